#!/usr/bin/env bash
# Metadata rate over 1, 2 and 4 MDTs, in one run: a release `lode cluster up --mdts 4`, then
# `lode bench --meta` with N clients (each in its own directory, placed on MDT i mod K with
# `lode mkdir -i`), K = 1, 2, 4 in rotated order over several rounds, durable answers (the way
# every MDT but 0 answers). Beside each rate, the CPU the MDS processes used, per metadata
# operation (create, stat and unlink of each file), read from /proc before and after.
#
# With SPREAD=striped, every client works in one shared directory striped over K MDTs
# (`lode setdirstripe -c K`; K = 1: a plain directory) instead of a directory each. With
# MODE=behind, clients keep their changes uncommitted and hold leases where an MDS grants them
# (MDT0), so they walk paths through MDT0 from their caches.
#
#   [SPREAD=own|striped] [MODE=durable|behind] scripts/mdt-scale.sh [CLIENTS] [FILES] [ROUNDS]
#   (default 16 20000 3)
set -euo pipefail
clients=${1:-16}
files=${2:-20000}
rounds=${3:-3}
spread=${SPREAD:-own}
mode=${MODE:-durable}
case $mode in # its column in the bench's table
  behind) col=2 ;;
  durable) col=3 ;;
  *) echo "MODE is durable or behind" >&2; exit 2 ;;
esac
bin=$(dirname "$0")/../target/release
dir=$(mktemp -d /var/tmp/lode-mdt-scale.XXXXXX)
port=${PORT:-19300}
trap '"$bin/lode" cluster down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"$bin/lode" cluster up --dir "$dir" --mdts 4 --oss 2 --port "$port" >/dev/null
export LODE_MDS=127.0.0.1:$port LODE_KEY=$dir/client.key
ticks=$(getconf CLK_TCK)
cpu() { # the MDS processes' user+system ticks, one per line: MDT0 first
  for role in mds mdt1 mdt2 mdt3; do
    pid=$(awk -v r="$role" '$1 == r {print $2}' "$dir/cluster.pids")
    awk '{print $14 + $15}' "/proc/$pid/stat"
  done
}
order=(1 2 4)
echo "mdts  round  create/s  stat/s  unlink/s  MDS CPU-us per op (MDT0..3)"
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < 3; i++)); do
    k=${order[$(((i + r) % 3))]}
    before=$(cpu)
    if [ "$spread" = striped ]; then where=(--meta-dir-stripe "$k"); else where=(--meta-mdts "$k"); fi
    # On MDT0, whatever MDT a new top-level directory would go to: K = 1 is MDT0 alone.
    "$bin/lode" mkdir -i 0 "/scale-$k-$r"
    out=$("$bin/lode" bench --meta --clients "$clients" --meta-files "$files" \
      --meta-modes "$mode" --rounds 1 "${where[@]}" --dir "/scale-$k-$r" 2>/dev/null)
    after=$(cpu)
    rates=$(echo "$out" | awk -v c="$col" '$1 == "create" || $1 == "stat" || $1 == "unlink" {gsub("/s", "", $c); printf "%s ", $c}')
    per=$(paste <(echo "$before") <(echo "$after") |
      awk -v t="$ticks" -v ops=$((files * 3)) '{printf "%.1f ", ($2 - $1) / t * 1e6 / ops}')
    echo "$k     $((r + 1))      $rates $per"
  done
done
