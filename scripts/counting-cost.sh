#!/usr/bin/env bash
# What counting costs on the data path: two clusters side by side (an MDS and two storage
# servers each, on loopback), one counting as servers do by default and one with --no-stats,
# driven in the order on, off, off, on, on, off, on, off by `lode bench` (2 files of 512 MiB
# striped over both servers, written then read), with the CPU seconds each cluster's servers
# used during the run. The first run warms a fresh cluster up: leave it out. The MDS's side is
# `lode-mds bench --counting`.
#
#   scripts/counting-cost.sh            (BIN=target/release RUNS=8 WORK=/var/tmp/counting-cost)
set -euo pipefail
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
RUNS=${RUNS:-8}
w=${WORK:-/var/tmp/counting-cost}
rm -rf "$w"; mkdir -p "$w"
"$BIN/lode" key new "$w/cluster.key" >/dev/null
"$BIN/lode" key client --from "$w/cluster.key" "$w/client.key" >/dev/null
declare -A pids
up() { # name port extra-flags...
  local n=$1 p=$2; shift 2
  "$BIN/lode-mds" format --data-dir "$w/$n/mds" >/dev/null
  "$BIN/lode-mds" --data-dir "$w/$n/mds" --listen "127.0.0.1:$p" --key "$w/cluster.key" \
    --trust 127.0.0.1 "$@" >/dev/null 2>&1 &
  pids[$n]=$!
  sleep 1
  for i in 0 1; do
    "$BIN/lode-oss" --data-dir "$w/$n/oss$i" --mds "127.0.0.1:$p" \
      --listen "127.0.0.1:$((p + 10 + i))" --key "$w/cluster.key" "$@" >/dev/null 2>&1 &
    pids[$n]="${pids[$n]} $!"
  done
}
cpu() { # CPU seconds used so far by the given processes
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  awk -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}
trap 'kill ${pids[on]} ${pids[off]} 2>/dev/null' EXIT
up on 9601
up off 9701 --no-stats
sleep 3
export LODE_KEY=$w/client.key
order=(on off off on on off on off off on on off)
echo "run setting  server-CPU-s  write-GB/s read-GB/s"
for k in $(seq 0 $((RUNS - 1))); do
  s=${order[$((k % ${#order[@]}))]}
  port=$([ "$s" = on ] && echo 9601 || echo 9701)
  # shellcheck disable=SC2086
  c0=$(cpu ${pids[$s]})
  out=$("$BIN/lode" --mds "127.0.0.1:$port" bench --files 2 --size 512M --stripe-count=-1 \
    --rounds 1 --dir "/b$k" 2>&1)
  # shellcheck disable=SC2086
  c1=$(cpu ${pids[$s]})
  rates=$(echo "$out" | awk '/lode \(library\)/ { print $(NF - 1), $NF }')
  echo "$k   $s  $(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')  $rates"
done
