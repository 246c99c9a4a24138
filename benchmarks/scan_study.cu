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

// rows.cu's kernel, with the tile by an atomic ticket (TICKET) or by blockIdx.x. Where AHEAD
// > 0, it first asks L2 for tile t + AHEAD (as rows.cu's `ahead` does): by one bulk prefetch
// from thread 0, or with LINES a 128-byte line a thread (prefetch.global.L2).
template <int THREADS, int ITEMS, int BLOCKS, bool TICKET, int AHEAD = 0, bool LINES = false>
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
    const unsigned long long later = base + (unsigned long long)AHEAD * TILE;
    if (AHEAD > 0 && later + TILE <= n) {
        if (LINES)
            asm volatile("prefetch.global.L2 [%0];\n" :: "l"(x + later + threadIdx.x * ITEMS));
        else if (threadIdx.x == 0)
            prefetch_l2(x + later, TILE * 4);
    }
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

// Hopper's bulk copies (sm_90+) and the mbarrier they signal.
#if __CUDA_ARCH__ >= 900
// An mbarrier whose phase completes after `count` arrivals and every byte it was told to
// expect has landed; fenced so that the TMA unit (the async proxy) sees it initialised.
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                 :: "r"(smem_addr(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Tells bar to expect `bytes` more and arrives on it.
__device__ __forceinline__ void mbarrier_arrive_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Waits for bar's phase of the given parity (0 first) to complete.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    } while (!done);
}
// `bytes` (a multiple of 16; src and dst 16-byte aligned) from global src to shared dst by the
// TMA unit, counted on bar as they land.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// `bytes` from shared src to global dst by the TMA unit; returns once src has been read (the
// block may then exit or reuse it). The writers of src fence (fence_proxy_async) before the
// barrier that precedes this.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 :: "l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Orders this thread's earlier shared-memory writes before later bulk copies that read them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#endif

// 16 bytes of T: the unit a thread moves to and from shared memory in scan_bulk.
template <typename T> struct alignas(16) Chunk { T v[16 / sizeof(T)]; };

// a[i] = a[(i + SIGN r) mod 8] for all i at once, by three conditional rotations (selects, so
// the array stays in registers where an index computed at run time would not).
template <int SIGN, typename T>
__device__ __forceinline__ void rotate8(T (&a)[8], unsigned r) {
#pragma unroll
    for (int b = 1; b < 8; b <<= 1) {
        T o[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = a[(i + SIGN * b) & 7];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = (r & b) ? o[i] : a[i];
    }
}

// The scan on Hopper (sm_90+) with x and y 16-byte aligned, not kept (slower: see RESULTS.md):
// a whole tile comes in by bulk copies (the TMA unit moves it while the block's threads issue nothing, and signals an
// mbarrier as the bytes land) into a plain, unpadded tile, and leaves in 16-byte stores. A
// thread's run of ITEMS elements is 8 chunks of 16 bytes, 128 bytes apart from the next
// thread's; lane l reads its chunks from (k + l) mod 8 on, so that the 8 lanes that share a
// shared-memory wavefront hit 8 different bank groups, and rotate8 turns the chunks' sums into
// their order in the run and the prefixes back. The tile past n (the last one) is read and
// written element by element.
// COPIES bulk copies bring the tile in (lane c of warp 0 issues copy c); BULK_STORE sends a
// whole tile out by one bulk copy too, after the prefix is added in shared memory.
template <typename T, int THREADS, int ITEMS, int STRIDE, int SLEEP, int BLOCKS, int COPIES,
          bool BULK_STORE>
__device__ __forceinline__ void scan_bulk_tile(T* __restrict__ y, const T* __restrict__ x,
                                               unsigned long long* state, T* sums,
                                               unsigned long long n) {
#if __CUDA_ARCH__ >= 900
    using C = Chunk<T>;
    constexpr unsigned PER = 16 / sizeof(T), CHUNKS = ITEMS / PER, TILE = THREADS * ITEMS;
    static_assert(CHUNKS == 8, "a thread's run is 8 chunks of 16 bytes");
    constexpr bool HOLD = BLOCKS * THREADS <= 1024;
    extern __shared__ __align__(16) unsigned char scan_bytes[];  // TILE of T
    T* buf = reinterpret_cast<T*>(scan_bytes);
    C* chunks = reinterpret_cast<C*>(scan_bytes);
    __shared__ __align__(8) unsigned long long landed;
    __shared__ T warp_totals[THREADS / 32];
    __shared__ T tile_prefix;
    const unsigned t = blockIdx.x, lane = threadIdx.x & 31;
    const unsigned long long base = (unsigned long long)t * TILE;
    const bool whole = base + TILE <= n;
    if (!whole) {
#pragma unroll
        for (unsigned j = 0; j < ITEMS; ++j) {
            const unsigned e = j * THREADS + threadIdx.x;
            buf[e] = base + e < n ? x[base + e] : T(0);
        }
    } else if (threadIdx.x < COPIES) {
        constexpr unsigned PIECE = TILE / COPIES;
        if (threadIdx.x == 0) {
            mbarrier_init(&landed, 1);
            mbarrier_arrive_expect(&landed, TILE * sizeof(T));
        }
        if (COPIES > 1) __syncwarp((1u << COPIES) - 1);
        bulk_load(buf + threadIdx.x * PIECE, x + base + threadIdx.x * PIECE,
                  PIECE * sizeof(T), &landed);
    }
    __syncthreads();
    if (whole) mbarrier_wait(&landed, 0);
    TileStatus<T, STRIDE> status(state, sums);
    const unsigned own = threadIdx.x * CHUNKS;  // the thread's first chunk
    C v[HOLD ? CHUNKS : 1];
    T part[CHUNKS];  // slot k: chunk (k + lane) mod 8's sum, then the run's sum before it
#pragma unroll
    for (unsigned k = 0; k < CHUNKS; ++k) {
        const C w = chunks[own + ((k + lane) & 7)];
        if (HOLD) v[k] = w;
        T sum = w.v[0];
#pragma unroll
        for (unsigned p = 1; p < PER; ++p) sum += w.v[p];
        part[k] = sum;
    }
    rotate8<-1>(part, lane);  // part[c]: chunk c's sum
    T run = T(0);
#pragma unroll
    for (unsigned c = 0; c < CHUNKS; ++c) {
        const T sum = part[c];
        part[c] = run;
        run += sum;
    }
    rotate8<1>(part, lane);  // part[k]: the sum before slot k's chunk
    T total;
    const T add = offset_in_tile<T, THREADS>(run, warp_totals, total);
    if (threadIdx.x == 0 && t > 0) status.publish(t, 1u, total);  // as early as can be
#pragma unroll
    for (unsigned k = 0; k < CHUNKS; ++k) {
        C& slot = chunks[own + ((k + lane) & 7)];
        C w = HOLD ? v[HOLD ? k : 0] : slot;
        T acc = add + part[k];
#pragma unroll
        for (unsigned p = 0; p < PER; ++p) {
            acc += w.v[p];
            w.v[p] = acc;
        }
        slot = w;
    }
    finish_tile<T, STRIDE, SLEEP>(status, t, total, &tile_prefix);
    __syncthreads();
    const T prefix = tile_prefix;
#pragma unroll
    for (unsigned j = 0; j < CHUNKS; ++j) {  // coalesced, striped over the block
        const unsigned q = j * THREADS + threadIdx.x;
        C w = chunks[q];
#pragma unroll
        for (unsigned p = 0; p < PER; ++p) w.v[p] += prefix;
        if (BULK_STORE && whole) {
            chunks[q] = w;
        } else if (whole) {
            reinterpret_cast<C*>(y + base)[q] = w;
        } else {
#pragma unroll
            for (unsigned p = 0; p < PER; ++p)
                if (base + q * PER + p < n) y[base + q * PER + p] = w.v[p];
        }
    }
    if (BULK_STORE && whole) {
        fence_proxy_async();  // this thread's writes to the tile, seen by the TMA unit
        __syncthreads();
        if (threadIdx.x == 0) bulk_store(y + base, buf, TILE * sizeof(T));
    }
#endif
}

// The tile of scan_bulk only copied: COPIES bulk copies in, 16-byte stores or one bulk copy
// out (whole tiles only: n a multiple of THREADS x 32).
template <int THREADS, int BLOCKS, int COPIES, bool BULK_STORE>
__global__ void __launch_bounds__(THREADS, BLOCKS)
copy_bulk(float* __restrict__ y, const float* __restrict__ x, unsigned long long*,
          unsigned long long) {
    constexpr unsigned TILE = THREADS * 32, PIECE = TILE / COPIES;
    extern __shared__ __align__(16) unsigned char scan_bytes[];
    float* buf = reinterpret_cast<float*>(scan_bytes);
    __shared__ __align__(8) unsigned long long landed;
    const unsigned long long base = (unsigned long long)blockIdx.x * TILE;
    if (threadIdx.x < COPIES) {
        if (threadIdx.x == 0) {
            mbarrier_init(&landed, 1);
            mbarrier_arrive_expect(&landed, TILE * 4);
        }
        if (COPIES > 1) __syncwarp((1u << COPIES) - 1);
        bulk_load(buf + threadIdx.x * PIECE, x + base + threadIdx.x * PIECE, PIECE * 4, &landed);
    }
    __syncthreads();
    mbarrier_wait(&landed, 0);
    if (BULK_STORE) {
        if (threadIdx.x == 0) bulk_store(y + base, buf, TILE * 4);
        return;
    }
    for (unsigned j = 0; j < 8; ++j) {
        const unsigned q = j * THREADS + threadIdx.x;
        reinterpret_cast<float4*>(y + base)[q] = reinterpret_cast<const float4*>(buf)[q];
    }
}

// scan_bulk with the study's arguments (no sums: float only).
template <int THREADS, int BLOCKS, int COPIES, bool BULK_STORE>
__global__ void __launch_bounds__(THREADS, BLOCKS)
scan_bulk_study(float* __restrict__ y, const float* __restrict__ x, unsigned long long* state,
                unsigned long long n) {
    scan_bulk_tile<float, THREADS, 32, 16, 20, BLOCKS, COPIES, BULK_STORE>(y, x, state, nullptr,
                                                                          n);
}
