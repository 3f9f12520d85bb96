// BF16 in "kt-bf16-p16k2-v1" (kt/formats/packed_layouts.h): a 64-byte chunk holds the bf16 pair
// (k, k+1) of 16 channels, lane-major. NEON widens a pair word to two f32 vectors with a shift
// and a mask (exact) and multiply-adds exact f32 activations: the kernel's only rounding is the
// f32 accumulation. Where the target has BF16 (ARMv8.6), a chunk's 16-byte quarter is exactly
// `bfdot`'s operand (4 lanes of a (k, k+1) pair each): activations are split into two bf16 planes
// (x = hi + lo, ~16 significant bits, as kt-backend-avx's split-bf16) and each plane takes one
// `bfdot` per quarter; two rows at a time (prefill) take `bfmmla` (a 2 x 4 by 4 x 2 bf16 product into
// a 2 x 2 f32 tile) on two chunks' quarters zipped into channel pairs, as the integer methods take
// `smmla`. Each weight byte is read once per row, or row pair (decode streams the panel once).
#include "common.h"

namespace KT_TARGET_NAMESPACE {
namespace {

uint16_t to_bf16(float f) {   // round to nearest even (NaN/Inf were refused at load)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

L::ExpertPanels layout(const kt_moe_config* c) { return L::bf16::expert(c->hidden, c->intermediate); }
size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes(); }

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const L::ExpertPanels l = layout(c);
    auto* out = static_cast<uint8_t*>(dst);
    const Part parts[3] = {{&src->gate, c->intermediate, c->hidden, 0}, {&src->up, c->intermediate, c->hidden, 1},
                           {&src->down, c->hidden, c->intermediate, 2}};
    std::vector<float> row;
    for (const Part& part : parts) {
        row.resize(size_t(part.cols));
        for (int64_t n = 0; n < part.rows; ++n) {
            if (!row_f32(part.w->values, n, row.data()))
                return fail(KT_ERROR_UNSUPPORTED, "kml BF16: weights must be float32, bfloat16 or float16 (kt_dtype %d given)",
                            int(part.w->values.dtype));
            uint8_t* panel = out + panel_at(l, part.which, n / kPanel);
            for (int64_t k = 0; k < part.cols; ++k) {
                const uint16_t h = to_bf16(row[size_t(k)]);
                std::memcpy(panel + L::bf16::offset(k, int(n % kPanel)), &h, 2);
            }
        }
    }
    return KT_OK;
}

// f32 rows; with bfdot, two bf16 planes per row (hi then lo, K rounded up to 4 and zero-padded: a
// bfmmla operand's 4 k never read past a plane).
int64_t plane(int64_t k) { return (k + 3) / 4 * 4; }
size_t row_bytes(int64_t k) { return kBf16Dot ? size_t(plane(k)) * 4 : f32_row_bytes(k); }

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (!kBf16Dot) return quantize_f32_rows(in, dtype, rows, k, stride, out);
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        if (!activation_row(in, dtype, r, k, stride, x.data()))
            return fail(KT_ERROR_UNSUPPORTED, "kml BF16: activations must be float32 or bfloat16 (kt_dtype %d)", int(dtype));
        auto* hi = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(out) + size_t(r) * row_bytes(k));
        uint16_t* lo = hi + plane(k);
        for (int64_t i = k; i < plane(k); ++i) hi[i] = lo[i] = 0;   // the padding (its weights are zero too)
        for (int64_t i = 0; i < k; ++i) {
            hi[i] = to_bf16(x[size_t(i)]);
            lo[i] = to_bf16(x[size_t(i)] - bf16_to_f32(hi[i]));   // NaN/Inf stay in hi: they reach the output
        }
    }
    return KT_OK;
}

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
// acc[0..3] (16 channels) += panel . (hi + lo) over K: one bfdot per plane per 4 channels and k pair.
inline void panel_dot(const uint8_t* panel, const uint8_t* row, int64_t K, float32x4_t acc[4]) {
    const uint32_t* hi = reinterpret_cast<const uint32_t*>(row);
    const uint32_t* lo = hi + plane(K) / 2;
    for (int64_t j = 0; 2 * j < K; ++j) {
        const bfloat16x8_t xh = vreinterpretq_bf16_u32(vdupq_n_u32(hi[j])), xl = vreinterpretq_bf16_u32(vdupq_n_u32(lo[j]));
        const uint8_t* w = panel + size_t(j) * 64;
        for (int v = 0; v < 4; ++v) {
            const bfloat16x8_t wv = vreinterpretq_bf16_u8(vld1q_u8(w + 16 * v));
            acc[v] = vbfdotq_f32(vbfdotq_f32(acc[v], wv, xh), wv, xl);
        }
    }
}
#else
// acc[0..3] (16 channels) += panel . x over K.
inline void panel_dot(const uint8_t* panel, const uint8_t* row, int64_t K, float32x4_t acc[4]) {
    const float* x = reinterpret_cast<const float*>(row);
    const uint32x4_t high = vdupq_n_u32(0xffff0000u);
    int64_t j = 0;
    for (; 2 * j + 1 < K; ++j) {
        const float32x4_t x0 = vdupq_n_f32(x[2 * j]), x1 = vdupq_n_f32(x[2 * j + 1]);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64);
        for (int v = 0; v < 4; ++v) {
            const uint32x4_t pair = vld1q_u32(w + 4 * v);
            acc[v] = vfmaq_f32(acc[v], vreinterpretq_f32_u32(vshlq_n_u32(pair, 16)), x0);
            acc[v] = vfmaq_f32(acc[v], vreinterpretq_f32_u32(vandq_u32(pair, high)), x1);
        }
    }
    if (2 * j < K) {   // odd K: the last pair's second weight is padding
        const float32x4_t x0 = vdupq_n_f32(x[2 * j]);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64);
        for (int v = 0; v < 4; ++v)
            acc[v] = vfmaq_f32(acc[v], vreinterpretq_f32_u32(vshlq_n_u32(vld1q_u32(w + 4 * v), 16)), x0);
    }
}
#endif

// One panel's 16 outputs for one activation row.
void panel_out(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    float32x4_t acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = vdupq_n_f32(0.0f);
    panel_dot(panel, row, K, acc);
    for (int v = 0; v < 4; ++v) vst1q_f32(out + 4 * v, acc[v]);
}

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
// Two activation rows' 16 outputs: chunks j and j + 1 (k = 2j..2j+3) zipped into channel pairs (2
// channels x 4 k), against both rows' 4 k of each plane: one bfmmla per pair and plane.
void panel_out_pair(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    const auto* h0 = reinterpret_cast<const bfloat16_t*>(row0);
    const auto* h1 = reinterpret_cast<const bfloat16_t*>(row1);
    const bfloat16_t *l0 = h0 + plane(K), *l1 = h1 + plane(K);
    const int64_t chunks = (K + 1) / 2;
    float32x4_t t[8];   // tiles: channel pair t of group t / 2, rows 0 and 1
    for (int i = 0; i < 8; ++i) t[i] = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < chunks; j += 2) {
        const bfloat16x8_t xh = vcombine_bf16(vld1_bf16(h0 + 2 * j), vld1_bf16(h1 + 2 * j));
        const bfloat16x8_t xl = vcombine_bf16(vld1_bf16(l0 + 2 * j), vld1_bf16(l1 + 2 * j));
        for (int v = 0; v < 4; ++v) {
            const uint32x4_t a = vld1q_u32(reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64 + 16 * v));
            const uint32x4_t b = j + 1 < chunks ? vld1q_u32(reinterpret_cast<const uint32_t*>(panel + size_t(j + 1) * 64 + 16 * v))
                                                : vdupq_n_u32(0);
            const bfloat16x8_t p0 = vreinterpretq_bf16_u32(vzip1q_u32(a, b)), p1 = vreinterpretq_bf16_u32(vzip2q_u32(a, b));
            t[2 * v] = vbfmmlaq_f32(vbfmmlaq_f32(t[2 * v], xh, p0), xl, p0);
            t[2 * v + 1] = vbfmmlaq_f32(vbfmmlaq_f32(t[2 * v + 1], xh, p1), xl, p1);
        }
    }
    for (int v = 0; v < 4; ++v) {   // tile lanes: row 0 x channel 0, row 0 x channel 1, row 1 x ...
        const float64x2_t p0 = vreinterpretq_f64_f32(t[2 * v]), p1 = vreinterpretq_f64_f32(t[2 * v + 1]);
        vst1q_f32(out[0] + 4 * v, vreinterpretq_f32_f64(vzip1q_f64(p0, p1)));
        vst1q_f32(out[1] + 4 * v, vreinterpretq_f32_f64(vzip2q_f64(p0, p1)));
    }
}
constexpr auto kPair = panel_out_pair;
#else
constexpr NoPair kPair{};
#endif

#if defined(__ARM_FEATURE_SVE)
// SVE (sve.h): part s of a chunk is one vector of (k, k+1) pair words. Without BF16 each widens to
// two f32 vectors (the shift and the mask) for `fmla` on exact f32 activations, in NEON's order
// (bit-identical); with it, `bfdot` per plane on the words as they are, and row pairs through SVE's
// `bfmmla` on part s of chunks j and j + 1 zipped into channel pairs.
#if defined(KT_SVE_BF16)
template <int N>
void panel_out_sve(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    const uint32_t* hi = reinterpret_cast<const uint32_t*>(row);
    const uint32_t* lo = hi + plane(K) / 2;
    const svbool_t pw = sve::words<N>();
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0;
    for (int64_t j = 0; 2 * j < K; ++j) {
        const svbfloat16_t xh = svreinterpret_bf16(svdup_n_u32(hi[j])), xl = svreinterpret_bf16(svdup_n_u32(lo[j]));
        const uint32_t* w = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64);
        sve::for_parts<N>([&](auto s) {
            const svbfloat16_t wv = svreinterpret_bf16(svld1(pw, w + s * sve::kLanes<N>));
            svfloat32_t& a = sve::pick<s>(a0, a1);
            a = svbfdot(svbfdot(a, wv, xh), wv, xl);
        });
    }
    sve::for_parts<N>([&](auto s) { svst1(pw, out + s * sve::kLanes<N>, sve::pick<s>(a0, a1)); });
}

template <int N>
void panel_out_pair_sve(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    const auto* h0 = reinterpret_cast<const uint16_t*>(row0);
    const auto* h1 = reinterpret_cast<const uint16_t*>(row1);
    const uint16_t *l0 = h0 + plane(K), *l1 = h1 + plane(K);
    const int64_t chunks = (K + 1) / 2;
    const svbool_t pw = sve::words<N>();
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0, b0 = a0, b1 = a0;   // zip1, zip2 tiles
    for (int64_t j = 0; j < chunks; j += 2) {   // the planes are padded to 4 k: 2j..2j+3 is readable
        const svbfloat16_t xh = svreinterpret_bf16(sve::rows2(h0 + 2 * j, h1 + 2 * j));
        const svbfloat16_t xl = svreinterpret_bf16(sve::rows2(l0 + 2 * j, l1 + 2 * j));
        const svbool_t next = j + 1 < chunks ? pw : svpfalse();
        sve::for_parts<N>([&](auto s) {
            const uint32_t* p = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64) + s * sve::kLanes<N>;
            const svuint32_t a = svld1(pw, p), b = svld1(next, p + 16);
            const svbfloat16_t p0 = svreinterpret_bf16(sve::pair_lo(a, b)), p1 = svreinterpret_bf16(sve::pair_hi(a, b));
            svfloat32_t &ta = sve::pick<s>(a0, a1), &tb = sve::pick<s>(b0, b1);
            ta = svbfmmla(svbfmmla(ta, xh, p0), xl, p0);
            tb = svbfmmla(svbfmmla(tb, xh, p1), xl, p1);
        });
    }
    sve::for_parts<N>([&](auto s) {
        const svfloat32_t ta = sve::pick<s>(a0, a1), tb = sve::pick<s>(b0, b1);
        svst1(pw, out[0] + s * sve::kLanes<N>, sve::row0(ta, tb));
        svst1(pw, out[1] + s * sve::kLanes<N>, sve::row1(ta, tb));
    });
}
template <int N> constexpr auto kPairSve = panel_out_pair_sve<N>;
#else
template <int N>
void panel_out_sve(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    const float* x = reinterpret_cast<const float*>(row);
    const svbool_t pw = sve::words<N>();
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0;
    int64_t j = 0;
    for (; 2 * j + 1 < K; ++j) {
        const svfloat32_t x0 = svdup_n_f32(x[2 * j]), x1 = svdup_n_f32(x[2 * j + 1]);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64);
        sve::for_parts<N>([&](auto s) {
            const svuint32_t pair = svld1(pw, w + s * sve::kLanes<N>);
            svfloat32_t& a = sve::pick<s>(a0, a1);
            a = svmla_x(pw, a, svreinterpret_f32(svlsl_n_u32_x(pw, pair, 16)), x0);
            a = svmla_x(pw, a, svreinterpret_f32(svand_n_u32_x(pw, pair, 0xffff0000u)), x1);
        });
    }
    if (2 * j < K) {   // odd K: the last pair's second weight is padding
        const svfloat32_t x0 = svdup_n_f32(x[2 * j]);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(panel + size_t(j) * 64);
        sve::for_parts<N>([&](auto s) {
            svfloat32_t& a = sve::pick<s>(a0, a1);
            a = svmla_x(pw, a, svreinterpret_f32(svlsl_n_u32_x(pw, svld1(pw, w + s * sve::kLanes<N>), 16)), x0);
        });
    }
    sve::for_parts<N>([&](auto s) { svst1(pw, out + s * sve::kLanes<N>, sve::pick<s>(a0, a1)); });
}
template <int N> constexpr NoPair kPairSve{};
#endif

// run(dot, pair): the SVE kernels for this CPU's vector length, NEON's at 128 bits.
template <class Run> void with_kernels(Run run) {
    if (!sve::with_parts([&]<int N>() { run(panel_out_sve<N>, kPairSve<N>); })) run(panel_out, kPair);
}
#else
template <class Run> void with_kernels(Run run) { run(panel_out, kPair); }
#endif

kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        gate_up_panels(c, layout(c), packed, act, row_bytes(c->hidden), rows, n0, n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        gate_up_raw_panels(c, layout(c), packed, act, row_bytes(c->hidden), rows, n0, n1, out_gate, out_up, ldo, dot, pair);
    });
    return KT_OK;
}

kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        down_panels(c, layout(c), packed, act, row_bytes(c->intermediate), rows, n0, n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

}  // namespace

kt_method_kernels bf16_kernels(const char* kernel_id) {
    return method_table("BF16", L::bf16::kId, kernel_id, packed_bytes, pack, row_bytes, quantize, gate_up, down,
                        gate_up_raw);
}

}  // namespace KT_TARGET_NAMESPACE
