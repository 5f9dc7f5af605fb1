#!/usr/bin/env python3
"""Calibrates the testbed's flow model on a running lode cluster and checks it against the cluster.

Measures, with `lode bench` in rotated order and several rounds (medians):
  A  one file of stripe count 1: one target's bandwidth, all a lone stream gets;
  D  as many files of stripe count 1 as there are targets, together as large as A's: the
     host's ceiling for independent streams (what the client's path carries at most);
  C  one file striped over every target: what the model is asked to predict.
Writes `loopback-write.toml` and `loopback-read.toml` (targets at A, the client's NIC at D),
runs `lode sim run --mode model` on each, and prints the model against C.

  scripts/calibrate-testbed.py --mds 127.0.0.1:9600 --rounds 10 --out docs/experiments
"""

import argparse
import csv
import os
import random
import statistics
import subprocess
import sys

TEMPLATE = """name = "a lode cluster on this machine, striped {direction}, calibrated"
description = "{targets} targets and one client on loopback. Calibrated from lode bench on the cluster ({rounds} rounds, medians): one file of stripe count 1 ({a:.2f} GB/s, the targets' {direction} bandwidth) and {targets} such files at once, {part} each ({d:.2f} GB/s, the host's ceiling, as the client's NIC). Predicts one {size} file striped over the {targets} targets; measured: {c:.2f} GB/s."

[topology]
clients = 1
client_nic_gbs = {d:.3f}
oss = {targets}
oss_nic_gbs = 100
targets_per_oss = 1
target_read_gbs = {a:.3f}
target_write_gbs = {a:.3f}
target_io_latency_us = 100
link_latency_us = 10

[workload]
kind = "io"
direction = "{direction}"
bytes_per_client = "{size}"
request_size = "4M"
window = 16

[workload.layout]
stripe_count = {targets}
stripe_size = "4M"
"""


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def bench(lode, env, files, size, stripes):
    """One round of lode bench: (write GB/s, read GB/s)."""
    d = f"/calibrate-{random.getrandbits(48):012x}"
    out = subprocess.run(
        [lode, "bench", "--files", str(files), "--size", size,
         "--stripe-count", str(stripes), "--rounds", "1", "--dir", d],
        env=env, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("lode (library)"):
            w, r = line.split()[-2:]
            return float(w), float(r)
    sys.exit(f"lode bench printed no result:\n{out}")


def model(lode, toml, out):
    subprocess.run([lode, "sim", "run", toml, "--mode", "model", "--out", out],
                   check=True, capture_output=True)
    with open(os.path.join(out, "runs.csv")) as f:
        row = next(csv.DictReader(f))
    return float(row["aggregate_per_s"]) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mds", default=os.environ.get("LODE_MDS", "127.0.0.1:9400"))
    p.add_argument("--lode", default="lode", help="the lode command")
    p.add_argument("--targets", type=int, default=4)
    p.add_argument("--size", default="2G", help="bytes per run")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", default=".", help="where the calibrated experiments go")
    a = p.parse_args()
    env = dict(os.environ, LODE_MDS=a.mds)
    total = parse_size(a.size)
    part = human(total // a.targets)
    runs = {
        "A": (1, a.size, 1),
        "D": (a.targets, part, 1),
        "C": (1, a.size, a.targets),
    }
    got = {k: ([], []) for k in runs}
    order = list(runs)
    for r in range(a.rounds):
        turn = order[r % len(order):] + order[:r % len(order)]
        for k in turn:
            w, rd = bench(a.lode, env, *runs[k])
            got[k][0].append(w)
            got[k][1].append(rd)
            print(f"round {r + 1}/{a.rounds} {k}: write {w:.2f} read {rd:.2f} GB/s",
                  file=sys.stderr, flush=True)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for i, direction in enumerate(("write", "read")):
        m = {k: statistics.median(v[i]) for k, v in got.items()}
        toml = os.path.join(a.out, f"loopback-{direction}.toml")
        with open(toml, "w") as f:
            f.write(TEMPLATE.format(direction=direction, targets=a.targets, rounds=a.rounds,
                                    a=m["A"], d=m["D"], c=m["C"], size=a.size, part=part))
        predicted = model(a.lode, toml, os.path.join(a.out, f"loopback-{direction}.out"))
        rows.append((direction, m["A"], m["D"], predicted, m["C"]))
    print(f"calibration on {a.mds}: {a.rounds} rounds of {a.size}, rotated, medians (GB/s)")
    print(f"  {'':6} {'A one target':>13} {'D ceiling':>10} {'model':>8} {'C measured':>11} "
          f"{'model - C':>10}")
    for direction, a_, d, predicted, c in rows:
        print(f"  {direction:6} {a_:13.2f} {d:10.2f} {predicted:8.2f} {c:11.2f} "
              f"{(predicted - c) / c:+10.1%}")
    print("spread of the rounds (lowest, quartiles, highest):")
    for i, direction in enumerate(("write", "read")):
        for k in runs:
            v = sorted(got[k][i])
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            print(f"  {direction:6} {k}: {v[0]:.2f}  {q[0]:.2f} {q[1]:.2f} {q[2]:.2f}  {v[-1]:.2f}")


if __name__ == "__main__":
    main()
