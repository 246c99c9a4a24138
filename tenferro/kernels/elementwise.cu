// Elementwise kernels of tenferro.kernels. Every loop is grid-stride over n elements, so any
// length runs with a grid capped at a few waves of the device.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T>
__global__ void fill(T* __restrict__ y, T value, unsigned long long n) {
#pragma unroll 4
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = value;
}

// Conversion through float (or double where either side is double): the C++ casts of
// cuda_fp16 / cuda_bf16 round to nearest even, as numpy's astype does.
template <typename To, typename From> __device__ __forceinline__ To convert(From v) {
    return static_cast<To>(v);
}
template <> __device__ __forceinline__ __half convert<__half, float>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 convert<__nv_bfloat16, float>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ float convert<float, __half>(__half v) {
    return __half2float(v);
}
template <> __device__ __forceinline__ float convert<float, __nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename To, typename From>
__global__ void cast(To* __restrict__ y, const From* __restrict__ x, unsigned long long n) {
#pragma unroll 4
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = convert<To, From>(x[i]);
}

template <typename T>
__global__ void axpy(T* __restrict__ y, const T* __restrict__ x, T a, unsigned long long n) {
#pragma unroll 4
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}
