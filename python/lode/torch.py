"""PyTorch helpers (torch is an optional extra: `pip install lode[torch]`).

- `ShardDataset`: map-style, one item per file or per (path, offset, length) byte range.
- `StreamingShards`: iterable, streams shards and splits them across ranks and DataLoader
  workers, so each shard is read by exactly one worker of one rank per epoch.
- `save`, `load`, `save_async`: checkpoints written to a temporary name, fsynced, then renamed
  over the final name, so a reader sees the old checkpoint or the new one, never a part.

Every worker process connects on its own (after fork the connection is made again).
"""

import io
import os
import threading
import uuid
from concurrent.futures import Future

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import lode

_local = threading.local()


def _fs(address):
    """This process's (and thread's) connection to `address`."""
    cache = getattr(_local, "fs", None)
    if cache is None or cache[0] != os.getpid():
        cache = (os.getpid(), {})
        _local.fs = cache
    if address not in cache[1]:
        cache[1][address] = lode.connect(address)
    return cache[1][address]


def _address(fs):
    return fs.address if isinstance(fs, lode.Filesystem) else fs


class ShardDataset(Dataset):
    """Items are whole files (paths) or byte ranges ((path, offset, length)); each is read
    in one call straight into a fresh buffer and passed to `transform` (default: a uint8
    tensor over the bytes, no copy)."""

    def __init__(self, fs, items, transform=None):
        self.address = _address(fs)
        self.items = [i if isinstance(i, tuple) else (i, 0, None) for i in items]
        self.transform = transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        path, offset, length = self.items[index]
        fs = _fs(self.address)
        if length is None:
            length = fs.stat(path)["size"] - offset
        buf = torch.empty(length, dtype=torch.uint8)
        n = fs.read_ranges([(path, offset, length)], into=[buf.numpy()])[0]
        data = buf[:n]
        return self.transform(data) if self.transform else data

    def read_many(self, indices):
        """Several items in one batch of reads (for a sampler that yields index lists)."""
        fs = _fs(self.address)
        ranges, bufs = [], []
        for i in indices:
            path, offset, length = self.items[i]
            if length is None:
                length = fs.stat(path)["size"] - offset
            ranges.append((path, offset, length))
            bufs.append(torch.empty(length, dtype=torch.uint8))
        counts = fs.read_ranges(ranges, into=[b.numpy() for b in bufs])
        out = [b[:n] for b, n in zip(bufs, counts)]
        return [self.transform(d) for d in out] if self.transform else out


def _rank_and_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class StreamingShards(IterableDataset):
    """Streams the shards this rank and worker own (shard i goes to the i-th of all
    rank×worker slots), reading each in `chunk`-byte pieces. `decode(path, data)` turns a whole
    shard into an iterable of samples; without it, each shard is yielded as (path, tensor)."""

    def __init__(self, fs, shards, decode=None, chunk=64 << 20, shuffle_seed=None):
        self.address = _address(fs)
        self.shards = list(shards)
        self.decode = decode
        self.chunk = chunk
        self.shuffle_seed = shuffle_seed
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def mine(self):
        rank, world = _rank_and_world()
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info else (0, 1)
        slot, slots = rank * workers + wid, world * workers
        order = list(range(len(self.shards)))
        if self.shuffle_seed is not None:
            g = torch.Generator().manual_seed(self.shuffle_seed + self.epoch)
            order = torch.randperm(len(order), generator=g).tolist()
        return [self.shards[i] for i in order[slot::slots]]

    def __iter__(self):
        fs = _fs(self.address)
        for path in self.mine():
            with fs.open(path, "rb") as f:
                size = f.size()
                data = torch.empty(size, dtype=torch.uint8)
                view = data.numpy()
                at = 0
                while at < size:
                    n = f.readinto(view[at:at + self.chunk])
                    if n == 0:
                        break
                    at += n
                data = data[:at]
            if self.decode is None:
                yield path, data
            else:
                yield from self.decode(path, data)


def _commit(fs, path, payload):
    """Writes `payload` to a temporary name beside `path`, fsyncs, renames over `path`."""
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open(tmp, "wb") as f:
            view = memoryview(payload)
            step = 64 << 20
            for at in range(0, len(view), step):
                f.write(view[at:at + step])
            f.fsync()
        fs.rename(tmp, path)
    except BaseException:
        try:
            fs.rm(tmp)
        except OSError:
            pass
        raise


def save(obj, path, fs=None):
    """torch.save to lode, atomically: the old checkpoint stays whole until the new one is."""
    fs = _fs(_address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400")))
    buf = io.BytesIO()
    torch.save(obj, buf)
    _commit(fs, path, buf.getbuffer())


def save_async(obj, path, fs=None):
    """Serialises `obj` now (a consistent snapshot: later changes to it are not saved), then
    writes, fsyncs and renames in a background thread. Returns a Future whose result() is the
    path once committed, or raises the failure."""
    address = _address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400"))
    buf = io.BytesIO()
    torch.save(obj, buf)
    done = Future()

    def commit():
        try:
            _commit(_fs(address), path, buf.getbuffer())
            done.set_result(path)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)

    threading.Thread(target=commit, name="lode-save", daemon=False).start()
    return done


def load(path, fs=None, **kwargs):
    """torch.load from lode (one read of the whole file)."""
    fs = _fs(_address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400")))
    with fs.open(path, "rb") as f:
        data = bytearray(f.size())
        n = f.readinto(data)
    return torch.load(io.BytesIO(memoryview(data)[:n]), **kwargs)
