"""Kernels shared by the GPU tests: CUDA C sources and a numba kernel."""

from numba import cuda

AXPY = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void add2d(double* out, const double* a, const double* b,
                                 unsigned rows, unsigned cols) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) out[r * cols + c] = a[r * cols + c] * 2.0 + b[r * cols + c];
}
// Reads x only after spinning for `cycles` clocks: long enough to drop and reuse its memory.
extern "C" __global__ void slow_scale(double* y, const double* x, double a, unsigned n,
                                      long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
// Strided 2-D read: out[r, c] = x[r * rs + c * cs] (strides in elements).
extern "C" __global__ void gather2d(double* out, const double* x, long long rs, long long cs,
                                    unsigned rows, unsigned cols) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (r < rows && c < cols) out[r * cols + c] = x[r * rs + c * cs];
}
"""


def scale_add(out, x, a, n):
    """A numba kernel: out += a * x."""
    i = cuda.grid(1)
    if i < n:
        out[i] = out[i] + a * x[i]


N = 50_001  # elements of the bound-launch and graph tests: not a multiple of a block


def raw_and_numba_axpy(session):
    """The CUDA C axpy and the numba scale_add of ``session``, ready to launch."""
    return (
        session.compile(AXPY).function("axpy"),
        session.numba_kernel(scale_add, "void(float32[::1], float32[::1], float32, int64)"),
    )


# C++ linkage, cooperative groups, an overload and a namespace: a kernel file as people write
# them, compiled unchanged and found by its kernels' own names.
CPP_KERNELS = r"""
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

// One warp a row: mean and rstd through cg::reduce, then out = (x - mean) * rstd * w + b.
__global__ void layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                  float* __restrict__ rstd, const float* __restrict__ inp,
                                  const float* __restrict__ weight,
                                  const float* __restrict__ bias, int N, int C) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (row >= N) return;
    const float* x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) sum += x[i];
    float m = cg::reduce(warp, sum, cg::plus<float>()) / C;
    float var = 0.0f;
    for (int i = warp.thread_rank(); i < C; i += warp.size()) var += (x[i] - m) * (x[i] - m);
    float s = rsqrtf(cg::reduce(warp, var, cg::plus<float>()) / C + 1e-5f);
    float* o = out + (size_t)row * C;
    for (int i = warp.thread_rank(); i < C; i += warp.size())
        o[i] = (x[i] - m) * s * weight[i] + bias[i];
    if (warp.thread_rank() == 0) { mean[row] = m; rstd[row] = s; }
}

// Overloads: scale each row of a row-major matrix by s[row], in float or in double.
__global__ void scale_rows(float* x, const float* s, int rows, int cols) {
    int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && c < cols) x[(size_t)r * cols + c] *= s[r];
}
__global__ void scale_rows(double* x, const double* s, int rows, int cols) {
    int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && c < cols) x[(size_t)r * cols + c] *= s[r];
}

namespace ops {
// y[i] += b[i % cols] over n elements.
__global__ void add_bias(float* y, const float* b, size_t n, unsigned long cols) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i % cols];
}
}  // namespace ops
"""
