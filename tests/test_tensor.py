"""tf.Tensor: made by a session only, its allocation, spans, CUDA Array Interface export and
preview."""

import numpy as np
import pytest
from _stand_ins import MemorySession

import tenferro as tf


def test_tensor_is_made_by_a_session_only():
    with pytest.raises(TypeError, match=r"Tensor: made by a session"):
        tf.Tensor()


@pytest.mark.gpu
def test_cuda_array_interface_export_is_zero_copy(session, rng):
    from numba import cuda

    a = rng.standard_normal((33, 17)).astype(np.float32)
    t = session.upload(a)
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3 and cai["data"] == (t.ptr, False)
    assert cai["shape"] == (33, 17) and cai["typestr"] == "<f4"
    assert cai["stream"] == session.stream
    view = cuda.as_cuda_array(t)
    assert view.__cuda_array_interface__["data"][0] == t.ptr
    np.testing.assert_array_equal(view.copy_to_host(), a)
    view[0, 0] = 12345.0  # a write through numba is seen by tenferro: the same memory
    assert session.download(t)[0, 0] == 12345.0


@pytest.mark.gpu
def test_zero_d_tensor_keeps_its_shape_through_upload_and_export(session):
    value = np.float32(np.random.default_rng().standard_normal())
    t = session.upload(np.array(value))
    assert t.shape == () and t.strides == () and t.nbytes == 4
    assert session.download(t).shape == () and session.download(t) == value
    cp = pytest.importorskip("cupy")
    c = cp.from_dlpack(t)
    assert c.shape == () and c.data.ptr == t.ptr and float(c) == value
    torch = pytest.importorskip("torch")
    tt = torch.from_dlpack(t)
    assert tt.shape == () and tt.data_ptr() == t.ptr and tt.item() == value


@pytest.mark.gpu
def test_zero_size_tensor_exports_a_null_cai_pointer(session):
    z = session.alloc_zeros((0, 3), np.float32)
    cai = z.__cuda_array_interface__
    assert cai["data"] == (0, False) and cai["shape"] == (0, 3)
    one = session.alloc_zeros((1,), np.float32)  # the first non-empty size has its pointer
    assert one.__cuda_array_interface__["data"] == (one.ptr, False) and one.ptr != 0


class _Downloads:
    """What Tensor.preview uses of its session (download), as its state's session."""

    def __init__(self, values):
        self.values, self.asked = values, []
        self.session = self

    def download(self, x):
        self.asked.append(x)
        return self.values


def _tensor(values, name="f32"):
    from tenferro import dtypes

    t = object.__new__(tf.Tensor)
    t.ptr, t.device, t.shape = 0, 0, values.shape  # ptr 0: nothing for __del__ to free
    t.scalar_type = dtypes.by_name(name)
    t.nbytes = values.nbytes
    t.state = _Downloads(values)
    return t


class _Allocates:
    """What Tensor.allocate uses of a session: its context's allocator and stream."""

    device, stream, is_open, thread = 2, 7, False, None

    def __init__(self):
        self.context = self.liveness = self

    def alloc_async(self, nbytes, stream, op):
        return 0x1000

    def take_block(self):  # no small blocks kept for reuse
        return 0

    def push(self):  # a closed session's Tensor frees through its context: not here
        raise RuntimeError("no driver")


def test_a_tensors_span_is_the_same_object_while_something_holds_it():
    import gc
    import weakref

    from tenferro import dtypes
    from tenferro.spans import TensorMut, TensorRef

    s = _Allocates()
    t = tf.Tensor.allocate(s, (4, 3), dtypes.by_name("f32"), "test")
    mut = t.span(TensorMut)
    assert t.span(TensorMut) is mut and type(mut) is TensorMut
    ref = t.span(TensorRef)
    assert type(ref) is TensorRef and t.span(TensorRef) is ref and ref is not mut
    assert (
        mut.ptr,
        mut.shape,
        mut.strides,
        mut.nbytes,
        mut.lo,
        mut.hi,
        mut.owner,
        mut.state,
        mut.device,
    ) == (0x1000, (4, 3), (12, 4), 48, 0x1000, 0x1000 + 48, t, s, 2)
    assert mut.scalar_type is dtypes.by_name("f32") and ref.scalar_type is mut.scalar_type
    gone = weakref.ref(mut)
    del mut
    assert gone() is None  # the Tensor does not keep its span alive
    again = t.span(TensorMut)
    assert type(again) is TensorMut and again.ptr == 0x1000
    gc.disable()  # no cycle: the Tensor goes by reference counting alone
    try:
        tensor_gone = weakref.ref(t)
        del t, again, ref
        assert tensor_gone() is None
    finally:
        gc.enable()


def test_preview_shows_the_edges_of_each_dimension_from_a_download():
    values = np.arange(100.0, dtype=np.float32).reshape(10, 10) + 0.5
    t = _tensor(values)
    text = t.preview(edgeitems=2)
    assert t.state.asked == [t]
    assert text == np.array2string(values, threshold=4, edgeitems=2)
    assert "..." in text and "0.5" in text and "99.5" in text and "55.5" not in text
    small = _tensor(np.array([1.25, -2.5, 3.0, 4.0, 5.5, 6.0], dtype=np.float32))
    assert small.preview() == "[ 1.25 -2.5   3.    4.    5.5   6.  ]"  # 6 = 2 x 3: all shown


@pytest.mark.parametrize("bad", [0, -3, True, 1.5])
def test_preview_refuses_edgeitems_below_one_without_a_download(bad):
    t = _tensor(np.ones(4, np.float32))
    with pytest.raises(
        tf.ValidationError, match=rf"^tensor\.preview: edgeitems={bad!r} must be an int >= 1$"
    ):
        t.preview(edgeitems=bad)
    assert t.state.asked == []
    assert t.preview(edgeitems=1) == "[1. ... 1.]"  # the smallest accepted


def test_a_tensor_says_what_it_is_and_how_to_see_its_values_without_reading_them():
    t = _tensor(np.ones((4, 3), np.float32))
    assert repr(t) == "Tensor(shape=(4, 3), dtype=f32, device=0, ptr=0x0)"
    assert t._repr_html_().startswith(
        "<b>tenferro Tensor</b> shape (4, 3), f32, device 0, 48 bytes"
    )
    assert t.state.asked == []


@pytest.mark.gpu
def test_preview_of_a_device_tensor_is_its_values_as_numpy_prints_them(session, rng):
    host = rng.standard_normal((7, 9))
    t = session.upload(host)
    assert t.preview() == np.array2string(host, threshold=6, edgeitems=3)
    assert "Tensor(shape=(7, 9), dtype=f64" in repr(t)


@pytest.mark.gpu
def test_a_tensor_dropped_after_its_session_closed_gives_its_bytes_back_to_the_pool(device, rng):
    # A Tensor a consumer kept past the block (or a thread's last locals) is freed without a
    # stream; its bytes must go back to the pool, not stay counted as used.
    from conftest import UNDER_SANITIZER, pool_bytes_used

    before = pool_bytes_used(device)
    with tf.Session(device) as s:
        x = rng.standard_normal(1 << 16).astype(np.float32)
        t = s.upload(x)
    if UNDER_SANITIZER:
        pytest.skip("compute-sanitizer keeps freed pool memory counted as used")
    assert pool_bytes_used(device) - before == t.nbytes  # alive: still used
    del t
    assert pool_bytes_used(device) == before


def test_a_tensor_whose_allocation_failed_frees_nothing(monkeypatch):
    from tenferro import dtypes

    s = MemorySession(monkeypatch)

    def refuse(nbytes, stream, op):
        raise tf.BackendError(f"{op}: CUDA_ERROR_OUT_OF_MEMORY")

    s.alloc_async = refuse
    with pytest.raises(tf.BackendError, match=r"^test: CUDA_ERROR_OUT_OF_MEMORY"):
        tf.Tensor.allocate(s, (8,), dtypes.by_name("f32"), "test")
    import gc

    gc.collect()
    assert s.calls == [] and s.spare == []  # no pointer to free, nor to keep for the next one


class _ClosedState:
    is_open, thread, stream = False, 0, 9


class _Context:
    def __init__(self, calls):
        self.calls = calls

    def push(self):
        self.calls.append("push")

    def pop(self):
        self.calls.append("pop")


def _orphan_tensor(calls, ptr):
    """A Tensor whose session has closed, as one left over from an earlier block."""
    t = object.__new__(tf.Tensor)
    t.ptr, t.nbytes, t.state, t.context = ptr, 4096, _ClosedState(), _Context(calls)
    return t


def test_a_tensor_of_a_closed_session_dropped_during_a_capture_is_freed_after_it(monkeypatch):
    # Freeing synchronously on the capturing thread would invalidate the other session's
    # capture (its mode is thread-local); the free waits for the capture's end instead.
    from tenferro import _driver, _liveness

    calls = []
    monkeypatch.setattr(_driver, "mem_free", lambda ptr: calls.append(("free", ptr)))
    monkeypatch.setattr(_driver, "mem_free_async", lambda ptr, stream: calls.append("async"))
    live = _liveness.Liveness(stream=3, fence_every=8, fence_bytes=1 << 30)
    saved = live.begin_capture()
    t = _orphan_tensor(calls, 0x5000)
    del t
    assert calls == []  # nothing reached the driver during the capture
    live.end_capture(saved)
    live.free_deferred()
    assert calls == ["push", ("free", 0x5000), "pop"]
    calls.clear()
    t = _orphan_tensor(calls, 0x6000)
    del t  # no capture running: freed at once
    assert calls == ["push", ("free", 0x6000), "pop"]
