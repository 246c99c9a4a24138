"""The memory operations (tenferro.memory): allocation, upload/download, copies, memset,
copy_peer and the pool's statistics and trimming, on the GPU and through stand-in sessions."""

import numpy as np
import pytest
from _stand_ins import ImportingSession, MemorySession

import tenferro as tf
from tenferro import dtypes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype",
    [np.float64, np.float32, np.float16, np.int8, np.uint16, np.int64, np.complex128, np.bool_],
)
def test_upload_download_round_trip(session, rng, dtype):
    a = (rng.standard_normal((5, 7, 3)) * 100).astype(dtype)
    t = session.upload(a)
    assert t.shape == a.shape and t.dtype == a.dtype and t.nbytes == a.nbytes
    assert t.strides == a.strides
    np.testing.assert_array_equal(session.download(t), a)
    np.testing.assert_array_equal(t.to_host(), a)


@pytest.mark.gpu
def test_alloc_zeros_output_bytes_and_empty(session):
    np.testing.assert_array_equal(
        session.download(session.alloc_zeros((3, 5), np.int16)), np.zeros((3, 5), np.int16)
    )
    out = session.alloc_output((9,), np.float32)
    assert out.shape == (9,) and out.ptr
    ws = session.alloc_bytes(1000)
    assert isinstance(ws, tf.DeviceBytes) and ws.nbytes == 1000
    empty = session.upload(np.zeros((0, 4)))
    assert session.download(empty).shape == (0, 4)
    with pytest.raises(tf.ValidationError, match=r"session\.alloc_output: shape=\(-1,\)"):
        session.alloc_output(-1, np.float32)
    with pytest.raises(tf.ValidationError, match=r"session\.alloc_bytes: nbytes=2.5"):
        session.alloc_bytes(2.5)
    with pytest.raises(tf.ValidationError, match=r"session\.upload: array must be a numpy"):
        session.upload([1, 2, 3])
    with pytest.raises(tf.ValidationError, match=r"session\.upload: dtype object"):
        session.upload(np.array([object()]))


@pytest.mark.gpu
def test_copy_device_to_device(session, rng):
    a = rng.standard_normal(1001)
    src = session.upload(a)
    dst = session.upload(np.full(1001, np.nan))
    session.copy(dst, src)
    np.testing.assert_array_equal(session.download(dst), a)
    ws = session.alloc_bytes(a.nbytes)
    session.copy(ws, src)  # untyped workspace takes any dtype of the same size
    back = session.alloc_output(1001, np.float64)
    session.copy(back, ws)
    np.testing.assert_array_equal(session.download(back), a)
    with pytest.raises(tf.ValidationError, match=r"session\.copy: dst has 8 bytes, src has 8008"):
        session.copy(session.alloc_output(1, np.float64), src)
    with pytest.raises(tf.ValidationError, match=r"session\.copy: dst is f32, src is f64"):
        session.copy(session.alloc_output(2002, np.float32), src)
    with pytest.raises(tf.ValidationError, match=r"session\.copy: dst and src overlap"):
        session.copy(src, session.tensor(src))
    with pytest.raises(tf.ValidationError, match=r"session\.copy: dst: x is read-only"):
        session.copy(session.tensor(dst), src)


@pytest.mark.gpu
def test_memset_sets_every_byte_of_the_destination_and_nothing_else(session, rng):
    from numba import cuda

    a = rng.standard_normal(64).astype(np.float32)
    t = session.upload(a)
    view = cuda.as_cuda_array(t)  # slices of a foreign array: only their bytes are set
    session.memset(view[8:24], 0)
    session.memset(view[40:41], 255)  # the last byte value taken: every bit set (a NaN)
    session.memset(view[41:41], 7)  # empty: nothing to set
    session.synchronize()
    want = a.copy()
    want[8:24] = 0.0
    got = session.download(t)
    np.testing.assert_array_equal(got[:40], want[:40])
    assert got[40:41].view(np.uint32)[0] == 0xFFFFFFFF
    np.testing.assert_array_equal(got[41:], want[41:])
    ws = session.alloc_bytes(12)
    session.memset(ws, np.uint8(0xA5))
    back = session.alloc_output(3, np.uint32)
    session.copy(back, ws)
    np.testing.assert_array_equal(session.download(back), [0xA5A5A5A5] * 3)
    before = session.download(t)
    for bad in (256, -1, True, 2.0, "0"):
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.memset: value=.* must be a "
            r"byte value, an int from 0 to 255",
        ):
            session.memset(t, bad)
    with pytest.raises(tf.ValidationError, match=r"^session\.memset: dst: x is read-only"):
        session.memset(session.tensor(t), 0)
    with pytest.raises(tf.ValidationError, match=r"^session\.memset: dst: x has non-compact"):
        session.memset(view[::2], 0)
    np.testing.assert_array_equal(session.download(t), before)  # nothing changed


@pytest.mark.gpu
def test_memory_is_given_back_and_the_default_pool_left_alone(device):
    from tenferro import _driver

    with tf.Session(device) as s:
        s.synchronize()
        before_free, _ = _driver.mem_get_info()
        threshold = _driver.default_pool_release_threshold(device)
        for i in range(5000):
            t = s.alloc_output((1 << 16) + 64 * (i % 97), np.float32)  # sizes vary: no reuse
            del t
        s.synchronize()
        assert s.memory_stats()["reserved_bytes"] > 0
    with tf.Session(device) as s:  # the first session trimmed at its end
        assert s.memory_stats()["reserved_bytes"] <= 64 << 20
        after_free, _ = _driver.mem_get_info()
    assert after_free >= before_free - (64 << 20)
    assert _driver.default_pool_release_threshold(device) == threshold


@pytest.mark.gpu
def test_trim_memory_on_request(session):
    big = session.alloc_output((64 << 20) // 4, np.float32)
    del big
    session.synchronize()
    stats = session.memory_stats()
    assert stats["reserved_bytes"] >= 64 << 20 and stats["used_bytes_high"] >= 64 << 20
    session.trim_memory(keep_bytes=0)  # the last value accepted
    assert session.memory_stats()["reserved_bytes"] < 64 << 20
    for bad in (-1, 1.5, "0", True):
        with pytest.raises(tf.ValidationError, match=r"session\.trim_memory: keep_bytes="):
            session.trim_memory(keep_bytes=bad)


@pytest.mark.gpu
def test_a_dropped_small_tensors_block_serves_the_next_one_in_stream_order(session, rng):
    from tenferro import kernels

    x = rng.standard_normal(40).astype(np.float32)  # 160 bytes: a small Tensor
    a = session.upload(x)
    ptr = a.ptr
    del a  # nothing holds it: its block is kept at once, its upload still enqueued
    b = session.alloc_zeros((64,), np.float32)  # 256 bytes: the last size a kept block takes
    assert b.ptr == ptr
    np.testing.assert_array_equal(session.download(b), np.zeros(64, np.float32))  # in order
    kernels.fill(session, b, 2.5)
    total = kernels.sum(session, b)
    assert float(session.download(total)) == 64 * 2.5
    used = session.memory_stats()["used_bytes"]
    del b, total
    session.trim_memory()  # the kept blocks go back to the pool
    session.synchronize()
    assert session.memory_stats()["used_bytes"] < used


@pytest.mark.gpu
def test_large_allocations_fence_so_dropped_owners_go_before_a_synchronize(session):
    import weakref

    from tenferro import kernels
    from tenferro import session as session_module

    n = session_module.FENCE_BYTES // 4 // 2  # two of these fill one fence's byte budget
    refs = []
    for _ in range(2):
        t = session.alloc_output((n,), np.float32)
        kernels.fill(session, t, 1.0)
        refs.append(weakref.ref(t))
        del t
    done = session.record_event()
    done.synchronize()  # the GPU has passed both fills; no session.synchronize
    keep = [session.alloc_output((n,), np.float32) for _ in range(2)]  # crosses the budget
    assert refs[0]() is None, "an owner the GPU has passed must go at the next byte fence"
    del keep


@pytest.mark.parametrize("bad", [256, -1, True, 2.0, "0", None])
def test_memset_refuses_a_value_that_is_not_a_byte_before_it_reads_the_destination(bad):
    from tenferro.memory import memset

    class _Untouched:  # any use of the session or the destination fails the test
        def __getattr__(self, name):
            raise AssertionError(f"memset read {name!r} before refusing the value")

    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.memset: value=.* must be a byte "
        r"value, an int from 0 to 255",
    ):
        memset(_Untouched(), _Untouched(), bad)


def test_memset_writes_the_byte_values_at_both_ends_and_skips_empty_memory(monkeypatch):
    from tenferro import _driver
    from tenferro.memory import memset

    calls = []
    monkeypatch.setattr(
        _driver,
        "memset_d8_async",
        lambda ptr, value, nbytes, stream, op: calls.append((ptr, value, nbytes, stream, op)),
    )
    s = ImportingSession()
    f32 = dtypes.by_name("f32")
    dst = tf.TensorMut(0x2000, (6,), (4,), f32, 0, None, s)
    memset(s, dst)  # the default: zero
    memset(s, dst, 255)  # the last byte value taken
    memset(s, dst, np.uint8(1))
    memset(s, tf.TensorMut(0x3000, (0,), (4,), f32, 0, None, s), 9)  # nothing to set
    assert calls == [
        (0x2000, 0, 24, 7, "session.memset"),
        (0x2000, 255, 24, 7, "session.memset"),
        (0x2000, 1, 24, 7, "session.memset"),
    ]
    (held,) = s.held[0]  # the span set, held until the stream passes
    assert len(s.held) == 4 and (type(held), held.ptr, held.nbytes) == (tf.TensorMut, 0x2000, 24)
    for bad in (256, -1):  # the first values refused on each side
        with pytest.raises(tf.ValidationError, match=rf"^session\.memset: value={bad} must be"):
            memset(s, dst, bad)
    assert len(calls) == 3


def test_alloc_zeros_and_upload_ask_the_driver_for_their_bytes_on_the_stream(monkeypatch):
    from tenferro import memory as tensor_part

    s = MemorySession(monkeypatch)
    z = tensor_part.alloc_zeros(s, (3, 5), np.int16)
    assert (z.shape, z.dtype, z.nbytes) == ((3, 5), np.int16, 30)
    assert s.calls == [
        ("alloc", 256, 7, "session.alloc_zeros"),  # a small Tensor's block
        ("memset", z.ptr, 0, 30, 7, "session.alloc_zeros"),
    ]
    s.calls.clear()
    host = np.float32(2.5) * np.ones((), np.float32)  # 0-d stays 0-d
    t = tensor_part.upload(s, np.asarray(host))
    assert t.shape == () and t.dtype == np.float32 and s.allocated == 34
    assert s.calls[0] == ("alloc", 256, 7, "session.upload")
    assert (
        s.calls[1][0] == "htod"
        and s.calls[1][1] == t.ptr
        and s.calls[1][3:] == (4, 7, "session.upload")
    )
    assert len(s.held) == 1 and s.held[0].shape == ()  # the host copy, until the stream passes
    capturing = MemorySession(monkeypatch, capturing=True)
    with pytest.raises(
        tf.RuntimeStateError,
        match=r"^session\.upload: not allowed during "
        r"s\.capture\(\): host copies cannot be "
        r"captured; upload before the capture",
    ):
        tensor_part.upload(capturing, np.ones(3))
    assert capturing.calls == []
    del z, t  # freed on the stream, in order


def test_a_small_tensors_block_is_kept_for_the_next_small_one_and_trim_frees_it(monkeypatch):
    from tenferro import memory as tensor_part
    from tenferro._liveness import SPARE_BLOCK_BYTES

    s = MemorySession(monkeypatch)
    last = tensor_part.alloc_output(s, (SPARE_BLOCK_BYTES // 4,), np.float32)  # the last fit
    past = tensor_part.alloc_output(s, (SPARE_BLOCK_BYTES + 1,), np.uint8)  # the first past it
    assert s.calls == [
        ("alloc", SPARE_BLOCK_BYTES, 7, "session.alloc_output"),
        ("alloc", SPARE_BLOCK_BYTES + 1, 7, "session.alloc_output"),
    ]
    assert last.context is s.context and past.context is s.context  # what __del__ frees through
    kept, freed = last.ptr, past.ptr
    s.calls.clear()
    del last, past
    assert s.calls == [("free", freed, 7)] and s.spare == [kept]  # kept, not freed
    s.calls.clear()
    again = tensor_part.alloc_zeros(s, (3,), np.int16)
    assert again.ptr == kept and s.calls == [("memset", kept, 0, 6, 7, "session.alloc_zeros")]
    del again
    full = tensor_part.alloc_output(s, (SPARE_BLOCK_BYTES,), np.uint8)  # a block's size exactly
    assert full.ptr == kept and s.calls == [("memset", kept, 0, 6, 7, "session.alloc_zeros")]
    del full
    s.calls.clear()
    tensor_part.trim_memory(s, 0)
    assert s.calls == [("free", kept, 7), ("trim", 0, "session.trim_memory")]


@pytest.mark.parametrize("shape", [(3, 0), (0,), (), [2, 3], (np.int64(2), 3), 5])
def test_a_shape_of_ints_at_least_zero_is_taken(monkeypatch, shape):
    from tenferro import memory as tensor_part

    t = tensor_part.alloc_output(MemorySession(monkeypatch), shape, np.float32)
    assert t.shape == ((5,) if shape == 5 else tuple(int(d) for d in shape))
    assert all(type(d) is int for d in t.shape)


@pytest.mark.parametrize("shape", [(3, -1), (-1,), (2, True), (2.0,), "ab", None])
def test_a_shape_with_a_negative_or_a_non_int_is_refused(monkeypatch, shape):
    from tenferro import memory as tensor_part

    s = MemorySession(monkeypatch)
    with pytest.raises(tf.ValidationError, match=r"^session\.alloc_output: shape="):
        tensor_part.alloc_output(s, shape, np.float32)
    assert s.calls == [] and s.allocated == 0


def test_a_dtype_of_none_is_refused_not_read_as_float64(monkeypatch):
    from tenferro import memory as tensor_part

    s = MemorySession(monkeypatch)
    with pytest.raises(tf.ValidationError, match=r"^session\.alloc_output: dtype=None; give "):
        tensor_part.alloc_output(s, (4,), None)
    assert s.calls == [] and s.allocated == 0


def test_a_tensor_of_a_type_numpy_lacks_is_allocated_from_its_scalar_type(monkeypatch):
    from tenferro import dtypes
    from tenferro import memory as tensor_part

    bf16 = dtypes.by_name("bf16")  # what a ready kernel passes for a bf16 temporary
    t = tensor_part.alloc_output(MemorySession(monkeypatch), (3, 5), bf16)
    assert t.scalar_type is bf16 and t.nbytes == 30 and t.strides == (10, 2)


class _PeerSession:
    """A session on a stand-in device for copy_peer: a real PrimaryContext (made from
    `TwoDevices`), its stream a number, its holds a list."""

    fast_path_ok, faulted, is_open = False, False, True

    def __init__(self, context, stream):
        import threading
        from types import SimpleNamespace

        self.context, self.device, self.stream = context, context.ordinal, stream
        self.thread = threading.get_ident()
        self.ordering = SimpleNamespace(pending=[], in_order_with=frozenset((stream,)))
        self.liveness, self.held = self, []

    def check_use(self, op):
        pass

    def refuse_in_capture(self, op, why):
        pass

    def hold(self, obj):
        self.held.append(obj)


def test_copy_peer_orders_after_the_source_enables_peer_access_once_and_copies(monkeypatch):
    from _stand_ins import TwoDevices

    from tenferro import _driver, dtypes
    from tenferro import memory as tensor_part
    from tenferro.spans import TensorMut, TensorRef

    devices = TwoDevices(monkeypatch)
    asked = devices.asked
    monkeypatch.setattr(_driver, "event_create", lambda: asked.append(("event",)) or 0xE0)
    monkeypatch.setattr(_driver, "wait_for_stream", lambda *a: asked.append(("wait", *a)))
    monkeypatch.setattr(_driver, "event_destroy", lambda ev: asked.append(("destroy", ev)))
    monkeypatch.setattr(_driver, "memcpy_peer_async", lambda *a: asked.append(("copy", *a)))
    s, other = _PeerSession(devices.contexts[0], 7), _PeerSession(devices.contexts[1], 9)
    f32, owner = dtypes.by_name("f32"), object()
    dst = TensorMut.compact(0x10000, (4,), (4,), f32, 16, 0, None, s)
    src = TensorRef.compact(0x20000, (4,), (4,), f32, 16, 1, owner, other)
    op = "session.copy_peer"
    tensor_part.copy_peer(s, dst, src)
    assert asked == [
        ("push", 0xC1),
        ("event",),
        ("wait", 7, 9, 0xE0, op),
        ("destroy", 0xE0),
        ("pop",),  # the event is the source context's, recorded on its stream
        ("can", 0xD0, 0xD1),
        ("enable", 0xC1, 0),  # this context reaches device 1
        ("copy", 0x10000, 0xC0, 0x20000, 0xC1, 16, 7, op),
    ]
    ((d, held),) = s.held
    assert (d.ptr, d.nbytes, held) == (0x10000, 16, owner)
    asked.clear()
    tensor_part.copy_peer(s, dst, src)
    assert [a[0] for a in asked] == ["push", "event", "wait", "destroy", "pop", "copy"]  # once
