#!/usr/bin/env python3
"""The mount's data path as users drive it, against a local directory and any other mounts, in
the same run: fio through the page cache (sequential 1 MiB write with its final fsync, cold
sequential reads with 1 and 4 jobs), 4 KiB random reads with O_DIRECT at QD16, a checkpoint
(write, fsync, rename, fsync of the directory), and, where asked, a walk of large sparse files.

    scripts/mount-data-bench.py --mount /mnt/lode --local /var/tmp/bench [--rounds 3] [--size 2g]
    scripts/mount-data-bench.py --mount lode=/mnt/lode --mount moosefs=/mnt/mfs --local DIR
    scripts/mount-data-bench.py ... --sparse 200    # 200 sparse files of 1 GiB: read 64 MiB, rm
    scripts/mount-data-bench.py ... --json out.json

Several mounts (LABEL=PATH) are measured in the same run; the first is the one the report
divides by the others. Caches are dropped before every read job (root), so reads are cold on
every side. Each round runs every job on every directory in rotated order; the report gives
medians, the ratio to local and to each other mount, the 1 MiB requests' median and p99
completion latency, and CPU seconds per GB: fio's own plus the filesystems' processes (lode's
binaries, MooseFS's mfs*), read from /proc, the mount daemon and the servers apart.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def fs_cpu():
    """CPU seconds used so far by each filesystem process kind: the mount daemons (`lode`,
    `mfsmount`) and the servers (`lode-oss`, `lode-mds`, `mfschunkserver`, `mfsmaster`)."""
    out = {"daemon": 0.0, "servers": 0.0}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                exe = os.path.basename(f.read().split(b"\0")[0])
            if exe in (b"lode", b"mfsmount"):
                kind = "daemon"
            elif exe.startswith(b"lode-") or exe.startswith(b"mfs"):
                kind = "servers"
            else:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[kind] += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            continue
    return out


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        print("warning: cannot drop caches (not root): reads may be warm", file=sys.stderr)


def pct(clat, p):
    table = clat.get("percentile", {})
    key = next((k for k in table if abs(float(k) - p) < 1e-6), None)
    return table[key] / 1e3 if key else float("nan")  # µs


def fio(directory, name, args, side):
    if side == "read":
        drop_caches()
    cmd = ["fio", f"--name={name}", f"--directory={directory}", "--output-format=json",
           "--group_reporting", "--percentile_list=50:99"] + args
    before, t = fs_cpu(), time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall, after = time.perf_counter() - t, fs_cpu()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    secs = job["job_runtime"] / 1000 or 1e-9
    jobs = int(next((a.split("=")[1] for a in args if a.startswith("--numjobs=")), "1"))
    fio_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * secs * jobs
    gb = job[side]["io_bytes"] / 1e9
    clat = job[side]["clat_ns"]
    return {
        "MiB/s": job[side]["io_bytes"] / (1 << 20) / secs,
        "IOPS": job[side]["iops"],
        "p50_us": pct(clat, 50.0),
        "p99_us": pct(clat, 99.0),
        "cpu_s_per_GB": (fio_cpu + after["daemon"] - before["daemon"]
                         + after["servers"] - before["servers"]) / gb,
        "daemon_cpu_s_per_GB": (after["daemon"] - before["daemon"]) / gb,
        "servers_cpu_s_per_GB": (after["servers"] - before["servers"]) / gb,
        "wall_s": wall,
    }


def checkpoint(directory, size):
    """A checkpoint as torch.save leaves it: a temporary file written in 1 MiB pieces,
    fsynced, renamed over the final name, and the directory fsynced. Returns seconds."""
    block = os.urandom(1 << 20)
    tmp, final = os.path.join(directory, "ckpt.tmp"), os.path.join(directory, "ckpt")
    before = fs_cpu()
    t = time.perf_counter()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(size >> 20):
        os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, final)
    d = os.open(directory, os.O_RDONLY)
    os.fsync(d)
    os.close(d)
    secs = time.perf_counter() - t
    after = fs_cpu()
    os.unlink(final)
    return {"s": secs, "daemon_cpu_s_per_GB": (after["daemon"] - before["daemon"]) / (size / 1e9),
            "servers_cpu_s_per_GB": (after["servers"] - before["servers"]) / (size / 1e9)}


def sparse_walk(directory, files):
    """Sparse files as fsstress leaves them (1 GiB apparent, a few MiB written), walked the
    way a cleanup script does: each file's first 64 MiB read, then the file removed."""
    d = os.path.join(directory, "sparse")
    os.makedirs(d, exist_ok=True)
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(block)
            f.seek((1 << 30) - len(block))
            f.write(block)
    drop_caches()
    t = time.perf_counter()
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                left = 64 << 20
                while left > 0 and (got := f.read(min(left, 1 << 20))):
                    left -= len(got)
            os.unlink(p)
    secs = time.perf_counter() - t
    os.rmdir(d)
    return {"s": secs}


def jobs(size):
    per4 = f"{int(size.rstrip('g')) * 256}m"
    psync = ["--ioengine=psync", "--bs=1m"]
    return [
        ("seq write x1 +fsync, buffered", "write",
         psync + ["--rw=write", f"--size={size}", "--end_fsync=1"]),
        ("seq read x1, buffered", "read", psync + ["--rw=read", f"--size={size}"]),
        ("seq read x4, buffered", "read", psync + ["--rw=read", f"--size={per4}", "--numjobs=4"]),
        ("4k randread QD16, O_DIRECT", "read",
         ["--ioengine=libaio", "--bs=4k", "--iodepth=16", "--rw=randread", f"--size={size}",
          "--direct=1", "--runtime=15", "--time_based"]),
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mount", required=True, action="append",
                   help="a mount, PATH or LABEL=PATH; repeat to compare mounts")
    p.add_argument("--local", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="2g")
    p.add_argument("--sparse", type=int, default=0, help="sparse files to walk (0: none)")
    p.add_argument("--json", help="write every round's figures here")
    a = p.parse_args()
    mounts = [m.split("=", 1) if "=" in m else ["lode", m] for m in a.mount]
    dirs = {label: os.path.join(path, "data-bench") for label, path in mounts}
    labels = list(dirs)
    dirs["local"] = a.local
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    size_bytes = int(a.size.rstrip("g")) << 30
    results = {}
    order = list(dirs)
    for rnd in range(a.rounds):
        sides = order[rnd % len(order):] + order[:rnd % len(order)]
        # Every job uses the files the one before it made: the write's file is the reads'.
        for name in sides:
            subprocess.run(f"rm -f {dirs[name]}/bench.*", shell=True)
        for label, side, args in jobs(a.size):
            for name in sides:
                r = fio(dirs[name], "bench", args, side)
                results.setdefault((label, name), []).append(r)
                print(f"round {rnd + 1} {name:8} {label:30} {r['MiB/s']:8.0f} MiB/s "
                      f"{r['IOPS']:9.0f} IOPS p50 {r['p50_us']:8.0f} µs p99 {r['p99_us']:8.0f} µs "
                      f"{r['cpu_s_per_GB']:.2f} CPU s/GB", file=sys.stderr)
        for name in sides:
            subprocess.run(f"rm -f {dirs[name]}/bench.*", shell=True)
        for name in sides:
            r = checkpoint(dirs[name], size_bytes)
            results.setdefault((f"checkpoint {a.size} write+fsync+rename", name), []).append(r)
            print(f"round {rnd + 1} {name:8} checkpoint {r['s']:.2f} s", file=sys.stderr)
        if a.sparse:
            for name in sides:
                r = sparse_walk(dirs[name], a.sparse)
                results.setdefault((f"sparse walk {a.sparse} x 1 GiB", name), []).append(r)
                print(f"round {rnd + 1} {name:8} sparse walk {r['s']:.2f} s", file=sys.stderr)
    print(f"\nmedians of {a.rounds} rounds, {a.size} ({', '.join(a.mount)}, local = {a.local})")
    report(results, labels)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"job": j, "side": s, "rounds": r} for (j, s), r in results.items()], f,
                      indent=1)
    for label in labels:
        subprocess.run(["rm", "-rf", dirs[label]])


def report(results, labels):
    first = labels[0]
    seen = []
    for job, _ in results:
        if job not in seen:
            seen.append(job)
    sides = labels + ["local"]
    med = lambda job, side, key: statistics.median(r[key] for r in results[(job, side)])
    head = f"{'job':36}" + "".join(f"{s:>14}" for s in sides)
    head += "".join(f"{first + '/' + s:>16}" for s in sides[1:])
    print(head)
    for job in seen:
        timed = "s" in results[(job, first)][0]
        key = "s" if timed else ("IOPS" if "4k" in job else "MiB/s")
        unit = {"s": "s", "IOPS": "IOPS", "MiB/s": "MiB/s"}[key]
        vals = {s: med(job, s, key) for s in sides}
        line = f"{job:36}" + "".join(f"{vals[s]:>9.{2 if timed else 0}f} {unit:4}" for s in sides)
        for s in sides[1:]:
            ratio = vals[s] / vals[first] if timed else vals[first] / vals[s]
            line += f"{ratio:>16.2f}"
        print(line)
    print("\n(time ratios are other/first, so above 1 means the first is faster)")
    print(f"\n{'latency of one request (µs)':36}" + "".join(f"{s:>20}" for s in sides))
    for job in seen:
        if "p50_us" not in results[(job, first)][0]:
            continue
        print(f"{job:36}" + "".join(
            f"{med(job, s, 'p50_us'):>9.0f} / {med(job, s, 'p99_us'):<8.0f}" for s in sides))
    print(f"\n{'CPU s/GB: fio+fs (daemon, servers)':36}" + "".join(f"{s:>22}" for s in sides))
    for job in seen:
        if "cpu_s_per_GB" not in results[(job, first)][0]:
            continue
        print(f"{job:36}" + "".join(
            f"{med(job, s, 'cpu_s_per_GB'):>8.2f} ({med(job, s, 'daemon_cpu_s_per_GB'):.2f}, "
            f"{med(job, s, 'servers_cpu_s_per_GB'):.2f})" for s in sides))


if __name__ == "__main__":
    main()
