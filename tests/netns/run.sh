#!/usr/bin/env bash
# lode across hosts: the MDS, two storage servers and two clients, each in its own network
# namespace with its own address on a bridge (in a namespace of its own, so the machine's own
# network is left alone). Client one writes with the command, client two reads it back with
# the command, through a mount and through the Python package; `lode health` and
# `lode jobstats` are run from a client host.
#
# The MDS, the first storage server and the clients have a second interface on a second
# bridge (multi-rail): the MDS and that server listen on both, and clients are given both of
# the MDS's addresses. The server's first path is taken down: the cluster stays healthy, a
# new file is written across both servers, and a mount that was already running reads it back
# over the path left; with the MDS's first path down too, the namespace answers over its second.
# Then the second storage server (one path only) has its link taken down:
# `lode health` names that server and only it, the namespace still answers, and once the link
# returns the cluster is healthy and the file reads back whole.
# Last, `lode cluster up --netns` makes a cluster of its own in namespaces: this host reaches it
# over its bridge, and `lode cluster down` removes every namespace it made.
# Everything made here is torn down on exit, whatever happens.
#
# Needs root, `ip` (iproute2), FUSE, and the binaries in BIN (default target/debug). With
# PYTHON=0 the Python part is skipped (the package must be installed for it).
#
#   tests/netns/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/target/debug}
PYTHON=${PYTHON:-1}
net=10.77.0
net2=10.78.0
tag=lode$$
work=$(mktemp -d)
hosts=(mds oss1 oss2 c1 c2)
declare -A addr=([mds]=$net.1 [oss1]=$net.11 [oss2]=$net.12 [c1]=$net.21 [c2]=$net.22)
# The hosts on the second network, and their addresses there.
rail2=(mds oss1 c1 c2)
declare -A addr2=([mds]=$net2.1 [oss1]=$net2.11 [c1]=$net2.21 [c2]=$net2.22)

say() { printf '== %s\n' "$*"; }
ns() { echo "$tag-$1"; }
on() { local h=$1; shift; ip netns exec "$(ns "$h")" "$@"; }

cleanup() {
  set +e
  [ -d "$work/nc" ] && "$BIN/lode" cluster down --dir "$work/nc" >/dev/null 2>&1
  on c2 bash -c "fusermount3 -u -z $work/mnt" 2>/dev/null
  for p in "$work"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  sleep 0.5
  for p in "$work"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done
  for h in "${hosts[@]}" br; do ip netns del "$(ns "$h")" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

say "network: five hosts on $net.0/24, and four of them on $net2.0/24 too"
ip netns add "$(ns br)"
on br ip link add br0 type bridge
on br ip link set br0 up
on br ip link add br1 type bridge
on br ip link set br1 up
i=0
for h in "${hosts[@]}"; do
  i=$((i + 1))
  ip netns add "$(ns "$h")"
  ip link add "v$tag$i" type veth peer name "b$tag$i"
  ip link set "v$tag$i" netns "$(ns "$h")"
  ip link set "b$tag$i" netns "$(ns br)"
  on br ip link set "b$tag$i" master br0 up
  on "$h" ip link set lo up
  on "$h" ip link set "v$tag$i" name eth0
  on "$h" ip addr add "${addr[$h]}/24" dev eth0
  on "$h" ip link set eth0 up
  echo "b$tag$i" > "$work/$h.port"
done
for h in "${rail2[@]}"; do
  i=$((i + 1))
  ip link add "v$tag$i" type veth peer name "b$tag$i"
  ip link set "v$tag$i" netns "$(ns "$h")"
  ip link set "b$tag$i" netns "$(ns br)"
  on br ip link set "b$tag$i" master br1 up
  on "$h" ip link set "v$tag$i" name eth1
  on "$h" ip addr add "${addr2[$h]}/24" dev eth1
  on "$h" ip link set eth1 up
done

say "keys and servers"
"$BIN/lode" key new "$work/cluster.key" >/dev/null
"$BIN/lode" key client --from "$work/cluster.key" "$work/client.key" >/dev/null
start() {
  local h=$1; shift
  # Not through `on`: a function run in the background is a subshell, and its pid (what
  # cleanup kills) would not be the server's. `ip netns exec` execs in place.
  ip netns exec "$(ns "$h")" "$@" > "$work/$h.out" 2> "$work/$h.log" &
  echo $! > "$work/$h.pid"
  for _ in $(seq 100); do
    grep -q serving "$work/$h.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$h did not start:"; cat "$work/$h.log"; exit 1
}
"$BIN/lode-mds" format --data-dir "$work/mds" >/dev/null
start mds "$BIN/lode-mds" --data-dir "$work/mds" --listen "${addr[mds]}:9400" \
  --listen "${addr2[mds]}:9400" --key "$work/cluster.key" --trust "$net.0/24" \
  --trust "$net2.0/24"
start oss1 "$BIN/lode-oss" --data-dir "$work/oss1" --mds "${addr[mds]}:9400,${addr2[mds]}:9400" \
  --listen "${addr[oss1]}:9500" --listen "${addr2[oss1]}:9500" --key "$work/cluster.key" \
  --heartbeat 1
start oss2 "$BIN/lode-oss" --data-dir "$work/oss2" --mds "${addr[mds]}:9400" \
  --listen "${addr[oss2]}:9500" --key "$work/cluster.key" --heartbeat 1

export LODE_MDS=${addr[mds]}:9400,${addr2[mds]}:9400 LODE_KEY=$work/client.key
lode() { local h=$1; shift; on "$h" "$BIN/lode" "$@"; }
# `lode health` on host $1 (or through the command given after `-`), passing when all is
# well, or when its only warnings are about the targets' free space: they share this
# machine's disk, whose free space is not the cluster's doing.
healthy() {
  local out status=0
  if [ "$1" = - ]; then shift; out=$("$@" health) || status=$?; else out=$(lode "$1" health) || status=$?; fi
  echo "$out"
  [ "$status" = 0 ] && return 0
  [ "$status" = 1 ] && ! echo "$out" | grep "^WARN" | grep -v "free of" >/dev/null
}
# Pipelines below end in `grep PATTERN >/dev/null`, never `grep -q`: grep -q stops reading at
# the first match, and the command writing into it then dies of SIGPIPE (pipefail is on).
for _ in $(seq 50); do
  [ "$(lode c1 health 2>/dev/null | grep -c "in service")" = 2 ] && break
  sleep 0.2
done
healthy c1 | tee "$work/health.up"
grep -q "OK   oss ${addr[oss1]}:9500@tcp: up" "$work/health.up"
grep -q "OK   oss ${addr[oss2]}:9500@tcp: up" "$work/health.up"

say "client one writes a file striped over both servers; client two reads it back"
head -c 5000000 /dev/urandom > "$work/data.bin"
lode c1 mkdir /x
lode c1 setstripe -c -1 -S 1M /x
LODE_JOBID=writer.1 lode c1 cp "local:$work/data.bin" /x/data.bin
lode c1 getstripe /x/data.bin | grep "lmm_stripe_count:  2" >/dev/null
LODE_JOBID=reader.2 lode c2 cat /x/data.bin | cmp - "$work/data.bin"

say "client two through a mount"
mkdir -p "$work/mnt"
on c2 bash -c "
  set -e
  '$BIN/lode' mount --daemon '$work/mnt'
  cmp '$work/mnt/x/data.bin' '$work/data.bin'
  cp '$work/data.bin' '$work/mnt/x/from-mount.bin'
  sync '$work/mnt/x/from-mount.bin'
  '$BIN/lode' umount '$work/mnt'
"
lode c1 cat /x/from-mount.bin | cmp - "$work/data.bin"

if [ "$PYTHON" = 1 ]; then
  say "client one through the Python package"
  on c1 python3 - "$work/data.bin" <<PY
import sys, lode
fs = lode.connect("${addr[mds]}:9400", key="$work/client.key")
want = open(sys.argv[1], "rb").read()
assert fs.read_bytes("/x/data.bin") == want
fs.write_bytes("/x/from-python.bin", want[::-1])
names = sorted(fs.ls("/x"))
assert names == ["/x/data.bin", "/x/from-mount.bin", "/x/from-python.bin"], names
PY
  python3 -c 'import sys; open(sys.argv[2], "wb").write(open(sys.argv[1], "rb").read()[::-1])' \
    "$work/data.bin" "$work/reversed.bin"
  lode c2 cat /x/from-python.bin | cmp - "$work/reversed.bin"
fi

say "job statistics from a client host"
LODE_KEY=$work/cluster.key lode c1 jobstats > "$work/jobs.yaml"
grep -q "^oss.${addr[oss1]}:9500@tcp.job_stats=" "$work/jobs.yaml"
grep -q "job_id: *writer.1" "$work/jobs.yaml"
grep -q "job_id: *reader.2" "$work/jobs.yaml"

say "multi-rail: storage server one's first path taken down"
# A mount is seen only inside the `ip netns exec` that made it: this one runs in the
# background, reads once with both paths up, then waits for the file written with one down.
on c2 bash -c "
  set -e
  '$BIN/lode' mount --daemon '$work/mnt'
  trap \"'$BIN/lode' umount '$work/mnt'\" EXIT
  cmp '$work/mnt/x/data.bin' '$work/data.bin'
  touch '$work/mounted'
  for _ in \$(seq 600); do [ -f '$work/written' ] && break; sleep 0.1; done
  cmp '$work/mnt/x/after.bin' '$work/after.bin'
" &
mount_session=$!
for _ in $(seq 100); do [ -f "$work/mounted" ] && break; sleep 0.1; done
[ -f "$work/mounted" ]
on br ip link set "$(cat "$work/oss1.port")" down
healthy c1 | tee "$work/health.rail"
grep -q "OK   oss ${addr[oss1]}:9500@tcp: up" "$work/health.rail"
head -c 3000000 /dev/urandom > "$work/after.bin"
lode c1 cp "local:$work/after.bin" /x/after.bin
lode c1 getstripe /x/after.bin | grep "lmm_stripe_count:  2" >/dev/null
lode c1 cat /x/after.bin | cmp - "$work/after.bin"
# The mount's connections over the dead path fail and its calls go over the other.
touch "$work/written"
wait "$mount_session"
say "multi-rail: the MDS's first path taken down too"
on br ip link set "$(cat "$work/mds.port")" down
lode c1 ls /x | grep after.bin >/dev/null
lode c1 cat /x/data.bin | cmp - "$work/data.bin"
on br ip link set "$(cat "$work/mds.port")" up
on br ip link set "$(cat "$work/oss1.port")" up

say "one storage server's link down: health names that server and only it"
on br ip link set "$(cat "$work/oss2.port")" down
set +e
lode c2 health > "$work/health.down"
status=$?
set -e
cat "$work/health.down"
[ "$status" = 2 ]
grep -q "FAIL oss ${addr[oss2]}:9500@tcp: not answering" "$work/health.down"
grep -q "OK   oss ${addr[oss1]}:9500@tcp: up" "$work/health.down"
lode c2 ls /x > /dev/null
on br ip link set "$(cat "$work/oss2.port")" up
for _ in $(seq 50); do
  healthy c2 >/dev/null && break
  sleep 0.2
done
healthy c2
LODE_JOBID=reader.2 lode c2 cat /x/data.bin | cmp - "$work/data.bin"

say "lode cluster up --netns"
"$BIN/lode" cluster up --netns --subnet 10.79.0 --oss 2 --port 9800 --dir "$work/nc"
ip netns list | grep -- "-oss1" >/dev/null
(
  export LODE_MDS=10.79.0.1:9800 LODE_KEY=$work/nc/client.key
  healthy - "$BIN/lode" | grep "OK   oss 10.79.0.12:9901@tcp: up" >/dev/null
  "$BIN/lode" mkdir /n
  "$BIN/lode" setstripe -c -1 /n
  "$BIN/lode" cp "local:$work/data.bin" /n/data.bin
  "$BIN/lode" cat /n/data.bin | cmp - "$work/data.bin"
)
"$BIN/lode" cluster down --dir "$work/nc"
# Only this script's own namespaces are left.
[ "$(ip netns list | grep "^lode" | grep -vc "^$tag-")" = 0 ] || { ip netns list; exit 1; }
say "passed"
