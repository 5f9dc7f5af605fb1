#!/usr/bin/env python3
"""An operator-fault campaign: the slips and failing disks no kill -9 campaign reaches, each
made on a real cluster (`lode cluster up`, release or debug binaries), each ending with every
acknowledged file readable byte-exact, or with a refusal that names the problem, and never
with data destroyed.

    scripts/operator-fault-campaign.py --dir /tmp/lode-ops [--files 40] [--port 9600]
                                       [--bin target/release] [--cases a,b,...] [--long]

Cases (all by default):
  missing-mds-dir   the MDS's data directory is gone (a volume not mounted) and the service
                    manager starts `lode-mds` again with the same command line; then the
                    operator formats a new filesystem there by mistake and a storage server
                    restarts against it; then the directory comes back
  typo-mds-dir      `lode-mds` started with a data directory that does not exist
  swapped-targets   two storage servers' target directories swapped while they are down
  rolled-back       a target restored from an older copy of itself, then the newer copy back
  mds-disk-full     the MDS's data directory on a small tmpfs that fills (root; skipped
                    otherwise)
  fsync-eio         a disk that fails fsync: through device-mapper's `error` target where the
                    kernel has device-mapper (skipped otherwise; the `mem` engine's cases run
                    in the test suite: oss/tests/target.rs, cluster/tests/fsync.rs)

--long runs every case on more files and repeats the swap and the rollback. Exits 1 on the
first case that ends otherwise than its contract says.
"""
import argparse
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time


class Campaign:
    def __init__(self, a):
        self.bin = os.path.abspath(a.bin) + "/" if a.bin else ""
        self.dir = os.path.abspath(a.dir)
        self.port = a.port
        self.files = a.files
        self.rnd = random.Random(a.seed)
        self.env = dict(os.environ, LODE_MDS=f"127.0.0.1:{a.port}",
                        LODE_KEY=f"{self.dir}/client.key", LODE_LOG="warn")
        self.acked = {}  # path -> sha256 of what `lode cp` acknowledged
        self.n = 0

    # -- the cluster --------------------------------------------------------------------

    def lode(self, *args, check=True, timeout=120):
        r = subprocess.run([f"{self.bin}lode", *args], env=self.env, capture_output=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise SystemExit(f"lode {' '.join(args)}: {r.stderr.decode(errors='replace')}")
        return r

    def up(self):
        self.lode("cluster", "up", "--dir", self.dir, "--port", str(self.port), timeout=180)

    def down(self):
        self.lode("cluster", "down", "--dir", self.dir, check=False)

    def pids(self):
        out = {}
        try:
            with open(f"{self.dir}/cluster.pids") as f:
                for line in f:
                    role, pid = line.split()
                    out[role] = int(pid)
        except FileNotFoundError:
            pass
        return out

    def kill(self, role):
        pid = self.pids().get(role)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        # A killed process stays a zombie a moment: wait until it is reaped or gone.
        for _ in range(100):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1].startswith("Z"):
                        break
            except FileNotFoundError:
                break
            time.sleep(0.05)
        time.sleep(0.2)

    def mds_cmd(self, data_dir=None):
        return [f"{self.bin}lode-mds", "--data-dir", data_dir or f"{self.dir}/mds", "--listen",
                f"127.0.0.1:{self.port}", "--trust", "127.0.0.0/8", "--key",
                f"{self.dir}/cluster.key"]

    def oss_cmd(self, i):
        return [f"{self.bin}lode-oss", "--data-dir", f"{self.dir}/oss{i}", "--mds",
                f"127.0.0.1:{self.port}", "--listen", f"127.0.0.1:{self.port + 100 + i}",
                "--targets", "1", "--key", f"{self.dir}/cluster.key", "--mds-timeout", "20"]

    def start(self, cmd, log):
        return subprocess.Popen(cmd, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def run_briefly(self, cmd, seconds=15):
        """Runs a server that must refuse to start: its exit status and what it said."""
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=seconds)
        except subprocess.TimeoutExpired as e:
            return None, (e.stderr or b"").decode(errors="replace")
        return r.returncode, (r.stdout + r.stderr).decode(errors="replace")

    # -- the data -----------------------------------------------------------------------

    def write(self, count, under="/data"):
        tmp = f"{self.dir}/payload"
        for _ in range(count):
            self.n += 1
            size = self.rnd.choice([1, 4096, 70_000, 300_000, 1 << 20])
            body = random.Random(self.n).randbytes(size)
            with open(tmp, "wb") as f:
                f.write(body)
            path = f"{under}/f{self.n}"
            self.lode("cp", f"local:{tmp}", path)
            self.acked[path] = hashlib.sha256(body).hexdigest()

    def verify(self, what, paths=None, may_fail=()):
        """Every acknowledged file reads byte-exact; those in `may_fail` may instead fail
        with an error (never read different)."""
        bad = []
        for path in sorted(paths or self.acked):
            r = self.lode("cat", path, check=False)
            if r.returncode != 0:
                if path not in may_fail:
                    bad.append(f"{path}: {r.stderr.decode(errors='replace').strip()}")
                continue
            if hashlib.sha256(r.stdout).hexdigest() != self.acked[path]:
                bad.append(f"{path}: differs from what was acknowledged")
        if bad:
            raise SystemExit(f"{what}: " + "; ".join(bad[:5]))

    def objects(self, oss):
        """Data files of objects on storage server `oss`'s targets."""
        n = 0
        for root, _, names in os.walk(f"{self.dir}/oss{oss}"):
            if "/O/" in root + "/":
                n += sum(1 for x in names if not x.endswith(".cs") and not x.startswith("free."))
        return n

    def wait_log(self, log, text, seconds=30):
        end = time.time() + seconds
        while time.time() < end:
            try:
                with open(log, errors="replace") as f:
                    if text in f.read():
                        return True
            except FileNotFoundError:
                pass
            time.sleep(0.2)
        return False

    # -- the cases ----------------------------------------------------------------------

    def missing_mds_dir(self):
        before = [self.objects(i) for i in range(4)]
        self.kill("mds")
        away = f"{self.dir}/mds.away"
        os.rename(f"{self.dir}/mds", away)
        code, out = self.run_briefly(self.mds_cmd())
        assert code not in (0, None), f"the MDS served a missing data directory: {out}"
        assert "lode-mds format" in out, f"the refusal names no format command: {out}"
        assert not os.path.exists(f"{self.dir}/mds"), "a refused start made the directory"
        # The operator formats there by mistake and starts it; a storage server restarts.
        self.lode_mds("format", "--data-dir", f"{self.dir}/mds")
        wrong = self.start(self.mds_cmd(), f"{self.dir}/logs/wrong-mds.log")
        time.sleep(1.5)
        self.kill("oss0")
        code, out = self.run_briefly(self.oss_cmd(0), 30)
        assert code not in (0, None), f"a target joined another filesystem's MDS: {out}"
        assert "belongs to filesystem" in out, f"the refusal does not say why: {out}"
        time.sleep(1)
        after = [self.objects(i) for i in range(4)]
        assert after == before, f"objects destroyed: {before} -> {after}"
        wrong.kill()
        wrong.wait()
        shutil.rmtree(f"{self.dir}/mds")
        os.rename(away, f"{self.dir}/mds")
        self.up()
        self.verify("missing-mds-dir")
        return f"refused twice, {sum(before)} objects kept, {len(self.acked)} files byte-exact"

    def lode_mds(self, *args):
        r = subprocess.run([f"{self.bin}lode-mds", *args], capture_output=True)
        if r.returncode != 0:
            raise SystemExit(f"lode-mds {' '.join(args)}: {r.stderr.decode(errors='replace')}")

    def typo_mds_dir(self):
        typo = f"{self.dir}/mdss"
        code, out = self.run_briefly(self.mds_cmd(typo))
        assert code not in (0, None), f"the MDS served a mistyped directory: {out}"
        assert typo in out and "lode-mds format" in out, out
        assert not os.path.exists(typo), "a refused start made the directory"
        return "refused, naming the directory and the format command"

    def swapped_targets(self):
        self.kill("oss0")
        self.kill("oss1")
        a = [d for d in os.listdir(f"{self.dir}/oss0") if d.startswith("ost-")]
        b = [d for d in os.listdir(f"{self.dir}/oss1") if d.startswith("ost-")]
        for d in a:
            os.rename(f"{self.dir}/oss0/{d}", f"{self.dir}/swap-{d}")
        for d in b:
            os.rename(f"{self.dir}/oss1/{d}", f"{self.dir}/oss0/{d}")
        for d in a:
            os.rename(f"{self.dir}/swap-{d}", f"{self.dir}/oss1/{d}")
        self.up()
        self.verify("swapped-targets")
        self.write(3)
        self.verify("swapped-targets, new files")
        return f"both servers came back on each other's targets; {len(self.acked)} files byte-exact"

    def rolled_back(self):
        self.kill("oss2")
        snap = f"{self.dir}/oss2.old"
        shutil.copytree(f"{self.dir}/oss2", snap, symlinks=True)
        os.remove(f"{snap}/lock") if os.path.exists(f"{snap}/lock") else None
        self.up()
        old = set(self.acked)
        self.write(max(6, self.files // 4))
        newer = f"{self.dir}/oss2.new"
        self.kill("oss2")
        os.rename(f"{self.dir}/oss2", newer)
        os.rename(snap, f"{self.dir}/oss2")
        log = f"{self.dir}/logs/mds.log"
        server = self.start(self.oss_cmd(2), f"{self.dir}/logs/oss2-rolled-back.log")
        assert self.wait_log(log, "rolled back"), "the MDS took a rolled-back target"
        # What was written before the copy reads whole; nothing after it reads different.
        self.verify("rolled-back, older files", old)
        self.verify("rolled-back, newer files", set(self.acked) - old,
                    may_fail=set(self.acked) - old)
        server.kill()
        server.wait()
        shutil.rmtree(f"{self.dir}/oss2")
        os.rename(newer, f"{self.dir}/oss2")
        self.up()
        self.verify("rolled-back, the newer copy back")
        return "refused (LAST_ID behind the namespace), nothing destroyed; the newer copy serves all"

    def mds_disk_full(self):
        if os.geteuid() != 0:
            return "skipped: needs root for a small tmpfs"
        self.kill("mds")
        real = f"{self.dir}/mds.real"
        os.rename(f"{self.dir}/mds", real)
        os.makedirs(f"{self.dir}/mds")
        used = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(real) for f in fs)
        size = max(used * 2, 1 << 20) + (256 << 10)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                        f"{self.dir}/mds"], check=True)
        try:
            for name in os.listdir(real):
                if name != "lock":
                    shutil.copy2(f"{real}/{name}", f"{self.dir}/mds/{name}")
            self.up()
            filler = f"{self.dir}/mds/filler"
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            # Changes now fail (the journal cannot grow); none is acknowledged and lost.
            failed = 0
            for _ in range(5):
                self.n += 1
                r = self.lode("mkdir", f"/full{self.n}", check=False, timeout=60)
                if r.returncode == 0:
                    self.acked_dirs = getattr(self, "acked_dirs", []) + [f"/full{self.n}"]
                else:
                    failed += 1
            os.remove(filler)
            self.kill("mds")
            self.up()
            self.verify("mds-disk-full")
            for d in getattr(self, "acked_dirs", []):
                assert self.lode("stat", d, check=False).returncode == 0, f"{d} was lost"
            self.write(2)
            self.kill("mds")
            for name in os.listdir(f"{self.dir}/mds"):
                if name != "lock":
                    shutil.copy2(f"{self.dir}/mds/{name}", f"{real}/{name}")
        finally:
            subprocess.run(["umount", "-l", f"{self.dir}/mds"], check=False)
        os.rmdir(f"{self.dir}/mds")
        os.rename(real, f"{self.dir}/mds")
        self.up()
        self.verify("mds-disk-full, back on its disk")
        return f"{failed} of 5 changes refused on the full disk, every acknowledged one kept"

    def fsync_eio(self):
        if not os.path.exists("/dev/mapper/control") or shutil.which("dmsetup") is None:
            return ("skipped: the kernel has no device-mapper; the mem engine's failing-fsync "
                    "cases run in the test suite")
        return "skipped: device-mapper present but this campaign's dm-error case is not built"


CASES = ["typo-mds-dir", "missing-mds-dir", "swapped-targets", "rolled-back", "mds-disk-full",
         "fsync-eio"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--files", type=int, default=24)
    p.add_argument("--port", type=int, default=9600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bin", default="")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--long", action="store_true")
    a = p.parse_args()
    if a.long:
        a.files *= 4
    shutil.rmtree(a.dir, ignore_errors=True)
    c = Campaign(a)
    c.up()
    c.lode("mkdir", "/data")
    c.lode("setstripe", "-c", "-1", "-S", "64K", "/data")
    c.write(a.files)
    cases = a.cases.split(",")
    if a.long:
        cases += ["swapped-targets", "rolled-back"]
    try:
        for case in cases:
            started = time.time()
            try:
                what = getattr(c, case.replace("-", "_"))()
            except AssertionError as e:
                print(f"FAIL {case}: {e}")
                return 1
            print(f"ok   {case} ({time.time() - started:.1f} s): {what}", flush=True)
    finally:
        c.down()
    print(f"operator-fault campaign: {len(cases)} cases, {len(c.acked)} files, all kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
