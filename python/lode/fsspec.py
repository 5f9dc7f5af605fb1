"""fsspec for lode: `lode://host:port/path` opens in pandas, pyarrow, Hugging Face datasets and
webdataset unchanged (the `lode` protocol is registered through the package's entry point).

    import fsspec
    with fsspec.open("lode://127.0.0.1:9400/data/train.parquet", "rb") as f: ...
    fs = fsspec.filesystem("lode", host="127.0.0.1:9400")
"""

import errno
import io
import os
from urllib.parse import urlsplit

from fsspec.spec import AbstractFileSystem

import lode

DEFAULT_BLOCK = 4 << 20


class LodeFileSystem(AbstractFileSystem):
    protocol = "lode"
    root_marker = "/"

    def __init__(self, host=None, auto_mkdir=True, **kwargs):
        super().__init__(**kwargs)
        self.host = host or os.environ.get("LODE_MDS", "127.0.0.1:9400")
        self.auto_mkdir = auto_mkdir
        self.lode = lode.connect(self.host)

    def _parents(self, path):
        """Writing a file makes its directory, as object stores behave (auto_mkdir)."""
        parent = path.rsplit("/", 1)[0] or "/"
        if self.auto_mkdir and not self.exists(parent):
            self.lode.mkdir(parent, parents=True)

    # Paths: "lode://host:port/a/b", "lode:///a/b", "/a/b" and "a/b" all name /a/b.
    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("lode://"):
            path = urlsplit(path).path
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        netloc = urlsplit(str(path)).netloc if str(path).startswith("lode://") else ""
        return {"host": netloc} if netloc else {}

    def unstrip_protocol(self, name):
        return f"lode://{self.host}{self._strip_protocol(name)}"

    @staticmethod
    def _entry(e):
        return {
            "name": e["name"],
            "size": e["size"] if e["type"] != "directory" else 0,
            "type": e["type"] if e["type"] in ("file", "directory") else "other",
            "mode": e["mode"],
            "uid": e["uid"],
            "gid": e["gid"],
            "nlink": e["nlink"],
            "mtime": e["mtime"],
            "ctime": e["ctime"],
            "fid": e["fid"],
        }

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        entries = [self._entry(e) for e in self.lode.ls(path, detail=True)]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        e = self.lode.stat(path)
        e["name"] = path
        return self._entry(e)

    def exists(self, path, **kwargs):
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    def created(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["ctime"], datetime.timezone.utc)

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.timezone.utc)

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists")
        self.lode.mkdir(path, parents=create_parents)

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if self.exists(path):
            if exist_ok and self.isdir(path):
                return
            raise FileExistsError(errno.EEXIST, f"{path} exists")
        self.lode.mkdir(path, parents=True)

    def rmdir(self, path):
        self.lode.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.lode.rm(self._strip_protocol(path))

    def _rm(self, path):
        path = self._strip_protocol(path)
        if self.isdir(path):
            self.lode.rmdir(path)
        else:
            self.lode.rm(path)

    def rm(self, path, recursive=False, maxdepth=None):
        if isinstance(path, list):
            for p in path:
                self.rm(p, recursive=recursive, maxdepth=maxdepth)
            return
        path = self._strip_protocol(path)
        if recursive and maxdepth is None and self.isdir(path):
            self.lode.rm(path, recursive=True)
            return
        super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """A rename: atomic, and a directory moves whole."""
        if isinstance(path1, str) and isinstance(path2, str):
            p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
            if self.isdir(p2) and not self.isdir(p1):
                p2 = p2.rstrip("/") + "/" + p1.rsplit("/", 1)[-1]
            self.lode.rename(p1, p2)
            self.invalidate_cache()
            return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(p1):
            self.makedirs(p2, exist_ok=True)
            return
        buf = bytearray(DEFAULT_BLOCK * 4)
        self._parents(p2)
        with self.lode.open(p1, "rb") as src, self.lode.open(p2, "wb") as dst:
            while n := src.readinto(buf):
                dst.write(memoryview(buf)[:n])

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self._parents(path)
            self.lode.open(path, "wb").close()

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        size = None
        if start is not None and start < 0 or end is not None and end < 0:
            size = self.info(path)["size"]
        start = 0 if start is None else (start if start >= 0 else max(size + start, 0))
        if end is None:
            with self.lode.open(path, "rb") as f:
                f.seek(start)
                return f.readall()
        end = end if end >= 0 else max(size + end, 0)
        if end <= start:
            return b""
        return self.lode.read_ranges([(path, start, end - start)])[0]

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        """Every range in one batch (`Filesystem.read_ranges`)."""
        paths = [self._strip_protocol(p) for p in paths]
        if isinstance(starts, int):
            starts = [starts] * len(paths)
        if isinstance(ends, int):
            ends = [ends] * len(paths)
        if any(s is None or s < 0 or e is None or e < 0 for s, e in zip(starts, ends)):
            return super().cat_ranges(paths, starts, ends, max_gap, on_error=on_error, **kwargs)
        ranges = [(p, s, max(e - s, 0)) for p, s, e in zip(paths, starts, ends)]
        try:
            return self.lode.read_ranges(ranges)
        except OSError:
            if on_error == "raise":
                raise
            out = []
            for r in ranges:
                try:
                    out.append(self.lode.read_ranges([r])[0])
                except OSError as e:
                    out.append(e)
            return out

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        self._parents(path)
        with self.lode.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(value)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        path = self._strip_protocol(path)
        if "b" not in mode:
            mode += "b"
        if "w" in mode or "a" in mode or "x" in mode:
            self._parents(path)
        raw = self.lode.open(path, mode)
        size = block_size or DEFAULT_BLOCK
        if "+" in mode:
            f = io.BufferedRandom(raw, size)
        elif "r" in mode:
            f = io.BufferedReader(raw, size)
        else:
            f = io.BufferedWriter(raw, size)
        return _Named(f, path, self)


class _Named(io.BufferedIOBase):
    """A buffered lode file with the attributes fsspec's callers look for (path, fs, size)."""

    def __init__(self, f, path, fs):
        self._f = f
        self.path = path
        self.fs = fs
        self.mode = f.raw.mode

    @property
    def name(self):
        return self.path

    @property
    def size(self):
        return self._f.raw.size()

    def __getattr__(self, item):
        return getattr(self._f, item)

    def readable(self):
        return self._f.readable()

    def writable(self):
        return self._f.writable()

    def seekable(self):
        return True

    def read(self, size=-1):
        return self._f.read(size)

    def read1(self, size=-1):
        return self._f.read1(size)

    def readinto(self, b):
        return self._f.readinto(b)

    def readline(self, size=-1):
        return self._f.readline(size)

    def write(self, b):
        return self._f.write(b)

    def seek(self, offset, whence=io.SEEK_SET):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def flush(self):
        if not self._f.closed:
            self._f.flush()

    @property
    def closed(self):
        return self._f.closed

    def close(self):
        self._f.close()

    def __iter__(self):
        return iter(self._f)
