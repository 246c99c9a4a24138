// One-pass reductions in one launch: each thread folds a grid-stride slice, a warp folds with
// shuffles, the block folds its warps through shared memory and writes its partial to the
// workspace; the last block to finish (a counter in the workspace) folds the partials in
// block order, writes *out and sets the counter back to 0 for the next launch. No memset
// before the launch, and a result that does not depend on the order blocks finish in.
// Workspace: word 0 the counter (0 between launches), partials from word 1, one a block.
#include "pack.cuh"
#define NEG_INF __int_as_float(0xff800000)

template <typename T> struct Sum {
    static __device__ __forceinline__ T apply(T a, T b) { return a + b; }
};
// fmax: a NaN element is skipped; NEG_INF is the identity, so all-NaN input gives -inf.
template <typename T> struct Max;
template <> struct Max<float> {
    static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
};
template <> struct Max<double> {
    static __device__ __forceinline__ double apply(double a, double b) { return fmax(a, b); }
};


// The fold of v over the block, in thread 0; every thread must call it. `partial` is reused
// across calls: the caller separates two calls with __syncthreads().
template <typename T, typename Op>
__device__ __forceinline__ T block_fold(T v, T identity, T* partial) {
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x + 31) / 32 ? partial[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_down_sync(0xffffffffu, v, o));
    }
    return v;
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_body(T* __restrict__ out, const T* __restrict__ x,
                                            unsigned long long n, T identity,
                                            unsigned long long* __restrict__ workspace) {
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
    acc = block_fold<T, Op>(acc, identity, partial);
    unsigned* counter = reinterpret_cast<unsigned*>(workspace);
    T* partials = reinterpret_cast<T*>(workspace + 1);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = acc;
        __threadfence();  // the partial is visible to every block before the count says so
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    acc = identity;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        acc = Op::apply(acc, __ldcg(partials + b));  // L2: written by other multiprocessors
    acc = block_fold<T, Op>(acc, identity, partial);
    if (threadIdx.x == 0) {
        *out = acc;
        *counter = 0;  // every block has counted: the next launch starts from 0
    }
}

template <typename T>
__global__ void reduce_sum(T* out, const T* x, unsigned long long n,
                           unsigned long long* workspace) {
    reduce_body<T, Sum<T>>(out, x, n, T(0), workspace);
}
template <typename T>
__global__ void reduce_max(T* out, const T* x, unsigned long long n,
                           unsigned long long* workspace) {
    reduce_body<T, Max<T>>(out, x, n, NEG_INF, workspace);
}
