// The matrix multiplies' outputs: f32 accumulators stored as float or as bfloat16 (rounded to
// nearest even), one element or two neighbours (p aligned to two elements) at a time.
#pragma once
#include <cuda_bf16.h>

__device__ __forceinline__ void store_out(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float x) {
    *p = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void store_out2(float* p, float x, float y) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void store_out2(__nv_bfloat16* p, float x, float y) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
