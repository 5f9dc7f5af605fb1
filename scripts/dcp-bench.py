#!/usr/bin/env python3
"""PyTorch Distributed Checkpoint on lode against DCP's own writers, in the same run.

    scripts/dcp-bench.py --mds 127.0.0.1:9400 --local /var/tmp/dcp --size 4G --ranks 2,4

For each world size, `--rounds` rounds, the three systems in rotated order within each:
  lode    lode.torch.dcp.Writer / Reader (parallel striped writes, per-piece SHA-256, atomic
          publish, verified loads)
  local   DCP's FileSystemWriter / FileSystemReader on a local directory (`--local`)
  fsspec  DCP's FsspecWriter / FsspecReader through lode's fsspec (lode://)
Each rank (a process, gloo) holds SIZE/world bytes of float32 tensors of 64 MiB under names of
its own (as FSDP's flat shards are). Timed between barriers: the save, the load into the same
tensors after the page cache is dropped, and an async_save's blocking time (until it returns)
against its total (until its future is done). The ranks' CPU seconds per GB are beside each.
Prints a table of medians with lode's ratios and writes runs.csv to --out.
"""

import argparse
import csv
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

TENSOR = 64 << 20


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import lode.torch.dcp as ldcp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per = args.size // world
    state = {f"rank{rank}.flat{i}": torch.full((TENSOR // 4,), float(rank * 1000 + i))
             for i in range(max(1, per // TENSOR))}
    nbytes = sum(t.numel() * 4 for t in state.values())

    def writer(name):
        if args.system == "lode":
            return ldcp.Writer(f"lode://{args.mds}{args.base}/{name}")
        if args.system == "local":
            return dcp.FileSystemWriter(f"{args.local}/{name}", thread_count=4)
        return dcp.FsspecWriter(f"lode://{args.mds}{args.base}/{name}", thread_count=4)

    def reader(name):
        if args.system == "lode":
            return ldcp.Reader(f"lode://{args.mds}{args.base}/{name}")
        if args.system == "local":
            return dcp.FileSystemReader(f"{args.local}/{name}")
        return dcp.FsspecReader(f"lode://{args.mds}{args.base}/{name}")

    def timed(fn):
        dist.barrier()
        t, c = time.perf_counter(), cpu()
        out = fn()
        dist.barrier()
        return time.perf_counter() - t, cpu() - c, out

    out = {}
    out["save_s"], out["save_cpu"], _ = timed(lambda: dcp.save(state, storage_writer=writer("sync")))
    if rank == 0:
        drop_caches()
    for t in state.values():
        t.zero_()
    out["load_s"], out["load_cpu"], _ = timed(lambda: dcp.load(state, storage_reader=reader("sync")))
    assert all(float(t[0]) == float(rank * 1000 + i) for i, t in enumerate(state.values()))

    def async_save():
        t = time.perf_counter()
        fut = dcp.async_save(state, storage_writer=writer("async"))
        blocked = time.perf_counter() - t
        fut.result()
        return blocked
    out["async_s"], out["async_cpu"], out["async_block_s"] = timed(async_save)
    gathered = [None] * world
    dist.all_gather_object(gathered, dict(out, nbytes=nbytes))
    if rank == 0:
        total = sum(g["nbytes"] for g in gathered)
        row = {k: max(g[k] for g in gathered) for k in ("save_s", "load_s", "async_s",
                                                       "async_block_s")}
        for k in ("save_cpu", "load_cpu", "async_cpu"):
            row[k] = sum(g[k] for g in gathered)
        row["bytes"] = total
        print("RESULT " + json.dumps(row), flush=True)
    dist.destroy_process_group()


def run(args, system, world, rnd):
    import lode
    fs = lode.connect(args.mds)
    base = f"/dcp-bench/r{rnd}-{system}-{world}"
    fs.mkdir(base, parents=True)
    fs.setstripe(base, stripe_count=-1, stripe_size=4 << 20)
    local = os.path.join(args.local, f"r{rnd}-{system}-{world}")
    os.makedirs(local, exist_ok=True)
    port = random.randrange(41000, 49000)
    cmd = [sys.executable, __file__, "--worker", "--system", system, "--mds", args.mds,
           "--base", base, "--local", local, "--size", str(args.size)]
    procs = [subprocess.Popen(cmd, env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                                            LOCAL_WORLD_SIZE=str(world),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, text=True) for r in range(world)]
    row = None
    for p in procs:
        text, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"{system} world {world}: a rank failed ({p.returncode})")
        for line in text.splitlines():
            if line.startswith("RESULT "):
                row = json.loads(line[7:])
    fs.rm(base, recursive=True)
    subprocess.run(["rm", "-rf", local], check=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mds", default=os.environ.get("LODE_MDS", "127.0.0.1:9400"))
    ap.add_argument("--local", default="/var/tmp/lode-dcp-bench")
    ap.add_argument("--size", type=size_of, default=size_of("4G"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="dcp-bench.out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    os.makedirs(args.out, exist_ok=True)
    systems = ["lode", "local", "fsspec"]
    rows = []
    for world in [int(w) for w in args.ranks.split(",")]:
        for rnd in range(args.rounds):
            order = systems[rnd % 3:] + systems[:rnd % 3]
            for system in order:
                r = run(args, system, world, rnd)
                r.update(system=system, world=world, round=rnd)
                rows.append(r)
                gb = r["bytes"] / 1e9
                print(f"world {world} round {rnd} {system:6}: save {gb / r['save_s']:.2f} GB/s, "
                      f"load {gb / r['load_s']:.2f} GB/s, async blocks {r['async_block_s']:.2f} s "
                      f"of {r['async_s']:.2f} s", flush=True)
    with open(os.path.join(args.out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"\n| ranks | system | save s | save GB/s | load s | load GB/s | async blocks s | "
          f"async total s | CPU s/GB save | CPU s/GB load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = {}
    for world in sorted({r["world"] for r in rows}):
        for system in systems:
            rs = [r for r in rows if r["world"] == world and r["system"] == system]
            m = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in
                 ("system", "world", "round")}
            med[(world, system)] = m
            gb = m["bytes"] / 1e9
            print(f"| {world} | {system} | {m['save_s']:.2f} | {gb / m['save_s']:.2f} | "
                  f"{m['load_s']:.2f} | {gb / m['load_s']:.2f} | {m['async_block_s']:.2f} | "
                  f"{m['async_s']:.2f} | {m['save_cpu'] / gb:.2f} | {m['load_cpu'] / gb:.2f} |")
    print()
    for world in sorted({r["world"] for r in rows}):
        lode_m = med[(world, "lode")]
        for other in ("local", "fsspec"):
            o = med[(world, other)]
            print(f"{world} ranks: lode/{other}: save {o['save_s'] / lode_m['save_s']:.2f}x, "
                  f"load {o['load_s'] / lode_m['load_s']:.2f}x (speed ratios)")


if __name__ == "__main__":
    main()
