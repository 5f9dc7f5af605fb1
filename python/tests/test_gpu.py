"""GPU memory from Python on the simulated GPU (device memory the CPU cannot touch): reads
and writes of buffers with __cuda_array_interface__, the path each took, datasets that
deliver device batches, and checkpoints whose manifest refuses a damaged tensor by name."""

import errno
import os
import subprocess

import pytest

import lode
from conftest import lode_bin

torch = pytest.importorskip("torch")
import lode.torch as lt  # noqa: E402


@pytest.fixture(scope="module")
def gpu():
    return lode.SimGpu(256 << 20)


@pytest.fixture(scope="module")
def gpufs(cluster, gpu):
    return lode.connect(cluster, gpu=gpu)


def pattern(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


class Foreign:
    """Someone else's device array: only the interface, as CuPy or Numba export it."""

    def __init__(self, inner):
        self._inner = inner
        self.__cuda_array_interface__ = inner.__cuda_array_interface__


def test_readinto_device_memory_stages_over_tcp_and_says_so(gpufs, gpu, tmpdir_lode):
    data = pattern(3_000_001)
    path = f"{tmpdir_lode}/shard"
    gpufs.setstripe(tmpdir_lode, stripe_count=-1, stripe_size=1 << 20)
    gpufs.write_bytes(path, data)
    buf = gpu.empty(len(data))
    with gpufs.open(path, "rb") as f:
        assert f.readinto(buf) == len(data)
        io = f.last_io
    assert buf.to_bytes() == data
    # TCP moves bytes through the CPU: auto stages, verified end to end, and says why.
    assert io["path"] == "staged" and io["verified"] == "end-to-end"
    assert io["staged_bytes"] == len(data) and "CPU" in io["fallback"]
    # Asking for the direct path is an error, never a silent fallback.
    with gpufs.open(path, "rb") as f:
        with pytest.raises(OSError) as e:
            f.readinto(gpu.empty(16), path="direct")
    assert e.value.errno == errno.EOPNOTSUPP
    # Anything exporting __cuda_array_interface__ will do, read from an offset.
    other = gpu.empty(1000)
    with gpufs.open(path, "rb") as f:
        f.seek(12345)
        assert f.readinto(Foreign(other), path="staged") == 1000
    assert other.to_bytes() == data[12345:13345]


def test_read_ranges_and_write_with_device_buffers(gpufs, gpu, tmpdir_lode):
    a, b = pattern(200_000, 2), pattern(50_000, 3)
    gpufs.write_bytes(f"{tmpdir_lode}/a", a)
    gpufs.write_bytes(f"{tmpdir_lode}/b", b)
    bufs = [gpu.empty(100_000), gpu.empty(50_000), bytearray(10)]
    counts = gpufs.read_ranges([(f"{tmpdir_lode}/a", 7, 100_000), (f"{tmpdir_lode}/b", 0, 50_000),
                                (f"{tmpdir_lode}/a", 0, 10)], into=bufs)
    assert counts == [100_000, 50_000, 10]
    assert bufs[0].to_bytes() == a[7:100_007] and bufs[1].to_bytes() == b
    assert bytes(bufs[2]) == a[:10]
    # Device memory written to a file (staged: copied out, checksummed, sent).
    src = gpu.empty(len(a))
    src.fill(a)
    with gpufs.open(f"{tmpdir_lode}/c", "wb") as f:
        assert f.write(src) == len(a)
        assert f.last_io["path"] == "staged"
    assert gpufs.read_bytes(f"{tmpdir_lode}/c") == a


def test_without_a_gpu_a_device_buffer_is_refused(cluster, gpu, tmpdir_lode, lodefs):
    lodefs.write_bytes(f"{tmpdir_lode}/f", b"x" * 100)
    plain = lode.connect(cluster, gpu="none")
    with plain.open(f"{tmpdir_lode}/f", "rb") as f:
        with pytest.raises(ValueError):
            f.readinto(gpu.empty(100))


def test_datasets_deliver_batches_in_device_memory(gpufs, gpu, tmpdir_lode):
    shards = {f"{tmpdir_lode}/s{i}": pattern(70_000 + i, 10 + i) for i in range(4)}
    for p, d in shards.items():
        gpufs.write_bytes(p, d)
    ds = lt.ShardDataset(gpufs, list(shards), device=gpu)
    for i, p in enumerate(shards):
        item = ds[i]
        assert hasattr(item, "__cuda_array_interface__")
        assert item.to_bytes() == shards[p]
    many = ds.read_many([3, 1])
    assert [m.to_bytes() for m in many] == [shards[list(shards)[3]], shards[list(shards)[1]]]
    stream = lt.StreamingShards(gpufs, list(shards), device=gpu)
    got = {p: d.to_bytes() for p, d in stream}
    assert got == shards


def test_a_checkpoint_round_trips_and_a_damaged_tensor_is_refused_by_name(
        cluster, lodefs, tmpdir_lode):
    state = {"model": {"w": torch.randn(300, 70), "b": torch.arange(70, dtype=torch.int64),
                       "h": torch.ones(5, dtype=torch.bfloat16)},
             "step": 42, "lr": [0.1, torch.tensor(3.5)], "empty": torch.empty(0)}
    path = f"{tmpdir_lode}/ckpt.lode"
    lt.save(state, path, fs=lodefs)
    back = lt.load(path, fs=lodefs)
    assert back["step"] == 42 and back["lr"][0] == 0.1
    for k in ("w", "b", "h"):
        assert torch.equal(back["model"][k], state["model"][k]) and \
            back["model"][k].dtype == state["model"][k].dtype
    assert torch.equal(back["lr"][1], state["lr"][1]) and back["empty"].numel() == 0
    assert lt.verify(path, fs=lodefs) == 5
    env = dict(os.environ, LODE_MDS=cluster)
    ok = subprocess.run([lode_bin(), "verify", path], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "5 tensors" in ok.stdout

    # One byte of model.b changed in place (a bad disk, a bad copy): refused, by name.
    with lodefs.open(path, "rb") as f:
        f.seek(0)
        raw = bytearray(f.read())
    import json
    import struct
    (hlen,) = struct.unpack_from("<Q", raw, 16)
    header = json.loads(raw[24:24 + hlen])
    entry = next(e for e in header["tensors"] if e["name"] == "model.b")
    with lodefs.open(path, "r+b") as f:
        f.seek(entry["offset"] + 9)
        f.write(bytes([raw[entry["offset"] + 9] ^ 1]))
    with pytest.raises(lt.CheckpointError, match="model.b"):
        lt.load(path, fs=lodefs)
    with pytest.raises(lt.CheckpointError, match="model.b"):
        lt.verify(path, fs=lodefs)
    bad = subprocess.run([lode_bin(), "verify", path], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "model.b" in bad.stderr, (bad.stdout, bad.stderr)


def test_weights_only_loading_refuses_arbitrary_objects(lodefs, tmpdir_lode):
    path = f"{tmpdir_lode}/obj.lode"
    lt.save({"when": os.stat_result((0,) * 10)}, path, fs=lodefs)
    with pytest.raises(Exception, match="not allowed"):
        lt.load(path, fs=lodefs)
    assert lt.load(path, fs=lodefs, weights_only=False)["when"].st_mode == 0


class _DLDevice(__import__("ctypes").Structure):
    import ctypes as c
    _fields_ = [("device_type", c.c_int32), ("device_id", c.c_int32)]


class _DLDataType(__import__("ctypes").Structure):
    import ctypes as c
    _fields_ = [("code", c.c_uint8), ("bits", c.c_uint8), ("lanes", c.c_uint16)]


class _DLTensor(__import__("ctypes").Structure):
    import ctypes as c
    _fields_ = [("data", c.c_void_p), ("device", _DLDevice), ("ndim", c.c_int32),
                ("dtype", _DLDataType), ("shape", c.POINTER(c.c_int64)),
                ("strides", c.POINTER(c.c_int64)), ("byte_offset", c.c_uint64)]


class _DLManaged(__import__("ctypes").Structure):
    import ctypes as c
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c.c_void_p), ("deleter", c.c_void_p)]


_DLTENSOR = b"dltensor"


class DLPackOnly:
    """A CUDA float32 array that exports only DLPack (as JAX or a framework without
    __cuda_array_interface__ would), `skip` bytes into the device buffer `inner`."""

    def __init__(self, inner, skip):
        import ctypes
        self._inner = inner
        base = inner.__cuda_array_interface__["data"][0]
        self._shape = (ctypes.c_int64 * 1)((inner.nbytes - skip) // 4)
        self._managed = _DLManaged()
        t = self._managed.dl_tensor
        t.data, t.byte_offset, t.ndim = base, skip, 1
        t.device = _DLDevice(2, 0)
        t.dtype = _DLDataType(2, 32, 1)
        t.shape = self._shape
        t.strides = None
        self.streams = []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        import ctypes
        self.streams.append(stream)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._managed), _DLTENSOR, None)


def test_dlpack_device_arrays_are_read_into(gpufs, gpu, tmpdir_lode):
    data = pattern(40_000, 7)
    gpufs.write_bytes(f"{tmpdir_lode}/f", data)
    buf = gpu.empty(40_256)
    arr = DLPackOnly(buf, 256)
    with gpufs.open(f"{tmpdir_lode}/f", "rb") as f:
        assert f.readinto(arr, path="staged") == 40_000
    got = buf.to_bytes()
    assert got[256:] == data and got[:256] == b"\xee" * 256
    # The producer was told which stream the copies are ordered on (1: the default stream).
    assert arr.streams == [1]
