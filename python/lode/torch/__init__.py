"""PyTorch helpers (torch is an optional extra: `pip install lode[torch]`).

- `ShardDataset`: map-style, one item per file or per (path, offset, length) byte range.
- `StreamingShards`: iterable, streams shards and splits them across ranks and DataLoader
  workers, so each shard is read by exactly one worker of one rank per epoch.
- `save`, `load`, `save_async`: checkpoints written to a temporary name, fsynced, then renamed
  over the final name, so a reader sees the old checkpoint or the new one, never a part. Each
  carries a manifest of per-tensor SHA-256 digests that `load` verifies (a damaged checkpoint
  is refused with the tensor's name, never loaded) and `verify` (or `lode verify PATH`)
  checks; `load(..., map_location="cuda")` reads each tensor into GPU memory through a small
  pinned buffer, never holding the whole file in host memory.
- `lode.torch.dcp`: PyTorch Distributed Checkpoint's storage writer and reader on lode, and
  `latest` (also here) for the newest complete checkpoint of a directory.
- Datasets take `device=`: a torch device ("cuda", "cuda:1"), or any object with
  `empty(nbytes)` returning GPU memory (a `lode.SimGpu`); items then land in device memory
  straight from the storage servers (use `num_workers=0`: CUDA does not survive fork).

Every worker process connects on its own (after fork the connection is made again).

The checkpoint format (little-endian): `LODECKPT`, u32 version (1), u32 0, u64 header length,
the header (JSON: each tensor's name, dtype, shape, offset, nbytes and sha256, and the
skeleton's offset, nbytes and sha256), then the tensors' bytes, each 4 KiB-aligned, then the
skeleton: the object pickled with each tensor replaced by its index.
"""

import collections
import hashlib
import io
import json
import os
import pickle
import struct
import threading
import uuid
from concurrent.futures import Future

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import lode

_local = threading.local()


def _fs(address, device=None):
    """This process's (and thread's) connection to `address`; for a simulated GPU device,
    one whose GPU it is."""
    gpu = device if isinstance(device, lode.SimGpu) else None
    cache = getattr(_local, "fs", None)
    if cache is None or cache[0] != os.getpid():
        cache = (os.getpid(), {})
        _local.fs = cache
    key = (address, id(gpu))
    if key not in cache[1]:
        cache[1][key] = lode.connect(address, gpu=gpu)
    return cache[1][key]


def _address(fs):
    return fs.address if isinstance(fs, lode.Filesystem) else fs


def _empty(nbytes, device):
    """A uint8 buffer of `nbytes`: host memory, or device memory of `device`."""
    if device is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    if hasattr(device, "empty"):
        return device.empty(nbytes)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _target(buf, device):
    """What lode reads into: a numpy view of host memory, the device buffer itself."""
    return buf.numpy() if device is None else buf


def _trim(buf, n):
    return buf if n == len(buf) else buf[:n]


class ShardDataset(Dataset):
    """Items are whole files (paths) or byte ranges ((path, offset, length)); each is read
    in one call straight into a fresh buffer and passed to `transform` (default: a uint8
    tensor over the bytes, no copy). With `device`, the buffer is device memory and the
    bytes land there from the storage servers (on `path`: "auto", "direct", "staged")."""

    def __init__(self, fs, items, transform=None, device=None, path="auto"):
        self.address = _address(fs)
        self.items = [i if isinstance(i, tuple) else (i, 0, None) for i in items]
        self.transform = transform
        self.device = device
        self.path = path

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        path, offset, length = self.items[index]
        fs = _fs(self.address, self.device)
        if length is None:
            length = fs.stat(path)["size"] - offset
        buf = _empty(length, self.device)
        n = fs.read_ranges([(path, offset, length)], into=[_target(buf, self.device)],
                           path=self.path)[0]
        data = _trim(buf, n)
        return self.transform(data) if self.transform else data

    def read_many(self, indices):
        """Several items in one batch of reads (for a sampler that yields index lists)."""
        fs = _fs(self.address, self.device)
        ranges, bufs = [], []
        for i in indices:
            path, offset, length = self.items[i]
            if length is None:
                length = fs.stat(path)["size"] - offset
            ranges.append((path, offset, length))
            bufs.append(_empty(length, self.device))
        counts = fs.read_ranges(ranges, into=[_target(b, self.device) for b in bufs],
                                path=self.path)
        out = [_trim(b, n) for b, n in zip(bufs, counts)]
        return [self.transform(d) for d in out] if self.transform else out


def _rank_and_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class StreamingShards(IterableDataset):
    """Streams the shards this rank and worker own (shard i goes to the i-th of all
    rank×worker slots), reading each in `chunk`-byte pieces. `decode(path, data)` turns a whole
    shard into an iterable of samples; without it, each shard is yielded as (path, tensor).
    With `device`, each shard lands in device memory in one read."""

    def __init__(self, fs, shards, decode=None, chunk=64 << 20, shuffle_seed=None,
                 device=None, path="auto"):
        self.address = _address(fs)
        self.shards = list(shards)
        self.decode = decode
        self.chunk = chunk
        self.shuffle_seed = shuffle_seed
        self.epoch = 0
        self.device = device
        self.path = path

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
        fs = _fs(self.address, self.device)
        for path in self.mine():
            if self.device is not None:
                with fs.open(path, "rb") as f:
                    data = _empty(f.size(), self.device)
                    data = _trim(data, f.readinto(data, self.path))
                if self.decode is None:
                    yield path, data
                else:
                    yield from self.decode(path, data)
                continue
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
    """Writes `payload` (bytes, or a function that writes to the open file) to a temporary
    name beside `path`, fsyncs, renames over `path`, and makes the rename durable (the
    directory's fsync): a checkpoint saved survives a crash of the MDS and this process
    together."""
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open(tmp, "wb") as f:
            if callable(payload):
                payload(f)
            else:
                view = memoryview(payload)
                step = 64 << 20
                for at in range(0, len(view), step):
                    f.write(view[at:at + step])
            f.fsync()
        fs.rename(tmp, path)
        fs.sync()
    except BaseException:
        try:
            fs.rm(tmp)
        except OSError:
            pass
        raise


MAGIC = b"LODECKPT"
VERSION = 1
ALIGN = 4096
_HEAD = struct.Struct("<8sIIQ")


class CheckpointError(ValueError):
    """A checkpoint that is damaged or is not one."""


def _names(obj, prefix="", out=None):
    """Each tensor reachable through dicts, lists and tuples, by its dotted path."""
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out.setdefault(id(obj), prefix or "tensor")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _names(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _names(v, f"{prefix}.{i}" if prefix else str(i), out)
    return out


def _serialise(obj):
    """The checkpoint's bytes: header, tensors, skeleton (see the module's docstring)."""
    names = _names(obj)
    tensors, index = [], {}

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, torch.Tensor):
                if id(o) not in index:
                    index[id(o)] = len(tensors)
                    tensors.append((names.get(id(o), f"tensor{len(tensors)}"), o))
                return ("lode-tensor", index[id(o)])
            return None

    skel = io.BytesIO()
    Pickler(skel, protocol=4).dump(obj)
    skeleton = skel.getvalue()
    blobs, entries = [], []
    for name, t in tensors:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        entries.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."),
                        "shape": list(t.shape), "nbytes": len(raw),
                        "sha256": hashlib.sha256(raw).hexdigest()})
        blobs.append(raw)

    def layout(header_len):
        at = -(-(_HEAD.size + header_len) // ALIGN) * ALIGN
        for e, raw in zip(entries, blobs):
            e["offset"] = at
            at = -(-(at + len(raw)) // ALIGN) * ALIGN
        return at

    header = {"format": "lode-checkpoint", "version": VERSION, "tensors": entries,
              "skeleton": {"nbytes": len(skeleton),
                           "sha256": hashlib.sha256(skeleton).hexdigest()}}
    # Offsets depend on the header's length, which depends on the offsets: settle it.
    size = 0
    while True:
        header["skeleton"]["offset"] = layout(size)
        text = json.dumps(header, separators=(",", ":")).encode()
        if len(text) == size:
            break
        size = len(text)
    out = bytearray(header["skeleton"]["offset"] + len(skeleton))
    out[:_HEAD.size] = _HEAD.pack(MAGIC, VERSION, 0, len(text))
    out[_HEAD.size:_HEAD.size + len(text)] = text
    for e, raw in zip(entries, blobs):
        out[e["offset"]:e["offset"] + len(raw)] = raw
    off = header["skeleton"]["offset"]
    out[off:off + len(skeleton)] = skeleton
    return out


def save(obj, path, fs=None):
    """Saves `obj` (tensors anywhere in dicts, lists, tuples and picklable objects) to lode,
    atomically: the old checkpoint stays whole until the new one is. Each tensor's SHA-256
    goes in the manifest."""
    fs = _fs(_address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400")))
    _commit(fs, path, _serialise(obj))


def save_async(obj, path, fs=None):
    """Serialises `obj` now (a consistent snapshot: later changes to it are not saved), then
    writes, fsyncs and renames in a background thread. Returns a Future whose result() is the
    path once committed, or raises the failure."""
    address = _address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400"))
    payload = _serialise(obj)
    done = Future()

    def commit():
        try:
            _commit(_fs(address), path, payload)
            done.set_result(path)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            done.set_exception(e)

    threading.Thread(target=commit, name="lode-save", daemon=False).start()
    return done


def _header(f, path):
    head = bytearray(_HEAD.size)
    if f.readinto(head) != _HEAD.size:
        raise CheckpointError(f"{path}: too short to be a lode checkpoint")
    magic, version, _, length = _HEAD.unpack(head)
    if magic != MAGIC:
        return None
    if version != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {version}, this lode reads {VERSION}")
    if length > 1 << 30:
        raise CheckpointError(f"{path}: header of {length} bytes")
    text = bytearray(length)
    if f.readinto(text) != length:
        raise CheckpointError(f"{path}: the header is cut short")
    try:
        return json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"{path}: the header is damaged: {e}") from None


def _read_verified(f, path, entry, what, into=None, chunk=16 << 20):
    """Reads `entry`'s bytes, hashing them as they pass: into host memory (returned), or in
    `chunk` pieces through a pinned buffer into the device tensor `into`."""
    n, sha = entry["nbytes"], hashlib.sha256()
    f.seek(entry["offset"])
    if into is None:
        data = bytearray(n)
        got = f.readinto(data) if n else 0
        sha.update(data)
    else:
        stage = torch.empty(min(chunk, max(n, 1)), dtype=torch.uint8, pin_memory=True)
        got, data = 0, None
        while got < n:
            k = min(len(stage), n - got)
            view = stage[:k]
            r = f.readinto(view.numpy())
            if r != k:
                break
            sha.update(view.numpy())
            into[got:got + k].copy_(view, non_blocking=True)
            torch.cuda.current_stream(into.device).synchronize()
            got += k
    if got != n or sha.hexdigest() != entry["sha256"]:
        raise CheckpointError(
            f"{path}: {what} is damaged: its SHA-256 does not match the manifest "
            f"(it is not loaded)")
    return data


class _Unpickler(pickle.Unpickler):
    SAFE = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
            ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range"),
            ("torch", "Size")}

    def __init__(self, data, tensor, weights_only):
        super().__init__(io.BytesIO(data))
        self.tensor = tensor
        self.weights_only = weights_only

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "lode-tensor"):
            raise CheckpointError(f"unknown reference {pid!r} in the checkpoint")
        return self.tensor(pid[1])

    def find_class(self, module, name):
        if self.weights_only and (module, name) not in self.SAFE and not (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            raise pickle.UnpicklingError(
                f"{module}.{name} is not allowed with weights_only=True")
        return super().find_class(module, name)


def load(path, fs=None, map_location=None, weights_only=True, **kwargs):
    """Loads a checkpoint saved by `save`, verifying every tensor's SHA-256 first (a damaged
    one raises CheckpointError naming it). `map_location` puts the tensors on a device
    ("cuda", "cuda:1", a torch.device): each is read into device memory through a small
    pinned buffer. With weights_only (the default) the skeleton may hold only containers,
    numbers, strings and tensors. A file written by torch.save is handed to torch.load."""
    fs = _fs(_address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400")))
    device = None if map_location is None else torch.device(map_location)
    with fs.open(path, "rb") as f:
        header = _header(f, path)
        if header is None:
            f.seek(0)
            data = bytearray(f.size())
            n = f.readinto(data)
            return torch.load(io.BytesIO(memoryview(data)[:n]), map_location=map_location,
                              weights_only=weights_only, **kwargs)
        try:
            entries = header["tensors"]
            skeleton = _read_verified(f, path, header["skeleton"], "the skeleton")
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: the manifest is incomplete: {e}") from None
        made = {}

        def tensor(i):
            if i in made:
                return made[i]
            e = entries[i]
            dtype = getattr(torch, e["dtype"])
            what = f"tensor {e['name']!r}"
            if device is None or device.type == "cpu":
                raw = _read_verified(f, path, e, what)
                t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(
                    0, dtype=torch.uint8)
            else:
                t = torch.empty(e["nbytes"], dtype=torch.uint8, device=device)
                _read_verified(f, path, e, what, into=t)
            made[i] = t.view(dtype).reshape(e["shape"])
            return made[i]

        return _Unpickler(bytes(skeleton), tensor, weights_only).load()


def latest(url, fs=None):
    """The newest complete distributed checkpoint under the directory `url`, as a URL, or None;
    under torch.distributed rank 0 asks and broadcasts (`lode.torch.dcp.latest`)."""
    from .dcp import latest as newest

    return newest(url, fs)


def verify(path, fs=None):
    """Checks every digest of a checkpoint saved by `save`; returns the number of tensors,
    or raises CheckpointError naming the first damaged one."""
    fs = _fs(_address(fs or os.environ.get("LODE_MDS", "127.0.0.1:9400")))
    with fs.open(path, "rb") as f:
        header = _header(f, path)
        if header is None:
            raise CheckpointError(f"{path}: not a lode checkpoint (no manifest)")
        _read_verified(f, path, header["skeleton"], "the skeleton")
        for e in header["tensors"]:
            _read_verified(f, path, e, f"tensor {e['name']!r}")
        return len(header["tensors"])
