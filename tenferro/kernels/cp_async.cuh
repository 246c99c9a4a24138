// Asynchronous global-to-shared copies (sm_80+), shared by the matrix multiplies and the scan.
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
