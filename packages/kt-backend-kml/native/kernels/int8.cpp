// INT8 in "kt-int8-p16k4-v1" (kt/formats/packed_layouts.h): per panel a header {f32 scale[16];
// i32 128 * sum q [16]} and 64-byte chunks of the codes of k = 4j..4j+3 for 16 channels,
// lane-major — exactly the operand order of the ARMv8.2 `sdot` (four int8 products into each
// 32-bit lane). Activations are two int8 passes per row (x ~ s (q_hi + q_lo / 128), as
// kt-backend-avx's), so the products are exact integers: every target gives bit-identical
// outputs. Without dotprod, `smull` + two pairwise adds make the same four-product sums.
#include <kt/formats/quant_rules.h>

#include "common.h"
#include "int8_activations.h"

namespace KT_TARGET_NAMESPACE {
namespace {

L::ExpertPanels layout(const kt_moe_config* c) { return L::int8::expert(c->hidden, c->intermediate); }
size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes(); }

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const L::ExpertPanels l = layout(c);
    auto* out = static_cast<uint8_t*>(dst);
    const Part parts[3] = {{&src->gate, c->intermediate, c->hidden, 0}, {&src->up, c->intermediate, c->hidden, 1},
                           {&src->down, c->hidden, c->intermediate, 2}};
    std::vector<float> row;
    std::vector<int8_t> q;
    for (const Part& part : parts) {
        row.resize(size_t(part.cols));
        q.resize(size_t(part.cols));
        for (int64_t n = 0; n < part.rows; ++n) {
            if (!row_f32(part.w->values, n, row.data()))
                return fail(KT_ERROR_UNSUPPORTED, "kml INT8: weights must be float32, bfloat16 or float16 (kt_dtype %d given)",
                            int(part.w->values.dtype));
            const float s = kt::quant::quantize_symmetric(row.data(), part.cols, 127.0f, -127, 127, q.data());
            uint8_t* panel = out + panel_at(l, part.which, n / kPanel);
            const int lane = int(n % kPanel);
            int32_t sum = 0;
            for (int64_t k = 0; k < part.cols; ++k) {
                panel[L::int8::code_offset(k, lane)] = uint8_t(q[size_t(k)]);
                sum += q[size_t(k)];
            }
            const int32_t comp = 128 * sum;
            std::memcpy(panel + size_t(lane) * 4, &s, 4);
            std::memcpy(panel + 64 + size_t(lane) * 4, &comp, 4);
        }
    }
    return KT_OK;
}

}  // namespace

kt_status quantize_int8_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        if (!activation_row(in, dtype, r, k, stride, x.data()))
            return fail(KT_ERROR_UNSUPPORTED, "kml INT8: activations must be float32 or bfloat16 (kt_dtype %d)", int(dtype));
        auto* row = static_cast<uint8_t*>(out) + size_t(r) * act_row_bytes(k);
        std::memset(row, 0, act_row_bytes(k));
        auto* hi = reinterpret_cast<int8_t*>(row + 16);
        auto* lo = hi + act_padded(k);
        // A NaN or Inf in the row cannot be quantized: its codes stay 0 and its scale NaN, so the
        // token's output is NaN and no other token's is.
        if (!std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); })) {
            const float nan = std::nanf("");
            std::memcpy(row, &nan, 4);
            continue;
        }
        const float s = kt::quant::quantize_symmetric(x.data(), k, 127.0f, -127, 127, hi);
        std::memcpy(row, &s, 4);
        if (s != 0.0f)
            for (int64_t i = 0; i < k; ++i) lo[i] = int8_t(kt::quant::round_clamped((x[size_t(i)] / s - hi[i]) * 128.0f, -127, 127));
        auto* sums_hi = const_cast<int16_t*>(act_sums_hi(row, k));
        int16_t* sums_lo = sums_hi + act_sums(k);
        for (int64_t i = 0; i < act_sums(k); ++i) {   // the padding's codes are 0
            int sh = 0, sl = 0;
            for (int64_t e = 32 * i; e < std::min(32 * i + 32, act_padded(k)); ++e) sh += hi[e], sl += lo[e];
            sums_hi[i] = int16_t(sh);
            sums_lo[i] = int16_t(sl);
        }
    }
    return KT_OK;
}

namespace {

// One row's 16 outputs from its exact dots: s_x * s_w * (dot_hi + dot_lo / 128), in f32.
inline void finish(const uint8_t* panel, const uint8_t* row, const int32x4_t* acc_hi, const int32x4_t* acc_lo, float out[16]) {
    const float sx = act_scale(row);
    const float* sw = reinterpret_cast<const float*>(panel);
    for (int v = 0; v < 4; ++v) {
        const float32x4_t dot = vaddq_f32(vcvtq_f32_s32(acc_hi[v]), vmulq_n_f32(vcvtq_f32_s32(acc_lo[v]), 1.0f / 128.0f));
        vst1q_f32(out + 4 * v, vmulq_f32(vmulq_n_f32(vld1q_f32(sw + 4 * v), sx), dot));
    }
}

// The 16 channels' w . x of one panel for R activation rows: chunk quartets, each row's 16 k from 4j
// one register per pass (rows are zero-padded to 16 k) read by `sdot`'s indexed form, each chunk's
// codes loaded once for every row.
template <int R>
inline void panel_rows(const uint8_t* panel, const uint8_t* const* rows, int64_t K, float* const* out) {
    const int8_t* w = reinterpret_cast<const int8_t*>(panel + L::int8::kHeaderBytes);
    int32x4_t acc_hi[R][4], acc_lo[R][4];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) acc_hi[r][v] = acc_lo[r][v] = vdupq_n_s32(0);
    const int64_t chunks = (K + 3) / 4;
    for (int64_t j = 0; j < chunks; j += 4) {
        int8x16_t xh[R], xl[R];
        for (int r = 0; r < R; ++r) xh[r] = vld1q_s8(act_hi(rows[r]) + 4 * j), xl[r] = vld1q_s8(act_lo(rows[r], K) + 4 * j);
        const auto chunk = [&](int t) {   // t: the lane the indexed dots read, a constant in a whole quartet
            for (int v = 0; v < 4; ++v) {
                const int8x16_t wv = vld1q_s8(w + size_t(j + t) * 64 + 16 * v);
                for (int r = 0; r < R; ++r) {
                    acc_hi[r][v] = dot4_lane(acc_hi[r][v], wv, xh[r], t);
                    acc_lo[r][v] = dot4_lane(acc_lo[r][v], wv, xl[r], t);
                }
            }
        };
        if (j + 4 <= chunks) {
            chunk(0), chunk(1), chunk(2), chunk(3);
        } else {
            for (int t = 0; t < int(chunks - j); ++t) chunk(t);
        }
    }
    for (int r = 0; r < R; ++r) finish(panel, rows[r], acc_hi[r], acc_lo[r], out[r]);
}

// One activation row.
inline void panel_dot(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    panel_rows<1>(panel, &row, K, &out);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Two activation rows at once: chunks j and j + 1 (k = 4j..4j+7) zipped into channel pairs, one
// `smmla` per pair and pass (the integers of two panel_dot calls, so the outputs are bit-identical).
inline void panel_dot_pair(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    const int8_t *h0 = act_hi(row0), *h1 = act_hi(row1), *l0 = act_lo(row0, K), *l1 = act_lo(row1, K);
    const int8_t* w = reinterpret_cast<const int8_t*>(panel + L::int8::kHeaderBytes);
    const int64_t chunks = (K + 3) / 4;
    int32x4_t th[8], tl[8];
    for (int t = 0; t < 8; ++t) th[t] = tl[t] = vdupq_n_s32(0);
    for (int64_t j = 0; j < chunks; j += 2) {   // activations are zero-padded to 16: k up to 4j + 7 is readable
        const int8x16_t xh = rows2x8(h0 + 4 * j, h1 + 4 * j), xl = rows2x8(l0 + 4 * j, l1 + 4 * j);
        for (int v = 0; v < 4; ++v) {
            const int8x16_t a = vld1q_s8(w + size_t(j) * 64 + 16 * v);
            const int8x16_t b = j + 1 < chunks ? vld1q_s8(w + size_t(j + 1) * 64 + 16 * v) : vdupq_n_s8(0);
            const int8x16_t w0 = channel_pair0(a, b), w1 = channel_pair1(a, b);
            th[2 * v] = mmla(th[2 * v], xh, w0);
            th[2 * v + 1] = mmla(th[2 * v + 1], xh, w1);
            tl[2 * v] = mmla(tl[2 * v], xl, w0);
            tl[2 * v + 1] = mmla(tl[2 * v + 1], xl, w1);
        }
    }
    int32x4_t hi[2][4], lo[2][4];
    untile(th, hi[0], hi[1]);
    untile(tl, lo[0], lo[1]);
    finish(panel, row0, hi[0], lo[0], out[0]);
    finish(panel, row1, hi[1], lo[1], out[1]);
}
constexpr auto kPair = panel_dot_pair;
#elif defined(__ARM_FEATURE_DOTPROD)
// Two activation rows through `sdot` (ARMv8.2 without I8MM): panel_rows' sums for each, so the outputs
// are bit-identical. (ARMv8.0 keeps one row per pass: its four-product dot is six instructions, beside
// which the shared load is nothing.)
inline void panel_dot_pair(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    const uint8_t* rows[2] = {row0, row1};
    float* outs[2] = {out[0], out[1]};
    panel_rows<2>(panel, rows, K, outs);
}
constexpr auto kPair = panel_dot_pair;
#else
constexpr NoPair kPair{};
#endif

#if defined(__ARM_FEATURE_SVE)
// SVE (sve.h): part s of a chunk is one vector, `sdot` as above per part — the same integers, and
// the same f32 finish in the same order: bit-identical to the NEON targets.
template <int N>
inline void finish_part(const uint8_t* panel, const uint8_t* row, int s, svint32_t hi, svint32_t lo, float* out) {
    const svbool_t pw = sve::words<N>();
    const float* sw = reinterpret_cast<const float*>(panel) + s * sve::kLanes<N>;
    const svfloat32_t dot = svadd_x(pw, svcvt_f32_x(pw, hi), svmul_n_f32_x(pw, svcvt_f32_x(pw, lo), 1.0f / 128.0f));
    svst1(pw, out + s * sve::kLanes<N>, svmul_x(pw, svmul_n_f32_x(pw, svld1(pw, sw), act_scale(row)), dot));
}

template <int N>
void panel_dot_sve(const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    const int8_t *hi = act_hi(row), *lo = act_lo(row, K);
    const int8_t* w = reinterpret_cast<const int8_t*>(panel + L::int8::kHeaderBytes);
    svint32_t h0 = svdup_n_s32(0), h1 = h0, l0 = h0, l1 = h0;
    const int64_t chunks = (K + 3) / 4;
    for (int64_t j = 0; j < chunks; j += 4) {   // 16 k per ld1rq (rows are padded to 16), indexed sdot
        const svint8_t xh = svld1rq(svptrue_b8(), hi + 4 * j), xl = svld1rq(svptrue_b8(), lo + 4 * j);
        const auto chunk = [&](int t) {
            sve::for_parts<N>([&](auto s) {
                const svint8_t wv = svld1(sve::bytes<N>(), w + size_t(j + t) * 64 + s * sve::kBytes<N>);
                svint32_t &h = sve::pick<s>(h0, h1), &l = sve::pick<s>(l0, l1);
                h = sve::dot_lane(h, wv, xh, t);
                l = sve::dot_lane(l, wv, xl, t);
            });
        };
        if (j + 4 <= chunks) {
            chunk(0), chunk(1), chunk(2), chunk(3);
        } else {
            for (int t = 0; t < int(chunks - j); ++t) chunk(t);
        }
    }
    sve::for_parts<N>([&](auto s) { finish_part<N>(panel, row, s, sve::pick<s>(h0, h1), sve::pick<s>(l0, l1), out); });
}

#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
// Two rows through SVE's `smmla` (per 128-bit segment as NEON's): part s of chunks j and j + 1
// zipped into channel pairs (sve.h), tiles un-zipped per part — panel_dot_sve's integers.
template <int N>
void panel_dot_pair_sve(const uint8_t* panel, const uint8_t* row0, const uint8_t* row1, int64_t K, float out[2][16]) {
    const int8_t *h0 = act_hi(row0), *h1 = act_hi(row1), *l0 = act_lo(row0, K), *l1 = act_lo(row1, K);
    const int8_t* w = reinterpret_cast<const int8_t*>(panel + L::int8::kHeaderBytes);
    const int64_t chunks = (K + 3) / 4;
    // per part: hi and lo passes' tiles of the zip1 (a) and zip2 (b) channel pairs
    svint32_t ha0 = svdup_n_s32(0), ha1 = ha0, hb0 = ha0, hb1 = ha0;
    svint32_t la0 = ha0, la1 = ha0, lb0 = ha0, lb1 = ha0;
    for (int64_t j = 0; j < chunks; j += 2) {   // activations are zero-padded to 16: k up to 4j + 7 is readable
        const svint8_t xh = svreinterpret_s8(sve::rows2(h0 + 4 * j, h1 + 4 * j));
        const svint8_t xl = svreinterpret_s8(sve::rows2(l0 + 4 * j, l1 + 4 * j));
        const svbool_t next = j + 1 < chunks ? sve::bytes<N>() : svpfalse();
        sve::for_parts<N>([&](auto s) {
            const int8_t* p = w + size_t(j) * 64 + s * sve::kBytes<N>;
            mmla_part(svreinterpret_s32(svld1(sve::bytes<N>(), p)), svreinterpret_s32(svld1(next, p + 64)), xh, xl,
                      sve::pick<s>(ha0, ha1), sve::pick<s>(hb0, hb1), sve::pick<s>(la0, la1), sve::pick<s>(lb0, lb1));
        });
    }
    sve::for_parts<N>([&](auto s) {
        const svint32_t ha = sve::pick<s>(ha0, ha1), hb = sve::pick<s>(hb0, hb1);
        const svint32_t la = sve::pick<s>(la0, la1), lb = sve::pick<s>(lb0, lb1);
        finish_part<N>(panel, row0, s, sve::row0(ha, hb), sve::row0(la, lb), out[0]);
        finish_part<N>(panel, row1, s, sve::row1(ha, hb), sve::row1(la, lb), out[1]);
    });
}
template <int N> constexpr auto kPairSve = panel_dot_pair_sve<N>;
#else
template <int N> constexpr NoPair kPairSve{};
#endif

// run(dot, pair): the SVE kernels for this CPU's vector length, NEON's at 128 bits.
template <class Run> void with_kernels(Run run) {
    if (!sve::with_parts([&]<int N>() { run(panel_dot_sve<N>, kPairSve<N>); })) run(panel_dot, kPair);
}
#else
template <class Run> void with_kernels(Run run) { run(panel_dot, kPair); }
#endif

kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        gate_up_panels(c, layout(c), packed, act, act_row_bytes(c->hidden), rows, n0, n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        gate_up_raw_panels(c, layout(c), packed, act, act_row_bytes(c->hidden), rows, n0, n1, out_gate, out_up, ldo, dot,
                           pair);
    });
    return KT_OK;
}

kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    with_kernels([&](auto dot, auto pair) {
        down_panels(c, layout(c), packed, act, act_row_bytes(c->intermediate), rows, n0, n1, out, ldo, dot, pair);
    });
    return KT_OK;
}

}  // namespace

kt_method_kernels int8_kernels(const char* kernel_id) {
    return method_table("INT8", L::int8::kId, kernel_id, packed_bytes, pack, act_row_bytes, quantize_int8_activations, gate_up,
                        down, gate_up_raw);
}

}  // namespace KT_TARGET_NAMESPACE
