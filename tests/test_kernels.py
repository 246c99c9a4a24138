"""tenferro.kernels against numpy in float64, on fresh random data, odd and edge sizes."""

import numpy as np
import pytest

import tenferro as tf
from tenferro import kernels as k
from tenferro.kernels import _build, gemm, maps, reduce, rows

SIZES = [0, 1, 31, 33, (1 << 20) + 7]


@pytest.mark.parametrize(("file", "exprs"), [
    ("elementwise.cu", maps._EXPRS), ("reduce.cu", reduce._EXPRS), ("rows.cu", rows._EXPRS),
    ("matmul.cu", gemm._EXPRS), ("matmul_sm90.cu", gemm._WGMMA)])
def test_every_source_compiles_without_a_gpu(file, exprs):
    arch = "sm_90a" if file == "matmul_sm90.cu" else "sm_90"
    r = tf.compile_cuda(_build._source(file), arch=arch, options=["-std=c++17"],
                        name_expressions=list(exprs) or None)
    assert r.image and set(r.lowered_names) == set(exprs)


def test_package_headers_are_inlined_into_the_compiled_source():
    src = _build._source("elementwise.cu")
    assert '#include "pack.cuh"' not in src.splitlines()
    assert src.count("struct alignas(W * sizeof(T)) Pack") == 1


def test_every_kernel_source_is_in_the_wheel():
    import fnmatch
    import os
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["tenferro.kernels"]
    here = os.path.dirname(_build.__file__)
    sources = [n for n in os.listdir(here) if n.endswith((".cu", ".cuh"))]
    assert sources and all(any(fnmatch.fnmatch(n, g) for g in globs) for n in sources), globs


@pytest.mark.parametrize("ctype", ["float", "double"])
def test_generated_fused_map_compiles_without_a_gpu(ctype):
    params = [f"{ctype}* __restrict__ out_", f"const {ctype}* __restrict__ x_", f"{ctype} a",
              f"const {ctype}* __restrict__ y_", "unsigned long long n__"]
    src = maps._fused_source(ctype, params, ["x", "y"], "a * x + sin(y)")
    assert "n__ / 4" in src
    r = tf.compile_cuda(src, arch="sm_90")
    assert r.image


def _poisoned(s, shape, dtype):
    """An output pre-filled with NaN (or a sentinel for ints), so unwritten elements show."""
    dt = np.dtype(dtype)
    fill = np.nan if dt.kind == "f" else np.iinfo(dt).max
    return s.upload(np.full(shape, fill, dtype=dt))


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_fill_axpy_cast(session, rng, n):
    y = _poisoned(session, (n,), np.float32)
    k.fill(session, y, 1.25)
    np.testing.assert_array_equal(session.download(y), np.full(n, 1.25, np.float32))
    x64 = rng.standard_normal(n)
    y64 = rng.standard_normal(n)
    yd = session.upload(y64)
    k.axpy(session, yd, session.upload(x64), -0.5)
    np.testing.assert_allclose(session.download(yd), -0.5 * x64 + y64, rtol=1e-15, atol=1e-15)
    x32 = x64.astype(np.float32)
    h = _poisoned(session, (n,), np.float16)
    k.cast(session, h, session.upload(x32))
    np.testing.assert_array_equal(session.download(h), x32.astype(np.float16))
    back = _poisoned(session, (n,), np.float64)
    k.cast(session, back, session.upload(x32))
    np.testing.assert_array_equal(session.download(back), x32.astype(np.float64))


def _shifted(tensor, n, typestr, itemsize):
    """A view of elements 1..n of ``tensor``: its pointer is off the 4-element vector grid."""
    from conftest import CAI

    ptr = tensor.__cuda_array_interface__["data"][0] + itemsize
    return CAI(ptr, (n,), typestr, keep=tensor)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 33, (1 << 16) + 5])
def test_views_off_the_vector_grid_take_the_scalar_path(session, rng, n):
    x64, y64 = rng.standard_normal(n + 1), rng.standard_normal(n + 1)
    xd, yd = session.upload(x64), session.upload(y64)
    k.axpy(session, _shifted(yd, n, "<f8", 8), _shifted(xd, n, "<f8", 8), 2.5)
    want = y64.copy()
    want[1:] = 2.5 * x64[1:] + y64[1:]
    np.testing.assert_allclose(session.download(yd), want, rtol=1e-15, atol=1e-15)
    out = _poisoned(session, (n + 1,), np.float64)
    k.elementwise(session, "x * y", _shifted(out, n, "<f8", 8), x=_shifted(xd, n, "<f8", 8),
                  y=session.upload(y64[:n]))
    got = session.download(out)
    assert np.isnan(got[0])
    np.testing.assert_allclose(got[1:], session.download(xd)[1:] * y64[:n], rtol=1e-15)
    x32 = session.upload(x64.astype(np.float32))
    h = _poisoned(session, (n + 1,), np.float16)
    k.cast(session, _shifted(h, n, "<f2", 2), _shifted(x32, n, "<f4", 4))
    np.testing.assert_array_equal(session.download(h)[1:], x64[1:].astype(np.float32)
                                  .astype(np.float16))
    k.fill(session, _shifted(x32, n, "<f4", 4), 0.75)
    np.testing.assert_array_equal(session.download(x32)[1:], np.full(n, 0.75, np.float32))
    got = float(session.download(k.sum(session, _shifted(xd, n, "<f8", 8))))
    np.testing.assert_allclose(got, session.download(xd)[1:].sum(), rtol=1e-12)


@pytest.mark.gpu
def test_cast_to_bfloat16_rounds_like_ml_dtypes(session, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal(1000).astype(np.float32) * 100
    out = session.alloc_output((1000,), ml_dtypes.bfloat16)
    k.cast(session, out, session.upload(x))
    np.testing.assert_array_equal(session.download(out).astype(np.float32),
                                  x.astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_fused_elementwise_map(session, rng, n):
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    out = _poisoned(session, (n,), np.float64)
    k.elementwise(session, "a * x + sin(y) * y", out, x=session.upload(x),
                  y=session.upload(y), a=3.0)
    np.testing.assert_allclose(session.download(out), 3.0 * x + np.sin(y) * y, rtol=1e-14,
                               atol=1e-14)


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


# (SOFTMAX_KERNEL, SOFTMAX_REG): every kernel for rows that fit on chip, "split" at each
# compiled register count.
SOFTMAX_KERNELS = [("cached", 8), ("online", 8), *(("split", r) for r in rows.SOFTMAX_REGS)]


@pytest.mark.gpu
@pytest.mark.parametrize(("rows_", "cols"), [
    (1, 1), (31, 33), (1000, 257), (3, 0), (9, 1000),
    (7, 4099),     # row cached in shared memory, one float at a time
    (5, 4096),     # cached, float4 accesses; "split": all in registers
    (7, 4100),     # float4, the last register slots of a row padded
    (4, 16384),    # "split" at 4 registers: half the row in registers, half in shared memory
    (3, 40000),    # "split" with more than 48 KiB (opt-in) of shared memory
    (2, 20001),    # cached above 48 KiB (the opt-in shared memory)
    (3, 70001)])   # beyond the opt-in limit: the three-pass kernel
@pytest.mark.parametrize(("kernel", "reg"), SOFTMAX_KERNELS)
def test_row_softmax(session, rng, monkeypatch, kernel, reg, rows_, cols):
    monkeypatch.setattr(rows, "SOFTMAX_KERNEL", kernel)
    monkeypatch.setattr(rows, "SOFTMAX_REG", reg)
    x = rng.standard_normal((rows_, cols)) * 4
    out = _poisoned(session, (rows_, cols), np.float32)
    k.softmax(session, out, session.upload(x.astype(np.float32)))
    e = np.exp(x - x.max(axis=1, keepdims=True)) if cols else x
    want = e / e.sum(axis=1, keepdims=True) if cols else x
    np.testing.assert_allclose(session.download(out), want, rtol=2e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "reg"), SOFTMAX_KERNELS)
@pytest.mark.parametrize("cols", [257, 4096, 4099, 16384])
def test_row_softmax_with_minus_infinity(session, rng, monkeypatch, kernel, reg, cols):
    monkeypatch.setattr(rows, "SOFTMAX_KERNEL", kernel)
    monkeypatch.setattr(rows, "SOFTMAX_REG", reg)
    x = (rng.standard_normal((6, cols)) * 4).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = -np.inf  # masked entries, as attention masks make them
    x[:, 0] = rng.standard_normal(6)  # every row keeps a finite entry
    out = _poisoned(session, x.shape, np.float32)
    k.softmax(session, out, session.upload(x))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(session.download(out), e / e.sum(axis=1, keepdims=True),
                               rtol=2e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize(("rows_", "cols"), [(1, 1), (31, 33), (33, 31), (1025, 70), (0, 5),
                                             (70, 130), (128, 64)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("tile", rows.TRANSPOSE_TILES)
def test_transpose(session, rng, monkeypatch, tile, rows_, cols, dtype):
    monkeypatch.setattr(rows, "TRANSPOSE_TILE", tile)
    x = (rng.standard_normal((rows_, cols)) * 1000).astype(dtype)
    out = _poisoned(session, (cols, rows_), dtype)
    k.transpose(session, out, session.upload(x))
    np.testing.assert_array_equal(session.download(out), x.T)


def _check_scans(session, rng, n):
    """cumsum of fresh f64, i32 and f32 data of length n against numpy's."""
    x = rng.standard_normal(n)
    out = _poisoned(session, (n,), np.float64)
    k.cumsum(session, out, session.upload(x))
    np.testing.assert_allclose(session.download(out), np.cumsum(x), rtol=1e-10, atol=1e-9)
    xi = rng.integers(-1000, 1000, n, dtype=np.int32)
    oi = _poisoned(session, (n,), np.int32)
    k.cumsum(session, oi, session.upload(xi))
    np.testing.assert_array_equal(session.download(oi), np.cumsum(xi, dtype=np.int32))
    x32 = rng.standard_normal(n).astype(np.float32)
    o32 = _poisoned(session, (n,), np.float32)
    k.cumsum(session, o32, session.upload(x32))
    err = np.abs(session.download(o32) - np.cumsum(x32.astype(np.float64)))
    # f32 partial sums drift like sqrt(i) ulps of the running magnitude (NaN fails too)
    tol = 4e-5 * np.sqrt(np.arange(1, n + 1)) + 1e-5
    assert not (err > tol).any() and not np.isnan(err).any(), (err - tol).max(initial=0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [*SIZES, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 8192 + 1,
                               (1 << 24) + 3])
def test_inclusive_scan(session, rng, n):
    _check_scans(session, rng, n)


@pytest.mark.gpu
@pytest.mark.parametrize("config", rows.SCAN_CONFIGS)
@pytest.mark.parametrize("n", [1, 4097, 8193, 16383, 16385, 300 * 4096 + 5])  # tile edges
def test_inclusive_scan_at_each_tile_and_look_back_width(session, rng, monkeypatch, config, n):
    monkeypatch.setattr(rows, "SCAN_CONFIG", config)
    _check_scans(session, rng, n)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "kk"), [(1, 1, 1), (31, 33, 17), (64, 64, 64),
                                            (130, 257, 100), (256, 128, 512), (5, 7, 0)])
def test_matmul_f32(session, rng, m, n, kk):
    a, b = rng.standard_normal((m, kk)), rng.standard_normal((kk, n))
    out = _poisoned(session, (m, n), np.float32)
    k.matmul(session, out, session.upload(a.astype(np.float32)),
             session.upload(b.astype(np.float32)))
    want = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(session.download(out), want, rtol=1e-4,
                               atol=1e-4 * np.sqrt(max(kk, 1)))


# (kernel, tile): the mma.sync kernel at each compiled tile, and on Hopper the wgmma one.
BF16_KERNELS = [*(("mma.sync", t) for t in gemm.BF16_TILES),
                *(("wgmma", t) for t in gemm.WGMMA_TILES)]


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "tile"), BF16_KERNELS)
@pytest.mark.parametrize(("m", "n", "kk"), [
    (1, 1, 1), (31, 33, 17), (130, 257, 100),  # the any-shape kernel
    (128, 128, 32), (256, 384, 512), (300, 200, 48), (1, 8, 8),  # pipelined: K, N % 8 == 0
    (1000, 520, 1000), (129, 264, 40), (384, 768, 4104)])  # partial tiles on every side
def test_matmul_bf16_on_tensor_cores(session, rng, monkeypatch, kernel, tile, m, n, kk):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if kernel == "wgmma" and session.context.compute_capability != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")
    monkeypatch.setattr(gemm, "WGMMA", kernel == "wgmma")
    monkeypatch.setattr(gemm, "WGMMA_TILE" if kernel == "wgmma" else "BF16_TILE", tile)
    a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)
    out = _poisoned(session, (m, n), np.float32)
    k.matmul(session, out, session.upload(a), session.upload(b))
    want = a.astype(np.float64) @ b.astype(np.float64)  # exact products of the bf16 inputs
    # float32 accumulation of K unit-variance products errs like K ulps at its running
    # magnitude (on the H200 at K=4104: up to 1.9e-3, the same bits from wgmma and mma.sync);
    # a wrong element is off by O(1) and more.
    np.testing.assert_allclose(session.download(out), want, rtol=1e-4,
                               atol=1e-5 * np.sqrt(kk) + 1e-6 * kk)


@pytest.mark.gpu
@pytest.mark.parametrize(("wgmma", "kk"), [(True, 8), (False, 8), (False, 7)])
def test_matmul_refuses_more_rows_than_the_grid_holds(session, monkeypatch, wgmma, kk):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(gemm, "WGMMA", wgmma)
    m = 65535 * 128 + 1  # one row past the grid's y extent at 128-row tiles
    a = session.alloc_output((m, kk), ml_dtypes.bfloat16)
    b = session.alloc_output((kk, 8), ml_dtypes.bfloat16)
    out = session.alloc_output((m, 8), np.float32)
    with pytest.raises(tf.ValidationError, match=rf"kernels\.matmul: M={m} is above 8388480"):
        k.matmul(session, out, a, b)


@pytest.mark.gpu
def test_session_compile_refuses_another_architecture(session):
    major, minor = session.context.compute_capability
    other = "sm_80" if (major, minor) != (8, 0) else "sm_90"
    with pytest.raises(tf.ValidationError,
                       match=rf"session\.compile: arch='{other}' is not this device's "
                             rf"architecture \(sm_{major}{minor}, "):
        session.compile("extern \"C\" __global__ void f() {}", arch=other)


@pytest.mark.gpu
def test_entry_points_refuse_bad_input(session):
    f32 = session.upload(np.ones(8, np.float32))
    f64 = session.upload(np.ones(8, np.float64))
    i32 = session.upload(np.ones(8, np.int32))
    ro = session.tensor(f32)
    cases = [
        (lambda: k.axpy(session, f32, f64, 1.0), tf.ValidationError,
         r"kernels\.axpy: inputs\[0\] is f64, out is f32"),
        (lambda: k.axpy(session, i32, i32, 1), tf.ValidationError,
         r"kernels\.axpy: y is i32; axpy takes"),
        (lambda: k.axpy(session, f32, session.upload(np.ones(9, np.float32)), 1.0),
         tf.ValidationError, r"kernels\.axpy: inputs\[0\] has 9 elements, out has 8"),
        (lambda: k.fill(session, i32, 2**40), tf.ValidationError, r"out of range|outside"),
        (lambda: k.fill(session, f32, "x"), tf.ValidationError,
         r"kernels\.fill: value='x' must be a number"),
        (lambda: k.fill(session, ro, 1.0), tf.ValidationError, r"read-only"),
        (lambda: k.cast(session, i32, f64), tf.ValidationError,
         r"kernels\.cast: f64 -> i32 is not provided"),
        (lambda: k.elementwise(session, "x + z", f32, x=f32), tf.ValidationError,
         r"kernels\.elementwise: expr uses 'z'"),
        (lambda: k.elementwise(session, "x +", session.upload(np.ones(8, np.float32)), x=f32),
         tf.CompileError, r"kernels\.elementwise: expr 'x \+' did not compile"),
        (lambda: k.softmax(session, f32, f32), tf.ValidationError,
         r"kernels\.softmax: x must be 2-D"),
        (lambda: k.transpose(session, session.upload(np.ones((2, 4), np.float32)),
                             session.upload(np.ones((2, 4), np.float32))),
         tf.ValidationError, r"kernels\.transpose: out must be f32\(4, 2\)"),
        (lambda: k.cumsum(session, f64, f32), tf.ValidationError,
         r"kernels\.cumsum: x must be 1-D and out of its shape and dtype"),
        (lambda: k.matmul(session, session.upload(np.ones((2, 2), np.float32)),
                          session.upload(np.ones((2, 3), np.float32)),
                          session.upload(np.ones((2, 2), np.float32))),
         tf.ValidationError, r"kernels\.matmul: a\(2, 3\) @ b\(2, 2\) needs"),
        (lambda: k.max(session, i32), tf.ValidationError, r"kernels\.max: x is i32"),
        (lambda: k.sum(session, np.ones(3)), tf.ValidationError, r"host memory"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()
