"""The package, unchanged, over a directory linked to an S3 bucket: objects uploaded to a real
S3-compatible server (moto's, started here on loopback) are read through `lode.connect`,
fsspec and the PyTorch shard dataset, each file restored from S3 on its first read, byte for
byte."""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import lode

from conftest import lode_bin

boto3 = pytest.importorskip("boto3")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def linked():
    """A cluster, an S3 server, a copytool, and /lake linked to s3://py-hsm/set holding
    `objects` (name -> bytes)."""
    exe = lode_bin()
    root = tempfile.mkdtemp(prefix="lode-py-hsm-")
    port = random.randrange(15000, 19800, 200)  # below the ephemeral ports
    subprocess.run([exe, "cluster", "up", "--dir", root, "--port", str(port)], check=True,
                   stdout=subprocess.DEVNULL)
    s3port = free_port()
    endpoint = f"http://127.0.0.1:{s3port}"
    env = dict(os.environ, LODE_MDS=f"127.0.0.1:{port}",
               LODE_KEY=os.path.join(root, "client.key"),
               AWS_ACCESS_KEY_ID="py", AWS_SECRET_ACCESS_KEY="py")
    procs = [subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(s3port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="py", aws_secret_access_key="py")
        for _ in range(100):
            try:
                s3.create_bucket(Bucket="py-hsm")
                break
            except Exception:
                time.sleep(0.2)
        objects = {f"shard{i}.bin": os.urandom(100_000 + 12_345 * i) for i in range(6)}
        for name, data in objects.items():
            s3.put_object(Bucket="py-hsm", Key=f"set/{name}", Body=data)
        cluster_key = os.path.join(root, "cluster.key")
        procs.append(subprocess.Popen(
            [str(exe.parent / "lode-copytool"), "--key", cluster_key], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        admin = [exe, "--key", cluster_key]
        subprocess.run(admin + ["mkdir", "/lake"], env=env, check=True)
        subprocess.run(admin + ["hsm", "link", "/lake", "s3://py-hsm/set", "--endpoint",
                                endpoint], env=env, check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while "importing" in subprocess.run([exe, "hsm", "links"], env=env, check=True,
                                            capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the import never ended"
            time.sleep(0.1)

        def state(path):
            return subprocess.run([exe, "hsm", "state", path], env=env, check=True,
                                  capture_output=True, text=True).stdout

        yield f"127.0.0.1:{port}", env["LODE_KEY"], objects, state
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait()
        subprocess.run([exe, "cluster", "down", "--dir", root], stdout=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


def test_released_files_read_through_the_package_fsspec_and_torch(linked, monkeypatch):
    address, key, objects, state = linked
    monkeypatch.setenv("LODE_KEY", key)
    fs = lode.connect(address, key=key)
    assert sorted(fs.ls("/lake")) == sorted(f"/lake/{n}" for n in objects)
    assert "released" in state("/lake/shard0.bin")
    assert fs.read_bytes("/lake/shard0.bin") == objects["shard0.bin"]
    assert "released" not in state("/lake/shard0.bin")

    import fsspec
    with fsspec.open(f"lode://{address}/lake/shard1.bin", "rb") as f:
        assert f.read() == objects["shard1.bin"]

    torch = pytest.importorskip("torch")
    from lode.torch import ShardDataset

    names = [f"shard{i}.bin" for i in range(2, 6)]
    assert all("released" in state(f"/lake/{n}") for n in names)
    ds = ShardDataset(fs, [f"/lake/{n}" for n in names])
    for i, n in enumerate(names):
        got = ds[i]
        data = got.numpy().tobytes() if isinstance(got, torch.Tensor) else bytes(got)
        assert data == objects[n], n
