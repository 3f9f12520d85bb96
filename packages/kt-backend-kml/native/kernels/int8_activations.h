// The integer methods' activations (INT8, INT4): each row quantized in two int8 passes,
// x ~ s (q_hi + q_lo / 128), so dot products with integer codes are exact and the second pass
// brings the error to ~1e-3 of the output (one pass costs up to ~15 %, as on x86). A row is
// {f32 s; 12 bytes padding} then q_hi and q_lo, each K rounded up to 16 and zero-padded (a chunk's
// four k never read past the row). And the four-product dot both kernels are made of.
#pragma once
#include "common.h"

namespace KT_TARGET_NAMESPACE {

inline int64_t act_padded(int64_t k) { return (k + 15) / 16 * 16; }
inline size_t act_row_bytes(int64_t k) { return 16 + 2 * size_t(act_padded(k)); }
inline const int8_t* act_hi(const uint8_t* row) { return reinterpret_cast<const int8_t*>(row + 16); }
inline const int8_t* act_lo(const uint8_t* row, int64_t k) { return act_hi(row) + act_padded(k); }
inline float act_scale(const uint8_t* row) {
    float s;
    std::memcpy(&s, row, 4);
    return s;
}

// kt_method_kernels.quantize_activations of the integer methods (int8.cpp).
kt_status quantize_int8_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out);

// Four consecutive int8 activations repeated in every 32-bit lane.
inline int8x16_t broadcast4(const int8_t* x) {
    int32_t v;
    std::memcpy(&v, x, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

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

}  // namespace KT_TARGET_NAMESPACE
