"""tenferro.kernels.maps (fill, cast, axpy, the fused map) against numpy in float64."""

import numpy as np
import pytest
from _kernel_helpers import SIZES, poisoned, shifted

import tenferro as tf
from tenferro import kernels as k
from tenferro.kernels import maps


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_generated_fused_map_compiles_without_a_gpu(ctype):
    params = [
        f"{ctype}* __restrict__ out_",
        f"const {ctype}* __restrict__ x_",
        f"{ctype} a",
        f"const {ctype}* __restrict__ y_",
        "unsigned long long n__",
    ]
    src = maps._fused_source(ctype, params, ["x", "y"], "a * x + sin(y)")
    assert "n__ / 4" in src
    r = tf.compile_cuda(src, arch="sm_90")
    assert r.image


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_fill_axpy_cast(session, rng, n):
    y = poisoned(session, (n,), np.float32)
    k.fill(session, y, 1.25)
    np.testing.assert_array_equal(session.download(y), np.full(n, 1.25, np.float32))
    x64 = rng.standard_normal(n)
    y64 = rng.standard_normal(n)
    yd = session.upload(y64)
    k.axpy(session, yd, session.upload(x64), -0.5)
    np.testing.assert_allclose(session.download(yd), -0.5 * x64 + y64, rtol=1e-15, atol=1e-15)
    x32 = x64.astype(np.float32)
    h = poisoned(session, (n,), np.float16)
    k.cast(session, h, session.upload(x32))
    np.testing.assert_array_equal(session.download(h), x32.astype(np.float16))
    back = poisoned(session, (n,), np.float64)
    k.cast(session, back, session.upload(x32))
    np.testing.assert_array_equal(session.download(back), x32.astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 33, (1 << 16) + 5])
def test_views_off_the_vector_grid_take_the_scalar_path(session, rng, n):
    x64, y64 = rng.standard_normal(n + 1), rng.standard_normal(n + 1)
    xd, yd = session.upload(x64), session.upload(y64)
    k.axpy(session, shifted(yd, n, "<f8", 8), shifted(xd, n, "<f8", 8), 2.5)
    want = y64.copy()
    want[1:] = 2.5 * x64[1:] + y64[1:]
    np.testing.assert_allclose(session.download(yd), want, rtol=1e-15, atol=1e-15)
    out = poisoned(session, (n + 1,), np.float64)
    k.elementwise(
        session,
        "x * y",
        shifted(out, n, "<f8", 8),
        x=shifted(xd, n, "<f8", 8),
        y=session.upload(y64[:n]),
    )
    got = session.download(out)
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], session.download(xd)[1:] * y64[:n], rtol=1e-15)
    x32 = session.upload(x64.astype(np.float32))
    h = poisoned(session, (n + 1,), np.float16)
    k.cast(session, shifted(h, n, "<f2", 2), shifted(x32, n, "<f4", 4))
    np.testing.assert_array_equal(
        session.download(h)[1:], x64[1:].astype(np.float32).astype(np.float16)
    )
    k.fill(session, shifted(x32, n, "<f4", 4), 0.75)
    np.testing.assert_array_equal(session.download(x32)[1:], np.full(n, 0.75, np.float32))
    got = float(session.download(k.sum(session, shifted(xd, n, "<f8", 8))))
    np.testing.assert_allclose(got, session.download(xd)[1:].sum(), rtol=1e-12)


@pytest.mark.gpu
def test_cast_to_bfloat16_rounds_like_ml_dtypes(session, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal(1000).astype(np.float32) * 100
    out = session.alloc_output((1000,), ml_dtypes.bfloat16)
    k.cast(session, out, session.upload(x))
    np.testing.assert_array_equal(
        session.download(out).astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_fused_elementwise_map(session, rng, n):
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    out = poisoned(session, (n,), np.float64)
    k.elementwise(
        session, "a * x + sin(y) * y", out, x=session.upload(x), y=session.upload(y), a=3.0
    )
    np.testing.assert_allclose(
        session.download(out), 3.0 * x + np.sin(y) * y, rtol=1e-14, atol=1e-14
    )


@pytest.mark.gpu
def test_an_expression_again_with_new_values_and_an_operand_turned_array(session, rng):
    n = 3001
    x, y, a = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    xd, yd, ad = session.upload(x), session.upload(y), session.upload(a)
    out = poisoned(session, (n,), np.float64)
    for scale in (3.0, -0.5):  # the kernel found again; the scalar is this call's
        k.elementwise(session, "a * x + y", out, x=xd, y=yd, a=scale)
        np.testing.assert_allclose(session.download(out), scale * x + y, rtol=1e-14, atol=1e-14)
    out2 = poisoned(session, (n,), np.float64)
    k.elementwise(session, "a * x + y", out2, x=xd, y=yd, a=ad)  # `a` an array: its own kernel
    np.testing.assert_allclose(session.download(out2), a * x + y, rtol=1e-14, atol=1e-14)
    before = session.download(out)
    with pytest.raises(tf.ValidationError, match=r"^kernels\.elementwise: expr uses 'b'"):
        k.elementwise(session, "a * x + b", out, x=xd, a=2.0)  # refused every time asked
    with pytest.raises(tf.ValidationError, match=r"^kernels\.elementwise: expr uses 'b'"):
        k.elementwise(session, "a * x + b", out, x=xd, a=2.0)
    np.testing.assert_array_equal(session.download(out), before)  # nothing written


class _CompilingSession:
    """What `_fused_function` asks of a session, without a GPU: NVRTC compiles the kernel."""

    def __init__(self):
        self.sources = []

    def resource(self, key, init):
        return init(self)

    def compile(self, src):
        self.sources.append(src)
        tf.compile_cuda(src, cache=False)  # the generated kernel compiles
        return self

    def function(self, name):
        return name


@pytest.mark.parametrize(
    "expr",
    ["2.0f * x + 1e-3", "x * 0x10 + 10u", "(float)x / 3.f", "max(x, 0.5f) + min(y, .25)"],
)
def test_an_expression_with_literals_casts_and_min_max_is_taken(expr):
    from tenferro import dtypes
    from tenferro.kernels import maps

    s = _CompilingSession()
    fn = maps._fused_function(
        s, "kernels.elementwise", expr, dtypes.by_name("f32"), ["x", "y"], (False, False)
    )
    assert fn == "fused_map" and expr in s.sources[0]


@pytest.mark.parametrize(("expr", "name"), [("x * e", "e"), ("x + f1", "f1"), ("sinh(y) + q", "q")])
def test_a_name_that_is_no_operand_is_still_refused_beside_literals(expr, name):
    from tenferro import dtypes
    from tenferro.kernels import maps

    s = _CompilingSession()
    with pytest.raises(tf.ValidationError, match=rf"^kernels\.elementwise: expr uses '{name}', "):
        maps._fused_function(
            s, "kernels.elementwise", expr, dtypes.by_name("f32"), ["x", "y"], (False, False)
        )
    assert s.sources == []  # refused before anything compiled


@pytest.mark.parametrize("name", ["float", "min"])
def test_an_operand_named_as_a_type_or_function_is_refused(name):
    from tenferro import dtypes
    from tenferro.kernels import maps

    with pytest.raises(tf.ValidationError, match=rf"operand name '{name}' is not usable"):
        maps._fused_function(
            _CompilingSession(),
            "kernels.elementwise",
            f"{name} + 1",
            dtypes.by_name("f32"),
            [name],
            (False,),
        )


class _DeviceScalar:
    """A 0-d array on the device, as torch, CuPy and tf.Tensor present one."""

    dtype, ndim = np.dtype(np.float32), 0
    __cuda_array_interface__ = property(lambda self: {})


class _DLPackScalar:
    dtype, ndim = np.dtype(np.float32), 0

    def __dlpack__(self, stream=None):
        raise AssertionError("not read here")


@pytest.mark.parametrize(
    ("value", "scalar"),
    [
        (2.0, True),
        (3, True),
        (np.float32(2.0), True),
        (np.array(2.0), True),  # a 0-d host array: a value
        (_DeviceScalar(), False),  # a 0-d device array: an array of one element
        (_DLPackScalar(), False),
        (np.ones(3), False),
    ],
)
def test_a_0d_device_array_is_an_array_operand_and_a_host_number_a_scalar(value, scalar):
    from tenferro.kernels import maps

    assert maps._is_scalar(value) is scalar
