#!/usr/bin/env python3
"""Buffered I/O, as training code does it, on a lode mount against a local directory, in the
same run: fio through the page cache (cold sequential reads with 1 and 4 jobs, a sequential
write with its final fsync), the same with O_DIRECT on the mount (what the page cache costs),
and a checkpoint (write, fsync, rename, fsync of the directory).

    scripts/mount-buffered-bench.py --mount /mnt/lode --local /var/tmp/bench [--rounds 3] [--size 2g]
    scripts/mount-buffered-bench.py --mount wb=/mnt/a --mount nowb=/mnt/b --local /var/tmp/bench

Several mounts (LABEL=PATH, e.g. one with `-o no_writeback`) are measured in the same run.

Caches are dropped before every read job (root), so reads are cold on both sides. Each round
runs every job on both directories in rotated order; the report gives medians, lode's ratio to
local, and CPU seconds per GB (fio's own plus every lode process's: the FUSE daemon and the
servers, read from /proc).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def lode_cpu():
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                exe = f.read().split(b"\0")[0]
            if not os.path.basename(exe).startswith(b"lode"):
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            continue
    return total


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        print("warning: cannot drop caches (not root): reads may be warm", file=sys.stderr)


def fio(directory, name, args, side):
    if side == "read":
        drop_caches()
    cmd = ["fio", f"--name={name}", f"--directory={directory}", "--output-format=json",
           "--group_reporting", "--ioengine=psync", "--bs=1m"] + args
    before = lode_cpu()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = lode_cpu()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    secs = job["job_runtime"] / 1000 or 1e-9
    jobs = int(next((a.split("=")[1] for a in args if a.startswith("--numjobs=")), "1"))
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * secs * jobs + (after - before)
    gb = job[side]["io_bytes"] / 1e9
    return {"MiB/s": job[side]["io_bytes"] / (1 << 20) / secs, "cpu_s_per_GB": cpu / gb}


def checkpoint(directory, size):
    """A checkpoint as torch.save leaves it: a temporary file written in 1 MiB pieces,
    fsynced, renamed over the final name, and the directory fsynced. Returns seconds."""
    block = os.urandom(1 << 20)
    tmp, final = os.path.join(directory, "ckpt.tmp"), os.path.join(directory, "ckpt")
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
    os.unlink(final)
    return {"s": secs}


def jobs(size):
    per4 = f"{int(size.rstrip('g')) * 256}m"
    return [
        ("seq read x1, buffered", "read", ["--rw=read", f"--size={size}"], True),
        ("seq read x4, buffered", "read", ["--rw=read", f"--size={per4}", "--numjobs=4"], True),
        ("seq write x1 +fsync, buffered", "write", ["--rw=write", f"--size={size}", "--end_fsync=1"], True),
        ("seq read x1, O_DIRECT", "read", ["--rw=read", f"--size={size}", "--direct=1"], False),
        ("seq write x1, O_DIRECT", "write", ["--rw=write", f"--size={size}", "--direct=1"], False),
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mount", required=True, action="append",
                   help="a lode mount, PATH or LABEL=PATH; repeat to compare mounts")
    p.add_argument("--local", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="2g")
    a = p.parse_args()
    mounts = [m.split("=", 1) if "=" in m else ["lode", m] for m in a.mount]
    dirs = {label: os.path.join(path, "buffered-bench") for label, path in mounts}
    lodes = list(dirs)
    dirs["local"] = a.local
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    size_bytes = int(a.size.rstrip("g")) << 30
    results = {}
    order = list(dirs)
    for rnd in range(a.rounds):
        sides = order[rnd % len(order):] + order[:rnd % len(order)]
        for label, side, args, both in jobs(a.size):
            for name in sides if both else [n for n in sides if n != "local"]:
                r = fio(dirs[name], label.split(",")[0].replace(" ", "_"), args, side)
                results.setdefault((label, name), []).append(r)
                print(f"round {rnd + 1} {name:5} {label:32} {r['MiB/s']:8.0f} MiB/s "
                      f"{r['cpu_s_per_GB']:.2f} CPU s/GB", file=sys.stderr)
        for name in sides:
            r = checkpoint(dirs[name], size_bytes)
            results.setdefault(("checkpoint write+fsync+rename", name), []).append(r)
            print(f"round {rnd + 1} {name:5} checkpoint {r['s']:.2f} s", file=sys.stderr)
    print(f"\nmedians of {a.rounds} rounds, {a.size} ({', '.join(a.mount)}, local = {a.local})")
    for lode in lodes:
        report(results, lode)
    for lode in lodes:
        subprocess.run(["rm", "-rf", dirs[lode]])


def report(results, lode):
    print(f"\n{'job':34} {lode:>12} {'local':>12} {'ratio':>6}  CPU s/GB {lode} / local")
    seen = []
    for job, _ in results:
        if job not in seen:
            seen.append(job)
    for job in seen:
        lo, lc = results[(job, lode)], results.get((job, "local"))
        if "s" in lo[0]:
            x = statistics.median(r["s"] for r in lo)
            y = statistics.median(r["s"] for r in lc)
            print(f"{job:34} {x:10.2f} s {y:10.2f} s {x / y:6.2f}")
            continue
        x = statistics.median(r["MiB/s"] for r in lo)
        cx = statistics.median(r["cpu_s_per_GB"] for r in lo)
        if lc is None:
            print(f"{job:34} {x:6.0f} MiB/s {'':>12} {'':>6}  {cx:.2f}")
            continue
        y = statistics.median(r["MiB/s"] for r in lc)
        cy = statistics.median(r["cpu_s_per_GB"] for r in lc)
        print(f"{job:34} {x:6.0f} MiB/s {y:6.0f} MiB/s {x / y:6.2f}  {cx:.2f} / {cy:.2f}")


if __name__ == "__main__":
    main()
