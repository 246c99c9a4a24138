"""Foreign arrays read into a record and checked for the device (tenferro.interop.foreign):
`read_foreign`'s choice between a capsule, DLPack and the CUDA Array Interface, and
`check_memory`'s refusals, with stand-in producers and a stand-in driver query."""

import ctypes

import numpy as np
import pytest
from _dlpack_structs import DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion

import tenferro as tf
from tenferro import _driver, dtypes
from tenferro._driver import memory
from tenferro.interop import dlpack
from tenferro.interop.foreign import check_memory, read_foreign
from tenferro.interop.foreign_array import Foreign
from tenferro.spans import c_strides

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

PTR = 0x7000_0000


def _capsule(ptr, shape, device):
    """An unused versioned capsule of float32 on CUDA ``device``, and what must outlive it."""
    extents = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = DLManagedTensorVersioned()
    managed.version = DLPackVersion(1, 0)
    t = managed.dl_tensor
    t.data, t.device, t.ndim = ptr, DLDevice(dlpack.DL_CUDA, device), len(shape)
    t.dtype = DLDataType(2, 32, 1)  # kDLFloat, 32 bits, one lane
    t.shape = ctypes.cast(extents, ctypes.POINTER(ctypes.c_int64))
    capsule = _new_capsule(ctypes.addressof(managed), b"dltensor_versioned", None)
    return capsule, (managed, extents)


class _DLPack:
    """A CUDA DLPack producer: it records each request and hands out a fresh capsule."""

    def __init__(self, ptr=PTR, shape=(4,), device=0):
        self.ptr, self.shape, self.device = ptr, shape, device
        self.asked, self.keep = [], []

    def __dlpack_device__(self):
        return (dlpack.DL_CUDA, self.device)

    def __dlpack__(self, stream=None, max_version=None):
        self.asked.append((stream, max_version))
        capsule, keep = _capsule(self.ptr, self.shape, self.device)
        self.keep.append(keep)
        return capsule


class _Both(_DLPack):
    """A producer with both DLPack and a CUDA Array Interface, which counts its reads."""

    def __init__(self, strides=None, **kw):
        super().__init__(**kw)
        self.cai_strides, self.cai_reads = strides, 0
        if strides is not None:
            self.strides = strides  # as CuPy's ndarray.strides: bytes, signed

    @property
    def __cuda_array_interface__(self):
        self.cai_reads += 1
        return {
            "shape": self.shape,
            "typestr": "<f4",
            "data": (self.ptr, False),
            "strides": self.cai_strides,
            "version": 3,
            "stream": None,
        }


def _cupy_like(strides, module="cupy._core.core"):
    """A producer whose type lives in ``module``, as CuPy's ndarray lives in cupy._core.core."""
    cls = type("ndarray", (_Both,), {"__module__": module})
    return cls(strides=strides, shape=(4,) if len(strides) == 1 else (2, 2))


# --- read_foreign: which reader, and its refusals ---------------------------------------------


def test_a_numpy_array_is_refused_as_host_memory_with_the_way_to_upload_it():
    class Sub(np.ndarray):
        pass

    for host in (np.arange(3.0), np.arange(3.0).view(Sub), np.zeros((0, 2))):
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.tensor: x is a numpy array in "
            r"host memory; s\.upload\(x\) copies it to "
            r"the device$",
        ):
            read_foreign(host, 7, 0, False, "session.tensor")


def test_an_unused_capsule_is_read_as_it_is_during_a_capture_and_for_dlpack_only():
    for capturing, dlpack_only in ((False, False), (True, False), (True, True)):
        capsule, _keep = _capsule(PTR, (2, 3), 1)
        f = read_foreign(capsule, 7, 0, capturing, "session.tensor", dlpack_only=dlpack_only)
        assert (f.ptr, f.shape, f.device, f.scalar_type.name) == (PTR, (2, 3), 1, "f32")
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.copy: not an unused DLPack "
            r"capsule",
        ):
            read_foreign(capsule, 7, 0, False, "session.copy")  # taken once, by the first read


def test_dlpack_is_taken_first_where_a_producer_has_both_with_the_sessions_stream():
    x = _Both()
    f = read_foreign(x, 7, 0, False, "session.tensor")
    assert x.asked == [(7, dlpack.MAX_VERSION)] and x.cai_reads == 0
    assert (f.ptr, f.shape, f.device, f.stream) == (PTR, (4,), 0, None)
    assert f.owner.producer is x


def test_a_producer_with_only_a_cai_is_read_through_it(cai):
    x = cai(PTR, (2, 3), "<f8", stream=5)
    f = read_foreign(x, 7, 0, False, "session.tensor")
    assert (f.ptr, f.shape, f.strides, f.scalar_type.name) == (PTR, (2, 3), (24, 8), "f64")
    assert f.device is None and f.stream == 5 and f.owner is x  # CAI names no device
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.copy: __cuda_array_interface__ has "
        r"a mask",
    ):
        read_foreign(cai(PTR, (2,), "<f4", mask=object()), 7, 0, False, "session.copy")


def test_the_sessions_device_and_operation_reach_the_dlpack_reader():
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.copy: x lives on device 1, this "
        r"session is on device 0$",
    ):
        read_foreign(_DLPack(device=1), 7, 0, False, "session.copy")
    x = _DLPack(device=1)
    assert read_foreign(x, 9, 1, False, "session.copy").device == 1  # the same device: read
    assert x.asked == [(9, dlpack.MAX_VERSION)]


def test_dlpack_only_takes_a_dlpack_producer_and_refuses_one_without(cai):
    cai_only = cai(PTR, (4,), "<f4")
    assert read_foreign(cai_only, 7, 0, False, "session.tensor").ptr == PTR  # not asked: read
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x is a CAI; expected an "
        r"object with __dlpack__ or a DLPack "
        r"capsule$",
    ):
        read_foreign(cai_only, 7, 0, False, "session.tensor", dlpack_only=True)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x is a object; expected an "
        r"object with __dlpack__",
    ):
        read_foreign(object(), 7, 0, False, "session.tensor", dlpack_only=True)
    x = _DLPack()
    assert read_foreign(x, 7, 0, False, "session.tensor", dlpack_only=True).device == 0
    assert x.asked == [(7, dlpack.MAX_VERSION)]


@pytest.mark.parametrize("x", [object(), 5, [1, 2], "cuda"], ids=repr)
def test_what_has_neither_interface_is_refused_by_its_type(x):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.copy: x is a {type(x).__name__}; "
        r"expected a tf\.Tensor, a span or a device "
        r"array with __cuda_array_interface__ or "
        r"__dlpack__$",
    ):
        read_foreign(x, 7, 0, False, "session.copy")


@pytest.mark.parametrize("dlpack_only", [False, True])
@pytest.mark.parametrize("make", [_DLPack, _Both], ids=["dlpack", "dlpack_and_cai"])
def test_a_dlpack_producer_is_refused_during_a_capture_before_it_is_asked(make, dlpack_only):
    x = make()
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^session\.tensor: not allowed during "
        r"s\.capture\(\): a DLPack producer would "
        r"order itself on the capturing stream; make "
        r"the span before the capture$",
    ):
        read_foreign(x, 7, 0, True, "session.tensor", dlpack_only=dlpack_only)
    assert x.asked == []
    assert read_foreign(x, 7, 0, False, "session.tensor", dlpack_only=dlpack_only).ptr == PTR
    assert len(x.asked) == 1  # outside the capture: read


def test_a_cai_only_producer_is_read_during_a_capture(cai):
    f = read_foreign(cai(PTR, (4,), "<f4", stream=2), 7, 0, True, "session.tensor")
    assert (f.ptr, f.shape, f.stream, f.device) == (PTR, (4,), 2, None)


@pytest.mark.parametrize("strides", [(-4,), (8, -4), (-8, 4)])
def test_a_cupy_array_with_a_negative_stride_is_read_through_its_cai(strides):
    # CuPy's DLPack export divides such byte strides as unsigned numbers; its CAI is right.
    for module in ("cupy._core.core", "cupy"):
        x = _cupy_like(strides, module)
        f = read_foreign(x, 7, 0, False, "session.tensor")
        assert x.asked == [] and x.cai_reads > 0
        assert f.strides == strides and f.device is None
    x = _cupy_like(strides)
    assert read_foreign(x, 7, 0, True, "session.tensor").strides == strides  # no capture refusal
    assert x.asked == []


@pytest.mark.parametrize(
    ("strides", "module"),
    [
        ((4,), "cupy._core.core"),
        ((0,), "cupy._core.core"),
        ((8, 4), "cupy"),  # none negative
        ((-4,), "cupyx.jit"),
        ((-4,), "numba.cuda.cudadrv.devicearray"),
        ((-4,), "mycupy"),
    ],
)
def test_other_strides_and_other_libraries_go_through_dlpack(strides, module):
    x = _cupy_like(strides, module)
    f = read_foreign(x, 7, 0, False, "session.tensor")
    assert x.asked == [(7, dlpack.MAX_VERSION)] and x.cai_reads == 0 and f.device == 0


def test_a_cupy_array_without_strides_and_dlpack_only_go_through_dlpack():
    bare = type("ndarray", (_Both,), {"__module__": "cupy._core.core"})()
    read_foreign(bare, 7, 0, False, "session.tensor")
    assert len(bare.asked) == 1 and bare.cai_reads == 0
    x = _cupy_like((-4,))
    assert read_foreign(x, 7, 0, False, "session.tensor", dlpack_only=True).device == 0
    assert len(x.asked) == 1 and x.cai_reads == 0


# --- check_memory: the pointer, the device, and what the driver says of the memory ---------


def _foreign(ptr, shape=(4,), device=None):
    f32 = dtypes.by_name("f32")
    return Foreign(ptr, shape, c_strides(shape, 4), f32, False, None, object(), device)


@pytest.fixture
def driver(monkeypatch):
    """`pointer_info` answering ``driver.answer``, with the pointers it was asked about."""

    class Driver:
        def __init__(self):
            self.answer, self.asked = (_driver.MEMORY_DEVICE, 0), []

        def pointer_info(self, ptr):
            self.asked.append(ptr)
            return self.answer

    stand_in = Driver()
    monkeypatch.setattr(_driver, "pointer_info", stand_in.pointer_info)
    return stand_in


@pytest.mark.parametrize(("ptr", "shape"), [(0, (0,)), (1, (4,)), (2**64 - 1, (1,))])
def test_the_first_and_last_64_bit_addresses_are_taken(driver, ptr, shape):
    check_memory(_foreign(ptr, shape), 0, "session.tensor")
    assert driver.asked == ([ptr] if ptr else [])


@pytest.mark.parametrize("ptr", [-1, 2**64, -(2**63), 2**65])
@pytest.mark.parametrize("device", [None, 0])
def test_a_pointer_outside_64_bits_is_refused_before_the_driver_is_asked(driver, ptr, device):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.tensor: x's data pointer {ptr} is "
        rf"not a 64-bit address$",
    ):
        check_memory(_foreign(ptr, device=device), 0, "session.tensor")
    assert driver.asked == []


def test_a_dlpack_device_claim_is_taken_when_it_is_the_sessions_without_asking(driver):
    driver.answer = (_driver.MEMORY_HOST, 0)  # were the driver asked, it would refuse
    check_memory(_foreign(PTR, device=0), 0, "session.tensor")
    check_memory(_foreign(PTR, device=3), 3, "session.tensor")
    assert driver.asked == []


@pytest.mark.parametrize(("claim", "device"), [(1, 0), (0, 1), (3, 2)])
def test_a_dlpack_device_claim_of_another_device_is_refused(driver, claim, device):
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.copy: x lives on device {claim}, "
        rf"this session is on device {device}$",
    ):
        check_memory(_foreign(PTR, device=claim), device, "session.copy")
    assert driver.asked == []


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5, 2)])
@pytest.mark.parametrize("device", [None, 0])
def test_a_null_pointer_with_no_elements_is_taken_without_asking(driver, shape, device):
    check_memory(_foreign(0, shape, device), 0, "session.tensor")
    assert driver.asked == []


@pytest.mark.parametrize("shape", [(1,), (2, 3), ()])
@pytest.mark.parametrize("device", [None, 0])
def test_a_null_pointer_with_elements_is_refused(driver, shape, device):
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x has a null data "
        r"pointer$",
    ):
        check_memory(_foreign(0, shape, device), 0, "session.tensor")
    assert driver.asked == []


def test_memory_of_no_elements_is_taken_without_asking_the_driver(driver):
    driver.answer = (_driver.MEMORY_HOST, 0)
    check_memory(_foreign(PTR, (3, 0)), 0, "session.tensor")
    assert driver.asked == []
    with pytest.raises(tf.ValidationError, match=r"host memory"):  # one element: asked
        check_memory(_foreign(PTR, (3, 1)), 0, "session.tensor")
    assert driver.asked == [PTR]


@pytest.mark.parametrize("device", [0, 2])
def test_device_memory_of_the_sessions_device_is_taken(driver, device):
    driver.answer = (_driver.MEMORY_DEVICE, device)
    check_memory(_foreign(PTR), device, "session.tensor")
    assert driver.asked == [PTR]


@pytest.mark.parametrize(("ordinal", "device"), [(1, 0), (0, 1), (2, 3)])
def test_device_memory_of_another_device_is_refused(driver, ordinal, device):
    driver.answer = (_driver.MEMORY_DEVICE, ordinal)
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.copy: x lives on device {ordinal}, "
        rf"this session is on device {device}$",
    ):
        check_memory(_foreign(PTR), device, "session.copy")
    assert driver.asked == [PTR]


@pytest.mark.parametrize("ordinal", [0, 1])
def test_host_memory_is_refused_naming_its_address(driver, ordinal):
    driver.answer = (_driver.MEMORY_HOST, ordinal)  # host memory, whatever device it names
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x is in host memory "
        r"\(0x70000000\); copy it to the device "
        r"first$",
    ):
        check_memory(_foreign(PTR), 0, "session.tensor")
    assert driver.asked == [PTR]


@pytest.mark.parametrize(
    ("kind", "ordinal"),
    [
        (memory.MEMORY_UNKNOWN, -1),  # what the driver says of memory it does not know
        (memory.MEMORY_UNKNOWN, 0),
        ("array", 0),
    ],
)  # even where the ordinal is the session's
def test_memory_of_another_kind_is_refused_as_not_device_memory(driver, kind, ordinal):
    driver.answer = (kind, ordinal)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: x's pointer 0x70000000 is "
        r"not CUDA device memory$",
    ):
        check_memory(_foreign(PTR), 0, "session.tensor")
    assert driver.asked == [PTR]
