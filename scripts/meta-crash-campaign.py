#!/usr/bin/env python3
"""A crash campaign on the namespace, through the mount: writer processes create files with
data, overwrite them (O_TRUNC), rename and unlink them, each in its own directory, one call at a
time, while a server is killed with SIGKILL at random moments and started again with
`lode cluster up`. Every change a call returned success for is acknowledged; afterwards a fresh
mount must show exactly the acknowledged names, each with the bytes of its last acknowledged
write (the one change in flight per writer when it stopped may have happened or not).

    scripts/meta-crash-campaign.py --dir /tmp/lode-camp [--rounds 10] [--writers 3]
                                   [--seed 1] [--kill mds|oss|any] [--port 9400]
                                   [--mdts N [--stripe]]

With --mdts N the cluster has N metadata servers (`--kill mds` kills any of them); with
--stripe each writer's directory is striped over all N (`lode setdirstripe -c N`), so its
creates spread over the MDTs and its renames between names on different MDTs are renames
across MDTs.

Needs root, /dev/fuse and `lode` on PATH (or --bin DIR). The cluster is made under --dir (4
storage servers), used, then stopped; it exits 1 if anything acknowledged is missing, extra or
different.
"""
import argparse
import hashlib
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time


def data(key, gen):
    """The bytes version `gen` of the file first made as `key` holds: 1 to 30,000 of them."""
    h = hashlib.sha256(f"{key}:{gen}".encode()).digest()
    n = 1 + int.from_bytes(h[:2], "little") % 30000
    return (h * (n // 32 + 1))[:n]


def writer(root, wid, stop, q, seed):
    rnd = random.Random(seed)
    d = f"{root}/w{wid}"
    os.makedirs(d, exist_ok=True)
    live = {}  # name -> (key, gen)
    n = 0
    while not stop.is_set():
        op = rnd.random()
        try:
            if op < 0.55 or len(live) < 5:
                name = f"f{n}"
                n += 1
                q.put(("try", wid, name, None))
                fd = os.open(f"{d}/{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.write(fd, data(name, 0))
                os.close(fd)
                live[name] = (name, 0)
                q.put(("put", wid, name, live[name]))
            elif op < 0.7:
                name = rnd.choice(sorted(live))
                new = f"r{n}"
                n += 1
                q.put(("try", wid, name, new))
                os.rename(f"{d}/{name}", f"{d}/{new}")
                live[new] = live.pop(name)
                q.put(("rename", wid, name, (new, live[new])))
            elif op < 0.85:
                name = rnd.choice(sorted(live))
                q.put(("try", wid, name, None))
                os.unlink(f"{d}/{name}")
                live.pop(name)
                q.put(("del", wid, name, None))
            else:
                name = rnd.choice(sorted(live))
                key, gen = live[name][0], live[name][1] + 1
                q.put(("try", wid, name, None))
                fd = os.open(f"{d}/{name}", os.O_WRONLY | os.O_TRUNC)
                os.write(fd, data(key, gen))
                os.close(fd)
                live[name] = (key, gen)
                q.put(("put", wid, name, live[name]))
        except OSError as e:
            # Nothing may fail: a server away is waited for, not reported.
            q.put(("err", wid, repr(e), None))
            return


def servers(cluster, kind):
    """Pids of the cluster's `kind` servers (lode-mds or lode-oss) by their data directories."""
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
    return sorted(out)


def mount(bin_dir, point, env):
    os.makedirs(point, exist_ok=True)
    log = open(f"{point}.log", "w")
    subprocess.Popen([f"{bin_dir}lode", "mount", "-o", "allow_other", point], stdout=log,
                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
    for _ in range(120):
        if os.path.ismount(point):
            return
        time.sleep(0.25)
    sys.exit(f"{point}: the mount did not come up (see {point}.log)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--writers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill", choices=["mds", "oss", "any"], default="any")
    p.add_argument("--port", type=int, default=9400, help="the MDS's (storage servers: after)")
    p.add_argument("--bin", default="", help="where lode, lode-mds and lode-oss are")
    p.add_argument("--mdts", type=int, default=1, help="metadata servers")
    p.add_argument("--stripe", action="store_true",
                   help="each writer's directory striped over every MDT")
    a = p.parse_args()
    bin_dir = a.bin.rstrip("/") + "/" if a.bin else ""
    cluster = os.path.abspath(a.dir)
    env = dict(os.environ, LODE_MDS=f"127.0.0.1:{a.port}", LODE_KEY=f"{cluster}/client.key")
    if bin_dir:
        env["PATH"] = bin_dir + ":" + env["PATH"]
    up = [f"{bin_dir}lode", "cluster", "up", "--dir", cluster]
    subprocess.run(up + ["--port", str(a.port), "--mdts", str(a.mdts)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    mnt, check = f"{cluster}/mnt", f"{cluster}/check"
    mount(bin_dir, mnt, env)
    rnd = random.Random(a.seed)
    root = f"{mnt}/campaign.{a.seed}"
    os.makedirs(root)
    if a.stripe:
        for i in range(a.writers):
            subprocess.run([f"{bin_dir}lode", "setdirstripe", "-c", str(a.mdts), f"{root}/w{i}"],
                           check=True, env=env)
    stop, q = mp.Event(), mp.Queue()
    ws = [mp.Process(target=writer, args=(root, i, stop, q, a.seed * 1000 + i))
          for i in range(a.writers)]
    for w in ws:
        w.start()
    acked, in_flight, errors = {}, {}, []

    def drain():
        while True:
            try:
                kind, wid, name, arg = q.get_nowait()
            except Exception:
                return
            if kind == "try":
                in_flight[wid] = {name} | ({arg} if arg else set())
                continue
            in_flight.pop(wid, None)
            if kind == "put":
                acked[(wid, name)] = arg
            elif kind == "rename":
                acked.pop((wid, name), None)
                acked[(wid, arg[0])] = arg[1]
            elif kind == "del":
                acked.pop((wid, name), None)
            else:
                errors.append((wid, name))
                print(f"writer {wid}: {name}", flush=True)

    for r in range(a.rounds):
        time.sleep(rnd.uniform(0.3, 2.5))
        drain()
        kind = a.kill if a.kill != "any" else rnd.choice(["mds", "oss"])
        victim = rnd.choice(servers(cluster, f"lode-{kind}"))
        os.kill(victim, signal.SIGKILL)
        time.sleep(rnd.uniform(0, 1.0))
        t = time.monotonic()
        subprocess.run(up, check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"round {r + 1}: lode-{kind} {victim} killed, up again in "
              f"{time.monotonic() - t:.1f} s; {len(acked)} files acknowledged", flush=True)
    time.sleep(2)
    stop.set()
    # A writer exits once what it queued is read: drained while they finish.
    deadline = time.monotonic() + 300
    while any(w.is_alive() for w in ws) and time.monotonic() < deadline:
        drain()
        time.sleep(0.05)
    drain()
    stuck = [w.pid for w in ws if w.is_alive()]
    if stuck:
        sys.exit(f"writers {stuck} still wait for a call after 300 s")
    mount(bin_dir, check, env)
    bad = 0
    seen = f"{check}/campaign.{a.seed}"
    for wid in range(a.writers):
        maybe = in_flight.get(wid, set())
        names = set(os.listdir(f"{seen}/w{wid}"))
        want = {n for (w, n) in acked if w == wid}
        for n in sorted((want ^ names) - maybe):
            print(f"w{wid}/{n}: {'lost' if n in want else 'there, never acknowledged'}")
            bad += 1
        for n in sorted((want & names) - maybe):
            with open(f"{seen}/w{wid}/{n}", "rb") as f:
                got = f.read()
            key, gen = acked[(wid, n)]
            if got != data(key, gen):
                print(f"w{wid}/{n}: {len(got)} bytes ({got.count(0)} zeros), not the "
                      f"{len(data(key, gen))} of its last acknowledged write")
                bad += 1
    subprocess.run(["umount", "-l", check])
    subprocess.run(["umount", "-l", mnt])
    subprocess.run([f"{bin_dir}lode", "cluster", "down", "--dir", cluster], env=env,
                   stdout=subprocess.DEVNULL)
    print(f"{len(acked)} files acknowledged, {a.rounds} servers killed: "
          f"{bad} wrong, {len(errors)} calls failed")
    sys.exit(1 if bad or errors else 0)


if __name__ == "__main__":
    main()
