#!/usr/bin/env python3
"""Encryption at rest against clear, in the same run: sequential write and read through the
library (`lode bench`, one file striped over every target, and a checkpoint: write a temporary
file, fsync, rename), rounds alternating between a clear directory and an encrypted one, with
GB/s and CPU seconds per GB (the bench process and the servers, from /proc); then, with
--mount, the mount's data path on both directories (scripts/mount-data-bench.py, fio through
the page cache, cold reads, random reads, a checkpoint), the encrypted one divided by the clear.

    scripts/crypt-bench.py --bin target/release --key-file KEY [--size 1G] [--rounds 3]
        [--mount /mnt/lode --local /var/tmp/bench]

Needs LODE_MDS and LODE_KEY for a running cluster; KEY is 64 random bytes (it is unlocked in
the keyring for the run). Makes /crypt-bench-clear and /crypt-bench-enc.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def servers_cpu():
    """CPU seconds used so far by the servers (lode-oss, lode-mds)."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                exe = os.path.basename(f.read().split(b"\0")[0])
            if exe not in (b"lode-oss", b"lode-mds"):
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError, ValueError):
            continue
    return total


def size_bytes(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s.upper())
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def bench(lode, d, size, checkpoint):
    """One round of `lode bench` in `d`: write GB/s, read GB/s, checkpoint seconds, CPU
    seconds of the bench process and of the servers."""
    before = os.times()
    s0 = servers_cpu()
    out = subprocess.run(
        [lode, "bench", "--rounds", "1", "--size", size, "--dir", d, "--checkpoint", checkpoint],
        check=True, capture_output=True, text=True).stdout
    after = os.times()
    s1 = servers_cpu()
    row = re.search(r"lode \(library\)\s+([\d.]+)\s+([\d.]+)", out)
    ck = re.search(r"checkpoint of \S+: lode ([\d.]+) s", out)
    if not row or not ck:
        sys.exit(f"crypt-bench: cannot read lode bench's report:\n{out}")
    client = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return float(row.group(1)), float(row.group(2)), float(ck.group(1)), client, s1 - s0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release")
    p.add_argument("--key-file", required=True)
    p.add_argument("--size", default="1G")
    p.add_argument("--checkpoint", default="1G")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mount", help="a mount of the same cluster, for the mount's data path")
    p.add_argument("--local", help="a local directory for the mount bench's baseline")
    a = p.parse_args()
    lode = os.path.join(a.bin, "lode")
    run = lambda *args: subprocess.run([lode, *args], check=True, capture_output=True, text=True)
    for d in ("/crypt-bench-clear", "/crypt-bench-enc"):
        subprocess.run([lode, "mkdir", d], capture_output=True)
    st = run("crypt", "status", "/crypt-bench-enc").stdout
    if "not encrypted" in st:
        run("crypt", "set", "/crypt-bench-enc", "--key-file", a.key_file)
    run("crypt", "unlock", "/crypt-bench-enc", "--key-file", a.key_file)
    gb = size_bytes(a.size) / 1e9
    rows = {"clear": [], "encrypted": []}
    for r in range(a.rounds):
        order = ["clear", "encrypted"] if r % 2 == 0 else ["encrypted", "clear"]
        for kind in order:
            d = "/crypt-bench-clear" if kind == "clear" else "/crypt-bench-enc"
            w, rd, ck, client, servers = bench(lode, f"{d}/r{r}", a.size, a.checkpoint)
            # Each round writes and reads the file once, and writes the checkpoint.
            moved = 2 * gb + size_bytes(a.checkpoint) / 1e9
            rows[kind].append((w, rd, ck, client / moved, servers / moved))
            print(f"round {r} {kind:9}: write {w:.2f} GB/s, read {rd:.2f} GB/s, "
                  f"checkpoint {ck:.2f} s, CPU s/GB client {client / moved:.2f} "
                  f"servers {servers / moved:.2f}", flush=True)
    med = {k: [statistics.median(c) for c in zip(*v)] for k, v in rows.items()}
    print(f"\nlibrary, {a.size} striped over every target, {a.checkpoint} checkpoint, "
          f"{a.rounds} rounds alternating, medians")
    print(f"{'':12}{'write GB/s':>12}{'read GB/s':>12}{'ckpt s':>10}{'client CPU s/GB':>18}"
          f"{'server CPU s/GB':>18}")
    for k in ("clear", "encrypted"):
        m = med[k]
        print(f"{k:12}{m[0]:12.2f}{m[1]:12.2f}{m[2]:10.2f}{m[3]:18.2f}{m[4]:18.2f}")
    c, e = med["clear"], med["encrypted"]
    print(f"{'enc/clear':12}{e[0] / c[0]:12.2f}{e[1] / c[1]:12.2f}{c[2] / e[2]:10.2f}"
          "   (checkpoint: clear time / encrypted time)")
    if a.mount:
        if not a.local:
            sys.exit("crypt-bench: --mount needs --local")
        here = os.path.dirname(os.path.abspath(__file__))
        print("\nthe mount: encrypted against clear (and local), same run", flush=True)
        subprocess.run([sys.executable, os.path.join(here, "mount-data-bench.py"),
                        "--mount", f"encrypted={a.mount}/crypt-bench-enc",
                        "--mount", f"clear={a.mount}/crypt-bench-clear",
                        "--local", a.local, "--rounds", str(a.rounds),
                        "--size", a.size.lower()], check=True)


if __name__ == "__main__":
    main()
