// C (M x N, float) = A (M x K) B (K x N), both bf16 and row-major as users hold them, on
// Hopper's warpgroup tensor cores, sm_90a only. A persistent grid: each block takes output tiles
// of BM=128 x BN=256 in turn (grouped by GROUP rows of tiles, for L2 reuse). Warpgroup 0 is the
// producer: one thread issues TMA loads of K-tiles of 64 into a STAGES-deep ring of shared
// memory; warpgroups 1 and 2 consume, each 64 rows of the tile with wgmma, A K-major and B
// MN-major (no copy of B: wgmma transposes 16-bit operands itself). Full and empty mbarriers a
// stage hand the ring between them; the pipeline runs on across tiles, so the next tile's loads
// overlap this tile's epilogue. The maps zero-fill past the edges; M, N, K any, with K and N
// multiples of 8 (TMA's 16-byte row strides).

#include "cp_async.cuh"
#include "wgmma.cuh"

struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;

namespace tma_mm {

constexpr int BM = 128, BN = 256, BK = 64, GROUP = 16;
constexpr int A_BYTES = BM * BK * 2, B_CHUNK = BK * 64 * 2, B_BYTES = BN * BK * 2;

__device__ __forceinline__ void bar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void bar_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bar_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}

// Returns once the phase of parity `parity` has completed (a fresh barrier: parity 1 has).
__device__ __forceinline__ void bar_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n"
            " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            " selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    }
}

// The box at (c0 innermost, c1) of the map into dst, counted on bar's transaction bytes.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1,
                                         unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n"
        :: "r"(smem_addr(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
           "r"(smem_addr(bar))
        : "memory");
}

// B's shared-memory descriptor (A's is wgmma_desc): MN-major, 128-byte swizzle, fields in
// 16-byte units: 64-column atoms of 64 rows x 128 bytes, 8192 bytes apart along N (leading
// offset), 8-row groups of K 1024 bytes apart (stride offset).
__device__ __forceinline__ unsigned long long desc_b(const void* p) {
    return ((smem_addr(p) & 0x3FFFFu) >> 4) | (512ull << 16) | (64ull << 32) | (1ull << 62);
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
            const unsigned long long da = wgmma_desc(a + cw * 64 * 128), db = desc_b(a + A_BYTES);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk)  // 16 of K: 32 bytes of A, 16 rows (2048 B) of B
                wgmma_m64n256k16<1>(d, da + 2 * kk, db + 128 * kk);
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
