// Asynchronous global-to-shared copies (sm_80+), shared by the matrix multiplies and the scan,
// and the scan's L2 prefetch (sm_90+).
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes from src to dst without passing through registers; inside == false writes zeros
// (a source size of 0), so a tile's chunks outside the matrix need no second path.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool inside) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(inside ? 16 : 0));
}
// One element of T (4, 8 or 16 bytes) from src to dst, zeros where inside == false; through
// L1 (.ca), the only cache the sizes under 16 bytes may take.
template <typename T>
__device__ __forceinline__ void cp_async_element(T* dst, const T* src, bool inside) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "n"(sizeof(T)),
                    "r"(inside ? (unsigned)sizeof(T) : 0u));
}
#if __CUDA_ARCH__ >= 900
// Asks L2 to fetch `bytes` (a multiple of 16) from src on, in one bulk prefetch (a hint: nothing
// waits on it). src is rounded down to 16 bytes, so [src - 15, src + bytes) must be readable.
__device__ __forceinline__ void prefetch_l2(const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n"
                 :: "l"(reinterpret_cast<unsigned long long>(src) & ~15ull), "r"(bytes)
                 : "memory");
}
#endif
