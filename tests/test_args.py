import ctypes
import math
import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro.args import ParamBlock
from tenferro.signature import parse_ptx, refine_with_source
from tenferro.tensor_maps import TENSOR_MAP_C_TYPES

SRC = r"""
extern "C" __global__ void k(float* y, const float* x, float a, unsigned n, double d,
                             long long q) {}
"""
PTX_ONLY = """
.visible .entry raw(.param .u64 raw_param_0, .param .u32 raw_param_1, .param .f32 raw_param_2)
{ ret; }
"""


def _block(src=SRC, name="k"):
    sig = tf.compile_cuda(src).signatures[name]
    return ParamBlock(sig)


def _read(block, i, fmt):
    off = block.offsets[i]
    return struct.unpack_from(fmt, ctypes.string_at(ctypes.addressof(block._buf) + off, 16))[0]


@pytest.mark.parametrize(
    "make,value",
    [
        (tf.u8, 256),
        (tf.u8, -1),
        (tf.i8, 128),
        (tf.i16, -32769),
        (tf.u32, 1 << 32),
        (tf.i32, 1 << 31),
        (tf.u64, -1),
        (tf.i64, 1 << 63),
    ],
)
def test_integer_scalars_refuse_out_of_range(make, value):
    with pytest.raises(tf.ValidationError, match=rf"tf\.{make.__name__}: .*out of range"):
        make(value)


@pytest.mark.parametrize("make,value", [(tf.f32, 1e39), (tf.f16, 70000.0), (tf.bf16, 1e39)])
def test_float_scalars_refuse_finite_overflow(make, value):
    with pytest.raises(tf.ValidationError, match=rf"tf\.{make.__name__}: .*overflows"):
        make(value)


def test_scalars_refuse_wrong_kind():
    with pytest.raises(tf.ValidationError, match=r"tf\.u32: u32 needs an integer"):
        tf.u32(1.5)
    with pytest.raises(tf.ValidationError, match=r"tf\.f32: f32 needs a real number"):
        tf.f32("1")


def test_a_scalar_of_a_value_made_again_is_the_same_object_with_the_same_bits():
    # A loop that writes tf.u32(n) each call passes one object: a launch of the very objects
    # of the previous one skips its checks.
    assert tf.u32(4096) is tf.u32(4096) and tf.f32(2.5) is tf.f32(2.5)
    assert tf.i64(-3) is tf.i64(-3) and tf.f64(0.1) is tf.f64(0.1)
    assert tf.u64(4096) is not tf.u32(4096) and tf.u64(4096).data == (4096).to_bytes(8, "little")
    assert tf.u32(4096).data == bytes.fromhex("00100000")
    assert tf.f32(2.5).data == bytes.fromhex("00002040")


def test_float_zeros_keep_their_sign_whichever_comes_first():
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        a, b = tf.f32(first), tf.f32(second)
        assert {a.data, b.data} == {bytes.fromhex("00000000"), bytes.fromhex("00000080")}
        assert tf.f64(-0.0).data == bytes.fromhex("0000000000000080")
        assert tf.f64(0.0).data == bytes(8)


def test_kept_scalars_are_bounded_and_stay_right_past_the_bound():
    from tenferro import args

    values = range(1000, 1000 + 3 * args._KEPT_SCALARS + 1)
    for v in values:
        assert tf.u32(v).data == v.to_bytes(4, "little")
        assert tf.f64(v + 0.5).data == struct.pack("<d", v + 0.5)
    assert tf.u32(values[-1]) is tf.u32(values[-1])
    cells = [c.cell_contents for c in tf.u32.__closure__ if isinstance(c.cell_contents, dict)]
    assert cells and len(cells[0]) <= args._KEPT_SCALARS


def test_a_refused_value_is_not_kept_and_the_last_in_range_is():
    for _ in range(2):  # a second time: nothing from the first refusal answers it
        with pytest.raises(tf.ValidationError, match=r"tf\.u32: .*out of range"):
            tf.u32(1 << 32)
        with pytest.raises(tf.ValidationError, match=r"tf\.f32: .*overflows"):
            tf.f32(1e39)
    assert tf.u32((1 << 32) - 1).data == bytes.fromhex("ffffffff")
    assert tf.u32((1 << 32) - 1) is tf.u32((1 << 32) - 1)
    assert tf.u32(True).data == (1).to_bytes(4, "little")  # a bool takes the checked path


def test_scalars_pack_exact_bits():
    # Bit patterns written out from the IEEE formats, not computed the way the code does.
    assert tf.f32(1.0).data == bytes.fromhex("0000803f")
    assert tf.f32(-2.5).data == bytes.fromhex("000020c0")
    assert tf.f32(0.1).data == bytes.fromhex("cdcccc3d")  # rounded to nearest
    assert tf.f16(1.0).data == bytes.fromhex("003c")
    assert tf.f16(-2.5).data == bytes.fromhex("00c1")
    assert tf.f16(65504.0).data == bytes.fromhex("ff7b")
    assert tf.f16(2.0**-24).data == bytes.fromhex("0100")  # the smallest subnormal
    assert tf.f64(1.0).data == bytes.fromhex("000000000000f03f")
    assert tf.i64(-5).data == bytes.fromhex("fbffffffffffffff")
    assert tf.u16(0xABCD).data == bytes.fromhex("cdab")
    # bf16 is the top half of the f32 bits, rounded to nearest even.
    assert tf.bf16(1.0).data == struct.pack("<H", 0x3F80)
    assert tf.bf16(float.fromhex("0x1.0101p0")).data == struct.pack("<H", 0x3F81)
    assert tf.f32(float("inf")).data == np.float32("inf").tobytes()  # inf is not an overflow


def _mut(ptr, n=4):
    from tenferro.dtypes import by_name

    return tf.TensorMut(ptr, (n,), (4,), by_name("f32"), 0, None, None)


def _ref(ptr, n=4):
    from tenferro.dtypes import by_name

    return tf.TensorRef(ptr, (n,), (4,), by_name("f32"), 0, None, None)


def test_pack_writes_values_in_place(rng):
    b = _block()
    a, n, d, q = (
        float(rng.standard_normal()),
        int(rng.integers(1, 1 << 31)),
        float(rng.standard_normal()),
        int(rng.integers(-(1 << 62), 1 << 62)),
    )
    b.pack([_mut(0x1000), _ref(0x2000), tf.f32(a), tf.u32(n), d, q], None, "session.launch")
    assert _read(b, 0, "<Q") == 0x1000 and _read(b, 1, "<Q") == 0x2000
    assert _read(b, 2, "<f") == np.float32(a)
    assert _read(b, 3, "<I") == n
    assert _read(b, 4, "<d") == d  # a Python float where the type is known: f64
    assert _read(b, 5, "<q") == q
    # numpy scalars keep their exact width
    b.pack(
        [_mut(0x100), _ref(0x200), np.float32(a), np.uint32(n), np.float64(d), np.int64(q)],
        None,
        "session.launch",
    )
    assert (_read(b, 2, "<f"), _read(b, 3, "<I"), _read(b, 4, "<d"), _read(b, 5, "<q")) == (
        np.float32(a),
        n,
        d,
        q,
    )
    quiet_less = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # a signalling NaN
    b.pack(
        [_mut(0x100), _ref(0x200), quiet_less, np.uint32(n), np.float64(d), np.int64(q)],
        None,
        "session.launch",
    )
    assert _read(b, 2, "<I") == 0x7F800001  # its bits as they were, not made quiet


@pytest.mark.parametrize(
    "args,pattern",
    [
        (
            [tf.u64(1), tf.u64(2), tf.f32(1), 3, 1.0, 1],
            r"session\.launch: args\[0\] 'y' is a u64 scalar, the kernel takes float\*$",
        ),
        (
            [_mut(0x1000), _ref(0x1000), tf.f32(1), 3, 1.0, 1],
            r"session\.launch: args\[0\] \(TensorMut\) and args\[1\] \(TensorRef\) overlap",
        ),
        (
            [_mut(0x1000), _mut(0x1004), tf.f32(1), 3, 1.0, 1],
            r"session\.launch: args\[0\] \(TensorMut\) and args\[1\] \(TensorMut\) overlap",
        ),
        (
            [tf.KernelArg.pointer(_mut(0x1000)), _mut(0x1000), tf.f32(1), 3, 1.0, 1],
            r"session\.launch: args\[0\] \(TensorMut\) and args\[1\] \(TensorMut\) overlap",
        ),
        (
            [_mut(0x1000), _ref(0x1000), tf.f32(1), _ref(0x1000), 1.0, 1],
            r"session\.launch: args\[3\] 'n' is a TensorRef \(pointer\), the kernel takes "
            r"unsigned int$",
        ),
        ([tf.u64(1)], r"session\.launch: kernel 'k' takes 6 argument\(s\), got 1"),
        (
            [_mut(1), _ref(64), tf.u32(3), tf.u32(4), 1.0, 1],
            r"session\.launch: args\[2\] 'a' is a u32 scalar, the kernel takes float$",
        ),
        (
            [_mut(1), _ref(64), tf.f32(1), tf.u64(4), 1.0, 1],
            r"session\.launch: args\[3\] 'n' is a u64 scalar, the kernel takes unsigned int$",
        ),
        (
            [tf.u32(1), _ref(64), tf.f32(1), tf.u32(4), 1.0, 1],
            r"session\.launch: args\[0\] 'y' is a u32 scalar, the kernel takes float\*$",
        ),
        (
            [_mut(1), _ref(64), tf.f32(1), 1.5, 1.0, 1],
            r"session\.launch: args\[3\] is a bare Python float",
        ),
        (
            [_mut(1), _ref(64), tf.f32(1), 1 << 32, 1.0, 1],
            r"session\.launch: args\[3\]: 4294967296 is out of range for u32",
        ),
        ([_mut(1), _ref(64), 1e39, 3, 1.0, 1], r"session\.launch: args\[2\].*overflows f32"),
        (
            [_mut(1), _ref(64), tf.f32(1), 3, 1.0, "x"],
            r"session\.launch: args\[5\] is str; expected a span",
        ),
        (
            [_mut(1), _ref(64), np.float64(1), 3, 1.0, 1],
            r"session\.launch: args\[2\] 'a' is a numpy float64 scalar, the kernel takes "
            r"float$",
        ),
    ],
)
def test_abi_mismatches_are_refused(args, pattern):
    with pytest.raises(tf.ValidationError, match=pattern):
        _block().pack(args, None, "session.launch")


def test_python_numbers_refused_where_ptx_cannot_say():
    sig = parse_ptx(PTX_ONLY)["raw"]
    b = ParamBlock(sig)
    # .u64 may be a pointer: a bare int there is never guessed
    with pytest.raises(
        tf.ValidationError,
        match=r"args\[0\] is a bare Python int .*pointer or "
        r"64-bit integer",
    ):
        b.pack([5, 1, 1.0], None, "session.launch")
    b.pack([tf.u64(5), -1, 1.0], None, "session.launch")  # 32-bit width known, sign not
    assert _read(b, 1, "<I") == 0xFFFFFFFF
    with pytest.raises(tf.ValidationError, match=r"args\[1\]: 4294967296 does not fit"):
        b.pack([tf.u64(5), 1 << 32, 1.0], None, "session.launch")


def test_struct_args_checked_by_size():
    src = r"""struct P { float a; int b; double c; };
    extern "C" __global__ void s(P p, float* o) {}"""
    b = _block(src, "s")

    class P(ctypes.Structure):
        _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int), ("c", ctypes.c_double)]

    b.pack([tf.KernelArg.struct(P(1.5, 2, 3.25)), _mut(8)], None, "session.launch")
    assert _read(b, 0, "<f") == 1.5
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[0\] 'p' is a struct of "
        r"8 bytes, the kernel takes P \(16 bytes, "
        r"aligned to 8\)$",
    ):
        b.pack([tf.KernelArg.struct(b"\0" * 8), _mut(8)], None, "session.launch")
    ptx = parse_ptx(".entry s(.param .align 8 .b8 s_param_0[16], .param .u64 s_param_1)")["s"]
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[0\] expects 16-byte "
        r"struct aligned to 8, got 8-byte struct$",
    ):
        ParamBlock(ptx).pack([tf.KernelArg.struct(b"\0" * 8), _mut(8)], None, "session.launch")
    # An alignment, when given, must be the parameter's: 8 is, 4 and 16 are not.
    b.pack([tf.KernelArg.struct(P(2.5, 2, 3.25), align=8), _mut(8)], None, "session.launch")
    assert _read(b, 0, "<f") == 2.5
    for wrong in (4, 16):
        with pytest.raises(
            tf.ValidationError,
            match=rf"session\.launch: args\[0\] 'p' is a "
            rf"struct of 16 bytes, aligned to {wrong}, "
            rf"the kernel takes P \(16 bytes, aligned "
            rf"to 8\)$",
        ):
            b.pack(
                [tf.KernelArg.struct(P(9.0, 2, 3.25), align=wrong), _mut(8)], None, "session.launch"
            )
    assert _read(b, 0, "<f") == 2.5  # the refused structs wrote nothing


@pytest.mark.parametrize("align", [0, -1, 3, 512, 2.0, True])
def test_struct_alignment_must_be_a_power_of_two(align):
    with pytest.raises(
        tf.ValidationError,
        match=rf"KernelArg\.struct: align={align!r} must be None or a power of "
        r"two from 1 to 256",
    ):
        tf.KernelArg.struct(b"\0" * 4, align=align)
    assert tf.KernelArg.struct(b"\0" * 4, align=256).align == 256  # the last accepted
    assert tf.KernelArg.struct(b"\0", align=1).align == 1


def test_empty_struct_is_refused():
    with pytest.raises(tf.ValidationError, match=r"KernelArg\.struct: data is empty"):
        tf.KernelArg.struct(b"")
    with pytest.raises(tf.ValidationError, match=r"KernelArg\.struct: data is empty"):
        tf.KernelArg.struct(np.zeros(0, np.float32))
    assert tf.KernelArg.struct(b"\x01").data == b"\x01"  # one byte is a struct


def test_kernelarg_factories_refuse_bad_input():
    with pytest.raises(tf.ValidationError, match=r"KernelArg\.pointer: span must be"):
        tf.KernelArg.pointer(np.zeros(3))
    with pytest.raises(
        tf.ValidationError,
        match=r"^KernelArg\.struct: data must be bytes, a "
        r"numpy array or a ctypes\.Structure, got int$",
    ):
        tf.KernelArg.struct(3)
    arr = np.array([1, -2], np.int32)
    assert tf.KernelArg.struct(arr).data == arr.tobytes()
    assert tf.KernelArg.struct(b"x" * 16, align=8).describe() == "16-byte struct aligned to 8"
    assert tf.KernelArg.struct(b"x" * 16).describe() == "16-byte struct"
    assert tf.KernelArg.scalar(7, np.uint16).data == struct.pack("<H", 7)
    assert tf.KernelArg.scalar(7, "i8").data == struct.pack("<b", 7)


def test_refine_ignores_mismatched_declarations():
    sigs = parse_ptx(PTX_ONLY)
    out = refine_with_source(sigs, 'extern "C" __global__ void raw(float* a) {}')
    assert out["raw"] is sigs["raw"]


def test_repeated_arguments_skip_rechecks_but_any_change_is_checked():
    b = _block()
    y, x = _mut(0x1000), _ref(0x2000)
    args = [y, x, tf.f32(1.0), tf.u32(5), 1.0, 2]
    spans = b.pack(args, None, "session.launch")
    assert b.pack(args, None, "session.launch") is spans  # same objects: nothing re-checked
    args[2] = tf.f64(1.0)  # the same list, one element changed: checked again
    with pytest.raises(
        tf.ValidationError,
        match=r"session\.launch: args\[2\] 'a' is an f64 "
        r"scalar, the kernel takes float$",
    ):
        b.pack(args, None, "session.launch")
    args[2] = tf.f32(3.0)
    b.pack(args, None, "session.launch")
    assert _read(b, 2, "<f") == 3.0
    with pytest.raises(tf.ValidationError, match=r"args\[0\] \(TensorMut\) and args\[1\]"):
        b.pack([y, _ref(0x1000), *args[2:]], None, "session.launch")


@pytest.mark.parametrize(
    ("make", "accepted", "refused"),
    [
        # The largest value that rounds to the type's maximum, and the first that rounds past it.
        (tf.f16, 65519.0, 65520.0),
        (tf.f16, -65519.0, -65520.0),
        (tf.f32, float(np.nextafter(2.0**128 - 2.0**103, 0)), 2.0**128 - 2.0**103),
        (tf.bf16, 2.0**128 - 2.0**119 - 2.0**104, 2.0**128 - 2.0**119),
    ],
)
def test_floats_are_refused_only_where_they_round_to_infinity(make, accepted, refused):
    bits = make(accepted).data
    maxima = {"f16": np.finfo(np.float16).max, "f32": np.finfo(np.float32).max}
    if make.__name__ in maxima:
        got = np.frombuffer(bits, dtype={"f16": np.float16, "f32": np.float32}[make.__name__])[0]
        assert abs(float(got)) == float(maxima[make.__name__])
    else:
        assert bits == b"\x7f\x7f"  # bf16's largest finite value, 0x7F7F
    with pytest.raises(
        tf.ValidationError,
        match=rf"tf\.{make.__name__}: .* overflows "
        rf"{make.__name__} \(it rounds past ",
    ):
        make(refused)


@pytest.mark.parametrize(
    ("make", "value"),
    [
        (tf.f32, 2**1024),
        (tf.f64, 10**400),
        (tf.f16, -(10**400)),
        (tf.bf16, 2**2000),
    ],
)
def test_ints_past_float64_are_refused_not_overflowerror(make, value):
    digits = len(str(abs(value)))
    with pytest.raises(
        tf.ValidationError,
        match=rf"^tf\.{make.__name__}: an integer of {digits} "
        rf"digits overflows {make.__name__}$",
    ):
        make(value)
    assert make(float(np.finfo(np.float16).max)).data  # an ordinary value still packs


# --- the scalar factories on any input: the value's exact bits, or a named refusal ------------

_INT_RANGES = {
    "u8": (0, 255),
    "u16": (0, 65535),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "i8": (-128, 127),
    "i16": (-(2**15), 2**15 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_INT_RANGES)), st.integers(-(2**70), 2**70) | st.integers(-300, 300))
def test_int_factories_take_exactly_their_range(name, v):
    lo, hi = _INT_RANGES[name]
    make = getattr(tf, name)
    if lo <= v <= hi:
        got = int.from_bytes(make(v).data, "little", signed=name.startswith("i"))
        assert got == v and len(make(v).data) * 8 == int(name[1:])
    else:
        with pytest.raises(
            tf.ValidationError,
            match=rf"tf\.{name}: {v} is out of range for "
            rf"{name} \[{lo}, {hi}\]",
        ):
            make(v)


_FLOAT_TYPES = {"f16": (np.float16, 10), "f32": (np.float32, 23), "f64": (np.float64, 52)}


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["f16", "f32", "f64", "bf16"]),
    st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(-70000.0, 70000.0)
    | st.integers(-(2**1100), 2**1100),
)
def test_float_factories_round_to_nearest_or_refuse_overflow(name, v):
    make = getattr(tf, name)
    try:
        data = make(v).data
    except tf.ValidationError as exc:
        assert re.match(rf"tf\.{name}: .* overflows {name}", str(exc)), str(exc)
        assert not isinstance(v, float) or not math.isinf(v)  # infinities pass as they are
        return
    if name == "bf16":
        bits = np.array([int.from_bytes(data, "little") << 16], np.uint32)
        got = float(bits.view(np.float32)[0])
        mant = 7
    else:
        got = float(np.frombuffer(data, _FLOAT_TYPES[name][0])[0])
        mant = _FLOAT_TYPES[name][1]
    x = float(v)
    if math.isnan(x):
        assert math.isnan(got)
        return
    if math.isinf(x):
        assert got == x
        return
    assert math.isfinite(got)
    # Round to nearest: within half a unit in the last place of the result (or of the
    # smallest normal, for subnormals and values that round to zero).
    exp = math.frexp(got if got else x)[1]
    min_exp = {"f16": -13, "f32": -125, "f64": -1021, "bf16": -125}[name]
    ulp = 2.0 ** (max(exp, min_exp) - 1 - mant)
    assert abs(got - x) <= ulp / 2 * (1 + 1e-12) or (name == "bf16" and abs(got - x) <= ulp)


@pytest.mark.parametrize("name", sorted(_INT_RANGES))
def test_int_factories_at_both_ends_of_their_range(name):
    lo, hi = _INT_RANGES[name]
    make = getattr(tf, name)
    signed = name.startswith("i")
    for v in (lo, hi):  # the last values accepted, packed exactly
        assert int.from_bytes(make(v).data, "little", signed=signed) == v
    for v in (lo - 1, hi + 1):  # the first refused
        with pytest.raises(tf.ValidationError, match=rf"tf\.{name}: {v} is out of range"):
            make(v)


TYPED = r"""#include <cuda_fp16.h>
extern "C" __global__ void t(float* y, const float* x, const double* d, void* v, const char* c,
                             unsigned char* u, float2* z, const __half* h, unsigned n, int i,
                             char ch, unsigned long long m) {}
"""


def _typed_args(**changes):
    """Arguments `TYPED` takes, each span over its own memory; ``changes`` replace some."""
    from tenferro.dtypes import by_name

    def span(cls, ptr, t):
        t = by_name(t)
        return cls(ptr, (4,), (t.itemsize,), t, 0, None, _OURS)

    args = dict(
        y=span(tf.TensorMut, 0x1000, "f32"),
        x=span(tf.TensorRef, 0x2000, "f32"),
        d=span(tf.TensorRef, 0x3000, "f64"),
        v=span(tf.TensorMut, 0x4000, "f64"),
        c=span(tf.TensorRef, 0x5000, "i32"),
        u=span(tf.TensorMut, 0x6000, "bf16"),
        z=span(tf.TensorMut, 0x7000, "c64"),
        h=span(tf.TensorRef, 0x8000, "f16"),
        n=tf.u32(7),
        i=tf.i32(-7),
        ch=tf.i8(-1),
        m=tf.u64(1 << 40),
    )
    args.update(changes)
    return list(args.values())


def _both_packs():
    return (lambda b, a: b.pack(a, _OURS, "session.launch"), lambda b, a: _general(b, a))


def _signatures():
    from tenferro.dtypes import by_name
    from tenferro.signature import BYTES, FLOAT, INT, OPAQUE, PTR, PTR_OR_INT, Param, Signature

    mixed = Signature(
        "mixed",
        (
            Param(PTR, 8, 8, writes=True, name="out"),
            Param(PTR, 8, 8, writes=False, name="in"),
            Param(PTR_OR_INT, 8, 8),
            Param(FLOAT, 4, 4, by_name("f32")),
            Param(INT, 4, 4, by_name("u32")),
            Param(INT, 8, 8),
            Param(FLOAT, 8, 8, by_name("f64")),
            Param(BYTES, 12, 4),
            Param(OPAQUE, 8, 8),
            Param(PTR, 8, 8),
        ),
        "test",
    )
    return [
        tf.compile_cuda(SRC).signatures["k"],
        parse_ptx(PTX_ONLY, "t")["raw"],
        mixed,
        tf.compile_cuda(TYPED).signatures["t"],
        tf.compile_cuda(COMPLEX).signatures["z"],
        tf.compile_cuda(STRUCTS).signatures["st"],
        tf.compile_cuda(MAPS).signatures["tm"],
        parse_ptx(PTX_MAPS, "t")["pmaps"],
    ]


# 128-byte parameters of no C type, as PTX declares a CUtensorMap: a map or a struct goes there.
PTX_MAPS = """
.visible .entry pmaps(.param .align 64 .b8 pmaps_param_0[128], .param .u64 pmaps_param_1,
                      .param .align 64 .b8 pmaps_param_2[128], .param .u32 pmaps_param_3)
{ ret; }
"""
# Tensor maps by value, beside a pointer, a scalar and a struct of their size that is no map.
MAPS = r"""
struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;
struct alignas(64) Other { unsigned long long v[16]; };
extern "C" __global__ void tm(const __grid_constant__ CUtensorMap a, float* y,
                              const __grid_constant__ CUtensorMap b, Other o, unsigned n) {}
"""


COMPLEX = r"""
extern "C" __global__ void z(float2* y, float2 a, double2 b, float f, int i, long long q) {}
"""


def _pool():
    """Arguments of every kind a launch may be given, right and wrong."""
    from tenferro.dtypes import by_name

    ours, theirs = _OURS, object()
    f32 = by_name("f32")
    spans = [
        cls(ptr, (4,), (4,), f32, 0, None, who)
        for cls in (tf.TensorMut, tf.TensorRef)
        for ptr in (0x1000, 0x1008, 0x2000)
        for who in (ours, theirs)
    ]
    spans.append(tf.DeviceBytes(0x3000, (16,), (1,), by_name("u8"), 0, None, ours))
    spans += [
        cls(ptr, (2,), (t.itemsize,), t, 0, None, ours)
        for cls, ptr in ((tf.TensorMut, 0x5000), (tf.TensorRef, 0x6000))
        for t in map(by_name, ("f64", "c64", "f16", "bf16", "u8", "i32"))
    ]
    spans.append(tf.TensorRef(0x7000, (4,), (4,), f32, 0, None, ours, True))  # read-only memory
    values = [
        tf.f32(1.5),
        tf.f64(-2.0),
        tf.u32(7),
        tf.i32(-7),
        tf.u64(1 << 40),
        tf.i64(-3),
        tf.f16(0.5),
        tf.u8(3),
        tf.i8(-3),
        tf.u64(3),
        5,
        -1,
        1 << 63,
        2.5,
        True,
        np.float32(1.25),
        np.int32(3),
        np.uint32(9),
        np.int64(-4),
        1 + 2j,
        np.complex64(2 - 1j),
        np.complex128(3j),
        ctypes.c_int(3),
        ctypes.c_float(1.5),
        ctypes.c_double(-2.0),
        ctypes.c_uint64(11),
        ctypes.c_void_p(0x1000),
        _Affine(1.0, 2.0),
        np.array((1.0, 2.0), _AFFINE)[()],
        tf.KernelArg.struct(b"x" * 12),
        tf.KernelArg.struct(b"y" * 8),
        tf.KernelArg.pointer(spans[0]),
        "text",
        None,
    ]
    # Maps over memory no other span of the pool touches (so that lists of maps pack often),
    # of ours read-only and writable, and of another session; each map's bytes its own.
    map_spans = [
        tf.TensorRef(0x9000, (4,), (4,), f32, 0, None, ours),
        tf.TensorRef(0x9000, (4,), (4,), f32, 0, None, ours),
        tf.TensorMut(0xA000, (4,), (4,), f32, 0, None, ours),
        tf.TensorRef(0xB000, (4,), (4,), f32, 0, None, theirs),
    ]
    maps = [tf.TensorMap(sp, (4,), None, bytes([i + 1]) * 128) for i, sp in enumerate(map_spans)]
    return spans + values + maps


_OURS = object()  # the session the spans of these tests belong to


def _general(block, args):
    from tenferro.args import ParamBlockBase

    return ParamBlockBase.pack(block, args, _OURS, "session.launch")


def _fitting(p, pool):
    """Arguments a parameter takes, so that a drawn list often gets to its last checks."""
    from tenferro.signature import BYTES, FLOAT, INT, OPAQUE, PTR, PTR_OR_INT

    spans = [
        a
        for a in pool
        if isinstance(a, tf.TensorRef | tf.TensorMut | tf.DeviceBytes) and a.state is _OURS
    ]
    if p.kind in (PTR, PTR_OR_INT) or (p.kind == OPAQUE and p.size == 8):
        return spans
    if p.kind == FLOAT:
        return [tf.f32(1.5) if p.size == 4 else tf.f64(2.5), 2.5]
    if p.kind == INT:
        return [tf.u32(7), 5] if p.size == 4 else [tf.u64(9), tf.i64(-9), 5]
    if p.kind == BYTES:
        struct = tf.KernelArg.struct(b"z" * p.size)
        name = None if p.c_type is None else p.c_type.unqualified().name
        if p.size == 128 and (name is None or name in TENSOR_MAP_C_TYPES):
            return [a for a in pool if isinstance(a, tf.TensorMap) and a.state is _OURS] + [struct]
        if p.scalar is not None:  # float2 / double2 by value: a complex too
            return [tf.KernelArg.struct(b"z" * p.size), 1 + 2j, np.complex64(2 - 1j)]
        return [struct]
    return pool


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_the_straight_line_pack_does_what_the_general_loop_does(data):
    pool = _pool()  # made within the test, as are the signatures (compile-cache hits)
    sig = data.draw(st.sampled_from(_signatures()))
    n = len(sig.params)
    length = data.draw(st.sampled_from([n] * 8 + [n - 1, n + 1]))
    args = []
    for i in range(length):
        fit = _fitting(sig.params[i], pool) if i < n else pool
        args.append(
            data.draw(
                st.sampled_from(fit) if data.draw(st.integers(0, 9)) else st.sampled_from(pool)
            )
        )
    results = []
    for pack in (lambda b: b.pack(args, _OURS, "session.launch"), lambda b: _general(b, args)):
        b = ParamBlock(sig)
        try:
            spans = pack(b)
            results.append(
                ("ok", [id(sp) for sp in spans], bytes(b._mv), b.last_args == tuple(args))
            )
        except tf.ValidationError as exc:
            results.append(("refused", str(exc), b.last_args))
    assert results[0] == results[1]


def test_the_usual_arguments_take_the_straight_line_alone(monkeypatch):
    # The launch's hot path: a span of the dtype the pointee names (one of two for float2*),
    # any span where the pointee names none, a read-only producer's span where the kernel
    # reads through const, typed and numpy scalars of the parameter's own type. None of them
    # needs the general per-slot check; what is packed is what that check would pack.
    from tenferro.dtypes import by_name

    sig = tf.compile_cuda(TYPED).signatures["t"]
    readonly_x = tf.TensorRef(0x2000, (4,), (4,), by_name("f32"), 0, None, _OURS, True)
    z_f32 = tf.TensorMut(0x7000, (4,), (4,), by_name("f32"), 0, None, _OURS)  # float2's lanes
    lists = [
        _typed_args(),
        _typed_args(x=readonly_x, z=z_f32, n=np.uint32(7), i=np.int32(-7), m=np.uint64(1 << 40)),
    ]
    want = []
    for args in lists:
        block = ParamBlock(sig)
        assert block.pack(args, _OURS, "session.launch") == [a for a in args[:8]]
        want.append(bytes(block._mv))
    slow = []
    monkeypatch.setattr(ParamBlock, "pack_slot", lambda self, i, *a: slow.append(i))
    for args, packed in zip(lists, want, strict=True):
        block = ParamBlock(sig)  # binds the spy as its slot check
        block.pack(args, _OURS, "session.launch")
        assert slow == [] and bytes(block._mv) == packed


def test_a_tensor_map_takes_the_straight_line_and_passes_its_bytes_and_its_span(monkeypatch):
    # A map where the kernel takes a CUtensorMap: its 128 bytes at the parameter's offset,
    # its span among the launch's spans (held, overlap-checked), no per-slot check.
    from tenferro.dtypes import by_name

    sig = tf.compile_cuda(MAPS).signatures["tm"]
    f32 = by_name("f32")
    a_span = tf.TensorRef(0x1000, (4,), (4,), f32, 0, None, _OURS)
    y = tf.TensorMut(0x2000, (4,), (4,), f32, 0, None, _OURS)
    b_span = tf.TensorRef(0x3000, (4,), (4,), f32, 0, None, _OURS)
    a_map = tf.TensorMap(a_span, (4,), None, bytes(range(128)))
    b_map = tf.TensorMap(b_span, (4,), None, bytes(range(128, 256)))
    other = tf.KernelArg.struct(b"o" * 128, align=64)
    args = [a_map, y, b_map, other, tf.u32(7)]
    block = ParamBlock(sig)
    assert block.pack(args, _OURS, "session.launch") == [a_span, y, b_span]
    packed = bytes(block._mv)
    offsets = block.offsets
    assert packed[offsets[0] : offsets[0] + 128] == a_map.data
    assert packed[offsets[2] : offsets[2] + 128] == b_map.data
    # A map where the kernel takes another struct of its size is refused, naming both.
    with pytest.raises(tf.ValidationError, match=r"args\[3\] 'o' is a TensorMap .*Other"):
        ParamBlock(sig).pack([a_map, y, b_map, a_map, tf.u32(7)], _OURS, "session.launch")
    slow = []
    monkeypatch.setattr(ParamBlock, "pack_slot", lambda self, i, *a: slow.append(i))
    block = ParamBlock(sig)
    block.pack(args, _OURS, "session.launch")
    assert slow == [3]  # the struct alone: the maps, the pointer and the scalar inline


def test_which_parameters_take_a_span_and_which_refuse_it():
    # Both pack paths share these decisions, so they are checked here by what they accept.
    from tenferro.dtypes import by_name
    from tenferro.signature import PTR, Param, Signature

    f32 = by_name("f32")

    def span(cls, ptr):
        return cls(ptr, (4,), (4,), f32, 0, None, _OURS)

    good = [
        span(tf.TensorMut, 0x1000),
        span(tf.TensorRef, 0x2000),
        tf.u64(5),
        tf.f32(1.0),
        tf.u32(3),
        tf.i64(1),
        tf.f64(2.0),
        tf.KernelArg.struct(b"s" * 12),
        tf.u64(9),
        span(tf.TensorRef, 0x3000),
    ]
    mixed = _signatures()[2]
    for pack in (lambda b, a: b.pack(a, _OURS, "session.launch"), lambda b, a: _general(b, a)):
        assert len(pack(ParamBlock(mixed), good)) == 3
        for i, ok in (
            (2, True),
            (8, True),
            (9, True),
            (5, False),
            (6, False),
            (3, False),
            (4, False),
            (7, False),
        ):
            args = list(good)
            args[i] = span(tf.TensorMut, 0x4000)
            if ok:  # a pointer-or-int, an 8-byte opaque value, an untyped pointer
                assert args[i] in pack(ParamBlock(mixed), args)
            else:
                with pytest.raises(
                    tf.ValidationError,
                    match=rf"^session\.launch: args\[{i}\] expects .*, got a "
                    r"TensorMut \(pointer\)",
                ):
                    pack(ParamBlock(mixed), args)
        args = list(good)
        args[0] = span(tf.TensorRef, 0x4000)
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: args\[0\] is a "
            r"read-only TensorRef but kernel 'mixed' writes parameter out",
        ):
            pack(ParamBlock(mixed), args)
    unnamed = Signature("w", (Param(PTR, 8, 8), Param(PTR, 8, 8, writes=True)), "test")
    with pytest.raises(
        tf.ValidationError,
        match=r"kernel 'w' writes parameter 1; use "
        r"tensor_mut\(\)",
    ):
        ParamBlock(unnamed).pack(
            [span(tf.TensorRef, 0x10), span(tf.TensorRef, 0x20)], _OURS, "session.launch"
        )


def _span(cls, ptr, t, readonly=False):
    from tenferro.dtypes import by_name

    t = by_name(t)
    return cls(ptr, (4,), (t.itemsize,), t, 0, None, _OURS, readonly)


def _typed():
    """`TYPED`'s signature, read within the test that asks (the compile cache answers)."""
    return tf.compile_cuda(TYPED).signatures["t"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "y",
            _span(tf.TensorMut, 0x9000, "f64"),
            r"args\[0\] 'y' is float64, the kernel takes float\*",
        ),
        (
            "x",
            _span(tf.TensorRef, 0x9000, "f64"),
            r"args\[1\] 'x' is float64, the kernel takes const float\*",
        ),
        (
            "x",
            _span(tf.TensorRef, 0x9000, "i32"),
            r"args\[1\] 'x' is int32, the kernel takes const float\*",
        ),
        (
            "d",
            _span(tf.TensorRef, 0x9000, "f32"),
            r"args\[2\] 'd' is float32, the kernel takes const double\*",
        ),
        (
            "z",
            _span(tf.TensorMut, 0x9000, "f64"),
            r"args\[6\] 'z' is float64, the kernel takes float2\*",
        ),
        (
            "h",
            _span(tf.TensorRef, 0x9000, "bf16"),
            r"args\[7\] 'h' is bf16, the kernel takes const __half\*",
        ),
        (
            "h",
            tf.KernelArg.pointer(_span(tf.TensorRef, 0x9000, "u8")),
            r"args\[7\] 'h' is uint8, the kernel takes const __half\*",
        ),
    ],
)
def test_a_span_of_another_dtype_is_refused_for_a_typed_pointer(name, value, message):
    for pack in _both_packs():
        b = ParamBlock(_typed())
        good = _typed_args()
        pack(b, good)
        before = bytes(b._mv)
        with pytest.raises(tf.ValidationError, match=rf"^session\.launch: {message}$"):
            pack(b, _typed_args(**{name: value}))
        assert b.last_args == ()  # nothing is taken as checked: the next launch packs anew
        pack(b, good)
        assert bytes(b._mv) == before


@pytest.mark.parametrize(
    ("name", "dtypes"),
    [
        ("y", ["f32"]),
        ("x", ["f32"]),
        ("d", ["f64"]),
        ("h", ["f16"]),
        ("z", ["f32", "c64"]),
        ("v", ["f64", "u8", "bf16", "c128", "bool"]),
        ("c", ["f64", "u8", "i8", "f16"]),
        ("u", ["f32", "u8", "i64"]),
    ],
)
def test_a_typed_pointer_takes_its_element_type_and_untyped_ones_take_any(name, dtypes):
    # float2* is a pair of floats (and complex64's layout); void*, char*, unsigned char* are bytes
    i = [p.name for p in _typed().params].index(name)
    for pack in _both_packs():
        for t in dtypes:
            cls = tf.TensorRef if _typed().params[i].c_type.pointee.is_const else tf.TensorMut
            args = _typed_args(**{name: _span(cls, 0x9000, t)})
            pack(ParamBlock(_typed()), args)
            ws = tf.DeviceBytes(0xA000, (16,), (1,), args[i].scalar_type, 0, None, _OURS)
            pack(ParamBlock(_typed()), _typed_args(**{name: ws}))  # a workspace is untyped
        b = ParamBlock(_typed())
        pack(b, _typed_args(**{name: _span(tf.TensorMut, 0xBBB0, dtypes[0])}))
        assert _read(b, i, "<Q") == 0xBBB0


def test_memory_its_producer_marked_read_only_needs_a_const_pointer():
    frozen = _span(tf.TensorRef, 0x9000, "f32", readonly=True)
    for pack in _both_packs():
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: args\[0\] 'y' is memory "
            r"its producer marked read-only, the kernel takes float\*; declare it "
            r"const if the kernel only reads it$",
        ):
            pack(ParamBlock(_typed()), _typed_args(y=frozen))
        pack(ParamBlock(_typed()), _typed_args(x=frozen))  # const float*: read-only memory goes
        # A read-only span of writable memory is the caller's choice: a non-const pointer takes it
        pack(ParamBlock(_typed()), _typed_args(y=_span(tf.TensorRef, 0x9000, "f32")))
        pack(ParamBlock(_typed()), _typed_args(c=frozen))  # const char*
        with pytest.raises(
            tf.ValidationError,
            match=r"args\[3\] 'v' is memory its producer "
            r"marked read-only, the kernel takes void\*;",
        ):
            pack(ParamBlock(_typed()), _typed_args(v=frozen))


@pytest.mark.parametrize(
    ("name", "accepted", "refused", "takes"),
    [
        (
            "n",
            [tf.u32(0), tf.u32(2**32 - 1), np.uint32(5)],
            [tf.i32(5), tf.u64(5), tf.u16(5), np.int32(5)],
            "unsigned int",
        ),
        ("i", [tf.i32(-(2**31)), np.int32(3)], [tf.u32(5), tf.i64(5), np.uint32(5)], "int"),
        ("ch", [tf.i8(-128), tf.u8(255)], [tf.i16(1), tf.u16(1)], "char"),
        ("m", [tf.u64(2**64 - 1)], [tf.i64(1), tf.u32(1), np.int64(1)], "unsigned long long"),
    ],
)
def test_a_scalar_must_have_the_parameters_signedness_and_width(name, accepted, refused, takes):
    i = [p.name for p in _typed().params].index(name)
    for pack in _both_packs():
        for a in accepted:
            b = ParamBlock(_typed())
            pack(b, _typed_args(**{name: a}))
            size = _typed().params[i].size
            want = a.data if isinstance(a, tf.KernelArg) else a.tobytes()
            assert bytes(b._mv[b.offsets[i] : b.offsets[i] + size]) == want
        for a in refused:
            what = (
                f"an? {a.scalar_type.name} scalar"
                if isinstance(a, tf.KernelArg)
                else f"a numpy {a.dtype} scalar"
            )
            with pytest.raises(
                tf.ValidationError,
                match=rf"^session\.launch: args\[{i}\] "
                rf"'{name}' is {what}, the kernel takes {takes}$",
            ):
                pack(ParamBlock(_typed()), _typed_args(**{name: a}))


@pytest.mark.parametrize(
    ("name", "last", "first_refused", "type_name"),
    [
        ("n", 2**32 - 1, 2**32, "u32"),
        ("n", 0, -1, "u32"),
        ("i", 2**31 - 1, 2**31, "i32"),
        ("i", -(2**31), -(2**31) - 1, "i32"),
        ("ch", 127, 128, "i8"),
        ("m", 2**64 - 1, 2**64, "u64"),
        ("m", 0, -1, "u64"),
    ],
)
def test_a_python_int_is_range_checked_into_the_c_type(name, last, first_refused, type_name):
    i = [p.name for p in _typed().params].index(name)
    size = _typed().params[i].size
    for pack in _both_packs():
        b = ParamBlock(_typed())
        pack(b, _typed_args(**{name: last}))
        signed = type_name[0] == "i"
        assert (
            int.from_bytes(b._mv[b.offsets[i] : b.offsets[i] + size], "little", signed=signed)
            == last
        )
        with pytest.raises(
            tf.ValidationError,
            match=rf"^session\.launch: args\[{i}\]: "
            rf"{first_refused} is out of range for {type_name}",
        ):
            pack(ParamBlock(_typed()), _typed_args(**{name: first_refused}))


def test_ptx_without_source_keeps_the_kind_checks_only():
    # PTX cannot say what a .u64 points to: a span of any dtype goes, as the README says.
    b = ParamBlock(parse_ptx(PTX_ONLY, "t")["raw"])
    b.pack([_span(tf.TensorMut, 0x9000, "f64"), tf.u32(3), tf.f32(1.0)], _OURS, "session.launch")
    b.pack([_span(tf.TensorMut, 0x9000, "u8"), tf.u32(3), tf.f32(1.0)], _OURS, "session.launch")
    assert _read(b, 0, "<Q") == 0x9000


# --- what the tests above leave to module-level objects, checked within tests ---------------


def test_a_pointer_kernelarg_passes_its_span():
    span = _span(tf.TensorMut, 0x9000, "f32")
    a = tf.KernelArg.pointer(span)
    assert (a.kind, a.scalar_type, a.data, a.span) == (1, None, b"", span)
    b = ParamBlock(_typed())
    assert b.pack(_typed_args(y=a), _OURS, "session.launch")[0] is span
    assert _read(b, 0, "<Q") == 0x9000
    with pytest.raises(
        tf.ValidationError,
        match=r"^KernelArg\.pointer: span must be a TensorRef, "
        r"TensorMut or DeviceBytes, got int$",
    ):
        tf.KernelArg.pointer(0x9000)


def test_the_pointer_array_the_driver_reads_points_at_each_parameter():
    b = ParamBlock(_typed())
    n = len(b.offsets)
    ptrs = (ctypes.c_void_p * n).from_address(b.address)
    assert [ptrs[i] for i in range(n)] == [ctypes.addressof(b._buf) + o for o in b.offsets]
    assert b.offsets == tuple(sorted(b.offsets)) and b.offsets[-1] + 8 <= len(b._buf)


def test_a_kernel_without_parameters_packs_nothing():
    sig = tf.compile_cuda('extern "C" __global__ void e() {}').signatures["e"]
    b = ParamBlock(sig)
    assert b.pack([], _OURS, "session.launch") == []
    assert b.pack((), _OURS, "session.launch") == []
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: kernel 'e' takes 0 "
        r"argument\(s\), got 1$",
    ):
        b.pack([tf.u32(1)], _OURS, "session.launch")


PTX_KINDS = """
.visible .entry kinds(.param .u32 kinds_param_0, .param .f32 kinds_param_1,
                      .param .u64 kinds_param_2, .param .u8 kinds_param_3)
{ ret; }
"""


@pytest.mark.parametrize(
    ("i", "accepted", "refused"),
    [
        (0, [tf.u32(1), tf.i32(-1)], [tf.f32(1.0), tf.u16(1), tf.u64(1)]),  # .u32: any 32-bit int
        (1, [tf.f32(1.0)], [tf.u32(1), tf.i32(1), tf.f64(1.0)]),  # .f32
        (2, [tf.u64(1), tf.i64(-1)], [tf.f64(1.0), tf.u32(1)]),  # .u64: pointer or int
        (3, [tf.u8(1), tf.i8(-1), tf.KernelArg.scalar(True, "bool")], [tf.u16(1)]),  # .u8
    ],
)
def test_ptx_parameters_take_scalars_by_kind_and_width(i, accepted, refused):
    sig = parse_ptx(PTX_KINDS)["kinds"]
    good = [tf.u32(1), tf.f32(1.0), tf.u64(1), tf.u8(1)]
    for a in accepted:
        b = ParamBlock(sig)
        b.pack([*good[:i], a, *good[i + 1 :]], _OURS, "session.launch")
        off = b.offsets[i]
        assert bytes(b._mv[off : off + len(a.data)]) == a.data
    for a in refused:
        with pytest.raises(
            tf.ValidationError,
            match=rf"^session\.launch: args\[{i}\] expects "
            rf".*, got {a.describe()}$",
        ):
            ParamBlock(sig).pack([*good[:i], a, *good[i + 1 :]], _OURS, "session.launch")


@pytest.mark.parametrize(
    ("value", "ok"),
    [(-(1 << 31), True), (-(1 << 31) - 1, False), ((1 << 32) - 1, True), (1 << 32, False)],
)
def test_a_python_int_for_a_ptx_int_takes_either_reading_of_its_width(value, ok):
    sig = parse_ptx(PTX_KINDS)["kinds"]
    args = [value, tf.f32(1.0), tf.u64(1), tf.u8(1)]
    if ok:
        b = ParamBlock(sig)
        b.pack(args, _OURS, "session.launch")
        assert bytes(b._mv[0:4]) == (value & 0xFFFFFFFF).to_bytes(4, "little")
    else:
        with pytest.raises(
            tf.ValidationError,
            match=rf"^session\.launch: args\[0\]: {value} "
            r"does not fit a 32-bit integer parameter$",
        ):
            ParamBlock(sig).pack(args, _OURS, "session.launch")


def test_a_refusal_without_a_c_type_says_what_was_expected_and_given():
    sig = parse_ptx(PTX_KINDS)["kinds"]
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] expects f32, got "
        r"f64 scalar$",
    ):
        ParamBlock(sig).pack([1, tf.f64(1.0), tf.u64(1), tf.u8(1)], _OURS, "session.launch")
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] expects f32, got "
        r"numpy float64 scalar$",
    ):
        ParamBlock(sig).pack([1, np.float64(1.0), tf.u64(1), tf.u8(1)], _OURS, "session.launch")


def test_a_struct_for_an_opaque_parameter_is_checked_by_size():
    from tenferro.signature import from_driver_layout

    sig = from_driver_layout("cubin_kernel", [(0, 8), (8, 4)])
    b = ParamBlock(sig)
    b.pack([tf.KernelArg.struct(b"12345678"), tf.KernelArg.struct(b"abcd")], _OURS, "op")
    assert bytes(b._mv[0:12]) == b"12345678abcd"
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: args\[1\] expects 4-byte value, got "
        r"8-byte struct$",
    ):
        ParamBlock(sig).pack([tf.u64(1), tf.KernelArg.struct(b"12345678")], _OURS, "op")


def test_an_unnamed_parameter_is_named_by_its_position():
    sig = tf.compile_cuda('extern "C" __global__ void u(float*, int) {}').signatures["u"]
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[0\] is float64, the "
        r"kernel takes float\*$",
    ):
        ParamBlock(sig).pack([_span(tf.TensorMut, 0x9000, "f64"), 1], _OURS, "session.launch")


def test_numpy_scalars_of_types_the_device_lacks_are_refused_naming_the_argument():
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[8\]: dtype float128 "
        r"is not supported on the device$",
    ):
        ParamBlock(_typed()).pack(_typed_args(n=np.longdouble(1)), _OURS, "session.launch")


def test_kernelarg_scalar_names_itself_in_its_refusals():
    with pytest.raises(
        tf.ValidationError,
        match=r"^KernelArg\.scalar: dtype float128 is not "
        r"supported on the device$",
    ):
        tf.KernelArg.scalar(1, np.longdouble)
    with pytest.raises(
        tf.ValidationError,
        match=r"^KernelArg\.scalar\(u8\): 256 is out of "
        r"range for u8",
    ):
        tf.KernelArg.scalar(256, np.uint8)
    assert tf.KernelArg.scalar(255, np.uint8).data == b"\xff"


def test_an_empty_argument_list_is_counted_when_nothing_is_remembered():
    # An empty list matches an empty memory by identity: it must still be counted, or a launch
    # after a synchronize (which forgets) would run with the bytes of an earlier one.
    block = _block()
    s = object()
    for _ in range(2):  # before any pack, and after a forget
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: kernel 'k' takes 6 "
            r"argument\(s\), got 0",
        ):
            block.pack([], s, "session.launch")
        with pytest.raises(tf.ValidationError, match=r"takes 6 argument\(s\), got 0"):
            super(ParamBlock, block).pack((), s, "session.launch")  # the general loop too
        block.forget()
    none = ParamBlock(tf.compile_cuda('extern "C" __global__ void z() {}').signatures["z"])
    assert none.pack([], s, "session.launch") == [] and none.pack([], s, "op") == []


_THREE = r"""extern "C" __global__ void three(float* a, const float* b, float* c, unsigned n) {}"""


@pytest.mark.parametrize(
    ("ptrs", "names"),
    [
        ((0x1000, 0x2000, 0x100C), ("0] (TensorMut", "2] (TensorMut")),  # a and c share a float
        ((0x1000, 0x2000, 0x2004), ("1] (TensorRef", "2] (TensorMut")),  # b and c
        ((0x1000, 0x100C, 0x3000), ("0] (TensorMut", "1] (TensorRef")),  # a and b
    ],
)
def test_each_pair_of_three_spans_is_checked_for_overlap(ptrs, names):
    b = _block(_THREE, "three")
    a, r, c = ptrs
    with pytest.raises(
        tf.ValidationError,
        match=re.escape(f"session.launch: args[{names[0]}) and args[{names[1]}) overlap"),
    ):
        b.pack([_mut(a), _ref(r), _mut(c), tf.u32(4)], None, "session.launch")
    # each span just past the one before it: the last placement accepted
    b.pack([_mut(0x1000), _ref(0x1010), _mut(0x1020), tf.u32(4)], None, "session.launch")
    assert _read(b, 2, "<Q") == 0x1020


def test_the_generated_pack_says_where_its_source_is_built():
    import traceback

    from tenferro.signature import parse_ptx

    block = ParamBlock(parse_ptx(PTX_ONLY)["raw"])
    generated = block.pack_new  # made from source at run time, as its `pack` is
    assert "tenferro.args.ParamBlock._straight_line_pack" in generated.__doc__
    assert generated.__code__.co_filename == "<tenferro.args.ParamBlock._straight_line_pack>"
    with pytest.raises(tf.ValidationError) as refused:  # a string where a pointer goes
        block.pack(["text", tf.u32(1), tf.f32(1.0)], _OURS, "session.launch")
    frames = traceback.extract_tb(refused.value.__traceback__)
    assert any(f.filename == "<tenferro.args.ParamBlock._straight_line_pack>" for f in frames)


def test_a_typed_scalar_of_a_structs_size_is_refused_where_the_compiler_named_the_struct():
    src = r"""struct P { float a; float b; }; enum Mode { A, B };
    extern "C" __global__ void s(P p, Mode m, float* o) {}"""
    b = _block(src, "s")
    struct = tf.KernelArg.struct(struct_bytes := bytes(range(8)))
    b.pack([tf.KernelArg.struct(bytes(8)), tf.i32(5), _mut(8)], None, "session.launch")
    before = b.snapshot()
    for scalar in (tf.f64(1.0), tf.u64(7), tf.i64(-1)):  # 8 bytes, as P is: still refused
        with pytest.raises(
            tf.ValidationError,
            match=r"^session\.launch: args\[0\] 'p' is an? [fiu]64 scalar, the kernel takes P "
            r"\(8 bytes, aligned to 4\); pass the struct itself \(a ctypes\.Structure, a numpy "
            r"structured scalar\) or its bytes with tf\.KernelArg\.struct$",
        ):
            b.pack([scalar, tf.i32(1), _mut(8)], None, "session.launch")
        assert b.snapshot() == before  # a refused pack wrote nothing
    b.pack([struct, tf.i32(1), _mut(8)], None, "session.launch")  # the struct itself
    assert ctypes.string_at(ctypes.addressof(b._buf), 8) == struct_bytes
    b.pack([struct, tf.u32(1), _mut(8)], None, "session.launch")  # an enum takes its int


def test_ptx_alone_still_takes_a_scalar_of_a_by_value_parameters_size():
    ptx = parse_ptx(".entry s(.param .align 4 .b8 s_param_0[8], .param .u64 s_param_1)")["s"]
    ParamBlock(ptx).pack([tf.f64(1.0), _mut(8)], None, "session.launch")  # no C type to say


def _in_args_code(code):  # tenferro.args and the pack it generates
    return "tenferro" in code.co_filename and "args" in code.co_filename


def test_an_interrupt_anywhere_in_a_pack_leaves_no_half_packed_block_behind():
    from _stand_ins import finishes_despite_interrupt_at

    op = "session.launch"
    y, x = _mut(0x1000), _ref(0x2000)
    first = [y, x, tf.f32(1.5), tf.u32(7), tf.f64(2.25), tf.i64(-3)]
    second = [y, x, tf.f32(-4.0), tf.u32(9), tf.f64(8.5), tf.i64(11)]
    fresh = _block()

    def packed(args):
        fresh.pack(args, None, op)
        return fresh.snapshot()

    expect_first, expect_second = packed(first), packed(second)
    b = _block()
    b.pack(first, None, op)
    interrupted = 0
    for n in range(1, 500):
        finished = finishes_despite_interrupt_at(n, _in_args_code, lambda: b.pack(second, None, op))
        # Whatever the interrupt left, the next pack writes exactly its own arguments: the
        # last complete one's again (no shortcut past half-written bytes), then the other.
        assert b.pack(first, None, op) == [y, x] and b.snapshot() == expect_first, n
        assert b.pack(second, None, op) == [y, x] and b.snapshot() == expect_second, n
        b.pack(first, None, op)
        if finished:
            break
        interrupted += 1
    assert finished and interrupted >= 10  # every line of the pack was an interrupt point


def test_a_complex_parameter_takes_python_and_numpy_complex_numbers_at_its_width():
    # cuFloatComplex and cuDoubleComplex are float2 and double2, as the compiler names them.
    block = _block(COMPLEX, "z")
    assert [p.scalar.name if p.scalar else None for p in block.params[1:3]] == ["c64", "c128"]
    for i, value, packed in (
        (1, 1 + 2j, struct.pack("<ff", 1, 2)),
        (1, np.complex64(-3 + 0.5j), struct.pack("<ff", -3, 0.5)),
        (1, 2.5, struct.pack("<ff", 2.5, 0)),  # a real number is a complex one
        (1, tf.KernelArg.scalar(1j, np.complex64), struct.pack("<ff", 0, 1)),
        (1, tf.KernelArg.struct(struct.pack("<ff", 7, 8)), struct.pack("<ff", 7, 8)),
        (2, 1e308 - 1e308j, struct.pack("<dd", 1e308, -1e308)),
        (2, np.complex128(4j), struct.pack("<dd", 0, 4)),
        (2, 7, struct.pack("<dd", 7, 0)),
    ):
        block.pack_slot(i, value, None, "session.launch")
        assert bytes(block._mv[block.slices[i]]) == packed, (i, value)


@pytest.mark.parametrize(
    ("i", "value", "message"),
    [
        (1, 1e39j, r"args\[1\]: 1e\+39j overflows c64 \(a part rounds past "),
        (
            1,
            np.complex128(1j),
            r"args\[1\] 'a' is a numpy complex128 scalar, the kernel takes float2",
        ),
        (
            2,
            np.complex64(1j),
            r"args\[2\] 'b' is a numpy complex64 scalar, the kernel takes double2",
        ),
        (1, True, r"args\[1\] is a bare Python bool but the parameter is"),
        (3, 1 + 0j, r"args\[3\]: f32 needs a real number, got complex \(1\+0j\)"),
        (4, 2j, r"args\[4\] is a bare Python complex but the parameter is i32"),
    ],
)
def test_complex_numbers_refused_where_they_do_not_fit_leave_the_block_as_it_was(i, value, message):
    block = _block(COMPLEX, "z")
    before = bytes(block._mv)
    with pytest.raises(tf.ValidationError, match=rf"^session\.launch: {message}"):
        block.pack_slot(i, value, None, "session.launch")
    assert bytes(block._mv) == before


class _MyInt(ctypes.c_int):
    """A ctypes subclass, as bindings generators make them."""


def test_ctypes_numbers_pack_at_their_c_types_width():
    block = _block()  # k(float* y, const float* x, float a, unsigned n, double d, long long q)
    for i, value, fmt, want in (
        (2, ctypes.c_float(1.5), "<f", 1.5),
        (3, ctypes.c_uint(7), "<I", 7),
        (3, ctypes.c_uint32(0xFFFFFFFF), "<I", 0xFFFFFFFF),
        (4, ctypes.c_double(-2.25), "<d", -2.25),
        (5, ctypes.c_longlong(-(1 << 62)), "<q", -(1 << 62)),
        (5, ctypes.c_int64(5), "<q", 5),
    ):
        block.pack_slot(i, value, None, "session.launch")
        assert _read(block, i, fmt) == want, (i, value)
    mine = _block(COMPLEX, "z")
    mine.pack_slot(4, _MyInt(-4), None, "session.launch")
    assert _read(mine, 4, "<i") == -4


@pytest.mark.parametrize(
    ("i", "value", "message"),
    [
        (
            3,
            ctypes.c_int(7),
            r"args\[3\] 'n' is a ctypes c_int \(i32\), the kernel takes unsigned int",
        ),
        (
            2,
            ctypes.c_double(1.0),
            r"args\[2\] 'a' is a ctypes c_double \(f64\), the kernel takes float",
        ),
        (
            5,
            ctypes.c_int32(1),
            r"args\[5\] 'q' is a ctypes c_int \(i32\), the kernel takes long long",
        ),
        (
            3,
            ctypes.c_void_p(0x1000),
            r"args\[3\] is a ctypes c_void_p, an address; pass memory as a span",
        ),
        (3, ctypes.c_char_p(b"x"), r"args\[3\] is a ctypes c_char_p, an address"),
        (3, ctypes.c_char(b"x"), r"args\[3\] is a ctypes c_char, a character; pass a number"),
        (4, ctypes.c_longdouble(1.0), r"args\[4\] is a ctypes c_longdouble, a C type no kernel "),
    ],
)
def test_ctypes_values_of_another_type_or_no_number_are_refused_and_nothing_written(
    i, value, message
):
    block = _block()
    before = bytes(block._mv)
    with pytest.raises(tf.ValidationError, match=rf"^session\.launch: {message}"):
        block.pack_slot(i, value, None, "session.launch")
    assert bytes(block._mv) == before


STRUCTS = r"""
struct Affine { float scale; float shift; };
struct Mixed { float a; double b; };
extern "C" __global__ void st(float* y, Affine p, Mixed m, unsigned n) {}
"""


class _Affine(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("shift", ctypes.c_float)]


class _Mixed(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_double)]


class _MixedPacked(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_double)]


_AFFINE = np.dtype([("scale", "<f4"), ("shift", "<f4")], align=True)
_MIXED = np.dtype([("a", "<f4"), ("b", "<f8")], align=True)
_MIXED_PACKED = np.dtype([("a", "<f4"), ("b", "<f8")])  # no align=True: no C padding


def test_ctypes_and_numpy_structs_go_by_value_where_the_kernel_takes_that_struct():
    b = _block(STRUCTS, "st")
    for i, value, want in (
        (1, _Affine(1.5, -2.0), struct.pack("<ff", 1.5, -2.0)),
        (1, np.array((1.5, -2.0), _AFFINE)[()], struct.pack("<ff", 1.5, -2.0)),
        (2, _Mixed(3.0, 0.25), struct.pack("<f4xd", 3.0, 0.25)),
        (2, np.array((3.0, 0.25), _MIXED)[()], struct.pack("<f4xd", 3.0, 0.25)),
    ):
        b.pack_slot(i, value, None, "session.launch")
        got = bytes(b._mv[b.slices[i]])
        assert got[:4] == want[:4] and got[-8:] == want[-8:], (i, value)  # the padding aside
    b.pack([_mut(8), _Affine(1, 2), _Mixed(3, 4), 7], None, "session.launch")  # in a launch


@pytest.mark.parametrize(
    ("i", "value", "got"),
    [
        (2, _MixedPacked(1, 2), "a struct of 12 bytes, aligned to 1"),
        (2, np.array((1, 2), _MIXED_PACKED)[()], "a struct of 12 bytes, aligned to 1"),
        (1, _Mixed(1, 2), "a struct of 16 bytes, aligned to 8"),
        (3, _Affine(1, 2), "a struct of 8 bytes, aligned to 4"),
    ],
)
def test_a_struct_of_another_size_or_alignment_is_refused_and_nothing_written(i, value, got):
    b = _block(STRUCTS, "st")
    before = b.snapshot()
    takes = {1: r"Affine \(8 bytes, aligned to 4\)", 2: r"Mixed \(16 bytes, aligned to 8\)"}
    name = {1: "p", 2: "m", 3: "n"}[i]
    with pytest.raises(
        tf.ValidationError,
        match=rf"^session\.launch: args\[{i}\] '{name}' is {got}, the kernel takes "
        + takes.get(i, "unsigned int"),
    ):
        b.pack_slot(i, value, None, "session.launch")
    assert b.snapshot() == before


# --- a graph condition as an argument -------------------------------------------------------------

CONDITION_SRC = r"""
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __global__ void c(cudaGraphConditionalHandle h, float x, long long s) {}
"""


def test_a_graph_condition_packs_its_handle_only_inside_its_capture():
    import types

    from tenferro.conditions import GraphCondition

    block = _block(CONDITION_SRC, "c")
    state, other_state = object(), object()
    capture = types.SimpleNamespace(running=True)
    cond = GraphCondition(state, capture, 0x1234_5678_9ABC, 1, 0)
    block.pack([cond, 1.0, 5], state, "session.launch")
    assert _read(block, 0, "<Q") == 0x1234_5678_9ABC
    block.pack([tf.u64(7), 1.0, cond], state, "session.launch")  # a long long takes it too
    assert _read(block, 2, "<q") == 0x1234_5678_9ABC
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.launch: args\[1\] 'x' is a GraphCondition \(a 64-bit handle\), the "
        r"kernel takes float$",
    ):
        block.pack([cond, cond, 5], state, "session.launch")
    with pytest.raises(
        tf.ValidationError, match=r"^session\.launch: args\[0\] is a GraphCondition of another"
    ):
        block.pack([cond, 1.0, 5], other_state, "session.launch")
    capture.running = False
    with pytest.raises(
        tf.ValidationError,
        match=r"^bound_launch\.update: args\[0\] is a GraphCondition of a capture that has ended; "
        r"a condition is an argument only inside the capture that made it",
    ):
        block.pack([cond, 1.0, 5], state, "bound_launch.update")
    assert _read(block, 2, "<q") == 0x1234_5678_9ABC  # the refusals wrote nothing


def test_a_slot_replaced_makes_the_next_pack_of_the_old_list_write_it_all_again():
    b = _block()
    first = [_mut(0x1000), _ref(0x2000), tf.f32(1.5), tf.u32(7), 2.0, 3]
    b.pack(first, None, "session.launch")
    _, spans = b.replace(first, 0, _mut(0x5000), None, "graph_kernel.update")
    assert _read(b, 0, "<Q") == 0x5000 and [sp.ptr for sp in spans] == [0x5000, 0x2000]
    b.pack(first, None, "graph_kernel.set_args")  # the very objects packed before the replace
    assert _read(b, 0, "<Q") == 0x1000, "the block holds what it was last given, not a list"
    with pytest.raises(tf.ValidationError, match=r"^graph_kernel\.update: index=6 is out"):
        b.replace(first, 6, 1, None, "graph_kernel.update")
    with pytest.raises(
        tf.ValidationError, match=r"^graph_kernel\.update: args\[0\] .* and args\[1\] .* overlap"
    ):
        b.replace(first, 1, _ref(0x1000), None, "graph_kernel.update")
    assert _read(b, 1, "<Q") == 0x2000  # a refused replace writes nothing
