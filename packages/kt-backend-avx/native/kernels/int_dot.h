// Integer dot products over 4-byte lanes: acc[i] += sum_{b<4} u8[4i+b] * s8[4i+b].
// VNNI does it in one vpdpbusd; without VNNI, vpmaddubsw + vpmaddwd do it in two, exact as
// long as each pair sum fits int16 — the callers guarantee that (u8 operands <= 15 for INT4, <= 24 for MXFP4,
// |operands| <= 127 with the sign moved onto the weights for INT8).
#pragma once
#include "simd.h"

namespace KT_TARGET_NAMESPACE {

// 4 bytes of activation codes as one int32 (for a broadcast), whatever the alignment.
inline int32_t load_i32(const uint8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

#if defined(__AVX512F__)
inline VI vzeroi() { return _mm512_setzero_si512(); }
inline VI vset1i(int32_t v) { return _mm512_set1_epi32(v); }
inline VI vand(VI a, VI b) { return _mm512_and_si512(a, b); }
template <int N>
inline VI vsrl16(VI a) { return _mm512_srli_epi16(a, N); }
template <int N>
inline VI vslli16(VI a) { return _mm512_slli_epi16(a, N); }
template <int N>
inline VI vslli32(VI a) { return _mm512_slli_epi32(a, N); }
inline VF vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
inline VI vsubi(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI vaddi(VI a, VI b) { return _mm512_add_epi32(a, b); }
// Byte b of each 128-bit lane -> table[b & 15] (b < 16 here), the table repeated in every lane.
inline VI vlookup16(const uint8_t* table, VI b) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table))), b);
}
#if defined(__AVX512VNNI__)
// In-place accumulate through asm: with the intrinsic, GCC 12 copied each accumulator to a
// fresh register around every vpdpbusd and spilled the copies (the INT8 prefill microkernel
// ran at half the instruction's throughput); "+v" ties the accumulator to its register.
inline VI dot_u8s8(VI acc, VI u8, VI s8) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}
#else
inline VI dot_u8s8(VI acc, VI u8, VI s8) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u8, s8), _mm512_set1_epi16(1)));
}
#endif
// |a| as u8 and b with a's sign: a*b = |a| * (b * sign(a)), products fit int16 pairs.
// AVX-512BW has no vpsignb; b is negated where a < 0 and left alone where a == 0, where |a| = 0
// makes the product 0 anyway (vpsignb's zeroing cost three more mask ops per dot, and made
// x86-64-v4's INT8 prefill slower than x86-64-v3's).
inline VI abs_i8(VI a) { return _mm512_abs_epi8(a); }
inline VI sign_i8(VI b, VI a) { return _mm512_mask_sub_epi8(b, _mm512_movepi8_mask(a), _mm512_setzero_si512(), b); }
// vpmaddubsw's int16 pair sums, added up in int16 (the caller bounds how many), and their
// widening to int32 lanes: dot_u8s8 split in two, so a run of dots pays the widening once.
inline VI pairs_u8s8(VI acc16, VI u8, VI s8) { return _mm512_add_epi16(acc16, _mm512_maddubs_epi16(u8, s8)); }
inline VI widen_pairs(VI acc, VI acc16) { return _mm512_add_epi32(acc, _mm512_madd_epi16(acc16, _mm512_set1_epi16(1))); }
#else
inline VI vzeroi() { return _mm256_setzero_si256(); }
inline VI vset1i(int32_t v) { return _mm256_set1_epi32(v); }
inline VI vand(VI a, VI b) { return _mm256_and_si256(a, b); }
template <int N>
inline VI vsrl16(VI a) { return _mm256_srli_epi16(a, N); }
template <int N>
inline VI vslli16(VI a) { return _mm256_slli_epi16(a, N); }
template <int N>
inline VI vslli32(VI a) { return _mm256_slli_epi32(a, N); }
inline VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
inline VI vsubi(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI vaddi(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI vlookup16(const uint8_t* table, VI b) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table))), b);
}
inline VI dot_u8s8(VI acc, VI u8, VI s8) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), _mm256_set1_epi16(1)));
}
inline VI abs_i8(VI a) { return _mm256_abs_epi8(a); }
inline VI sign_i8(VI b, VI a) { return _mm256_sign_epi8(b, a); }
inline VI pairs_u8s8(VI acc16, VI u8, VI s8) { return _mm256_add_epi16(acc16, _mm256_maddubs_epi16(u8, s8)); }
inline VI widen_pairs(VI acc, VI acc16) { return _mm256_add_epi32(acc, _mm256_madd_epi16(acc16, _mm256_set1_epi16(1))); }
#endif

}  // namespace KT_TARGET_NAMESPACE
