import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from lode.fsspec import LodeFileSystem


def test_the_protocol_is_registered_and_urls_open(cluster, lodefs, tmpdir_lode):
    assert fsspec.get_filesystem_class("lode") is LodeFileSystem
    url = f"lode://{cluster}{tmpdir_lode}/data.bin"
    with fsspec.open(url, "wb") as f:
        f.write(b"hello fsspec")
    assert lodefs.read_bytes(f"{tmpdir_lode}/data.bin") == b"hello fsspec"
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"hello fsspec"
    with fsspec.open(url, "rt") as f:
        assert f.read() == "hello fsspec"
    fs, path = fsspec.core.url_to_fs(url)
    assert isinstance(fs, LodeFileSystem) and fs.host == cluster and path == f"{tmpdir_lode}/data.bin"


def test_listing_info_ranges_and_moves(cluster, tmpdir_lode):
    fs = fsspec.filesystem("lode", host=cluster)
    d = tmpdir_lode
    fs.pipe({f"{d}/a/x": b"0123456789", f"{d}/a/y": b"abc"})
    assert sorted(fs.ls(f"{d}/a", detail=False)) == [f"{d}/a/x", f"{d}/a/y"]
    assert fs.info(f"{d}/a/x")["size"] == 10 and fs.isdir(f"{d}/a") and fs.isfile(f"{d}/a/y")
    assert fs.cat_file(f"{d}/a/x", start=2, end=5) == b"234"
    assert fs.cat_file(f"{d}/a/x", start=-3) == b"789"
    assert fs.cat_ranges([f"{d}/a/x", f"{d}/a/y"], [0, 1], [2, 3]) == [b"01", b"bc"]
    assert sorted(fs.glob(f"{d}/a/*")) == [f"{d}/a/x", f"{d}/a/y"]
    assert fs.du(f"{d}/a") == 13
    fs.mv(f"{d}/a/x", f"{d}/a/z")
    assert not fs.exists(f"{d}/a/x") and fs.cat(f"{d}/a/z") == b"0123456789"
    with pytest.raises(FileNotFoundError):
        fs.info(f"{d}/nothing")
    fs.rm(f"{d}/a", recursive=True)
    assert not fs.exists(f"{d}/a")


class LodeFixtures(AbstractFixtures):
    @pytest.fixture(scope="class")
    def fs(self, cluster):
        return LodeFileSystem(host=cluster)

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join([p.rstrip("/") for p in parts[:-1]] + [parts[-1]])

    @pytest.fixture
    def fs_path(self, tmpdir_lode):
        return tmpdir_lode

    @pytest.fixture
    def supports_empty_directories(self):
        return True


class TestLodeCopy(AbstractCopyTests, LodeFixtures):
    pass


class TestLodeGet(AbstractGetTests, LodeFixtures):
    pass


class TestLodePut(AbstractPutTests, LodeFixtures):
    pass


class TestLodeOpen(AbstractOpenTests, LodeFixtures):
    pass


class TestLodePipe(AbstractPipeTests, LodeFixtures):
    pass
