// Elementwise kernels of tenferro.kernels. Every loop is grid-stride, so any length runs with a
// grid of a few waves of the device. Where every pointer is aligned to four elements, each
// thread moves four elements with one vector access (16 bytes for 4-byte types), which is what
// keeps enough bytes in flight to reach the H200's bandwidth; the last n % 4 elements, and
// arrays that are not so aligned, take the scalar loop.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> struct alignas(4 * sizeof(T)) Pack4 { T v[4]; };

template <typename T> __device__ __forceinline__ bool packs(const T* p) {
    return reinterpret_cast<unsigned long long>(p) % sizeof(Pack4<T>) == 0;
}

#define THREAD_AND_STRIDE                                                                 \
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;         \
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;

template <typename T>
__global__ void fill(T* __restrict__ y, T value, unsigned long long n) {
    THREAD_AND_STRIDE
    unsigned long long head = 0;
    if (packs(y)) {
        Pack4<T> p;
#pragma unroll
        for (int q = 0; q < 4; ++q) p.v[q] = value;
        Pack4<T>* yv = reinterpret_cast<Pack4<T>*>(y);
        for (unsigned long long g = tid; g < n / 4; g += stride) yv[g] = p;
        head = n / 4 * 4;
    }
    for (unsigned long long i = head + tid; i < n; i += stride) y[i] = value;
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
    THREAD_AND_STRIDE
    unsigned long long head = 0;
    if (packs(y) && packs(x)) {
        Pack4<To>* yv = reinterpret_cast<Pack4<To>*>(y);
        const Pack4<From>* xv = reinterpret_cast<const Pack4<From>*>(x);
        unsigned long long g = tid;
        for (; g + stride < n / 4; g += 2 * stride) {  // both loads issued before either store
            Pack4<From> a0 = xv[g], a1 = xv[g + stride];
            Pack4<To> b0, b1;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                b0.v[q] = convert<To, From>(a0.v[q]);
                b1.v[q] = convert<To, From>(a1.v[q]);
            }
            yv[g] = b0;
            yv[g + stride] = b1;
        }
        for (; g < n / 4; g += stride) {
            Pack4<From> a = xv[g];
            Pack4<To> b;
#pragma unroll
            for (int q = 0; q < 4; ++q) b.v[q] = convert<To, From>(a.v[q]);
            yv[g] = b;
        }
        head = n / 4 * 4;
    }
    for (unsigned long long i = head + tid; i < n; i += stride) y[i] = convert<To, From>(x[i]);
}

template <typename T>
__global__ void axpy(T* __restrict__ y, const T* __restrict__ x, T a, unsigned long long n) {
    THREAD_AND_STRIDE
    unsigned long long head = 0;
    if (packs(y) && packs(x)) {
        Pack4<T>* yv = reinterpret_cast<Pack4<T>*>(y);
        const Pack4<T>* xv = reinterpret_cast<const Pack4<T>*>(x);
        unsigned long long g = tid;
        for (; g + stride < n / 4; g += 2 * stride) {  // four loads issued before any store
            Pack4<T> u0 = xv[g], w0 = yv[g], u1 = xv[g + stride], w1 = yv[g + stride];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                w0.v[q] = a * u0.v[q] + w0.v[q];
                w1.v[q] = a * u1.v[q] + w1.v[q];
            }
            yv[g] = w0;
            yv[g + stride] = w1;
        }
        for (; g < n / 4; g += stride) {
            Pack4<T> u = xv[g], w = yv[g];
#pragma unroll
            for (int q = 0; q < 4; ++q) w.v[q] = a * u.v[q] + w.v[q];
            yv[g] = w;
        }
        head = n / 4 * 4;
    }
    for (unsigned long long i = head + tid; i < n; i += stride) y[i] = a * x[i] + y[i];
}
