#!/usr/bin/env bash
# `ls -l` (readdir and a stat of every entry) through the mount of one large directory striped
# over 4 MDTs, against the same number of files in a plain directory, in the same run: a
# release `lode cluster up --mdts 4`, the files made through the library (`lode bench --meta
# --meta-keep`, 16 clients), then each directory listed through a fresh mount (no kernel
# cache), in rotated order over several rounds.
#
#   scripts/bigdir-ls.sh [ENTRIES] [ROUNDS]      (default 1000000 2)
set -euo pipefail
entries=${1:-1000000}
rounds=${2:-2}
bin=$(dirname "$0")/../target/release
dir=$(mktemp -d /var/tmp/lode-bigdir.XXXXXX)
mnt=$dir/mnt
port=${PORT:-19500}
cleanup() {
  "$bin/lode" umount "$mnt" >/dev/null 2>&1 || true
  "$bin/lode" cluster down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
"$bin/lode" cluster up --dir "$dir" --mdts 4 --oss 2 --port "$port" >/dev/null
export LODE_MDS=127.0.0.1:$port LODE_KEY=$dir/client.key
mkdir -p "$mnt"
for k in 4 1; do
  start=$(date +%s.%N)
  "$bin/lode" bench --meta --clients 16 --meta-files "$entries" --meta-modes durable \
    --rounds 1 --meta-dir-stripe "$k" --meta-keep --dir "/big$k" >/dev/null 2>&1
  echo "made $entries files in /big$k/durable0/shared (striped over $k) in $(echo "$(date +%s.%N) - $start" | bc) s"
done
echo "round  dir                   entries  seconds  entries/s"
for ((r = 0; r < rounds; r++)); do
  order=(4 1)
  if ((r % 2 == 1)); then order=(1 4); fi
  for k in "${order[@]}"; do
    "$bin/lode" mount "$mnt" --daemon >/dev/null
    start=$(date +%s.%N)
    n=$(ls -l "$mnt/big$k/durable0/shared" | tail -n +2 | wc -l)
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    "$bin/lode" umount "$mnt"
    printf "%-6s %-21s %-8s %-8.2f %.0f\n" "$((r + 1))" "striped over $k" "$n" "$secs" \
      "$(echo "$n / $secs" | bc -l)"
  done
done
