// Row softmax, tiled transpose and the pieces of an inclusive scan.
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

// y (cols x rows) = x (rows x cols)^T through a 32x33 shared tile (the pad avoids bank
// conflicts on the column reads); blocks of 32x8 threads, each thread moves 4 elements.
template <typename T>
__global__ void transpose(T* __restrict__ y, const T* __restrict__ x, unsigned rows,
                          unsigned cols) {
    __shared__ T tile[32][33];
    unsigned c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (unsigned j = threadIdx.y; j < 32; j += 8) {
        unsigned r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = x[(unsigned long long)r * cols + c];
    }
    __syncthreads();
    for (unsigned j = threadIdx.y; j < 32; j += 8) {
        unsigned c = c0 + j, r = r0 + threadIdx.x;  // y[c][r] = x[r][c]
        if (r < rows && c < cols) y[(unsigned long long)c * rows + r] = tile[threadIdx.x][j];
    }
}

// Inclusive scan of 1024-element chunks, one chunk a block of 1024 threads; the chunk totals
// go to sums[blockIdx.x] for the next level.
template <typename T>
__global__ void scan_chunks(T* __restrict__ y, const T* __restrict__ x, T* __restrict__ sums,
                            unsigned long long n) {
    __shared__ T warp_totals[32];
    unsigned long long i = blockIdx.x * 1024ull + threadIdx.x;
    T v = i < n ? x[i] : T(0);
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        T u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T t = warp_totals[lane];
        for (int o = 1; o < 32; o <<= 1) {
            T u = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += u;
        }
        warp_totals[lane] = t;
    }
    __syncthreads();
    if (warp > 0) v += warp_totals[warp - 1];
    if (i < n) y[i] = v;
    if (threadIdx.x == 1023 && sums) sums[blockIdx.x] = v;
}

// y[i] += offsets[chunk - 1] for every chunk but the first.
template <typename T>
__global__ void scan_add(T* __restrict__ y, const T* __restrict__ offsets, unsigned long long n) {
    unsigned long long i = (blockIdx.x + 1) * 1024ull + threadIdx.x;
    if (i < n) y[i] += offsets[blockIdx.x];
}
