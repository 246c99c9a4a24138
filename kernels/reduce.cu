// One-pass reductions: each thread folds a grid-stride slice, a warp folds with shuffles, the
// block folds its warps through shared memory, and one atomic per block folds the blocks into
// *out (which the caller initialised: 0 for sum; for max all bits set, a NaN, which
// atomic_max_float's integer order and atomic_max_double's failed compare both put below any
// value, and each block makes one atomic, so some value replaces it).
#include "pack.cuh"
#define NEG_INF __int_as_float(0xff800000)

template <typename T> struct Sum {
    static __device__ __forceinline__ T apply(T a, T b) { return a + b; }
    static __device__ __forceinline__ void atomic(T* out, T v) { atomicAdd(out, v); }
};

__device__ __forceinline__ void atomic_max_float(float* out, float v) {
    // IEEE floats order like sign-magnitude integers: max on the int for v >= 0, min on the
    // unsigned for v < 0 (their bit patterns order in reverse).
    if (v >= 0.0f) atomicMax(reinterpret_cast<int*>(out), __float_as_int(v));
    else atomicMin(reinterpret_cast<unsigned*>(out), __float_as_uint(v));
}
__device__ __forceinline__ void atomic_max_double(double* out, double v) {
    unsigned long long* p = reinterpret_cast<unsigned long long*>(out);
    unsigned long long old = *p, assumed;
    do {
        assumed = old;
        if (__longlong_as_double(assumed) >= v) return;
        old = atomicCAS(p, assumed, __double_as_longlong(v));
    } while (old != assumed);
}

template <typename T> struct Max;
template <> struct Max<float> {
    static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
    static __device__ __forceinline__ void atomic(float* out, float v) { atomic_max_float(out, v); }
};
template <> struct Max<double> {
    static __device__ __forceinline__ double apply(double a, double b) { return fmax(a, b); }
    static __device__ __forceinline__ void atomic(double* out, double v) {
        atomic_max_double(out, v);
    }
};


template <typename T, typename Op>
__device__ __forceinline__ void reduce_body(T* __restrict__ out, const T* __restrict__ x,
                                            unsigned long long n, T identity) {
    __shared__ T partial[32];
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    // Where x is aligned to four elements, one vector load a step feeds four independent
    // accumulators; the rest (n % 4, or all of an unaligned x) folds one element a step.
    T a[4] = {identity, identity, identity, identity};
    unsigned long long head = 0;
    if (packs<T, 4>(x)) {
        const Pack<T, 4>* xv = reinterpret_cast<const Pack<T, 4>*>(x);
        const unsigned long long packs = n / 4;
        unsigned long long g = tid;
        // Four packs a step, all loaded before any is folded: four loads in flight a thread.
        for (; g + 3 * stride < packs; g += 4 * stride) {
            Pack<T, 4> p[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) p[u] = xv[g + u * stride];
#pragma unroll
            for (int q = 0; q < 4; ++q)
                a[q] = Op::apply(a[q], Op::apply(Op::apply(p[0].v[q], p[1].v[q]),
                                                 Op::apply(p[2].v[q], p[3].v[q])));
        }
        for (; g < packs; g += stride) {
            Pack<T, 4> p = xv[g];
#pragma unroll
            for (int q = 0; q < 4; ++q) a[q] = Op::apply(a[q], p.v[q]);
        }
        head = n / 4 * 4;
    }
    for (unsigned long long i = head + tid; i < n; i += stride) a[0] = Op::apply(a[0], x[i]);
    T acc = Op::apply(Op::apply(a[0], a[1]), Op::apply(a[2], a[3]));
    for (int o = 16; o > 0; o >>= 1) acc = Op::apply(acc, __shfl_down_sync(0xffffffffu, acc, o));
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (blockDim.x + 31) / 32 ? partial[lane] : identity;
        for (int o = 16; o > 0; o >>= 1)
            acc = Op::apply(acc, __shfl_down_sync(0xffffffffu, acc, o));
        if (lane == 0) Op::atomic(out, acc);
    }
}

template <typename T> __global__ void reduce_sum(T* out, const T* x, unsigned long long n) {
    reduce_body<T, Sum<T>>(out, x, n, T(0));
}
template <typename T> __global__ void reduce_max(T* out, const T* x, unsigned long long n) {
    reduce_body<T, Max<T>>(out, x, n, NEG_INF);
}
