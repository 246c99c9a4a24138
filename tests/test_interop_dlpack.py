"""Reading DLPack (tenferro.interop.dlpack): capsules, producers' __dlpack__, their refusals,
and crafted capsules read right or refused."""

import ctypes
import gc
import re
import struct
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro import dtypes
from tenferro.interop import dlpack
from tenferro.spans import c_strides


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
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x\.__dlpack__\(\) of _Refuses "
        r"refused to export: BufferError: Can't export",
    ):
        dlpack.read_dlpack(_Refuses(), 1, 0, "session.tensor")
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.tensor: x\.__dlpack_device__\(\) of "
        r"_BadDevice failed: ValueError",
    ):
        dlpack.read_dlpack(_BadDevice(), 1, 0, "session.tensor")


# --- crafted DLPack capsules: a right record or a clear refusal, never a crash -----------

_capsule_new = ctypes.pythonapi.PyCapsule_New

_capsule_new.restype = ctypes.py_object

_capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

_NAMES = {True: ctypes.c_char_p(b"dltensor_versioned"), False: ctypes.c_char_p(b"dltensor")}

_DL_KNOWN = {(k.dl_code, k.dl_bits): k for k in dtypes.SCALAR_TYPES}


@st.composite
def dltensors(draw):
    ndim = draw(st.integers(0, 6))
    code, bits = draw(
        st.one_of(
            st.sampled_from(sorted(_DL_KNOWN)),
            st.tuples(
                st.sampled_from([0, 1, 2, 4, 5, 6, 200]),
                st.sampled_from([1, 8, 16, 32, 64, 128, 12]),
            ),
        )
    )
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
        "strides": draw(
            st.one_of(
                st.none(), st.lists(st.integers(-(1 << 40), 1 << 40), min_size=ndim, max_size=ndim)
            )
        ),
        "offset": draw(st.sampled_from([0, 8, 12, 1 << 20])),
    }


def _craft(d):
    """A capsule over exactly the fields of ``d`` (and the buffer that holds them)."""
    ndim = d["ndim"]
    head = dlpack.VERSIONED_HEAD.size if d["versioned"] else 0
    tail = 0 if d["versioned"] else dlpack.LEGACY_TAIL.size
    size = head + dlpack.DLTENSOR.size + tail
    buf = ctypes.create_string_buffer(size + 16 * max(ndim, 1))
    base = ctypes.addressof(buf)
    shape_p, strides_p = base + size, base + size + 8 * ndim
    if ndim:
        struct.pack_into(f"<{ndim}q", buf, size, *d["shape"])
    if d["strides"] is not None and ndim:
        struct.pack_into(f"<{ndim}q", buf, size + 8 * ndim, *d["strides"])
    dlpack.DLTENSOR.pack_into(
        buf,
        head,
        d["data"],
        d["device_type"],
        d["device_id"],
        ndim,
        d["code"],
        d["bits"],
        d["lanes"],
        shape_p if ndim else 0,
        strides_p if d["strides"] is not None and ndim else 0,
        d["offset"],
    )
    deleter = d.get("deleter", 0)
    if d["versioned"]:
        dlpack.VERSIONED_HEAD.pack_into(buf, 0, d["major"], 0, 0, deleter, d["flags"])
    else:
        dlpack.LEGACY_TAIL.pack_into(buf, dlpack.DLTENSOR.size, 0, deleter)
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
    d = {
        "versioned": True,
        "major": 1,
        "flags": 0,
        "data": 0x7000_0000,
        "device_type": 2,
        "device_id": 0,
        "ndim": 1,
        "code": 2,
        "bits": 32,
        "lanes": 1,
        "shape": [4],
        "strides": None,
        "offset": 0,
    }
    d.update(kw)
    return d


@pytest.mark.parametrize(
    ("ndim", "shape", "ok"),
    [
        (0, [], True),
        (1, [0], True),
        (2, [3, 0], True),
        (dlpack.MAX_NDIM, [1] * dlpack.MAX_NDIM, True),
        (dlpack.MAX_NDIM + 1, [1] * (dlpack.MAX_NDIM + 1), False),
        (1, [-1], False),
    ],
)
def test_dlpack_ndim_and_extents_on_both_sides(ndim, shape, ok):
    d = _plain(ndim=ndim, shape=shape)
    buf, cap = _craft(d)
    if ok:
        f = dlpack.read_capsule(cap, "op", producer=buf)
        assert f.shape == tuple(shape) and f.owner.producer is buf  # the owner keeps it alive
        assert f.strides == c_strides(f.shape, 4)
    else:
        with pytest.raises(
            tf.ValidationError,
            match=r"^op: DLPack (ndim=65 must be from 0 to "
            r"64|shape=\(-1,\) has a negative extent)",
        ):
            dlpack.read_capsule(cap, "op")


@pytest.mark.parametrize(
    ("device_type", "where"),
    [(1, "host (kDLCPU)"), (3, "pinned host (kDLCUDAHost)"), (7, "device_type 7")],
)
def test_dlpack_memory_a_session_cannot_use_is_named(device_type, where):
    _buf, cap = _craft(_plain(device_type=device_type))
    with pytest.raises(
        tf.ValidationError,
        match=rf"^op: x is in {re.escape(where)} memory; the "
        r"session needs CUDA device memory",
    ):
        dlpack.read_capsule(cap, "op")


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


@pytest.mark.parametrize(
    ("shape", "ok"), [((0,), True), ((3, 0), True), ((1,), False), ((2, 3), False)]
)
def test_null_dlpack_data_is_taken_only_for_an_empty_tensor(shape, ok):
    _buf, cap = _craft(_plain(data=0, ndim=len(shape), shape=list(shape)))
    if ok:
        assert dlpack.read_capsule(cap, "op").shape == shape
    else:
        with pytest.raises(
            tf.ValidationError,
            match=rf"^op: DLPack data is NULL for "
            rf"shape={re.escape(str(shape))}$",
        ):
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

    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: DLPack version 2\.\d+ is "
        r"not supported",
    ):
        dlpack.read_dlpack(Producer(), 7, 0, "session.tensor")
