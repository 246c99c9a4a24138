// Elementwise kernels of tenferro.kernels. Every loop is grid-stride, so any length runs with any
// grid (the entry points launch one step a thread). Where every pointer is aligned to a pack
// of W elements, each thread moves W elements a step by vector accesses; the last n % W
// elements, and arrays that are not so aligned, take the scalar loop.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "pack.cuh"

#define THREAD_AND_STRIDE                                                                 \
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;         \
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;

// Calls pack(g) for every pack index g < n / W and one(i) for every element of the tail
// (i >= n / W * W) when vec, else one(i) for every i < n; grid-stride over both.
template <int W, typename PackFn, typename OneFn>
__device__ __forceinline__ void for_each(unsigned long long n, bool vec, PackFn pack, OneFn one) {
    THREAD_AND_STRIDE
    unsigned long long head = 0;
    if (vec) {
        for (unsigned long long g = tid; g < n / W; g += stride) pack(g);
        head = n / W * W;
    }
    for (unsigned long long i = head + tid; i < n; i += stride) one(i);
}

template <typename T>
__global__ void fill(T* __restrict__ y, T value, unsigned long long n) {
    Pack<T, 4> p;
#pragma unroll
    for (int q = 0; q < 4; ++q) p.v[q] = value;
    for_each<4>(n, packs<T, 4>(y),
                [&](unsigned long long g) { reinterpret_cast<Pack<T, 4>*>(y)[g] = p; },
                [&](unsigned long long i) { y[i] = value; });
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

// Eight elements a pack where either side is 2 bytes (16 bytes of the narrow side a thread a
// step), four otherwise; maps.cast sizes the grid by the same rule.
template <typename To, typename From>
__host__ __device__ constexpr int cast_width() { return sizeof(To) == 2 || sizeof(From) == 2 ? 8 : 4; }

template <typename To, typename From>
__global__ void cast(To* __restrict__ y, const From* __restrict__ x, unsigned long long n) {
    constexpr int W = cast_width<To, From>();
    for_each<W>(n, packs<To, W>(y) && packs<From, W>(x),
                [&](unsigned long long g) {
                    const Pack<From, W> a = reinterpret_cast<const Pack<From, W>*>(x)[g];
                    Pack<To, W> b;
#pragma unroll
                    for (int q = 0; q < W; ++q) b.v[q] = convert<To, From>(a.v[q]);
                    reinterpret_cast<Pack<To, W>*>(y)[g] = b;
                },
                [&](unsigned long long i) { y[i] = convert<To, From>(x[i]); });
}

template <typename T>
__global__ void axpy(T* __restrict__ y, const T* __restrict__ x, T a, unsigned long long n) {
    for_each<4>(n, packs<T, 4>(y) && packs<T, 4>(x),
                [&](unsigned long long g) {
                    const Pack<T, 4> u = reinterpret_cast<const Pack<T, 4>*>(x)[g];
                    Pack<T, 4> w = reinterpret_cast<Pack<T, 4>*>(y)[g];
#pragma unroll
                    for (int q = 0; q < 4; ++q) w.v[q] = a * u.v[q] + w.v[q];
                    reinterpret_cast<Pack<T, 4>*>(y)[g] = w;
                },
                [&](unsigned long long i) { y[i] = a * x[i] + y[i]; });
}
