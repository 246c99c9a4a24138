// Variants of the inclusive scan (float), compiled after rows.cu's source by scan_study.py to
// time where the scan's time goes. Not shipped. state[0] is a counter (the ticket, or the tiles
// done); tile t's status word is state[16 + 16 t] (rows.cu's TileStatus over state + 16).

__device__ __forceinline__ void bar_sync(unsigned id, unsigned count) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned count) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}

// Tile t's elements into the padded tile with 4-byte cp.async, zeros past n, one commit group.
template <int THREADS, int ITEMS>
__device__ __forceinline__ void issue_tile(float* buf, const float* x, unsigned long long base,
                                           unsigned long long n) {
    constexpr unsigned TILE = THREADS * ITEMS, ROW = THREADS + THREADS / 32;
    const unsigned rem = n - base < TILE ? (unsigned)(n - base) : TILE;
    const float* xs = x + base + threadIdx.x;
    float* ss = buf + threadIdx.x + threadIdx.x / 32;
    if (rem == TILE) {
#pragma unroll
        for (unsigned j = 0; j < ITEMS; ++j) cp_async_element(ss + j * ROW, xs + j * THREADS, true);
    } else {
#pragma unroll
        for (unsigned j = 0; j < ITEMS; ++j) {
            const bool inside = j * THREADS + threadIdx.x < rem;
            cp_async_element(ss + j * ROW, inside ? xs + j * THREADS : x, inside);
        }
    }
    asm volatile("cp.async.commit_group;\n");
}
template <int THREADS, int ITEMS>
__device__ __forceinline__ void store_tile(float* y, const float* buf, unsigned long long base,
                                           unsigned long long n, float prefix) {
    constexpr unsigned TILE = THREADS * ITEMS, ROW = THREADS + THREADS / 32;
    const unsigned rem = n - base < TILE ? (unsigned)(n - base) : TILE;
    float* ys = y + base + threadIdx.x;
    const float* ss = buf + threadIdx.x + threadIdx.x / 32;
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j)
        if (rem == TILE || j * THREADS + threadIdx.x < rem) ys[j * THREADS] = ss[j * ROW] + prefix;
}

// rows.cu's kernel, with the tile by an atomic ticket (TICKET) or by blockIdx.x.
template <int THREADS, int ITEMS, int BLOCKS, bool TICKET>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_order(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
           unsigned long long n) {
    constexpr unsigned TILE = THREADS * ITEMS;
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float* buf = reinterpret_cast<float*>(scan_bytes);
    __shared__ float warp_totals[THREADS / 32];
    __shared__ unsigned ticket;
    __shared__ float tile_prefix;
    if (TICKET) {
        if (threadIdx.x == 0) ticket = atomicAdd(reinterpret_cast<unsigned*>(state), 1u);
        __syncthreads();
    }
    const unsigned t = TICKET ? ticket : blockIdx.x;
    const unsigned long long base = (unsigned long long)t * TILE;
    load_tile<float, THREADS, ITEMS, true>(buf, x, base, n);
    __syncthreads();
    TileStatus<float, 16> status(state + 16, nullptr);
    scan_tile<float, THREADS, ITEMS, 16, 20, false>(buf, t, status, warp_totals, &tile_prefix);
    __syncthreads();
    const float prefix = tile_prefix;
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {
        const unsigned e = j * THREADS + threadIdx.x;
        if (base + e < n) y[base + e] = buf[padded(e)] + prefix;
    }
}

// MODE 0: the tile only copied through shared memory; 1: scanned in the tile alone (no
// look-back: wrong past tile 0, for timing); 2: the whole scan. Tile t by block t.
template <int THREADS, int ITEMS, int BLOCKS, int MODE>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_mode(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
          unsigned long long n) {
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float* buf = reinterpret_cast<float*>(scan_bytes);
    __shared__ float warp_totals[THREADS / 32];
    __shared__ float tile_prefix;
    const unsigned long long base = (unsigned long long)blockIdx.x * THREADS * ITEMS;
    issue_tile<THREADS, ITEMS>(buf, x, base, n);
    asm volatile("cp.async.wait_all;\n");
    __syncthreads();
    float prefix = 0.f;
    if (MODE > 0) {
        TileStatus<float, 16> status(state + 16, nullptr);
        scan_tile<float, THREADS, ITEMS, 16, 20, false>(buf, MODE == 2 ? blockIdx.x : 0u, status,
                                                      warp_totals, &tile_prefix);
        __syncthreads();
        prefix = tile_prefix;
    }
    store_tile<THREADS, ITEMS>(y, buf, base, n, prefix);
}

// A chunk of 4 floats of a tile where each thread owns 8 consecutive chunks: XOR-swizzled
// within the thread's row so that striped and blocked 16-byte accesses are conflict-free.
__device__ __forceinline__ unsigned swz(unsigned c) { return (c & ~7u) | ((c ^ (c >> 3)) & 7u); }

// 16-byte cp.async into the swizzled tile, 16-byte stores; 32 floats a thread.
template <int THREADS, int BLOCKS>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_vec(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
         unsigned long long n) {
    constexpr unsigned Q = 8, TILE = THREADS * Q * 4, WARPS = THREADS / 32;
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float4* buf = reinterpret_cast<float4*>(scan_bytes);
    __shared__ float warp_totals[WARPS];
    __shared__ float tile_prefix;
    const unsigned t = blockIdx.x;
    const unsigned long long base = (unsigned long long)t * TILE;
    const float* xt = x + base;
    const unsigned inside = n - base < TILE ? (unsigned)(n - base) : TILE;
#pragma unroll
    for (unsigned j = 0; j < Q; ++j) {
        const unsigned c = j * THREADS + threadIdx.x, e = 4 * c;
        const unsigned bytes = e + 4 <= inside ? 16u : (e < inside ? 4u * (inside - e) : 0u);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(smem_addr(&buf[swz(c)])), "l"(xt + (bytes ? e : 0)), "r"(bytes));
    }
    asm volatile("cp.async.wait_all;\n");
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float run = 0.f;
#pragma unroll
    for (unsigned k = 0; k < Q; ++k) {
        const float4 v = buf[swz(threadIdx.x * Q + k)];
        run += (v.x + v.y) + (v.z + v.w);
    }
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, run, o);
        if (lane >= o) run += u;
    }
    float before = __shfl_up_sync(0xffffffffu, run, 1);
    if (lane == 0) before = 0.f;
    if (lane == 31) warp_totals[warp] = run;
    __syncthreads();
    float wincl = lane < WARPS ? warp_totals[lane] : 0.f;
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, wincl, o);
        if (lane >= o) wincl += u;
    }
    const float total = __shfl_sync(0xffffffffu, wincl, WARPS - 1);
    const float wexcl = warp == 0 ? 0.f : __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
    TileStatus<float, 16> status(state + 16, nullptr);
    if (warp == 0 && lane == 0 && t > 0) status.publish(t, 1u, total);
    float add = wexcl + before;
#pragma unroll
    for (unsigned k = 0; k < Q; ++k) {
        float4& r = buf[swz(threadIdx.x * Q + k)];
        float4 v = r;
        v.x += add; v.y += v.x; v.z += v.y; v.w += v.z; add = v.w;
        r = v;
    }
    if (warp == 0) {
        const float p = t > 0 ? look_back<float, 16, 20>(status, t, lane) : 0.f;
        if (lane == 0) {
            status.publish(t, 2u, p + total);
            tile_prefix = p;
        }
    }
    __syncthreads();
    const float prefix = tile_prefix;
    float* yt = y + base;
#pragma unroll
    for (unsigned j = 0; j < Q; ++j) {
        const unsigned c = j * THREADS + threadIdx.x, e = 4 * c;
        float4 v = buf[swz(c)];
        v.x += prefix; v.y += prefix; v.z += prefix; v.w += prefix;
        if (e + 4 <= inside) {
            *reinterpret_cast<float4*>(yt + e) = v;
        } else {
            const float w[4] = {v.x, v.y, v.z, v.w};
            for (unsigned i = 0; i < 4 && e + i < inside; ++i) yt[e + i] = w[i];
        }
    }
}

// A dedicated look-back warp (the block's last) looks back while the tile loads; named
// barriers: 1 the scan warps, 3 "the total is in tile_total", 2 "tile_prefix is written".
// CLEAN: the last tile to finish its look-back clears the state (no memset before a launch).
template <int THREADS, int ITEMS, int BLOCKS, bool CLEAN>
__global__ void __launch_bounds__(THREADS + 32, BLOCKS)
scan_lookahead(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
               unsigned long long n) {
    constexpr unsigned WARPS = THREADS / 32, ALL = THREADS + 32;
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float* buf = reinterpret_cast<float*>(scan_bytes);
    __shared__ float warp_totals[WARPS];
    __shared__ float tile_total, tile_prefix;
    const unsigned t = blockIdx.x;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    TileStatus<float, 16> status(state + 16, nullptr);
    if (warp == WARPS) {
        const float p = t > 0 ? look_back<float, 16, 20>(status, t, lane) : 0.f;
        bar_sync(3, ALL);
        if (lane == 0) {
            status.publish(t, 2u, p + tile_total);
            tile_prefix = p;
        }
        bar_arrive(2, ALL);
        if (CLEAN) {
            unsigned d = 0;
            if (lane == 0) d = atomicAdd(reinterpret_cast<unsigned*>(state), 1u);
            d = __shfl_sync(0xffffffffu, d, 0);
            if (d == gridDim.x - 1) {  // every other tile is past its look-back
                __threadfence();
                for (unsigned p = lane; p < gridDim.x; p += 32) state[16 + 16ull * p] = 0;
                if (lane == 0) state[0] = 0;
            }
        }
        return;
    }
    const unsigned long long base = (unsigned long long)t * THREADS * ITEMS;
    issue_tile<THREADS, ITEMS>(buf, x, base, n);
    asm volatile("cp.async.wait_all;\n");
    bar_sync(1, THREADS);
    float run = 0.f;
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) run += buf[padded(threadIdx.x * ITEMS + j)];
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, run, o);
        if (lane >= o) run += u;
    }
    float before = __shfl_up_sync(0xffffffffu, run, 1);
    if (lane == 0) before = 0.f;
    if (lane == 31) warp_totals[warp] = run;
    bar_sync(1, THREADS);
    float wincl = lane < WARPS ? warp_totals[lane] : 0.f;
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, wincl, o);
        if (lane >= o) wincl += u;
    }
    const float total = __shfl_sync(0xffffffffu, wincl, WARPS - 1);
    const float wexcl = warp == 0 ? 0.f : __shfl_sync(0xffffffffu, wincl, (warp + 31) & 31);
    if (threadIdx.x == 0) {
        tile_total = total;
        if (t > 0) status.publish(t, 1u, total);
        __threadfence();  // the total lands before the look-back warp's inclusive prefix
    }
    bar_arrive(3, ALL);
    float add = wexcl + before;
#pragma unroll
    for (unsigned j = 0; j < ITEMS; ++j) {
        float& e = buf[padded(threadIdx.x * ITEMS + j)];
        add += e;
        e = add;
    }
    bar_sync(2, ALL);
    store_tile<THREADS, ITEMS>(y, buf, base, n, tile_prefix);
}

// Persistent: the grid is the blocks that fit at once; block b scans tiles b, b + grid, ...
// and loads its next tile while it scans, looks back and stores the current one.
template <int THREADS, int ITEMS, int BLOCKS, bool HOLD>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_persistent(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
                unsigned long long n) {
    constexpr unsigned TILE = THREADS * ITEMS, PADDED = TILE + TILE / 32;
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float* bufs = reinterpret_cast<float*>(scan_bytes);
    __shared__ float warp_totals[THREADS / 32];
    __shared__ float tile_prefix;
    const unsigned tiles = (unsigned)((n + TILE - 1) / TILE);
    TileStatus<float, 16> status(state + 16, nullptr);
    unsigned cur = 0;
    unsigned t = blockIdx.x;
    issue_tile<THREADS, ITEMS>(bufs, x, (unsigned long long)t * TILE, n);
    for (; t < tiles; t += gridDim.x) {
        float* buf = bufs + cur * PADDED;
        const unsigned next = t + gridDim.x;
        if (next < tiles) {
            issue_tile<THREADS, ITEMS>(bufs + (cur ^ 1) * PADDED, x,
                                       (unsigned long long)next * TILE, n);
            asm volatile("cp.async.wait_group 1;\n");
        } else {
            asm volatile("cp.async.wait_group 0;\n");
        }
        __syncthreads();
        scan_tile<float, THREADS, ITEMS, 16, 20, HOLD>(buf, t, status, warp_totals, &tile_prefix);
        __syncthreads();
        store_tile<THREADS, ITEMS>(y, buf, (unsigned long long)t * TILE, n, tile_prefix);
        __syncthreads();  // buf is the next prefetch's destination
        cur ^= 1;
    }
}
