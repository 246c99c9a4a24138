"""tenferro.kernels.reduce (sum, max) against numpy in float64."""

import numpy as np
import pytest
from _kernel_helpers import SIZES

import tenferro as tf
from tenferro import kernels as k


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_and_max(session, rng, n, dtype):
    x = rng.standard_normal(n)
    xd = session.upload(x.astype(dtype))
    total = session.download(k.sum(session, xd))
    tol = (1e-6 if dtype == np.float32 else 1e-13) * max(1.0, np.abs(x).sum())
    assert abs(float(total) - x.astype(dtype).astype(np.float64).sum()) <= tol
    if n == 0:
        with pytest.raises(tf.ValidationError, match=r"kernels\.max: x is empty"):
            k.max(session, xd)
    else:
        assert float(session.download(k.max(session, xd))) == x.astype(dtype).max()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_skips_nans_and_of_negatives_only_is_the_largest(session, rng, dtype):
    neg = -1.0 - np.abs(rng.standard_normal(5000))  # negatives only: not the first value
    neg[::7] = np.nan
    got = float(session.download(k.max(session, session.upload(neg.astype(dtype)))))
    assert got == np.nanmax(neg.astype(dtype)) and got < -1.0
    one = np.array([-np.inf], dtype)
    assert float(session.download(k.max(session, session.upload(one)))) == -np.inf
    nans = np.full(300, np.nan, dtype)
    assert float(session.download(k.max(session, session.upload(nans)))) == -np.inf
    tiny = np.array([-0.75], dtype)  # one element: one block, its atomic replaces the start
    assert float(session.download(k.max(session, session.upload(tiny)))) == -0.75
    assert float(session.download(k.sum(session, session.upload(tiny)))) == -0.75


def _workspace(session):
    from tenferro.kernels import _build

    return session.download(_build.session_table(session)["workspace"])


@pytest.mark.gpu
def test_the_workspace_grows_with_the_grid_and_is_left_as_found(session, rng):
    small = rng.standard_normal(1000)  # one block: a workspace of two words
    big = rng.standard_normal((1 << 22) + 3)  # the capped grid: a block an SM times 8
    xs, xb = session.upload(small), session.upload(big)
    assert float(session.download(k.sum(session, xs))) == pytest.approx(small.sum(), abs=1e-12)
    assert _workspace(session).shape == (2,) and _workspace(session)[0] == 0
    got = float(session.download(k.sum(session, xb)))  # a larger workspace, made zeroed
    assert abs(got - big.sum()) <= 1e-13 * np.abs(big).sum()
    blocks = session.context.attribute("MULTIPROCESSOR_COUNT") * 8
    ws = _workspace(session)
    assert ws.shape == (1 + blocks,) and ws[0] == 0  # the counter is back at 0
    assert float(session.download(k.max(session, xs))) == small.max()  # the large one serves
    assert _workspace(session).shape == (1 + blocks,)


@pytest.mark.gpu
def test_an_f32_sum_is_the_same_to_the_bit_every_run(session, rng):
    big = rng.standard_normal((1 << 22) + 3).astype(np.float32)
    small = rng.standard_normal(999).astype(np.float32)
    xb, xs = session.upload(big), session.upload(small)
    first = session.download(k.sum(session, xb))
    assert abs(float(first) - big.astype(np.float64).sum()) <= 1e-6 * np.abs(big).sum()
    for _ in range(4):  # interleaved with other grids on the same workspace
        assert session.download(k.sum(session, xb)).tobytes() == first.tobytes()
        assert float(session.download(k.max(session, xs))) == small.max()
        assert (
            abs(float(session.download(k.sum(session, xs))) - small.astype(np.float64).sum())
            <= 1e-6 * np.abs(small).sum()
        )


@pytest.mark.gpu
def test_an_empty_sum_writes_its_zero(session, rng):
    for _ in range(3):  # freed NaN memory the result's allocation may be given
        junk = session.upload(np.full(1, np.nan))
        del junk
        assert float(session.download(k.sum(session, session.upload(np.zeros(0))))) == 0.0


@pytest.mark.gpu
def test_a_closed_session_keeps_no_workspace(device, rng):
    import gc
    import weakref

    from tenferro.kernels import _build

    x = rng.standard_normal(5000)
    with tf.Session(device=device) as s:
        assert float(s.download(k.sum(s, s.upload(x)))) == pytest.approx(x.sum(), abs=1e-12)
        ws = weakref.ref(_build.session_table(s)["workspace"])
        assert ws() is not None
    gc.collect()
    assert ws() is None  # freed at the close, though `s` is still referenced
    assert not _build.session_table(s)
