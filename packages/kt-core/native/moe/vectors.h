// What kt-core's training loops (grouped_lora.cpp, training_rows.cpp) share: GCC vectors one
// register wide for each ISA level the loops are compiled for — 16 floats inside AVX-512 target
// functions, 8 inside AVX2 ones, 4 in the baseline build (SSE2, NEON) — and the choice of the widest
// instantiation this host (and KT_MAX_ISA) allows. kt-core is compiled for the baseline ISA; each
// loop body is a template on its vectors, always inlined into target-attributed wrappers and picked
// after host detection, as probes/compute_peak.cpp does, so no wider instruction runs on a host
// without it. (One 16-float type for every level made GCC copy each temporary through the stack
// with `rep movs` wherever the registers are narrower: the LoRA products 10x, the gated rows 4x
// slower under AVX2 than under AVX-512.)
#pragma once
#include "abi/host_api.h"

#include <cstdint>
#include <cstring>

namespace kt::vectors {

typedef float F16 __attribute__((vector_size(64)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef int32_t I4 __attribute__((vector_size(16)));

// One ISA level's float vector V and int32 vector VI, and what the loops do with them. Loads and
// stores go through memcpy (any alignment). Always inlined, like the bodies: a vector passed or
// returned by value between functions compiled for different levels would cross two calling
// conventions.
template <class F, class I>
struct Vec {
    using V = F;
    using VI = I;
    static constexpr int64_t kLanes = sizeof(V) / 4;
    [[gnu::always_inline]] static V load(const float* p) {
        V v;
        std::memcpy(&v, p, sizeof v);
        return v;
    }
    [[gnu::always_inline]] static void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
    // An add and a broadcast. (Spellings that should be one broadcast — a shuffle of lane 0,
    // V{f, f, ...} — made GCC emit a masked broadcast per lane in some instantiations: slower.)
    [[gnu::always_inline]] static V splat(float f) { return V{} + f; }
    [[gnu::always_inline]] static float sum(V v) {
        float s = 0.0f;
        for (int l = 0; l < kLanes; ++l) s += v[l];
        return s;
    }
};
using Avx512Vec = Vec<F16, I16>;
using Avx2Vec = Vec<F8, I8>;
using BaselineVec = Vec<F4, I4>;

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

}  // namespace kt::vectors
