import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import lode.torch as lt  # noqa: E402


def shards(lodefs, d, n=8, size=100_000):
    paths = []
    for i in range(n):
        p = f"{d}/shard-{i:04}"
        lodefs.write_bytes(p, bytes([i]) * size)
        paths.append(p)
    return paths


def test_map_style_dataset_with_workers(lodefs, tmpdir_lode):
    paths = shards(lodefs, tmpdir_lode)
    items = [(p, 1000 * k, 512) for p in paths for k in range(4)]
    ds = lt.ShardDataset(lodefs, items)
    assert len(ds) == 32
    loader = DataLoader(ds, batch_size=4, num_workers=3)
    seen = []
    for batch in loader:
        assert batch.shape == (4, 512) and batch.dtype == torch.uint8
        seen.extend(int(row[0]) for row in batch)
        assert all(bool((row == row[0]).all()) for row in batch)
    assert sorted(seen) == sorted(i for i in range(8) for _ in range(4))
    whole = lt.ShardDataset(lodefs.address, paths, transform=lambda t: int(t.sum()))
    assert whole[3] == 3 * 100_000
    assert ds.read_many([0, 5])[1][0] == 1


def test_streaming_shards_split_across_workers_and_ranks(lodefs, tmpdir_lode, monkeypatch):
    paths = shards(lodefs, tmpdir_lode, n=10, size=50_000)

    def decode(path, data):
        yield path, data.numel(), int(data[0])

    ds = lt.StreamingShards(lodefs, paths, decode=decode, chunk=16_384)
    got = list(DataLoader(ds, batch_size=None, num_workers=3))
    assert sorted(p for p, _, _ in got) == sorted(paths)  # every shard exactly once
    assert all(n == 50_000 and paths[v] == p for p, n, v in got)
    # Two ranks of two workers each: disjoint, and together every shard.
    mine = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = lt.StreamingShards(lodefs, paths, shuffle_seed=1)
        mine.append([p for p, _ in DataLoader(ds, batch_size=None, num_workers=2)])
    assert not set(mine[0]) & set(mine[1])
    assert sorted(mine[0] + mine[1]) == sorted(paths)


def test_save_load_and_save_async(lodefs, tmpdir_lode):
    state = {"w": torch.arange(1000, dtype=torch.float32), "step": 7}
    path = f"{tmpdir_lode}/ckpt.pt"
    lt.save(state, path, fs=lodefs)
    back = lt.load(path, fs=lodefs)
    assert back["step"] == 7 and torch.equal(back["w"], state["w"])
    fut = lt.save_async(state, path, fs=lodefs)
    state["w"] += 1  # after the call: not in the checkpoint
    assert fut.result(timeout=60) == path
    assert torch.equal(lt.load(path, fs=lodefs)["w"], torch.arange(1000, dtype=torch.float32))
    # No temporary names are left behind.
    assert [p.rsplit("/", 1)[1] for p in lodefs.ls(tmpdir_lode)] == ["ckpt.pt"]


WRITER = r"""
import sys, torch, lode.torch as lt
address, path = sys.argv[1], sys.argv[2]
version = 0
while True:
    version += 1
    # about 24 MiB, every element holding the version
    lt.save({"v": version, "t": torch.full((6 << 20,), version, dtype=torch.int32)}, path, fs=address)
    print(version, flush=True)
"""


def test_a_checkpoint_is_whole_when_the_writer_is_killed_mid_save(cluster, lodefs, tmpdir_lode):
    path = f"{tmpdir_lode}/ckpt.pt"

    def inside_a_save():
        return any(p.rsplit("/", 1)[1].startswith(".ckpt.pt.tmp-") for p in lodefs.ls(tmpdir_lode))

    # Kills at moments spread over a save (serialising, then writing), until at least four
    # rounds are done and one kill has landed while a temporary file was being written.
    for round_ in range(24):
        w = subprocess.Popen([sys.executable, "-c", WRITER, cluster, path],
                             stdout=subprocess.PIPE, text=True)
        first = w.stdout.readline()  # at least one version committed
        assert first.strip()
        time.sleep(0.05 + 0.11 * (round_ % 8))  # somewhere inside a later save
        w.send_signal(signal.SIGKILL)
        w.wait()
        ck = lt.load(path, fs=lodefs)
        v = ck["v"]
        assert v >= 1 and bool((ck["t"] == v).all()), "a checkpoint mixes versions"
        assert ck["t"].numel() == 6 << 20
        if round_ >= 3 and inside_a_save():
            break
    # The kills did land inside saves: their temporary files are there, never the final name.
    left = [p.rsplit("/", 1)[1] for p in lodefs.ls(tmpdir_lode)]
    assert "ckpt.pt" in left and any(n.startswith(".ckpt.pt.tmp-") for n in left), left
