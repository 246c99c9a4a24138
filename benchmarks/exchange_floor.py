"""The floor under reading torch tensors in compiled code: DLPack's C exchange API.

    python3 benchmarks/exchange_floor.py [--json exchange_floor.json]

Before launches read torch tensors in compiled (numba) code, this measures, in one process and
interleaved, what such a read would save:

- torch's own Python field reads that a span of a torch tensor needs today (dtype,
  requires_grad, is_cuda, is_neg, is_contiguous, get_device, data_ptr, shape), for two tensors;
- one nopython call that asks the tensor type's ``dltensor_from_py_object_no_sync`` (from
  ``type(t).__dlpack_c_exchange_api__``) for both tensors, given their object addresses, and
  copies out pointer, device, dtype, ndim, shape and strides; with the addresses written into
  the kept array on each call (the path users write) and already there (a floor);
- the producer's current stream: ``current_work_stream`` from a nopython call against
  ``torch._C._cuda_getCurrentRawStream`` from Python.

Each compiled read is first compared with torch's own answers; the run fails if one differs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from launch import Method, run_interleaved  # noqa: E402

KDL_CUDA = 2
CAPSULE_NAME = b"dlpack_exchange_api"
# struct DLPackExchangeAPI: a 16-byte header (version major, minor: u32; prev_api), then five
# function pointers; dltensor_from_py_object_no_sync is the fourth, current_work_stream the fifth.
FROM_PY_OFFSET, STREAM_OFFSET = 16 + 3 * 8, 16 + 4 * 8
# struct DLTensor as 64-bit words: data, device (type, id), ndim | dtype, shape*, strides*, offset.
DL_WORDS = 6


def exchange_api(cls: type) -> tuple[int, tuple[int, int]]:
    """The address of ``cls``'s DLPackExchangeAPI and its version, or raise saying why not."""
    api = getattr(cls, "__dlpack_c_exchange_api__", None)
    if api is None:
        raise RuntimeError(f"{cls.__name__} has no __dlpack_c_exchange_api__")
    if isinstance(api, int):  # the attribute's first form: the address itself
        addr = api
    else:
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        addr = get(api, CAPSULE_NAME)
    major, minor = (ctypes.c_uint32.from_address(addr + 4 * k).value for k in (0, 1))
    return addr, (major, minor)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    import torch
    from numba import njit

    api, version = exchange_api(torch.Tensor)
    word = ctypes.c_uint64.from_address
    from_py_addr, stream_addr = word(api + FROM_PY_OFFSET).value, word(api + STREAM_OFFSET).value
    if not from_py_addr or not stream_addr:
        raise RuntimeError("torch's exchange API lacks dltensor_from_py_object_no_sync")
    # Addresses as int64 in compiled code: numba's sum of uint64 and int64 is a float.
    i64 = ctypes.c_int64
    from_py = ctypes.CFUNCTYPE(ctypes.c_int, i64, i64)(from_py_addr)
    work_stream = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, i64)(stream_addr)
    libc = ctypes.CDLL(None)
    memcpy = ctypes.CFUNCTYPE(i64, i64, i64, i64)(ctypes.cast(libc.memcpy, ctypes.c_void_p).value)

    @njit  # the GIL held: a refusal sets a Python exception
    def read(addrs, dl, out):  # out[k]: data, device, ndim|dtype, shape[0:4], strides[0:4]
        dl_addr = np.int64(dl.ctypes.data)
        out_addr = np.int64(out.ctypes.data)
        for k in range(addrs.shape[0]):
            if from_py(addrs[k], dl_addr) != 0:
                return k + 1
            out[k, 0], out[k, 1], out[k, 2] = dl[0], dl[1], dl[2]
            ndim = dl[2] & 0xFFFFFFFF
            if ndim > 4:
                return -(k + 1)
            row = out_addr + (k * 11 + 3) * 8
            memcpy(row, dl[3], 8 * ndim)
            if dl[4] != 0:
                memcpy(row + 32, dl[4], 8 * ndim)
        return 0

    @njit
    def empty(a, b, c):  # what numba's dispatch and unboxing of three arrays cost
        return a.shape[0] + b.shape[0] + c.shape[0]

    @njit
    def current(device, slot):
        return work_stream(KDL_CUDA, device, np.int64(slot.ctypes.data))

    dev = torch.cuda.current_device()
    n = 4096
    y, x = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    tensors = (y, x)
    addrs = np.array([id(t) for t in tensors], dtype=np.int64)
    dl = np.zeros(DL_WORDS, dtype=np.int64)
    out = np.zeros((2, 11), dtype=np.int64)
    slot = np.zeros(1, dtype=np.int64)
    # Checked against torch's own answers before anything is timed.
    assert read(addrs, dl, out) == 0, "dltensor_from_py_object_no_sync refused a tensor"
    for k, t in enumerate(tensors):
        assert out[k, 0] == t.data_ptr(), (out[k, 0], t.data_ptr())
        assert out[k, 1] == KDL_CUDA | (t.get_device() << 32), hex(out[k, 1])
        ndim, code, bits = (
            out[k, 2] & 0xFFFFFFFF,
            (out[k, 2] >> 32) & 0xFF,
            (out[k, 2] >> 40) & 0xFF,
        )
        assert (ndim, code, bits) == (1, 2, 32), (ndim, code, bits)  # kDLFloat, 32 bits
        assert out[k, 3] == n and out[k, 7] == 1, out[k]
    raw_stream = torch._C._cuda_getCurrentRawStream
    assert current(dev, slot) == 0 and int(slot[0]) == raw_stream(dev), (slot, raw_stream(dev))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the answer follows torch's current stream
        assert current(dev, slot) == 0 and int(slot[0]) == side.cuda_stream

    def torch_fields():
        for t in (y, x):
            (
                t.dtype,
                t.requires_grad,
                t.is_cuda,
                t.is_neg(),
                t.is_contiguous(),
                t.get_device(),
                t.data_ptr(),
                t.shape,
            )

    def exchange_fresh():  # the addresses of the tensors given on this call
        addrs[0], addrs[1] = id(y), id(x)
        read(addrs, dl, out)

    methods = [
        Method("torch Python field reads, 2 tensors", torch_fields),
        Method("exchange read in one nopython call, 2 tensors", exchange_fresh),
        Method("  the same, addresses already in the array (floor)", lambda: read(addrs, dl, out)),
        Method("torch._C._cuda_getCurrentRawStream (Python)", lambda: raw_stream(dev)),
        Method("current_work_stream (nopython call)", lambda: current(dev, slot)),
        Method("empty nopython call, 3 array arguments", lambda: empty(addrs, dl, out)),
    ]
    empty(addrs, dl, out)
    timed = run_interleaved(methods, lambda: None)
    name = torch.cuda.get_device_name(dev)
    print(f"{name}; torch {torch.__version__}; DLPack exchange API {version[0]}.{version[1]}")
    width = max(len(m.name) for m in methods)
    for m in methods:
        print(f"  {m.name:<{width}}  {timed[m.name][0] * 1000:8.0f} ns")
    saved = (timed[methods[0].name][0] - timed[methods[1].name][0]) * 1000
    print(f"  saved by the compiled read, 2 tensors: {saved:.0f} ns")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "api_version": list(version),
                    "ns": {m.name: timed[m.name][0] * 1000 for m in methods},
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
