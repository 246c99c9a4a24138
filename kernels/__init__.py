"""Ready kernels for a tenferro session, each checking its inputs as the session does.

``tenferro.kernels.axpy(s, y, x, a)`` and so on: every entry takes the session first, then
outputs, then inputs; arrays are tf.Tensors or anything ``s.tensor`` accepts (compact strides).
The CUDA C sources ship beside this module and compile once a session (NVRTC, disk-cached).
"""

from .gemm import matmul
from .maps import axpy, cast, elementwise, fill
from .reduce import max, sum
from .rows import cumsum, softmax, transpose

__all__ = [
    "axpy",
    "cast",
    "cumsum",
    "elementwise",
    "fill",
    "matmul",
    "max",
    "softmax",
    "sum",
    "transpose",
]
