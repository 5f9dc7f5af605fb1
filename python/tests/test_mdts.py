"""The package, unchanged, over a filesystem of three MDTs: directories placed on MDT1 and
MDT2 (`lode mkdir -i`) and one striped over all three (`lode setdirstripe -c 3`) are used
through the same calls as any other; a checkpoint written on one MDT is renamed into place on
another, and a directory renamed between MDTs keeps its files."""

import os
import random
import shutil
import subprocess
import tempfile

import pytest

import lode

from conftest import lode_bin


@pytest.fixture(scope="module")
def three_mdts():
    """The MDS address of a cluster of three MDTs, and a runner of `lode` commands on it."""
    exe = lode_bin()
    root = tempfile.mkdtemp(prefix="lode-py-mdts-")
    port = random.randrange(10000, 15000, 200)  # below the ephemeral ports
    subprocess.run([exe, "cluster", "up", "--dir", root, "--port", str(port), "--mdts", "3"],
                   check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, LODE_MDS=f"127.0.0.1:{port}",
               LODE_KEY=os.path.join(root, "client.key"))

    def run(*args):
        return subprocess.run([exe, *args], check=True, env=env, capture_output=True,
                              text=True).stdout

    try:
        yield f"127.0.0.1:{port}", os.path.join(root, "client.key"), run
    finally:
        subprocess.run([exe, "cluster", "down", "--dir", root], stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


def test_files_directories_and_checkpoints_across_three_mdts(three_mdts):
    address, key, run = three_mdts
    run("mkdir", "-i", "1", "/one")
    run("mkdir", "-i", "2", "/two")
    run("setdirstripe", "-c", "3", "/wide")
    assert run("getdirstripe", "-m", "/one").strip() == "1"
    assert run("getdirstripe", "-m", "/two").strip() == "2"
    fs = lode.connect(address, key=key)
    files = {}
    for d in ("/one", "/two", "/wide"):
        for i in range(24):
            data = os.urandom(1000 + 37 * i)
            fs.write_bytes(f"{d}/f{i}", data)
            files[f"{d}/f{i}"] = data
    for d in ("/one", "/two", "/wide"):
        assert sorted(fs.ls(d)) == sorted(f"{d}/f{i}" for i in range(24))
    for path, data in files.items():
        assert fs.read_bytes(path) == data, path

    # A checkpoint: written beside its final name on MDT1, synced, renamed onto MDT2's over an
    # older one.
    old = os.urandom(3 << 20)
    fs.write_bytes("/two/ckpt", old)
    new = os.urandom(5 << 20)
    with fs.open("/one/ckpt.tmp", "wb", stripe_count=2) as f:
        f.write(new)
        f.flush()
        f.fsync()
    fs.rename("/one/ckpt.tmp", "/two/ckpt")
    fs.sync()
    assert not fs.exists("/one/ckpt.tmp")
    assert fs.read_bytes("/two/ckpt") == new

    # A directory of MDT2 renamed below MDT1's: its files come along.
    fs.rename("/two", "/one/two")
    assert not fs.exists("/two")
    assert fs.read_bytes("/one/two/f5") == files["/two/f5"]
    assert fs.read_bytes("/one/two/ckpt") == new
    assert run("getdirstripe", "-m", "/one/two").strip() == "2"

    # Another client sees all of it at once; then everything goes.
    other = lode.connect(address, key=key)
    assert other.read_bytes("/wide/f7") == files["/wide/f7"]
    assert len(other.ls("/one/two")) == 25
    other.close()
    fs.rm("/one", recursive=True)
    fs.rm("/wide", recursive=True)
    assert fs.ls("/") == []
    fs.close()
