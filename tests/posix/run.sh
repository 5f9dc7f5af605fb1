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
RUST_BACKTRACE=0 pjdfstest -c "$here/pjdfstest.toml" -p "$work" -s "$other" | tail -3
for seed in 1 2 3; do
  fsx -N "$ops" -S "$seed" -f "$here/fsx.toml" -P "$other" "$work/fsx.$seed"
done
cd /
rm -rf "$work" "$other"
