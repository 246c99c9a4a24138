"""The kernel the launch benchmarks time: y = a * x + y on float32, as the README's quickstart."""

AXPY_SRC = r"""
extern "C" __global__ void axpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}"""
