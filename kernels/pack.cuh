// Vector accesses shared by the kernels' sources (_build.py inlines this file where a source
// says #include "pack.cuh"): W elements of T moved by one access of W * sizeof(T) bytes (two
// where that is 32 bytes), which is what keeps enough bytes in flight to reach the bandwidth.
#pragma once

template <typename T, int W> struct alignas(W * sizeof(T)) Pack { T v[W]; };

// Whether p may be read or written as Pack<T, W>.
template <typename T, int W> __device__ __forceinline__ bool packs(const T* p) {
    return reinterpret_cast<unsigned long long>(p) % sizeof(Pack<T, W>) == 0;
}
