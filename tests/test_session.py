import threading

import numpy as np
import pytest

import tenferro as tf
from tenferro import _driver


def _gpu_reason():
    try:
        _driver.ensure_init()
        if _driver.device_count() == 0:
            return "the CUDA driver sees no GPU"
    except tf.RuntimeStateError as exc:
        return str(exc)
    return None


@pytest.fixture
def session():
    reason = _gpu_reason()
    if reason:
        pytest.skip(f"needs a GPU: {reason}")
    with tf.Session(device=0) as s:
        yield s


AXPY = r'''
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void add2d(double* out, const double* a, const double* b,
                                 unsigned rows, unsigned cols) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) out[r * cols + c] = a[r * cols + c] * 2.0 + b[r * cols + c];
}
'''


def test_session_without_gpu_is_a_clear_error():
    if _gpu_reason() is None:
        pytest.skip("a GPU is present; this checks its absence")
    with pytest.raises(tf.RuntimeStateError, match=r"session: "):
        with tf.Session(device=0):
            pass


def test_session_refuses_bad_device_argument():
    with pytest.raises(tf.ValidationError, match=r"Session: device=-1"):
        tf.Session(device=-1)


@pytest.mark.gpu
def test_axpy_matches_numpy(session, rng):
    n = 100_003
    x, y0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a = float(rng.standard_normal())
    fn = session.compile(AXPY).function("axpy")
    y = session.upload(y0)
    session.launch(fn, tf.LaunchConfig.flat(n, 256),
                   [y, session.readonly(session.upload(x)), tf.f32(a), tf.u32(n)])
    out = session.download(y)
    ref = np.float32(a).astype(np.float64) * x.astype(np.float64) + y0
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_2d_kernel_writes_every_element(session, rng):
    rows, cols = 67, 131
    a, b = rng.standard_normal((rows, cols)), rng.standard_normal((rows, cols))
    out = session.upload(np.full((rows, cols), np.nan))  # poison: unwritten stays NaN
    fn = session.compile(AXPY).function("add2d")
    cfg = tf.LaunchConfig(((cols + 15) // 16, (rows + 15) // 16), (16, 16))
    session.launch(fn, cfg, [out, session.readonly(session.upload(a)),
                             session.readonly(session.upload(b)), rows, cols])
    np.testing.assert_allclose(session.download(out), a * 2.0 + b, rtol=0, atol=1e-12)


@pytest.mark.gpu
def test_launch_refusals_on_device(session):
    fn = session.compile(AXPY).function("axpy")
    y = session.alloc_zeros(64, np.float32)
    with pytest.raises(tf.ValidationError,
                       match=r"session\.launch: args\[0\] \(TensorMut\) and args\[1\]"):
        session.launch(fn, tf.LaunchConfig.flat(64), [y, y, tf.f32(1), tf.u32(64)])
    with pytest.raises(tf.ValidationError, match=r"session\.launch: config must be a LaunchConfig"):
        session.launch(fn, [1, 256], [y, y, tf.f32(1), tf.u32(64)])
    with pytest.raises(tf.ValidationError, match=r"module\.function: no kernel named 'nope'.*axpy"):
        session.compile(AXPY).function("nope")


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
    with pytest.raises(tf.RuntimeStateError, match=r"session\.launch: the session is closed"):
        s2.launch(fn, tf.LaunchConfig.flat(4), [])
    with pytest.raises(tf.RuntimeStateError, match=r"session\.synchronize: the session is closed"):
        s2.synchronize()
