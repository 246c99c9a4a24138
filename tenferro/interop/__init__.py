"""Everything that crosses to another library, both directions.

Imports read torch tensors and CuPy arrays through their own fields (`producers`), and any
other producer's array into a `Foreign` record (`read_foreign`: DLPack first, the CUDA Array
Interface otherwise; `check_memory` for the device); `tenferro.span_import` turns either into
a checked span of a session. Exports are ``Tensor.__dlpack__`` (`export`) and its CUDA Array
Interface. Stream values follow one rule (`stream_value`), a stream is ordered after another
one way (`order_after`), and spans made for a launch leave their producer's stream to the
session's `StreamOrdering`; see `tenferro.interop.streams`.
"""

from .cai import read_cai
from .dlpack import read_capsule, read_dlpack
from .dlpack_export import export, live_exports
from .foreign import check_memory, read_foreign
from .foreign_array import Foreign
from .streams import LEGACY, PER_THREAD, order_after, stream_value

__all__ = [
    "LEGACY",
    "PER_THREAD",
    "Foreign",
    "check_memory",
    "export",
    "live_exports",
    "order_after",
    "read_cai",
    "read_capsule",
    "read_dlpack",
    "read_foreign",
    "stream_value",
]
