"""CUDA C kernels shared by the GPU tests."""

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
