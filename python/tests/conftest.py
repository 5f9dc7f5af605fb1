"""A real local lode cluster (an MDS and storage servers on loopback) for the tests, started
with the `lode` command of this repository's build (or of LODE_BIN_DIR)."""

import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {}


def lode_bin():
    if os.environ.get("LODE_BIN_DIR"):
        return Path(os.environ["LODE_BIN_DIR"]) / "lode"
    found = [REPO / "target" / k / "lode" for k in ("release", "debug")]
    found = [p for p in found if p.exists()]
    if not found:
        pytest.exit("no lode binary: run `cargo build` or set LODE_BIN_DIR", returncode=2)
    return max(found, key=lambda p: p.stat().st_mtime)


@pytest.fixture(scope="session")
def cluster():
    """The MDS address of a cluster of 4 targets, stopped after the session."""
    exe = lode_bin()
    root = tempfile.mkdtemp(prefix="lode-py-")
    port = random.randrange(20000, 40000, 200)
    subprocess.run([exe, "cluster", "up", "--dir", root, "--port", str(port)], check=True,
                   stdout=subprocess.DEVNULL)
    # Clients (and the processes the tests start) authenticate with the cluster's client key.
    os.environ["LODE_KEY"] = os.path.join(root, "client.key")
    ROOTS[f"127.0.0.1:{port}"] = root
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([exe, "cluster", "down", "--dir", root], stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster_dir(cluster):
    """The cluster's directory: its servers' data directories are below it."""
    return Path(ROOTS[cluster])


@pytest.fixture(scope="session")
def lodefs(cluster):
    import lode

    return lode.connect(cluster)


@pytest.fixture
def tmpdir_lode(lodefs, request):
    """A fresh directory in lode for one test."""
    path = f"/t/{request.node.originalname}-{random.randrange(1 << 30)}"
    lodefs.mkdir(path, parents=True)
    yield path
    lodefs.rm(path, recursive=True)
