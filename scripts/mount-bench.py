#!/usr/bin/env python3
"""fio on a lode mount against a local directory, in the same run.

    scripts/mount-bench.py --mount /mnt/lode --local /var/tmp/fio-local [--rounds 3] [--size 2g]
                           [--files 20000] [--meta-only] [--small-files 20000]
                           [--procs 4] [--peer NAME=DIR ...]

Each round runs every job on both directories in rotated order; the report gives medians,
lode's ratio to local, and CPU seconds per GB (fio's own plus every lode process's, read from
/proc, so the FUSE daemon and the servers are counted). Data jobs use O_DIRECT (direct=1).
With --small-files N, N files of 8 KiB are written, the page cache dropped, and each is opened,
read whole and closed; on lode twice: in a directory whose files keep their first 64 KiB on the
MDS (Data-on-MDT, set through the lode.layout xattr) and in a plain one.
With --procs P, --files files are also created and unlinked over 20 directories by P processes
at once. With --peer NAME=DIR (repeatable), another filesystem mounted at DIR (MooseFS, NFS, ...) runs
every job in the same rotation, and the report gives lode's ratio to it beside the local one.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

TICK = os.sysconf("SC_CLK_TCK")


def lode_cpu():
    """CPU seconds used so far by every process whose command is a lode binary."""
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


def fio(directory, name, args):
    cmd = ["fio", f"--name={name}", f"--directory={directory}", "--output-format=json",
           "--group_reporting"] + args
    before = lode_cpu()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = lode_cpu()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    runtime = job["job_runtime"] / 1000 or 1e-9
    # fio's usr/sys are percentages of its runtime, per job: times the job count.
    jobs = int(next((a.split("=")[1] for a in args if a.startswith("--numjobs=")), "1"))
    fio_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime * jobs
    return job, fio_cpu + (after - before)


def data_jobs(size):
    gib = size
    per4 = f"{int(gib.rstrip('g')) * 256}m"
    common = ["--direct=1", "--ioengine=psync", "--bs=1m"]
    return [
        ("seq write 1M x1", "write", common + ["--rw=write", f"--size={gib}", "--numjobs=1"]),
        ("seq read 1M x1", "read", common + ["--rw=read", f"--size={gib}", "--numjobs=1"]),
        ("seq write 1M x4", "write", common + ["--rw=write", f"--size={per4}", "--numjobs=4"]),
        ("seq read 1M x4", "read", common + ["--rw=read", f"--size={per4}", "--numjobs=4"]),
        ("rand read 4K QD16", "read",
         ["--direct=1", "--ioengine=libaio", "--iodepth=16", "--bs=4k", "--rw=randread",
          "--size=1g", "--runtime=10", "--time_based"]),
    ]


def run_data(directory, label, side, args):
    job, cpu = fio(directory, label.replace(" ", "_"), args)
    r = job[side]
    gb = r["io_bytes"] / 1e9
    secs = job["job_runtime"] / 1000
    return {"GB/s": gb / secs if secs else 0, "IOPS": r["iops"], "cpu_s_per_GB": cpu / gb if gb else 0}


def drop_caches(pages=False):
    """Drops the kernel's dentry and inode caches, and with `pages` the page cache too (root
    only; otherwise what follows may be warm)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3" if pages else "2")
    except OSError:
        print("cannot drop the kernel's caches (not root?): results may be warm", file=sys.stderr)


def run_meta(directory, n):
    """create, stat and unlink of n empty files in one directory, one process, one call at a
    time: fio's filecreate engine spends O(files) per operation at this count, so the loop is
    ours (a Python call adds about a microsecond to each system call)."""
    import time
    sub = os.path.join(directory, f"meta.{os.getpid()}")
    shutil.rmtree(sub, ignore_errors=True)
    os.makedirs(sub)
    names = [os.path.join(sub, f"f{i:06}") for i in range(n)]
    out = {}
    t = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    out["create"] = n / (time.perf_counter() - t)
    time.sleep(1.5)  # past the mount's attribute cache time
    drop_caches()    # and the kernel's dentries and inodes: every stat reaches the filesystem
    t = time.perf_counter()
    for p in names:
        os.stat(p)
    out["stat"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for p in names:
        os.unlink(p)
    out["unlink"] = n / (time.perf_counter() - t)
    os.rmdir(sub)
    return out


def _meta_worker(names, start, results):
    """Puts its four times, or its error (after breaking the barrier, so that no other worker
    waits for it)."""
    import time
    try:
        start.wait()
        t = time.perf_counter()
        for p in names:
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
        created = time.perf_counter()
        start.wait()
        u = time.perf_counter()
        for p in names:
            os.unlink(p)
        results.put((t, created, u, time.perf_counter()))
    except Exception as e:  # reported by the parent, whatever it was
        start.abort()
        results.put(f"{type(e).__name__}: {e}")


def run_meta_parallel(directory, n, procs, ndirs=20):
    """create, then unlink, n empty files spread over `ndirs` directories by `procs`
    processes at once (each works in every procs-th directory); rates over the whole of each
    phase, from the first process's start to the last one's end."""
    import multiprocessing as mp
    sub = os.path.join(directory, f"metap.{os.getpid()}")
    shutil.rmtree(sub, ignore_errors=True)
    dirs = [os.path.join(sub, f"d{d:02}") for d in range(ndirs)]
    for d in dirs:
        os.makedirs(d)
    start, results = mp.Barrier(procs), mp.Queue()
    workers = []
    for w in range(procs):
        mine = dirs[w::procs] or dirs[w % ndirs:][:1]
        names = [os.path.join(mine[i % len(mine)], f"p{w}f{i:06}") for i in range(n // procs)]
        workers.append(mp.Process(target=_meta_worker, args=(names, start, results)))
    for w in workers:
        w.start()
    spans = [results.get() for _ in workers]
    for w in workers:
        w.join()
    # The worker that failed first, rather than those the broken barrier stopped.
    failed = sorted((s for s in spans if isinstance(s, str)),
                    key=lambda s: s.startswith("BrokenBarrierError"))
    if failed:
        sys.exit(f"{directory}: the parallel metadata run failed: {failed[0]}")
    done = procs * (n // procs)
    shutil.rmtree(sub)
    create = done / (max(s[1] for s in spans) - min(s[0] for s in spans))
    unlink = done / (max(s[3] for s in spans) - min(s[2] for s in spans))
    return {f"create x{procs}": create, f"unlink x{procs}": unlink}


DOM = b"-E 64K -L mdt -E -1 -c -1"


def run_small(directory, n, layout=None):
    """Times the writing of n files of 8 KiB (create, write, close; with `layout` as the
    directory's default), drops the caches, then times open + read + close of each, one
    process, one call at a time. Returns (writes/s, reads/s)."""
    import time
    sub = os.path.join(directory, f"small.{os.getpid()}")
    shutil.rmtree(sub, ignore_errors=True)
    os.makedirs(sub)
    if layout:
        os.setxattr(sub, "lode.layout", layout)
    data = os.urandom(8192)
    names = [os.path.join(sub, f"f{i:06}") for i in range(n)]
    t = time.perf_counter()
    for p in names:
        fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)
    written = n / (time.perf_counter() - t)
    time.sleep(1.5)
    drop_caches(pages=True)
    t = time.perf_counter()
    for p in names:
        fd = os.open(p, os.O_RDONLY)
        got = os.read(fd, 16384)
        os.close(fd)
        if got != data:
            sys.exit(f"{p}: read back {len(got)} bytes that differ from those written")
    rate = n / (time.perf_counter() - t)
    shutil.rmtree(sub)
    return written, rate


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mount", required=True)
    p.add_argument("--local", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", default="2g")
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--meta-only", action="store_true", help="only create, stat and unlink")
    p.add_argument("--small-files", type=int, default=0,
                   help="also write (create, write, close) and read (open, read, close) "
                        "this many 8 KiB files")
    p.add_argument("--procs", type=int, default=0,
                   help="also create and unlink --files files over 20 directories with this "
                        "many processes at once")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=DIR",
                   help="another filesystem's directory, measured in the same run")
    a = p.parse_args()
    dirs = {"lode": os.path.join(a.mount, "fio"), "local": a.local}
    peers = []
    for spec in a.peer:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path or name in dirs:
            p.error(f"--peer {spec!r}: expected NAME=DIR with a new NAME")
        dirs[name] = os.path.join(path, "fio")
        peers.append(name)
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    results = {}  # (job, side) -> list of dicts
    order = list(dirs)
    for rnd in range(a.rounds):
        sides = order[rnd % len(order):] + order[:rnd % len(order)]
        for label, side, args in ([] if a.meta_only else data_jobs(a.size)):
            for name in sides:
                r = run_data(dirs[name], label, side, args)
                results.setdefault((label, name), []).append(r)
                print(f"round {rnd + 1} {name:7} {label:18} {r['GB/s']:.3f} GB/s "
                      f"{r['IOPS']:.0f} IOPS {r['cpu_s_per_GB']:.2f} CPU s/GB", file=sys.stderr)
        for name in sides if a.small_files else []:
            runs = [("small read", None)]
            if name == "lode":
                runs.append(("small read, on MDS", DOM))
            for label, layout in runs:
                w, v = run_small(dirs[name], a.small_files, layout)
                for what, rate in ((label.replace("read", "write"), w), (label, v)):
                    key = (f"{what} {a.small_files}", name)
                    results.setdefault(key, []).append({"ops/s": rate})
                    print(f"round {rnd + 1} {name:7} {what:18} {rate:.0f} files/s", file=sys.stderr)
        for name in sides:
            meta = run_meta(dirs[name], a.files)
            if a.procs:
                meta.update(run_meta_parallel(dirs[name], a.files, a.procs))
            for k, v in meta.items():
                results.setdefault((f"{k} {a.files} files", name), []).append({"ops/s": v})
                print(f"round {rnd + 1} {name:7} {k:18} {v:.0f} ops/s", file=sys.stderr)
    print(f"\nmedians of {a.rounds} rounds (lode = {a.mount}, local = {a.local}"
          + "".join(f", {n} = {dirs[n][:-len('/fio')]}" for n in peers) + ")")
    print(f"{'job':24} {'lode':>12} {'local':>12} {'ratio':>6}  CPU s/GB lode / local"
          + "".join(f"  {n:>12} {'lode/' + n:>10}" for n in peers))
    jobs = []
    for (job, _) in results:
        if job not in jobs:
            jobs.append(job)
    for job in jobs:
        if (job, "local") not in results:
            # lode alone (the MDS-kept variant): against lode's plain run and local.
            x = statistics.median(r["ops/s"] for r in results[(job, "lode")])
            plain = job.replace(", on MDS", "")
            y = statistics.median(r["ops/s"] for r in results[(plain, "local")])
            z = statistics.median(r["ops/s"] for r in results[(plain, "lode")])
            print(f"{job:24} {x:10.0f}/s {y:10.0f}/s {x / y:6.2f}  ({x / z:.2f}x lode plain)")
            continue
        lo, lc = results[(job, "lode")], results[(job, "local")]
        key = "ops/s" if "ops/s" in lo[0] else "IOPS" if "4K" in job else "GB/s"
        x = statistics.median(r[key] for r in lo)
        beside = ""
        for n in peers:
            z = statistics.median(r[key] for r in results[(job, n)])
            shown = f"{z:.2f} GB/s" if key == "GB/s" else f"{z:.0f}" if key == "IOPS" else f"{z:.0f}/s"
            beside += f"  {shown:>12} {x / z if z else 0:10.2f}"
        if key == "ops/s":
            y = statistics.median(r["ops/s"] for r in lc)
            print(f"{job:24} {x:10.0f}/s {y:10.0f}/s {x / y:6.2f}".ljust(80) + beside)
            continue
        y = statistics.median(r[key] for r in lc)
        cx = statistics.median(r["cpu_s_per_GB"] for r in lo)
        cy = statistics.median(r["cpu_s_per_GB"] for r in lc)
        unit = "" if key == "IOPS" else " GB/s"
        fmt = (lambda v: f"{v:.0f}") if key == "IOPS" else (lambda v: f"{v:.2f}")
        print(f"{job:24} {fmt(x) + unit:>12} {fmt(y) + unit:>12} {x / y:6.2f}  "
              f"{cx:.2f} / {cy:.2f}".ljust(80) + beside)
    shutil.rmtree(dirs["lode"], ignore_errors=True)
    for n in peers:
        shutil.rmtree(dirs[n], ignore_errors=True)


if __name__ == "__main__":
    main()
