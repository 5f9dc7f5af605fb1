#!/usr/bin/env python3
"""Loading a multi-GB safetensors file: lode.safetensors.load_file against the safetensors
package's own load_file from a local file and from lode's mount, in the same run (every page
touched after each load, so a lazily mapped file counts its reads).

    scripts/safetensors-bench.py --mds 127.0.0.1:9400 --mount /mnt/lode --local /var/tmp \
        --size 2G --device cpu        # or --device cuda on a machine with a GPU

The same file (float16 tensors of 64 MiB, as model weights come) is written to lode (striped
over every target) and to the local directory. Each round drops the page cache before each
load and takes the three in rotated order; medians of GB/s and CPU seconds per GB are printed
with lode's ratios. On a GPU the package's loads go through host memory then `.to(device)`
(its own `device=` does the same); lode's land in device memory from the storage servers.
"""

import argparse
import os
import resource
import statistics
import time


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mds", default=os.environ.get("LODE_MDS", "127.0.0.1:9400"))
    ap.add_argument("--mount", required=True, help="where lode is mounted")
    ap.add_argument("--local", default="/var/tmp")
    ap.add_argument("--size", type=size_of, default=size_of("2G"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch
    import lode
    import lode.safetensors as lst
    import safetensors.torch as st

    fs = lode.connect(args.mds)
    fs.mkdir("/st-bench", parents=True)
    fs.setstripe("/st-bench", stripe_count=-1, stripe_size=4 << 20)
    n = max(1, args.size // (64 << 20))
    g = torch.Generator().manual_seed(1)
    weights = {f"model.layers.{i}.weight": torch.randn(32 << 20, generator=g).half()
               for i in range(n)}
    local = os.path.join(args.local, "st-bench.safetensors")
    st.save_file(weights, local)
    lst.save_file(weights, "/st-bench/model.safetensors", fs=fs)
    nbytes = os.path.getsize(local)
    del weights
    mounted = os.path.join(args.mount, "st-bench", "model.safetensors")
    dev = torch.device(args.device)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def touch(tensors):
        # A byte of every page: the package's CPU loads may map the file and read it lazily,
        # so "loaded" means every byte in memory for all three.
        for t in tensors.values():
            flat = t.reshape(-1).view(torch.uint8)
            flat[::4096].sum()

    loads = {
        "lode": lambda: lst.load_file("/st-bench/model.safetensors", device=dev, fs=fs),
        "local": lambda: st.load_file(local, device=str(dev)),
        "mount": lambda: st.load_file(mounted, device=str(dev)),
    }
    names = list(loads)
    times = {k: [] for k in names}
    cpus = {k: [] for k in names}
    for rnd in range(args.rounds):
        for name in names[rnd % 3:] + names[:rnd % 3]:
            drop_caches()
            t, c = time.perf_counter(), cpu()
            out = loads[name]()
            touch(out)
            sync()
            times[name].append(time.perf_counter() - t)
            cpus[name].append(cpu() - c)
            assert len(out) == n
            del out
            print(f"round {rnd} {name:5}: {nbytes / 1e9 / times[name][-1]:.2f} GB/s", flush=True)
    gb = nbytes / 1e9
    print(f"\n{gb:.2f} GB into {dev}; medians of {args.rounds} rounds")
    print("| load | s | GB/s | CPU s/GB |\n|---|---|---|---|")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in names:
        print(f"| {k} | {med[k]:.2f} | {gb / med[k]:.2f} | {statistics.median(cpus[k]) / gb:.2f} |")
    print(f"lode/local {med['local'] / med['lode']:.2f}x, lode/mount "
          f"{med['mount'] / med['lode']:.2f}x (speed ratios)")
    fs.rm("/st-bench", recursive=True)
    os.unlink(local)


if __name__ == "__main__":
    main()
