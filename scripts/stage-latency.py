#!/usr/bin/env python3
"""Where a workload's requests spend their time: scrapes the metrics endpoints of a mount and
of the servers before and after a command, and prints, for each stage of a request (the
kernel's request in the mount, its wait for readahead or for a write window, the client's call
to a storage server, the server's bulk transfer, its disk I/O), how many there were, their
mean, median and p99 in that interval.

    scripts/stage-latency.py --metrics 127.0.0.1:9690 --metrics 127.0.0.1:9451 ... \\
        -- fio --name=w --directory=/mnt/lode/data --rw=write --bs=1m --size=2g

Histograms of every endpoint given are added together per stage (the storage servers' into
one). Quantiles are read from the histograms' buckets (each 1.5 times the one before), by
linear interpolation inside the bucket.
"""
import argparse
import re
import subprocess
import sys
import urllib.request

WANTED = {
    "lode_mount_stage_seconds": ("mount", "stage"),
    "lode_client_call_latency_seconds": ("client call", "op"),
    "lode_rpc_latency_seconds": ("server rpc", "op"),
    "lode_oss_stage_seconds": ("oss", "stage"),
}
LINE = re.compile(r'^(\w+)_bucket\{(.*)\} (\S+)$')
SUM = re.compile(r'^(\w+)_sum\{(.*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(endpoints):
    """{(family, label): {le: cumulative count}}, summed over endpoints."""
    out = {}
    for e in endpoints:
        url = e if e.startswith("http") else f"http://{e}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            m = SUM.match(line)
            if m and m.group(1) in WANTED:
                labels = dict(LABEL.findall(m.group(2)))
                key = (m.group(1), labels.get(WANTED[m.group(1)][1], "?"))
                buckets = out.setdefault(key, {})
                buckets["sum"] = buckets.get("sum", 0) + float(m.group(3))
                continue
            m = LINE.match(line)
            if not m or m.group(1) not in WANTED:
                continue
            labels = dict(LABEL.findall(m.group(2)))
            key = (m.group(1), labels.get(WANTED[m.group(1)][1], "?"))
            le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets = out.setdefault(key, {})
            buckets[le] = buckets.get(le, 0) + float(m.group(3))
    return out


def quantile(buckets, q):
    """The q-quantile of a cumulative histogram {le: count}."""
    les = sorted(le for le in buckets if le != "sum")
    total = buckets[les[-1]]
    if total == 0:
        return float("nan")
    want, lo, below = q * total, 0.0, 0.0
    for le in les:
        if buckets[le] >= want:
            if le == float("inf"):
                return lo
            inside = buckets[le] - below
            return lo + (le - lo) * ((want - below) / inside if inside else 1.0)
        lo, below = le, buckets[le]
    return lo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--metrics", action="append", required=True,
                   help="a metrics endpoint, HOST:PORT or a URL; repeat for each server")
    p.add_argument("--sums", action="store_true", help="also print each stage's total seconds")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    before = scrape(a.metrics)
    if cmd:
        subprocess.run(cmd, check=True)
    else:
        input("press enter when the workload is done ")
    after = scrape(a.metrics)
    rows = []
    for key, b in after.items():
        prev = before.get(key, {})
        delta = {le: c - prev.get(le, 0) for le, c in b.items()}
        n = delta.get(float("inf"), 0)
        if n <= 0:
            continue
        mean = delta.get("sum", 0) / n
        rows.append((WANTED[key[0]][0], key[1], n, mean, quantile(delta, 0.5),
                     quantile(delta, 0.99)))
    order = {"mount": 0, "client call": 1, "server rpc": 2, "oss": 3}
    rows.sort(key=lambda r: (order[r[0]], r[1]))
    print(f"{'where':12} {'stage':16} {'count':>9} {'mean µs':>10} {'p50 µs':>10} {'p99 µs':>10}"
          + (f" {'total s':>9}" if a.sums else ""))
    for where, stage, n, mean, p50, p99 in rows:
        print(f"{where:12} {stage:16} {n:9.0f} {mean * 1e6:10.0f} {p50 * 1e6:10.0f} "
              f"{p99 * 1e6:10.0f}" + (f" {n * mean:9.2f}" if a.sums else ""))


if __name__ == "__main__":
    sys.exit(main())
