#!/usr/bin/env python3
"""A differential oracle for the mount: a Hypothesis state machine applies the same random
operations to a directory on a lode mount and to a local directory, and compares every result
and errno. Creates, writes at random offsets and sizes, reads, truncates, renames, links,
unlinks, fsync, writes through a shared mapping, xattrs, through two handles at once and, when
given, a second mount (which opens a file only once its handles here are closed, and a name
only once the kernel's cache of it has expired: close-to-open, as NFS and lode promise). A
failure is shrunk to a minimal sequence of steps and printed with the seed that replays it.

    tests/posix/oracle.py --mount MNT/dir --local /var/tmp/dir [--mount2 MNT2/dir]
                          [--examples 200] [--steps 50] [--seed N]

Needs `pip install hypothesis`. Each run empties both directories first.
"""
import argparse
import errno
import mmap
import os
import shutil
import sys
import time

from hypothesis import HealthCheck, note, seed as hseed, settings, strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, precondition, rule,
                                 run_state_machine_as_test)

NAMES = ["a", "b", "c", "d/e"]
# A name's kernel cache (entries and attributes) on another mount may be this old.
CACHE_TIME = 1.2
MAX_OFFSET = 3 << 20
SIZES = st.sampled_from([0, 1, 100, 4095, 4096, 4097, 65536, 131073, 1 << 20, (1 << 20) + 7])
OFFSETS = st.one_of(st.integers(0, 9000), st.integers(0, MAX_OFFSET), st.sampled_from(
    [0, 4096, 65536, 1 << 20, (1 << 20) - 1, 2 << 20]))
MODES = {
    "r": os.O_RDONLY,
    "r+": os.O_RDWR,
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "rw-creat": os.O_RDWR | os.O_CREAT,
    "excl": os.O_RDWR | os.O_CREAT | os.O_EXCL,
}


def outcome(f, *args):
    """What a call did: ("ok", value) or ("err", errno name)."""
    try:
        return ("ok", f(*args))
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, e.errno))


def data_of(seed, size):
    b = seed.to_bytes(4, "little") * (size // 4 + 1)
    return bytes((x + i) & 0xFF for i, x in enumerate(b[:size]))


class Oracle(RuleBasedStateMachine):
    roots = None  # (mount, local, mount2 or None)

    def __init__(self):
        super().__init__()
        self.mnt, self.loc, self.mnt2 = self.roots
        self.handles = []  # (lode fd, local fd, mode)
        self.changed = {}  # name -> when its entry last changed here

    @initialize()
    def empty(self):
        for root in (self.mnt, self.loc):
            for n in os.listdir(root):
                p = os.path.join(root, n)
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
            os.mkdir(os.path.join(root, "d"))

    def both(self, f, *args, label=""):
        a, b = outcome(f, self.mnt, *args), outcome(f, self.loc, *args)
        note(f"{label or f.__name__}{args}: lode {a!r:.120} local {b!r:.120}")
        assert a == b, f"{label or f.__name__}{args}: lode {a!r:.200} local {b!r:.200}"
        return a

    def touch_name(self, *names):
        for n in names:
            self.changed[n] = time.monotonic()

    # -- handles ---------------------------------------------------------------------------

    @precondition(lambda self: len(self.handles) < 3)
    @rule(name=st.sampled_from(NAMES), mode=st.sampled_from(sorted(MODES)))
    def open(self, name, mode):
        fds = []
        results = []
        for root in (self.mnt, self.loc):
            r = outcome(os.open, os.path.join(root, name), MODES[mode], 0o644)
            results.append(("ok", None) if r[0] == "ok" else r)
            fds.append(r[1] if r[0] == "ok" else None)
        note(f"open({name!r}, {mode}): {results}")
        if results[0] != results[1]:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            raise AssertionError(f"open({name!r}, {mode}): lode {results[0]} local {results[1]}")
        if fds[0] is not None:
            self.handles.append((fds[0], fds[1], mode))
            self.touch_name(name)

    def pair(self, i):
        return self.handles[i % len(self.handles)]

    def known_gap(self, i, a, b):
        """A change of attributes (size, mode) through a handle of a file no name holds any
        more is refused with ESTALE: the MDS forgets a file's inode at its last unlink, and
        keeps only its objects until the last close. A known difference, not a failure: the
        handle is closed on both sides, as its file now differs."""
        m, l, _ = self.pair(i)
        if a == ("err", "ESTALE") and b[0] == "ok" and os.fstat(l).st_nlink == 0:
            note("known gap: attributes of an unlinked open file")
            self.handles.remove((m, l, self.pair(i)[2]))
            os.close(m)
            os.close(l)
            return True
        return False

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2), offset=OFFSETS, size=SIZES, seed=st.integers(0, 2**32 - 1))
    def pwrite(self, i, offset, size, seed):
        m, l, mode = self.pair(i)
        data = data_of(seed, size)
        if mode == "a":
            r = (outcome(os.write, m, data), outcome(os.write, l, data))
        else:
            r = (outcome(os.pwrite, m, data, offset), outcome(os.pwrite, l, data, offset))
        note(f"write(h{i % len(self.handles)}, {offset}, {size}): {r}")
        assert r[0] == r[1], f"write: lode {r[0]} local {r[1]}"

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2), offset=OFFSETS, size=SIZES)
    def pread(self, i, offset, size):
        m, l, _ = self.pair(i)
        a, b = outcome(os.pread, m, size, offset), outcome(os.pread, l, size, offset)
        note(f"pread(h{i % len(self.handles)}, {offset}, {size}): {len(a[1]) if a[0] == 'ok' else a}")
        assert a == b, f"pread({offset}, {size}): lode {summary(a)} local {summary(b)}"

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2), size=st.one_of(SIZES, OFFSETS))
    def ftruncate(self, i, size):
        m, l, _ = self.pair(i)
        a, b = outcome(os.ftruncate, m, size), outcome(os.ftruncate, l, size)
        note(f"ftruncate(h{i % len(self.handles)}, {size}): {a} {b}")
        assert a == b or self.known_gap(i, a, b), f"ftruncate: lode {a} local {b}"

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2))
    def fstat_size(self, i):
        m, l, _ = self.pair(i)
        a, b = outcome(lambda fd: os.fstat(fd).st_size, m), outcome(
            lambda fd: os.fstat(fd).st_size, l)
        if a != b and self.known_gap(i, a, b):
            return
        note(f"fstat(h{i % len(self.handles)}).size: {a} {b}")
        assert a == b, f"fstat size: lode {a} local {b}"

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2))
    def fsync(self, i):
        m, l, _ = self.pair(i)
        a, b = outcome(os.fsync, m), outcome(os.fsync, l)
        assert a == b, f"fsync: lode {a} local {b}"

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2), offset=st.integers(0, 20000), size=st.integers(1, 9000),
          seed=st.integers(0, 2**32 - 1))
    def mmap_write(self, i, offset, size, seed):
        """Writes through a shared mapping of what the file holds now (a handle open for
        reading and writing), then syncs the mapping."""
        m, l, mode = self.pair(i)
        if mode not in ("r+", "w+", "rw-creat", "excl"):
            return
        n = os.fstat(l).st_size
        if os.fstat(m).st_size != n or n == 0 or offset >= n:
            return
        size = min(size, n - offset)
        data = data_of(seed, size)
        for fd in (m, l):
            with mmap.mmap(fd, n) as mm:
                mm[offset:offset + size] = data
                mm.flush()
        note(f"mmap_write(h{i % len(self.handles)}, {offset}, {size})")

    @precondition(lambda self: self.handles)
    @rule(i=st.integers(0, 2))
    def close(self, i):
        m, l, _ = self.handles.pop(i % len(self.handles))
        a, b = outcome(os.close, m), outcome(os.close, l)
        assert a == b, f"close: lode {a} local {b}"

    # -- names -----------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES))
    def stat(self, name):
        self.both(lambda r, n: (lambda s: (s.st_size, oct(s.st_mode), s.st_nlink))(
            os.stat(os.path.join(r, n))), name, label="stat")

    @rule(name=st.sampled_from(NAMES))
    def read_whole(self, name):
        self.both(lambda r, n: open(os.path.join(r, n), "rb").read(), name, label="read_whole")

    @rule(src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES))
    def rename(self, src, dst):
        self.both(lambda r, a, b: os.rename(os.path.join(r, a), os.path.join(r, b)), src, dst,
                  label="rename")
        self.touch_name(src, dst)

    @rule(src=st.sampled_from(NAMES), dst=st.sampled_from(NAMES))
    def link(self, src, dst):
        self.both(lambda r, a, b: os.link(os.path.join(r, a), os.path.join(r, b)), src, dst,
                  label="link")
        self.touch_name(dst)

    @rule(name=st.sampled_from(NAMES))
    def unlink(self, name):
        self.both(lambda r, n: os.unlink(os.path.join(r, n)), name, label="unlink")
        self.touch_name(name)

    @rule(name=st.sampled_from(NAMES), size=st.one_of(SIZES, OFFSETS))
    def truncate(self, name, size):
        self.both(lambda r, n, s: os.truncate(os.path.join(r, n), s), name, size,
                  label="truncate")

    @rule(name=st.sampled_from(NAMES), key=st.sampled_from(["user.x", "user.y"]),
          value=st.binary(max_size=64))
    def setxattr(self, name, key, value):
        self.both(lambda r, n, k, v: os.setxattr(os.path.join(r, n), k, v), name, key, value,
                  label="setxattr")

    @rule(name=st.sampled_from(NAMES), key=st.sampled_from(["user.x", "user.y"]))
    def getxattr(self, name, key):
        self.both(lambda r, n, k: os.getxattr(os.path.join(r, n), k), name, key,
                  label="getxattr")

    @rule()
    def listdir(self):
        self.both(lambda r: sorted(os.listdir(r)), label="listdir")

    # -- the second mount ------------------------------------------------------------------

    @precondition(lambda self: self.mnt2 is not None and not self.handles)
    @rule(name=st.sampled_from(NAMES))
    def read_on_other_mount(self, name):
        if time.monotonic() - self.changed.get(name, -CACHE_TIME) < CACHE_TIME:
            time.sleep(CACHE_TIME)
        a = outcome(lambda: open(os.path.join(self.mnt2, name), "rb").read())
        b = outcome(lambda: open(os.path.join(self.loc, name), "rb").read())
        note(f"read_on_other_mount({name!r}): {summary(a)} {summary(b)}")
        assert a == b, f"read on the other mount: lode {summary(a)} local {summary(b)}"

    def teardown(self):
        for m, l, _ in self.handles:
            os.close(m)
            os.close(l)


def summary(r):
    if r[0] == "ok" and isinstance(r[1], bytes):
        return f"{len(r[1])} bytes, crc {hash(r[1]) & 0xFFFF:04x}"
    return repr(r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mount", required=True, help="a directory on the lode mount")
    p.add_argument("--local", required=True, help="a directory on a local filesystem")
    p.add_argument("--mount2", help="the same lode directory through a second mount")
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seed", type=int)
    a = p.parse_args()
    for d in (a.mount, a.local):
        os.makedirs(d, exist_ok=True)
    Oracle.roots = (a.mount, a.local, a.mount2)
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"oracle: seed {seed} ({a.examples} sequences of up to {a.steps} steps)", flush=True)
    cfg = settings(max_examples=a.examples, stateful_step_count=a.steps, deadline=None,
                   suppress_health_check=list(HealthCheck), database=None,
                   derandomize=False)
    try:
        # @seed on the machine is what run_state_machine_as_test reads its seed from.
        run_state_machine_as_test(hseed(seed)(Oracle), settings=cfg)
    except Exception:
        print(f"oracle: FAILED; replay with --seed {seed}", file=sys.stderr)
        raise
    print("oracle: the mount and the local directory agreed on every step")


if __name__ == "__main__":
    main()
