"""safetensors files on lode, read straight into GPU (or host) memory.

    import lode.safetensors as lst
    weights = lst.load_file("lode://mds:9400/models/llama/model.safetensors", device="cuda")
    weights = lst.load_file("lode://mds:9400/models/llama", device="cuda:1")  # sharded
    lst.save_file(weights, "lode://mds:9400/models/mine/model.safetensors")

The format is safetensors' own (an 8-byte little-endian header length, a JSON header, the
tensors' bytes), so files move both ways between this module and the `safetensors` package.

`load_file` reads the header, checks it (known dtypes; each tensor's byte range matching its
shape and dtype, inside the file, overlapping no other; no name twice), allocates every tensor
on `device`, and puts every tensor's range in flight at once (`Filesystem.read_ranges`), each
landing straight in the tensor's memory: over TCP through lode's pinned staging, never a whole
host copy of a GPU-bound file. Any damage raises SafetensorsError naming the file and the
tensor: a bad header, a range past the file's end (a file cut short), a read the storage
servers could not serve. A directory (or an `*.index.json`) loads a sharded model through its
index's weight map, every shard's ranges in one batch.

`save_file` writes under a temporary name, fsyncs and renames over the target: a reader sees
the old file or the new one, whole.
"""

import errno
import json
import struct

import torch

from .torch import _commit, _fs
from .torch.dcp import split_url

__all__ = ["load_file", "save_file", "load_header", "SafetensorsError"]

# safetensors' dtype names (those torch has).
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "C64": torch.complex64,
}
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                     ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):
        DTYPES[_name] = getattr(torch, _attr)
NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20  # safetensors' own limit


class SafetensorsError(ValueError):
    """A safetensors file that is damaged or is not one."""


def _size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise SafetensorsError(f"the header names {k!r} twice")
        seen[k] = v
    return seen


def load_header(f, path, file_size):
    """The tensors of an open safetensors file as {name: (dtype, shape, start, end)} (file
    offsets), and its __metadata__; raises SafetensorsError if the header is not sound."""
    head = bytearray(8)
    if file_size < 8 or f.readinto(head) != 8:
        raise SafetensorsError(f"{path}: too short to be a safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER or 8 + n > file_size:
        raise SafetensorsError(f"{path}: a header of {n} bytes in a file of {file_size}")
    text = bytearray(n)
    if f.readinto(text) != n:
        raise SafetensorsError(f"{path}: the header is cut short")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except SafetensorsError as e:
        raise SafetensorsError(f"{path}: {e}") from None
    except ValueError as e:
        raise SafetensorsError(f"{path}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    meta = header.pop("__metadata__", None)
    base, end_of_data = 8 + n, file_size - 8 - n
    tensors, spans = {}, []
    for name, e in header.items():
        what = f"{path}: tensor {name!r}"
        try:
            dtype, shape, (start, end) = e["dtype"], e["shape"], e["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{what}: its header entry is malformed") from None
        if dtype not in DTYPES:
            raise SafetensorsError(f"{what}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise SafetensorsError(f"{what}: bad shape {shape!r}")
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end):
            raise SafetensorsError(f"{what}: bad data offsets {[start, end]}")
        count = 1
        for s in shape:
            count *= s
        if end - start != count * _size(DTYPES[dtype]):
            raise SafetensorsError(f"{what}: {end - start} bytes for shape {shape} of {dtype}")
        if end > end_of_data:
            raise SafetensorsError(f"{what}: its bytes end at {end}, past the data's end "
                                   f"({end_of_data}): the file is cut short")
        tensors[name] = (DTYPES[dtype], shape, base + start, base + end)
        if end > start:
            spans.append((start, end, name))
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise SafetensorsError(f"{path}: tensors {a!r} and {b!r} overlap")
    return tensors, meta


def _open(path, fs):
    address, p = split_url(path, fs)
    return _fs(address, None), p


def _shards(lfs, path):
    """The files to read and, for each, the names wanted from it (None: all)."""
    st = lfs.stat(path)
    if st["type"] == "directory":
        names = [n.rsplit("/", 1)[-1] for n in lfs.ls(path)]
        index = [n for n in names if n.endswith(".safetensors.index.json")]
        if len(index) > 1:
            raise SafetensorsError(f"{path}: several index files: {sorted(index)}")
        if not index:
            files = sorted(n for n in names if n.endswith(".safetensors"))
            if not files:
                raise FileNotFoundError(errno.ENOENT, "no safetensors file there", path)
            return [(f"{path.rstrip('/')}/{n}", None) for n in files]
        path = f"{path.rstrip('/')}/{index[0]}"
    if not path.endswith(".json"):
        return [(path, None)]
    with lfs.open(path, "rb") as f:
        try:
            weight_map = json.loads(f.readall())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise SafetensorsError(f"{path}: not a safetensors index: {e}") from None
    folder = path.rsplit("/", 1)[0]
    wanted = {}
    for name, file in weight_map.items():
        if "/" in file or file in ("", ".", ".."):
            raise SafetensorsError(f"{path}: tensor {name!r} is in {file!r}, outside the "
                                   "model's directory")
        wanted.setdefault(f"{folder}/{file}", []).append(name)
    return sorted(wanted.items())


def load_file(path, device="cpu", fs=None, max_in_flight=64):
    """Every tensor of a safetensors file, or of a sharded model (a directory or its
    `*.index.json`), as {name: tensor} on `device` ("cpu", "cuda", "cuda:1", a torch.device)."""
    lfs, path = _open(path, fs)
    device = torch.device(device)
    plan = []  # (file, name, dtype, shape, start, end)
    seen = {}
    for file, names in _shards(lfs, path):
        with lfs.open(file, "rb") as f:
            tensors, _ = load_header(f, file, f.size())
        for name in (names if names is not None else tensors):
            if name not in tensors:
                raise SafetensorsError(f"{file}: tensor {name!r} of the index is not in it")
            if name in seen:
                raise SafetensorsError(f"tensor {name!r} is in both {seen[name]} and {file}")
            seen[name] = file
            plan.append((file, name) + tensors[name])
    out, ranges, into, owners = {}, [], [], []
    for file, name, dtype, shape, start, end in plan:
        buf = torch.empty(end - start, dtype=torch.uint8, device=device)
        out[name] = (buf, dtype, shape)
        if end > start:
            ranges.append((file, start, end - start))
            into.append(buf.numpy() if device.type == "cpu" else buf)
            owners.append((file, name))
    if ranges:
        try:
            counts = lfs.read_ranges(ranges, into=into, max_in_flight=max_in_flight)
        except OSError:
            counts = [_one(lfs, r, b, o) for r, b, o in zip(ranges, into, owners)]
        for (file, start, n), got, (_, name) in zip(ranges, counts, owners):
            if got != n:
                raise SafetensorsError(f"{file}: tensor {name!r}: {n - got} of its bytes are "
                                       "missing: the file is cut short")
    return {name: buf.view(dtype).reshape(shape) for name, (buf, dtype, shape) in out.items()}


def _one(lfs, rng, buf, owner):
    """One range again, alone, so that a failure names its tensor."""
    try:
        return lfs.read_ranges([rng], into=[buf])[0]
    except OSError as e:
        raise SafetensorsError(f"{owner[0]}: tensor {owner[1]!r} could not be read: {e}") from e


def save_file(tensors, path, metadata=None, fs=None):
    """Writes {name: tensor} (host or GPU tensors, any dtype of safetensors) to `path` in
    safetensors' format, atomically (a temporary name, fsync, rename)."""
    lfs, path = _open(path, fs)
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in metadata.items()):
        raise ValueError("metadata must map strings to strings")
    order = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    header, at = {}, 0
    for name, t in order:
        if t.dtype not in NAMES:
            raise ValueError(f"tensor {name!r}: safetensors has no dtype {t.dtype}")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + n]}
        at += n
    if metadata:
        header = {"__metadata__": dict(metadata), **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    def write(f):
        f.write(struct.pack("<Q", len(text)) + text)
        for _, t in order:
            t = t.detach().contiguous()
            if t.numel() == 0:
                continue
            flat = t.reshape(-1).view(torch.uint8)
            data = flat.numpy() if t.device.type == "cpu" else flat
            done = 0
            while done < len(flat):
                done += f.write(data[done:])

    _commit(lfs, path, write)
