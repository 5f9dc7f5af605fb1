#!/usr/bin/env python3
"""A linked bucket, measured: how long a link takes to name every object, the first full read
of the set through the mount (every file restored from S3 as it is read), a second read (the
bytes in lode now), and, in the same run, the same objects read straight from the S3 server
with parallel ranged GETs from Python (the baseline).

    scripts/hsm-bench.py --bin target/release [--objects 10000] [--big 4] [--threads 16]

It starts everything itself on loopback: moto's S3 server (`pip install 'moto[server]'`), a
`lode cluster up`, a copytool and a mount. Object sizes: `--objects` minus `--big` drawn
log-uniform from 1 KiB to `--small-max` (1 MiB), and `--big` from 64 MiB up to `--big-max`
(256 MiB), so the whole set fits this machine's memory and disk while spanning the sizes.
Caches are dropped before every read (root). The baseline reads each object with ranged GETs of
`--range` bytes (8 MiB), `--threads` objects at a time, as the mount's readers are.
"""
import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import boto3
from botocore.config import Config


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError:
        print("warning: cannot drop caches (not root)", file=sys.stderr)


def sizes(n, big, small_max, big_max, seed):
    r = random.Random(seed)
    out = [int(math.exp(r.uniform(math.log(1024), math.log(small_max)))) for _ in range(n - big)]
    lo = 64 << 20
    out += [lo + (big_max - lo) * k // max(big - 1, 1) for k in range(big)]
    r.shuffle(out)
    return out


def read_tree(root, names, threads):
    """Reads every file fully with `threads` readers; bytes read."""
    def one(name):
        n = 0
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            while True:
                b = f.read(8 << 20)
                if not b:
                    return n
                n += len(b)
    with cf.ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(one, names))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--objects", type=int, default=10000)
    ap.add_argument("--big", type=int, default=4)
    ap.add_argument("--small-max", type=int, default=1 << 20)
    ap.add_argument("--big-max", type=int, default=256 << 20)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--range", type=int, default=8 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--port", type=int, default=9700, help="the cluster's first port")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    bindir = os.path.abspath(a.bin)
    lode = os.path.join(bindir, "lode")
    work = a.dir or tempfile.mkdtemp(prefix="lode-hsm-bench-")
    os.makedirs(work, exist_ok=True)
    procs = []
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
    mdsport = a.port
    cluster = os.path.join(work, "cluster")
    mnt = os.path.join(work, "mnt")
    res = {}
    try:
        subprocess.run([lode, "cluster", "up", "--dir", cluster, "--port", str(mdsport)],
                       check=True, stdout=subprocess.DEVNULL)
        s3port = free_port()
        endpoint = f"http://127.0.0.1:{s3port}"
        procs.append(subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(s3port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="bench", aws_secret_access_key="bench",
                          config=Config(max_pool_connections=a.threads * 2))
        for _ in range(100):
            try:
                s3.create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.2)
        sz = sizes(a.objects, a.big, a.small_max, a.big_max, a.seed)
        names = [f"d{k % 100:02d}/o{k:05d}.bin" for k in range(len(sz))]
        total = sum(sz)
        print(f"{len(sz)} objects, {total / 2**30:.2f} GiB "
              f"({min(sz)} B to {max(sz) / 2**20:.0f} MiB); uploading", flush=True)
        blob = os.urandom(max(sz))

        def put(i):
            s3.put_object(Bucket="bench", Key=f"set/{names[i]}", Body=blob[:sz[i]])
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(put, range(len(sz))))

        env["LODE_MDS"] = f"127.0.0.1:{mdsport}"
        env["LODE_KEY"] = os.path.join(cluster, "client.key")
        admin = [lode, "--key", os.path.join(cluster, "cluster.key")]
        procs.append(subprocess.Popen(
            [os.path.join(bindir, "lode-copytool"), "--key", os.path.join(cluster, "cluster.key"),
             "--workers", str(a.threads)],
            env=env, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "copytool.log"), "w")))
        subprocess.run(admin + ["mkdir", "/lake"], env=env, check=True)
        t0 = time.monotonic()
        subprocess.run(admin + ["hsm", "link", "/lake", "s3://bench/set", "--endpoint", endpoint],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        while "importing" in subprocess.run([lode, "hsm", "links"], env=env, check=True,
                                            capture_output=True, text=True).stdout:
            time.sleep(0.05)
        res["link_s"] = time.monotonic() - t0
        print(f"link: every name in {res['link_s']:.2f} s "
              f"({len(sz) / res['link_s']:.0f} names/s)", flush=True)

        os.makedirs(mnt, exist_ok=True)
        subprocess.run([lode, "mount", "--daemon", mnt], env=env, check=True)
        root = os.path.join(mnt, "lake")
        listed = sum(len(fs) for _, _, fs in os.walk(root))
        assert listed == len(sz), f"{listed} names listed, {len(sz)} objects"

        def baseline():
            def one(i):
                key, n, at = f"set/{names[i]}", sz[i], 0
                while at < n:
                    end = min(at + a.range, n) - 1
                    b = s3.get_object(Bucket="bench", Key=key,
                                      Range=f"bytes={at}-{end}")["Body"].read()
                    at += len(b)
                return at
            with cf.ThreadPoolExecutor(a.threads) as ex:
                return sum(ex.map(one, range(len(sz))))

        runs = {}
        for label, fn in [("s3 direct (boto3, ranged GETs)", baseline),
                          ("lode, first read (restored from S3)",
                           lambda: read_tree(root, names, a.threads)),
                          ("lode, second read", lambda: read_tree(root, names, a.threads))]:
            drop_caches()
            t = time.monotonic()
            n = fn()
            dt = time.monotonic() - t
            assert n == total, f"{label}: {n} bytes of {total}"
            runs[label] = dt
            print(f"{label}: {dt:.2f} s, {total / dt / 2**20:.0f} MiB/s, "
                  f"{len(sz) / dt:.0f} files/s", flush=True)
        res["runs"] = runs
        base = runs["s3 direct (boto3, ranged GETs)"]
        for k, v in runs.items():
            print(f"  {k}: {base / v:.2f}x the direct read's rate")
        res.update(objects=len(sz), bytes=total, threads=a.threads)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    finally:
        subprocess.run([lode, "umount", mnt], env=env, stderr=subprocess.DEVNULL)
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run([lode, "cluster", "down", "--dir", cluster], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
