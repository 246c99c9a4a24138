"""tenferro.dtypes: the one table of numpy dtype, DLPack code, PTX type and packing."""

import struct

import numpy as np
import pytest

import tenferro as tf
from tenferro import dtypes

# The DLPack standard's codes (dlpack.h DLDataTypeCode), written out here, not read from the
# package: a wrong code in the table would hand another library the wrong type.
DL = {"int": 0, "uint": 1, "float": 2, "bfloat": 4, "complex": 5, "bool": 6}


@pytest.mark.parametrize("t", dtypes.SCALAR_TYPES, ids=lambda t: t.name)
def test_each_row_agrees_with_numpy_dlpack_and_struct(t):
    assert dtypes.by_name(t.name) is t
    if t.numpy is not None:
        assert dtypes.from_numpy(t.numpy) is t and t.numpy.itemsize == t.itemsize
    kind = "bfloat" if t.name == "bf16" else t.kind
    assert (t.dl_code, t.dl_bits) == (DL[kind], 8 * t.itemsize)
    assert dtypes.from_dlpack(t.dl_code, t.dl_bits, 1) is t
    assert struct.calcsize(t.fmt) == t.itemsize


def test_from_numpy_takes_a_scalar_class_and_its_dtype_alike():
    for t in dtypes.SCALAR_TYPES:
        if t.numpy is not None:
            assert dtypes.from_numpy(t.numpy.type) is t and dtypes.from_numpy(t.numpy) is t
    assert dtypes.from_numpy(float).name == "f64" and dtypes.from_numpy(bool).name == "bool"
    with pytest.raises(tf.ValidationError, match=r"op: dtype >f4 is not supported"):
        dtypes.from_numpy(np.dtype(">f4"), "op")  # equal to no key, though its class is float32
    with pytest.raises(tf.ValidationError, match=r"op: dtype \[\] is not supported"):
        dtypes.from_numpy([], "op")  # unhashable: np.dtype reads it (an empty struct)


@pytest.mark.parametrize(
    ("dtype", "msg"),
    [
        (">f4", r"op: dtype >f4 is not supported on the device"),
        (object, r"op: dtype object is not supported"),
        ("U3", r"op: dtype <U3 is not supported"),
        ("not a dtype", r"op: 'not a dtype' is not a dtype"),
    ],
)
def test_from_numpy_refuses_by_name(dtype, msg):
    with pytest.raises(tf.ValidationError, match=msg):
        dtypes.from_numpy(dtype, "op")
    assert dtypes.from_numpy("<f4", "op").name == "f32"  # the same type in its own byte order


def test_lookups_refuse_what_the_table_lacks():
    with pytest.raises(tf.ValidationError, match=r"dtypes\.by_name: unknown scalar type 'f8'"):
        dtypes.by_name("f8")
    with pytest.raises(tf.ValidationError, match=r"op: DLPack dtype code=2 bits=24"):
        dtypes.from_dlpack(2, 24, 1, "op")
    with pytest.raises(tf.ValidationError, match=r"op: DLPack dtype with lanes=4"):
        dtypes.from_dlpack(2, 32, 4, "op")
    assert dtypes.from_dlpack(2, 32, 1, "op") is dtypes.by_name("f32")
    assert np.dtype(np.float32) == dtypes.by_name("f32").numpy


_INTS = [
    ("u8", 0, 255),
    ("u16", 0, 65535),
    ("u32", 0, 2**32 - 1),
    ("u64", 0, 2**64 - 1),
    ("i8", -128, 127),
    ("i16", -32768, 32767),
    ("i32", -(2**31), 2**31 - 1),
    ("i64", -(2**63), 2**63 - 1),
    ("bool", 0, 1),
]


@pytest.mark.parametrize(("name", "lo", "hi"), _INTS)
def test_the_general_packer_takes_exactly_each_integer_range(name, lo, hi):
    # tf.u8(255) packs Python ints itself; pack_scalar is what numpy integers, KernelArg.scalar
    # and bare numbers given for a known parameter type go through.
    t = dtypes.by_name(name)
    for v in (lo, hi, np.int64(lo) if lo >= -(2**63) else lo, np.uint64(hi) if hi < 2**64 else hi):
        assert int.from_bytes(
            dtypes.pack_scalar(t, v, "op"), "little", signed=t.kind == "int"
        ) == int(v)
    for v in (lo - 1, hi + 1):
        with pytest.raises(
            tf.ValidationError,
            match=rf"^op: {v} is out of range for {name} "
            rf"\[{lo}, {hi}\]",
        ):
            dtypes.pack_scalar(t, v, "op")


def test_the_general_packer_on_bools_and_non_integers():
    i32, b = dtypes.by_name("i32"), dtypes.by_name("bool")
    assert dtypes.pack_scalar(i32, True, "op") == (1).to_bytes(4, "little")  # a bool is 0 or 1
    assert dtypes.pack_scalar(b, np.bool_(True), "op") == b"\x01"
    assert dtypes.pack_scalar(b, False, "op") == b"\x00"
    for v, kind in ((1.0, "float"), (np.float32(2), "float32"), ("3", "str"), (None, "NoneType")):
        with pytest.raises(tf.ValidationError, match=rf"^op: i32 needs an integer, got {kind} "):
            dtypes.pack_scalar(i32, v, "op")
    with pytest.raises(tf.ValidationError, match=r"^op: f32 needs a real number, got str '1'"):
        dtypes.pack_scalar(dtypes.by_name("f32"), "1", "op")


def test_overflow_messages_name_each_types_largest_value():
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: 70000\.0 overflows f16 \(it rounds past "
        r"65504\.0\)",
    ):
        dtypes.pack_scalar(dtypes.by_name("f16"), 70000.0, "op")
    with pytest.raises(
        tf.ValidationError,
        match=r"^op: 1e\+39 overflows f32 \(it rounds past "
        r"3\.4028234663852886e\+38\)",
    ):
        dtypes.pack_scalar(dtypes.by_name("f32"), 1e39, "op")


@pytest.mark.parametrize(
    ("value", "bits"),
    [
        (1.0, 0x3F80),
        (-2.0, 0xC000),
        (float("inf"), 0x7F80),
        (float("-inf"), 0xFF80),
        (1.00390625, 0x3F80),  # exactly half way between 0x3F80 and 0x3F81: to the even one
        (1.01171875, 0x3F82),  # half way between 0x3F81 and 0x3F82: to the even one, up
        (3.3895313892515355e38, 0x7F7F),
    ],
)  # bf16's largest finite value
def test_bf16_rounds_to_nearest_even(value, bits):
    assert dtypes.pack_scalar(dtypes.by_name("bf16"), value, "op") == bits.to_bytes(2, "little")


def test_lookups_name_their_default_operation():
    with pytest.raises(tf.ValidationError, match=r"^dtype: 'nope' is not a dtype$"):
        dtypes.from_numpy("nope")
    with pytest.raises(tf.ValidationError, match=r"^dlpack: DLPack dtype code=2 bits=24 "):
        dtypes.from_dlpack(2, 24, 1)
    assert dtypes.from_numpy(">u1").name == "u8"  # one byte has no byte order


def test_an_integer_past_float64_is_named_by_its_length():
    for name in ("f32", "c64", "c128"):
        with pytest.raises(
            tf.ValidationError,
            match=rf"^op: an integer of 401 digits overflows "
            rf"{name}$",
        ):
            dtypes.pack_scalar(dtypes.by_name(name), -(10**400), "op")
    assert dtypes.pack_scalar(dtypes.by_name("f64"), 10**308, "op") == struct.pack("<d", 1e308)


def test_as_scalar_type_takes_a_scalar_type_as_it_is_and_names_the_caller_otherwise():
    f32 = dtypes.by_name("f32")
    assert dtypes.as_scalar_type(f32) is f32 and dtypes.as_scalar_type(np.float32) is f32
    with pytest.raises(tf.ValidationError, match=r"^module\.variable: 'nope' is not a dtype$"):
        dtypes.as_scalar_type("nope", "module.variable")
    with pytest.raises(tf.ValidationError, match=r"^dtype: dtype >i4 is not supported"):
        dtypes.as_scalar_type(np.dtype(">i4"))


def test_the_numpy_table_is_a_read_only_lookup_that_never_raises():
    import numpy as np

    from tenferro import dtypes

    assert dtypes.BY_NUMPY.get(np.dtype(np.float32)) is dtypes.by_name("f32")
    assert dtypes.BY_NUMPY.get(np.dtype(">f4")) is None  # big-endian: no device type
    assert dtypes.BY_NUMPY.get(np.dtype(object)) is None
    assert set(dtypes.BY_NUMPY.values()) == {t for t in dtypes.SCALAR_TYPES if t.numpy is not None}
    with pytest.raises(TypeError):
        dtypes.BY_NUMPY[np.dtype(np.float32)] = dtypes.by_name("f64")


def test_complex64_takes_what_rounds_to_float32s_largest_value_and_refuses_past_it():
    c64 = dtypes.by_name("c64")
    f32_max = float(np.finfo(np.float32).max)
    half_ulp = 2.0**103  # float32's largest value is (2 - 2**-23) * 2**127
    last = float(np.nextafter(f32_max + half_ulp, 0))  # rounds down, to the largest value
    first = f32_max + half_ulp  # the tie: rounds to even, which is infinity
    for part in (complex(last, 1), complex(-1, -last)):
        assert dtypes.pack_scalar(c64, part, "op") == struct.pack(
            "<ff", np.float32(part.real), np.float32(part.imag)
        )
        assert dtypes.pack_scalar(c64, part, "op") == dtypes.pack_scalar(
            dtypes.by_name("f32"), part.real, "op"
        ) + dtypes.pack_scalar(dtypes.by_name("f32"), part.imag, "op")
    for part in (complex(first, 0), complex(0, -first)):
        with pytest.raises(
            tf.ValidationError,
            match=r"^op: .* overflows c64 \(a part rounds past 3\.4028234663852886e\+38\)$",
        ):
            dtypes.pack_scalar(c64, part, "op")
    assert dtypes.pack_scalar(c64, complex("inf"), "op") == struct.pack("<ff", np.inf, 0)


# --- record types: numpy structured dtypes ---------------------------------------------------


def test_a_structured_dtype_is_one_record_type_whatever_its_alignment_flag():
    plain = np.dtype([("x", "<f4"), ("n", "<i4")])
    t = dtypes.from_numpy(plain)
    assert (t.kind, t.itemsize, t.numpy) == ("record", 8, plain)
    assert t.name == "record(x f32 @0, n i32 @4; 8 bytes)"  # a refusal tells layouts apart
    assert dtypes.from_numpy(np.dtype([("x", "<f4"), ("n", "<i4")], align=True)) is t
    assert dtypes.record_type(plain) is t and dtypes.as_scalar_type(plain) is t
    padded = np.dtype({"names": ["x", "n"], "formats": ["<f4", "<i8"], "offsets": [0, 8]})
    other = dtypes.from_numpy(padded)
    assert other is not t and other.itemsize == 16  # another layout, another type
    nested = np.dtype([("v", "<f4", (3,)), ("inner", [("a", "<i2"), ("b", "u1"), ("c", "u1")])])
    assert dtypes.from_numpy(nested).name == (
        "record(v f32[3] @0, inner record(a i16 @0, b u8 @2, c u8 @3; 4 bytes) @12; 16 bytes)"
    )
    # the last layouts accepted: each field at a multiple of its own alignment, and the size
    # a multiple of the widest one's; the struct aligned as that field
    assert dtypes.from_numpy(np.dtype([("n", "<i4"), ("d", "<f8")], align=True)).alignment == 8
    assert dtypes.from_numpy(np.dtype([("d", "<f8"), ("n", "<i4"), ("m", "<i4")])).alignment == 8
    assert dtypes.from_numpy(np.dtype([("b", "u1"), ("c", "u1"), ("h", "<i2")])).alignment == 2
    # a complex field is aligned as its parts, as numpy's align=True places it
    with_c64 = dtypes.from_numpy(np.dtype([("a", "<f4"), ("c", "<c8")], align=True))
    assert (with_c64.itemsize, with_c64.alignment) == (12, 4)
    with_c128 = dtypes.from_numpy(np.dtype([("a", "<i4"), ("z", "<c16")], align=True))
    assert (with_c128.itemsize, with_c128.alignment) == (24, 8)


@pytest.mark.parametrize(
    ("dtype", "msg"),
    [
        (np.dtype([("o", "O")]), r"holds Python objects"),
        (np.dtype([("x", ">f4")]), r"field 'x' \(>f4\) is not a device type in the host's"),
        (np.dtype([("s", "<U3")]), r"field 's' \(<U3\) is not a device type"),
        (np.dtype([("inner", [("a", ">i2")])]), r"field 'a' \(>i2\) is not a device type"),
        (np.dtype("V8"), r"dtype \|V8 is not supported on the device"),
        (
            np.dtype([("n", "<i4"), ("d", "<f8")]),
            r"field 'd' at offset 4 is not aligned to the 8 bytes the device reads it in; "
            r"make the dtype with align=True",
        ),
        (
            np.dtype([("d", "<f8"), ("n", "<i4")]),
            r"is 12 bytes, not a multiple of its 8-byte alignment, so every other element",
        ),
        (
            np.dtype([("b", "u1"), ("inner", [("a", "<i2")])]),
            r"field 'inner' at offset 1 is not aligned to the 2 bytes",
        ),
        (
            np.dtype([("a", "<i2"), ("z", "<c16")]),
            r"field 'z' at offset 2 is not aligned to the 8 bytes",
        ),
    ],
)
def test_record_types_refuse_what_the_device_cannot_hold(dtype, msg):
    with pytest.raises(tf.ValidationError, match=r"^session\.upload: .*" + msg):
        dtypes.from_numpy(dtype, "session.upload")
    assert dtype not in dtypes._RECORDS  # a refused layout leaves no type behind
    with pytest.raises(tf.ValidationError, match=r"^op: dtype int32 is not a structured dtype"):
        dtypes.record_type(np.dtype(np.int32), "op")


def test_a_record_whose_fields_are_out_of_order_is_refused_as_the_interface_cannot_say_it():
    swapped = np.dtype({"names": ["x", "y"], "formats": ["<f4", "<f4"], "offsets": [4, 0]})
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.upload: dtype .* has fields out of order or overlapping, which "
        r"__cuda_array_interface__ cannot describe; order its fields by offset",
    ):
        dtypes.from_numpy(swapped, "session.upload")
    ordered = np.dtype({"names": ["y", "x"], "formats": ["<f4", "<f4"], "offsets": [0, 4]})
    assert dtypes.from_numpy(ordered).itemsize == 8
