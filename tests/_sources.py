"""Kernels shared by the GPU tests: CUDA C sources and a numba kernel."""

from numba import cuda

AXPY = r'''
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
'''


def scale_add(out, x, a, n):
    """A numba kernel: out += a * x."""
    i = cuda.grid(1)
    if i < n:
        out[i] = out[i] + a * x[i]


N = 50_001  # elements of the bound-launch and graph tests: not a multiple of a block


def raw_and_numba_axpy(session):
    """The CUDA C axpy and the numba scale_add of ``session``, ready to launch."""
    return (session.compile(AXPY).function("axpy"),
            session.numba_kernel(scale_add, "void(float32[::1], float32[::1], float32, int64)"))
