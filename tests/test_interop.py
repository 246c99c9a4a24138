"""Reading foreign arrays: CUDA Array Interface dicts and DLPack capsules (CPU parts)."""

import ctypes
import gc
import re
import struct
import sys

import numpy as np
import pytest
from _stand_ins import ImportingSession
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro import dtypes
from tenferro.interop import dlpack, read_cai
from tenferro.spans import c_strides


def test_cai_v3_fields(cai):
    f = read_cai(cai(0x7000, (4, 6), "<f4", strides=(4, 16), readonly=True, stream=2), "op")
    assert (f.ptr, f.shape, f.strides, f.scalar_type.name, f.readonly, f.stream) == \
        (0x7000, (4, 6), (4, 16), "f32", True, 2)
    g = read_cai(cai(0x8000, (3, 5), "<i2", version=2, stream=77), "op")
    assert g.strides == (10, 2) and g.stream is None  # v2 has no stream to order after


@pytest.mark.parametrize(("kw", "msg"), [
    ({"mask": object()}, r"has a mask"),
    ({"stream": 0}, r"stream=0 is ambiguous"),
    ({"stream": -1}, r"stream=-1 is not a stream handle"),
    ({"stream": "s"}, r"stream='s' must be None, an int"),
    ({"version": 1}, r"version=1 is not supported"),
    ({"strides": (8,)}, r"strides=\(8,\) do not match shape=\(2, 2\)"),
])
def test_cai_refusals(cai, kw, msg):
    with pytest.raises(tf.ValidationError, match=r"session\.tensor: __cuda_array_interface__ "
                                                 + msg):
        read_cai(cai(0x7000, (2, 2), "<f8", **kw), "session.tensor")


def test_cai_bad_typestr_and_shape(cai):
    with pytest.raises(tf.ValidationError, match=r"op: __cuda_array_interface__ typestr='zz'"):
        read_cai(cai(0x7000, (2,), "zz"), "op")
    with pytest.raises(tf.ValidationError, match=r"op: dtype object is not supported"):
        read_cai(cai(0x7000, (2,), "|O"), "op")
    with pytest.raises(tf.ValidationError, match=r"shape=\(2, -1\) has a negative extent"):
        read_cai(cai(0x7000, (2, -1), "<f8"), "op")


def _capsule_name_is(capsule, name):
    f = ctypes.pythonapi.PyCapsule_IsValid
    f.restype, f.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_char_p)
    return bool(f(capsule, name))


@pytest.mark.parametrize("versioned", [True, False])
def test_host_capsule_is_refused_renamed_and_released_once(versioned):
    a = np.arange(10.0)
    base = sys.getrefcount(a)
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    assert sys.getrefcount(a) > base  # the capsule holds the array
    with pytest.raises(tf.ValidationError, match=r"op: x is in host \(kDLCPU\) memory"):
        dlpack.read_capsule(cap, "op")
    used = b"used_dltensor_versioned" if versioned else b"used_dltensor"
    assert _capsule_name_is(cap, used)
    with pytest.raises(tf.ValidationError, match=r"op: not an unused DLPack capsule"):
        dlpack.read_capsule(cap, "op")
    del cap
    gc.collect()
    assert sys.getrefcount(a) == base  # the deleter ran exactly once (twice would go below)


def test_read_dlpack_refuses_host_before_asking_for_a_capsule():
    with pytest.raises(tf.ValidationError, match=r"op: x is on DLPack device_type 1"):
        dlpack.read_dlpack(np.arange(3.0), 1, 0, "op")


@pytest.mark.gpu
def test_torch_tensors_zero_copy_on_a_torch_stream(session, rng):
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    a = rng.standard_normal((64, 48))
    with torch.cuda.stream(stream):
        t = torch.from_numpy(a).cuda() * 2.0  # produced on torch's non-default stream
        ref = session.tensor(t)  # ordered after torch's stream through __dlpack__(stream=)
        assert ref.ptr == t.data_ptr() and ref.shape == (64, 48) and ref.dtype == np.float64
        np.testing.assert_array_equal(session.download(ref), 2.0 * a)
        mut = session.tensor_mut(t)
        session.copy(mut, session.upload(a))  # a write through tenferro ...
        session.synchronize()
        np.testing.assert_array_equal(t.cpu().numpy(), a)  # ... is seen by torch
        tt = t.t()
        with pytest.raises(tf.ValidationError, match=r"session\.tensor: x has non-compact"):
            session.tensor(tt)
        np.testing.assert_array_equal(session.download(session.tensor(tt, allow_strided=True)),
                                      a.T)
        half = torch.ones(8, dtype=torch.bfloat16, device="cuda")
        assert session.tensor(half).scalar_type.name == "bf16"


class _Refuses:
    """A producer whose DLPack export refuses, as torch does for a tensor that requires grad."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, max_version=None):
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")


class _BadDevice:
    def __dlpack_device__(self):
        return ("cuda",)

    def __dlpack__(self, stream=None, max_version=None):  # pragma: no cover - never asked
        raise AssertionError("asked for a capsule after a bad __dlpack_device__")


def test_a_producer_refusing_dlpack_is_named():
    with pytest.raises(tf.ValidationError, match=r"session\.tensor: x\.__dlpack__\(\) of _Refuses "
                                                 r"refused to export: BufferError: Can't export"):
        dlpack.read_dlpack(_Refuses(), 1, 0, "session.tensor")
    with pytest.raises(tf.ValidationError, match=r"session\.tensor: x\.__dlpack_device__\(\) of "
                                                 r"_BadDevice failed: ValueError"):
        dlpack.read_dlpack(_BadDevice(), 1, 0, "session.tensor")


# --- crafted DLPack capsules and CAI dicts: a right record or a clear refusal, never a crash ----

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_NAMES = {True: ctypes.c_char_p(b"dltensor_versioned"), False: ctypes.c_char_p(b"dltensor")}
_DL_KNOWN = {(k.dl_code, k.dl_bits): k for k in dtypes.SCALAR_TYPES}


@st.composite
def dltensors(draw):
    ndim = draw(st.integers(0, 6))
    code, bits = draw(st.one_of(st.sampled_from(sorted(_DL_KNOWN)),
                                st.tuples(st.sampled_from([0, 1, 2, 4, 5, 6, 200]),
                                          st.sampled_from([1, 8, 16, 32, 64, 128, 12]))))
    return {
        "versioned": draw(st.booleans()),
        "major": draw(st.sampled_from([1, 1, 1, 1, 0, 2])),
        "flags": draw(st.integers(0, 3)),
        "data": draw(st.sampled_from([0x7000_0000, 0x7F00_0000_0000, 0x7000_0000, 0])),
        "device_type": draw(st.sampled_from([2, 2, 2, 13, 1, 3, 7])),
        "device_id": draw(st.integers(-1, 5)),
        "ndim": ndim,
        "code": code,
        "bits": bits,
        "lanes": draw(st.sampled_from([1, 1, 1, 1, 2, 0])),
        "shape": draw(st.lists(st.integers(-1, 12), min_size=ndim, max_size=ndim)),
        "strides": draw(st.one_of(st.none(), st.lists(st.integers(-(1 << 40), 1 << 40),
                                                      min_size=ndim, max_size=ndim))),
        "offset": draw(st.sampled_from([0, 8, 12, 1 << 20])),
    }


def _craft(d):
    """A capsule over exactly the fields of ``d`` (and the buffer that holds them)."""
    ndim = d["ndim"]
    head = dlpack._VERSIONED_HEAD.size if d["versioned"] else 0
    tail = 0 if d["versioned"] else dlpack._LEGACY_TAIL.size
    size = head + dlpack._TENSOR.size + tail
    buf = ctypes.create_string_buffer(size + 16 * max(ndim, 1))
    base = ctypes.addressof(buf)
    shape_p, strides_p = base + size, base + size + 8 * ndim
    if ndim:
        struct.pack_into(f"<{ndim}q", buf, size, *d["shape"])
    if d["strides"] is not None and ndim:
        struct.pack_into(f"<{ndim}q", buf, size + 8 * ndim, *d["strides"])
    dlpack._TENSOR.pack_into(buf, head, d["data"], d["device_type"], d["device_id"], ndim,
                             d["code"], d["bits"], d["lanes"], shape_p if ndim else 0,
                             strides_p if d["strides"] is not None and ndim else 0, d["offset"])
    deleter = d.get("deleter", 0)
    if d["versioned"]:
        dlpack._VERSIONED_HEAD.pack_into(buf, 0, d["major"], 0, 0, deleter, d["flags"])
    else:
        dlpack._LEGACY_TAIL.pack_into(buf, dlpack._TENSOR.size, 0, deleter)
    return buf, _capsule_new(base, _NAMES[d["versioned"]], None)


@settings(max_examples=400, deadline=None)
@given(dltensors())
def test_crafted_dltensors_read_right_or_refused(d):
    _buf, cap = _craft(d)  # the buffer lives as long as the capsule is read
    try:
        f = dlpack.read_capsule(cap, "op")
    except tf.ValidationError as exc:
        assert str(exc).startswith("op: ")
        return
    finally:
        del cap
    # Accepted: every field is what the structure says, and only what a right one can say.
    t = _DL_KNOWN[(d["code"], d["bits"])]
    assert d["lanes"] == 1 and d["device_type"] in (2, 13) and d["device_id"] >= 0
    assert not d["versioned"] or d["major"] == 1
    assert all(n >= 0 for n in d["shape"])
    assert f.shape == tuple(d["shape"]) and f.scalar_type is t and f.device == d["device_id"]
    assert f.ptr == d["data"] + d["offset"]
    assert d["data"] or 0 in f.shape
    if d["strides"] is None or not d["ndim"]:
        assert f.strides == c_strides(f.shape, t.itemsize)
    else:
        assert f.strides == tuple(e * t.itemsize for e in d["strides"])  # signed, in bytes
    assert f.readonly == (d["versioned"] and bool(d["flags"] & 1))


@st.composite
def cai_dicts(draw):
    ndim = draw(st.integers(0, 4))
    shape = draw(st.one_of(st.lists(st.integers(-1, 7), min_size=ndim, max_size=ndim).map(tuple),
                           st.sampled_from([None, [2, 3], (2.0,), "4"])))
    return {
        "shape": shape,
        "typestr": draw(st.sampled_from(["<f4", "<f8", "|u1", "<i8", ">f4", "<c8", "|b1",
                                         "zz", "|O", 5])),
        "data": draw(st.sampled_from([(0x7000, False), (0x7000, True), (0, False), None,
                                      [0x7000, False], ("0x7000", False)])),
        "strides": draw(st.one_of(st.none(), st.lists(st.integers(-64, 64), min_size=ndim,
                                                      max_size=ndim).map(tuple),
                                  st.just((8,) * (ndim + 1)))),
        "version": draw(st.sampled_from([3, 3, 2, 1, "3"])),
        "stream": draw(st.sampled_from([None, 1, 2, 0x1234, 0, -1, "s", True])),
        "mask": draw(st.sampled_from([None, None, object()])),
    }


class _Producer:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@settings(max_examples=400, deadline=None)
@given(cai_dicts())
def test_cai_dicts_read_right_or_refused(cai):
    try:
        f = read_cai(_Producer(cai), "op")
    except tf.ValidationError as exc:
        assert str(exc).startswith("op: ")
        return
    assert isinstance(cai["version"], int) and cai["version"] >= 2 and cai["mask"] is None
    assert isinstance(cai["shape"], tuple) and f.shape == cai["shape"]
    assert all(n >= 0 for n in f.shape)
    assert (f.ptr, f.readonly) == (cai["data"][0], cai["data"][1])
    t = f.scalar_type
    assert np.dtype(cai["typestr"]) == t.numpy
    if cai["strides"] is None:
        assert f.strides == c_strides(f.shape, t.itemsize)
    else:
        assert f.strides == cai["strides"] and len(f.strides) == len(f.shape)
    if cai["version"] >= 3 and cai["stream"] is not None:
        assert f.stream == cai["stream"] and f.stream not in (0,) and not isinstance(
            cai["stream"], bool)
    else:
        assert f.stream is None


def test_a_dlpack_producer_that_says_its_view_is_negated_is_refused():
    # torch's neg bit is invisible in a DLPack capsule: the memory holds the unsigned values.
    class Negated:
        exported = False

        def is_neg(self):
            return True

        def __dlpack__(self, **kwargs):
            Negated.exported = True
            raise AssertionError("asked to export")

    with pytest.raises(tf.ValidationError, match=r"^op: x is a negated view .*resolve_neg"):
        dlpack.read_dlpack(Negated(), 7, 0, "op")
    assert not Negated.exported


def _plain(**kw):
    d = {"versioned": True, "major": 1, "flags": 0, "data": 0x7000_0000, "device_type": 2,
         "device_id": 0, "ndim": 1, "code": 2, "bits": 32, "lanes": 1, "shape": [4],
         "strides": None, "offset": 0}
    d.update(kw)
    return d


@pytest.mark.parametrize(("ndim", "shape", "ok"), [
    (0, [], True), (1, [0], True), (2, [3, 0], True), (dlpack.MAX_NDIM, [1] * dlpack.MAX_NDIM,
                                                       True),
    (dlpack.MAX_NDIM + 1, [1] * (dlpack.MAX_NDIM + 1), False), (1, [-1], False)])
def test_dlpack_ndim_and_extents_on_both_sides(ndim, shape, ok):
    d = _plain(ndim=ndim, shape=shape)
    buf, cap = _craft(d)
    if ok:
        f = dlpack.read_capsule(cap, "op", producer=buf)
        assert f.shape == tuple(shape) and f.owner.producer is buf  # the owner keeps it alive
        assert f.strides == c_strides(f.shape, 4)
    else:
        with pytest.raises(tf.ValidationError, match=r"^op: DLPack (ndim=65 must be from 0 to "
                                                     r"64|shape=\(-1,\) has a negative extent)"):
            dlpack.read_capsule(cap, "op")


@pytest.mark.parametrize(("device_type", "where"), [
    (1, "host (kDLCPU)"), (3, "pinned host (kDLCUDAHost)"), (7, "device_type 7")])
def test_dlpack_memory_a_session_cannot_use_is_named(device_type, where):
    _buf, cap = _craft(_plain(device_type=device_type))
    with pytest.raises(tf.ValidationError, match=rf"^op: x is in {re.escape(where)} memory; the "
                                                 r"session needs CUDA device memory"):
        dlpack.read_capsule(cap, "op")


def test_cai_takes_zero_extents_keeps_its_producer_and_names_bad_fields():
    p = _Producer({"shape": (3, 0), "typestr": "<f4", "data": (0, False), "version": 3})
    f = read_cai(p, "op")
    assert f.shape == (3, 0) and f.owner is p
    for field, value in (("shape", (2.0,)), ("strides", (4.0,))):
        cai = {"shape": (1,), "typestr": "<f4", "data": (0x7000, False), "version": 3,
               field: value}
        with pytest.raises(tf.ValidationError, match=rf"^op: __cuda_array_interface__ "
                                                     rf"{field}={re.escape(repr(value))} must "
                                                     r"be a tuple of ints"):
            read_cai(_Producer(cai), "op")


@pytest.mark.parametrize("versioned", [True, False])
def test_a_capsules_deleter_runs_once_and_its_producer_is_kept(versioned):
    calls = []
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(calls.append)
    d = _plain(versioned=versioned, deleter=ctypes.cast(deleter, ctypes.c_void_p).value)
    buf, cap = _craft(d)
    f = dlpack.read_capsule(cap, "op", producer=buf)
    owner = f.owner
    assert owner.producer is buf and calls == []  # held until the last span goes
    owner.release()
    owner.release()
    del f, owner
    gc.collect()
    assert calls == [ctypes.addressof(buf)]  # the managed tensor's address, once


@pytest.mark.parametrize(("shape", "ok"), [((0,), True), ((3, 0), True), ((1,), False),
                                           ((2, 3), False)])
def test_null_dlpack_data_is_taken_only_for_an_empty_tensor(shape, ok):
    _buf, cap = _craft(_plain(data=0, ndim=len(shape), shape=list(shape)))
    if ok:
        assert dlpack.read_capsule(cap, "op").shape == shape
    else:
        with pytest.raises(tf.ValidationError, match=rf"^op: DLPack data is NULL for "
                                                     rf"shape={re.escape(str(shape))}$"):
            dlpack.read_capsule(cap, "op")


def test_a_dlpack_producer_is_asked_with_the_sessions_stream_and_our_version():
    seen = {}

    class Producer:
        def is_neg(self):  # torch's method, answering "not negated"
            return False

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            seen.update(kwargs)
            self.buf, cap = _craft(_plain())
            return cap

    producer = Producer()
    f = dlpack.read_dlpack(producer, 7, 0, "op")
    assert seen == {"stream": 7, "max_version": dlpack.MAX_VERSION}
    assert f.shape == (4,) and f.ptr == 0x7000_0000
    assert f.owner.producer is producer  # the producer lives as long as its memory is used


def test_a_capsule_a_producer_gives_is_refused_naming_the_callers_operation():
    class Producer:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            self.buf, cap = _craft(_plain(major=2))
            return cap

    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: DLPack version 2\.\d+ is "
                                                 r"not supported"):
        dlpack.read_dlpack(Producer(), 7, 0, "session.tensor")


class _Fields:
    """A producer read directly, as torch tensors are: its reader returns its fields."""

    def __init__(self, ptr, shape=(4, 3)):
        self.ptr, self.shape, self.type_name, self.strides = ptr, shape, "f32", None
        self.stream = 7  # the producer's stream: the session's own unless changed


@pytest.fixture
def direct_fields(monkeypatch):
    from tenferro.interop import producers

    def read(x, device, op):
        t = dtypes.by_name(x.type_name)
        strides = x.strides or c_strides(x.shape, t.itemsize)
        compact = x.strides is None or strides == c_strides(x.shape, t.itemsize)
        nbytes = t.itemsize * int(np.prod(x.shape)) if compact else -1
        return x.ptr, x.shape, strides, t, x.stream, nbytes

    monkeypatch.setitem(producers.readers, _Fields, read)


def test_a_directly_read_array_gets_its_span_again_while_the_fields_are_the_same(direct_fields):
    import weakref

    from tenferro.interop import imports

    s, x = ImportingSession(), _Fields(0x1000)
    mut = imports.tensor_mut(s, x)
    assert imports.tensor_mut(s, x) is mut and (mut.ptr, mut.shape, mut.nbytes, mut.device) == \
        (0x1000, (4, 3), 48, 0)
    ref = imports.tensor(s, x)
    assert type(ref) is tf.TensorRef and imports.tensor(s, x) is ref and ref is not mut
    x.ptr = 0x2000  # moved (torch's set_): a new span over the new place
    moved = imports.tensor_mut(s, x)
    assert moved is not mut and (moved.ptr, moved.hi) == (0x2000, 0x2000 + 48)
    x.shape = (4, 2)  # resized in place
    resized = imports.tensor_mut(s, x)
    assert resized is not moved and (resized.shape, resized.nbytes) == ((4, 2), 32)
    x.type_name = "i32"  # another type of the same size (torch's .data = x.view(torch.int32))
    retyped = imports.tensor_mut(s, x)
    assert retyped is not resized and retyped.scalar_type is dtypes.by_name("i32")
    x.strides = (4, 1024)  # an extent of one may have any stride and still be compact
    x.shape = (4, 1)
    strided = imports.tensor_mut(s, x)
    assert strided.strides == (4, 1024)
    x.strides = (4, 4)
    assert imports.tensor_mut(s, x).strides == (4, 4)
    x.shape, x.type_name, x.strides = (4, 2), "f32", None
    resized = imports.tensor_mut(s, x)
    other = ImportingSession()
    theirs = imports.tensor_mut(other, x)
    assert theirs is not resized and theirs.session is other and resized.session is s
    gone, owner_gone = weakref.ref(theirs), weakref.ref(x)
    del mut, moved, resized, theirs, ref, retyped, strided
    assert gone() is None  # the table keeps spans weakly
    del x
    assert owner_gone() is None  # and no array alive through them


def test_the_table_of_kept_spans_stays_bounded(direct_fields):
    from tenferro.interop import imports, producers

    s = ImportingSession()
    table = producers.kept[tf.TensorRef]  # a table a span class
    table.clear()
    held = [imports.tensor(s, _Fields(0x1000 + 16 * i)) for i in range(producers.KEPT_MAX)]
    assert len(table) == producers.KEPT_MAX  # the last size kept whole
    held += [imports.tensor(s, _Fields(0x1000 + 16 * i)) for i in range(producers.KEPT_MAX,
                                                                       producers.KEPT_MAX + 5)]
    assert len(table) == 5  # the first past it dropped the table and began again
    assert imports.tensor(s, held[-1].owner) is held[-1]  # the newest entries stay
    assert [h.ptr for h in held[:2]] == [0x1000, 0x1010]


@pytest.mark.parametrize("op", ["tensor", "tensor_mut"])
def test_a_directly_read_array_is_refused_naming_the_call_and_ordered_before_the_kernel(
        direct_fields, op):
    from tenferro.interop import imports

    s, x = ImportingSession(), _Fields(0x1000)
    make = getattr(imports, op)
    with pytest.raises(tf.ValidationError, match=rf"^session\.{op}: dtype=f64 was asked but x "
                                                 r"is f32$"):
        make(s, x, np.float64)
    assert make(s, x, np.float32).scalar_type is dtypes.by_name("f32")
    x.strides, x.shape = (4, 8), (4, 1)  # compact: an extent of one
    assert make(s, x).strides == (4, 8)
    x.strides, x.shape = (16, 8), (4, 2)  # every other element
    with pytest.raises(tf.ValidationError, match=rf"^session\.{op}: x has non-compact "
                                                 r"strides=\(16, 8\)"):
        make(s, x)
    assert make(s, x, allow_strided=True).strides == (16, 8)
    assert s.deferred == []
    x.stream = 9  # the producer works on another stream: ordered before the next kernel
    make(s, x, allow_strided=True)
    assert s.deferred == [9] and s.held == []


def test_a_direct_import_refuses_misplaced_memory_and_a_session_off_its_fast_path(
        direct_fields, monkeypatch):
    from tenferro.interop import imports
    from tenferro.spans import ADDRESS_END

    s = ImportingSession()
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x's data pointer 0x1002 is "
                                                 r"not aligned to its 4-byte f32 elements"):
        imports.tensor(s, _Fields(0x1002))
    last = _Fields(ADDRESS_END - 48)  # its 48 bytes end where the address space does
    assert imports.tensor(s, last).hi == ADDRESS_END
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x's 48 bytes from 0x.* "
                                                 r"reach outside the address space"):
        imports.tensor(s, _Fields(ADDRESS_END - 44))
    empty = _Fields(0x1000, (0, 3))
    assert imports.tensor(s, empty) is imports.tensor(s, empty)  # kept too, though it has no bytes
    s.fast_path_ok = False
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor_mut: the session is closed"):
        imports.tensor_mut(s, _Fields(0x1000))
    s.fast_path_ok, s.thread = True, -1  # another thread's session
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor: the session is closed"):
        imports.tensor(s, _Fields(0x1000))


def test_a_memory_operation_orders_after_a_producer_now_not_at_the_next_kernel(
        direct_fields, monkeypatch):
    from tenferro.interop import imports

    ordered = []
    monkeypatch.setattr(imports, "_order_after", lambda s, stream, op: ordered.append((stream, op)))
    s, x = ImportingSession(), _Fields(0x1000)
    x.stream = 9
    imports.import_span(s, x, tf.TensorRef, None, False, "session.copy: src")
    assert ordered == [(9, "session.copy: src")] and s.deferred == []


@pytest.mark.parametrize("path", ["one call", "direct", "direct, memory op", "CAI",
                                  "CAI, memory op", "another session's Tensor"])
def test_no_event_for_a_stream_the_driver_orders_with_the_sessions(
        fake_torch, direct_fields, cai, monkeypatch, path):
    # A blocking session stream and the legacy default stream (torch's default) wait for each
    # other in the driver: an import from the legacy stream needs no event, also in a capture.
    # Any other stream still gets one, and the legacy stream gets one on a non-blocking stream.
    from tenferro.interop import imports

    ordered = []  # (session, stream, operation) of each ordering made at once
    monkeypatch.setattr(imports, "_order_after",
                        lambda sess, stream, op: ordered.append((sess, stream, op)))
    monkeypatch.setattr(imports, "check_memory", lambda f, device, op: None)
    made = []

    def span_from(s, producer):
        op = "session.copy: src"
        if path == "one call":
            x = _TorchTensor(0x1000)
            fake_torch.stream = 0 if producer == 1 else producer
            return imports.tensor(s, x)
        if path.startswith("direct"):
            x = _Fields(0x1000)
            x.stream = producer
            return imports.import_span(s, x, tf.TensorRef, None, False, op, defer="op" not in path)
        if path.startswith("CAI"):
            x = cai(0x1000, (4, 3), "<f4", stream=producer)
            return imports.import_span(s, x, tf.TensorRef, None, False, op, defer="op" not in path)
        other = ImportingSession()
        other.stream = producer
        t = tf.Tensor.allocate(other, (4, 3), dtypes.by_name("f32"), "test")
        made.append(t)
        return imports.import_span(s, t, tf.TensorRef, None, False, op)

    def orders(s, producer):
        ordered.clear()
        s.deferred.clear()
        span_from(s, producer)
        assert all(sess is s and op == "session.copy: src" for sess, _, op in ordered)
        return [stream for _, stream, _ in ordered] + s.deferred

    s = ImportingSession()
    s.in_order_with = frozenset((7, 1))  # the session's own stream is blocking
    assert orders(s, 1) == []
    assert orders(s, 9) == [9]
    s.capturing, s.fast_path_ok = True, False  # no event to make: nothing a capture refuses
    assert orders(s, 1) == []
    why = ("a Tensor of another open session needs an event" if path.startswith("another")
           else "ordering after the producer's stream needs an event; make the span before "
                "the capture")
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.\w+(: src)?: not allowed during "
                                                   rf"s\.capture\(\): {re.escape(why)}$"):
        span_from(s, 9)
    s = ImportingSession()  # a non-blocking session stream
    assert orders(s, 1) == [1]
    assert orders(s, 7) == []
    for t in made:
        t.ptr = 0  # the stand-in has no driver to free it with


@pytest.fixture
def foreign_reads(monkeypatch):
    """`import_span`'s foreign path on the CPU: its calls of read_foreign and check_memory."""
    from tenferro.interop import imports

    calls = []
    real = imports.read_foreign

    def read(x, stream, device, capturing, op, **kw):
        calls.append(("read", stream, device, capturing, op, kw))
        return real(x, stream, device, capturing, op, **kw)

    monkeypatch.setattr(imports, "read_foreign", read)
    monkeypatch.setattr(imports, "check_memory",
                        lambda f, device, op: calls.append(("check", f.ptr, device, op)))
    return calls


def test_a_foreign_span_is_what_the_producer_describes_for_this_session(cai, foreign_reads):
    from tenferro.interop import imports

    s = ImportingSession()
    s.device = 3
    x = cai(0x1000, (4, 3), "<f4", stream=7)
    op = "session.copy: src"
    span = imports.import_span(s, x, tf.TensorMut, np.float32, False, op)
    assert foreign_reads == [("read", 7, 3, False, op, {"dlpack_only": False}),
                             ("check", 0x1000, 3, op)]
    assert (type(span), span.ptr, span.shape, span.strides, span.device, span.owner,
            span.session, span.producer_readonly) == \
        (tf.TensorMut, 0x1000, (4, 3), (12, 4), 3, x, s, False)
    ro = cai(0x2000, (4,), "<f4", readonly=True, stream=7)
    with pytest.raises(tf.ValidationError, match=r"^session\.copy: src: x is read-only \(its "
                                                 r"producer says so\); use s\.tensor\(x\)"):
        imports.import_span(s, ro, tf.TensorMut, None, False, op)
    ref = imports.import_span(s, ro, tf.TensorRef, None, False, op)
    assert ref.producer_readonly and ref.owner is ro and ref.session is s
    with pytest.raises(tf.ValidationError, match=r"^session\.copy: src: 'no such dtype' is "
                                                 r"not a dtype"):
        imports.import_span(s, x, tf.TensorRef, "no such dtype", False, op)


@pytest.mark.parametrize(("shape", "strides", "cls", "refused"), [
    ((2, 3), (24, 4), tf.TensorMut, None),  # every other row: taken with allow_strided
    ((2, 3), (26, 4), tf.TensorRef, "not multiples of its 4-byte"),  # an extent of two
    ((1, 2, 3), (6, 24, 4), tf.TensorRef, None),  # an extent of one: its stride is never used
    ((2, 3), (0, 4), tf.TensorRef, None),  # a broadcast view may be read
    ((2, 3), (0, 4), tf.TensorMut, "a zero stride"),
    ((1, 2, 3), (0, 24, 4), tf.TensorMut, None),  # a zero stride on an extent of one: no race
    ((2, 3), (-24, 4), tf.TensorRef, None),  # one row back from address 24: lo is 0
    ((3, 3), (-24, 4), tf.TensorRef, "reach outside the address space"),  # two rows from 40
])
def test_a_strided_foreign_span_is_checked_on_both_sides(cai, foreign_reads, shape, strides,
                                                         cls, refused):
    from tenferro.interop import imports

    s = ImportingSession()
    ptr = (24 if shape == (2, 3) else 40) if strides[0] < 0 else 0x1000
    x = cai(ptr, shape, "<f4", strides=strides, stream=7)
    op = "session.tensor"
    if refused is None:
        span = imports.import_span(s, x, cls, None, True, op)
        assert (span.shape, span.strides, type(span)) == (shape, strides, cls)
    else:
        with pytest.raises(tf.ValidationError, match=rf"^session\.tensor: .*{refused}"):
            imports.import_span(s, x, cls, None, True, op)


def test_a_foreign_span_reaches_the_last_address_and_not_past_it(cai, foreign_reads):
    from tenferro.interop import imports
    from tenferro.spans import ADDRESS_END

    s = ImportingSession()
    op = "session.tensor"
    last = imports.import_span(s, cai(ADDRESS_END - 16, (4,), "<f4", stream=7), tf.TensorRef,
                               None, False, op)
    assert last.hi == ADDRESS_END
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x's 16 bytes from "
                                                 r"0x[0-9a-f]+ reach outside the address space"):
        imports.import_span(s, cai(ADDRESS_END - 12, (4,), "<f4", stream=7), tf.TensorRef,
                            None, False, op)
    strided = imports.import_span(s, cai(ADDRESS_END - 28, (2, 2), "<f4", strides=(20, 4),
                                         stream=7), tf.TensorRef, None, True, op)
    assert strided.hi == ADDRESS_END  # its last element ends at the last byte
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x's strides=\(20, 4\) .*"
                                                 r"reach outside the address space"):
        imports.import_span(s, cai(ADDRESS_END - 24, (2, 2), "<f4", strides=(20, 4), stream=7),
                            tf.TensorRef, None, True, op)


def test_the_sessions_own_tensor_is_its_kept_span_unless_a_dtype_is_asked():
    from tenferro.interop import imports

    s, other = ImportingSession(), ImportingSession()
    other.device = 1
    f32 = dtypes.by_name("f32")
    t = tf.Tensor.allocate(s, (4, 3), f32, "test")
    assert imports.tensor(s, t) is t.span(tf.TensorRef) and imports.tensor_mut(s, t) is \
        t.span(tf.TensorMut)
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: dtype=f64 was asked but x "
                                                 r"is f32$"):
        imports.tensor(s, t, np.float64)
    assert imports.tensor(s, t, np.float32).ptr == 0x8000
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: x lives on device 0, this "
                                                 r"session is on device 1"):
        imports.tensor(other, t)  # a Tensor of another session, on another device
    t.ptr = 0  # the stand-in has no driver to free it with


class _TorchTensor:
    """What the torch readers read of a tensor: its fields, as torch's own methods give them."""

    def __init__(self, ptr, shape=(4, 3), dtype="float32", device=0):
        self.ptr, self.shape, self.dtype, self.device = ptr, shape, dtype, device
        self.requires_grad, self.is_cuda, self.neg, self.strides = False, True, False, None
        self.fail = None  # a field that raises, as a sparse tensor's data_ptr() does

    def is_neg(self):
        return self.neg

    def is_contiguous(self):
        return self.strides is None

    def get_device(self):
        return self.device

    def data_ptr(self):
        if self.fail:
            raise RuntimeError(self.fail)
        return self.ptr

    def stride(self):
        return self.strides


@pytest.fixture
def fake_torch(monkeypatch):
    """sys.modules["torch"] a stand-in whose Tensor class is `_TorchTensor` and whose current
    stream is ``fake_torch.stream``; the readers' decisions per class start empty."""
    import types

    from tenferro import spans
    from tenferro.interop import imports, producers

    torch = types.SimpleNamespace(**{n: n for n in ("float32", "float64", "int32", "bool")})
    torch.Tensor = _TorchTensor
    torch.nn = types.SimpleNamespace(Parameter=type("Parameter", (_TorchTensor,), {}))
    torch.stream = 7
    # the stream of the device asked (another device's is another stream)
    torch._C = types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda device: torch.stream if device == 0 else 99)
    monkeypatch.setitem(sys.modules, "torch", torch)
    saved = [(table, dict(table)) for table in (producers.readers, producers.fast_spans,
                                                 spans.layouts)]  # layouts made anew
    for table, _ in saved:
        table.clear()
    imports.forget_fast_paths()
    yield torch
    for table, contents in saved:
        table.clear()
        table.update(contents)
    imports.forget_fast_paths()


@pytest.mark.parametrize("op", ["tensor", "tensor_mut"])
def test_a_compact_torch_tensor_takes_one_call_and_gets_its_span_again(fake_torch, op):
    from tenferro.interop import imports, producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    make = getattr(imports, op)
    span = make(s, x)
    cls = tf.TensorRef if op == "tensor" else tf.TensorMut
    assert type(span) is cls and (span.ptr, span.shape, span.strides, span.nbytes, span.owner,
                                  span.device) == (0x1000, (4, 3), (12, 4), 48, x, 0)
    assert make(s, x) is span and s.deferred == []  # torch's stream is the session's
    assert producers.fast_spans[_TorchTensor] is not None  # decided once for the class
    fake_torch.stream = 0  # torch's default stream: the legacy handle, ordered before the kernel
    assert make(s, x) is span and s.deferred == [1]
    fake_torch.stream = 7
    for change, value in (("ptr", 0x2000), ("shape", (4, 2)), ("dtype", "int32")):
        setattr(x, change, value)  # torch's set_, resize_, .data = another type
        again = make(s, x)
        assert again is not span and (again.ptr, again.shape, again.scalar_type.name) == \
            (x.ptr, x.shape, "i32" if x.dtype == "int32" else "f32")
        span = again
    other = ImportingSession()
    assert make(other, x).session is other and make(s, x).session is s


@pytest.mark.parametrize(("change", "value", "msg"), [
    ("device", 1, r"x lives on device 1, this session is on device 0"),
    ("neg", True, r"x is a negated view"),
    ("ptr", 0x1002, r"x.s data pointer 0x1002 is not aligned to its 4-byte f32"),
    ("ptr", (1 << 64) - 44, r"x.s 48 bytes from 0x[0-9a-f]+ reach outside the address space"),
    ("strides", (1, 4), r"x has non-compact strides=\(4, 16\)"),
])
def test_a_torch_tensor_the_one_call_cannot_take_is_refused_by_the_general_path(
        fake_torch, monkeypatch, change, value, msg):
    from tenferro.interop import imports, producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    setattr(x, change, value)
    handed = []
    general = imports.import_span
    monkeypatch.setattr(imports, "import_span",
                        lambda s, x, *a, **k: handed.append(x) or general(s, x, *a, **k))
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: " + msg):
        imports.tensor(s, x)
    assert handed == [x] and s.deferred == [] and s.held == []
    assert not producers.kept[tf.TensorRef].get(id(x))  # nothing kept for it


def test_tensors_and_parameters_in_turn_both_take_the_one_call(fake_torch, monkeypatch):
    from tenferro.interop import imports

    s = ImportingSession()
    x, w = _TorchTensor(0x1000), fake_torch.nn.Parameter(0x2000)
    spans = [imports.tensor(s, x), imports.tensor(s, w)]
    monkeypatch.setattr(imports, "import_span", lambda *a, **k: "general")
    for _ in range(3):  # each class decided once: neither goes to the general path again
        assert [imports.tensor(s, x), imports.tensor(s, w)] == spans
    assert [sp.ptr for sp in spans] == [0x1000, 0x2000]


def test_the_one_call_keeps_the_boundaries_of_the_general_path(fake_torch, monkeypatch):
    from tenferro.interop import imports

    s = ImportingSession()
    monkeypatch.setattr(imports, "import_span", lambda *a, **k: "general")
    make = imports.tensor
    last = _TorchTensor((1 << 64) - 48)  # its last byte is the address space's last
    assert make(s, last).hi == 1 << 64
    assert make(s, _TorchTensor((1 << 64) - 44)) == "general"
    assert make(s, _TorchTensor(0x1004)).ptr == 0x1004  # aligned to 4
    assert make(s, _TorchTensor(0x1002)) == "general"
    for field, value in (("requires_grad", True), ("is_cuda", False), ("dtype", "complex64"),
                         ("fail", "sparse tensors have no data_ptr"), ("neg", True),
                         ("strides", (1, 4)), ("device", 1)):
        x = _TorchTensor(0x1000)
        setattr(x, field, value)
        assert make(s, x) == "general", field  # the general path says why
    assert s.deferred == []


def test_a_torch_tensor_off_the_fast_path_goes_through_the_checks(fake_torch):
    from tenferro.interop import imports

    s, x = ImportingSession(), _TorchTensor(0x1000)
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor_mut: dtype=f64 was asked "
                                                 r"but x is f32$"):
        imports.tensor_mut(s, x, np.float64)
    s.fast_path_ok = False  # closed, faulted or capturing: the session says which
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor: the session is closed"):
        imports.tensor(s, x)
    s.fast_path_ok = True
    s.thread = -1  # another thread's session
    with pytest.raises(tf.RuntimeStateError, match=r"^session\.tensor_mut: the session is "):
        imports.tensor_mut(s, x)


def test_the_torch_reader_reads_fields_and_hands_on_what_it_does_not_take(fake_torch):
    from tenferro.interop import producers

    read = producers.direct_reader(_TorchTensor)
    assert producers.readers[_TorchTensor] is read and producers.direct_reader(_TorchTensor) is read
    assert producers.direct_reader(fake_torch.nn.Parameter) is not None
    x = _TorchTensor(0x1000, (4, 3), "float64")
    assert read(x, 0, "op") == (0x1000, (4, 3), (24, 8), dtypes.by_name("f64"), 7, 96)
    fake_torch.stream = 0  # torch's default stream: the legacy handle
    assert read(x, 0, "op")[4] == 1
    x.strides = (1, 4)  # a transposed view: byte strides from torch's element strides
    assert read(x, 0, "op")[2:] == ((8, 32), dtypes.by_name("f64"), 1, -1)
    for field, value in (("requires_grad", True), ("is_cuda", False), ("dtype", "complex64")):
        y = _TorchTensor(0x1000)
        setattr(y, field, value)
        assert read(y, 0, "op") is None, field  # the general path says why
    y = _TorchTensor(0x1000)
    y.fail = "a sparse tensor has no data_ptr"
    assert read(y, 0, "op") is None
    y = _TorchTensor(0x1000)
    y.neg = True
    with pytest.raises(tf.ValidationError, match=r"^op: x is a negated view"):
        read(y, 0, "op")
    with pytest.raises(tf.ValidationError, match=r"^op: x lives on device 0, this session is on "
                                                 r"device 1$"):
        read(_TorchTensor(0x1000), 1, "op")


def test_only_torch_tensors_are_read_directly_and_each_class_is_decided_once(fake_torch,
                                                                           monkeypatch):
    from tenferro.interop import producers

    class Other:
        pass

    for decide, table in ((producers.direct_reader, producers.readers),
                          (producers.fast_span, producers.fast_spans)):
        assert decide(Other) is None and table[Other] is None
        assert decide(np.ndarray) is None
        assert decide(_TorchTensor) is not None and decide(_TorchTensor) is table[_TorchTensor]
    import types

    cupy = types.SimpleNamespace(ndarray=type("ndarray", (), {}), cuda=types.SimpleNamespace(
        get_current_stream=lambda: None))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert producers.direct_reader(cupy.ndarray) is not None  # CuPy: a reader, no fast span
    assert producers.fast_span(cupy.ndarray) is None
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "cupy")
    producers.fast_spans.clear()
    producers.readers.clear()
    assert producers.fast_span(_TorchTensor) is None  # torch not imported: not recognised
    assert producers.direct_reader(_TorchTensor) is None
    assert producers.direct_reader(cupy.ndarray) is None


def test_torchs_public_stream_query_serves_where_the_raw_one_is_missing(fake_torch):
    import types

    from tenferro.interop import producers

    fake_torch._C = types.SimpleNamespace()
    fake_torch.cuda = types.SimpleNamespace(
        current_stream=lambda device: types.SimpleNamespace(cuda_stream=40 + device))
    assert producers.torch_current_stream(fake_torch)(2) == 42


def test_a_torch_span_given_again_is_found_without_making_one(fake_torch, monkeypatch):
    from tenferro.interop import imports, producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    span = imports.tensor(s, x)
    made = []
    monkeypatch.setattr(producers, "kept_compact", lambda *a: made.append(a))
    monkeypatch.setattr(producers, "compact_layout", lambda *a: made.append(a))
    assert imports.tensor(s, x) is span and made == []  # the fields match: no layout, no span


def test_a_torch_tensors_read_only_and_writable_spans_are_kept_apart(fake_torch):
    from tenferro.interop import imports, producers

    s, x = ImportingSession(), _TorchTensor(0x1000)
    ref, mut = imports.tensor(s, x), imports.tensor_mut(s, x)
    assert type(ref) is tf.TensorRef and type(mut) is tf.TensorMut
    assert imports.tensor(s, x) is ref and imports.tensor_mut(s, x) is mut  # each its own
    assert producers.kept[tf.TensorRef][id(x)]() is ref
    assert producers.kept[tf.TensorMut][id(x)]() is mut
