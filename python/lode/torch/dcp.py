"""PyTorch Distributed Checkpoint (DCP) on lode.

    import torch.distributed.checkpoint as dcp
    import lode.torch.dcp as ldcp
    dcp.save(state, storage_writer=ldcp.Writer("lode://mds:9400/ckpt/step-1000"))
    dcp.async_save(state, storage_writer=ldcp.Writer(url))        # training goes on
    dcp.load(state, storage_reader=ldcp.Reader(ldcp.latest("lode://mds:9400/ckpt")))

Each rank writes its shards from several threads, one file per thread (`__RANK_THREAD.distcp`),
each item at a 4 KiB-aligned offset, straight from the tensor's memory: host tensors with no
copy, GPU tensors through a pinned piece on the thread's own CUDA stream, never a whole-tensor
host copy. Every item is digested in pieces of `piece` bytes (SHA-256 each) as it is written.

A checkpoint is published whole or not at all: the ranks write under a temporary directory
(`.NAME.tmp-SAVEID` beside the target), the coordinator writes DCP's metadata and lode's
manifest last, fsyncs them and renames the directory into place with one rename, made durable
before `save` returns; then it points `.lode-latest` in the parent at it. A reader therefore
finds the previous checkpoint or the new one, never a mix; a save that dies leaves only its
temporary directory, which the next save of that name removes.

Loading reads each piece into a per-thread bounce buffer (pinned when the target is on a GPU),
checks its digest, and only then copies it into the target tensor: a damaged shard (zeros, a
torn write, a lost object) raises CheckpointError naming the tensor and the shard, and none of
its bytes reach the state dict. Loading into another world size (resharding) works as DCP
defines it: a stored chunk read whole, verified, and the requested part of it copied.

The manifest (`.lode-manifest.json`, JSON) lists each shard's tensor, file, offset, length and
piece digests, and the metadata file's digest: `lode verify DIR` checks a checkpoint with it.
"""

import dataclasses
import errno
import hashlib
import io
import json
import os
import pickle
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, SavePlan
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import CheckpointError, _commit, _fs

__all__ = ["Writer", "Reader", "latest", "verify", "CheckpointError"]

FORMAT = "lode-dcp"
VERSION = 1
MANIFEST = ".lode-manifest.json"
METADATA = ".metadata"
LATEST = ".lode-latest"
ALIGN = 4096
PIECE = 32 << 20


def split_url(url, fs=None):
    """(MDS address, absolute path) of "lode://host:port/a/b", or of a path on `fs` (a
    Filesystem or an address; default $LODE_MDS)."""
    url = os.fspath(url)
    if fs is not None:
        default = fs.address if hasattr(fs, "address") else str(fs)
    else:
        default = os.environ.get("LODE_MDS", "127.0.0.1:9400")
    if url.startswith("lode://"):
        parts = urlsplit(url)
        address, path = parts.netloc or default, parts.path
    else:
        address, path = default, url
    path = "/" + path.strip("/")
    return address, path


def _join(parent, name):
    return f"{parent.rstrip('/')}/{name}"


def _parent_and_name(path):
    parent, name = path.rsplit("/", 1)
    if not name:
        raise ValueError("a checkpoint is a directory below the root, not the root")
    return parent or "/", name


def _url(address, path):
    return f"lode://{address}{path}"


def _align(at):
    return -(-at // ALIGN) * ALIGN


def _digests(view, piece):
    """SHA-256 of each `piece` bytes of a buffer (one digest for an empty one)."""
    view = memoryview(view).cast("B")
    if len(view) == 0:
        return [hashlib.sha256(b"").hexdigest()]
    return [hashlib.sha256(view[at:at + piece]).hexdigest()
            for at in range(0, len(view), piece)]


def _write_all(f, at, view):
    view = memoryview(view).cast("B")
    f.seek(at)
    done = 0
    while done < len(view):
        n = f.write(view[done:])
        if not n:
            raise OSError(errno.EIO, "a write to lode took no bytes", f.name)
        done += n


def _read_full(f, at, view):
    """Reads up to len(view) bytes at `at`; returns how many (fewer only at the file's end)."""
    f.seek(at)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            break
        done += n
    return done


def _host_bytes(t):
    """A contiguous CPU tensor's bytes, as a uint8 numpy array over the same memory."""
    return t.reshape(-1).view(torch.uint8).numpy()


@dataclasses.dataclass(frozen=True)
class _Prefix:
    """Where a rank writes: the temporary directory and its files' prefix."""
    dir: str
    prefix: str


@dataclasses.dataclass(frozen=True)
class _Shard:
    """Where one stored item lies and what it must hash to (DCP's storage data)."""
    file: str
    offset: int
    length: int
    piece: int
    sha256: tuple
    dtype: str = None
    shape: tuple = None


def _label(index):
    """A stored item's name: its key, and for a shard of a tensor past the first, where the
    shard starts ("w@[48, 0]")."""
    if index.offset is None or not any(index.offset):
        return index.fqn
    return f"{index.fqn}@{list(index.offset)}"


def _threads(threads):
    """Writer and reader threads per rank: the given number, else the node's cores shared
    among its ranks (LOCAL_WORLD_SIZE), between 2 and 8."""
    if threads:
        return max(1, int(threads))
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return min(8, max(2, (os.cpu_count() or 2) // local))


def _item_bytes(item):
    td = item.tensor_data
    if td is None:
        return 0
    n = 1
    for s in td.size:
        n *= s
    return n * torch.empty((), dtype=td.properties.dtype).element_size()


def _bins(items, count):
    """Items shared among `count` files by size, largest first into the lightest."""
    count = max(1, min(count, len(items)))
    bins = [[] for _ in range(count)]
    load = [0] * count
    for item in sorted(items, key=_item_bytes, reverse=True):
        i = load.index(min(load))
        bins[i].append(item)
        load[i] += _item_bytes(item)
    return [b for b in bins if b]


class _DeviceStage:
    """A pinned piece and a CUDA stream of one thread, for moving GPU memory piece by
    piece."""

    def __init__(self, device, piece):
        self.stream = torch.cuda.Stream(device)
        self.buf = torch.empty(piece, dtype=torch.uint8, pin_memory=True)


class _Located:
    """Where a checkpoint is: its MDS address and path, as DCP's checkpoint id (a URL)."""

    @property
    def checkpoint_id(self):
        return _url(self.address, self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return str(checkpoint_id).startswith("lode://")


class Writer(_Located, StorageWriter, BlockingAsyncStager):
    """A DCP StorageWriter on lode (see the module's docstring).

    url: "lode://host:port/dir/name", or a path with `fs` (a lode.Filesystem or an address).
    threads: writer threads (and files) per rank; default from the node's cores.
    piece: the bytes under each SHA-256 (32 MiB).
    overwrite: replace an existing checkpoint of that name (two renames: between them the
      name is absent); by default an existing one is an error (FileExistsError).
    sync: fsync every file before publishing (on by default; off loses the guarantee).
    stripe_count, stripe_size: the temporary directory's layout, so its files' (default: the
      parent's).
    pinned_staging: for `async_save`, keep a pinned host copy of the state dict between saves
      (staging GPU tensors is then one fast copy; the copy is held until the writer goes)."""

    def __init__(self, url, *, fs=None, threads=None, piece=PIECE, overwrite=False, sync=True,
                 stripe_count=None, stripe_size=None, pinned_staging=False):
        StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=pinned_staging)
        self.address, self.path = split_url(url, fs)
        _parent_and_name(self.path)
        if piece <= 0 or piece % ALIGN:
            raise ValueError(f"piece must be a positive multiple of {ALIGN}")
        self.threads = threads
        self.piece = piece
        self.overwrite = overwrite
        self.sync = sync
        self.stripe_count = stripe_count
        self.stripe_size = stripe_size
        self.save_id = uuid.uuid4().hex
        self.tmp = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["state_dict_cache"] = None  # a process-based async save stages on its own
        return state

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.address, self.path = split_url(checkpoint_id, self.address)
            _parent_and_name(self.path)
        self.save_id = uuid.uuid4().hex
        self.tmp = None

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        if not kwargs.get("use_collectives", True):
            raise ValueError("lode.torch.dcp.Writer publishes a checkpoint with one rename by "
                             "the coordinator: save with use_collectives=True")

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans):
        fs = _fs(self.address)
        parent, name = _parent_and_name(self.path)
        if not fs.exists(parent):
            fs.mkdir(parent, parents=True)
        if fs.exists(self.path) and not self.overwrite:
            raise FileExistsError(errno.EEXIST, "a checkpoint is already there "
                                  "(Writer(..., overwrite=True) replaces it)",
                                  self.checkpoint_id)
        _sweep(fs, parent, name)
        self.tmp = _join(parent, f".{name}.tmp-{self.save_id[:16]}")
        fs.mkdir(self.tmp)
        if self.stripe_count is not None or self.stripe_size is not None:
            fs.setstripe(self.tmp, self.stripe_count or 1, self.stripe_size or (4 << 20))
        return [dataclasses.replace(p, storage_data=_Prefix(self.tmp, f"__{i}_"))
                for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        where = plan.storage_data
        fs = _fs(self.address)
        bins = _bins(plan.items, _threads(self.threads))

        def write_bin(i):
            name = f"{where.prefix}{i}.distcp"
            results, stage = [], None
            with fs.open(_join(where.dir, name), "wb") as f:
                at = 0
                for item in bins[i]:
                    data = planner.resolve_data(item)
                    at = _align(at)
                    if isinstance(data, torch.Tensor):
                        t = data.detach()
                        if t.device.type != "cpu" and stage is None:
                            stage = _DeviceStage(t.device, self.piece)
                        n, sha = self._write_tensor(f, at, t, stage)
                        shard = _Shard(name, at, n, self.piece, tuple(sha),
                                       str(t.dtype).removeprefix("torch."), tuple(t.shape))
                    else:
                        raw = data.getbuffer() if isinstance(data, io.BytesIO) else bytes(data)
                        _write_all(f, at, raw)
                        n = len(raw)
                        shard = _Shard(name, at, n, self.piece, tuple(_digests(raw, self.piece)))
                    results.append(WriteResult(index=item.index, size_in_bytes=n,
                                               storage_data=shard))
                    at += n
                if self.sync:
                    f.fsync()
            return results

        with ThreadPoolExecutor(len(bins) or 1, thread_name_prefix="lode-dcp-write") as pool:
            out = [r for rs in pool.map(write_bin, range(len(bins))) for r in rs]
        fut = Future()
        fut.set_result(out)
        return fut

    def _write_tensor(self, f, at, t, stage):
        """Writes a tensor's bytes at `at`: from host memory as they lie, from GPU memory a
        piece at a time through the pinned stage. Returns (bytes, piece digests)."""
        t = t.contiguous()
        if t.device.type == "cpu":
            raw = _host_bytes(t)
            _write_all(f, at, raw)
            return len(raw), _digests(raw, self.piece)
        flat = t.reshape(-1).view(torch.uint8)
        n, sha = flat.numel(), []
        # The copies wait for the work that made the tensor, on the stream that made it.
        stage.stream.wait_stream(torch.cuda.current_stream(t.device))
        for a in range(0, max(n, 1), self.piece):
            k = min(self.piece, n - a)
            piece = stage.buf[:k]
            with torch.cuda.stream(stage.stream):
                piece.copy_(flat[a:a + k], non_blocking=True)
            stage.stream.synchronize()
            host = piece.numpy()
            sha.append(hashlib.sha256(host).hexdigest())
            _write_all(f, at + a, host)
        return n, sha

    def finish(self, metadata: Metadata, results):
        fs = _fs(self.address)
        storage = {}
        for rs in results:
            for wr in rs:
                storage[wr.index] = wr.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        payload = pickle.dumps(metadata, protocol=4)
        shards = [{"name": _label(index), "file": s.file, "offset": s.offset,
                   "length": s.length, "sha256": list(s.sha256)}
                  for index, s in sorted(storage.items(),
                                         key=lambda kv: (kv[1].file, kv[1].offset))]
        manifest = {"format": FORMAT, "version": VERSION, "piece": self.piece,
                    "metadata": {"file": METADATA, "length": len(payload),
                                 "sha256": _digests(payload, self.piece)},
                    "shards": shards}
        for name, data in ((METADATA, payload),
                           (MANIFEST, json.dumps(manifest, separators=(",", ":")).encode())):
            with fs.open(_join(self.tmp, name), "wb") as f:
                _write_all(f, 0, data)
                if self.sync:
                    f.fsync()
        parent, name = _parent_and_name(self.path)
        if fs.exists(self.path):
            if not self.overwrite:
                raise FileExistsError(errno.EEXIST, "a checkpoint appeared there during the "
                                      "save", self.checkpoint_id)
            old = _join(parent, f".{name}.old-{self.save_id[:16]}")
            fs.rename(self.path, old)
            fs.rename(self.tmp, self.path)
            fs.rm(old, recursive=True)
        else:
            fs.rename(self.tmp, self.path)
        fs.sync()
        _commit(fs, _join(parent, LATEST), name.encode())
        self.tmp = None


def _sweep(fs, parent, name):
    """Removes what failed saves of `name` left behind: their temporary directories, and the
    replaced checkpoint of an overwrite, but only once its replacement holds the name (an
    overwrite killed between its two renames leaves the old one only there)."""
    stale = re.compile(rf"^\.{re.escape(name)}\.(tmp|old)-[0-9a-f]+$")
    published = fs.exists(_join(parent, name))
    for entry in fs.ls(parent):
        here = entry.rsplit("/", 1)[-1]
        found = stale.match(here)
        if found and (found.group(1) == "tmp" or published):
            fs.rm(_join(parent, here), recursive=True)


def _manifest(fs, path, url):
    try:
        with fs.open(_join(path, MANIFEST), "rb") as f:
            raw = f.readall()
    except FileNotFoundError:
        if not fs.exists(path):
            raise FileNotFoundError(errno.ENOENT, "no checkpoint there", url) from None
        raise CheckpointError(f"{url}: not a complete lode DCP checkpoint (no "
                              f"{MANIFEST})") from None
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{url}: the manifest is damaged: {e}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{url}: not a lode DCP checkpoint of version {VERSION}")
    return manifest


def _damaged(url, what, shard, detail):
    return CheckpointError(f"{url}: {what} is damaged ({shard.file} at byte {shard.offset}, "
                           f"{shard.length} bytes): {detail} (it is not loaded)")


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata is a pickle: loaded allowing only what DCP's metadata is made of (its
    metadata classes, torch's sizes, dtypes and layouts, lode's storage entries), so a
    checkpoint directory cannot run code in the process that loads it."""

    METADATA = "torch.distributed.checkpoint.metadata"
    ALLOWED = {("lode.torch.dcp", "_Shard"), ("torch", "Size"),
               ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
               ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice")}

    def __init__(self, stream, url):
        super().__init__(stream)
        self.url = url

    def find_class(self, module, name):
        found = None
        if (module, name) in self.ALLOWED:
            found = super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None),
                                              (torch.dtype, torch.layout, torch.memory_format)):
            found = getattr(torch, name)
        elif module == self.METADATA and not name.startswith("__"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == self.METADATA:
                found = obj
        if found is None:
            raise CheckpointError(f"{self.url}: DCP's metadata names {module}.{name}, which "
                                  "checkpoint metadata does not hold (it is not loaded)")
        return found


class Reader(_Located, StorageReader):
    """A DCP StorageReader on lode (see the module's docstring).

    url: "lode://host:port/dir/name", or a path with `fs`.
    threads: reader threads per rank; default from the node's cores."""

    def __init__(self, url, *, fs=None, threads=None):
        super().__init__()
        self.address, self.path = split_url(url, fs)
        self.threads = threads
        self.storage = None
        self.load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            self.address, self.path = split_url(checkpoint_id, self.address)
        self.storage = None
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **kwargs):
        fs = _fs(self.address)
        url = self.checkpoint_id
        manifest = _manifest(fs, self.path, url)
        entry = manifest.get("metadata") or {}
        with fs.open(_join(self.path, METADATA), "rb") as f:
            raw = f.readall()
        if (len(raw) != entry.get("length")
                or _digests(raw, manifest.get("piece", PIECE)) != entry.get("sha256")):
            raise CheckpointError(f"{url}: DCP's metadata is damaged: its SHA-256 does not "
                                  "match the manifest (it is not loaded)")
        metadata = _MetadataUnpickler(io.BytesIO(raw), url).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage = metadata.storage_data
        if not isinstance(self.storage, dict):
            raise CheckpointError(f"{self.checkpoint_id}: the metadata has no storage map")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        fs = _fs(self.address)
        url = self.checkpoint_id
        groups = {}
        for req in plan.items:
            shard = self.storage.get(req.storage_index)
            if not isinstance(shard, _Shard):
                raise CheckpointError(f"{url}: no stored data for {_label(req.storage_index)}")
            groups.setdefault((shard.file, shard.offset), (shard, []))[1].append(req)

        # Work: a piece of a shard that lands whole in one contiguous target; a whole shard
        # (read, verified, then the requested parts copied out) otherwise.
        pieces, chunks, blobs, commits = [], [], [], []
        for shard, reqs in groups.values():
            what = f"tensor {_label(reqs[0].storage_index)!r}"
            if reqs[0].type == LoadItemType.BYTE_IO:
                blobs.append((shard, reqs, what))
                continue
            targets = [planner.resolve_tensor(r).detach() for r in reqs]
            t = targets[0]
            whole = (len(reqs) == 1 and shard.dtype is not None
                     and list(reqs[0].storage_offsets) == [0] * len(shard.shape)
                     and list(reqs[0].lengths) == list(shard.shape)
                     and t.is_contiguous() and str(t.dtype).removeprefix("torch.") == shard.dtype
                     and t.numel() * t.element_size() == shard.length)
            if whole:
                flat = t.reshape(-1).view(torch.uint8)
                for k in range(len(shard.sha256)):
                    pieces.append((shard, k, flat, what))
            else:
                chunks.append((shard, reqs, targets, what))
            commits.append((reqs, targets))
        devices = {t.device for _, ts in commits for t in ts if t.device.type != "cpu"}
        local = threading.local()
        failed = threading.Event()
        handles, lock = [], threading.Lock()

        def file_of(name):
            files = getattr(local, "files", None)
            if files is None:
                files = local.files = {}
            if name not in files:
                files[name] = fs.open(_join(self.path, name), "rb")
                with lock:
                    handles.append(files[name])
            return files[name]

        def bounce(nbytes, device):
            buf = getattr(local, "bounce", None)
            if buf is None or len(buf) < nbytes:
                buf = local.bounce = torch.empty(max(nbytes, 1), dtype=torch.uint8,
                                                 pin_memory=bool(devices))
            return buf[:nbytes]

        def stream_of(device):
            streams = getattr(local, "streams", None)
            if streams is None:
                streams = local.streams = {}
            if device not in streams:
                streams[device] = torch.cuda.Stream(device)
                streams[device].wait_stream(torch.cuda.current_stream(device))
            return streams[device]

        def fetch(shard, k, into, what):
            """Reads piece k of `shard` into the host buffer `into` and checks its digest."""
            at = k * shard.piece
            n = min(shard.piece, shard.length - at)
            try:
                got = _read_full(file_of(shard.file), shard.offset + at, into[:n].numpy())
            except OSError as e:
                raise _damaged(url, what, shard, f"reading it failed: {e}") from e
            if got != n:
                raise _damaged(url, what, shard, f"the file ends {n - got} bytes short")
            if hashlib.sha256(into[:n].numpy()).hexdigest() != shard.sha256[k]:
                raise _damaged(url, what, shard, f"bytes {at}..{at + n} do not match their "
                               "SHA-256")
            return n

        def run_piece(work):
            shard, k, flat, what = work
            if failed.is_set():
                return
            at = k * shard.piece
            n = min(shard.piece, shard.length - at)
            buf = bounce(n, flat.device)
            fetch(shard, k, buf, what)
            if flat.device.type == "cpu":
                flat[at:at + n].copy_(buf)
            else:
                s = stream_of(flat.device)
                with torch.cuda.stream(s):
                    flat[at:at + n].copy_(buf, non_blocking=True)
                s.synchronize()

        def run_chunk(work):
            shard, reqs, targets, what = work
            if failed.is_set():
                return
            stored = torch.empty(shard.length, dtype=torch.uint8, pin_memory=bool(devices))
            for k in range(len(shard.sha256)):
                fetch(shard, k, stored[k * shard.piece:], what)
            t = stored.view(getattr(torch, shard.dtype)).reshape(shard.shape)
            for req, target in zip(reqs, targets):
                part = t
                for dim, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    part = part.narrow(dim, o, n)
                if target.size() != part.size():
                    raise CheckpointError(f"{url}: {what}: the stored part is "
                                          f"{list(part.size())}, the target "
                                          f"{list(target.size())}")
                target.copy_(part)

        def run_blob(work):
            shard, reqs, what = work
            if failed.is_set():
                return None
            raw = torch.empty(shard.length, dtype=torch.uint8)
            for k in range(len(shard.sha256)):
                fetch(shard, k, raw[k * shard.piece:], what)
            return raw.numpy().tobytes()

        def guarded(fn):
            def run(work):
                try:
                    return fn(work)
                except BaseException:
                    failed.set()
                    raise
            return run

        try:
            with ThreadPoolExecutor(_threads(self.threads),
                                    thread_name_prefix="lode-dcp-read") as pool:
                got = [pool.submit(guarded(run_blob), w) for w in blobs]
                done = [pool.submit(guarded(run_piece), w) for w in pieces]
                done += [pool.submit(guarded(run_chunk), w) for w in chunks]
                errors = [f.exception() for f in got + done if f.exception() is not None]
                if errors:
                    raise errors[0]
        finally:
            for f in handles:
                f.close()
        for (shard, reqs, what), fut in zip(blobs, got):
            for req in reqs:
                planner.load_bytes(req, io.BytesIO(fut.result()))
        for reqs, targets in commits:
            for req, target in zip(reqs, targets):
                planner.commit_tensor(req, target)
        fut = Future()
        fut.set_result(None)
        return fut


def latest(url, fs=None):
    """The newest complete checkpoint under the directory `url` ("lode://host:port/ckpt"), as
    a URL, or None. The parent's `.lode-latest` (written by each save once it is published)
    names it; without it, or if it names one since removed, the complete checkpoints (those
    with a manifest) are listed and the one with the highest trailing number (then the newest)
    wins. Under torch.distributed, rank 0 asks and the answer is broadcast: one rank reads the
    namespace, not every one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        box = [_latest(url, fs) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return _latest(url, fs)


def _latest(url, fs):
    address, parent = split_url(url, fs)
    lfs = _fs(address)
    try:
        with lfs.open(_join(parent, LATEST), "rb") as f:
            name = f.readall().decode().strip()
        if name and "/" not in name and lfs.exists(_join(_join(parent, name), MANIFEST)):
            return _url(address, _join(parent, name))
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    try:
        entries = lfs.ls(parent, detail=True)
    except FileNotFoundError:
        return None
    best = None
    for e in entries:
        name = e["name"].rsplit("/", 1)[-1]
        if e["type"] != "directory" or name.startswith("."):
            continue
        path = _join(parent, name)
        if not lfs.exists(_join(path, MANIFEST)):
            continue
        digits = re.search(r"(\d+)$", name)
        rank = (int(digits.group(1)) if digits else -1, e["mtime"], name)
        if best is None or rank > best[0]:
            best = (rank, path)
    return None if best is None else _url(address, best[1])


def verify(url, fs=None):
    """Checks every digest of a checkpoint written by Writer (the metadata's and every
    shard's piece); returns the number of shards, or raises CheckpointError naming the first
    damaged one. (`lode verify DIR` does the same from the command line.)"""
    address, path = split_url(url, fs)
    lfs = _fs(address)
    full = _url(address, path)
    manifest = _manifest(lfs, path, full)
    piece = manifest.get("piece", PIECE)
    entries = [dict(manifest["metadata"], name="DCP's metadata", offset=0)]
    entries += [dict(s, name=f"tensor {s['name']!r}") for s in manifest["shards"]]
    files = {}
    try:
        for e in entries:
            shard = _Shard(e["file"], e["offset"], e["length"], piece, tuple(e["sha256"]))
            if e["file"] not in files:
                files[e["file"]] = lfs.open(_join(path, e["file"]), "rb")
            buf = torch.empty(min(piece, max(shard.length, 1)), dtype=torch.uint8)
            for k in range(len(shard.sha256)):
                at = k * piece
                n = min(piece, shard.length - at)
                try:
                    got = _read_full(files[e["file"]], shard.offset + at, buf[:n].numpy())
                except OSError as err:
                    raise _damaged(full, e["name"], shard, f"reading it failed: {err}") from err
                if got != n or hashlib.sha256(buf[:n].numpy()).hexdigest() != shard.sha256[k]:
                    raise _damaged(full, e["name"], shard,
                                   f"bytes {at}..{at + n} do not match their SHA-256")
    finally:
        for f in files.values():
            f.close()
    return len(manifest["shards"])
