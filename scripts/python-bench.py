#!/usr/bin/env python3
"""Python against the Rust library, in the same run, on a running lode cluster:

    python3 scripts/python-bench.py --mds 127.0.0.1:9400 [--gib 2] [--rounds 3] [--samples 20000]

1. Shards: reads --gib GiB of 64 MiB shards (striped over every target, 4 MiB stripes) with
   `readinto` into one numpy buffer from Python, and with the Rust library alone (the same
   reads, `read_into` a registered 64 MiB buffer), rounds in rotated order; medians, ratio.
2. Samples: 4 KiB at random offsets of those shards, with one `read_ranges` call for all of
   them against one `seek` + `readinto` at a time; samples/s, ratio.
CPU seconds per GB are this process's (the Rust runtime's threads included).
"""
import argparse
import random
import statistics
import time

import numpy as np

import lode

SHARD = 64 << 20


def timed(f):
    t, c = time.perf_counter(), time.process_time()
    n = f()
    return n, time.perf_counter() - t, time.process_time() - c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mds", default="127.0.0.1:9400")
    ap.add_argument("--gib", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--dir", default="/bench-py")
    a = ap.parse_args()
    fs = lode.connect(a.mds)
    if fs.exists(a.dir):
        fs.rm(a.dir, recursive=True)
    fs.mkdir(a.dir, parents=True)
    fs.setstripe(a.dir, stripe_count=-1, stripe_size=4 << 20)
    n = a.gib * (1 << 30) // SHARD
    paths = [f"{a.dir}/shard-{i:05}" for i in range(n)]
    block = np.random.default_rng(0).integers(0, 255, SHARD, dtype=np.uint8)
    for p in paths:
        with fs.open(p, "wb") as f:
            f.write(block)
    buf = np.empty(SHARD, dtype=np.uint8)

    def python_readinto():
        total = 0
        for p in paths:
            with fs.open(p, "rb") as f:
                while k := f.readinto(buf):
                    total += k
        return total

    def rust():
        return fs._fs._read_files_native(paths, SHARD)

    runs = {"python readinto": [], "rust read_into": []}
    order = list(runs)
    for r in range(a.rounds):
        for name in order[r % 2:] + order[:r % 2]:
            got, secs, cpu = timed(python_readinto if name.startswith("python") else rust)
            assert got == n * SHARD, got
            runs[name].append((got / secs / 1e9, cpu / (got / 1e9)))
            print(f"round {r + 1} {name:16} {got / secs / 1e9:.2f} GB/s", flush=True)
    med = {k: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v))
           for k, v in runs.items()}
    py, rs = med["python readinto"], med["rust read_into"]
    print(f"\n{a.gib} GiB of 64 MiB shards, medians of {a.rounds}:")
    print(f"  python readinto {py[0]:.2f} GB/s ({py[1]:.2f} CPU s/GB)")
    print(f"  rust read_into  {rs[0]:.2f} GB/s ({rs[1]:.2f} CPU s/GB)")
    print(f"  ratio python/rust {py[0] / rs[0]:.2f}")

    rng = random.Random(1)
    ranges = [(rng.choice(paths), rng.randrange(0, SHARD - 4096) & ~4095, 4096)
              for _ in range(a.samples)]
    bufs = [np.empty(4096, dtype=np.uint8) for _ in ranges]

    def batched():
        return sum(fs.read_ranges(ranges, into=bufs))

    def one_at_a_time():
        files = {p: fs.open(p, "rb") for p in paths}
        total = 0
        for (p, off, k), b in zip(ranges, bufs):
            f = files[p]
            f.seek(off)
            total += f.readinto(b)
        for f in files.values():
            f.close()
        return total

    res = {"read_ranges": [], "one at a time": []}
    order = list(res)
    for r in range(a.rounds):
        for name in order[r % 2:] + order[:r % 2]:
            got, secs, _ = timed(batched if name == "read_ranges" else one_at_a_time)
            assert got == 4096 * a.samples
            res[name].append(a.samples / secs)
            print(f"round {r + 1} {name:14} {a.samples / secs:,.0f} samples/s", flush=True)
    b, o = statistics.median(res["read_ranges"]), statistics.median(res["one at a time"])
    print(f"\n{a.samples} samples of 4 KiB at random offsets, medians of {a.rounds}:")
    print(f"  read_ranges   {b:,.0f} samples/s")
    print(f"  one at a time {o:,.0f} samples/s")
    print(f"  ratio {b / o:.1f}x")
    fs.rm(a.dir, recursive=True)


if __name__ == "__main__":
    main()
