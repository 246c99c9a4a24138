"""TMA tensor maps: what `tf.tensor_map` checks before the driver encodes, and how a launch
passes the descriptor (a stand-in encoder and session; the tile copy itself on a GPU)."""

import numpy as np
import pytest

import tenferro as tf
from tenferro import tensor_maps as tensor_map_part
from tenferro.args import ParamBlock, ParamBlockBase
from tenferro.dtypes import by_name

TILE_SRC = r"""
#include <cuda/barrier>
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;
using barrier = cuda::barrier<cuda::thread_scope_block>;
namespace cde = cuda::device::experimental;
// Copies the 16 x 32 tile at (row0, col0) of the map's 2-D float array into out, row-major.
extern "C" __global__ void tile(float* out, const __grid_constant__ CUtensorMap tm, int row0,
                                int col0) {
    __shared__ alignas(128) float smem[16][32];
    #pragma nv_diag_suppress static_var_with_dynamic_init
    __shared__ barrier bar;
    if (threadIdx.x == 0) {
        init(&bar, blockDim.x);
        cde::fence_proxy_async_shared_cta();
    }
    __syncthreads();
    barrier::arrival_token token;
    if (threadIdx.x == 0) {
        cde::cp_async_bulk_tensor_2d_global_to_shared(&smem, &tm, col0, row0, bar);
        token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(smem));
    } else {
        token = bar.arrive();
    }
    bar.wait(std::move(token));
    for (int i = threadIdx.x; i < 16 * 32; i += blockDim.x) out[i] = smem[i / 32][i % 32];
}
struct Other { unsigned long long words[16]; };
extern "C" __global__ void other(float* out, Other o) {}
"""


class _Context:
    def __init__(self, cc=(9, 0)):
        self.compute_capability = cc


class _State:
    """A session's state as a tensor map asks it: open on this thread, sm_90 unless told."""

    def __init__(self, cc=(9, 0)):
        self.context, self.used = _Context(cc), []

    def check_use(self, op):
        self.used.append(op)


@pytest.fixture
def encoded(monkeypatch):
    """What the stand-in encoder was asked; it answers 128 recognisable bytes."""
    asked = []

    def encode(*args):
        asked.append(args)
        return bytes(range(128))

    monkeypatch.setattr(tensor_map_part._driver, "tensor_map_encode", encode)
    monkeypatch.setattr(tensor_map_part, "_MADE", {})
    return asked


def _span(shape, dtype="f32", strides=None, ptr=0x10000, cls=tf.TensorRef, state=None):
    t = by_name(dtype)
    if strides is None:
        strides = tuple(int(s) for s in np.empty(shape, t.numpy).strides)
    return cls(ptr, tuple(shape), tuple(strides), t, 0, None, state or _State())


def test_a_map_is_encoded_innermost_first_from_the_spans_own_order(encoded):
    span = _span((64, 96))  # 64 rows of 96 floats: strides (384, 4)
    tm = tf.tensor_map(span, (16, 32))
    assert encoded == [
        (
            "FLOAT32",
            0x10000,
            (96, 64),
            (384,),
            (32, 16),
            (1, 1),
            "NONE",
            "NONE",
            "NONE",
            "tensor_map",
        )
    ]
    assert tm.data == bytes(range(128)) and tm.span is span and tm.box == (16, 32)
    assert span.state.used == ["tensor_map"]
    assert repr(tm) == "TensorMap(shape=(64, 96), dtype=f32, box=(16, 32), swizzle=None)"


def test_a_map_asked_again_is_not_encoded_again(encoded, monkeypatch):
    # A kernel called in a loop asks for the same maps: each is checked and encoded once.
    st = _State()
    first = tf.tensor_map(_span((64, 96), state=st), (16, 32))
    again = tf.tensor_map(_span((64, 96), state=st), (16, 32))
    assert len(encoded) == 1 and again.data == first.data and again is not first
    assert again.box == (16, 32) and st.used == ["tensor_map"] * 2  # still checked for use
    tf.tensor_map(_span((64, 96), ptr=0x20000, state=st), (16, 32))  # another address
    tf.tensor_map(_span((64, 96), state=st), (16, 16))  # another box
    tf.tensor_map(_span((64, 96), state=_State()), (16, 32))  # another device's context
    assert [args[1] for args in encoded] == [0x10000, 0x20000, 0x10000, 0x10000]
    # Kept up to _MAX_MADE; the one past it starts over.
    monkeypatch.setattr(tensor_map_part, "_MAX_MADE", 4)
    tf.tensor_map(_span((64, 96), state=st), (16, 32))
    assert len(encoded) == 4 and len(tensor_map_part._MADE) == 4
    tf.tensor_map(_span((64, 96), state=st), (8, 32))
    assert len(encoded) == 5 and len(tensor_map_part._MADE) == 1


@pytest.mark.parametrize("box", [(True, 32), (1.0, 32), [1, 32]])
def test_a_box_equal_to_a_made_one_but_not_of_ints_is_checked_again(encoded, box):
    # True == 1 and 1.0 == 1: a lookup by equality alone would hand back the map made for
    # (1, 32). A list is checked and encoded, not looked up.
    st = _State()
    tf.tensor_map(_span((64, 96), state=st), (1, 32))
    if isinstance(box, list):
        assert tf.tensor_map(_span((64, 96), state=st), box).box == (1, 32)
        assert len(encoded) == 2
        return
    with pytest.raises(tf.ValidationError, match=r"tensor_map: box=.* must be 2 int\(s\)"):
        tf.tensor_map(_span((64, 96), state=st), box)
    assert len(encoded) == 1 and len(tensor_map_part._MADE) == 1


def test_the_options_reach_the_driver_by_their_names(encoded):
    span = _span((4, 8, 64), dtype="bf16", strides=(1024, 128, 2))
    tf.tensor_map(
        span, (2, 4, 64), swizzle=128, element_strides=(1, 2, 1), oob_fill="nan", l2_promotion=256
    )
    (args,) = encoded
    assert args[:6] == ("BFLOAT16", 0x10000, (64, 8, 4), (128, 1024), (64, 4, 2), (1, 2, 1))
    assert args[6:9] == ("128B", "L2_256B", "NAN_REQUEST_ZERO_FMA")


def test_a_dimension_of_one_element_is_encoded_with_its_compact_stride(encoded):
    # torch's (1, 64) view of a (64, 1) column says a stride of 2 bytes for its row: never
    # stepped along, so the map takes the row's compact 128 bytes and is not refused.
    tf.tensor_map(_span((1, 64), dtype="bf16", strides=(2, 2)), (1, 64), swizzle=128)
    assert encoded[0][2:5] == ((64, 1), (128,), (64, 1))
    with pytest.raises(tf.ValidationError, match=r"strides=\(2, 2\) \(bytes\): every stride"):
        tf.tensor_map(_span((2, 64), dtype="bf16", strides=(2, 2)), (1, 64))  # two rows: used


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (lambda: tf.tensor_map(object(), 4), r"span must be a TensorRef or TensorMut"),
        (
            lambda: tf.tensor_map(_span((64,), state=_State(cc=(8, 9))), 16),
            r"tensor maps need the Tensor Memory Accelerator \(sm_90 or later\); this device "
            r"is sm_89",
        ),
        (lambda: tf.tensor_map(_span((2,) * 6), (2,) * 6), r"the span has 6 dimension\(s\)"),
        (lambda: tf.tensor_map(_span((64,), "i8"), 16), r"the span is i8; a tensor map takes"),
        (
            lambda: tf.tensor_map(_span((64,), ptr=0x10008), 16),
            r"the span starts at 0x10008, not on 16 bytes",
        ),
        (
            lambda: tf.tensor_map(_span((8, 8), strides=(64, 8)), (4, 4)),
            r"strides=\(64, 8\) \(bytes\): the innermost dimension must be contiguous",
        ),
        (
            lambda: tf.tensor_map(_span((8, 3), strides=(12, 4)), (4, 4)),
            r"strides=\(12, 4\) \(bytes\): every stride but the innermost must be a positive "
            r"multiple of 16 bytes below 2\*\*40$",
        ),
        (lambda: tf.tensor_map(_span((8, 8)), 4), r"box=\(4,\) must be 2 int\(s\) from 1 to 256"),
        (lambda: tf.tensor_map(_span((8, 8)), (0, 4)), r"box=\(0, 4\) must be 2 int\(s\)"),
        (lambda: tf.tensor_map(_span((300, 8)), (257, 4)), r"box=\(257, 4\) must be 2 int"),
        (
            lambda: tf.tensor_map(_span((8, 8)), (4, 3)),
            r"box=\(4, 3\): its innermost row is 12 bytes; a tensor map moves rows of a "
            r"multiple of 16 bytes",
        ),
        (lambda: tf.tensor_map(_span((64,)), 16, swizzle=16), r"swizzle=16 must be None, 32"),
        (
            lambda: tf.tensor_map(_span((64,)), 12, swizzle=32),
            r"box=\(12,\): its innermost row is 48 bytes, past swizzle=32",
        ),
        (
            lambda: tf.tensor_map(_span((64,)), 16, element_strides=9),
            r"element_strides=\(9,\) must be 1 int\(s\) from 1 to 8",
        ),
        (lambda: tf.tensor_map(_span((64,)), 16, oob_fill="one"), r"oob_fill='one' must be"),
        (
            lambda: tf.tensor_map(_span((64,), "i32"), 16, oob_fill="nan"),
            r"oob_fill='nan' needs a float span; the span is i32",
        ),
        (lambda: tf.tensor_map(_span((64,)), 16, l2_promotion=32), r"l2_promotion=32 must be"),
    ],
)
def test_what_the_accelerator_cannot_take_is_refused_before_the_driver(encoded, make, msg):
    with pytest.raises(tf.ValidationError, match=r"^tensor_map: " + msg):
        make()
    assert encoded == []


def test_each_limit_is_taken_at_its_last_value(encoded):
    tf.tensor_map(_span((300, 8)), (256, 4))  # the largest box dimension
    tf.tensor_map(_span((64,)), 8, swizzle=32)  # a 32-byte row under a 32-byte swizzle
    tf.tensor_map(_span((64,)), 16, element_strides=8)
    tf.tensor_map(_span((8, 4)), (4, 4))  # a 16-byte row and a 16-byte stride
    tf.tensor_map(_span((64,), ptr=0x10010), 16)  # 16-byte aligned
    assert len(encoded) == 5


def _tile_block():
    return ParamBlock(tf.compile_cuda(TILE_SRC, arch="sm_90").signatures["tile"])


def test_a_launch_writes_the_descriptor_where_the_kernel_takes_a_tensor_map_and_holds_its_span(
    encoded,
):
    state = _State()
    out = _span((16, 32), cls=tf.TensorMut, ptr=0x90000, state=state)
    tm = tf.tensor_map(_span((64, 96), state=state), (16, 32))
    b = _tile_block()
    assert b.params[1].c_type.unqualified().name == "CUtensorMap_st"
    for pack in (b.pack, lambda args, st, op: ParamBlockBase.pack(b, args, st, op)):
        spans = pack([out, tm, 0, 32], state, "session.launch")
        assert spans == [out, tm.span]  # held, and checked for overlaps, as a span given
        assert bytes(b._mv[b.slices[1]]) == bytes(range(128))
        b.last_args = ()


@pytest.mark.parametrize(
    ("kernel", "i", "msg"),
    [
        ("tile", 0, r"args\[0\] 'out' is a TensorMap \(128 bytes\), the kernel takes float\*"),
        ("other", 1, r"args\[1\] 'o' is a TensorMap \(128 bytes\), the kernel takes Other"),
    ],
)
def test_a_map_where_the_kernel_takes_no_tensor_map_is_refused(encoded, kernel, i, msg):
    state = _State()
    tm = tf.tensor_map(_span((64, 96), state=state), (16, 32))
    b = ParamBlock(tf.compile_cuda(TILE_SRC, arch="sm_90").signatures[kernel])
    before = b.snapshot()
    with pytest.raises(tf.ValidationError, match=r"^session\.launch: " + msg):
        b.pack_slot(i, tm, state, "session.launch")
    assert b.snapshot() == before


def test_a_map_of_another_session_or_overlapping_a_written_span_is_refused(encoded):
    ours, theirs = _State(), _State()
    b = _tile_block()
    out = _span((16, 32), cls=tf.TensorMut, ptr=0x90000, state=ours)
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] is a TensorMap over a span of another session",
    ):
        b.pack(
            [out, tf.tensor_map(_span((64, 96), state=theirs), (16, 32)), 0, 0],
            ours,
            "session.launch",
        )
    over_out = tf.tensor_map(_span((16, 32), ptr=0x90000, state=ours), (16, 32))
    with pytest.raises(
        tf.ValidationError, match=r"^session\.launch: args\[0\] \(TensorMut\) and args\[1\]"
    ):
        b.pack([out, over_out, 0, 0], ours, "session.launch")


@pytest.mark.gpu
def test_a_tile_moved_by_the_accelerator_is_the_tile_numpy_slices(session, rng):
    if session.context.compute_capability < (9, 0):
        pytest.skip("tensor maps need sm_90 or later")
    a = rng.standard_normal((64, 96)).astype(np.float32)
    src = session.upload(a)
    tm = tf.tensor_map(session.tensor(src), (16, 32))
    fn = session.compile(TILE_SRC).function("tile")
    for row0, col0 in ((0, 0), (16, 32), (48, 64), (56, 80)):  # the last reads past the edges
        out = session.upload(np.full((16, 32), np.nan, np.float32))
        session.launch(fn, tf.LaunchConfig(1, 128), [session.tensor_mut(out), tm, row0, col0])
        want = np.zeros((16, 32), np.float32)  # out of bounds reads as zero
        part = a[row0 : row0 + 16, col0 : col0 + 32]
        want[: part.shape[0], : part.shape[1]] = part
        np.testing.assert_array_equal(session.download(out), want)


def test_a_bound_launchs_update_with_a_map_holds_its_span(encoded):
    from tenferro.args import span_of

    state = _State()
    tm = tf.tensor_map(_span((64, 96), state=state), (16, 32))
    assert span_of(tm) is tm.span  # what BoundLaunch.update keeps and checks for overlaps


def test_the_encode_call_passes_the_bindings_own_argument_conversion():
    # cuda.bindings takes lists of its cuuint32_t/cuuint64_t, not ints; converting happens
    # before the driver is asked, so a machine without one sees the driver's absence instead.
    from tenferro import _driver

    try:
        _driver.tensor_map_encode(
            "FLOAT32", 0x7000, (96, 64), (384,), (32, 16), (1, 1), "NONE", "NONE", "NONE", "op"
        )
    except TypeError as exc:
        raise AssertionError(f"the arguments were not converted: {exc}") from None
    except Exception:  # no driver here (or it refused the fake address): past the conversion
        pass
