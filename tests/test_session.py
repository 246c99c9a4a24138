import re
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
from _sources import AXPY
from conftest import gpu_reason

import tenferro as tf
from tenferro import _driver
from tenferro.session import state_of


def test_session_without_gpu_is_a_clear_error():
    if gpu_reason() is None:
        pytest.skip("a GPU is present; this checks its absence")
    with pytest.raises(tf.RuntimeStateError, match=r"session: "):
        with tf.Session(device=0):
            pass


def test_session_refuses_bad_arguments():
    with pytest.raises(tf.ValidationError, match=r"Session: device=-1"):
        tf.Session(device=-1)
    with pytest.raises(tf.ValidationError, match=r"Session: stream='fast'"):
        tf.Session(stream="fast")
    with pytest.raises(tf.ValidationError, match=r"Session: stream=-3"):
        tf.Session(stream=-3)


@pytest.mark.gpu
def test_axpy_matches_numpy(session, rng):
    n = 100_003
    x, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a = float(rng.standard_normal())
    fn = session.compile(AXPY).function("axpy")
    y = session.upload(y0)
    assert isinstance(y, tf.Tensor) and y.shape == (n,) and y.dtype == np.float32
    session.launch(
        fn,
        tf.LaunchConfig.flat(n, 256),
        [session.tensor_mut(y), session.tensor(session.upload(x)), tf.f32(a), tf.u32(n)],
    )
    out = session.download(y)
    ref = np.float32(a).astype(np.float64) * x.astype(np.float64) + y0
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_a_loop_of_fresh_spans_of_the_same_tensors_is_checked_once_and_computes(
    session, rng, monkeypatch
):
    from tenferro.args import ParamBlock

    n = 4099
    x0, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    fn = session.compile(AXPY).function("axpy")
    x, y = session.upload(x0), session.upload(y0)
    cfg = tf.LaunchConfig.flat(n, 256)
    packs = []
    pack = ParamBlock.pack
    monkeypatch.setattr(ParamBlock, "pack", lambda block, *a: packs.append(a[0]) or pack(block, *a))
    block = fn.param_block  # a launch that found new arguments packs through its pack_new
    pack_new = block.pack_new
    block.pack_new = lambda *a: packs.append(a[0]) or pack_new(*a)
    for _ in range(3):  # as the README writes it: spans and scalars made on every call
        session.launch(fn, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(n)])
    session.launch(fn, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(-1.5), tf.u32(n)])
    assert len(packs) == 2  # the first launch and the new value; the same objects between
    want = y0.astype(np.float64) + 6.0 * x0 - 1.5 * x0
    np.testing.assert_allclose(session.download(y), want, rtol=1e-5, atol=1e-5)
    session.launch(fn, cfg, [session.tensor_mut(y), session.tensor(x), tf.f32(2.0), tf.u32(n)])
    assert len(packs) == 3  # 2.0 again after -1.5: checked and packed again
    np.testing.assert_allclose(session.download(y), want + 2.0 * x0, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_2d_kernel_writes_every_element(session, rng):
    rows, cols = 67, 131
    a, b = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))
    out = session.upload(np.full((rows, cols), np.nan))  # poison: unwritten stays NaN
    fn = session.compile(AXPY).function("add2d")
    cfg = tf.LaunchConfig(((cols + 15) // 16, (rows + 15) // 16), (16, 16))
    session.launch(
        fn,
        cfg,
        [
            session.tensor_mut(out),
            session.tensor(session.upload(a)),
            session.tensor(session.upload(b)),
            rows,
            cols,
        ],
    )
    np.testing.assert_allclose(session.download(out), a * 2.0 + b, rtol=0, atol=1e-12)


@pytest.mark.gpu
def test_other_thread_and_after_block_are_refused(session):
    errors = []

    def other():
        try:
            session.alloc_zeros(4, np.float32)
        except tf.RuntimeStateError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "session.alloc_zeros" in str(errors[0]) and "thread" in str(errors[0])
    with tf.Session(device=0) as s2:
        fn = s2.compile(AXPY).function("axpy")
        y = s2.alloc_zeros(4, np.float32)
        ev = s2.record_event()
    with pytest.raises(tf.RuntimeStateError, match=r"session\.launch: the session is closed"):
        s2.launch(fn, tf.LaunchConfig.flat(4), [])
    with pytest.raises(tf.RuntimeStateError, match=r"session\.synchronize: the session is closed"):
        s2.synchronize()
    with pytest.raises(tf.RuntimeStateError, match=r"session\.tensor: the session is closed"):
        s2.tensor(y)
    with pytest.raises(tf.RuntimeStateError, match=r"module\.function: the session is closed"):
        fn.module.function("axpy")
    with pytest.raises(tf.RuntimeStateError, match=r"event\.query: the event's session is closed"):
        ev.query()


@pytest.mark.gpu
def test_block_that_raises_still_synchronizes_and_propagates(rng):
    if gpu_reason():
        pytest.skip(gpu_reason())
    x0 = rng.standard_normal(1 << 16)
    with pytest.raises(ZeroDivisionError):
        with tf.Session() as s:
            fn = s.compile(AXPY).function("slow_scale")
            x = s.upload(x0)
            y = s.alloc_output(x0.shape, np.float64)
            s.synchronize()
            s.launch(
                fn,
                tf.LaunchConfig.flat(x0.size),
                [s.tensor_mut(y), s.tensor(x), 3.0, x0.size, 200_000_000],
            )  # ~0.1 s
            t0 = time.perf_counter()
            raise ZeroDivisionError("the user's error")
    waited = time.perf_counter() - t0
    assert not s.is_open
    assert waited > 0.03, f"leaving the block returned after {waited:.4f} s, before the kernel"
    # The Tensor outlives its session: after the block it is synchronized and still readable.
    from numba import cuda

    assert y.__cuda_array_interface__["stream"] is None
    np.testing.assert_array_equal(cuda.as_cuda_array(y).copy_to_host(), 3.0 * x0)


@pytest.mark.gpu
def test_session_on_an_external_stream(rng):
    if gpu_reason():
        pytest.skip(gpu_reason())
    ctx = _driver.PrimaryContext.get(0)
    prev = ctx.make_current()
    stream = _driver.stream_create()
    try:
        x0 = rng.standard_normal(4099).astype(np.float32)
        with tf.Session(device=0, stream=stream) as s:
            assert s.stream == stream
            fn = s.compile(AXPY).function("axpy")
            y = s.upload(x0)
            s.launch(
                fn,
                tf.LaunchConfig.flat(x0.size),
                [s.tensor_mut(y), s.tensor(s.upload(x0)), 2.0, x0.size],
            )
            assert y.__cuda_array_interface__["stream"] == stream
            out = s.download(y)
        np.testing.assert_allclose(out, 3.0 * x0.astype(np.float64), rtol=1e-6)
        _driver.stream_synchronize(stream, "test")  # not destroyed by the session

        class HasStream:
            def __cuda_stream__(self):
                return (0, stream)

        with tf.Session(stream=HasStream()) as s:
            assert s.stream == stream
    finally:
        _driver.stream_destroy(stream)
        _driver.set_current(prev)


@pytest.mark.gpu
def test_the_sessions_stream_is_blocking_and_knows_the_streams_ordered_with_it(device):
    # Its own stream and the legacy default stream (torch's, CuPy's, numba's unless told
    # otherwise) wait for each other in the driver; a non-blocking stream with nothing else.
    from cuda.bindings import driver as cu

    with tf.Session(device=device) as s:
        assert not _driver.stream_is_non_blocking(s.stream, "test")
        assert state_of(s).ordering.in_order_with == {s.stream, 1}
    ctx = _driver.PrimaryContext.get(device)
    prev = ctx.make_current()
    err, non_blocking = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert err == cu.CUresult.CUDA_SUCCESS
    non_blocking, blocking = int(non_blocking), _driver.stream_create()
    try:
        assert _driver.stream_is_non_blocking(non_blocking, "test")
        for stream, want in (
            (non_blocking, {non_blocking}),
            (blocking, {blocking, 1}),
            (1, {1}),
            (2, {2, 1}),
        ):
            with tf.Session(device=device, stream=stream) as s:
                assert state_of(s).ordering.in_order_with == want, stream
    finally:
        _driver.stream_destroy(blocking)
        _driver.stream_destroy(non_blocking)
        _driver.set_current(prev)


FAULT_SCRIPT = r'''
import numpy as np, tenferro as tf
SRC = r"""extern "C" __global__ void bad(float* p) { p[threadIdx.x + (1ull << 40)] = 1.0f; }"""
with tf.Session() as s:
    fn = s.compile(SRC).function("bad")
    s.launch(fn, tf.LaunchConfig(1, 32), [s.tensor_mut(s.alloc_zeros(32, np.float32))])
    try:
        s.synchronize()
    except tf.KernelFault as exc:
        print("FAULT", exc.result_name, exc.launches)
    try:
        s.alloc_zeros(4, np.float32)
    except tf.KernelFault as exc:
        print("REFUSED", exc)
'''


@pytest.mark.gpu
def test_kernel_fault_is_reported_and_stops_the_session():
    if gpu_reason():
        pytest.skip(gpu_reason())
    # A fault poisons the process's context, so it runs in a child process.
    r = subprocess.run(
        [sys.executable, "-c", FAULT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert re.search(r"FAULT\W+CUDA_ERROR_ILLEGAL_ADDRESS\W+\('bad',\)", r.stdout), (
        r.stdout + r.stderr
    )
    assert re.search(r"REFUSED\W+session\.alloc_zeros: an earlier kernel fault", r.stdout), r.stdout


class _StreamObj:
    def __init__(self, ret):
        self.ret = ret

    def __cuda_stream__(self):
        return self.ret


@pytest.mark.parametrize(
    "ret",
    [
        ("x", 0),
        (1, 0x1000),
        (-1, 0x1000),
        (0, -5),
        (0, 1 << 64),
        (0, "0x10"),
        (0, 0x10, 0),
        [0, 0x10],
        None,
        (True, 0x10),
        (0.0, 0x10),
    ],
    ids=repr,
)
def test_session_refuses_malformed_cuda_stream(ret):
    with pytest.raises(
        tf.ValidationError,
        match=r"Session: stream\.__cuda_stream__\(\) returned .*; expected "
        r"\(0, handle\)",
    ):
        tf.Session(stream=_StreamObj(ret))


def test_session_keeps_the_stream_object_alive():
    import gc

    obj = _StreamObj((0, 0x10))  # the largest protocol version accepted is 0
    s = tf.Session(stream=obj)
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is not None and s.is_open is False
    del s
    gc.collect()
    assert ref() is None


FAULT_THROUGH = r'''
import sys, numpy as np, tenferro as tf
how = sys.argv[1]
SRC = r"""extern "C" __global__ void bad(float* p) { p[threadIdx.x + (1ull << 40)] = 1.0f; }
extern "C" __global__ void ok(float* p) { p[threadIdx.x] = 2.0f; }"""
with tf.Session() as s:
    m = s.compile(SRC)
    bad, ok = m.function("bad"), m.function("ok")
    y = s.alloc_zeros(32, np.float32)
    z = s.alloc_zeros(32, np.float32)
    cfg = tf.LaunchConfig(1, 32)
    bound = s.bind(ok, cfg, [s.tensor_mut(z)])
    start = s.record_event()
    s.launch(bad, cfg, [s.tensor_mut(y)])
    end = s.record_event()
    import time; time.sleep(0.5)  # let the fault happen before the next driver call
    calls = {
        "download": lambda: s.download(y),
        "launch": lambda: [s.launch(ok, cfg, [s.tensor_mut(z)]) for _ in range(3)],
        "bound": lambda: [bound() for _ in range(3)],
        "alloc": lambda: s.alloc_zeros(1 << 20, np.float32),
        "upload": lambda: s.upload(np.ones(1 << 20, np.float32)),
        "copy": lambda: s.copy(z, y),
        "event": lambda: end.synchronize(),
        "elapsed": lambda: start.elapsed_ms(end),
        "synchronize": lambda: s.synchronize(),
    }
    try:
        calls[how]()
        print("NO FAULT")
    except tf.KernelFault as exc:
        print("FAULT", exc.result_name, exc.launches)
    try:
        s.tensor(z)
    except tf.KernelFault as exc:
        print("REFUSED", exc)
print("EXITED CLEANLY")
'''


@pytest.mark.gpu
@pytest.mark.parametrize(
    "how",
    ["download", "launch", "bound", "alloc", "upload", "copy", "event", "elapsed", "synchronize"],
)
def test_a_fault_seen_by_any_call_is_named_once_and_stops_the_session(how):
    if gpu_reason():
        pytest.skip(gpu_reason())
    r = subprocess.run(
        [sys.executable, "-c", FAULT_THROUGH, how], capture_output=True, text=True, timeout=120
    )
    out = r.stdout + r.stderr
    assert re.search(r"FAULT CUDA_ERROR_ILLEGAL_ADDRESS \(.*'bad'", r.stdout), out
    assert re.search(r"REFUSED session\.tensor: an earlier kernel fault", r.stdout), out
    # Handled inside the block, the fault is not raised again when the block ends.
    assert "EXITED CLEANLY" in r.stdout and r.returncode == 0, out


def test_a_session_not_yet_entered_refuses_use():
    s = tf.Session()
    for call in (
        lambda: s.upload(np.ones(3)),
        lambda: s.alloc_zeros(3, np.float32),
        lambda: s.tensor(np.ones(3)),
        lambda: s.synchronize(),
        lambda: s.capture().__enter__(),
        lambda: s.timeline().__enter__(),
        lambda: s.range("step").__enter__(),
        lambda: s.stream,
    ):
        with pytest.raises(tf.RuntimeStateError, match=r"session\.\w+: the session is closed"):
            call()
    assert state_of(s).active_timeline is None and repr(s).endswith(", not entered)")


def test_every_method_says_what_it_does_and_takes_the_parts_arguments():
    # The delegates are the parts' own functions: help(s.upload) shows the part's docstring
    # and its arguments without the session.
    import inspect

    names = [n for n in dir(tf.Session) if not n.startswith("_")]
    undocumented = [n for n in names if not (getattr(tf.Session, n).__doc__ or "").strip()]
    assert undocumented == []
    s = tf.Session()
    assert list(inspect.signature(s.upload).parameters) == ["array"]
    assert list(inspect.signature(s.tensor).parameters) == ["x", "dtype", "allow_strided"]
    assert list(inspect.signature(s.compile).parameters) == [
        "source",
        "options",
        "name_expressions",
        "arch",
    ]
    assert (
        "NVRTC" not in (tf.Session.upload.__doc__ or "")
        and "host array" in tf.Session.upload.__doc__
    )


@pytest.mark.parametrize(
    ("name", "args"),
    [("tensor", (np.ones(3),)), ("tensor_mut", (np.ones(3),)), ("launch", (None, None, []))],
)
def test_an_instances_launch_calls_behave_as_the_documented_methods(name, args):
    s = tf.Session(0)  # not entered: every call is refused, with no GPU needed
    call = getattr(s, name)
    assert call.__doc__ == getattr(tf.Session, name).__doc__
    with pytest.raises(tf.RuntimeStateError) as via_instance:
        call(*args)
    with pytest.raises(tf.RuntimeStateError) as via_method:
        getattr(tf.Session, name)(s, *args)
    assert str(via_instance.value) == str(via_method.value)
    assert str(via_instance.value).startswith(f"session.{name}: ")


def test_allow_strided_is_a_keyword_as_the_method_says():
    s = tf.Session(0)
    with pytest.raises(TypeError):
        s.tensor(np.ones(3), None, True)
