// Row softmax, tiled transpose and the pieces of an inclusive scan.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "cp_async.cuh"
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// A block-wide fold of one value per thread; every thread gets the result.
template <bool IsMax> __device__ float block_fold(float v, float* shared32) {
    v = IsMax ? warp_max(v) : warp_sum(v);
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) / 32;
    __syncthreads();  // shared32 may still be read by the previous fold
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    v = lane < warps ? shared32[lane] : (IsMax ? NEG_INF : 0.0f);
    return IsMax ? warp_max(v) : warp_sum(v);
}

// One block per row: max, sum of exp(x - max), then the normalised values.
extern "C" __global__ void softmax_rows_f32(float* __restrict__ y, const float* __restrict__ x,
                                            unsigned rows, unsigned cols) {
    __shared__ float shared32[32];
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (unsigned long long)r * cols;
        float* yr = y + (unsigned long long)r * cols;
        float m = NEG_INF;
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
        m = block_fold<true>(m, shared32);
        float s = 0.0f;
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
        s = block_fold<false>(s, shared32);
        float inv = 1.0f / s;
        for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;
    }
}

// The same softmax with the row kept in dynamic shared memory: x is read once and y written
// once (the three-pass kernel above reads x three times), and exp is taken once an element.
// V is float, or float4 where cols % 4 == 0 and both pointers are 16-byte aligned.
__device__ __forceinline__ float hmax(float v) { return v; }
__device__ __forceinline__ float hmax(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }
__device__ __forceinline__ float exp_minus(float& v, float m) { v = expf(v - m); return v; }
__device__ __forceinline__ float exp_minus(float4& v, float m) {
    v.x = expf(v.x - m); v.y = expf(v.y - m); v.z = expf(v.z - m); v.w = expf(v.w - m);
    return (v.x + v.y) + (v.z + v.w);
}
__device__ __forceinline__ float scaled(float v, float k) { return v * k; }
__device__ __forceinline__ float4 scaled(float4 v, float k) {
    return make_float4(v.x * k, v.y * k, v.z * k, v.w * k);
}

template <typename V>
__global__ void softmax_rows_cached(float* __restrict__ y, const float* __restrict__ x,
                                    unsigned rows, unsigned cols) {
    extern __shared__ __align__(16) unsigned char cache_bytes[];
    V* cache = reinterpret_cast<V*>(cache_bytes);
    __shared__ float shared32[32];
    const unsigned units = cols / (sizeof(V) / sizeof(float));
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const V* xr = reinterpret_cast<const V*>(x + (unsigned long long)r * cols);
        V* yr = reinterpret_cast<V*>(y + (unsigned long long)r * cols);
        // Each thread touches the same units of the cache in every pass, so the passes need
        // no barrier of their own; block_fold's barriers order the rows.
        float m = NEG_INF;
#pragma unroll 4
        for (unsigned c = threadIdx.x; c < units; c += blockDim.x) {
            V v = xr[c];
            cache[c] = v;
            m = fmaxf(m, hmax(v));
        }
        m = block_fold<true>(m, shared32);
        float s = 0.0f;
        for (unsigned c = threadIdx.x; c < units; c += blockDim.x) s += exp_minus(cache[c], m);
        s = block_fold<false>(s, shared32);
        const float inv = 1.0f / s;
        for (unsigned c = threadIdx.x; c < units; c += blockDim.x) yr[c] = scaled(cache[c], inv);
    }
}

// The cached softmax with the max and the sum found in one fold: each thread keeps a running
// (max, sum of exp(x - max)) while it loads, rescaling the sum when the max grows; the pairs
// are folded across the block once, and y = exp(x - max) / sum is written from the cache.
__device__ __forceinline__ void fold_max_sum(float& m, float& s, float m2, float s2) {
    if (m2 == NEG_INF) return;  // the other side saw nothing (or only -inf)
    if (m == NEG_INF) { m = m2; s = s2; return; }
    const float mn = fmaxf(m, m2);
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}
__device__ __forceinline__ float sum_exp(float v, float m) { return expf(v - m); }
__device__ __forceinline__ float sum_exp(float4 v, float m) {
    return (expf(v.x - m) + expf(v.y - m)) + (expf(v.z - m) + expf(v.w - m));
}
__device__ __forceinline__ float exp_scaled(float v, float m, float k) { return expf(v - m) * k; }
__device__ __forceinline__ float4 exp_scaled(float4 v, float m, float k) {
    return make_float4(expf(v.x - m) * k, expf(v.y - m) * k, expf(v.z - m) * k,
                       expf(v.w - m) * k);
}

template <typename V>
__global__ void softmax_rows_online(float* __restrict__ y, const float* __restrict__ x,
                                    unsigned rows, unsigned cols) {
    extern __shared__ __align__(16) unsigned char cache_bytes[];
    V* cache = reinterpret_cast<V*>(cache_bytes);
    __shared__ float shared_m[32], shared_s[32];
    const unsigned units = cols / (sizeof(V) / sizeof(float));
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned warps = (blockDim.x + 31) / 32;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const V* xr = reinterpret_cast<const V*>(x + (unsigned long long)r * cols);
        V* yr = reinterpret_cast<V*>(y + (unsigned long long)r * cols);
        float m = NEG_INF, s = 0.0f;
#pragma unroll 4
        for (unsigned c = threadIdx.x; c < units; c += blockDim.x) {
            const V v = xr[c];
            cache[c] = v;
            const float vm = hmax(v);
            if (vm > m) { s = m == NEG_INF ? 0.0f : s * expf(m - vm); m = vm; }
            if (m != NEG_INF) s += sum_exp(v, m);
        }
        for (int o = 16; o > 0; o >>= 1)
            fold_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, o),
                         __shfl_xor_sync(0xffffffffu, s, o));
        __syncthreads();  // the shared pairs may still be read for the previous row
        if (lane == 0) { shared_m[warp] = m; shared_s[warp] = s; }
        __syncthreads();
        m = lane < warps ? shared_m[lane] : NEG_INF;
        s = lane < warps ? shared_s[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            fold_max_sum(m, s, __shfl_xor_sync(0xffffffffu, m, o),
                         __shfl_xor_sync(0xffffffffu, s, o));
        const float inv = 1.0f / s;
        for (unsigned c = threadIdx.x; c < units; c += blockDim.x)
            yr[c] = exp_scaled(cache[c], m, inv);
    }
}

// The softmax with REG float4 of the row a thread held in registers and the rest, if any, in
// dynamic shared memory: the register file and shared memory together hold more rows an SM
// than shared memory alone (each row has its own block), so more of x is in flight. Needs
// cols % 4 == 0 and 16-byte aligned rows. x is read once, exp taken once an element.
template <int REG>
__global__ void softmax_rows_split(float* __restrict__ y, const float* __restrict__ x,
                                   unsigned rows, unsigned cols) {
    extern __shared__ __align__(16) unsigned char cache_bytes[];
    float4* cache = reinterpret_cast<float4*>(cache_bytes);
    __shared__ float shared32[32];
    const unsigned units = cols / 4, held = REG * blockDim.x;
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const float4* xr = reinterpret_cast<const float4*>(x + (unsigned long long)r * cols);
        float4* yr = reinterpret_cast<float4*>(y + (unsigned long long)r * cols);
        float4 v[REG];
        float m = NEG_INF;
#pragma unroll
        for (int q = 0; q < REG; ++q) {
            const unsigned c = q * blockDim.x + threadIdx.x;
            v[q] = c < units ? xr[c] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            m = fmaxf(m, hmax(v[q]));
        }
#pragma unroll 4
        for (unsigned c = held + threadIdx.x; c < units; c += blockDim.x) {
            const float4 w = xr[c];
            cache[c - held] = w;
            m = fmaxf(m, hmax(w));
        }
        m = block_fold<true>(m, shared32);
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < REG; ++q) s += exp_minus(v[q], m);  // padding: exp(-inf) = 0
        for (unsigned c = held + threadIdx.x; c < units; c += blockDim.x)
            s += exp_minus(cache[c - held], m);
        s = block_fold<false>(s, shared32);
        const float inv = 1.0f / s;
#pragma unroll
        for (int q = 0; q < REG; ++q) {
            const unsigned c = q * blockDim.x + threadIdx.x;
            if (c < units) yr[c] = scaled(v[q], inv);
        }
        for (unsigned c = held + threadIdx.x; c < units; c += blockDim.x)
            yr[c] = scaled(cache[c - held], inv);
    }
}

// y (cols x rows) = x (rows x cols)^T through a TILE x (TILE + 1) shared tile (the pad puts a
// tile column on 32 distinct banks); blocks of 32x8 threads, each thread moves TILE * TILE / 256
// elements, all its loads issued before the barrier.
template <typename T, int TILE>
__global__ void __launch_bounds__(256)
transpose(T* __restrict__ y, const T* __restrict__ x, unsigned rows, unsigned cols) {
    __shared__ T tile[TILE][TILE + 1];
    const unsigned c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
#pragma unroll
    for (int j = 0; j < TILE; j += 8)
#pragma unroll
        for (int i = 0; i < TILE; i += 32) {
            const unsigned r = r0 + j + threadIdx.y, c = c0 + i + threadIdx.x;
            if (r < rows && c < cols)
                tile[j + threadIdx.y][i + threadIdx.x] = x[(unsigned long long)r * cols + c];
        }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TILE; j += 8)
#pragma unroll
        for (int i = 0; i < TILE; i += 32) {
            const unsigned c = c0 + j + threadIdx.y, r = r0 + i + threadIdx.x;  // y[c][r] = x[r][c]
            if (r < rows && c < cols)
                y[(unsigned long long)c * rows + r] = tile[i + threadIdx.x][j + threadIdx.y];
        }
}

// Inclusive scan in one pass (x read once, y written once) by decoupled look-back: block t
// scans tile t in shared memory, publishes its total (flag 1), adds the totals of its
// predecessors back to the nearest one that has published an inclusive prefix (flag 2), and
// publishes its own. Tile t waits only on tiles before it, and the blocks of a grid start in
// increasing index order (CUB's single-pass scan relies on the same), so those blocks already
// hold an SM and finish without waiting on t. An atomic ticket a block gave the same order for
// certain and cost 2.5% (156.5 against 152.7 us on the H200, 256 MiB f32): its round trip
// delays every tile's first load. A flag is (epoch << 2) | kind, kind 1 or 2: a word of
// another epoch (an earlier launch's, or zero) reads as nothing published, so the state needs
// no clearing between launches that each take a new epoch (rows.py counts them; a captured
// launch clears the state and takes epoch 0). Tiles are THREADS x ITEMS elements; STRIDE and
// SLEEP shape the look-back's polling (rows.py chooses them).
__device__ __forceinline__ unsigned padded(unsigned i) { return i + i / 32; }
template <typename T> __device__ __forceinline__ T warp_total(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// A tile's status, STRIDE words apart from the next tile's (state[STRIDE t]), so that a
// look-back's 32 polls can land on 32 cache lines, and so on many L2 slices, instead of all
// on two. 4-byte values travel with their flag in one 64-bit word, written and read whole, so
// no fence is needed; 8-byte values go to sums[2t] (total) and sums[2t + 1] (inclusive
// prefix), past the status words, written before the flag with a fence between, and read
// after it with a fence between, from L2.
template <typename T, int STRIDE, bool Packed = sizeof(T) == 4> struct TileStatus;
template <typename T, int STRIDE> struct TileStatus<T, STRIDE, true> {
    volatile unsigned long long* words;
    unsigned epoch;
    __device__ TileStatus(unsigned long long* state, unsigned e) : words(state), epoch(e << 2) {}
    __device__ void publish(unsigned t, unsigned kind, T v) {
        words[(unsigned long long)t * STRIDE] =
            ((unsigned long long)(epoch | kind) << 32) | *reinterpret_cast<const unsigned*>(&v);
    }
    // The tile's kind (0: nothing published in this epoch yet) and, where it is not 0, its
    // value.
    __device__ unsigned poll(unsigned long long p, T& v) {
        const unsigned long long w = words[p * STRIDE];
        const unsigned bits = (unsigned)w, flag = (unsigned)(w >> 32);
        v = *reinterpret_cast<const T*>(&bits);
        return (flag & ~3u) == epoch ? flag & 3u : 0u;
    }
};
template <typename T, int STRIDE> struct TileStatus<T, STRIDE, false> {
    volatile unsigned long long* flags;
    T* sums;
    unsigned epoch;
    __device__ TileStatus(unsigned long long* state, unsigned e)
        : flags(state), sums(reinterpret_cast<T*>(state + (unsigned long long)gridDim.x * STRIDE)),
          epoch(e << 2) {}
    __device__ void publish(unsigned t, unsigned kind, T v) {
        sums[2 * t + (kind == 2u)] = v;
        __threadfence();
        flags[(unsigned long long)t * STRIDE] = epoch | kind;
    }
    __device__ unsigned poll(unsigned long long p, T& v) {
        const unsigned flag = (unsigned)flags[p * STRIDE];
        const unsigned kind = (flag & ~3u) == epoch ? flag & 3u : 0u;
        if (kind != 0) {
            __threadfence();
            v = __ldcg(&sums[2 * p + (kind == 2u)]);
        }
        return kind;
    }
};

// The sum of the totals of the tiles before t back to the nearest one with an inclusive prefix
// (and that prefix), by warp 0: lane l reads tile top - l, 32 tiles a step, spinning (SLEEP ns
// between polls, to spare L2) on tiles that have published nothing yet. Tiles before tile 0
// count as inclusive zeros. (Reading 4 or 8 tiles a lane a step was slower on the H200.)
template <typename T, int STRIDE, int SLEEP>
__device__ T look_back(TileStatus<T, STRIDE>& status, unsigned t, unsigned lane) {
    T prefix = T(0);
    for (long long top = (long long)t - 1;; top -= 32) {
        const long long p = top - lane;
        T pv = T(0);
        unsigned f = 2u;
        if (p >= 0) {
            while ((f = status.poll(p, pv)) == 0) __nanosleep(SLEEP);
        }
        const unsigned inclusive = __ballot_sync(0xffffffffu, f == 2u);
        if (inclusive && lane > __ffs(inclusive) - 1) pv = T(0);  // beyond the nearest one
        prefix += warp_total(pv);
        if (inclusive) return prefix;
    }
}

// The sum of the tile's elements before this thread's, given `run`, the sum of the thread's own
// (threads hold consecutive runs of the tile, in thread order); the tile's sum goes to total.
// One barrier inside.
template <typename T, int THREADS>
__device__ __forceinline__ T offset_in_tile(T run, T* warp_totals, T& total) {
    constexpr unsigned WARPS = THREADS / 32;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, run, o);
        if (lane >= o) run += u;
    }
    T before = __shfl_up_sync(0xffffffffu, run, 1);  // what this warp's earlier lanes hold
    if (lane == 0) before = T(0);
    if (lane == 31) warp_totals[warp] = run;
    __syncthreads();
    // Every warp scans the warp totals itself (no barrier for warp 0's result): its own
    // exclusive prefix, and the tile's total.
    T wincl = lane < WARPS ? warp_totals[lane] : T(0);
    for (int o = 1; o < 32; o <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, wincl, o);
        if (lane >= o) wincl += u;
    }
    total = __shfl_sync(0xffffffffu, wincl, WARPS - 1);
    const T wexcl = warp == 0 ? T(0) : __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
    return wexcl + before;
}

// Warp 0 looks back from tile t (whose total is `total`), publishes the tile's inclusive
// prefix, and lane 0 writes the sum of the tiles before t to *tile_prefix.
template <typename T, int STRIDE, int SLEEP>
__device__ __forceinline__ void finish_tile(TileStatus<T, STRIDE>& status, unsigned t, T total,
                                            T* tile_prefix) {
    if (threadIdx.x >= 32) return;
    const unsigned lane = threadIdx.x;
    const T prefix = t > 0 ? look_back<T, STRIDE, SLEEP>(status, t, lane) : T(0);
    if (lane == 0) {
        status.publish(t, 2u, prefix + total);
        *tile_prefix = prefix;
    }
}

// Scans the tile in buf (the padded layout) in place, each element plus the ones before it in
// the tile; publishes the tile's total; warp 0 looks back and lane 0 writes the sum of the
// tiles before it to *tile_prefix and publishes the tile's inclusive prefix. Each thread scans
// ITEMS consecutive elements read from shared memory, so nothing is held while warp 0 looks
// back and the other warps go on. HOLD keeps a thread's ITEMS in registers between its two
// passes over them (sum, then running sums); without it, they are read twice from shared
// memory, for blocks that must fit in few registers. The caller syncs before reading buf or
// *tile_prefix. One barrier inside.
template <typename T, int THREADS, int ITEMS, int STRIDE, int SLEEP, bool HOLD>
__device__ __forceinline__ void scan_tile(T* buf, unsigned t, TileStatus<T, STRIDE>& status,
                                          T* warp_totals, T* tile_prefix) {
    T v[HOLD ? ITEMS : 1];
    T run = T(0);
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {
        if (HOLD) {
            v[j] = buf[padded(threadIdx.x * ITEMS + j)] + (j > 0 ? v[j - 1] : T(0));
            run = v[j];
        } else {
            run += buf[padded(threadIdx.x * ITEMS + j)];
        }
    }
    T total;
    T add = offset_in_tile<T, THREADS>(run, warp_totals, total);
    if (threadIdx.x == 0 && t > 0) status.publish(t, 1u, total);  // as early as can be
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {
        T& e = buf[padded(threadIdx.x * ITEMS + j)];
        if (HOLD) {
            e = v[j] + add;
        } else {
            add += e;
            e = add;
        }
    }
    finish_tile<T, STRIDE, SLEEP>(status, t, total, tile_prefix);
}

// Tile t's elements from x into buf (zeros past n). ASYNC (on sm_80 and later): cp.async
// straight into shared memory, so no register holds a load in flight and every load of the
// thread is issued before the first returns; otherwise through registers.
template <typename T, int THREADS, int ITEMS, bool ASYNC>
__device__ __forceinline__ void load_tile(T* buf, const T* x, unsigned long long base,
                                          unsigned long long n) {
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {  // coalesced loads, striped over the block
        const unsigned e = j * THREADS + threadIdx.x;
        const bool inside = base + e < n;
#if __CUDA_ARCH__ >= 800
        if (ASYNC) {
            cp_async_element(&buf[padded(e)], x + (inside ? base + e : 0), inside);
            continue;
        }
#endif
        buf[padded(e)] = inside ? x[base + e] : T(0);
    }
#if __CUDA_ARCH__ >= 800
    if (ASYNC) asm volatile("cp.async.wait_all;\n");
#endif
}

// One tile a block: load, scan, store; BLOCKS resident an SM (their tiles are what keeps the
// SM's loads in flight while a block looks back), so a thread gets 65536 / (BLOCKS x THREADS)
// registers, and holds its ITEMS in them where that is 64 or more (HOLD). On sm_90 and later,
// where `ahead` > 0, thread 0 first asks L2 for tile t + ahead (a tile that a block started
// later will load), so DRAM keeps reading while the SM's blocks wait on their look-backs and
// that block's loads find L2: 146-147 against 154 us on the H200 (256 MiB f32, 512 x 32 at 3
// an SM, about 6 MiB ahead; benchmarks/scan_study.py). Farther ahead, the prefetched tiles
// leave L2 before they are read (12 MiB: 153 us, 25 MiB: 187 us).
template <typename T, int THREADS, int ITEMS, int STRIDE, int SLEEP, int BLOCKS, bool ASYNC>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_single_pass(T* __restrict__ y, const T* __restrict__ x, unsigned long long* state,
                 unsigned long long n, unsigned ahead, unsigned epoch) {
    constexpr unsigned TILE = THREADS * ITEMS;
    extern __shared__ __align__(16) unsigned char scan_bytes[];  // TILE + TILE / 32 of T
    T* buf = reinterpret_cast<T*>(scan_bytes);
    __shared__ T warp_totals[THREADS / 32];
    __shared__ T tile_prefix;
    const unsigned t = blockIdx.x;
    const unsigned long long base = (unsigned long long)t * TILE;
#if __CUDA_ARCH__ >= 900
    const unsigned long long later = base + (unsigned long long)ahead * TILE;
    if (threadIdx.x == 0 && ahead > 0 && later + TILE <= n)
        prefetch_l2(x + later, TILE * sizeof(T));
#endif
    load_tile<T, THREADS, ITEMS, ASYNC>(buf, x, base, n);
    __syncthreads();
    TileStatus<T, STRIDE> status(state, epoch);
    scan_tile<T, THREADS, ITEMS, STRIDE, SLEEP, BLOCKS * THREADS <= 1024>(
        buf, t, status, warp_totals, &tile_prefix);
    __syncthreads();
    const T prefix = tile_prefix;
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {
        const unsigned e = j * THREADS + threadIdx.x;
        if (base + e < n) y[base + e] = buf[padded(e)] + prefix;
    }
}
