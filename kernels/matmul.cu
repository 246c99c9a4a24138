// C (M x N) = A (M x K) B (K x N), all row-major; C float, or for bf16 A and B float or bf16.
#include <cuda_bf16.h>
#include "cp_async.cuh"
#include "epilogue.cuh"

// float32: a 64x64 tile of C per block of 256 threads, each thread 4x4 outputs, K in steps of 16
// through shared memory.
extern "C" __global__ void __launch_bounds__(256)
matmul_f32(float* __restrict__ C, const float* __restrict__ A, const float* __restrict__ B,
           unsigned M, unsigned N, unsigned K) {
    __shared__ float As[16][64 + 4];  // As[k][m]: A's tile transposed, so rows read as float4
    __shared__ float Bs[16][64 + 4];
    unsigned tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    unsigned m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    float acc[4][4] = {};
    for (unsigned k0 = 0; k0 < K; k0 += 16) {
        for (unsigned e = threadIdx.x; e < 64 * 16; e += 256) {
            unsigned r = e / 16, k = e % 16;  // A: 64 rows x 16 k
            unsigned gm = m0 + r, gk = k0 + k;
            As[k][r] = (gm < M && gk < K) ? A[(unsigned long long)gm * K + gk] : 0.0f;
            unsigned kb = e / 64, c = e % 64;  // B: 16 k x 64 cols
            unsigned gkb = k0 + kb, gn = n0 + c;
            Bs[kb][c] = (gkb < K && gn < N) ? B[(unsigned long long)gkb * N + gn] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (unsigned k = 0; k < 16; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) { a[i] = As[k][ty * 4 + i]; b[i] = Bs[k][tx * 4 + i]; }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        unsigned gm = m0 + ty * 4 + i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; ++j) {
            unsigned gn = n0 + tx * 4 + j;
            if (gn < N) C[(unsigned long long)gm * N + gn] = acc[i][j];
        }
    }
}

// bfloat16 on the tensor cores through mma.sync.m16n8k16 (float accumulate): a 128x128 tile of C
// per block of 8 warps (2 x 4), each warp 64x32 = 4 x 4 mma tiles; K in steps of 32 through
// shared memory. Inline PTX keeps it free of the CUDA headers NVRTC may lack (mma.h).
// acc += a (16x16, row fragments) * b (16x8, column fragments), one warp-wide mma. Not asm
// volatile: only its registers order it, so the compiler may schedule it freely.
__device__ __forceinline__ void mma_bf16_16816(float* acc, const unsigned* a, const unsigned* b) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned pack2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}

template <typename OutT>
__global__ void __launch_bounds__(256)
matmul_bf16(OutT* __restrict__ C, const __nv_bfloat16* __restrict__ A,
            const __nv_bfloat16* __restrict__ B, unsigned M, unsigned N, unsigned K) {
    constexpr int BM = 128, BN = 128, BK = 32, PAD = 8;
    __shared__ __align__(16) __nv_bfloat16 As[BM][BK + PAD];
    __shared__ __align__(16) __nv_bfloat16 Bs[BK][BN + PAD];
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / 4, wn = warp % 4;
    unsigned g = lane / 4, tg = lane % 4;  // the PTX fragment layout's groupID, thread-in-group
    unsigned m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[4][4][4] = {};
    const __nv_bfloat16 zero = __float2bfloat16(0.0f);
    bool vec_a = (K % 8 == 0) && (reinterpret_cast<unsigned long long>(A) % 16 == 0);
    bool vec_b = (N % 8 == 0) && (reinterpret_cast<unsigned long long>(B) % 16 == 0);
    for (unsigned k0 = 0; k0 < K; k0 += BK) {
        // A tile: 128 x 32 = 512 chunks of 8; B tile: 32 x 128 = 512 chunks of 8.
        for (unsigned e = threadIdx.x; e < 512; e += 256) {
            unsigned r = e / 4, c = (e % 4) * 8, gm = m0 + r, gk = k0 + c;
            if (vec_a && gm < M && gk + 8 <= K) {
                *reinterpret_cast<uint4*>(&As[r][c]) =
                    *reinterpret_cast<const uint4*>(&A[(unsigned long long)gm * K + gk]);
            } else {
                for (int q = 0; q < 8; ++q)
                    As[r][c + q] = (gm < M && gk + q < K) ? A[(unsigned long long)gm * K + gk + q]
                                                          : zero;
            }
            unsigned rb = e / 16, cb = (e % 16) * 8, gkb = k0 + rb, gn = n0 + cb;
            if (vec_b && gkb < K && gn + 8 <= N) {
                *reinterpret_cast<uint4*>(&Bs[rb][cb]) =
                    *reinterpret_cast<const uint4*>(&B[(unsigned long long)gkb * N + gn]);
            } else {
                for (int q = 0; q < 8; ++q)
                    Bs[rb][cb + q] = (gkb < K && gn + q < N)
                                         ? B[(unsigned long long)gkb * N + gn + q] : zero;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[4][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                unsigned r = wm * 64 + i * 16 + g, c = kk + tg * 2;
                a[i][0] = *reinterpret_cast<const unsigned*>(&As[r][c]);
                a[i][1] = *reinterpret_cast<const unsigned*>(&As[r + 8][c]);
                a[i][2] = *reinterpret_cast<const unsigned*>(&As[r][c + 8]);
                a[i][3] = *reinterpret_cast<const unsigned*>(&As[r + 8][c + 8]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                unsigned n = wn * 32 + j * 8 + g, k = kk + tg * 2;
                b[j][0] = pack2(Bs[k][n], Bs[k + 1][n]);
                b[j][1] = pack2(Bs[k + 8][n], Bs[k + 9][n]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[i][j], a[i], b[j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // c0,c1 at row g; c2,c3 at row g + 8
                unsigned gm = m0 + wm * 64 + i * 16 + g + h * 8;
                unsigned gn = n0 + wn * 32 + j * 8 + tg * 2;
                if (gm >= M) continue;
                OutT* row = C + (unsigned long long)gm * N;
                if (gn < N) store_out(row + gn, acc[i][j][2 * h]);
                if (gn + 1 < N) store_out(row + gn + 1, acc[i][j][2 * h + 1]);
            }
}

// bfloat16 at the tensor cores' pace: the same mma.sync.m16n8k16, fed by cp.async copies into
// a STAGES-deep ring of shared-memory tiles (the copies of the next tiles run while this one
// multiplies) and by ldmatrix (four 8x8 fragments a warp instruction; .trans gives B's column
// fragments from its row-major tile). Rows are padded by 16 bytes, which keeps every ldmatrix
// row 16-byte aligned and its eight rows on distinct banks. Needs K % 8 == 0, N % 8 == 0 and
// 16-byte aligned A and B (every 16-byte chunk then lies wholly inside or outside the matrix;
// outside chunks are zero-filled by cp.async's source size of 0); matmul() checks that and
// takes matmul_bf16 otherwise.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

template <typename OutT, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int BK>
__global__ void __launch_bounds__(32 * WARPS_M * WARPS_N)
matmul_bf16_pipelined(OutT* __restrict__ C, const __nv_bfloat16* __restrict__ A,
                      const __nv_bfloat16* __restrict__ B, unsigned M, unsigned N, unsigned K) {
    constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    constexpr int AS = BK + 8, BS = BN + 8;  // padded row strides, in elements
    constexpr int A_STAGE = BM * AS, B_STAGE = BK * BS;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N, MI = WTM / 16, NI = WTN / 8;
    static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles are whole 16x16 fragments");
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(smem);
    __nv_bfloat16* Bs = As + STAGES * A_STAGE;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned wm = warp / WARPS_N, wn = warp % WARPS_N;
    // Blocks run in groups of 8 block-rows, column by column, so the A rows and B columns
    // that neighbouring blocks share are read while they are still in L2.
    const unsigned pid = blockIdx.y * gridDim.x + blockIdx.x, per_group = 8 * gridDim.x;
    const unsigned first = pid / per_group * 8, rows_in_group = min(gridDim.y - first, 8u);
    const unsigned m0 = (first + pid % per_group % rows_in_group) * BM;
    const unsigned n0 = pid % per_group / rows_in_group * BN;
    const unsigned tiles = (K + BK - 1) / BK;
    float acc[MI][NI][4] = {};

    auto load = [&](int slot, unsigned tile) {
        const unsigned k0 = tile * BK;
        __nv_bfloat16* as = As + slot * A_STAGE;
        __nv_bfloat16* bs = Bs + slot * B_STAGE;
#pragma unroll
        for (int e = threadIdx.x; e < BM * BK / 8; e += THREADS) {
            const unsigned r = e / (BK / 8), c = (e % (BK / 8)) * 8, gm = m0 + r, gk = k0 + c;
            const bool inside = gm < M && gk < K;
            cp_async16(as + r * AS + c, inside ? A + (unsigned long long)gm * K + gk : A, inside);
        }
#pragma unroll
        for (int e = threadIdx.x; e < BK * BN / 8; e += THREADS) {
            const unsigned r = e / (BN / 8), c = (e % (BN / 8)) * 8, gk = k0 + r, gn = n0 + c;
            const bool inside = gk < K && gn < N;
            cp_async16(bs + r * BS + c, inside ? B + (unsigned long long)gk * N + gn : B, inside);
        }
    };

    // One commit group a tile, empty past the last, so wait_group counts tiles exactly.
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
        if (t < tiles) load(t, t);
        asm volatile("cp.async.commit_group;\n");
    }
    for (unsigned t = 0; t < tiles; ++t) {
        asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 2));
        __syncthreads();  // tile t landed for every thread; slot (t - 1) % STAGES is free
        if (t + STAGES - 1 < tiles) load((t + STAGES - 1) % STAGES, t + STAGES - 1);
        asm volatile("cp.async.commit_group;\n");
        const __nv_bfloat16* as = As + (t % STAGES) * A_STAGE;
        const __nv_bfloat16* bs = Bs + (t % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned a[MI][4], b[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i)  // lanes 0-15 address rows 0-15 at k, 16-31 at k + 8
                ldmatrix_x4(a[i], as + (wm * WTM + i * 16 + (lane & 15)) * AS + kk +
                                      (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < NI; j += 2) {  // k rows 0-15, n columns j*8 and j*8 + 8
                unsigned r[4];
                ldmatrix_x4_trans(r, bs + (kk + (lane & 15)) * BS + wn * WTN + j * 8 +
                                         (lane >> 4) * 8);
                b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma_bf16_16816(acc[i][j], a[i], b[j]);
        }
    }
    asm volatile("cp.async.wait_all;\n");
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // c0,c1 at row g; c2,c3 at row g + 8
                const unsigned gm = m0 + wm * WTM + i * 16 + lane / 4 + h * 8;
                const unsigned gn = n0 + wn * WTN + j * 8 + (lane % 4) * 2;
                if (gm < M && gn < N)  // N % 8 == 0: gn < N implies gn + 1 < N
                    store_out2(C + (unsigned long long)gm * N + gn, acc[i][j][2 * h],
                               acc[i][j][2 * h + 1]);
            }
}
