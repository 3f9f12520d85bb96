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

#if defined(__ARM_FEATURE_SVE)
// SVE (sve.h): part s of a k row's 16 codes loaded sign-extended into 32-bit lanes; a shift left by
// 7 and the same mask put E4M3's fields where binary16 keeps them in each lane's low half (bit 15 the
// sign, 14 cleared), which `fcvt` widens exactly — the NEON decode's values, summed in its order
// (even and odd k, then the block scale): bit-identical.
template <int N>
inline svfloat32_t decode_part(const uint8_t* codes, int s) {
    const svbool_t pw = sve::words<N>();
    const svint32_t c = svld1sb_s32(pw, reinterpret_cast<const int8_t*>(codes) + s * sve::kLanes<N>);
    return svcvt_f32_f16_x(pw, svreinterpret_f16(svand_n_s32_x(pw, svlsl_n_s32_x(pw, c, 7), 0xBFFF)));
}

// One or two activation rows (R) of a panel: even and odd k of each row in their own accumulators per
// part, folded into the row's total with the block's scales.
template <Scales kScales, int N, int R>
void panel_rows_sve(const uint8_t* panel, const float* const* x, int64_t K, float* const* out) {
    constexpr L::fp8::Geometry G = kGeo<kScales>;
    const svbool_t pw = sve::words<N>();
    const uint8_t* codes = panel + G.codes_at(K);
    const svfloat32_t z = svdup_n_f32(0.0f);
    svfloat32_t t00 = z, t01 = z, t10 = z, t11 = z;   // totals: row, part
    for (int64_t kb = 0; kb < G.kblocks(K); ++kb) {
        svfloat32_t e00 = z, e01 = z, e10 = z, e11 = z;   // even k
        svfloat32_t o00 = z, o01 = z, o10 = z, o11 = z;   // odd k
        const auto row = [&](int64_t k, auto odd) {   // k row's codes, decoded part by part, into every row's sum
            sve::for_parts<N>([&](auto s) {
                const svfloat32_t w = decode_part<N>(codes + size_t(k) * kPanel, s);
                svfloat32_t& a0 = odd ? sve::pick<s>(o00, o01) : sve::pick<s>(e00, e01);
                a0 = svmla_n_f32_x(pw, a0, w, x[0][k]);
                if constexpr (R == 2) {
                    svfloat32_t& a1 = odd ? sve::pick<s>(o10, o11) : sve::pick<s>(e10, e11);
                    a1 = svmla_n_f32_x(pw, a1, w, x[1][k]);
                }
            });
        };
        const int64_t k1 = std::min(K, (kb + 1) * G.block);
        int64_t k = kb * G.block;
        for (; k + 1 < k1; k += 2) {
            row(k, std::false_type{});
            row(k + 1, std::true_type{});
        }
        if (k < k1) row(k, std::false_type{});
        const auto* sc = reinterpret_cast<const float*>(panel + size_t(kb) * L::fp8::kScaleBytes);
        sve::for_parts<N>([&](auto s) {
            const svfloat32_t bs = svld1(pw, sc + s * sve::kLanes<N>);
            svfloat32_t& t0 = sve::pick<s>(t00, t01);
            t0 = svmla_x(pw, t0, bs, svadd_x(pw, sve::pick<s>(e00, e01), sve::pick<s>(o00, o01)));
            if constexpr (R == 2) {
                svfloat32_t& t1 = sve::pick<s>(t10, t11);
                t1 = svmla_x(pw, t1, bs, svadd_x(pw, sve::pick<s>(e10, e11), sve::pick<s>(o10, o11)));
            }
        });
    }
    sve::for_parts<N>([&](auto s) {
        svst1(pw, out[0] + s * sve::kLanes<N>, sve::pick<s>(t00, t01));
        if constexpr (R == 2) svst1(pw, out[1] + s * sve::kLanes<N>, sve::pick<s>(t10, t11));
    });
}

// run(dot, pair): the SVE kernels for this CPU's vector length, NEON's at 128 bits.
template <Scales kScales, class Run>
void with_kernels(Run run) {
    const bool wide = sve::with_parts([&]<int N>() {
        run([](const uint8_t* panel, const uint8_t* row, int64_t K, float* o) {
                const float* x[1] = {reinterpret_cast<const float*>(row)};
                panel_rows_sve<kScales, N, 1>(panel, x, K, &o);
            },
            [](const uint8_t* panel, const uint8_t* r0, const uint8_t* r1, int64_t K, float (*o)[16]) {
                const float* x[2] = {reinterpret_cast<const float*>(r0), reinterpret_cast<const float*>(r1)};
                float* outs[2] = {o[0], o[1]};
                panel_rows_sve<kScales, N, 2>(panel, x, K, outs);
            });
    });
    if (!wide) run(panel_out<kScales>, panel_out_pair<kScales>);
}
#else
template <Scales kScales, class Run>
void with_kernels(Run run) { run(panel_out<kScales>, panel_out_pair<kScales>); }
#endif

template <Scales kScales>
kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    with_kernels<kScales>([&](auto dot, auto pair) {
        gate_up_panels(c, kGeo<kScales>.expert(c->hidden, c->intermediate), packed, act, f32_row_bytes(c->hidden), rows, n0,
                       n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

template <Scales kScales>
kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    with_kernels<kScales>([&](auto dot, auto pair) {
        gate_up_raw_panels(c, kGeo<kScales>.expert(c->hidden, c->intermediate), packed, act, f32_row_bytes(c->hidden), rows,
                           n0, n1, out_gate, out_up, ldo, dot, pair);
    });
    return KT_OK;
}

template <Scales kScales>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    with_kernels<kScales>([&](auto dot, auto pair) {
        down_panels(c, kGeo<kScales>.expert(c->hidden, c->intermediate), packed, act, f32_row_bytes(c->intermediate), rows,
                    n0, n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

template <Scales kScales>
kt_method_kernels table(const char* layout_id, const char* kernel_id) {
    return method_table(kt::inputs::fp8_method_name(kScales), layout_id, kernel_id, packed_bytes<kScales>, pack<kScales>,
                        f32_row_bytes, quantize_f32_rows, gate_up<kScales>, down<kScales>,
                        gate_up_raw<kScales>);
}

}  // namespace

kt_method_kernels fp8_kernels(const char* kernel_id) { return table<Scales::kBlock128>(L::fp8::kIdRows, kernel_id); }
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id) {
    return table<Scales::kPerChannel>(L::fp8::kIdRows, kernel_id);
}
kt_method_kernels mxfp8_kernels(const char* kernel_id) { return table<Scales::kMx>(L::mxfp8::kIdRows, kernel_id); }

}  // namespace KT_TARGET_NAMESPACE
