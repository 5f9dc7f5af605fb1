#!/usr/bin/env python3
"""Many processes writing one file in interleaved, unaligned records (IO500's ior-hard
pattern: 47,008-byte records, record i of process p at (i * procs + p) * 47008), then each
reading back another's. Every record is checked byte for byte; exits 1 on any wrong one and
names it (where the wrong bytes lie, and whether they are zeros).

    scripts/interleaved-records.py --file /mnt/lode/dir/shared --procs 4 --records 100
    scripts/interleaved-records.py --file /mnt/lode/dir/shared --write-via /mnt/other/dir/shared

--write-via FILE2 has the odd processes write through another path to the same file (another
mount), so the check spans clients; the read-back goes through --file.
"""
import argparse
import hashlib
import multiprocessing as mp
import os
import sys
import time

RECORD = 47008


def record(p, i):
    h = hashlib.sha256(f"{p}/{i}".encode()).digest()
    return (h * (RECORD // len(h) + 1))[:RECORD]


def writer(args):
    path, p, procs, records = args
    fd = os.open(path, os.O_WRONLY)
    try:
        for i in range(records):
            os.pwrite(fd, record(p, i), (i * procs + p) * RECORD)
        os.fsync(fd)
    finally:
        os.close(fd)


def reader(args):
    path, p, procs, records = args
    q = (p + 1) % procs
    wrong = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(records):
            at = (i * procs + q) * RECORD
            got, want = os.pread(fd, RECORD, at), record(q, i)
            if got != want:
                bad = [k for k in range(RECORD) if k >= len(got) or got[k] != want[k]]
                zeros = sum(1 for k in bad if k < len(got) and got[k] == 0)
                wrong.append(f"record {i} of process {q} at {at}: {len(bad)} bytes wrong, "
                             f"{at + bad[0]}..{at + bad[-1] + 1}, {zeros} of them zeros")
    finally:
        os.close(fd)
    return wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True)
    ap.add_argument("--write-via", help="another path to the same file for the odd processes")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--records", type=int, default=100)
    a = ap.parse_args()
    if os.path.exists(a.file):
        os.unlink(a.file)
    os.close(os.open(a.file, os.O_CREAT | os.O_WRONLY, 0o644))
    paths = [a.write_via if (a.write_via and p % 2) else a.file for p in range(a.procs)]
    total = a.procs * a.records * RECORD
    with mp.Pool(a.procs) as pool:
        t = time.perf_counter()
        pool.map(writer, [(paths[p], p, a.procs, a.records) for p in range(a.procs)])
        w = time.perf_counter() - t
        t = time.perf_counter()
        wrong = sum(pool.map(reader, [(a.file, p, a.procs, a.records)
                                      for p in range(a.procs)]), [])
        r = time.perf_counter() - t
    size = os.stat(a.file).st_size
    print(f"{a.procs} processes, {a.records} records each: write {total / w / 1e6:.1f} MB/s, "
          f"read {total / r / 1e6:.1f} MB/s, size {size} (want {total}), {len(wrong)} wrong")
    for line in wrong:
        print("  " + line)
    sys.exit(1 if wrong or size != total else 0)


if __name__ == "__main__":
    main()
