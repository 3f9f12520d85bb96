// The vector vocabulary the kernels are written in. This header is compiled once per
// target (x86-64-v3 = AVX2, x86-64-v4 = AVX-512, ...): the same kernel text becomes 8- or
// 16-lane code. Panels are always 16 output channels wide, so a panel is one AVX-512
// register or two AVX2 registers (kVecsPerPanel).
#pragma once
#include <cmath>
#include <immintrin.h>
#include <kt/formats/packed_layouts.h>

#include <cstdint>
#include <cstring>

namespace KT_TARGET_NAMESPACE {

using kt::layouts::kPanel;   // output channels per packed panel, for every layout and target

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using VF = __m512;
using VI = __m512i;
inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset1(float v) { return _mm512_set1_ps(v); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm512_sub_ps(a, b); }
inline VF vdiv(VF a, VF b) { return _mm512_div_ps(a, b); }
// min/max return their second operand when either is NaN: pass the data second so NaN survives.
inline VF vmin(VF bound, VF x) { return _mm512_min_ps(bound, x); }
inline VF vmax(VF bound, VF x) { return _mm512_max_ps(bound, x); }
inline VI vloadi(const void* p) { return _mm512_loadu_si512(p); }
// bf16 pairs packed in 32-bit lanes -> the f32 values of the even and odd element (exact).
inline VF bf16_even(VI w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
inline VF bf16_odd(VI w) { return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u)))); }
// kLanes consecutive bf16 -> f32 (exact).
inline VF vload_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// kLanes E4M3 bytes -> f32 equal to value / 256, exact: E4M3 (bias 7) placed in an IEEE half's
// bit positions reads as value / 256 (bias 15, subnormals included), widened by F16C.
inline VF vcvt_e4m3_over_256(__m128i bytes) {
    const __m256i b = _mm256_cvtepu8_epi16(bytes);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
}
inline VF vload_e4m3_over_256(const uint8_t* p) { return vcvt_e4m3_over_256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// kLanes E8M0 bytes e -> 2^(e - 128) (kt::layouts::e8m0_half), exact: e << 23 is 2^(e - 127)'s bits
// for e >= 1, 2^-127's (0x400000, subnormal) is the max for e = 0, and the halving is exact.
inline VF vload_e8m0_half(const uint8_t* p) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i bits = _mm512_max_epi32(_mm512_slli_epi32(e, 23), _mm512_set1_epi32(0x400000));
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0.5f));
}
inline VF vroundint(VF x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VF vpow2i(VF n) {   // 2^n for integral n in [-126, 127]
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#else
constexpr int kLanes = 8;
using VF = __m256;
using VI = __m256i;
inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset1(float v) { return _mm256_set1_ps(v); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm256_sub_ps(a, b); }
inline VF vdiv(VF a, VF b) { return _mm256_div_ps(a, b); }
inline VF vmin(VF bound, VF x) { return _mm256_min_ps(bound, x); }
inline VF vmax(VF bound, VF x) { return _mm256_max_ps(bound, x); }
inline VI vloadi(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VF bf16_even(VI w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
inline VF bf16_odd(VI w) { return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u)))); }
inline VF vload_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline VF vload_e4m3_over_256(const uint8_t* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}
inline VF vload_e8m0_half(const uint8_t* p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i bits = _mm256_max_epi32(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x400000));
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5f));
}
inline VF vroundint(VF x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline VF vpow2i(VF n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#endif

constexpr int kVecsPerPanel = kPanel / kLanes;

// e^x to ~2 ulp: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], degree-6 polynomial.
// Clamped to the f32 range so SiLU's limits come out right; NaN passes through.
inline VF vexp(VF x) {
    x = vmax(vset1(-87.3f), vmin(vset1(88.3f), x));
    const VF n = vroundint(vmul(x, vset1(1.44269504088896341f)));
    VF r = vfma(n, vset1(-0.693359375f), x);
    r = vfma(n, vset1(2.12194440e-4f), r);
    VF p = vset1(1.0f / 720);
    p = vfma(p, r, vset1(1.0f / 120));
    p = vfma(p, r, vset1(1.0f / 24));
    p = vfma(p, r, vset1(1.0f / 6));
    p = vfma(p, r, vset1(0.5f));
    p = vfma(p, r, vset1(1.0f));
    p = vfma(p, r, vset1(1.0f));
    return vmul(p, vpow2i(n));
}

// SiLU(g) * u = g * u / (1 + e^-g), the activation of every gate/up expert MLP.
inline VF silu_mul(VF g, VF u) {
    return vdiv(vmul(g, u), vadd(vset1(1.0f), vexp(vsub(vzero(), g))));
}

// Store the first `n` (<= kLanes) lanes of v.
inline void vstore_partial(float* p, VF v, int n) {
    if (n == kLanes) {
        vstore(p, v);
    } else {
        alignas(64) float tmp[kLanes];
        vstore(tmp, v);
        std::memcpy(p, tmp, sizeof(float) * size_t(n));
    }
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

// kLanes integral floats in [-127, 127] -> int8 (activation quantizers of every integer method).
inline void store_i8(int8_t* dst, VF q) {
#if defined(__AVX512F__)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
#else
    const __m256i i = _mm256_cvtps_epi32(q);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), _mm_packs_epi16(w, w));
#endif
}

// max |x[i]| over n floats, NaNs skipped (and reported: `nan` is set, never cleared) — the scale of
// every int8 activation quantizer. A vector at a time: the scalar loop is one vmaxss dependency
// chain, ~4 cycles per element, and was half of quantize_int8_rows' time (perf, AMX INT8 prefill).
// max(|x|, acc) keeps acc where |x| is NaN, as the scalar `a > amax ? a : amax` does.
inline float row_amax(const float* x, int64_t n, bool& nan) {
    int64_t i = 0;
    float amax = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    __mmask16 unordered = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        acc = _mm512_max_ps(_mm512_abs_ps(v), acc);
    }
    amax = _mm512_reduce_max_ps(acc);
    nan |= unordered != 0;
#else
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 acc = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        acc = _mm256_max_ps(_mm256_andnot_ps(sign, v), acc);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (const float a : lanes) amax = a > amax ? a : amax;
    nan |= _mm256_movemask_ps(unordered) != 0;
#endif
    for (; i < n; ++i) {
        const float a = std::fabs(x[i]);
        amax = a > amax ? a : amax;
        nan |= x[i] != x[i];
    }
    return amax;
}

}  // namespace KT_TARGET_NAMESPACE
