#!/usr/bin/env python3
"""Host reads against staged reads into GPU memory, in the same run, from one striped file.

Needs a running cluster ($LODE_MDS, $LODE_KEY), CUDA and PyTorch. Rounds alternate their order;
the report gives medians of GB/s and CPU seconds per GB for each, and the ratio of the two."""

import argparse
import os
import resource
import statistics
import sys
import time


def size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=size, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--path", default="/gpu-bench/shard")
    a = ap.parse_args()
    import torch

    import lode
    if not torch.cuda.is_available():
        sys.exit("gpu-bench: no CUDA device")
    fs = lode.connect(os.environ.get("LODE_MDS", "127.0.0.1:9400"), gpu="cuda")
    parent = a.path.rsplit("/", 1)[0] or "/"
    fs.mkdir(parent, parents=True)
    fs.setstripe(parent, stripe_count=-1, stripe_size=4 << 20)
    with fs.open(a.path, "wb") as f:
        block = os.urandom(64 << 20)
        for _ in range(a.size // len(block)):
            f.write(block)
        f.fsync()
    n = fs.stat(a.path)["size"]
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    kinds = {"host": lambda f: f.readinto(host.numpy()),
             "gpu-staged": lambda f: f.readinto(dev, path="staged")}
    results = {k: [] for k in kinds}
    for r in range(a.rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            with fs.open(a.path, "rb") as f:
                c0, t0 = cpu(), time.perf_counter()
                got = kinds[k](f)
                torch.cuda.synchronize()
                t, c = time.perf_counter() - t0, cpu() - c0
            assert got == n, (k, got, n)
            results[k].append((n / t / 1e9, c / (n / 1e9)))
    print(f"{'read':<12} {'GB/s':>8} {'CPU s/GB':>9}")
    med = {}
    for k, rs in results.items():
        med[k] = statistics.median(x for x, _ in rs)
        print(f"{k:<12} {med[k]:>8.2f} {statistics.median(c for _, c in rs):>9.3f}")
    print(f"gpu-staged / host = {med['gpu-staged'] / med['host']:.2f} (goal: at least 0.80)")
    # The bytes on the device are the file's.
    assert torch.equal(dev.cpu(), host)


if __name__ == "__main__":
    main()
