"""Reading foreign arrays: CUDA Array Interface dicts and DLPack capsules (CPU parts)."""

import ctypes
import gc
import sys

import numpy as np
import pytest

import tenferro as tf
from tenferro import dlpack
from tenferro.interop import read_cai


def test_cai_v3_fields(cai):
    f = read_cai(cai(0x7000, (4, 6), "<f4", strides=(4, 16), readonly=True, stream=2), "op")
    assert (f.ptr, f.shape, f.strides, f.scalar_type.name, f.readonly, f.stream) == \
        (0x7000, (4, 6), (4, 16), "f32", True, 2)
    g = read_cai(cai(0x8000, (3, 5), "<i2", version=2, stream=77), "op")
    assert g.strides == (10, 2) and g.stream is None  # v2 has no stream to order after


@pytest.mark.parametrize(("kw", "msg"), [
    ({"mask": object()}, r"has a mask"),
    ({"stream": 0}, r"stream=0 is forbidden"),
    ({"stream": "s"}, r"stream='s' must be an int"),
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
