"""DLPack export from tf.Tensor (tenferro.interop.dlpack_export): capsules checked on the CPU,
zero-copy round trips on the GPU."""

import ctypes
import gc
import os
import subprocess
import sys
import weakref

import _dlpack_structs as structs
import numpy as np
import pytest

import tenferro as tf
from tenferro import dtypes
from tenferro.interop import dlpack, dlpack_export
from tenferro.spans import c_strides


class _ClosedSession:
    is_open = False


class FakeTensor:
    """What export reads of a Tensor, over host memory: the capsule code needs no device."""

    def __init__(self, array):
        self.keep = array
        self.ptr = array.ctypes.data
        self.shape = array.shape
        self.scalar_type = dtypes.from_numpy(array.dtype)
        self.strides = c_strides(array.shape, array.itemsize)
        self.nbytes = array.nbytes
        self.device = 0
        self.state = _ClosedSession()


def _managed_address(capsule, name):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, (ctypes.py_object, ctypes.c_char_p)
    return get(capsule, name)


def _is_named(capsule, name):
    f = ctypes.pythonapi.PyCapsule_IsValid
    f.restype, f.argtypes = ctypes.c_int, (ctypes.py_object, ctypes.c_char_p)
    return bool(f(capsule, name))


@pytest.mark.parametrize(
    ("max_version", "name"),
    [
        (None, b"dltensor"),
        ((0, 8), b"dltensor"),
        ((1, 0), b"dltensor_versioned"),
        ((1, 7), b"dltensor_versioned"),
        ((2, 0), b"dltensor_versioned"),
    ],
)
def test_capsule_kind_follows_max_version(max_version, name):
    t = FakeTensor(np.arange(12.0).reshape(3, 4))
    cap = dlpack_export.export(t, -1, max_version, None, None)
    assert _is_named(cap, name)
    if name == b"dltensor_versioned":
        m = structs.DLManagedTensorVersioned.from_address(_managed_address(cap, name))
        want = (1, 0) if max_version == (1, 0) else (1, 1)
        assert (m.version.major, m.version.minor) == want and m.flags == 0


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_round_trip_through_our_reader_releases_once(max_version, rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    t = FakeTensor(a)
    alive = weakref.ref(t)
    before = dlpack_export.live_exports()
    cap = dlpack_export.export(t, -1, max_version, None, None)
    del t
    assert alive() is not None and dlpack_export.live_exports() == before + 1
    f = dlpack.read_capsule(cap, "op")
    assert (f.ptr, f.shape, f.strides, f.scalar_type.name, f.device, f.readonly) == (
        a.ctypes.data,
        (5, 7),
        (28, 4),
        "f32",
        0,
        False,
    )
    del cap
    gc.collect()
    assert alive() is not None  # the consumer (f's owner) still holds the memory
    f.owner.release()
    f.owner.release()  # a second call does nothing
    del f
    gc.collect()
    assert alive() is None and dlpack_export.live_exports() == before


def test_unconsumed_capsule_releases_on_collection():
    t = FakeTensor(np.ones(3, np.int16))
    alive = weakref.ref(t)
    before = dlpack_export.live_exports()
    cap = dlpack_export.export(t, -1, (1, 0), None, None)
    del t, cap
    gc.collect()
    assert alive() is None and dlpack_export.live_exports() == before


@pytest.mark.parametrize(
    ("kw", "exc", "msg"),
    [
        ({"stream": 0}, tf.ValidationError, r"stream=0 is ambiguous"),
        ({"stream": "s"}, tf.ValidationError, r"stream='s' must be None, an int$"),
        ({"stream": -5}, tf.ValidationError, r"stream=-5 is not a stream"),
        (
            {"max_version": 1},
            tf.ValidationError,
            r"max_version=1 must be None or a \(major, minor\)",
        ),
        ({"dl_device": (1, 0)}, BufferError, r"dl_device=\(1, 0\) asks for another device"),
        ({"dl_device": (2, 3)}, BufferError, r"dl_device=\(2, 3\) asks for another device"),
        (
            {"dl_device": "cuda"},
            BufferError,
            r"dl_device='cuda' must be a \(device_type, device_id\) tuple$",
        ),
        ({"copy": "yes"}, tf.ValidationError, r"copy='yes' must be None, True or False"),
        ({"copy": True}, BufferError, r"copy=True needs the Tensor's session to be open"),
    ],
)
def test_export_refusals_name_the_operation_and_argument(kw, exc, msg):
    args = {"stream": -1, "max_version": None, "dl_device": None, "copy": None, **kw}
    before = dlpack_export.live_exports()
    with pytest.raises(exc, match=r"tensor\.__dlpack__: " + msg):
        dlpack_export.export(FakeTensor(np.ones(2)), **args)
    assert dlpack_export.live_exports() == before


def _altered(max_version, change):
    """A capsule from our producer with one field of its structure changed."""
    t = FakeTensor(np.arange(6, dtype=np.float64))
    cap = dlpack_export.export(t, -1, max_version, None, None)
    name = b"dltensor" if max_version is None else b"dltensor_versioned"
    cls = structs.DLManagedTensor if max_version is None else structs.DLManagedTensorVersioned
    change(cls.from_address(_managed_address(cap, name)))
    return cap


def _set(path, value):
    def change(m):
        obj = m
        for p in path[:-1]:
            obj = getattr(obj, p)
        setattr(obj, path[-1], value)

    return change


@pytest.mark.parametrize(
    ("max_version", "path", "value", "msg"),
    [
        ((1, 0), ("version", "major"), 2, r"DLPack version 2\.0 is not supported"),
        ((1, 0), ("dl_tensor", "dtype", "code"), 3, r"DLPack dtype"),
        (None, ("dl_tensor", "dtype", "lanes"), 4, r"lanes=4 is not supported"),
        (None, ("dl_tensor", "device", "device_id"), -1, r"device_id=-1 is negative"),
        ((1, 0), ("dl_tensor", "device", "device_type"), 1, r"host \(kDLCPU\) memory"),
        ((1, 0), ("dl_tensor", "data"), None, r"data is NULL for shape=\(6,\)"),
        (None, ("dl_tensor", "ndim"), -2, r"ndim=-2 must be from 0 to 64"),
    ],
)
def test_bad_capsules_are_refused_and_still_released_once(max_version, path, value, msg):
    before = dlpack_export.live_exports()
    cap = _altered(max_version, _set(path, value))
    with pytest.raises(tf.ValidationError, match=r"op: .*" + msg):
        dlpack.read_capsule(cap, "op")
    assert _is_named(cap, b"used_dltensor" if max_version is None else b"used_dltensor_versioned")
    del cap
    gc.collect()
    assert dlpack_export.live_exports() == before  # the deleter ran (once: the count is exact)


def test_read_only_flag_and_byte_offset_are_honoured():
    def change(m):
        m.flags = dlpack.FLAG_READ_ONLY
        m.dl_tensor.byte_offset = 16
        m.dl_tensor.shape[0] = 4

    t = FakeTensor(np.arange(6, dtype=np.float64))
    cap = dlpack_export.export(t, -1, (1, 0), None, None)
    change(
        structs.DLManagedTensorVersioned.from_address(_managed_address(cap, b"dltensor_versioned"))
    )
    f = dlpack.read_capsule(cap, "op")
    # The offset moves the pointer by exactly 16 bytes: the span starts at element 2.
    assert f.readonly and f.shape == (4,) and f.ptr == t.ptr + 16
    assert np.frombuffer(ctypes.string_at(f.ptr, 32), np.float64).tolist() == [2.0, 3.0, 4.0, 5.0]
    f.owner.release()


class _OpenSession:
    """What export and the deleter read of an open session on this thread."""

    is_open = True

    def __init__(self):
        import threading
        import types

        self.stream, self.export_event = 0x51, 0xE0
        self.thread = threading.get_ident()
        self.liveness = types.SimpleNamespace(capturing=False)
        # A non-blocking session stream: ordered with itself only.
        self.ordering = types.SimpleNamespace(in_order_with=frozenset((0x51,)))


class _Context:
    def __init__(self):
        self.pushes = self.pops = 0

    def push(self):
        self.pushes += 1

    def pop(self):
        self.pops += 1


def _open_tensor(array):
    t = FakeTensor(array)
    t.state, t.context = _OpenSession(), _Context()
    return t


@pytest.fixture
def orderings(monkeypatch):
    """The (waiting stream, stream waited for, event, operation) of each order_after made."""
    calls = []
    monkeypatch.setattr(dlpack_export, "order_after", lambda *a: calls.append(a))
    return calls


def test_export_orders_the_consumer_after_the_session_and_release_orders_back(orderings):
    t = _open_tensor(np.arange(4.0))
    alive = weakref.ref(t)
    cap = dlpack_export.export(t, 0x77, (1, 0), None, None)  # the consumer's own stream
    assert orderings == [(0x77, 0x51, 0xE0, "tensor.__dlpack__")]
    f = dlpack.read_capsule(cap, "op")
    del t, cap
    f.owner.release()  # the consumer lets go: our stream waits for its stream first
    assert orderings[1:] == [(0x51, 0x77, 0xE0, "tensor.__dlpack__ deleter")]
    del f
    gc.collect()
    assert alive() is None  # and the reference is gone


def test_no_ordering_where_the_consumer_asked_for_none(orderings):
    t = _open_tensor(np.arange(4.0))
    f = dlpack.read_capsule(dlpack_export.export(t, -1, (1, 0), None, None), "op")
    f.owner.release()
    assert orderings == []
    f = dlpack.read_capsule(dlpack_export.export(t, 0x51, (1, 0), None, None), "op")
    f.owner.release()
    assert orderings == []  # the consumer's stream is the session's: nothing to order


def test_no_ordering_with_a_stream_the_driver_orders_with_the_sessions(orderings):
    # A blocking session stream and the legacy default stream (None and 1, what torch's default
    # stream asks with) wait for each other in the driver: no event either way.
    t = _open_tensor(np.arange(4.0))
    t.state.ordering.in_order_with = frozenset((0x51, 1))
    for consumer in (None, 1):
        dlpack.read_capsule(
            dlpack_export.export(t, consumer, (1, 0), None, None), "op"
        ).owner.release()
    assert orderings == []
    f = dlpack.read_capsule(dlpack_export.export(t, 2, (1, 0), None, None), "op")
    f.owner.release()  # the per-thread default stream is not ordered with a blocking stream
    assert orderings == [
        (2, 0x51, 0xE0, "tensor.__dlpack__"),
        (0x51, 2, 0xE0, "tensor.__dlpack__ deleter"),
    ]
    t.state.ordering.in_order_with = frozenset((0x51,))  # a non-blocking one: both ways
    del orderings[:]
    dlpack.read_capsule(dlpack_export.export(t, None, (1, 0), None, None), "op").owner.release()
    assert orderings == [
        (1, 0x51, 0xE0, "tensor.__dlpack__"),
        (0x51, 1, 0xE0, "tensor.__dlpack__ deleter"),
    ]


def test_a_closed_session_or_a_freed_tensor_orders_nothing(orderings):
    closed = FakeTensor(np.arange(4.0))  # its session is closed: nothing to order on
    f = dlpack.read_capsule(dlpack_export.export(closed, 0x77, None, None, None), "op")
    f.owner.release()
    assert orderings == []
    t = _open_tensor(np.arange(4.0))
    f = dlpack.read_capsule(dlpack_export.export(t, 0x77, None, None, None), "op")
    t.ptr = 0  # freed since (its memory went back already)
    f.owner.release()
    assert orderings == [(0x77, 0x51, 0xE0, "tensor.__dlpack__")]  # the export's alone


def test_export_takes_its_own_device_and_copy_false():
    t = FakeTensor(np.arange(3.0))
    for kw in ({"dl_device": (dlpack.DL_CUDA, 0)}, {"copy": False}):
        args = {"stream": -1, "max_version": None, "dl_device": None, "copy": None, **kw}
        f = dlpack.read_capsule(dlpack_export.export(t, **args), "op")
        assert f.ptr == t.ptr and f.shape == (3,)
        f.owner.release()


@pytest.mark.parametrize(
    ("max_version", "refused"),
    [((0, 0), False), ((-1, 0), True), ((1, -1), True), ((1.0, 0), True)],
)
def test_max_version_parts_are_non_negative_ints(max_version, refused):
    t = FakeTensor(np.arange(3.0))
    if refused:
        with pytest.raises(tf.ValidationError, match=r"^tensor\.__dlpack__: max_version="):
            dlpack_export.export(t, -1, max_version, None, None)
    else:
        dlpack.read_capsule(
            dlpack_export.export(t, -1, max_version, None, None), "op"
        ).owner.release()


def test_an_export_from_another_thread_makes_the_context_current_for_its_ordering(orderings):
    import threading

    t = _open_tensor(np.arange(4.0))
    dlpack.read_capsule(dlpack_export.export(t, 0x77, None, None, None), "op").owner.release()
    assert t.context.pushes == t.context.pops == 1  # the release's; the export's thread is its
    caps = []
    worker = threading.Thread(
        target=lambda: caps.append(dlpack_export.export(t, 0x77, None, None, None))
    )
    worker.start()
    worker.join()
    assert t.context.pushes == t.context.pops == 2 and len(orderings) == 3
    dlpack.read_capsule(caps.pop(), "op").owner.release()


def test_a_deleter_for_an_unknown_or_released_tensor_does_nothing():
    before = dlpack_export.live_exports()
    dlpack_export._release(0xDEAD0)  # no such export: no KeyError into the consumer's C code
    assert dlpack_export.live_exports() == before


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_strides_are_given_in_elements_for_every_dimension(max_version):
    t = FakeTensor(np.arange(24.0).reshape(2, 3, 4))
    cap = dlpack_export.export(t, -1, max_version, None, None)
    name = b"dltensor" if max_version is None else b"dltensor_versioned"
    cls = structs.DLManagedTensor if max_version is None else structs.DLManagedTensorVersioned
    dl = cls.from_address(_managed_address(cap, name)).dl_tensor
    assert [dl.shape[i] for i in range(3)] == [2, 3, 4]
    assert [dl.strides[i] for i in range(3)] == [12, 4, 1]


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_a_0d_export_has_no_shape_or_strides_arrays(max_version):
    t = FakeTensor(np.array(2.5))
    cap = dlpack_export.export(t, -1, max_version, None, None)
    name = b"dltensor" if max_version is None else b"dltensor_versioned"
    cls = structs.DLManagedTensor if max_version is None else structs.DLManagedTensorVersioned
    dl = cls.from_address(_managed_address(cap, name)).dl_tensor
    assert dl.ndim == 0 and not dl.shape and not dl.strides  # NULL, as the standard allows


# --- on the GPU ---------------------------------------------------------------------------

SPIN_WRITE = r"""
extern "C" __global__ void spin_then_fill(float* y, float v, unsigned n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}"""
SPIN = 200_000_000  # ~0.1 s at the H200's clock: long enough to lose any race it would lose


@pytest.mark.gpu
def test_torch_consumes_our_tensor_zero_copy_in_stream_order(session, rng):
    torch = pytest.importorskip("torch")
    fill = session.compile(SPIN_WRITE).function("spin_then_fill")
    n = 4099
    t = session.upload(rng.standard_normal(n).astype(np.float32))
    side = torch.cuda.Stream()
    session.launch(
        fill,
        tf.LaunchConfig.flat(n, 256),
        [session.tensor_mut(t), tf.f32(3.5), tf.u32(n), tf.i64(SPIN)],
    )
    with torch.cuda.stream(side):
        tt = torch.from_dlpack(t)  # torch passes its stream: it waits for our spinning kernel
        assert tt.data_ptr() == t.ptr and tt.shape == (n,) and tt.dtype == torch.float32
        doubled = tt * 2.0  # queued on torch's stream behind the event, no host sync
    side.synchronize()
    np.testing.assert_array_equal(doubled.cpu().numpy(), np.full(n, 7.0, np.float32))
    with torch.cuda.stream(side):
        tt.mul_(-1.0)  # a write through torch ...
    side.synchronize()
    np.testing.assert_array_equal(session.download(t), np.full(n, -3.5, np.float32))  # ... seen


@pytest.mark.gpu
def test_export_outlives_the_session_while_the_consumer_holds_it(device, rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((33, 17))
    before = dlpack_export.live_exports()
    with tf.Session(device=device) as s:
        tt = torch.from_dlpack(s.upload(a))  # the Tensor's last Python reference is torch's
    assert not s.is_open
    torch.cuda.synchronize()
    np.testing.assert_array_equal(tt.cpu().numpy(), a)  # still valid after the block
    assert dlpack_export.live_exports() == before + 1
    del tt
    gc.collect()
    assert dlpack_export.live_exports() == before  # torch called the deleter; memory freed


@pytest.mark.gpu
def test_stream_conventions_and_copy(session, rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal(1000).astype(np.float32)
    t = session.upload(a)
    side = torch.cuda.Stream()
    for stream in (None, 1, 2, -1, side.cuda_stream):
        cap = t.__dlpack__(stream=stream, max_version=(1, 0))
        tt = torch.from_dlpack(cap)
        assert tt.data_ptr() == t.ptr
        torch.cuda.synchronize()
        np.testing.assert_array_equal(tt.cpu().numpy(), a)
    with pytest.raises(tf.ValidationError, match=r"tensor\.__dlpack__: stream=0 is ambiguous"):
        t.__dlpack__(stream=0)
    assert t.__dlpack_device__() == (2, 0)
    cap = t.__dlpack__(stream=side.cuda_stream, max_version=(1, 0), copy=True)
    m = structs.DLManagedTensorVersioned.from_address(_managed_address(cap, b"dltensor_versioned"))
    assert m.flags & dlpack_export.FLAG_IS_COPIED
    tc = torch.from_dlpack(cap)
    assert tc.data_ptr() != t.ptr
    side.synchronize()
    np.testing.assert_array_equal(tc.cpu().numpy(), a)


@pytest.mark.gpu
@pytest.mark.parametrize("torch_dtype", ["float16", "bfloat16"])
def test_half_types_round_trip(session, rng, torch_dtype):
    torch = pytest.importorskip("torch")
    src = (
        torch.from_numpy(rng.standard_normal(257).astype(np.float32))
        .cuda()
        .to(getattr(torch, torch_dtype))
    )
    ref = session.tensor(src)
    assert (
        ref.ptr == src.data_ptr()
        and ref.scalar_type.name == {"float16": "f16", "bfloat16": "bf16"}[torch_dtype]
    )
    out = session.alloc_output((257,), np.float16) if torch_dtype == "float16" else None
    if out is None:
        pytest.importorskip("ml_dtypes")
        out = session.alloc_output((257,), "bfloat16")
    session.copy(session.tensor_mut(out), ref)
    back = torch.from_dlpack(out)
    assert back.dtype == src.dtype and back.data_ptr() == out.ptr
    torch.cuda.synchronize()
    assert torch.equal(back, src)


@pytest.mark.gpu
def test_cupy_and_numba_round_trips(session, rng):
    cp = pytest.importorskip("cupy")
    from numba import cuda

    a = rng.standard_normal((40, 30))
    t = session.upload(a)
    c = cp.from_dlpack(t)
    assert c.data.ptr == t.ptr
    session.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(c), a)
    c *= 3.0  # a write through cupy, seen by tenferro
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(session.download(t), 3.0 * a)
    cview = c[3:, ::2]  # a strided, offset view imported back
    span = session.tensor(cview, allow_strided=True)
    assert span.ptr == cview.data.ptr and span.strides == cview.strides
    np.testing.assert_array_equal(session.download(span), (3.0 * a)[3:, ::2])
    d = cuda.as_cuda_array(t)  # numba reads our CAI v3
    assert d.__cuda_array_interface__["data"][0] == t.ptr
    nd = cuda.to_device(a)
    mut = session.tensor_mut(nd)
    assert mut.ptr == nd.__cuda_array_interface__["data"][0]
    session.copy(mut, t)
    session.synchronize()
    np.testing.assert_array_equal(nd.copy_to_host(), 3.0 * a)


@pytest.mark.gpu
def test_jax_round_trip_if_it_imports(session, rng):
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as exc:
        pytest.skip(f"jax has no GPU backend here: {exc}")
    a = rng.standard_normal(513).astype(np.float32)
    x = jax.device_put(a, gpu)
    ref = session.tensor(x)
    assert ref.ptr == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(session.download(ref), a)
    t = session.upload(a * 2)
    session.synchronize()
    y = jax.dlpack.from_dlpack(t)
    np.testing.assert_array_equal(np.asarray(y), a * 2)


@pytest.mark.gpu
def test_torch_tensor_dropped_under_a_running_kernel_is_held(session, rng):
    torch = pytest.importorskip("torch")
    copy_spin = session.compile(r"""
    extern "C" __global__ void spin_copy(float* y, const float* x, unsigned n, long long c) {
        long long t0 = clock64();
        while (clock64() - t0 < c) {}
        unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }""").function("spin_copy")
    n = 1 << 16
    x = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).cuda()
    want = 2.0 * x.cpu().numpy()
    y = session.alloc_output((n,), np.float32)
    session.launch(
        copy_spin,
        tf.LaunchConfig.flat(n, 256),
        [session.tensor_mut(y), tf.from_dlpack(x), tf.u32(n), tf.i64(SPIN)],
    )
    del x  # torch's last reference: without the session's hold its block would be reused now
    junk = [torch.full((n,), 9.0, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    np.testing.assert_array_equal(session.download(y), want)
    assert all(bool((j == 9.0).all()) for j in junk)


@pytest.mark.gpu
def test_from_dlpack_takes_objects_and_capsules(session, rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.standard_normal(100)).cuda()
    ref = tf.from_dlpack(x)
    assert isinstance(ref, tf.TensorRef) and ref.ptr == x.data_ptr()
    mut = tf.from_dlpack(torch.utils.dlpack.to_dlpack(x), writable=True)
    assert isinstance(mut, tf.TensorMut) and mut.ptr == x.data_ptr()
    with pytest.raises(tf.ValidationError, match=r"session\.from_dlpack: x is a list"):
        tf.from_dlpack([1, 2], session=session)


def test_from_dlpack_without_a_session_is_refused():
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"tenferro\.from_dlpack: no tf\.Session is "
        r"open on this thread",
    ):
        tf.from_dlpack(np.arange(3))
    with pytest.raises(
        tf.ValidationError,
        match=r"tenferro\.from_dlpack: session must be a "
        r"tf\.Session, got int",
    ):
        tf.from_dlpack(np.arange(3), session=3)


@pytest.mark.gpu
def test_consumer_holding_an_export_at_interpreter_exit_is_clean(device):
    pytest.importorskip("torch")
    code = (
        "import numpy as np, torch, tenferro as tf\n"
        "with tf.Session() as s:\n"
        "    t = s.upload(np.arange(8.0))\n"
        "    KEEP = torch.from_dlpack(t)\n"
        "    CAP = t.__dlpack__(max_version=(1, 0))\n"  # never consumed
        "print(KEEP.sum().item())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "28.0"


def test_a_record_tensor_has_no_dlpack_type_and_says_where_to_go():
    record = np.zeros(3, np.dtype([("x", "<f4"), ("n", "<i4")]))
    before = dlpack_export.live_exports()
    with pytest.raises(
        BufferError,
        match=r"^tensor\.__dlpack__: the Tensor's dtype \[\('x', '<f4'\), \('n', '<i4'\)\] is a "
        r"record, which DLPack has no type for; consumers read it through "
        r"__cuda_array_interface__",
    ):
        dlpack_export.export(FakeTensor(record), -1, (1, 0), None, None)
    assert dlpack_export.live_exports() == before
    dlpack_export.export(FakeTensor(np.ones(3, np.int32)), -1, (1, 0), None, None)  # a plain one
