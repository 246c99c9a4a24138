"""What the kernels' tests share: the edge sizes and poisoned outputs."""

import numpy as np

SIZES = [0, 1, 31, 33, (1 << 20) + 7]


def poisoned(s, shape, dtype):
    """An output pre-filled with NaN (or a sentinel for ints), so unwritten elements show."""
    dt = np.dtype(dtype)
    fill = np.nan if dt.kind == "f" else np.iinfo(dt).max
    return s.upload(np.full(shape, fill, dtype=dt))
