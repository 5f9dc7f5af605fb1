import errno
import threading

import numpy as np
import pytest

import lode


def test_write_read_seek_tell(lodefs, tmpdir_lode):
    p = f"{tmpdir_lode}/f"
    data = bytes(range(256)) * 40000
    with lodefs.open(p, "wb", stripe_count=2, stripe_size=1 << 20) as f:
        assert f.writable() and not f.readable()
        assert f.write(data) == len(data)
        assert f.tell() == len(data)
    assert lodefs.stat(p)["size"] == len(data)
    with lodefs.open(p, "rb") as f:
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        assert f.seek(-6, 2) == len(data) - 6
        assert f.read() == data[-6:]
        assert f.read(5) == b""
        f.seek(1000)
        f.seek(24, 1)
        assert f.read(3) == data[1024:1027]
    with lodefs.open(p, "rb") as f:
        assert f.readall() == data
    assert lodefs.getstripe(p)["stripe_count"] == 2


def test_readinto_lands_in_any_writable_buffer(lodefs, tmpdir_lode):
    p = f"{tmpdir_lode}/f"
    data = np.arange(1 << 20, dtype=np.float32)
    with lodefs.open(p, "wb") as f:
        f.write(data)  # any buffer, no copy
    out = np.empty_like(data)
    with lodefs.open(p, "rb") as f:
        assert f.readinto(out) == data.nbytes
        assert f.readinto(out) == 0
    assert np.array_equal(out, data)
    ba = bytearray(100)
    with lodefs.open(p, "rb") as f:
        f.seek(4)
        assert f.readinto(memoryview(ba)[10:20]) == 10
    assert bytes(ba[10:20]) == data.tobytes()[4:14]
    with pytest.raises(TypeError):
        with lodefs.open(p, "rb") as f:
            f.readinto(b"read-only bytes")


def test_modes_append_update_exclusive(lodefs, tmpdir_lode):
    p = f"{tmpdir_lode}/f"
    with lodefs.open(p, "ab") as f:
        f.write(b"one")
    with lodefs.open(p, "ab") as f:
        f.write(b"two")
    assert lodefs.read_bytes(p) == b"onetwo"
    with lodefs.open(p, "r+b") as f:
        f.seek(3)
        f.write(b"TWO")
        f.seek(0)
        assert f.read() == b"oneTWO"
        f.truncate(3)
    assert lodefs.read_bytes(p) == b"one"
    with pytest.raises(FileExistsError):
        lodefs.open(p, "xb")
    with lodefs.open(p, "wb") as f:
        pass
    assert lodefs.stat(p)["size"] == 0
    with lodefs.open(p, "rb", buffering=-1) as f:
        assert f.read() == b""
    with pytest.raises(ValueError):
        lodefs.open(p, "r")


def test_errors_are_the_exceptions_python_code_catches(lodefs, tmpdir_lode):
    d = tmpdir_lode
    with pytest.raises(FileNotFoundError):
        lodefs.open(f"{d}/missing", "rb")
    with pytest.raises(FileNotFoundError):
        lodefs.stat(f"{d}/missing")
    lodefs.mkdir(f"{d}/sub")
    with pytest.raises(FileExistsError):
        lodefs.mkdir(f"{d}/sub")
    with pytest.raises(IsADirectoryError):
        lodefs.open(f"{d}/sub", "rb")
    lodefs.write_bytes(f"{d}/file", b"x")
    with pytest.raises(NotADirectoryError):
        lodefs.open(f"{d}/file/inside", "rb")
    lodefs.write_bytes(f"{d}/sub/x", b"x")
    with pytest.raises(OSError) as e:
        lodefs.rmdir(f"{d}/sub")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as e:
        lodefs.mkdir(f"{d}/" + "n" * 300)
    assert e.value.errno == errno.ENAMETOOLONG
    f = lodefs.open(f"{d}/file", "rb")
    f.close()
    with pytest.raises(ValueError):
        f.read()


def test_namespace_calls(lodefs, tmpdir_lode):
    d = tmpdir_lode
    lodefs.mkdir(f"{d}/a/b/c", parents=True)
    lodefs.write_bytes(f"{d}/a/f", b"12345")
    names = sorted(lodefs.ls(f"{d}/a"))
    assert names == [f"{d}/a/b", f"{d}/a/f"]
    detail = {e["name"]: e for e in lodefs.ls(f"{d}/a", detail=True)}
    assert detail[f"{d}/a/f"]["size"] == 5 and detail[f"{d}/a/b"]["type"] == "directory"
    lodefs.rename(f"{d}/a/f", f"{d}/a/b/g")
    assert not lodefs.exists(f"{d}/a/f") and lodefs.stat(f"{d}/a/b/g")["size"] == 5
    lodefs.setstripe(f"{d}/a", stripe_count=-1, stripe_size=1 << 20)
    lodefs.write_bytes(f"{d}/a/striped", b"s" * (3 << 20))
    s = lodefs.getstripe(f"{d}/a/striped")
    assert s["stripe_size"] == 1 << 20 and len(s["components"][0]["objects"]) == 4
    df = lodefs.df()
    assert df["targets"] == 4 and df["targets_up"] == 4 and df["total"] >= df["free"] > 0
    lodefs.rm(f"{d}/a", recursive=True)
    assert not lodefs.exists(f"{d}/a")


def test_read_ranges_batches_into_buffers_or_bytes(lodefs, tmpdir_lode):
    paths = [f"{tmpdir_lode}/s{i}" for i in range(4)]
    blobs = [np.random.default_rng(i).integers(0, 255, 1 << 20, dtype=np.uint8) for i in range(4)]
    for p, b in zip(paths, blobs):
        lodefs.write_bytes(p, b)
    rng = np.random.default_rng(7)
    ranges = [(paths[i % 4], int(rng.integers(0, (1 << 20) - 4096)), 4096) for i in range(500)]
    bufs = [np.empty(4096, dtype=np.uint8) for _ in ranges]
    counts = lodefs.read_ranges(ranges, into=bufs)
    assert counts == [4096] * len(ranges)
    for (p, off, n), b in zip(ranges, bufs):
        assert np.array_equal(b, blobs[paths.index(p)][off:off + n])
    got = lodefs.read_ranges([(paths[0], (1 << 20) - 10, 100), (paths[1], 0, 3)])
    assert got == [blobs[0][-10:].tobytes(), blobs[1][:3].tobytes()]
    with pytest.raises(ValueError):
        lodefs.read_ranges([(paths[0], 0, 10)], into=[bytearray(5)])
    with pytest.raises(FileNotFoundError):
        lodefs.read_ranges([(f"{tmpdir_lode}/none", 0, 1)])


def test_threads_read_in_parallel_and_correctly(lodefs, tmpdir_lode):
    p = f"{tmpdir_lode}/big"
    data = np.random.default_rng(1).integers(0, 255, 16 << 20, dtype=np.uint8)
    lodefs.write_bytes(p, data)
    errors = []

    def reader(k):
        try:
            out = np.empty(1 << 20, dtype=np.uint8)
            with lodefs.open(p, "rb") as f:
                for i in range(k, 16, 4):
                    f.seek(i << 20)
                    assert f.readinto(out) == 1 << 20
                    assert np.array_equal(out, data[i << 20:(i + 1) << 20])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_connect_to_nothing_fails_cleanly():
    with pytest.raises(OSError):
        lode.connect("127.0.0.1:1", timeout=1.0)
