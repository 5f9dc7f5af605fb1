#!/usr/bin/env python3
"""A crash campaign on HSM: files of a linked bucket and files written in lode are archived,
released and read (restored) at random, while the copytool or the MDS is killed with SIGKILL
at random moments and started again. Every read that succeeds must return the file's bytes;
afterwards, with the queue drained, every file must read back byte-exact, every released file
must have its bytes whole in S3 under its state's key and ETag, every archived and clean one
too, and `lode-mds fsck` must find the namespace sound.

    scripts/hsm-crash-campaign.py --dir /tmp/lode-hsm-camp [--rounds 8] [--files 12]
                                  [--seed 1] [--port 9650] [--bin target/debug]

Needs moto's S3 server (`pip install 'moto[server]'`) and `lode` built (--bin DIR). Exits 1 if
a read returned wrong bytes, a file is neither whole in lode nor whole in S3, or fsck fails.
"""
import argparse
import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

import boto3


def data(key):
    """The bytes of file `key`: 1 to 6 MiB, from its name."""
    h = hashlib.sha256(key.encode()).digest()
    n = (1 << 20) + int.from_bytes(h[:3], "little") % (5 << 20)
    return (h * (n // 32 + 1))[:n]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids(cluster, kind):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(args[0]) == kind.encode() and any(
                a.startswith(cluster.encode() + b"/") for a in args):
            out.append(int(pid))
    return out


class S3:
    """The bucket `camp`, through boto3 (signed requests, as moto's server wants for reads)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id="camp", aws_secret_access_key="camp")

    def make_bucket(self):
        self.c.create_bucket(Bucket="camp")

    def put(self, key, body):
        self.c.put_object(Bucket="camp", Key=key, Body=body)

    def get(self, key):
        """The object's bytes and ETag."""
        r = self.c.get_object(Bucket="camp", Key=key)
        return r["Body"].read(), r["ETag"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=9650)
    ap.add_argument("--bin", default="target/debug")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    bindir = os.path.abspath(a.bin)
    lode = os.path.join(bindir, "lode")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    cluster = os.path.join(a.dir, "cluster")
    s3port = free_port()
    s3 = S3(f"http://127.0.0.1:{s3port}")
    env = dict(os.environ, LODE_MDS=f"127.0.0.1:{a.port}", AWS_ACCESS_KEY_ID="camp",
               AWS_SECRET_ACCESS_KEY="camp", LODE_KEY=os.path.join(cluster, "client.key"))
    key = os.path.join(cluster, "cluster.key")
    up = [lode, "cluster", "up", "--dir", cluster, "--port", str(a.port)]
    moto = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(s3port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tool = None
    log = open(os.path.join(a.dir, "copytool.log"), "a")

    def copytool():
        return subprocess.Popen([os.path.join(bindir, "lode-copytool"), "--key", key,
                                 "--part-size", "1M"], env=env,
                                stdout=subprocess.DEVNULL, stderr=log)

    def run(*args, admin=False, **kw):
        base = [lode] + (["--key", key] if admin else [])
        return subprocess.run(base + list(args), env=env, capture_output=True, **kw)

    bad = []
    try:
        for _ in range(100):
            try:
                s3.make_bucket()
                break
            except Exception:
                time.sleep(0.2)
        files = {}
        for k in range(a.files // 2):
            name = f"imp{k}.bin"
            files[name] = data(name)
            s3.put(f"set/{name}", files[name])
        subprocess.run(up, check=True, env=env, stdout=subprocess.DEVNULL)
        tool = copytool()
        run("mkdir", "/lake", admin=True, check=True)
        run("hsm", "link", "/lake", "s3://camp/set", "--endpoint", s3.endpoint, admin=True,
            check=True)
        deadline = time.monotonic() + 60
        while "importing" in run("hsm", "links", check=True, text=True).stdout:
            assert time.monotonic() < deadline, "the import never ended"
            time.sleep(0.1)
        for k in range(a.files - a.files // 2):
            name = f"new{k}.bin"
            files[name] = data(name)
            src = os.path.join(a.dir, name)
            with open(src, "wb") as f:
                f.write(files[name])
            run("cp", f"local:{src}", f"/lake/{name}", check=True)
            os.unlink(src)
        names = sorted(files)

        reads = 0
        for r in range(a.rounds):
            ops = []
            for name in names:
                what = rnd.choice(["archive", "release", "read", "none"])
                if what == "archive":
                    ops.append((name, what, subprocess.Popen(
                        [lode, "hsm", "archive", f"/lake/{name}"], env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
                elif what == "release":
                    ops.append((name, what, subprocess.Popen(
                        [lode, "hsm", "release", f"/lake/{name}"], env=env,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
                elif what == "read":
                    ops.append((name, what, subprocess.Popen(
                        [lode, "cat", f"/lake/{name}"], env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)))
            time.sleep(rnd.uniform(0.05, 1.5))
            victim = rnd.choice(["copytool", "mds"])
            if victim == "copytool":
                tool.send_signal(signal.SIGKILL)
                tool.wait()
                time.sleep(rnd.uniform(0, 0.5))
                tool = copytool()
            else:
                for p in pids(cluster, "lode-mds"):
                    os.kill(p, signal.SIGKILL)
                time.sleep(rnd.uniform(0, 0.5))
                subprocess.run(up, check=True, env=env, stdout=subprocess.DEVNULL)
            for name, what, p in ops:
                try:
                    out, _ = p.communicate(timeout=180)
                except subprocess.TimeoutExpired:
                    p.kill()
                    bad.append(f"round {r + 1}: {what} of {name} hung")
                    continue
                if what == "read" and p.returncode == 0:
                    reads += 1
                    if out != files[name]:
                        bad.append(f"round {r + 1}: a read of {name} returned other bytes "
                                   f"({len(out)} of {len(files[name])})")
            print(f"round {r + 1}: {len(ops)} operations, {victim} killed", flush=True)

        # The queue drains (a killed copytool's actions go to another after 30 s).
        deadline = time.monotonic() + 240
        while True:
            st = run("hsm", "status", text=True).stdout
            if st and not any(" running " in l or " waiting " in l for l in st.splitlines()):
                break
            if time.monotonic() > deadline:
                bad.append(f"the queue never drained:\n{st}")
                break
            time.sleep(0.5)
        states = {}
        for name in names:
            st = run("hsm", "state", f"/lake/{name}", text=True).stdout
            states[name] = st
            words = st.split(")", 1)[1].split(",")[0] if ")" in st else ""
            obj_key = next((l.split(": ", 1)[1] for l in st.splitlines()
                            if l.strip().startswith("key:")), None)
            etag = next((l.split(": ", 1)[1] for l in st.splitlines()
                         if l.strip().startswith("etag:")), None)
            archived_clean = "archived" in words and "dirty" not in words
            if archived_clean or "released" in words:
                try:
                    body, there = s3.get(obj_key)
                except Exception as e:
                    bad.append(f"{name}: {words.strip()}, but its object {obj_key}: {e}")
                    continue
                if body != files[name] or there != etag:
                    bad.append(f"{name}: {words.strip()}, but its object differs "
                               f"(ETag {there}, state {etag})")
            out = run("cat", f"/lake/{name}").stdout
            if out != files[name]:
                bad.append(f"{name} ({words.strip()}) reads back {len(out)} bytes, not its own")
        released = sum("released" in s for s in states.values())
        archived = sum("archived" in s for s in states.values())
        print(f"{len(names)} files: {archived} archived, {released} released at the end; "
              f"{reads} reads during the kills, all byte-exact" if not bad else "", flush=True)
    finally:
        if tool:
            tool.kill()
        subprocess.run([lode, "cluster", "down", "--dir", cluster], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        moto.kill()
    fsck = subprocess.run([os.path.join(bindir, "lode-mds"), "fsck", "--data-dir",
                           os.path.join(cluster, "mds")], capture_output=True, text=True)
    print(fsck.stdout.strip())
    if fsck.returncode != 0:
        bad.append("fsck: " + fsck.stdout + fsck.stderr)
    for b in bad:
        print("BAD:", b)
    if bad:
        sys.exit(1)
    shutil.rmtree(a.dir, ignore_errors=True)
    print("every file whole in lode or in S3, states consistent, fsck clean")


if __name__ == "__main__":
    main()
