// C (M x N, float or bf16) = A (M x K) B (K x N), A and B bf16 and row-major as users hold
// them, on Hopper's warpgroup tensor cores, sm_90a only. A persistent grid: each block takes
// output tiles of BM=128 x BN=256 in turn (grouped by GROUP rows of tiles, for L2 reuse).
// Warpgroup 0 is the producer: one thread issues TMA loads of K-tiles of 64 into a
// STAGES-deep ring of shared memory; warpgroups 1 and 2 consume, each 64 rows of the tile with
// wgmma, A K-major and B MN-major (no copy of B: wgmma transposes 16-bit operands itself).
// Full and empty mbarriers a stage hand the ring between them; the pipeline runs on across
// tiles, so the next tile's loads overlap this tile's epilogue, in which each consumer stages
// its rows of C in shared memory and stores them with TMA. With clusters of CM blocks
// along M (CM = 2), the blocks of a cluster take vertically adjacent tiles, which share B's
// K-tiles: each block loads 1/CM of them and TMA multicasts it into every block of the
// cluster, so B crosses L2 once a cluster. The maps zero-fill past the edges; M, N, K any,
// with K and N multiples of 8 (TMA's 16-byte row strides).

#include "cp_async.cuh"
#include "wgmma.cuh"
#include "epilogue.cuh"

struct alignas(64) CUtensorMap_st { unsigned long long opaque[16]; };
typedef CUtensorMap_st CUtensorMap;

namespace tma_mm {

constexpr int BM = 128, BN = 256, BK = 64, GROUP = 16;
constexpr int A_BYTES = BM * BK * 2, B_CHUNK = BK * 64 * 2, B_BYTES = BN * BK * 2;
// The epilogue stages a consumer's 64 rows of C through two boxes of 64 rows x 128 bytes
// (128-byte swizzle) at a time: 2 passes over the tile's 256 columns in bf16, 4 in float.
constexpr int OUT_BOX = 64 * 128, OUT_STAGE = 2 * OUT_BOX;

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

// An arrive on the barrier at bar's offset in block `cta` of the cluster (this one included).
// The default release at CTA scope, as CUTLASS's cluster barriers: the wgmma reads of the slot
// it hands back have completed before it (.release.cluster here made the whole kernel 2.5x
// slower on the H100: 315 against 778 TFLOP/s at 8192^3 into bf16).
__device__ __forceinline__ void bar_arrive_cluster(unsigned long long* bar, unsigned cta) {
    asm volatile(
        "{\n .reg .b32 remote;\n"
        " mapa.shared::cluster.u32 remote, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
        :: "r"(smem_addr(bar)), "r"(cta) : "memory");
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

// tma_load's box, written at dst's offset into every block of the cluster that `ctas` has a
// bit for, each counted on the barrier at bar's offset in that block.
__device__ __forceinline__ void tma_load_multicast(void* dst, const CUtensorMap* map, int c0,
                                                   int c1, unsigned long long* bar,
                                                   unsigned short ctas) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
        :: "r"(smem_addr(dst)), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
           "r"(smem_addr(bar)), "h"(ctas)
        : "memory");
}

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster has arrived; what they wrote before is seen.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The box at smem into the map at (c0 innermost, c1), in this thread's bulk group; TMA writes
// only the part inside the matrix.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, int c0, int c1,
                                          const void* smem) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
        :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(smem_addr(smem))
        : "memory");
}

// The 128 threads of consumer warpgroup `cw` meet (named barrier 1 + cw; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(unsigned cw) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(1 + cw) : "memory");
}

// B's shared-memory descriptor (A's is wgmma_desc): MN-major, 128-byte swizzle, fields in
// 16-byte units: 64-column atoms of 64 rows x 128 bytes, 8192 bytes apart along N (leading
// offset), 8-row groups of K 1024 bytes apart (stride offset).
__device__ __forceinline__ unsigned long long desc_b(const void* p) {
    return ((smem_addr(p) & 0x3FFFFu) >> 4) | (512ull << 16) | (64ull << 32) | (1ull << 62);
}

// Tile t of the grid of (rows x tiles_n) tiles of CM x BM rows, in groups of GROUP / CM tile
// rows, column by column; (m0, n0) is where block `rank` of the cluster's BM rows start.
template <int CM>
__device__ __forceinline__ void tile_origin(unsigned t, unsigned rows, unsigned tiles_n,
                                            unsigned rank, unsigned& m0, unsigned& n0) {
    constexpr unsigned G = GROUP / CM;
    const unsigned per_group = G * tiles_n, first = t / per_group * G;
    const unsigned in_rows = min(rows - first, G), in_group = t % per_group;
    m0 = ((first + in_group % in_rows) * CM + rank) * BM;
    n0 = in_group / in_rows * BN;
}

}  // namespace tma_mm

template <typename OutT, int STAGES, int CM>  // CM: 1, or 2 blocks a cluster along M
__global__ void __launch_bounds__(384, 1)
matmul_bf16_tma(const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_a,
                const __grid_constant__ CUtensorMap map_b, unsigned M, unsigned N, unsigned K) {
    using namespace tma_mm;
    constexpr int B_SHARE = BN / 64 / CM;  // the B chunks of a K-tile this block loads
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) unsigned long long full[STAGES], empty[STAGES];
    // The swizzle is a function of the address: each stage starts on a 1024-byte boundary.
    unsigned char* ring = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
    unsigned char* out_stage = ring + STAGES * (A_BYTES + B_BYTES);  // OUT_STAGE a consumer
    const unsigned rank = CM == 1 ? 0 : cluster_rank();
    const unsigned rows = ((M + BM - 1) / BM + CM - 1) / CM, tiles_n = (N + BN - 1) / BN;
    const unsigned tiles = rows * tiles_n, k_tiles = (K + BK - 1) / BK;
    const unsigned first = blockIdx.x / CM, step = gridDim.x / CM;  // the cluster's tiles
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(&full[s], 1);        // this block's producer, then the loads' bytes
            bar_init(&empty[s], 2 * CM);  // each consumer warpgroup of the cluster
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (CM > 1) cluster_sync();  // no block loads into or arrives at another's ring before this
    else __syncthreads();
    const unsigned wg = threadIdx.x / 128;
    if (wg == 0) {  // the producer: 40 registers are plenty
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            unsigned it = 0;
            for (unsigned t = first; t < tiles; t += step) {
                unsigned m0, n0;
                tile_origin<CM>(t, rows, tiles_n, rank, m0, n0);
                for (unsigned kt = 0; kt < k_tiles; ++kt, ++it) {
                    const unsigned s = it % STAGES, phase = (it / STAGES) & 1;
                    bar_wait(&empty[s], phase ^ 1);  // every consumer of the cluster is done
                    unsigned char* a = ring + s * (A_BYTES + B_BYTES);
                    bar_expect(&full[s], A_BYTES + B_BYTES);  // B: its share and the others'
                    tma_load(a, &map_a, kt * BK, m0, &full[s]);
#pragma unroll
                    for (int j = rank * B_SHARE; j < (rank + 1) * B_SHARE; ++j) {
                        if (CM == 1)
                            tma_load(a + A_BYTES + j * B_CHUNK, &map_b, n0 + 64 * j, kt * BK,
                                     &full[s]);
                        else
                            tma_load_multicast(a + A_BYTES + j * B_CHUNK, &map_b, n0 + 64 * j,
                                               kt * BK, &full[s], (1u << CM) - 1);
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const unsigned cw = wg - 1;  // rows 64 cw .. 64 cw + 63 of the tile
        const unsigned w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
        const bool leader = threadIdx.x % 128 == 0;
        // Slot s is free again for every producer of the cluster: this block's arrive first,
        // so no block sees a later phase's arrive before this one.
        auto release = [&](unsigned s) {
            if (!leader) return;
            if (CM == 1) bar_arrive(&empty[s]);
            else
                for (unsigned i = 0; i < CM; ++i) bar_arrive_cluster(&empty[s], (rank + i) % CM);
        };
        unsigned it = 0;
        float d[BN / 2];
        for (unsigned t = first; t < tiles; t += step) {
            unsigned m0, n0;
            tile_origin<CM>(t, rows, tiles_n, rank, m0, n0);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
            for (unsigned kt = 0; kt < k_tiles; ++kt, ++it) {
                const unsigned s = it % STAGES, phase = (it / STAGES) & 1;
                bar_wait(&full[s], phase);
                const unsigned char* a = ring + s * (A_BYTES + B_BYTES);
                const unsigned long long da = wgmma_desc(a + cw * 64 * 128);
                const unsigned long long db = desc_b(a + A_BYTES);
                asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk)  // 16 of K: 32 bytes of A, 2048 B of B
                    wgmma_m64n256k16<1>(d, da + 2 * kk, db + 128 * kk);
                asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                // Waiting for this K-tile's products before the next frees its slot at once;
                // the other consumer warpgroup keeps the tensor cores busy meanwhile (keeping
                // one K-tile in flight instead measured slower on the H100).
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                release(s);
            }
            // The accumulator layout: warp w holds rows 16w..16w+15 of the warpgroup's 64; for
            // each 8 columns j, d[4j], d[4j+1] at row lane/4 and d[4j+2], d[4j+3] at lane/4 + 8,
            // columns 8j + 2 (lane % 4) and the next. Each pass writes BOX_COLS x 2 columns of
            // them into the staging boxes, in the swizzle the map reads (16-byte unit u of row
            // r at u ^ (r % 8): the 8 rows of a store land on distinct banks), and one thread
            // stores the boxes with TMA, which clips them at the matrix's edges.
            constexpr int BOX_COLS = 128 / sizeof(OutT), J_PASS = 2 * BOX_COLS / 8;
            unsigned char* stage = out_stage + cw * OUT_STAGE;
#pragma unroll
            for (int pass = 0; pass < BN / 8 / J_PASS; ++pass) {
                // The previous pass's boxes have been read out of shared memory.
                if (leader) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                warpgroup_sync(cw);
#pragma unroll
                for (int jj = 0; jj < J_PASS; ++jj)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const unsigned r = w * 16 + lane / 4 + h * 8, c = jj * 8 + (lane % 4) * 2;
                        const unsigned byte = (c % BOX_COLS) * sizeof(OutT);
                        unsigned char* p = stage + c / BOX_COLS * OUT_BOX + r * 128 +
                                           ((byte / 16) ^ (r % 8)) * 16 + byte % 16;
                        const int j = pass * J_PASS + jj;
                        store_out2(reinterpret_cast<OutT*>(p), d[4 * j + 2 * h],
                                   d[4 * j + 2 * h + 1]);
                    }
                // The generic proxy's writes, seen by TMA's async proxy.
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                warpgroup_sync(cw);
                if (leader) {
                    const int c0 = n0 + pass * 2 * BOX_COLS, c1 = m0 + cw * 64;
                    tma_store(&map_c, c0, c1, stage);
                    tma_store(&map_c, c0 + BOX_COLS, c1, stage + OUT_BOX);
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
        }
        if (leader) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
    // No block leaves while another of its cluster may still arrive at its barriers.
    if (CM > 1) cluster_sync();
}
