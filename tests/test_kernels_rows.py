"""tenferro.kernels.rows (softmax, transpose, cumsum) against numpy in float64."""

import numpy as np
import pytest
from _kernel_helpers import SIZES, poisoned, shifted

import tenferro as tf
from tenferro import kernels as k
from tenferro.kernels import rows

# (SOFTMAX_KERNEL, SOFTMAX_REG): every kernel for rows that fit on chip, "split" at each
# compiled register count.
SOFTMAX_KERNELS = [("cached", 8), ("online", 8), *(("split", r) for r in rows.SOFTMAX_REGS)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows_", "cols"),
    [
        (1, 1),
        (31, 33),
        (1000, 257),
        (3, 0),
        (9, 1000),
        (7, 4099),  # row cached in shared memory, one float at a time
        (5, 4096),  # cached, float4 accesses; "split": all in registers
        (7, 4100),  # float4, the last register slots of a row padded
        (4, 16384),  # "split" at 4 registers: half the row in registers, half in shared memory
        (3, 40000),  # "split" with more than 48 KiB (opt-in) of shared memory
        (2, 20001),  # cached above 48 KiB (the opt-in shared memory)
        (3, 70001),
    ],
)  # beyond the opt-in limit: the three-pass kernel
@pytest.mark.parametrize(("kernel", "reg"), SOFTMAX_KERNELS)
def test_row_softmax(session, rng, monkeypatch, kernel, reg, rows_, cols):
    monkeypatch.setattr(rows, "SOFTMAX_KERNEL", kernel)
    monkeypatch.setattr(rows, "SOFTMAX_REG", reg)
    x = rng.standard_normal((rows_, cols)) * 4
    out = poisoned(session, (rows_, cols), np.float32)
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
    out = poisoned(session, x.shape, np.float32)
    k.softmax(session, out, session.upload(x))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        session.download(out), e / e.sum(axis=1, keepdims=True), rtol=2e-5, atol=1e-7
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows_", "cols"), [(1, 1), (31, 33), (33, 31), (1025, 70), (0, 5), (70, 130), (128, 64)]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
@pytest.mark.parametrize("tile", rows.TRANSPOSE_TILES)
def test_transpose(session, rng, monkeypatch, tile, rows_, cols, dtype):
    monkeypatch.setattr(rows, "TRANSPOSE_TILE", tile)
    x = (rng.standard_normal((rows_, cols)) * 1000).astype(dtype)
    out = poisoned(session, (cols, rows_), dtype)
    k.transpose(session, out, session.upload(x))
    np.testing.assert_array_equal(session.download(out), x.T)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", rows.TRANSPOSE_TILES)
def test_transpose_refuses_more_rows_than_the_grid_holds(session, monkeypatch, tile):
    monkeypatch.setattr(rows, "TRANSPOSE_TILE", tile)
    n = 65535 * tile + 1  # one row past the grid's y extent
    x = session.alloc_output((n, 1), np.float32)
    out = session.alloc_output((1, n), np.float32)
    with pytest.raises(
        tf.ValidationError, match=rf"kernels\.transpose: x has {n} rows; at most {n - 1}$"
    ):
        k.transpose(session, out, x)


def _check_scans(session, rng, n):
    """cumsum of fresh f64, i32 and f32 data of length n against numpy's."""
    x = rng.standard_normal(n)
    out = poisoned(session, (n,), np.float64)
    k.cumsum(session, out, session.upload(x))
    np.testing.assert_allclose(session.download(out), np.cumsum(x), rtol=1e-10, atol=1e-9)
    xi = rng.integers(-1000, 1000, n, dtype=np.int32)
    oi = poisoned(session, (n,), np.int32)
    k.cumsum(session, oi, session.upload(xi))
    np.testing.assert_array_equal(session.download(oi), np.cumsum(xi, dtype=np.int32))
    x32 = rng.standard_normal(n).astype(np.float32)
    o32 = poisoned(session, (n,), np.float32)
    k.cumsum(session, o32, session.upload(x32))
    err = np.abs(session.download(o32) - np.cumsum(x32.astype(np.float64)))
    # f32 partial sums drift like sqrt(i) ulps of the running magnitude (NaN fails too)
    tol = 4e-5 * np.sqrt(np.arange(1, n + 1)) + 1e-5
    assert not (err > tol).any() and not np.isnan(err).any(), (err - tol).max(initial=0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "n", [*SIZES, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 8192 + 1, (1 << 24) + 3]
)
def test_inclusive_scan(session, rng, n):
    _check_scans(session, rng, n)


@pytest.mark.gpu
@pytest.mark.parametrize("config", rows.SCAN_CONFIGS)
@pytest.mark.parametrize(
    "n",
    [
        1,
        4097,
        8193,
        16383,
        16385,
        2 * 16384,  # tile edges
        300 * 4096 + 5,
    ],
)
def test_inclusive_scan_at_each_tile_and_polling_config(session, rng, monkeypatch, config, n):
    monkeypatch.setattr(rows, "SCAN_CONFIG", config)
    _check_scans(session, rng, n)


@pytest.mark.gpu
@pytest.mark.parametrize("ahead_tiles", [1, 5])
@pytest.mark.parametrize("extra", [0, -1])  # the last tile prefetched whole, or not at all
@pytest.mark.parametrize("x_off", [0, 1])  # 1: x off the 16-byte grid the prefetch rounds to
def test_scan_prefetches_up_to_the_last_tile(session, rng, monkeypatch, ahead_tiles, extra, x_off):
    threads, items = rows.SCAN_CONFIG[:2]
    tile = threads * items
    sms = session.context.attribute("MULTIPROCESSOR_COUNT")
    # the fewest bytes an SM that make ahead_tiles tiles for block 0 to prefetch
    monkeypatch.setattr(rows, "SCAN_AHEAD", -(-ahead_tiles * tile * 4 // sms))
    n = (ahead_tiles + 1) * tile + extra
    x = rng.standard_normal(n + 1).astype(np.float32)
    out = poisoned(session, (n,), np.float32)
    k.cumsum(session, out, shifted(session.upload(x), n, "<f4", 4, x_off))
    err = np.abs(session.download(out) - np.cumsum(x[x_off : x_off + n].astype(np.float64)))
    assert not (err > 4e-5 * np.sqrt(np.arange(1, n + 1)) + 1e-5).any()
    assert not np.isnan(err).any()


@pytest.mark.gpu
def test_scan_takes_the_small_tile_where_shared_memory_is_short(session, rng, monkeypatch):
    # A device with 32 KiB a block: the default tile's 33 KiB would not launch.
    ctx_type = type(session.context)
    attribute = ctx_type.attribute
    monkeypatch.setattr(
        ctx_type,
        "attribute",
        lambda self, name: (
            32 << 10 if name == "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN" else attribute(self, name)
        ),
    )
    names = []
    function = rows.function
    monkeypatch.setattr(
        rows, "function", lambda s, f, name, e: names.append(name) or function(s, f, name, e)
    )
    _check_scans(session, rng, 5 * 16384 + 7)
    assert names == [rows._scan_name(t, rows.SCAN_SMALL) for t in ("f64", "i32", "f32")]


@pytest.mark.gpu
def test_scans_of_other_sizes_and_types_in_turn_read_no_stale_status(session, rng):
    # One state for all: each launch's epoch makes the words the last ones left unreadable.
    for n in (300 * 4096 + 5, 5000, 300 * 4096 + 5, 17, 8193):
        _check_scans(session, rng, n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_scan_epoch_wraps_to_a_cleared_state(session, rng, dtype):
    from tenferro.kernels import _build

    def scan(n):
        x = rng.standard_normal(n).astype(dtype)
        out = poisoned(session, (n,), dtype)
        k.cumsum(session, out, session.upload(x))
        np.testing.assert_allclose(
            session.download(out),
            np.cumsum(x.astype(np.float64)),
            rtol=1e-4,
            atol=1e-3 * np.sqrt(n),
        )

    big = 40 * 8192 + 3
    scan(big)  # epoch 1 on every tile's status word
    table = _build.session_table(session)
    assert table["cumsum epoch"] == 1
    table["cumsum epoch"] = rows._MAX_EPOCH - 1
    scan(100)  # one tile: the words of the others keep epoch 1
    assert table["cumsum epoch"] == rows._MAX_EPOCH  # the last epoch taken as it is
    scan(big)  # epoch 1 again: only a cleared state keeps the first scan's words out
    assert table["cumsum epoch"] == 1


@pytest.mark.gpu
def test_a_captured_scan_replays_right_between_launches_of_its_own(session, rng):
    n = 40 * 8192 + 3
    x, out = session.upload(rng.standard_normal(n)), poisoned(session, (n,), np.float64)
    k.cumsum(session, out, x)  # its plan and state made before the capture (no allocation in it)
    with session.capture() as cap:
        k.cumsum(session, out, x)
    assert cap.graph is not None and cap.graph.node_count == 2  # clear the state, scan
    for _ in range(3):
        for replay in (True, False):  # the graph, then the eager launch, on the same state
            xs = rng.standard_normal(n)
            session.copy(x, session.upload(xs))
            session.memset(out, 0xFF)
            if replay:
                cap.graph.launch()
            else:
                k.cumsum(session, out, x)
            np.testing.assert_allclose(session.download(out), np.cumsum(xs), rtol=1e-10, atol=1e-9)
