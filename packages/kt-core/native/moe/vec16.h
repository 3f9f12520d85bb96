// What kt-core's training loops (grouped_lora.cpp, training_rows.cpp) share: vectors of 16 floats
// (GCC's vector extension: one AVX-512 register inside an AVX-512 target function, two AVX2 ones
// inside an AVX2 function, four SSE registers in the baseline build), and the choice of the widest
// per-ISA instantiation this host (and KT_MAX_ISA) allows. kt-core is compiled for the baseline
// ISA; each loop body is always inlined into target-attributed wrappers and picked after host
// detection, as probes/compute_peak.cpp does, so no wider instruction runs on a host without it.
#pragma once
#include "abi/host_api.h"

#include <cstdint>
#include <cstring>

namespace kt::vec16 {

typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kV = 16;

// Always inlined, like the bodies: a vector passed or returned by value between a function compiled
// for the baseline and one compiled for AVX-512 would cross two calling conventions.
[[gnu::always_inline]] inline V16 load(const float* p) {
    V16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
[[gnu::always_inline]] inline void store(float* p, V16 v) { std::memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline V16 splat(float f) { return V16{} + f; }
[[gnu::always_inline]] inline float sum(V16 v) {
    float s = 0.0f;
    for (int l = 0; l < kV; ++l) s += v[l];
    return s;
}

// The widest of a loop's three instantiations this host allows.
template <class Fn>
Fn widest(Fn avx512, Fn avx2, Fn baseline) {
#if defined(__x86_64__)
    if (host_has_feature("avx512f") && host_has_feature("avx512vl")) return avx512;
    if (host_has_feature("avx2") && host_has_feature("fma")) return avx2;
#endif
    (void)avx512;
    (void)avx2;
    return baseline;
}

}  // namespace kt::vec16
