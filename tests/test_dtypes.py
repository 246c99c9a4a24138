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


@pytest.mark.parametrize(("dtype", "msg"), [
    (">f4", r"op: dtype >f4 is not supported on the device"),
    (object, r"op: dtype object is not supported"),
    ("U3", r"op: dtype <U3 is not supported"),
    ("not a dtype", r"op: 'not a dtype' is not a dtype"),
])
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
