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
