"""PyTorch Distributed Checkpoint on lode: save and load (one process and several ranks, into
another world size), async save, the newest checkpoint, atomic publishing, and damaged shards
refused by name where DCP without digests loads the damage."""

import os
import random
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import lode.torch as lt  # noqa: E402
import lode.torch.dcp as ldcp  # noqa: E402
from conftest import lode_bin  # noqa: E402

PIECE = 64 << 10


def refused(exc_type, match, fn, *args, **kwargs):
    """DCP wraps each rank's failure in a CheckpointException: the one raised must be there."""
    from torch.distributed.checkpoint.api import CheckpointException
    with pytest.raises(CheckpointException) as e:
        fn(*args, **kwargs)
    errors = [x for x, _ in e.value.failures.values()]
    assert any(isinstance(x, exc_type) and re.search(match, str(x)) for x in errors), \
        [str(x) for x in errors]


def names_in(fs, path):
    return [n.rsplit("/", 1)[-1] for n in fs.ls(path)]


def state_of(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(400, 300, generator=g),  # several pieces
                  "h": torch.randn(33, generator=g).to(torch.bfloat16),
                  "ids": torch.arange(1000, dtype=torch.int64) * (seed + 1),
                  "mask": torch.rand(77, generator=g) > 0.5,
                  "empty": torch.empty(0, 5)},
        "optim": {"step": 7 + seed, "lr": [0.1, 0.01]},
    }


def zeros_like(state):
    out = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
           "optim": {"step": 0, "lr": [0.0, 0.0]}}
    return out


def assert_same(a, b):
    for k, v in a["model"].items():
        assert b["model"][k].dtype == v.dtype and torch.equal(b["model"][k], v), k
    assert a["optim"] == b["optim"]


def test_save_load_latest_and_verify(cluster, lodefs, tmpdir_lode):
    url = f"lode://{cluster}{tmpdir_lode}/ckpt/step-100"
    state = state_of(1)
    dcp.save(state, storage_writer=ldcp.Writer(url, piece=PIECE, threads=3))
    names = set(names_in(lodefs, f"{tmpdir_lode}/ckpt/step-100"))
    assert {".metadata", ".lode-manifest.json"} <= names
    assert {n for n in names if n.endswith(".distcp")} == {"__0_0.distcp", "__0_1.distcp",
                                                           "__0_2.distcp"}
    # Published by one rename: no temporary directory is left beside it.
    assert set(names_in(lodefs, f"{tmpdir_lode}/ckpt")) == {"step-100", ".lode-latest"}
    back = zeros_like(state)
    dcp.load(back, storage_reader=ldcp.Reader(url))
    assert_same(state, back)
    assert ldcp.verify(url) == 7  # 5 tensors, the step and the lr list
    env = dict(os.environ, LODE_MDS=cluster)
    ok = subprocess.run([lode_bin(), "verify", f"{tmpdir_lode}/ckpt/step-100"], env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "7 shards" in ok.stdout

    # A name taken is refused unless overwrite is asked for; then the new one replaces it.
    refused(FileExistsError, "already there", dcp.save, state_of(2),
            storage_writer=ldcp.Writer(url))
    dcp.save(state_of(2), storage_writer=ldcp.Writer(url, overwrite=True))
    back = zeros_like(state)
    dcp.load(back, storage_reader=ldcp.Reader(url))
    assert_same(state_of(2), back)

    # The newest: from the pointer, then (pointer gone) by listing; unfinished saves are not
    # checkpoints.
    dcp.save(state_of(3), storage_writer=ldcp.Writer(f"lode://{cluster}{tmpdir_lode}/ckpt/step-20"))
    assert ldcp.latest(f"lode://{cluster}{tmpdir_lode}/ckpt") == \
        f"lode://{cluster}{tmpdir_lode}/ckpt/step-20"
    lodefs.rm(f"{tmpdir_lode}/ckpt/.lode-latest")
    lodefs.mkdir(f"{tmpdir_lode}/ckpt/step-900")  # a save that never finished
    lodefs.mkdir(f"{tmpdir_lode}/ckpt/.step-1000.tmp-0123")
    assert ldcp.latest(f"lode://{cluster}{tmpdir_lode}/ckpt") == url
    assert lt.latest(f"{tmpdir_lode}/ckpt", fs=cluster) == url
    assert ldcp.latest(f"lode://{cluster}{tmpdir_lode}/nothing") is None
    # (DCP reports a failed metadata read as an AssertionError carrying the cause.)
    refused((lt.CheckpointError, AssertionError), "not a complete", dcp.load, zeros_like(state),
            storage_reader=ldcp.Reader(f"lode://{cluster}{tmpdir_lode}/ckpt/step-900"))


class Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lode-dcp-pwned",))


def test_metadata_that_would_run_code_is_refused(cluster, lodefs, tmpdir_lode):
    """A writer of the directory replaces DCP's metadata with a pickle that runs a command
    and fixes the manifest's digest to match: the reader refuses it without running it."""
    import json
    import pickle
    url = f"lode://{cluster}{tmpdir_lode}/step-1"
    dcp.save(state_of(0), storage_writer=ldcp.Writer(url))
    evil = pickle.dumps(Boom())
    manifest = json.loads(lodefs.read_bytes(f"{tmpdir_lode}/step-1/.lode-manifest.json"))
    manifest["metadata"] = {"file": ".metadata", "length": len(evil),
                            "sha256": ldcp._digests(evil, manifest["piece"])}
    lodefs.write_bytes(f"{tmpdir_lode}/step-1/.metadata", evil)
    lodefs.write_bytes(f"{tmpdir_lode}/step-1/.lode-manifest.json", json.dumps(manifest).encode())
    if os.path.exists("/tmp/lode-dcp-pwned"):
        os.unlink("/tmp/lode-dcp-pwned")
    refused((lt.CheckpointError, AssertionError), "posix.system|os.system", dcp.load,
            zeros_like(state_of(0)), storage_reader=ldcp.Reader(url))
    assert not os.path.exists("/tmp/lode-dcp-pwned")


def test_async_save_snapshots_the_state_and_publishes_it(cluster, tmpdir_lode):
    url = f"lode://{cluster}{tmpdir_lode}/step-1"
    state = state_of(4)
    want = {"model": {k: v.clone() for k, v in state["model"].items()},
            "optim": dict(state["optim"])}
    fut = dcp.async_save(state, storage_writer=ldcp.Writer(url, piece=PIECE))
    state["model"]["w"].add_(1)  # training goes on: the checkpoint keeps the state of the call
    fut.result()
    back = zeros_like(state)
    dcp.load(back, storage_reader=ldcp.Reader(url))
    assert_same(want, back)


ASYNC_PROCESS = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    import lode.torch.dcp as ldcp
    if __name__ == "__main__":
        dist.init_process_group("gloo")
        state = {"w": torch.arange(1000.0), "step": 3}
        fut = dcp.async_save(state, storage_writer=ldcp.Writer(sys.argv[1]),
                             async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        state["w"].zero_()
        fut.result()
        back = {"w": torch.zeros(1000), "step": 0}
        dcp.load(back, storage_reader=ldcp.Reader(sys.argv[1]))
        assert torch.equal(back["w"], torch.arange(1000.0)) and back["step"] == 3
        dist.destroy_process_group()
""")


def test_async_save_from_another_process(cluster, tmpdir_lode, tmp_path):
    """DCP's process-based async save pickles the writer into its checkpoint process."""
    script = tmp_path / "save.py"  # spawned processes re-import the main script by path
    script.write_text(ASYNC_PROCESS)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(random.randrange(41000, 49000)))
    r = subprocess.run([sys.executable, str(script), f"lode://{cluster}{tmpdir_lode}/step-7"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


RANK = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard
    import lode.torch.dcp as ldcp
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(96 * 40, dtype=torch.float32).reshape(96, 40)
    url, mode = sys.argv[1], sys.argv[2]
    if mode == "save":
        state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "bias": full[0] * 2, "step": 5}
        dcp.save(state, storage_writer=ldcp.Writer(url, piece=4096))
    else:
        state = {"w": distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)]),
                 "bias": torch.zeros(40), "step": 0}
        dcp.load(state, storage_reader=ldcp.Reader(ldcp.latest(url.rsplit("/", 1)[0])))
        local = state["w"].to_local()
        per = -(-96 // world)
        assert torch.equal(local, full[rank * per:(rank + 1) * per]), rank
        assert torch.equal(state["bias"], full[0] * 2) and state["step"] == 5
    dist.destroy_process_group()
""")


def ranks(world, url, mode):
    port = random.randrange(41000, 49000)
    procs = [subprocess.Popen([sys.executable, "-c", RANK, url, mode],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out


def test_ranks_save_their_shards_and_another_world_size_loads_them(cluster, lodefs,
                                                                    tmpdir_lode):
    url = f"lode://{cluster}{tmpdir_lode}/run/step-10"
    ranks(2, url, "save")
    names = set(names_in(lodefs, f"{tmpdir_lode}/run/step-10"))
    assert any(n.startswith("__0_") for n in names) and any(n.startswith("__1_") for n in names)
    ranks(3, url, "load")  # resharded: 2 shards of 48 rows read as 3 of 32
    # One process, no process group: the whole tensor.
    full = torch.arange(96 * 40, dtype=torch.float32).reshape(96, 40)
    state = {"w": torch.zeros(96, 40), "bias": torch.zeros(40), "step": 0}
    dcp.load(state, storage_reader=ldcp.Reader(url))
    assert torch.equal(state["w"], full) and state["step"] == 5


def object_file(cluster_dir, fid):
    """The data file of the object `fid` ("[0xSEQ:0xOID:0x0]") on whichever server keeps it."""
    seq, oid, _ = (int(x, 16) for x in fid.strip("[]").split(":"))
    found = list(cluster_dir.glob(f"**/O/{seq:x}/d{oid % 32}/{oid:x}"))
    assert len(found) == 1, (fid, found)
    return found[0]


def damage(kind, lodefs, cluster_dir, path, offset, length):
    """Loses `length` bytes of a shard file at `offset` the way a storage server does."""
    if kind == "zeros":  # the range came back as zeros (a lost write, a bad restore)
        with lodefs.open(path, "r+b") as f:
            f.seek(offset)
            f.write(bytes(length))
    elif kind == "torn":  # a torn write: the file ends in the middle of the tensor
        with lodefs.open(path, "r+b") as f:
            f.truncate(offset)
    else:  # the disk of a storage server lost the object holding the range (its data file
        # cut to nothing under the running server, its checksums kept)
        stripe = lodefs.getstripe(path)
        comp = stripe["components"][0]
        i = (offset // comp["stripe_size"]) % len(comp["objects"])
        os.truncate(object_file(cluster_dir, comp["objects"][i][1]), 0)


@pytest.mark.parametrize("kind", ["zeros", "torn", "lost-object"])
def test_a_shard_that_lost_a_range_is_refused_by_name(cluster, cluster_dir, lodefs,
                                                      tmpdir_lode, kind):
    fsspec = pytest.importorskip("fsspec")  # noqa: F841
    w = torch.arange(1, 1 + (3 << 20) // 4, dtype=torch.float32)  # 3 MiB, no zero in it
    state = {"layers.0.w": w, "step": 1}
    lodefs.mkdir(f"{tmpdir_lode}/ours")
    lodefs.setstripe(f"{tmpdir_lode}/ours", stripe_count=-1, stripe_size=1 << 20)
    ours = f"lode://{cluster}{tmpdir_lode}/ours/step-1"
    dcp.save(state, storage_writer=ldcp.Writer(ours, threads=1))
    # DCP's own writer through lode's fsspec: the checkpoint without digests.
    theirs = f"lode://{cluster}{tmpdir_lode}/theirs"
    dcp.save(state, storage_writer=dcp.FsspecWriter(theirs))

    shard = next(s for s in names_in(lodefs, f"{tmpdir_lode}/ours/step-1") if s.endswith(".distcp"))
    damage(kind, lodefs, cluster_dir, f"{tmpdir_lode}/ours/step-1/{shard}", 1 << 20, 64 << 10)
    target = {"layers.0.w": torch.full_like(w, -1.0), "step": 0}
    # (A torn file also cuts what follows the tensor: the step, saved after it.)
    refused(lt.CheckpointError, r"tensor '(layers\.0\.w|step)' is damaged", dcp.load, target,
            storage_reader=ldcp.Reader(ours))
    # Nothing unverified reached the target: what is not -1 is the checkpoint's own.
    got = target["layers.0.w"]
    assert torch.equal(got[got != -1], w[got != -1])
    with pytest.raises(lt.CheckpointError, match="layers.0.w|step"):
        ldcp.verify(ours)
    bad = subprocess.run([lode_bin(), "verify", f"{tmpdir_lode}/ours/step-1"],
                         env=dict(os.environ, LODE_MDS=cluster), capture_output=True, text=True)
    assert bad.returncode == 1 and "layers.0.w" in bad.stderr, (bad.stdout, bad.stderr)

    if kind == "zeros":
        # The same loss under DCP's reader: loaded without a word, zeros in the weights.
        files = [s for s in names_in(lodefs, f"{tmpdir_lode}/theirs") if s.endswith(".distcp")]
        path = f"{tmpdir_lode}/theirs/{files[0]}"
        size = lodefs.stat(path)["size"]
        damage(kind, lodefs, cluster_dir, path, size - (1 << 20), 64 << 10)
        target = {"layers.0.w": torch.full_like(w, -1.0), "step": 0}
        dcp.load(target, storage_reader=dcp.FsspecReader(theirs))
        assert (target["layers.0.w"] == 0).sum() > 0


def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint_newest(cluster, lodefs,
                                                                         tmpdir_lode):
    base = f"lode://{cluster}{tmpdir_lode}/ck"
    dcp.save(state_of(5), storage_writer=ldcp.Writer(f"{base}/step-1", piece=PIECE))
    code = textwrap.dedent(f"""
        import os, torch, torch.distributed.checkpoint as dcp, lode.torch.dcp as ldcp
        class Dies(ldcp.Writer):
            def finish(self, metadata, results):
                os._exit(9)  # killed after every shard is written, before publishing
        dcp.save({{"w": torch.ones(1 << 16)}}, storage_writer=Dies("{base}/step-2"))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 9, r.stderr
    assert not lodefs.exists(f"{tmpdir_lode}/ck/step-2")
    assert ldcp.latest(base) == f"{base}/step-1"
    back = zeros_like(state_of(5))
    dcp.load(back, storage_reader=ldcp.Reader(ldcp.latest(base)))
    assert_same(state_of(5), back)
    # The next save of that name clears what the dead one left.
    dcp.save(state_of(6), storage_writer=ldcp.Writer(f"{base}/step-2", piece=PIECE))
    assert set(names_in(lodefs, f"{tmpdir_lode}/ck")) == {"step-1", "step-2", ".lode-latest"}
    assert ldcp.latest(base) == f"{base}/step-2"
