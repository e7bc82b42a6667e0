"""Tests for ``energon_nemotron.tensors.packed``: ragged per-item tensors for media batches."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from energon_nemotron import tensors
from energon_nemotron.tensors import PackedTensor, dtype_from_name, dtype_name

FEATURE_SHAPES = [(), (3,), (2, 3)]
WIRE_DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.bool, torch.uint8]


def make_item(n: int, feature_shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A deterministic ``[n, *feature_shape]`` tensor of ``dtype`` with varied values."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, *feature_shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, generator=g, dtype=dtype)


@st.composite
def ragged(draw, dtypes=(torch.float32,)):
    """(items, feature_shape, dtype) with N in 0..6 items of n_i in 0..5 rows."""
    feature_shape = draw(st.sampled_from(FEATURE_SHAPES))
    dtype = draw(st.sampled_from(list(dtypes)))
    lengths = draw(st.lists(st.integers(0, 5), min_size=0, max_size=6))
    seed = draw(st.integers(0, 2**16))
    items = [make_item(n, feature_shape, dtype, seed + k) for k, n in enumerate(lengths)]
    return items, feature_shape, dtype


def pack(items, feature_shape, dtype) -> PackedTensor:
    return PackedTensor.from_list(items, feature_shape=feature_shape, dtype=dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors (shape, dtype and raw bytes)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


# ---------------------------------------------------------------- construction and access


@settings(max_examples=60, deadline=None)
@given(ragged(dtypes=WIRE_DTYPES))
def test_from_list_round_trip(case):
    items, feature_shape, dtype = case
    pt = pack(items, feature_shape, dtype)
    assert len(pt) == len(items)
    assert pt.feature_shape == feature_shape and pt.dtype == dtype
    assert pt.offsets.dtype == torch.int64 and pt.offsets.shape == (len(items) + 1,)
    assert pt.lengths().dtype == torch.int64
    assert pt.lengths().tolist() == [t.shape[0] for t in items]
    expected = torch.cat(items) if items else torch.empty((0, *feature_shape), dtype=dtype)
    assert same_bits(pt.as_tensor(), expected)
    for k, item in enumerate(items):
        assert same_bits(pt[k], item)
        assert same_bits(pt[k - len(items)], item)
    assert [t.shape for t in pt] == [t.shape for t in items]


def test_getitem_is_a_view_and_checks_range():
    pt = PackedTensor.from_list([torch.zeros(2, 3), torch.zeros(1, 3)])
    pt[1][0, 0] = 7.0
    assert pt.as_tensor()[2, 0] == 7.0
    assert pt[-1].shape == (1, 3) and pt[-2].shape == (2, 3)
    with pytest.raises(IndexError):
        pt[2]
    with pytest.raises(IndexError):
        pt[-3]
    assert pt[torch.tensor(0)].shape == (2, 3)


def test_empty_constructors():
    for pt in (PackedTensor.empty((2, 3), torch.bfloat16),
               PackedTensor.from_list([], feature_shape=(2, 3), dtype=torch.bfloat16)):
        assert len(pt) == 0 and pt.feature_shape == (2, 3) and pt.dtype == torch.bfloat16
        assert pt.offsets.tolist() == [0] and pt.lengths().tolist() == []
        assert pt.as_tensor().shape == (0, 2, 3)
        assert list(pt) == []
    with pytest.raises(ValueError, match="feature_shape and dtype"):
        PackedTensor.from_list([], dtype=torch.float32)
    with pytest.raises(ValueError, match="feature_shape and dtype"):
        PackedTensor.from_list([], feature_shape=(3,))


def test_items_with_zero_rows():
    pt = PackedTensor.from_list([torch.zeros(0, 4), torch.ones(0, 4)])
    assert len(pt) == 2 and pt.offsets.tolist() == [0, 0, 0] and pt[1].shape == (0, 4)


# ---------------------------------------------------------------- slice / concat


@settings(max_examples=60, deadline=None)
@given(ragged(), st.data())
def test_concat_of_slices_is_original(case, data):
    items, feature_shape, dtype = case
    pt = pack(items, feature_shape, dtype)
    n = len(pt)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    bounds = [0, *cuts, n]
    parts = [pt.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    for (a, b), part in zip(zip(bounds[:-1], bounds[1:]), parts):
        assert len(part) == b - a
        assert part.offsets[0].item() == 0 and part.offsets[-1].item() == part.as_tensor().shape[0]
        for k in range(b - a):
            assert torch.equal(part[k], items[a + k])
    joined = tensors.concat(parts)
    assert joined.equal(pt)
    assert [t.shape for t in joined] == [t.shape for t in items]
    assert all(torch.equal(x, y) for x, y in zip(joined, items))


def test_slice_shares_data_and_handles_edges():
    pt = PackedTensor.from_list([torch.arange(2.0), torch.arange(3.0), torch.arange(1.0)])
    mid = pt.slice(1, 3)
    assert mid.offsets.tolist() == [0, 3, 4]
    assert mid.as_tensor().data_ptr() == pt[1].data_ptr()  # a view, not a copy
    assert pt.slice(-2, 3).equal(mid)
    empty = pt.slice(2, 2)
    assert len(empty) == 0 and empty.as_tensor().shape == (0,) and empty.offsets.tolist() == [0]
    assert pt.slice(0, 3).equal(pt)
    for i, j in [(2, 1), (0, 4), (-4, 1)]:
        with pytest.raises(IndexError):
            pt.slice(i, j)


def test_concat_empty_parts_and_errors():
    a = PackedTensor.from_list([torch.ones(2, 3)])
    e = PackedTensor.empty((3,), torch.float32)
    joined = tensors.concat([e, a, e, a, e])
    assert joined.offsets.tolist() == [0, 2, 4]
    assert tensors.concat([e, e]).equal(e)
    with pytest.raises(ValueError):
        tensors.concat([])
    with pytest.raises(ValueError, match="part 1"):
        tensors.concat([a, PackedTensor.from_list([torch.ones(2, 4)])])
    with pytest.raises(ValueError, match="part 1"):
        tensors.concat([a, a.to(dtype=torch.float64)])


# ---------------------------------------------------------------- to / pin_memory / equal / repr


def test_to_casts_only_floating_data():
    f = PackedTensor.from_list([torch.randn(2, 3), torch.randn(1, 3)])
    i = PackedTensor.from_list([torch.tensor([[1, 2]], dtype=torch.int32), torch.tensor([[3, 4], [5, 6]], dtype=torch.int32)])
    fb = f.to(dtype=torch.bfloat16)
    assert fb.dtype == torch.bfloat16 and fb.offsets.dtype == torch.int64
    assert torch.equal(fb.as_tensor(), f.as_tensor().to(torch.bfloat16))
    ib = i.to(dtype=torch.bfloat16)
    assert ib.dtype == torch.int32 and ib.offsets.dtype == torch.int64 and ib.equal(i)
    assert f.to(torch.bfloat16).equal(fb)  # dtype given positionally, like Tensor.to
    assert f.to("cpu").equal(f) and f.to(device=torch.device("cpu"), dtype=torch.float32).equal(f)
    assert f.dtype == torch.float32  # the original is untouched
    with pytest.raises(TypeError):
        f.to(dtype=torch.int64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pin_memory():
    pt = PackedTensor.from_list([torch.randn(2, 3), torch.randn(4, 3)])
    pinned = pt.pin_memory()
    assert pinned.as_tensor().is_pinned() and pinned.offsets.is_pinned() and pinned.equal(pt)
    on_gpu = pinned.to("cuda", non_blocking=True)
    assert on_gpu.offsets.device.type == "cuda" and on_gpu.offsets.dtype == torch.int64
    assert on_gpu.to("cpu").equal(pt)


def test_equal():
    a = PackedTensor.from_list([torch.ones(2, 3), torch.zeros(1, 3)])
    assert a.equal(PackedTensor.from_list([torch.ones(2, 3), torch.zeros(1, 3)]))
    assert not a.equal(PackedTensor.from_list([torch.ones(1, 3), torch.zeros(2, 3)]))  # same data, other offsets
    assert not a.equal(a.to(dtype=torch.float64))
    assert not a.equal(PackedTensor.from_list([torch.ones(2, 3), torch.ones(1, 3)]))
    assert not a.equal(a.as_tensor())


def test_repr_has_no_data():
    pt = PackedTensor.from_list([torch.full((2, 768), 12345.0), torch.full((3, 768), 12345.0)])
    text = repr(pt)
    assert "n=2" in text and "(768,)" in text and "float32" in text
    assert "12345" not in text and len(text) < 200


# ---------------------------------------------------------------- pickle and wire form


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
def test_pickle_round_trip(dtype):
    pt = PackedTensor.from_list([make_item(n, (2, 3), dtype, n) for n in (2, 0, 3)])
    back = pickle.loads(pickle.dumps(pt))
    assert isinstance(back, PackedTensor) and back.equal(pt) and same_bits(back.as_tensor(), pt.as_tensor())
    assert back.offsets.dtype == torch.int64
    # A slice (a view into a larger storage) pickles too.
    assert pickle.loads(pickle.dumps(pt.slice(1, 3))).equal(pt.slice(1, 3))


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@pytest.mark.parametrize("feature_shape", FEATURE_SHAPES)
def test_wire_round_trip_bit_identical(dtype, feature_shape):
    items = [make_item(n, feature_shape, dtype, 10 + n) for n in (3, 0, 5, 1)]
    pt = PackedTensor.from_list(items)
    header, buffer = pt.wire_header(), pt.wire_buffer()
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1 and buffer.is_contiguous()
    assert buffer.numel() == pt.as_tensor().numel() * pt.as_tensor().element_size()
    assert buffer.data_ptr() == pt.as_tensor().data_ptr()  # zero-copy for contiguous data
    text = json.dumps(header)
    assert json.loads(text) == {"dtype": dtype_name(dtype), "feature_shape": list(feature_shape),
                                "offsets": [0, 3, 3, 8, 9]}
    assert len(text) < 200  # offsets and shape only, no data
    back = tensors.from_wire(json.loads(text), buffer.clone())
    assert back.dtype == dtype and back.feature_shape == feature_shape
    assert same_bits(back.as_tensor(), pt.as_tensor())
    assert back.offsets.tolist() == pt.offsets.tolist() and back.offsets.dtype == torch.int64
    for k, item in enumerate(items):
        assert same_bits(back[k], item)


def test_wire_bfloat16_special_values_bit_identical():
    raw = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0e38])
    pt = PackedTensor.from_list([raw.to(torch.bfloat16).reshape(-1, 1)])
    back = tensors.from_wire(pt.wire_header(), pt.wire_buffer().clone())
    assert same_bits(back.as_tensor(), pt.as_tensor())


def test_wire_of_slice_and_empty():
    pt = PackedTensor.from_list([make_item(n, (3,), torch.float32, n) for n in (2, 4, 1)])
    part = pt.slice(1, 3)
    assert tensors.from_wire(part.wire_header(), part.wire_buffer().clone()).equal(part)
    e = PackedTensor.empty((2, 3), torch.int64)
    assert e.wire_buffer().numel() == 0
    assert tensors.from_wire(e.wire_header(), e.wire_buffer()).equal(e)


def test_from_wire_misaligned_buffer_still_works():
    pt = PackedTensor.from_list([torch.arange(6, dtype=torch.int64).reshape(3, 2)])
    big = torch.zeros(pt.wire_buffer().numel() + 1, dtype=torch.uint8)
    big[1:] = pt.wire_buffer()
    assert tensors.from_wire(pt.wire_header(), big[1:]).equal(pt)


def test_from_wire_rejects_bad_input():
    pt = PackedTensor.from_list([torch.randn(2, 3), torch.randn(1, 3)])
    header, buffer = pt.wire_header(), pt.wire_buffer()
    with pytest.raises(ValueError, match="bytes"):
        tensors.from_wire(header, buffer[:-4])
    with pytest.raises(ValueError, match="bytes"):
        tensors.from_wire(header, torch.cat([buffer, torch.zeros(4, dtype=torch.uint8)]))
    with pytest.raises(ValueError, match="bytes"):
        tensors.from_wire({**header, "dtype": "float64"}, buffer)
    with pytest.raises(ValueError):
        tensors.from_wire(header, buffer.view(torch.float32))  # not uint8
    with pytest.raises(ValueError, match="unknown torch dtype"):
        tensors.from_wire({**header, "dtype": "float33"}, buffer)
    with pytest.raises(ValueError, match="malformed"):
        tensors.from_wire({"dtype": "float32", "offsets": [0, 3]}, buffer)
    with pytest.raises(ValueError, match="non-decreasing"):
        tensors.from_wire({**header, "offsets": [0, 2, 1, 3]}, buffer)


# ---------------------------------------------------------------- validation errors


def test_mismatched_trailing_shape_names_item():
    items = [torch.zeros(2, 3), torch.zeros(1, 3), torch.zeros(4, 5)]
    with pytest.raises(ValueError, match=r"item 2 .*\(4, 5\).*\(3,\)") as err:
        PackedTensor.from_list(items)
    assert "(5,)" in str(err.value)
    with pytest.raises(ValueError, match="item 1 has dtype"):
        PackedTensor.from_list([torch.zeros(2, 3), torch.zeros(1, 3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="item 0"):
        PackedTensor.from_list([torch.tensor(1.0)])  # 0-dim item has no row count
    with pytest.raises(ValueError, match="expected"):
        PackedTensor.from_list([torch.zeros(2, 3)], feature_shape=(4,))
    with pytest.raises(ValueError, match="expected"):
        PackedTensor.from_list([torch.zeros(2, 3)], dtype=torch.float16)


@pytest.mark.parametrize(
    "offsets",
    [
        torch.tensor([0, 2, 5], dtype=torch.int32),  # wrong dtype
        torch.tensor([[0, 2, 5]]),  # not 1-D
        torch.tensor([], dtype=torch.int64),  # no leading 0
        torch.tensor([1, 2, 5]),  # does not start at 0
        torch.tensor([0, 3, 2, 5]),  # decreasing
        torch.tensor([0, 2, 4]),  # does not end at data.shape[0]
        torch.tensor([0, 2, 6]),
    ],
)
def test_bad_offsets_rejected(offsets):
    with pytest.raises(ValueError):
        PackedTensor(torch.zeros(5, 3), offsets)


def test_constructor_accepts_valid_offsets_and_rejects_scalar_data():
    pt = PackedTensor(torch.zeros(5, 3), torch.tensor([0, 2, 2, 5]))
    assert pt.lengths().tolist() == [2, 0, 3]
    with pytest.raises(ValueError):
        PackedTensor(torch.tensor(1.0), torch.tensor([0]))


def test_dtype_names_round_trip():
    for dtype in [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.complex64]:
        assert dtype_from_name(dtype_name(dtype)) is dtype
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.bool) == "bool"
    for bad in ["float33", "Tensor", "", "torch.float32", "nn"]:
        with pytest.raises(ValueError):
            dtype_from_name(bad)
    with pytest.raises(TypeError):
        dtype_name("float32")


# ---------------------------------------------------------------- deduplicated store (from_keyed)


@st.composite
def keyed(draw, dtypes=(torch.float32,)):
    """(items as segment lists, keys, plain equivalent items, feature_shape, dtype): up to 5 distinct
    sources of 0..4 rows; each of up to 6 items references 0..3 of them (repeats likely)."""
    feature_shape = draw(st.sampled_from(FEATURE_SHAPES))
    dtype = draw(st.sampled_from(list(dtypes)))
    lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5))
    seed = draw(st.integers(0, 2**16))
    sources = [make_item(n, feature_shape, dtype, seed + k) for k, n in enumerate(lengths)]
    refs = draw(st.lists(st.lists(st.integers(0, len(sources) - 1), max_size=3), max_size=6))
    items = [[sources[r] for r in item] for item in refs]
    keys = [[f"src{r}" for r in item] for item in refs]
    plain = [torch.cat(i) if i else torch.empty((0, *feature_shape), dtype=dtype) for i in items]
    return items, keys, plain, feature_shape, dtype


def keyed_pair(case):
    items, keys, plain, feature_shape, dtype = case
    return (tensors.from_keyed(items, keys, feature_shape=feature_shape, dtype=dtype),
            pack(plain, feature_shape, dtype))


@settings(max_examples=80, deadline=None)
@given(keyed(dtypes=WIRE_DTYPES), st.data())
def test_dedup_and_plain_agree_through_the_logical_api(case, data):
    dd, pt = keyed_pair(case)
    assert dd.is_deduplicated and not pt.is_deduplicated and isinstance(dd, PackedTensor)
    assert len(dd) == len(pt) and dd.feature_shape == pt.feature_shape and dd.dtype == pt.dtype
    assert dd.device == pt.device and torch.equal(dd.offsets, pt.offsets) and dd.offsets.dtype == torch.int64
    assert torch.equal(dd.lengths(), pt.lengths())
    assert same_bits(dd.as_tensor(), pt.as_tensor()) and same_bits(dd.data, pt.data)
    for k in range(len(pt)):
        assert same_bits(dd[k], pt[k]) and same_bits(dd[k - len(pt)], pt[k])
    assert all(same_bits(a, b) for a, b in zip(dd, pt)) and len(list(dd)) == len(pt)
    assert dd.equal(pt) and pt.equal(dd) and dd.equal(dd)
    # physical <= logical; distinct keys stored once
    assert dd.logical_nbytes == pt.physical_nbytes == pt.logical_nbytes
    distinct = {k: t for item_keys, item in zip(case[1], case[0]) for k, t in zip(item_keys, item)}
    assert dd.physical_nbytes == sum(t.numel() * t.element_size() for t in distinct.values())
    # slices, and concat of slices (dedup kept across parts: stored at most once per key)
    n = len(pt)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    bounds = [0, *cuts, n]
    parts = [dd.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    for (a, b), part in zip(zip(bounds[:-1], bounds[1:]), parts):
        assert part.is_deduplicated and part.equal(pt.slice(a, b))
    joined = tensors.concat(parts)
    assert joined.is_deduplicated and joined.equal(pt) and joined.physical_nbytes == dd.physical_nbytes
    mixed = tensors.concat([dd, pt, dd])
    assert mixed.equal(tensors.concat([pt, pt, pt]))
    assert mixed.physical_nbytes == dd.physical_nbytes + pt.physical_nbytes  # the second dd is shared
    # pickle and wire: the same items and the same segment table
    for back in (pickle.loads(pickle.dumps(dd)),
                 tensors.from_wire(json.loads(json.dumps(dd.wire_header())), dd.wire_buffer().clone())):
        assert back.is_deduplicated and back.same_structure(dd) and back.equal(pt) and back.keys == dd.keys
    assert dd.wire_buffer().numel() == dd.physical_nbytes


def test_dedup_to_equal_and_cast():
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    dd = tensors.from_keyed([a, [b, a], a], ["a", ["b", "a"], "a"])
    pt = PackedTensor.from_list([a, torch.cat([b, a]), a])
    half = dd.to(torch.bfloat16)
    assert half.is_deduplicated and half.dtype == torch.bfloat16 and half.equal(pt.to(torch.bfloat16))
    assert half.same_structure(dd) and dd.dtype == torch.float32              # the original is untouched
    assert dd.to("cpu").equal(pt) and dd.to(device="cpu", dtype=torch.float32).same_structure(dd)
    ints = tensors.from_keyed([torch.ones(2, 2, dtype=torch.int32)] * 2, ["x", "x"])
    assert ints.to(dtype=torch.bfloat16).dtype == torch.int32
    with pytest.raises(TypeError):
        dd.to(dtype=torch.int64)
    assert not dd.equal(PackedTensor.from_list([a, torch.cat([a, b]), a]))    # same rows, other order
    assert not dd.equal(PackedTensor.from_list([a, torch.cat([b, a]), a + 1]))  # same offsets, other rows
    assert not dd.equal(pt.to(dtype=torch.float64)) and not dd.equal(pt.as_tensor())
    text = repr(dd)
    assert "segments=2" in text and "stored_rows=5" in text and "rows=11" in text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_dedup_pin_memory_and_device():
    a = torch.randn(3, 4)
    dd = tensors.from_keyed([a, a], ["a", "a"])
    pinned = dd.pin_memory()
    assert pinned.store.is_pinned() and pinned.offsets.is_pinned() and pinned.equal(dd)
    on_gpu = pinned.to("cuda", non_blocking=True)
    assert on_gpu.store.device.type == "cuda" and on_gpu.offsets.device.type == "cuda"
    assert on_gpu[1].device.type == "cuda" and on_gpu.to("cpu").equal(dd)


def test_dedup_materializes_lazily_and_shares_the_store():
    a, b, f = torch.randn(3, 4), torch.randn(2, 4), torch.randn(2, 4)
    unique = tensors.from_keyed([a, [b, f]], ["a", ["b", "f"]])
    assert unique._logical is None and unique.data.data_ptr() == unique.store.data_ptr()  # nothing shared: no copy
    assert unique.data.shape == unique.store.shape
    dd = tensors.from_keyed([a, [b, f, f], a], ["a", ["b", "f", "f"], "a"])
    assert dd.store.shape[0] == 7 and dd.offsets.tolist() == [0, 3, 9, 12]
    assert dd[2].data_ptr() == dd.store.data_ptr() and dd._logical is None    # one segment: a view
    assert dd[1].untyped_storage().data_ptr() != dd.store.untyped_storage().data_ptr()  # [b, f, f]: a copy
    data = dd.data
    assert data is dd.as_tensor() and data.shape == (12, 4)                    # built once, cached
    state = dd.__getstate__()
    assert "_logical" not in state and set(state) == {"store", "segment_offsets", "item_ptr", "segment_ids",
                                                      "keys", "offsets"}
    assert len(pickle.dumps(dd)) < dd.physical_nbytes + 2000 < dd.logical_nbytes + 2000
    assert pickle.loads(pickle.dumps(dd))._logical is None
    # a plain PackedTensor is what it was: data a plain attribute, no store
    pt = PackedTensor.from_list([a, b])
    assert type(pt) is PackedTensor and "data" in vars(pt) and pt.physical_nbytes == pt.logical_nbytes == 80


def test_dedup_shared_memory_and_empty():
    a = torch.randn(3, 4)
    dd = tensors.from_keyed([a, a, [a, a]], ["a", "a", ["a", "a"]], shared=True)
    assert dd.store.is_shared() and dd.store.shape == (3, 4) and dd.logical_nbytes == 4 * dd.physical_nbytes
    e = tensors.from_keyed([], [], feature_shape=(2, 3), dtype=torch.bfloat16)
    assert e.is_deduplicated and len(e) == 0 and e.as_tensor().shape == (0, 2, 3) and e.offsets.tolist() == [0]
    assert tensors.from_wire(e.wire_header(), e.wire_buffer()).equal(e)
    z = tensors.from_keyed([[], torch.zeros(0, 4)], [[], None])             # items with no rows
    assert z.offsets.tolist() == [0, 0, 0] and z[0].shape == (0, 4) and z.slice(1, 2).equal(z.slice(0, 1))


def test_dedup_errors():
    a = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"key 'a': item 1 segment 0 .*\(2, 4\).*\(3, 4\)"):
        tensors.from_keyed([a, torch.randn(2, 4)], ["a", "a"])
    with pytest.raises(ValueError, match="key 'a'.*float64"):
        tensors.from_keyed([a, a.double()], ["a", "a"])
    with pytest.raises(ValueError, match="item 1 segment 0 .*feature shape"):
        tensors.from_keyed([a, torch.randn(2, 5)], ["a", "b"])
    with pytest.raises(ValueError, match="item 1 segment 0 .*float64"):
        tensors.from_keyed([a, a.double()], ["a", "b"])
    with pytest.raises(ValueError, match="2 items but 1 keys"):
        tensors.from_keyed([a, a], ["a"])
    with pytest.raises(ValueError, match="item 0 has 2 segments but 1 keys"):
        tensors.from_keyed([[a, a]], [["a"]])
    with pytest.raises(ValueError, match="feature_shape and dtype"):
        tensors.from_keyed([], [])
    with pytest.raises(ValueError, match="expected"):
        tensors.from_keyed([a], ["a"], feature_shape=(5,))
    with pytest.raises(TypeError):
        tensors.from_keyed([a, a], [["un", "hashable"], "b"])
    # concat: the same key in two parts with other shapes
    with pytest.raises(ValueError, match="key 'a'"):
        tensors.concat([tensors.from_keyed([a], ["a"]), tensors.from_keyed([a[:1]], ["a"])])
    with pytest.raises(ValueError, match="part 1"):
        tensors.concat([tensors.from_keyed([a], ["a"]), PackedTensor.from_list([torch.ones(1, 5)])])
    # the checked constructor
    from energon_nemotron.tensors import DedupPackedTensor

    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    DedupPackedTensor(torch.zeros(5, 2), t([0, 2, 5]), t([0, 1, 3]), t([1, 0, 1]), ["x", "y"])
    for args, match in [((t([0, 2, 4]), t([0, 1]), t([0])), "store rows"),
                        ((t([0, 3, 2, 5]), t([0, 1]), t([0])), "non-decreasing"),
                        ((t([0, 2, 5]), t([0, 2]), t([0])), "segment references"),
                        ((t([0, 2, 5]), t([0, 1]), t([2])), r"\[0, 2\)"),
                        ((t([0, 2, 5]), t([1, 1]), t([0])), "start with 0")]:
        with pytest.raises(ValueError, match=match):
            DedupPackedTensor(torch.zeros(5, 2), *args)
    with pytest.raises(ValueError, match="distinct"):
        DedupPackedTensor(torch.zeros(5, 2), t([0, 2, 5]), t([0, 1]), t([0]), ["x", "x"])
    with pytest.raises(ValueError, match="1 keys for 2 segments"):
        DedupPackedTensor(torch.zeros(5, 2), t([0, 2, 5]), t([0, 1]), t([0]), ["x"])


def test_dedup_from_wire_rejects_bad_input():
    a = torch.randn(3, 4)
    dd = tensors.from_keyed([a, [a, a]], ["a", ["a", "a"]])
    header, buffer = dd.wire_header(), dd.wire_buffer()
    assert buffer.numel() == 48 and header["offsets"] == [0, 3, 9] and header["dedup"]["segment_ids"] == [0, 0, 0]
    with pytest.raises(ValueError, match="bytes"):
        tensors.from_wire(header, buffer[:-4])
    with pytest.raises(ValueError, match="disagree"):
        tensors.from_wire({**header, "offsets": [0, 6, 9]}, buffer)
    with pytest.raises(ValueError, match="malformed"):
        tensors.from_wire({**header, "dedup": {"item_ptr": [0, 1]}}, buffer)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        tensors.from_wire({**header, "dedup": {**header["dedup"], "segment_ids": [0, 1, 0]}}, buffer)
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), buffer])[1:]   # misaligned: copied
    assert tensors.from_wire(header, shifted).equal(dd)
    # non-str keys travel as stable digests (receivers can still re-intern by them)
    tup = tensors.from_keyed([a, a], [("img", b"\x01"), ("img", b"\x01")])
    keys = tup.wire_header()["dedup"]["keys"]
    assert len(keys) == 1 and keys[0].startswith("#") and keys == tup.wire_header()["dedup"]["keys"]
