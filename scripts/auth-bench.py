#!/usr/bin/env python3
"""The cost of authentication on bulk I/O through a whole cluster, measured in one run.

Brings up local clusters (`lode cluster up`) with authentication off and on, and optionally
one of a previous build (`--prev DIR`, its target/release), then runs `lode bench` against
each in rotated order, one round at a time, and reports medians of write and read GB/s with
each configuration's ratio against authentication off (and against the previous build):

    scripts/auth-bench.py --lode target/release/lode --prev /tmp/prev/target/release \\
        --rounds 5 --size 1G
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(cmd, env=None):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lode", default="target/release/lode")
    ap.add_argument("--prev", help="a previous build's binary directory (no authentication)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--port", type=int, default=9600)
    a = ap.parse_args()

    root = tempfile.mkdtemp(prefix="lode-auth-bench-")
    clusters = []  # (name, lode binary, dir, port, extra flags, env additions)
    port = a.port
    if a.prev:
        clusters.append(("previous build", os.path.join(a.prev, "lode"), "prev", port, [], {}))
        port += 200
    clusters.append(("no auth", a.lode, "off", port, ["--no-auth"], {}))
    port += 200
    keyed = os.path.join(root, "keyed")
    clusters.append(("integrity", a.lode, "keyed", port, [], {"LODE_KEY": keyed + "/client.key"}))
    clusters.append(("privacy", a.lode, "keyed", port, ["--privacy"],
                     {"LODE_KEY": keyed + "/client.key"}))
    up = {}
    try:
        for name, exe, d, p, flags, _ in clusters:
            if d in up:
                continue
            path = os.path.join(root, d)
            cmd = [exe, "cluster", "up", "--dir", path, "--port", str(p)]
            if d == "off":
                cmd.append("--no-auth")
            run(cmd)
            up[d] = (exe, path)
        results = {c[0]: ([], []) for c in clusters}
        for r in range(a.rounds):
            for k in range(len(clusters)):
                name, exe, d, p, flags, extra = clusters[(k + r) % len(clusters)]
                env = dict(os.environ, LODE_MDS=f"127.0.0.1:{p}", **extra)
                out = run([exe, *flags, "bench", "--size", a.size, "--rounds", "1",
                           "--dir", f"/auth-bench-{r}-{k}"], env=env)
                m = re.search(r"lode \(library\)\s+([\d.]+)\s+([\d.]+)", out)
                if not m:
                    sys.exit(f"no figures in:\n{out}")
                results[name][0].append(float(m.group(1)))
                results[name][1].append(float(m.group(2)))
                print(f"round {r + 1}: {name}: write {m.group(1)} GB/s, read {m.group(2)} GB/s",
                      file=sys.stderr)
        med = {n: (statistics.median(w), statistics.median(rd)) for n, (w, rd) in results.items()}
        print(f"lode bench through a local cluster: {a.size} per round, {a.rounds} rounds "
              f"in rotated order, medians")
        print(f"  {'':<18} {'write GB/s':>10} {'read GB/s':>10} {'w / off':>8} {'r / off':>8}"
              + (f" {'w / prev':>9} {'r / prev':>9}" if a.prev else ""))
        base = med["no auth"]
        prev = med.get("previous build")
        for name, (w, rd) in med.items():
            line = f"  {name:<18} {w:>10.2f} {rd:>10.2f} {w / base[0]:>8.2f} {rd / base[1]:>8.2f}"
            if prev:
                line += f" {w / prev[0]:>9.2f} {rd / prev[1]:>9.2f}"
            print(line)
    finally:
        for exe, path in up.values():
            subprocess.run([exe, "cluster", "down", "--dir", path], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", root])


if __name__ == "__main__":
    main()
