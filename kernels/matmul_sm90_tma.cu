// C (M x N, float) = A (M x K) B (K x N), both bf16 and row-major as users hold them, on
// Hopper's warpgroup tensor cores, sm_90a only. A persistent grid: each block takes output tiles
// of BM=128 x BN=256 in turn (grouped by GROUP rows of tiles, for L2 reuse). Warpgroup 0 is the
// producer: one thread issues TMA loads of K-tiles of 64 into a STAGES-deep ring of shared
// memory; warpgroups 1 and 2 consume, each 64 rows of the tile with wgmma, A K-major and B
// MN-major (no copy of B: wgmma transposes 16-bit operands itself). Full and empty mbarriers a
// stage hand the ring between them; the pipeline runs on across tiles, so the next tile's loads
// overlap this tile's epilogue. The maps zero-fill past the edges; M, N, K any, with K and N
// multiples of 8 (TMA's 16-byte row strides).

struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;

namespace tma_mm {

constexpr int BM = 128, BN = 256, BK = 64, GROUP = 16;
constexpr int A_BYTES = BM * BK * 2, B_CHUNK = BK * 64 * 2, B_BYTES = BN * BK * 2;

__device__ __forceinline__ unsigned smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem(bar)) : "memory");
}

// Returns once the phase of parity `parity` has completed (a fresh barrier: parity 1 has).
__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n"
            " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(smem(bar)), "r"(parity) : "memory");
    }
}

// The box at (c0 innermost, c1) of the map into dst, counted on bar's transaction bytes.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1,
                                         unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n"
        :: "r"(smem(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
           "r"(smem(bar))
        : "memory");
}

// Shared-memory matrix descriptors, 128-byte swizzle, fields in 16-byte units. A, K-major:
// rows of 128 bytes, 8-row groups 1024 bytes apart (stride offset). B, MN-major: 64-column
// atoms of 64 rows x 128 bytes, 8192 bytes apart along N (leading offset), 8-row groups of K
// 1024 bytes apart (stride offset).
__device__ __forceinline__ unsigned long long desc_a(const void* p) {
    return ((smem(p) & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ unsigned long long desc_b(const void* p) {
    return ((smem(p) & 0x3FFFFu) >> 4) | (512ull << 16) | (64ull << 32) | (1ull << 62);
}

// d += A (64 x 16, K-major) B (16 x 256, MN-major): the last immediate transposes B.
__device__ __forceinline__ void wgmma_256(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, 1, 1, 1, 0, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b));
}

// Tile t of the grid of (tiles_m x tiles_n) in groups of GROUP tile rows, column by column.
__device__ __forceinline__ void tile_origin(unsigned t, unsigned tiles_m, unsigned tiles_n,
                                            unsigned& m0, unsigned& n0) {
    const unsigned per_group = GROUP * tiles_n, first = t / per_group * GROUP;
    const unsigned rows = min(tiles_m - first, (unsigned)GROUP), in_group = t % per_group;
    m0 = (first + in_group % rows) * BM;
    n0 = in_group / rows * BN;
}

}  // namespace tma_mm

template <int STAGES>
__global__ void __launch_bounds__(384, 1)
matmul_bf16_tma(float* __restrict__ C, const __grid_constant__ CUtensorMap map_a,
                const __grid_constant__ CUtensorMap map_b, unsigned M, unsigned N, unsigned K) {
    using namespace tma_mm;
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) unsigned long long full[STAGES], empty[STAGES];
    // The swizzle is a function of the address: each stage starts on a 1024-byte boundary.
    unsigned char* ring = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
    const unsigned tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const unsigned tiles = tiles_m * tiles_n, k_tiles = (K + BK - 1) / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(&full[s], 1);   // the producer's arrive, then the loads' bytes
            bar_init(&empty[s], 2);  // one arrive a consumer warpgroup
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const unsigned wg = threadIdx.x / 128;
    if (wg == 0) {  // the producer: 40 registers are plenty
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0) return;
        unsigned it = 0;
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
            unsigned m0, n0;
            tile_origin(t, tiles_m, tiles_n, m0, n0);
            for (unsigned kt = 0; kt < k_tiles; ++kt, ++it) {
                const unsigned s = it % STAGES, phase = (it / STAGES) & 1;
                bar_wait(&empty[s], phase ^ 1);  // both consumers are done with the slot
                unsigned char* a = ring + s * (A_BYTES + B_BYTES);
                bar_expect(&full[s], A_BYTES + B_BYTES);
                tma_load(a, &map_a, kt * BK, m0, &full[s]);
#pragma unroll
                for (int j = 0; j < BN / 64; ++j)
                    tma_load(a + A_BYTES + j * B_CHUNK, &map_b, n0 + 64 * j, kt * BK, &full[s]);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const unsigned cw = wg - 1;  // rows 64 cw .. 64 cw + 63 of the tile
    const unsigned w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    unsigned it = 0;
    float d[BN / 2];
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        unsigned m0, n0;
        tile_origin(t, tiles_m, tiles_n, m0, n0);
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
        for (unsigned kt = 0; kt < k_tiles; ++kt, ++it) {
            const unsigned s = it % STAGES, phase = (it / STAGES) & 1;
            bar_wait(&full[s], phase);
            const unsigned char* a = ring + s * (A_BYTES + B_BYTES);
            const unsigned long long da = desc_a(a + cw * 64 * 128), db = desc_b(a + A_BYTES);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk)  // 16 of K: 32 bytes of A, 16 rows (2048 B) of B
                wgmma_256(d, da + 2 * kk, db + 128 * kk);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (threadIdx.x % 128 == 0) bar_arrive(&empty[s]);
        }
        // The accumulator layout: warp w holds rows 16w..16w+15 of the warpgroup's 64; for
        // each 8 columns j, d[4j], d[4j+1] at row lane/4 and d[4j+2], d[4j+3] at lane/4 + 8,
        // columns 8j + 2 (lane % 4) and the next.
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned gm = m0 + cw * 64 + w * 16 + lane / 4 + h * 8;
                const unsigned gn = n0 + j * 8 + (lane % 4) * 2;
                if (gm < M && gn < N)  // N % 8 == 0: gn < N implies gn + 1 < N
                    *reinterpret_cast<float2*>(C + (unsigned long long)gm * N + gn) =
                        make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
            }
    }
}
