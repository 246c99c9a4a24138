"""Reading the CUDA Array Interface (tenferro.interop.cai): v2 and v3 dicts, their refusals,
and crafted dicts read right or refused."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenferro as tf
from tenferro import dtypes as tf_dtypes
from tenferro.interop import read_cai
from tenferro.spans import c_strides


def test_cai_v3_fields(cai):
    f = read_cai(cai(0x7000, (4, 6), "<f4", strides=(4, 16), readonly=True, stream=2), "op")
    assert (f.ptr, f.shape, f.strides, f.scalar_type.name, f.readonly, f.stream) == (
        0x7000,
        (4, 6),
        (4, 16),
        "f32",
        True,
        2,
    )
    g = read_cai(cai(0x8000, (3, 5), "<i2", version=2, stream=77), "op")
    assert g.strides == (10, 2) and g.stream is None  # v2 has no stream to order after


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"mask": object()}, r"has a mask"),
        ({"stream": 0}, r"stream=0 is ambiguous"),
        ({"stream": -1}, r"stream=-1 is not a stream handle"),
        ({"stream": "s"}, r"stream='s' must be None, an int"),
        ({"version": 1}, r"version=1 is not supported"),
        ({"strides": (8,)}, r"strides=\(8,\) do not match shape=\(2, 2\)"),
    ],
)
def test_cai_refusals(cai, kw, msg):
    with pytest.raises(
        tf.ValidationError, match=r"session\.tensor: __cuda_array_interface__ " + msg
    ):
        read_cai(cai(0x7000, (2, 2), "<f8", **kw), "session.tensor")


def test_cai_bad_typestr_and_shape(cai):
    with pytest.raises(tf.ValidationError, match=r"op: __cuda_array_interface__ typestr='zz'"):
        read_cai(cai(0x7000, (2,), "zz"), "op")
    with pytest.raises(tf.ValidationError, match=r"op: dtype object is not supported"):
        read_cai(cai(0x7000, (2,), "|O"), "op")
    with pytest.raises(tf.ValidationError, match=r"shape=\(2, -1\) has a negative extent"):
        read_cai(cai(0x7000, (2, -1), "<f8"), "op")


# --- crafted CAI dicts: a right record or a clear refusal, never a crash ------------------


@st.composite
def cai_dicts(draw):
    ndim = draw(st.integers(0, 4))
    shape = draw(
        st.one_of(
            st.lists(st.integers(-1, 7), min_size=ndim, max_size=ndim).map(tuple),
            st.sampled_from([None, [2, 3], (2.0,), "4"]),
        )
    )
    return {
        "shape": shape,
        "typestr": draw(
            st.sampled_from(["<f4", "<f8", "|u1", "<i8", ">f4", "<c8", "|b1", "zz", "|O", 5])
        ),
        "data": draw(
            st.sampled_from(
                [
                    (0x7000, False),
                    (0x7000, True),
                    (0, False),
                    None,
                    [0x7000, False],
                    ("0x7000", False),
                ]
            )
        ),
        "strides": draw(
            st.one_of(
                st.none(),
                st.lists(st.integers(-64, 64), min_size=ndim, max_size=ndim).map(tuple),
                st.just((8,) * (ndim + 1)),
            )
        ),
        "version": draw(st.sampled_from([3, 3, 2, 1, "3"])),
        "stream": draw(st.sampled_from([None, 1, 2, 0x1234, 0, -1, "s", True])),
        "mask": draw(st.sampled_from([None, None, object()])),
    }


class _Producer:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@settings(max_examples=400, deadline=None)
@given(cai_dicts())
def test_cai_dicts_read_right_or_refused(cai):
    try:
        f = read_cai(_Producer(cai), "op")
    except tf.ValidationError as exc:
        assert str(exc).startswith("op: ")
        return
    assert isinstance(cai["version"], int) and cai["version"] >= 2 and cai["mask"] is None
    assert isinstance(cai["shape"], tuple) and f.shape == cai["shape"]
    assert all(n >= 0 for n in f.shape)
    assert (f.ptr, f.readonly) == (cai["data"][0], cai["data"][1])
    t = f.scalar_type
    assert np.dtype(cai["typestr"]) == t.numpy
    if cai["strides"] is None:
        assert f.strides == c_strides(f.shape, t.itemsize)
    else:
        assert f.strides == cai["strides"] and len(f.strides) == len(f.shape)
    if cai["version"] >= 3 and cai["stream"] is not None:
        assert (
            f.stream == cai["stream"]
            and f.stream not in (0,)
            and not isinstance(cai["stream"], bool)
        )
    else:
        assert f.stream is None


def test_cai_takes_zero_extents_keeps_its_producer_and_names_bad_fields():
    p = _Producer({"shape": (3, 0), "typestr": "<f4", "data": (0, False), "version": 3})
    f = read_cai(p, "op")
    assert f.shape == (3, 0) and f.owner is p
    for field, value in (("shape", (2.0,)), ("strides", (4.0,))):
        cai = {"shape": (1,), "typestr": "<f4", "data": (0x7000, False), "version": 3, field: value}
        with pytest.raises(
            tf.ValidationError,
            match=rf"^op: __cuda_array_interface__ "
            rf"{field}={re.escape(repr(value))} must "
            r"be a tuple of ints",
        ):
            read_cai(_Producer(cai), "op")


# --- records: a structured dtype's fields in descr ------------------------------------------------


def test_a_record_array_is_read_with_its_fields_from_descr(cai):
    padded = np.dtype({"names": ["x", "n"], "formats": ["<f4", "<i8"], "offsets": [0, 8]})
    producer = cai(0x7000, (3,), padded.str)
    producer.__cuda_array_interface__["descr"] = padded.descr  # as numba and CuPy give it
    f = read_cai(producer, "session.tensor")
    assert f.scalar_type.numpy == padded and f.strides == (16,)
    assert f.scalar_type is tf_dtypes.from_numpy(padded)


@pytest.mark.parametrize(
    "descr",
    [
        [("x", "<f4")],
        "nope",
        [("x",)],
        [],
        [("", "|V8"), ("", "|V8")],
        [("x", "<f4"), ("n", "<i8")],
    ],
)
def test_a_descr_that_is_not_the_records_fields_is_refused(cai, descr):
    producer = cai(0x7000, (3,), "|V16")
    producer.__cuda_array_interface__["descr"] = descr
    with pytest.raises(
        tf.ValidationError,
        match=r"^session\.tensor: __cuda_array_interface__ descr=.* is not a list of \(name, "
        r"typestr\) fields that make up the 16-byte record its typestr says",
    ):
        read_cai(producer, "session.tensor")
    good = cai(0x7000, (3,), "|V12")
    good.__cuda_array_interface__["descr"] = [("x", "<f4"), ("n", "<i4"), ("m", "<u4")]  # taken
    assert read_cai(good, "session.tensor").scalar_type.itemsize == 12


def test_a_struct_in_a_struct_is_read_from_its_nested_descr(cai):
    inner = np.dtype([("b", "u1"), ("c", "<f8")], align=True)
    nested = np.dtype([("a", "<f4"), ("inner", inner), ("d", "<i2", (2,))], align=True)
    producer = cai(0x7000, (3,), nested.str)
    producer.__cuda_array_interface__["descr"] = nested.descr  # padding at both levels
    t = read_cai(producer, "session.tensor").scalar_type
    assert t.numpy == nested and t is tf_dtypes.from_numpy(nested)


def test_a_record_array_without_descr_takes_its_fields_from_the_producers_dtype(cai):
    record = np.dtype([("x", "<f4"), ("n", "<i4")])
    producer = cai(0x7000, (3,), "|V8")  # as numba's device arrays give it: no descr
    producer.dtype = record
    assert read_cai(producer, "session.tensor").scalar_type.numpy == record
    producer.__cuda_array_interface__["descr"] = [("", "|V8")]  # the interface's default
    assert read_cai(producer, "session.tensor").scalar_type.numpy == record
    producer.dtype = np.dtype([("x", "<f8"), ("y", "<f8")])  # 16 bytes: not this typestr's
    with pytest.raises(tf.ValidationError, match=r"^session\.tensor: dtype \|V8 is not supported"):
        read_cai(producer, "session.tensor")
