// What the SVE targets' kernels share. SVE's vector length is the CPU's (128 to 2048 bits, read at
// run time), the panels are x86's: a 64-byte chunk (16 channels x 4 int8 k, 2 bf16 k, ...) is 2
// vectors of 32 bytes (256 to 511-bit SVE: Graviton 3) or one of 64 (512 and wider: A64FX) — N
// "parts", part s holding channels s * 16/N onwards. Each kernel is a template on N, chosen once per
// tile (with_parts). Where SVE is 128 bits wide (Grace, Graviton 4) a chunk would be four vectors, and
// the NEON kernels the same target also holds take fewer instructions for every method
// (docs/backends.md): with_parts declines and they run. Vectors past 512 bits run one chunk per
// predicated vector (lanes beyond it idle): filling them would take activations per 512-bit
// segment, for hardware nobody ships.
//
// SVE values cannot live in arrays or structs, so a kernel keeps its accumulators per part in named
// locals and reaches part s's with pick<s>, inside for_parts<N> (a fold over s < N: the compiler
// sees constants, the unused local vanishes).
#pragma once
#if defined(__ARM_FEATURE_SVE)
#include <arm_sve.h>

#include <cstdint>
#include <cstring>
#include <utility>

// SVE's bfdot / bfmmla: GCC 12 provides them with +sve+bf16 but defines only the base BF16 macro.
#if defined(__ARM_FEATURE_SVE_BF16) || defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define KT_SVE_BF16 1
#endif

namespace KT_TARGET_NAMESPACE::sve {

// Vectors per 64-byte chunk on this CPU: 1 (512-bit SVE and wider), 2 (256 to 511), 0 (128: NEON's turn).
inline int parts() {
    const uint64_t bytes = svcntb();
    return bytes >= 64 ? 1 : bytes >= 32 ? 2 : 0;
}
template <int N> constexpr int kBytes = 64 / N;   // a part's bytes of a chunk
template <int N> constexpr int kLanes = 16 / N;   // a part's channels
template <int N> inline svbool_t bytes() { return svptrue_pat_b8(N == 1 ? SV_VL64 : SV_VL32); }
template <int N> inline svbool_t words() { return svptrue_pat_b32(N == 1 ? SV_VL16 : SV_VL8); }

// f.template operator()<N>() for this CPU's N; false (nothing called) where SVE is 128 bits wide.
template <class F> inline bool with_parts(F&& f) {
    switch (parts()) {
    case 1: f.template operator()<1>(); return true;
    case 2: f.template operator()<2>(); return true;
    default: return false;
    }
}

// f(std::integral_constant<int, s>) for s = 0 .. N-1.
template <int N, class F> inline void for_parts(F&& f) {
    [&]<int... s>(std::integer_sequence<int, s...>) { (f(std::integral_constant<int, s>{}), ...); }(
        std::make_integer_sequence<int, N>{});
}

// Part s's accumulator of two named ones.
template <int s, class T> inline T& pick(T& a0, T& a1) {
    if constexpr (s == 0) return a0;
    else return a1;
}

// acc += each 32-bit lane of w dotted with the `lane`-th four bytes of x's 128-bit segment (`sdot`'s
// indexed form); `lane` is a constant wherever the loops are unrolled, and the switch folds there.
inline svint32_t dot_lane(svint32_t acc, svint8_t w, svint8_t x, int lane) {
    switch (lane) {
    case 0: return svdot_lane(acc, w, x, 0);
    case 1: return svdot_lane(acc, w, x, 1);
    case 2: return svdot_lane(acc, w, x, 2);
    default: return svdot_lane(acc, w, x, 3);
    }
}

// Two rows' 8 bytes side by side in every 128-bit segment: `smmla` / `bfmmla`'s 2-row operand.
inline svuint64_t rows2(const void* r0, const void* r1) {
    uint64_t a, b;
    std::memcpy(&a, r0, 8);
    std::memcpy(&b, r1, 8);
    return svdupq_n_u64(a, b);
}

// The matrix instructions' operands and results. Zipping the 32-bit lanes of a part of chunk j (4 k
// of its channels per lane) with the same part of the next 4 k gives, in every 128-bit segment, two
// channels x 8 k — the 2-channel operand; the 2 x 2 tiles of the zip1 and zip2 products, taken as
// 64-bit halves (a row's two channels each), un-zip into row 0's and row 1's channels in order.
template <class V> inline V pair_lo(V a, V b) { return svzip1(a, b); }
template <class V> inline V pair_hi(V a, V b) { return svzip2(a, b); }
inline svint32_t row0(svint32_t t_lo, svint32_t t_hi) {
    return svreinterpret_s32(svuzp1(svreinterpret_s64(t_lo), svreinterpret_s64(t_hi)));
}
inline svint32_t row1(svint32_t t_lo, svint32_t t_hi) {
    return svreinterpret_s32(svuzp2(svreinterpret_s64(t_lo), svreinterpret_s64(t_hi)));
}
inline svfloat32_t row0(svfloat32_t t_lo, svfloat32_t t_hi) {
    return svreinterpret_f32(svuzp1(svreinterpret_u64(t_lo), svreinterpret_u64(t_hi)));
}
inline svfloat32_t row1(svfloat32_t t_lo, svfloat32_t t_hi) {
    return svreinterpret_f32(svuzp2(svreinterpret_u64(t_lo), svreinterpret_u64(t_hi)));
}

}  // namespace KT_TARGET_NAMESPACE::sve
#endif
