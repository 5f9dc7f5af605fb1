#!/usr/bin/env bash
# An independent POSIX suite (pjdfstest) and a data-integrity exerciser (fsx) on a lode mount:
#   tests/posix/run.sh MOUNTPOINT [FSX_OPS]
# Needs root, the users of pjdfstest.toml (made here if missing) and both tools on PATH
# (`cargo install pjdfstest fsx`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mnt=$1
ops=${2:-20000}
if ! runuser -u nobody -- test -x "$mnt"; then
  echo "run.sh: other users cannot reach $mnt (pjdfstest runs parts as nobody and tests)" >&2
  exit 1
fi
getent group tests >/dev/null || groupadd tests
getent passwd tests >/dev/null || useradd -M -g tests tests
work="$mnt/posix.$$"
other=$(mktemp -d)
mkdir -p "$work"
cd "$work"
log=$(mktemp)
status=0
RUST_BACKTRACE=0 pjdfstest -c "$here/pjdfstest.toml" -p "$work" -s "$other" >"$log" 2>&1 || status=$?
# The summary, and every case that did not pass with the lines it printed, so that a failure
# can be read from the end of a long log.
tail -3 "$log"
if [ "$status" -ne 0 ]; then
  echo "run.sh: pjdfstest failed; the cases that did not pass:" >&2
  awk '/^[^\t]/ { show = $NF != "ok" && $NF != "skipped" && $1 != "Summary:" } show' "$log" >&2
  rm -f "$log"
  exit "$status"
fi
rm -f "$log"
for seed in 1 2 3; do
  fsx -N "$ops" -S "$seed" -f "$here/fsx.toml" -P "$other" "$work/fsx.$seed"
done
cd /
rm -rf "$work" "$other"
