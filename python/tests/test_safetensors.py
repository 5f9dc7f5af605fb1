"""safetensors on lode: files moving both ways with the safetensors package, sharded models
through their index, and every kind of damage refused with the tensor's name."""

import json
import struct

import pytest

torch = pytest.importorskip("torch")

import lode.safetensors as lst  # noqa: E402


def names_in(fs, path):
    return [n.rsplit("/", 1)[-1] for n in fs.ls(path)]


def tensors():
    g = torch.Generator().manual_seed(3)
    return {"embed.weight": torch.randn(300, 64, generator=g),
            "layers.0.norm": torch.randn(64, generator=g).to(torch.bfloat16),
            "layers.0.ids": torch.arange(17, dtype=torch.int64),
            "layers.0.mask": torch.tensor([True, False, True]),
            "layers.0.half": torch.randn(5, 5, generator=g).half(),
            "scalar": torch.tensor(2.5),
            "nothing": torch.empty(0, 3)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_round_trip_and_the_safetensors_package_agrees(lodefs, tmpdir_lode):
    st = pytest.importorskip("safetensors.torch")
    t = tensors()
    path = f"{tmpdir_lode}/model.safetensors"
    lst.save_file(t, path, metadata={"format": "pt"}, fs=lodefs)
    same(t, lst.load_file(path, fs=lodefs))
    # Ours read by the package, the package's read by ours.
    same(t, st.load(lodefs.read_bytes(path)))
    lodefs.write_bytes(f"{tmpdir_lode}/theirs.safetensors", st.save(t, metadata={"a": "b"}))
    same(t, lst.load_file(f"lode://{lodefs.address}{tmpdir_lode}/theirs.safetensors"))
    assert not [n for n in names_in(lodefs, tmpdir_lode) if n.startswith(".")]


def test_a_sharded_model_loads_through_its_index(lodefs, tmpdir_lode):
    t = tensors()
    names = sorted(t)
    parts = {"model-00001-of-00002.safetensors": names[:3],
             "model-00002-of-00002.safetensors": names[3:]}
    lodefs.mkdir(f"{tmpdir_lode}/m")
    for file, ns in parts.items():
        lst.save_file({n: t[n] for n in ns}, f"{tmpdir_lode}/m/{file}", fs=lodefs)
    index = {"metadata": {}, "weight_map": {n: f for f, ns in parts.items() for n in ns}}
    lodefs.write_bytes(f"{tmpdir_lode}/m/model.safetensors.index.json", json.dumps(index).encode())
    same(t, lst.load_file(f"{tmpdir_lode}/m", fs=lodefs))
    same(t, lst.load_file(f"{tmpdir_lode}/m/model.safetensors.index.json", fs=lodefs))
    # The index names a tensor its shard does not hold.
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    lodefs.write_bytes(f"{tmpdir_lode}/m/model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(lst.SafetensorsError, match="'ghost'"):
        lst.load_file(f"{tmpdir_lode}/m", fs=lodefs)
    index["weight_map"] = {"x": "../elsewhere.safetensors"}
    lodefs.write_bytes(f"{tmpdir_lode}/m/model.safetensors.index.json", json.dumps(index).encode())
    with pytest.raises(lst.SafetensorsError, match="outside"):
        lst.load_file(f"{tmpdir_lode}/m", fs=lodefs)


def file_of(header, data):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("header,data,match", [
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(24), "overlap"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8),
     "'a'.*cut short"),
    ({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, bytes(16),
     "'a': 16 bytes for shape"),
    ({"a": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 4]}}, bytes(4), "'a'.*dtype"),
    ({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), "'a'.*shape"),
    ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 0]}}, bytes(4), "'a'.*offsets"),
    ({"a": {"dtype": "U8", "shape": [4]}}, bytes(4), "'a'.*malformed"),
])
def test_a_bad_header_is_refused_naming_the_tensor(lodefs, tmpdir_lode, header, data, match):
    path = f"{tmpdir_lode}/bad.safetensors"
    lodefs.write_bytes(path, file_of(header, data))
    with pytest.raises(lst.SafetensorsError, match=match):
        lst.load_file(path, fs=lodefs)


def test_a_file_that_is_not_one_or_is_cut_short_is_refused(lodefs, tmpdir_lode):
    path = f"{tmpdir_lode}/x.safetensors"
    for raw, match in ((b"abc", "too short"), (struct.pack("<Q", 1 << 40), "header of"),
                       (struct.pack("<Q", 3) + b"{{{", "not JSON"),
                       (struct.pack("<Q", 2) + b"[]", "not a JSON object")):
        lodefs.write_bytes(path, raw)
        with pytest.raises(lst.SafetensorsError, match=match):
            lst.load_file(path, fs=lodefs)
    text = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    lodefs.write_bytes(path, struct.pack("<Q", len(text)) + text + b"x")
    with pytest.raises(lst.SafetensorsError, match="'a' twice"):
        lst.load_file(path, fs=lodefs)
    # A whole file cut short after it was written: the tensors past the cut are named.
    lst.save_file(tensors(), path, fs=lodefs)
    size = lodefs.stat(path)["size"]
    with lodefs.open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(lst.SafetensorsError, match="cut short"):
        lst.load_file(path, fs=lodefs)
