#!/usr/bin/env python3
"""Creates and buffered sequential reads, two builds of lode measured in one run.

For each build (a directory holding lode, lode-mds, lode-oss and the `creates` example), a
cluster is brought up with `lode cluster up`, mounted, and measured in rotated rounds:
  - creates/s through the library (`creates MDS N`): new files, then the same files again with
    O_CREAT|O_TRUNC (a checkpoint rewritten in place);
  - the same two through the mount (os.open / os.close);
  - a buffered sequential read of one striped file through the mount (`dd bs=1M`, page cache
    dropped first): GB/s, and CPU seconds per GB of the mount process plus dd.
Medians are printed per build, and the ratio of the second build to the first.

  scripts/create-read-bench.py --build before=DIR --build after=DIR [--rounds 3] [--files 2000]
"""
import argparse, os, resource, statistics, subprocess, sys, tempfile, time

def sh(*a, **k):
    return subprocess.run(a, check=True, capture_output=True, text=True, **k).stdout

def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

def mount_pid(mnt):
    out = sh("pgrep", "-f", f"mount {mnt}")
    return int(out.split()[0])

class Cluster:
    def __init__(self, name, bins, port):
        self.name, self.bins, self.port = name, bins, port
        self.dir = tempfile.mkdtemp(prefix=f"lode-bench-{name}-")
        self.mnt = os.path.join(self.dir, "mnt")
        self.mds = f"127.0.0.1:{port}"

    def env(self):
        # A build with authentication made the cluster's client key in its directory.
        key = os.path.join(self.dir, "client.key")
        return dict(os.environ, **({"LODE_KEY": key} if os.path.exists(key) else {}))

    def lode(self, *a):
        return sh(os.path.join(self.bins, "lode"), "--mds", self.mds, *a, env=self.env())

    def up(self):
        sh(os.path.join(self.bins, "lode"), "cluster", "up", "--dir", self.dir, "--port", str(self.port))
        self.lode("mkdir", "/data")
        self.lode("setstripe", "-c", "-1", "-S", "4M", "/data")
        os.makedirs(self.mnt, exist_ok=True)
        # The mount runs on in the background: its output must not hold our pipes open.
        subprocess.run([os.path.join(self.bins, "lode"), "--mds", self.mds, "mount", "--daemon", self.mnt],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env())

    def down(self):
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        subprocess.run([os.path.join(self.bins, "lode"), "cluster", "down", "--dir", self.dir], capture_output=True)

def lib_creates(c, n, tag):
    out = sh(os.path.join(c.bins, "creates"), c.mds, str(n), f"/lib-{tag}", env=c.env())
    rates = {}
    for line in out.splitlines():
        what, rate = line.split()[:2]
        rates[what] = float(rate)
    return rates["new"], rates["rewrite"]

def mount_creates(c, n, tag):
    d = os.path.join(c.mnt, f"m-{tag}")
    os.mkdir(d)
    out = []
    for _ in range(2):
        t = time.perf_counter()
        for i in range(n):
            fd = os.open(os.path.join(d, f"f{i}"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            os.close(fd)
        out.append(n / (time.perf_counter() - t))
    return out[0], out[1]

def seq_read(c, path, size):
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    pid = mount_pid(c.mnt)
    cpu0, child0 = proc_cpu(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    wall = time.perf_counter() - t
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = proc_cpu(pid) - cpu0 + (child1.ru_utime - child0.ru_utime) + (child1.ru_stime - child0.ru_stime)
    return size / wall / 1e9, cpu / (size / 1e9)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--read-mib", type=int, default=2048)
    a = ap.parse_args()
    clusters = [Cluster(n, d, 9480 + 10 * i) for i, (n, d) in enumerate(b.split("=", 1) for b in a.build)]
    results = {c.name: {k: [] for k in ("lib_new", "lib_rewrite", "mnt_new", "mnt_rewrite", "read_gbs", "read_cpu")} for c in clusters}
    try:
        for c in clusters:
            c.up()
            big = os.path.join(c.mnt, "data", "big")
            subprocess.run(["dd", "if=/dev/urandom", f"of={big}", "bs=1M", f"count={a.read_mib}", "conv=fsync"], check=True, capture_output=True)
        size = a.read_mib << 20
        for r in range(a.rounds):
            order = clusters[r % len(clusters):] + clusters[:r % len(clusters)]
            for c in order:
                res = results[c.name]
                n, w = lib_creates(c, a.files, r)
                res["lib_new"].append(n); res["lib_rewrite"].append(w)
                n, w = mount_creates(c, a.files, r)
                res["mnt_new"].append(n); res["mnt_rewrite"].append(w)
                g, cpu = seq_read(c, os.path.join(c.mnt, "data", "big"), size)
                res["read_gbs"].append(g); res["read_cpu"].append(cpu)
                print(f"round {r} {c.name}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in res.items()), flush=True)
    finally:
        for c in clusters:
            c.down()
    med = {n: {k: statistics.median(v) for k, v in res.items()} for n, res in results.items()}
    names = [c.name for c in clusters]
    print("\nmedians of", a.rounds, "rounds")
    print("| measure | " + " | ".join(names) + (f" | {names[-1]}/{names[0]} |" if len(names) > 1 else " |"))
    print("|---" * (len(names) + 2) + "|")
    for k in results[names[0]]:
        row = [med[n][k] for n in names]
        ratio = f" | {row[-1] / row[0]:.2f}" if len(names) > 1 else ""
        print(f"| {k} | " + " | ".join(f"{v:.3f}" if v < 10 else f"{v:.0f}" for v in row) + ratio + " |")

if __name__ == "__main__":
    sys.exit(main())
