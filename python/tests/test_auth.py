"""Authentication from Python: the cluster's client key gets in; another cluster's key, or none,
is refused with PermissionError at once."""

import subprocess

import pytest

import lode
from conftest import lode_bin


def test_a_client_without_the_clusters_key_is_refused(cluster, tmp_path):
    other = tmp_path / "other.key"
    subprocess.run([str(lode_bin()), "key", "new", str(other)], check=True,
                   stdout=subprocess.DEVNULL)
    with pytest.raises(PermissionError):
        lode.connect(cluster, timeout=2.0, key=str(other))
    with pytest.raises(PermissionError):
        lode.connect(cluster, timeout=2.0, auth=False)
    # A key file others can read is refused before anything is sent.
    other.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        lode.connect(cluster, timeout=2.0, key=str(other))


def test_privacy_carries_data_both_ways(cluster, lodefs):
    secret = lode.connect(cluster, privacy=True)
    path = f"/t/privacy-{id(secret)}"
    if not secret.exists("/t"):
        secret.mkdir("/t", parents=True)
    with secret.open(path, "wb") as f:
        f.write(b"encrypted on the wire" * 1000)
    assert lodefs.read_bytes(path) == b"encrypted on the wire" * 1000
    secret.rm(path)
