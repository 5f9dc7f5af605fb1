"""Encryption at rest through the Python package and fsspec: a tree set and unlocked in the
kernel keyring, written and read in clear (ranges, a checkpoint renamed into place), then
locked: names as kept, contents ENOKEY; another key refused; unlocked again, all there."""

import errno
import os

import fsspec
import pytest


def key_file(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(os.urandom(64))
    return str(p)


def test_an_encrypted_tree_reads_in_clear_with_its_key_and_is_enokey_without(cluster, lodefs, tmpdir_lode, tmp_path):
    d = f"{tmpdir_lode}/vault"
    lodefs.mkdir(d)
    k = key_file(tmp_path, "vault.key")
    key_id = lodefs.crypt_set(d, k)
    st = lodefs.crypt_status(d)
    assert st["key"] == key_id and st["unlocked"] and st["contents"] == "aes-256-xts"
    assert lodefs.crypt_status(tmpdir_lode) is None
    data = os.urandom(3 * 4096 + 123)
    lodefs.write_bytes(f"{d}/weights.bin", data)
    # A checkpoint: written under a temporary name, renamed over the last.
    with lodefs.open(f"{d}/ckpt.tmp", "wb") as f:
        f.write(data[::-1])
        f.fsync()
    lodefs.rename(f"{d}/ckpt.tmp", f"{d}/ckpt")
    assert sorted(os.path.basename(p) for p in lodefs.ls(d)) == ["ckpt", "weights.bin"]
    fs = fsspec.filesystem("lode", host=cluster)
    assert fs.cat_file(f"{d}/weights.bin", start=4000, end=9000) == data[4000:9000]
    assert fs.cat_file(f"{d}/ckpt") == data[::-1]

    assert lodefs.crypt_lock(d)
    kept = [os.path.basename(p) for p in lodefs.ls(d)]
    assert len(kept) == 2 and "weights.bin" not in kept and "ckpt" not in kept
    with pytest.raises(FileNotFoundError):
        lodefs.read_bytes(f"{d}/weights.bin")
    for name in kept:
        with pytest.raises(OSError) as e:
            lodefs.read_bytes(f"{d}/{name}")
        assert e.value.errno == errno.ENOKEY
    with pytest.raises(OSError) as e:
        lodefs.crypt_unlock(d, key_file(tmp_path, "other.key"))
    assert e.value.errno == errno.ENOKEY

    lodefs.crypt_unlock(d, k)
    assert lodefs.read_bytes(f"{d}/weights.bin") == data
    assert lodefs.crypt_status(d)["unlocked"]
