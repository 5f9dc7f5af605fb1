#!/usr/bin/env python3
"""Metadata rates of two builds of lode, measured in one run, rounds in rotated order.

For each build (a directory holding lode and lode-mds):
  - `lode-mds bench --files F --rounds 1`: create, stat, readdir, rename and unlink through the
    real RPC path by 1 and 8 clients, with integrity protection (an MDS in its own process);
  - `lode bench --meta --clients 8 --meta-files N --meta-modes ahead,durable --rounds 1`
    against a cluster brought up with `lode cluster up` (creates answered ahead and durable).
Medians per build, and the ratio of the second build to the first.

  scripts/security-bench.py --build before=DIR --build after=DIR [--rounds 3]
"""
import argparse, os, re, statistics, subprocess, sys, tempfile

def run(*a, **k):
    return subprocess.run(a, check=True, capture_output=True, text=True, **k).stdout

def mds_bench(bins, files):
    d = tempfile.mkdtemp(prefix="lode-secbench-mds-", dir="/var/tmp")
    try:
        out = run(os.path.join(bins, "lode-mds"), "bench", "--dir", d, "--files", str(files),
                  "--rounds", "1")
    finally:
        subprocess.run(["rm", "-rf", d])
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s+(lode.*?integrity.*?)\s{2,}([\d\s]+)$", line)
        if m:
            rows[m.group(1).strip()] = [float(x) for x in m.group(2).split()]
    return rows

def meta_bench(bins, files, port):
    d = tempfile.mkdtemp(prefix="lode-secbench-")
    lode = os.path.join(bins, "lode")
    run(lode, "cluster", "up", "--dir", d, "--port", str(port))
    try:
        env = dict(os.environ, LODE_MDS=f"127.0.0.1:{port}", LODE_KEY=os.path.join(d, "client.key"))
        out = run(lode, "bench", "--meta", "--clients", "8", "--meta-files", str(files),
                  "--meta-modes", "ahead,durable", "--rounds", "1", env=env)
    finally:
        subprocess.run([lode, "cluster", "down", "--dir", d], capture_output=True)
        subprocess.run(["rm", "-rf", d])
    rates = {}
    for line in out.splitlines():
        w = line.split()
        if w and w[0] in ("create", "stat", "unlink"):
            # op, commit-behind, durable, local, ahead, ...
            vals = [float(x[:-2]) if x.endswith("/s") else None for x in w[1:5]]
            rates[w[0] + " durable"] = vals[1]
            rates[w[0] + " ahead"] = vals[3]
    return rates

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mds-files", type=int, default=2000)
    ap.add_argument("--meta-files", type=int, default=20000)
    ap.add_argument("--only", choices=["mds", "meta"], help="run one of the two benchmarks")
    a = ap.parse_args()
    builds = [b.split("=", 1) for b in a.build]
    res = {name: {} for name, _ in builds}
    for r in range(a.rounds):
        order = builds[r % len(builds):] + builds[:r % len(builds)]
        for i, (name, bins) in enumerate(order):
            if a.only != "meta":
                for k, v in mds_bench(bins, a.mds_files).items():
                    for op, x in zip(["create", "stat", "readdir", "rename", "unlink"], v):
                        res[name].setdefault(f"mds-bench {k}: {op}", []).append(x)
            if a.only != "mds":
                for k, v in meta_bench(bins, a.meta_files, 19600 + 20 * i).items():
                    if v is not None:
                        res[name].setdefault(f"lode bench --meta: {k}", []).append(v)
            print(f"round {r + 1}: {name} done", file=sys.stderr)
    first, second = builds[0][0], builds[1][0]
    print(f"{'':62} {first:>10} {second:>10} {second + '/' + first:>14}")
    for key in res[first]:
        x = statistics.median(res[first][key])
        y = statistics.median(res[second].get(key, [float('nan')]))
        print(f"{key:62} {x:>10.0f} {y:>10.0f} {y / x:>14.2f}   "
              f"{' '.join(f'{v:.0f}' for v in res[first][key])} | "
              f"{' '.join(f'{v:.0f}' for v in res[second].get(key, []))}")

if __name__ == "__main__":
    main()
