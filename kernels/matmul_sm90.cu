// C (M x N, float or bf16) = A (M x K) Bt (N x K)^T on Hopper's warpgroup tensor cores
// (wgmma), sm_90a only: both operands K-major (gemm.py transposes B first). A block of two
// warpgroups computes a BM=128 x BN tile, warpgroup w rows 64w..64w+63; K in tiles of 64 (one
// 128-byte row of each operand a tile row) through a STAGES-deep cp.async ring in shared
// memory, written in the 128-byte swizzle wgmma's descriptors name (16-byte chunk c of row r
// at c ^ (r % 8)). Needs K % 8 == 0 and 16-byte aligned A and Bt: every chunk lies wholly
// inside or outside.
#include <cuda_bf16.h>
#include "cp_async.cuh"
#include "wgmma.cuh"
#include "epilogue.cuh"

template <int BN> __device__ __forceinline__ void wgmma_tile(float* d, unsigned long long a,
                                                            unsigned long long b) {
    if constexpr (BN == 128) wgmma_m64n128k16(d, a, b);
    else wgmma_m64n256k16<0>(d, a, b);
}

template <typename OutT, int BN, int STAGES>  // STAGES >= 3
__global__ void __launch_bounds__(256, 1)
matmul_bf16_wgmma(OutT* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                  const __nv_bfloat16* __restrict__ Bt, unsigned M, unsigned N, unsigned K) {
    constexpr int BM = 128, BK = 64, THREADS = 256;
    constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK;  // elements; rows of 128 bytes
    extern __shared__ unsigned char smem_raw[];
    // The swizzle is a function of the address: tiles start on 1024-byte boundaries.
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(
        (reinterpret_cast<unsigned long long>(smem_raw) + 1023) & ~1023ull);
    __nv_bfloat16* Bs = As + STAGES * A_STAGE;
    const unsigned wg = threadIdx.x / 128;
    // Groups of 8 block-rows, column by column, as matmul_bf16_pipelined (L2 reuse).
    const unsigned pid = blockIdx.y * gridDim.x + blockIdx.x, per_group = 8 * gridDim.x;
    const unsigned first = pid / per_group * 8, rows_in_group = min(gridDim.y - first, 8u);
    const unsigned m0 = (first + pid % per_group % rows_in_group) * BM;
    const unsigned n0 = pid % per_group / rows_in_group * BN;
    const unsigned tiles = (K + BK - 1) / BK;
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;

    auto load = [&](int slot, unsigned tile) {
        const unsigned k0 = tile * BK;
        unsigned char* as = reinterpret_cast<unsigned char*>(As + slot * A_STAGE);
        unsigned char* bs = reinterpret_cast<unsigned char*>(Bs + slot * B_STAGE);
#pragma unroll
        for (int e = threadIdx.x; e < BM * 8; e += THREADS) {
            const unsigned r = e / 8, c = e % 8, gm = m0 + r, gk = k0 + c * 8;
            const bool inside = gm < M && gk < K;
            cp_async16(as + r * 128 + ((c ^ (r & 7)) << 4),
                       inside ? A + (unsigned long long)gm * K + gk : A, inside);
        }
#pragma unroll
        for (int e = threadIdx.x; e < BN * 8; e += THREADS) {
            const unsigned r = e / 8, c = e % 8, gn = n0 + r, gk = k0 + c * 8;
            const bool inside = gn < N && gk < K;
            cp_async16(bs + r * 128 + ((c ^ (r & 7)) << 4),
                       inside ? Bt + (unsigned long long)gn * K + gk : Bt, inside);
        }
    };

    // One commit group a tile, empty past the last. One group of wgmma stays in flight while
    // the next is issued, so the slot refilled at step t is that of tile t - 2 (whose wgmma
    // every warpgroup has waited for before this step's barrier): STAGES - 2 tiles ahead.
#pragma unroll
    for (int t = 0; t < STAGES - 2; ++t) {
        if (t < tiles) load(t, t);
        asm volatile("cp.async.commit_group;\n");
    }
    for (unsigned t = 0; t < tiles; ++t) {
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 3));
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();  // tile t landed for all; every wgmma of tile t - 2 has completed
        if (t + STAGES - 2 < tiles) load((t + STAGES - 2) % STAGES, t + STAGES - 2);
        asm volatile("cp.async.commit_group;\n");
        const __nv_bfloat16* as = As + (t % STAGES) * A_STAGE + wg * 64 * BK;
        const __nv_bfloat16* bs = Bs + (t % STAGES) * B_STAGE;
        const unsigned long long da = wgmma_desc(as), db = wgmma_desc(bs);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)  // 16 elements = 32 bytes = 2 descriptor units
            wgmma_tile<BN>(d, da + 2 * kk, db + 2 * kk);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    asm volatile("cp.async.wait_all;\n");
    // The accumulator layout: warp w of the warpgroup holds rows 16w..16w+15; for each 8
    // columns j, d[4j], d[4j+1] at row lane/4 and d[4j+2], d[4j+3] at row lane/4 + 8, columns
    // 8j + 2 (lane % 4) and the next.
    const unsigned w = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned gm = m0 + wg * 64 + w * 16 + lane / 4 + h * 8;
            const unsigned gn = n0 + j * 8 + (lane % 4) * 2;
            if (gm < M && gn < N)  // N % 8 == 0: gn < N implies gn + 1 < N
                store_out2(C + (unsigned long long)gm * N + gn, d[4 * j + 2 * h],
                           d[4 * j + 2 * h + 1]);
        }
}
