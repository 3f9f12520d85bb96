// FP8 (E4M3 bytes) as checkpoints ship them: DeepSeek-V3's 128 x 128 block scales (FP8), one
// scale per output channel (FP8_PERCHANNEL) or an E8M0 exponent per 32 k of each channel (MXFP8),
// in "kt-fp8-p16-v1" / "kt-mxfp8-p16-v1" (kt/formats/packed_layouts.h): per panel one f32[16]
// scale vector per k block (2^8 folded in), then K rows of 16 codes — one NEON register per k.
// The checks and the packer are kt-core's (kt/formats/checkpoint_inputs.h), as kt-backend-avx's.
//
// Decode is exact and branch-free: a code byte shifted into the high half of a 16-bit lane, an
// arithmetic shift right by one and a mask put E4M3's sign, 4-bit exponent and 3-bit mantissa
// where binary16 keeps them, which reads as value / 256 (exponent bias 15 against 7), subnormals
// included; `fcvtl` widens halves to f32 exactly (ARMv8.0). Activations stay exact f32: the only
// rounding is the f32 arithmetic, as on x86 without AVX512_BF16.
#include <kt/formats/checkpoint_inputs.h>

#include "common.h"

namespace KT_TARGET_NAMESPACE {
namespace {

using Scales = kt::inputs::Fp8Scales;
template <Scales kScales>
constexpr L::fp8::Geometry kGeo = kt::inputs::fp8_geometry(kScales, 1);   // v1: rows of 16 codes

template <Scales kScales>
size_t packed_bytes(const kt_moe_config* c) { return kGeo<kScales>.expert(c->hidden, c->intermediate).bytes(); }

template <Scales kScales>
kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const std::string err = kt::inputs::check_fp8_expert(c, src, kScales);
    if (!err.empty()) return fail(KT_ERROR_INVALID_ARGUMENT, "%s", err.c_str());
    kt::inputs::pack_fp8_expert(c, src, kScales, kGeo<kScales>, dst);
    return KT_OK;
}

// Eight codes -> their values / 256 as binary16 bits (see the top of the file).
inline float16x8_t e4m3_over_256(uint16x8_t shifted) {   // shifted: each code << 8
    const int16x8_t keep = vdupq_n_s16(int16_t(0xBFFF));   // clears the sign's copy in bit 14
    return vreinterpretq_f16_s16(vandq_s16(vshrq_n_s16(vreinterpretq_s16_u16(shifted), 1), keep));
}

// The 16 codes of one k row as f32 (exact), channels 4v..4v+3 in w[v].
inline void decode_row(const uint8_t* codes, float32x4_t w[4]) {
    const uint8x16_t c = vld1q_u8(codes);
    const float16x8_t lo = e4m3_over_256(vshll_n_u8(vget_low_u8(c), 8)), hi = e4m3_over_256(vshll_high_n_u8(c, 8));
    w[0] = vcvt_f32_f16(vget_low_f16(lo));
    w[1] = vcvt_high_f32_f16(lo);
    w[2] = vcvt_f32_f16(vget_low_f16(hi));
    w[3] = vcvt_high_f32_f16(hi);
}

// part[0..3] (16 channels) += x * the decoded row w.
inline void fma_row(float32x4_t part[4], const float32x4_t w[4], float x) {
    const float32x4_t xv = vdupq_n_f32(x);
    for (int v = 0; v < 4; ++v) part[v] = vfmaq_f32(part[v], w[v], xv);
}

// One panel's 16 outputs for one f32 activation row: per k block, the codes' dot (even and odd k
// in accumulators of their own, so consecutive FMAs do not wait on each other), then times the
// block's scale vector.
template <Scales kScales>
void panel_out(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    constexpr L::fp8::Geometry G = kGeo<kScales>;
    const auto* x = reinterpret_cast<const float*>(row);
    const uint8_t* codes = panel + G.codes_at(K);
    float32x4_t acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = vdupq_n_f32(0.0f);
    for (int64_t kb = 0; kb < G.kblocks(K); ++kb) {
        float32x4_t even[4], odd[4];
        for (int v = 0; v < 4; ++v) even[v] = odd[v] = vdupq_n_f32(0.0f);
        const int64_t k1 = std::min(K, (kb + 1) * G.block);
        int64_t k = kb * G.block;
        float32x4_t w[4];
        for (; k + 1 < k1; k += 2) {
            decode_row(codes + size_t(k) * kPanel, w);
            fma_row(even, w, x[k]);
            decode_row(codes + size_t(k + 1) * kPanel, w);
            fma_row(odd, w, x[k + 1]);
        }
        if (k < k1) {
            decode_row(codes + size_t(k) * kPanel, w);
            fma_row(even, w, x[k]);
        }
        const auto* s = reinterpret_cast<const float*>(panel + size_t(kb) * L::fp8::kScaleBytes);
        for (int v = 0; v < 4; ++v) acc[v] = vfmaq_f32(acc[v], vld1q_f32(s + 4 * v), vaddq_f32(even[v], odd[v]));
    }
    for (int v = 0; v < 4; ++v) vst1q_f32(out + 4 * v, acc[v]);
}

// Two activation rows (prefill): each k row's codes decoded once for both, each row's sums in the
// same order as panel_out's — bit-identical outputs, half the decoding per row.
template <Scales kScales>
void panel_out_pair(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    constexpr L::fp8::Geometry G = kGeo<kScales>;
    const float* x[2] = {reinterpret_cast<const float*>(row0), reinterpret_cast<const float*>(row1)};
    const uint8_t* codes = panel + G.codes_at(K);
    float32x4_t acc[2][4];
    for (int v = 0; v < 4; ++v) acc[0][v] = acc[1][v] = vdupq_n_f32(0.0f);
    for (int64_t kb = 0; kb < G.kblocks(K); ++kb) {
        float32x4_t even[2][4], odd[2][4];
        for (int v = 0; v < 4; ++v) even[0][v] = even[1][v] = odd[0][v] = odd[1][v] = vdupq_n_f32(0.0f);
        const int64_t k1 = std::min(K, (kb + 1) * G.block);
        int64_t k = kb * G.block;
        float32x4_t w[4];
        for (; k + 1 < k1; k += 2) {
            decode_row(codes + size_t(k) * kPanel, w);
            for (int r = 0; r < 2; ++r) fma_row(even[r], w, x[r][k]);
            decode_row(codes + size_t(k + 1) * kPanel, w);
            for (int r = 0; r < 2; ++r) fma_row(odd[r], w, x[r][k + 1]);
        }
        if (k < k1) {
            decode_row(codes + size_t(k) * kPanel, w);
            for (int r = 0; r < 2; ++r) fma_row(even[r], w, x[r][k]);
        }
        const auto* s = reinterpret_cast<const float*>(panel + size_t(kb) * L::fp8::kScaleBytes);
        for (int r = 0; r < 2; ++r)
            for (int v = 0; v < 4; ++v) acc[r][v] = vfmaq_f32(acc[r][v], vld1q_f32(s + 4 * v), vaddq_f32(even[r][v], odd[r][v]));
    }
    for (int r = 0; r < 2; ++r)
        for (int v = 0; v < 4; ++v) vst1q_f32(out[r] + 4 * v, acc[r][v]);
}

template <Scales kScales>
kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    gate_up_panels(c, kGeo<kScales>.expert(c->hidden, c->intermediate), packed, act, f32_row_bytes(c->hidden), rows, n0, n1,
                   out, ldo, panel_out<kScales>, panel_out_pair<kScales>);
    return KT_OK;
}

template <Scales kScales>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    down_panels(c, kGeo<kScales>.expert(c->hidden, c->intermediate), packed, act, f32_row_bytes(c->intermediate), rows, n0,
                n1, out, ldo, panel_out<kScales>, panel_out_pair<kScales>);
    return KT_OK;
}

template <Scales kScales>
kt_method_kernels table(const char* layout_id, const char* kernel_id) {
    return method_table(kt::inputs::fp8_method_name(kScales), layout_id, kernel_id, packed_bytes<kScales>, pack<kScales>,
                        f32_row_bytes, quantize_f32_rows, gate_up<kScales>, down<kScales>);
}

}  // namespace

kt_method_kernels fp8_kernels(const char* kernel_id) { return table<Scales::kBlock128>(L::fp8::kIdRows, kernel_id); }
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id) {
    return table<Scales::kPerChannel>(L::fp8::kIdRows, kernel_id);
}
kt_method_kernels mxfp8_kernels(const char* kernel_id) { return table<Scales::kMx>(L::mxfp8::kIdRows, kernel_id); }

}  // namespace KT_TARGET_NAMESPACE
