"""lode: the Python client of the lode parallel filesystem.

    import lode
    fs = lode.connect("127.0.0.1:9400")
    with fs.open("/data/shard-0000", "rb") as f:
        n = f.readinto(numpy_array)          # straight from the storage servers
    fs.read_ranges([("/data/a", 0, 4096), ("/data/b", 8192, 4096)], into=[buf1, buf2])
    with fs.open("/data/shard-0001", "rb") as f:
        f.readinto(cuda_tensor)              # into GPU memory, on the current stream
        print(f.last_io)                     # {'path': 'staged', 'verified': 'end-to-end', ...}

Errors are the exceptions Python code already catches: FileNotFoundError, FileExistsError,
PermissionError, IsADirectoryError, NotADirectoryError, and OSError with its errno.
"""

import io

from ._lode import Filesystem as _Filesystem
from ._lode import RawFile
from ._lode import SimGpu

__all__ = ["connect", "Filesystem", "File", "RawFile", "SimGpu"]


class File(io.RawIOBase):
    """A lode file as a Python binary file: read, readinto (no copy), write, seek, tell,
    flush, close, fsync, truncate, and a context manager. Unbuffered: every call reaches the
    storage servers, so read and write in large pieces (or wrap it in io.BufferedReader)."""

    def __init__(self, raw, mode):
        super().__init__()
        self._raw = raw
        self.mode = mode

    @property
    def name(self):
        return self._raw.name

    def readable(self):
        return self._raw.readable()

    def writable(self):
        return self._raw.writable()

    def seekable(self):
        return True

    def readinto(self, buffer, path="auto"):
        """Reads into host memory, or into GPU memory (a CUDA tensor, anything with
        __cuda_array_interface__ or DLPack) on `path`: "auto" (direct where the transport
        reaches GPU memory, else staged), "direct" (or an error) or "staged"."""
        return self._raw.readinto(buffer, path)

    @property
    def last_io(self):
        """What the last read or write of GPU memory did: bytes, path, verified,
        staged_bytes, fallback."""
        return self._raw.last_io

    def read(self, size=-1):
        return self._raw.read(-1 if size is None else size)

    def readall(self):
        return self._raw.read(-1)

    def write(self, data, path="auto"):
        return self._raw.write(data, path)

    def seek(self, offset, whence=io.SEEK_SET):
        return self._raw.seek(offset, whence)

    def tell(self):
        return self._raw.tell()

    def truncate(self, size=None):
        return self._raw.truncate(size)

    def size(self):
        return self._raw.size()

    def flush(self):
        if not self.closed:
            self._raw.flush()

    def fsync(self):
        """Makes every write through this file durable on the storage servers."""
        self._raw.fsync()

    def close(self):
        if not self.closed:
            try:
                self._raw.close()
            finally:
                super().close()


class Filesystem:
    """A connection to one lode filesystem (its MDS address). Safe to share between threads;
    after fork (DataLoader workers) the child reconnects by itself on its first call."""

    def __init__(self, address, timeout=60.0, key=None, auth=True, privacy=False, gpu=None):
        self._fs = _Filesystem(address, timeout, key, auth, privacy, gpu)
        self.address = address

    def open(self, path, mode="rb", buffering=0, stripe_count=None, stripe_size=None):
        """Opens `path` in "rb", "wb", "ab", "r+b", "xb" (or with "+"). buffering=0 (the
        default) gives the unbuffered File; a positive size wraps it in io.Buffered*."""
        if "b" not in mode:
            raise ValueError("lode files are binary: use a mode with 'b'")
        raw = File(self._fs.open(path, mode.replace("t", ""), stripe_count, stripe_size), mode)
        if buffering == 0:
            return raw
        size = io.DEFAULT_BUFFER_SIZE if buffering < 0 else buffering
        if "+" in mode:
            return io.BufferedRandom(raw, size)
        if "r" in mode:
            return io.BufferedReader(raw, size)
        return io.BufferedWriter(raw, size)

    def ls(self, path="/", detail=False):
        entries = self._fs.ls(path)
        return entries if detail else [e["name"] for e in entries]

    def stat(self, path):
        return self._fs.stat(path)

    def exists(self, path):
        try:
            self._fs.stat(path)
            return True
        except FileNotFoundError:
            return False

    def mkdir(self, path, parents=False, mode=0o755):
        self._fs.mkdir(path, parents, mode)

    def rm(self, path, recursive=False):
        self._fs.rm(path, recursive)

    def rmdir(self, path):
        self._fs.rmdir(path)

    def rename(self, src, dst):
        """Atomic, replacing `dst` if it exists."""
        self._fs.rename(src, dst)

    def sync(self):
        """Waits until every namespace change made so far (a rename, say) is durable, as
        fsync of a directory does; raises OSError (EIO) if an acknowledged change was lost."""
        self._fs.sync()

    def close(self):
        """Commits what this client changed and leaves every MDS's table of clients; the
        filesystem connects again if used after."""
        self._fs.close()

    def setstripe(self, path, stripe_count=1, stripe_size=4 << 20):
        self._fs.setstripe(path, stripe_count, stripe_size)

    def getstripe(self, path):
        return self._fs.getstripe(path)

    def df(self):
        return self._fs.df()

    def crypt_set(self, path, key_file):
        """Encrypts everything made below the empty directory `path` under the master key in
        `key_file` (64 random bytes); unlocks it for this user on this node. Returns the key's
        identifier."""
        return self._fs.crypt_set(path, key_file)

    def crypt_unlock(self, path, key_file):
        """Gives every process of this user on this node (the kernel keyring, so DataLoader
        workers too) the key of the encrypted directory `path`."""
        self._fs.crypt_unlock(path, key_file)

    def crypt_lock(self, path):
        """Takes the key of the encrypted directory `path` out of the keyring."""
        return self._fs.crypt_lock(path)

    def crypt_status(self, path):
        """None for a clear directory, else its key's identifier and whether it is unlocked."""
        return self._fs.crypt_status(path)

    def read_ranges(self, ranges, into=None, max_in_flight=256, path="auto"):
        """Reads every (path, offset, length) at once; returns when all have landed. With
        `into` (one writable buffer per range, host or GPU memory), fills them and returns
        the byte counts; else returns a list of bytes. GPU buffers are read on `path`."""
        return self._fs.read_ranges(list(ranges), into, max_in_flight, path)

    def read_bytes(self, path):
        with self.open(path, "rb") as f:
            return f.readall()

    def write_bytes(self, path, data):
        with self.open(path, "wb") as f:
            f.write(data)


def connect(address="127.0.0.1:9400", timeout=60.0, key=None, auth=True, privacy=False,
            gpu=None):
    """Connects to the lode filesystem whose MDS listens at `address` ("host:port"). Calls
    keep being resent for `timeout` seconds while a server is unreachable or restarting.

    Connections authenticate with the key file `key` (default: $LODE_KEY, else
    /etc/lode/client.key); `auth=False` connects without authentication, to a cluster that
    runs without it. `privacy=True` also encrypts them.

    GPU buffers belong to `gpu`: None or "auto" (CUDA if the driver is found, else none),
    "cuda", "none", or a `lode.SimGpu` (a simulated GPU, for tests without one)."""
    return Filesystem(address, timeout, key, auth, privacy, gpu)
