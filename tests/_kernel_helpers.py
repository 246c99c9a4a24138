"""What the kernels' tests share: the edge sizes, poisoned outputs and shifted views."""

import numpy as np

SIZES = [0, 1, 31, 33, (1 << 20) + 7]


def poisoned(s, shape, dtype):
    """An output pre-filled with NaN (or a sentinel for ints), so unwritten elements show."""
    dt = np.dtype(dtype)
    fill = np.iinfo(dt).max if dt.kind in "iu" else np.nan  # floats, and ml_dtypes' bfloat16
    return s.upload(np.full(shape, fill, dtype=dt))


def shifted(tensor, n, typestr, itemsize, by=1):
    """A view of elements by..by+n-1 of ``tensor``; by=1 puts its pointer off the vector grid."""
    from conftest import CAI

    ptr = tensor.__cuda_array_interface__["data"][0] + by * itemsize
    return CAI(ptr, (n,), typestr, keep=tensor)
