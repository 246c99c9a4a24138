"""One tenferro session a process under torchrun, and an NCCL all-reduce over its output.

    torchrun --nproc-per-node 2 examples/torchrun_allreduce.py

Each rank opens a session on its own device (``tf.local_device()`` reads ``LOCAL_RANK``),
fills a tensor with a tenferro kernel, hands it to torch without a copy (DLPack) and
all-reduces it with NCCL; every rank then checks the sum. Exit status 0 means all ranks agreed.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tenferro as tf
from tenferro import kernels as k


def main() -> int:
    import torch
    import torch.distributed as dist

    device = tf.local_device()
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 1 << 20
    with tf.Session(device=device) as s:
        x = s.alloc_output((n,), np.float32)
        k.fill(s, x, float(rank + 1))  # a tenferro kernel on this rank's GPU
        t = torch.from_dlpack(x)  # zero-copy; torch's stream waits for ours
        assert t.data_ptr() == x.ptr and t.device.index == device
        dist.all_reduce(t)  # NCCL, in place, on tenferro's memory
        torch.cuda.synchronize()  # NCCL ran on torch's stream, not ours
        got = s.download(x)
    want = world * (world + 1) / 2
    ok = bool(np.all(got == want))
    print(
        f"rank {rank} device {device}: all-reduce sum {got[0]} (want {want}): "
        f"{'ok' if ok else 'WRONG'}",
        flush=True,
    )
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
