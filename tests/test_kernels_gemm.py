"""tenferro.kernels.gemm (matmul: f32, bf16 by mma.sync and wgmma) against numpy in float64."""

from functools import partial

import numpy as np
import pytest
from _kernel_helpers import poisoned

import tenferro as tf
from tenferro import kernels as k
from tenferro.kernels import gemm


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "kk"),
    [(1, 1, 1), (31, 33, 17), (64, 64, 64), (130, 257, 100), (256, 128, 512), (5, 7, 0)],
)
def test_matmul_f32(session, rng, m, n, kk):
    a, b = rng.standard_normal((m, kk)), rng.standard_normal((kk, n))
    out = poisoned(session, (m, n), np.float32)
    k.matmul(
        session, out, session.upload(a.astype(np.float32)), session.upload(b.astype(np.float32))
    )
    want = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(
        session.download(out), want, rtol=1e-4, atol=1e-4 * np.sqrt(max(kk, 1))
    )


# (kernel, tile): the mma.sync kernel at each compiled tile, and on Hopper the wgmma one and the
# TMA one (its tile: the stages and the blocks a cluster).
BF16_KERNELS = [
    *(("mma.sync", t) for t in gemm.BF16_TILES),
    *(("wgmma", t) for t in gemm.WGMMA_TILES),
    *(("tma", t) for t in gemm.TMA_CONFIGS),
]
_TILE_NAMES = {"mma.sync": "BF16_TILE", "wgmma": "WGMMA_TILE", "tma": "TMA_CONFIG"}


def _kernels_run(session, call):
    """The kernels ``call()`` launched, by name, as the session's timeline saw them."""
    with session.timeline() as t:
        call()
    return [launch.kernel for launch in t.launches]


def _tma_kernel(out_type, config=None):
    """The TMA kernel's name at ``config`` (the default's) into ``out_type``, as a timeline
    names it."""
    c_type = {"f32": "float", "bf16": "__nv_bfloat16"}[out_type]
    return "matmul_bf16_tma<{}, {}, {}>".format(c_type, *(config or gemm.TMA_CONFIG))


def _check_bf16_product(got, a, b, out_dtype):
    """``got`` against the float64 product of the bf16 inputs, at the output's precision."""
    kk = a.shape[1]
    want = a.astype(np.float64) @ b.astype(np.float64)  # exact products of the bf16 inputs
    # float32 accumulation of K unit-variance products errs like K ulps at its running
    # magnitude (on the H200 at K=4104: up to 1.9e-3, the same bits from wgmma and mma.sync);
    # a bf16 output adds the rounding of that sum (half a unit in the last of 8 bits); a wrong
    # element is off by O(1) and more.
    atol = 1e-5 * np.sqrt(kk) + 1e-6 * kk
    rtol = 1e-4 if out_dtype == np.float32 else 2.0**-8
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "tile"), BF16_KERNELS)
@pytest.mark.parametrize(
    ("m", "n", "kk"),
    [
        (1, 1, 1),
        (31, 33, 17),
        (130, 257, 100),  # the any-shape kernel
        (128, 128, 32),
        (256, 384, 512),
        (300, 200, 48),
        (1, 8, 8),  # pipelined: K, N % 8 == 0
        (1000, 520, 1000),
        (129, 264, 40),
        (384, 768, 4104),
        (4160, 2304, 72),  # more 128 x 256 tiles (297) than SMs: blocks take several in turn
    ],
)  # partial tiles on every side
@pytest.mark.parametrize("out_type", ["f32", "bf16"])
def test_matmul_bf16_on_tensor_cores(session, rng, monkeypatch, kernel, tile, m, n, kk, out_type):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if kernel != "mma.sync" and session.context.compute_capability != (9, 0):
        pytest.skip(f"{kernel} needs compute capability 9.0")
    monkeypatch.setattr(gemm, "WGMMA", kernel != "mma.sync")
    monkeypatch.setattr(gemm, "TMA", kernel == "tma")
    monkeypatch.setattr(gemm, _TILE_NAMES[kernel], tile)
    out_dtype = np.float32 if out_type == "f32" else ml_dtypes.bfloat16
    a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)
    out = poisoned(session, (m, n), out_dtype)
    da, db = session.upload(a), session.upload(b)
    ran = _kernels_run(session, lambda: k.matmul(session, out, da, db))
    _check_bf16_product(session.download(out), a, b, out_dtype)
    # The TMA cases are the TMA kernel's, at the tile asked, wherever K and N let it (uploads
    # are 16-byte aligned); elsewhere no TMA kernel runs.
    if kernel == "tma" and kk % 8 == 0 and n % 8 == 0:
        assert ran == [_tma_kernel(out_type, tile)]
    else:
        assert not any(name.startswith("matmul_bf16_tma") for name in ran)


@pytest.mark.gpu
@pytest.mark.parametrize("out_type", ["f32", "bf16"])
def test_matmul_with_k_zero_zeroes_out_of_either_type(session, out_type):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    out_dtype = np.float32 if out_type == "f32" else ml_dtypes.bfloat16
    a = session.upload(np.zeros((5, 0), ml_dtypes.bfloat16))  # as test_matmul_f32's (5, 7, 0)
    b = session.upload(np.zeros((0, 8), ml_dtypes.bfloat16))
    out = poisoned(session, (5, 8), out_dtype)
    k.matmul(session, out, a, b)
    got = session.download(out)
    assert got.dtype == out_dtype and (got.astype(np.float64) == 0.0).all()


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("a_type", "out_type", "accepted"),
    [
        ("bf16", "bf16", True),
        ("bf16", "f16", False),
        ("f32", "f32", True),
        ("f32", "bf16", False),
    ],
)
def test_matmul_takes_a_bf16_out_for_bf16_factors_only(session, rng, a_type, out_type, accepted):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    types = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
    a = rng.standard_normal((40, 16)).astype(types[a_type])
    b = rng.standard_normal((16, 24)).astype(types[a_type])
    out = poisoned(session, (40, 24), types[out_type])
    if accepted:
        k.matmul(session, out, session.upload(a), session.upload(b))
        got = session.download(out).astype(np.float64)
        want = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=1e-4)
        return
    shape = r"\(40, 24\)"
    want = f"f32{shape} or bf16{shape}" if a_type == "bf16" else f"f32{shape}"
    with pytest.raises(
        tf.ValidationError,
        match=rf"kernels\.matmul: out must be {want} for {a_type} a and b, got {out_type}{shape}",
    ):
        k.matmul(session, out, session.upload(a), session.upload(b))
    assert np.isnan(session.download(out).astype(np.float64)).all()  # nothing written


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [16, 8])
def test_the_tma_matmul_takes_an_out_on_16_bytes_and_the_copying_kernel_one_on_8(
    session, rng, offset
):
    # TMA stores the output too, so it needs out 16-byte aligned; out on 8 bytes takes the
    # Hopper kernel that copies b first, right as well, but it allocates (no capture).
    from conftest import CAI

    ml_dtypes = pytest.importorskip("ml_dtypes")
    if session.context.compute_capability != (9, 0):
        pytest.skip("the TMA kernel needs compute capability 9.0")
    m, n, kk = 136, 264, 72
    a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)
    da, db = session.upload(a), session.upload(b)
    buf = poisoned(session, (m * n + 4,), np.float32)
    ptr = buf.__cuda_array_interface__["data"][0] + offset
    out = CAI(ptr, (m, n), "<f4", keep=buf)
    ran = _kernels_run(session, lambda: k.matmul(session, out, da, db))
    got = session.download(buf)[offset // 4 : offset // 4 + m * n].reshape(m, n)
    _check_bf16_product(got, a, b, np.float32)
    assert (ran == [_tma_kernel("f32")]) == (offset == 16)
    if offset == 16:
        with session.capture() as cap:
            k.matmul(session, out, da, db)
        assert cap.graph is not None
    else:
        with pytest.raises(tf.RuntimeStateError, match=r"not allowed during s\.capture\(\)"):
            with session.capture():
                k.matmul(session, out, da, db)


@pytest.mark.gpu
def test_matmul_picks_its_kernel_again_when_out_moves_or_a_switch_changes(
    session, rng, monkeypatch
):
    # One shape, calls in turn: the kernel each runs follows out's address (16 bytes, 8, 4)
    # and the module's switches, not what the session kept for an earlier call of that shape.
    from conftest import CAI

    ml_dtypes = pytest.importorskip("ml_dtypes")
    hopper = session.context.compute_capability == (9, 0)
    m, n, kk = 136, 264, 72
    a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)
    da, db = session.upload(a), session.upload(b)
    pipelined = "matmul_bf16_pipelined<float, {}, {}, {}, {}, {}, {}>".format
    wgmma = "matmul_bf16_wgmma<float, {}, {}>".format(*gemm.WGMMA_TILE)
    steps = [  # (out's offset in bytes, switches, the last kernel on Hopper, elsewhere)
        (16, {}, _tma_kernel("f32"), pipelined(*gemm.BF16_TILE)),
        (8, {}, wgmma, pipelined(*gemm.BF16_TILE)),
        (4, {}, "matmul_bf16<float>", "matmul_bf16<float>"),
        (16, {"TMA": False}, wgmma, pipelined(*gemm.BF16_TILE)),
        (16, {"WGMMA": False}, pipelined(*gemm.BF16_TILE), pipelined(*gemm.BF16_TILE)),
        (
            16,
            {"WGMMA": False, "BF16_TILE": gemm.BF16_TILES[1]},
            pipelined(*gemm.BF16_TILES[1]),
            pipelined(*gemm.BF16_TILES[1]),
        ),
        (
            16,
            {"TMA": False, "WGMMA_TILE": gemm.WGMMA_TILES[0]},
            "matmul_bf16_wgmma<float, {}, {}>".format(*gemm.WGMMA_TILES[0]),
            pipelined(*gemm.BF16_TILE),
        ),
        (
            16,
            {"TMA_CONFIG": gemm.TMA_CONFIGS[1]},
            _tma_kernel("f32", gemm.TMA_CONFIGS[1]),
            pipelined(*gemm.BF16_TILE),
        ),
        (16, {}, _tma_kernel("f32"), pipelined(*gemm.BF16_TILE)),
    ]
    for offset, switches, on_hopper, elsewhere in steps:
        with monkeypatch.context() as patch:
            for name, value in switches.items():
                patch.setattr(gemm, name, value)
            buf = poisoned(session, (m * n + 4,), np.float32)
            out = CAI(buf.__cuda_array_interface__["data"][0] + offset, (m, n), "<f4", keep=buf)
            ran = _kernels_run(session, partial(k.matmul, session, out, da, db))
        got = session.download(buf)[offset // 4 : offset // 4 + m * n].reshape(m, n)
        _check_bf16_product(got, a, b, np.float32)
        assert ran[-1] == (on_hopper if hopper else elsewhere), (offset, switches)


@pytest.mark.gpu
def test_matmul_reads_factors_that_start_inside_a_buffer(session, rng):
    # torch views that start `offset` bf16 elements into NaN-filled buffers: 16 bytes in (the
    # TMA kernel's maps start there) and 2 bytes in (the any-shape kernel), in turn in one
    # session with one shape. A read before the start would bring a NaN into the result.
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m, n, kk = 136, 264, 72
    on_hopper = session.context.compute_capability == (9, 0)
    for offset in (8, 1, 8):
        a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)

        def inside(x, offset=offset):
            buf = torch.full((x.size + offset,), float("nan"), dtype=torch.bfloat16, device="cuda")
            view = buf[offset:].view(x.shape)
            view.copy_(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16))
            return view

        out = poisoned(session, (m, n), np.float32)
        a_in, b_in = inside(a), inside(b)
        ran = _kernels_run(session, partial(k.matmul, session, out, a_in, b_in))
        _check_bf16_product(session.download(out), a, b, np.float32)
        assert (ran == [_tma_kernel("f32")]) == (offset == 8 and on_hopper), offset


@pytest.mark.gpu
@pytest.mark.parametrize(("wgmma", "kk"), [(True, 8), (False, 8), (False, 7)])
def test_matmul_refuses_more_rows_than_the_grid_holds(session, monkeypatch, wgmma, kk):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(gemm, "WGMMA", wgmma)
    monkeypatch.setattr(gemm, "TMA", False)  # its persistent grid has no such bound
    m = 65535 * 128 + 1  # one row past the grid's y extent at 128-row tiles
    a = session.alloc_output((m, kk), ml_dtypes.bfloat16)
    b = session.alloc_output((kk, 8), ml_dtypes.bfloat16)
    out = session.alloc_output((m, 8), np.float32)
    with pytest.raises(tf.ValidationError, match=rf"kernels\.matmul: M={m} is above 8388480"):
        k.matmul(session, out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("config", gemm.TMA_CONFIGS)
def test_the_tma_matmul_is_captured_and_replays_right(session, rng, monkeypatch, config):
    # It allocates nothing (B is read as it is), so a graph can hold it; each replay recomputes.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if session.context.compute_capability != (9, 0):
        pytest.skip("the TMA kernel needs compute capability 9.0")
    monkeypatch.setattr(gemm, "TMA", True)
    monkeypatch.setattr(gemm, "TMA_CONFIG", config)
    m, n, kk = 300, 520, 136
    a = rng.standard_normal((m, kk)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((kk, n)).astype(ml_dtypes.bfloat16)
    da, db = session.upload(a), session.upload(b)
    out = poisoned(session, (m, n), np.float32)
    with session.capture() as cap:
        k.matmul(session, out, da, db)
    assert np.isnan(session.download(out)).all()  # captured, not run
    cap.graph.launch()
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(session.download(out), want, rtol=1e-4, atol=1e-5 * np.sqrt(kk))
