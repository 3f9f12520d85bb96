// The integer methods' activations (INT8, INT4): each row quantized in two int8 passes,
// x ~ s (q_hi + q_lo / 128), so dot products with integer codes are exact and the second pass
// brings the error to ~1e-3 of the output (one pass costs up to ~15 %, as on x86). A row is
// {f32 s; 12 bytes padding} then q_hi and q_lo, each K rounded up to 16 and zero-padded (a chunk's
// four k never read past the row), then each plane's int16 sums per 32 k (INT4's groups of 32, 64
// or 128 add two to four of them for their zero-point term instead of re-adding g activations per
// panel). And the four-product dot both kernels are made of.
#pragma once
#include "common.h"

namespace KT_TARGET_NAMESPACE {

inline int64_t act_padded(int64_t k) { return (k + 15) / 16 * 16; }
inline int64_t act_sums(int64_t k) { return (act_padded(k) + 31) / 32; }   // sums per plane
inline size_t act_row_bytes(int64_t k) { return 16 + 2 * size_t(act_padded(k)) + 4 * size_t(act_sums(k)); }
inline const int8_t* act_hi(const uint8_t* row) { return reinterpret_cast<const int8_t*>(row + 16); }
inline const int8_t* act_lo(const uint8_t* row, int64_t k) { return act_hi(row) + act_padded(k); }
// The sums of q_hi (q_lo) over k = 32i..32i+31, at [i] (|sum| <= 32 * 127).
inline const int16_t* act_sums_hi(const uint8_t* row, int64_t k) {
    return reinterpret_cast<const int16_t*>(row + 16 + 2 * size_t(act_padded(k)));
}
inline const int16_t* act_sums_lo(const uint8_t* row, int64_t k) { return act_sums_hi(row, k) + act_sums(k); }
inline float act_scale(const uint8_t* row) {
    float s;
    std::memcpy(&s, row, 4);
    return s;
}

// kt_method_kernels.quantize_activations of the integer methods (int8.cpp).
kt_status quantize_int8_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out);

// acc (channels 4v..4v+3) += the four-product dot of each 32-bit lane of w with x's.
inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, w, x);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));   // lanes 0, 1: two pair sums each
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, x));                         // lanes 2, 3
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}

// acc += the four-product dot of each 32-bit lane of w with lane `lane` (0-3) of x: with `sdot`'s
// indexed form the activations are read where they were loaded, 16 k per register, instead of one
// broadcast register per four k. `lane` is a constant wherever the loops are unrolled; the switch
// folds away there.
inline int32x4_t dot4_lane(int32x4_t acc, int8x16_t w, int8x16_t x, int lane) {
#if defined(__ARM_FEATURE_DOTPROD)
    switch (lane) {
    case 0: return vdotq_laneq_s32(acc, w, x, 0);
    case 1: return vdotq_laneq_s32(acc, w, x, 1);
    case 2: return vdotq_laneq_s32(acc, w, x, 2);
    default: return vdotq_laneq_s32(acc, w, x, 3);
    }
#else
    const int32x4_t xs = vreinterpretq_s32_s8(x);
    switch (lane) {
    case 0: return dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(xs, 0)));
    case 1: return dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(xs, 1)));
    case 2: return dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(xs, 2)));
    default: return dot4(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(xs, 3)));
    }
#endif
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// ARMv8.6 I8MM: `smmla` multiplies a 2 x 8 int8 matrix by the transpose of another, into a 2 x 2
// int32 tile — two activation rows against two channels, 8 k at once (32 products per instruction,
// `sdot` 16). The panels' chunks hold 4 k of 4 channels per vector; a 32-bit zip of the vectors of
// k 0-3 and k 4-7 is exactly its 2-channel operand, so the layouts stay x86's.
constexpr bool kMmla = true;
// Rows 0 and 1's 8 activations from these pointers: smmla's 2 x 8 activation operand.
inline int8x16_t rows2x8(const int8_t* r0, const int8_t* r1) { return vcombine_s8(vld1_s8(r0), vld1_s8(r1)); }
// Channels 4v, 4v+1 (pair 0) or 4v+2, 4v+3 (pair 1) of a (their k 0-3) and b (k 4-7), 8 k each.
inline int8x16_t channel_pair0(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}
inline int8x16_t channel_pair1(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b)));
}
// tile (lanes: row 0 x channel 0, row 0 x channel 1, row 1 x channel 0, row 1 x channel 1) += x . w^T.
inline int32x4_t mmla(int32x4_t tile, int8x16_t x, int8x16_t w) { return vmmlaq_s32(tile, x, w); }
// A panel's 8 tiles (channel pairs 2v, 2v + 1 of group v) split into each row's channel groups:
// row0[v], row1[v] hold channels 4v..4v+3.
inline void untile(const int32x4_t* t, int32x4_t* row0, int32x4_t* row1) {
    for (int v = 0; v < 4; ++v) {
        const int64x2_t p0 = vreinterpretq_s64_s32(t[2 * v]), p1 = vreinterpretq_s64_s32(t[2 * v + 1]);
        row0[v] = vreinterpretq_s32_s64(vzip1q_s64(p0, p1));
        row1[v] = vreinterpretq_s32_s64(vzip2q_s64(p0, p1));
    }
}
#else
constexpr bool kMmla = false;
#endif

#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
// SVE's `smmla` for both activation passes of one part (sve.h): a (4 k of its channels) and b (the
// next 4 k) zipped into channel pairs against two rows' 8 k; ha / la take the zip1 pairs' tiles, hb /
// lb the zip2 pairs'.
inline void mmla_part(svint32_t a, svint32_t b, svint8_t xh, svint8_t xl, svint32_t& ha, svint32_t& hb, svint32_t& la,
                      svint32_t& lb) {
    const svint8_t w0 = svreinterpret_s8(sve::pair_lo(a, b)), w1 = svreinterpret_s8(sve::pair_hi(a, b));
    ha = svmmla(ha, xh, w0);
    hb = svmmla(hb, xh, w1);
    la = svmmla(la, xl, w0);
    lb = svmmla(lb, xl, w1);
}
#endif

}  // namespace KT_TARGET_NAMESPACE
