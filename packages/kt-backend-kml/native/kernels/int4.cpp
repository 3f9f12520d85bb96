// Group-wise INT4 in "kt-int4-p16-v2" (kt/formats/packed_layouts.h): per group of G k (32, 64 or
// 128) a header {f32 s[16]} (with zero points {f32 s[16]; f32 s*z[16]}) and G/8 chunks whose low
// nibbles are the codes u of one 4-k quad of 16 channels, lane-major, and whose high nibbles the
// next quad. A nibble plane masked out is already the dot-product operand order, so per group:
// dot = sum u * q (sdot / smull on the two int8 activation passes, exact), then
// s * (dot - 8 * sum q) symmetric, or s * dot - s*z * sum q with zero points, in f32.
// RAWINT4 (compressed-tensors, Kimi-K2) is the symmetric G = 32 case with the checkpoint's codes
// and bf16 scales kept bit-exactly ("kt-rawint4-p16-v1": a 32-byte bf16 header per group).
#include <kt/formats/checkpoint_inputs.h>
#include <kt/formats/quant_rules.h>

#include "common.h"
#include "int8_activations.h"

namespace KT_TARGET_NAMESPACE {
namespace {

template <bool kRaw>
L::int4::Geometry geometry(const kt_moe_config* c) {
    return L::int4::geometry(kRaw, c->group_size == 0 ? 128 : c->group_size, (c->quant_flags & KT_QUANT_ZERO_POINT) != 0);
}
template <bool kRaw>
size_t packed_bytes(const kt_moe_config* c) { return geometry<kRaw>(c).expert(c->hidden, c->intermediate).bytes(); }

// Channel `lane` of a panel's group at g0: its codes u[0..g) in the layout's nibbles.
void put_codes(const L::int4::Geometry& geo, uint8_t* panel, int lane, int64_t g0, const uint8_t* u) {
    for (int64_t i = 0; i < geo.g; ++i) {
        uint8_t& byte = panel[geo.code_offset(g0 + i, lane)];
        byte = L::int4::Geometry::high_nibble(g0 + i) ? uint8_t((byte & 0x0f) | (u[i] << 4)) : uint8_t((byte & 0xf0) | u[i]);
    }
}

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const L::int4::Geometry geo = geometry<false>(c);
    const int64_t g = geo.g;
    if (g != 32 && g != 64 && g != 128)
        return fail(KT_ERROR_INVALID_ARGUMENT, "kml INT4: group_size %lld is not supported; use 32, 64 or 128", (long long)g);
    if (c->hidden % g || c->intermediate % g)
        return fail(KT_ERROR_INVALID_ARGUMENT, "kml INT4: group_size %lld must divide hidden (%lld) and intermediate (%lld)",
                    (long long)g, (long long)c->hidden, (long long)c->intermediate);
    const L::ExpertPanels l = geo.expert(c->hidden, c->intermediate);
    auto* out = static_cast<uint8_t*>(dst);
    const Part parts[3] = {{&src->gate, c->intermediate, c->hidden, 0}, {&src->up, c->intermediate, c->hidden, 1},
                           {&src->down, c->hidden, c->intermediate, 2}};
    std::vector<float> row;
    for (const Part& part : parts) {
        row.resize(size_t(part.cols));
        for (int64_t n = 0; n < part.rows; ++n) {
            if (!row_f32(part.w->values, n, row.data()))
                return fail(KT_ERROR_UNSUPPORTED, "kml INT4: weights must be float32, bfloat16 or float16 (kt_dtype %d given)",
                            int(part.w->values.dtype));
            uint8_t* panel = out + panel_at(l, part.which, n / kPanel);
            const int lane = int(n % kPanel);
            for (int64_t g0 = 0; g0 < part.cols; g0 += g) {
                uint8_t u[128];
                float s, sz = 0.0f;
                if (!geo.zero_point) {
                    int8_t q[128];
                    s = kt::quant::quantize_symmetric(row.data() + g0, g, 7.0f, -8, 7, q);
                    for (int64_t i = 0; i < g; ++i) u[i] = uint8_t(q[i] + 8);
                } else {
                    int z = 0;
                    s = kt::quant::quantize_asymmetric(row.data() + g0, g, u, &z);
                    sz = s * float(z);
                }
                uint8_t* header = panel + size_t(g0 / g) * geo.group_bytes();
                std::memcpy(header + size_t(lane) * 4, &s, 4);
                if (geo.zero_point) std::memcpy(header + 64 + size_t(lane) * 4, &sz, 4);
                put_codes(geo, panel, lane, g0, u);
            }
        }
    }
    return KT_OK;
}

kt_status pack_raw(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const L::int4::Geometry geo = geometry<true>(c);
    if (c->hidden % 32 || c->intermediate % 32)
        return fail(KT_ERROR_INVALID_ARGUMENT, "RAWINT4: group_size 32 must divide hidden (%lld) and intermediate (%lld), the K "
                    "of gate/up and of down", (long long)c->hidden, (long long)c->intermediate);
    const Part parts[3] = {{&src->gate, c->intermediate, c->hidden, 0}, {&src->up, c->intermediate, c->hidden, 1},
                           {&src->down, c->hidden, c->intermediate, 2}};
    const char* names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i) {
        const std::string err = kt::inputs::check_rawint4(*parts[i].w, parts[i].rows, parts[i].cols, names[i]);
        if (!err.empty()) return fail(KT_ERROR_INVALID_ARGUMENT, "%s", err.c_str());
    }
    const L::ExpertPanels l = geo.expert(c->hidden, c->intermediate);
    auto* out = static_cast<uint8_t*>(dst);
    std::vector<uint8_t> u;
    std::vector<float> s;
    for (const Part& part : parts) {
        u.resize(size_t(part.cols));
        s.resize(size_t(part.cols / 32));
        for (int64_t n = 0; n < part.rows; ++n) {
            kt::inputs::rawint4_channel(*part.w, n, u.data(), s.data());
            uint8_t* panel = out + panel_at(l, part.which, n / kPanel);
            const int lane = int(n % kPanel);
            for (int64_t g0 = 0; g0 < part.cols; g0 += 32) {
                uint32_t bits;   // a bf16 value (check_rawint4): its high half is the header's bf16
                std::memcpy(&bits, &s[size_t(g0 / 32)], 4);
                const uint16_t h = uint16_t(bits >> 16);
                std::memcpy(panel + size_t(g0 / 32) * geo.group_bytes() + size_t(lane) * 2, &h, 2);
                put_codes(geo, panel, lane, g0, u.data() + g0);
            }
        }
    }
    return KT_OK;
}

// Scales of 4v..4v+3 of a group header: f32, or RAWINT4's bf16 widened exactly.
template <bool kRaw>
inline float32x4_t group_scales(const uint8_t* header, int v) {
    if constexpr (kRaw) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const uint16_t*>(header) + 4 * v), 16));
    return vld1q_f32(reinterpret_cast<const float*>(header) + 4 * v);
}

// The sums of both activation passes over one group, in raw units (128 * hi + lo).
inline float group_asum(const L::int4::Geometry& geo, const uint8_t* row, int64_t K, int64_t g0) {
    const int16_t *sums_hi = act_sums_hi(row, K), *sums_lo = act_sums_lo(row, K);
    int32_t sum_hi = 0, sum_lo = 0;
    for (int64_t i = g0 / 32; i < (g0 + geo.g) / 32; ++i) sum_hi += sums_hi[i], sum_lo += sums_lo[i];
    return float(128 * sum_hi + sum_lo);
}

// acc += one group's scaled dots of one row: s * (dot - 8 * sum q) symmetric, s * dot - s*z * sum q
// with zero points (dot and sum in raw units, 128 * hi + lo: exact in int32).
template <bool kRaw>
inline void group_epilogue(const L::int4::Geometry& geo, const uint8_t* header, const uint8_t* row, int64_t K, int64_t g0,
                           const int32x4_t* dh, const int32x4_t* dl, float32x4_t* acc) {
    const float asum = group_asum(geo, row, K, g0);
    for (int v = 0; v < 4; ++v) {
        const float32x4_t dot = vcvtq_f32_s32(vaddq_s32(vshlq_n_s32(dh[v], 7), dl[v]));
        const float32x4_t s = group_scales<kRaw>(header, v);
        if (geo.zero_point) {
            const float32x4_t sz = vld1q_f32(reinterpret_cast<const float*>(header + 64) + 4 * v);
            acc[v] = vfmaq_f32(vmlsq_n_f32(acc[v], sz, asum), s, dot);
        } else {
            acc[v] = vfmaq_f32(acc[v], s, vsubq_f32(dot, vdupq_n_f32(8.0f * asum)));
        }
    }
}

inline void store_row(const uint8_t* row, const float32x4_t* acc, float out[16]) {
    const float sx = act_scale(row) / 128.0f;
    for (int v = 0; v < 4; ++v) vst1q_f32(out + 4 * v, vmulq_n_f32(acc[v], sx));
}

// Chunks c and c + 1 of a group (16 k from k: one register per pass and row, read by `sdot`'s
// indexed form) into R rows' dots; each chunk's nibble planes decoded once for every row.
template <int R>
inline void chunk_pair_dots(const uint8_t* chunks, int64_t c, int64_t k, const int8_t* const* hi, const int8_t* const* lo,
                            int32x4_t (*dh)[4], int32x4_t (*dl)[4]) {
    const uint8x16_t low4 = vdupq_n_u8(0x0f);
    int8x16_t xh[R], xl[R];
    for (int r = 0; r < R; ++r) xh[r] = vld1q_s8(hi[r] + k), xl[r] = vld1q_s8(lo[r] + k);
    for (int t = 0; t < 2; ++t)
        for (int v = 0; v < 4; ++v) {
            const uint8x16_t w = vld1q_u8(chunks + size_t(c + t) * 64 + 16 * v);
            const int8x16_t w0 = vreinterpretq_s8_u8(vandq_u8(w, low4)), w1 = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
            for (int r = 0; r < R; ++r) {
                dh[r][v] = dot4_lane(dot4_lane(dh[r][v], w0, xh[r], 2 * t), w1, xh[r], 2 * t + 1);
                dl[r][v] = dot4_lane(dot4_lane(dl[r][v], w0, xl[r], 2 * t), w1, xl[r], 2 * t + 1);
            }
        }
}

// The 16 channels' w . x of one panel for one activation row.
template <bool kRaw>
inline void panel_dot(const L::int4::Geometry& geo, const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    const int8_t* hi[1] = {act_hi(row)};
    const int8_t* lo[1] = {act_lo(row, K)};
    float32x4_t acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = vdupq_n_f32(0.0f);
    for (int64_t g0 = 0; g0 < K; g0 += geo.g) {
        const uint8_t* header = panel + size_t(g0 / geo.g) * geo.group_bytes();
        int32x4_t dh[1][4], dl[1][4];
        for (int v = 0; v < 4; ++v) dh[0][v] = dl[0][v] = vdupq_n_s32(0);
        for (int64_t c = 0; c < geo.g / 8; c += 2) chunk_pair_dots<1>(header + geo.header_bytes(), c, g0 + 8 * c, hi, lo, dh, dl);
        group_epilogue<kRaw>(geo, header, row, K, g0, dh[0], dl[0], acc);
    }
    store_row(row, acc, out);
}

#if defined(__ARM_FEATURE_MATMUL_INT8) || defined(__ARM_FEATURE_DOTPROD)
// One group's dots of two activation rows (h: both rows' hi planes, l: lo), channels 4v..4v+3 of row r
// in dh[r][v], dl[r][v]. I8MM: a chunk's low and high nibble planes (k 8c..8c+3, 8c+4..8c+7) zipped
// into channel pairs, one `smmla` per pair and pass, the tiles split back; ARMv8.2: `sdot`, each
// chunk decoded once for both rows. Either way the integers of two panel_dot calls.
inline void pair_group_dots(const L::int4::Geometry& geo, const uint8_t* chunks, int64_t g0, const int8_t* const* h,
                            const int8_t* const* l, int32x4_t (*dh)[4], int32x4_t (*dl)[4]) {
#if defined(__ARM_FEATURE_MATMUL_INT8)
    const uint8x16_t low4 = vdupq_n_u8(0x0f);
    int32x4_t th[8], tl[8];
    for (int t = 0; t < 8; ++t) th[t] = tl[t] = vdupq_n_s32(0);
    for (int64_t c = 0; c < geo.g / 8; ++c) {
        const int64_t k = g0 + 8 * c;
        const int8x16_t xh = rows2x8(h[0] + k, h[1] + k), xl = rows2x8(l[0] + k, l[1] + k);
        for (int v = 0; v < 4; ++v) {
            const uint8x16_t w = vld1q_u8(chunks + size_t(c) * 64 + 16 * v);
            const int8x16_t a = vreinterpretq_s8_u8(vandq_u8(w, low4)), b = vreinterpretq_s8_u8(vshrq_n_u8(w, 4));
            const int8x16_t w0 = channel_pair0(a, b), w1 = channel_pair1(a, b);
            th[2 * v] = mmla(th[2 * v], xh, w0);
            th[2 * v + 1] = mmla(th[2 * v + 1], xh, w1);
            tl[2 * v] = mmla(tl[2 * v], xl, w0);
            tl[2 * v + 1] = mmla(tl[2 * v + 1], xl, w1);
        }
    }
    untile(th, dh[0], dh[1]);
    untile(tl, dl[0], dl[1]);
#else
    for (int v = 0; v < 4; ++v) dh[0][v] = dh[1][v] = dl[0][v] = dl[1][v] = vdupq_n_s32(0);
    for (int64_t c = 0; c < geo.g / 8; c += 2) chunk_pair_dots<2>(chunks, c, g0 + 8 * c, h, l, dh, dl);
#endif
}

// Two activation rows at once (prefill): each group's dots as above, the same f32 epilogue as
// panel_dot's: bit-identical outputs.
template <bool kRaw>
inline void panel_dot_pair(const L::int4::Geometry& geo, const uint8_t* panel, const uint8_t* row0, const uint8_t* row1,
                           int64_t K, float out[2][16]) {
    const int8_t* h[2] = {act_hi(row0), act_hi(row1)};
    const int8_t* l[2] = {act_lo(row0, K), act_lo(row1, K)};
    float32x4_t acc[2][4];
    for (int v = 0; v < 4; ++v) acc[0][v] = acc[1][v] = vdupq_n_f32(0.0f);
    for (int64_t g0 = 0; g0 < K; g0 += geo.g) {
        const uint8_t* header = panel + size_t(g0 / geo.g) * geo.group_bytes();
        int32x4_t dh[2][4], dl[2][4];
        pair_group_dots(geo, header + geo.header_bytes(), g0, h, l, dh, dl);
        group_epilogue<kRaw>(geo, header, row0, K, g0, dh[0], dl[0], acc[0]);
        group_epilogue<kRaw>(geo, header, row1, K, g0, dh[1], dl[1], acc[1]);
    }
    store_row(row0, acc[0], out[0]);
    store_row(row1, acc[1], out[1]);
}
#endif

#if defined(__ARM_FEATURE_SVE)
// SVE (sve.h): part s of each chunk is one vector, the nibble planes and `sdot`s as above per part,
// the group epilogue per part in the same f32 order: bit-identical to the NEON targets.
template <bool kRaw, int N>
inline svfloat32_t group_scales_sve(const uint8_t* header, int s) {
    const svbool_t pw = sve::words<N>();
    if constexpr (kRaw) {
        const svuint32_t h = svld1uh_u32(pw, reinterpret_cast<const uint16_t*>(header) + s * sve::kLanes<N>);
        return svreinterpret_f32(svlsl_n_u32_x(pw, h, 16));
    }
    return svld1(pw, reinterpret_cast<const float*>(header) + s * sve::kLanes<N>);
}

template <bool kRaw, int N>
inline svfloat32_t group_epilogue_sve(const L::int4::Geometry& geo, const uint8_t* header, float asum, int s, svint32_t dh,
                                      svint32_t dl, svfloat32_t acc) {
    const svbool_t pw = sve::words<N>();
    const svfloat32_t dot = svcvt_f32_x(pw, svadd_x(pw, svlsl_n_s32_x(pw, dh, 7), dl));
    const svfloat32_t sc = group_scales_sve<kRaw, N>(header, s);
    if (geo.zero_point) {   // NEON's vmlsq_n_f32 is a multiply, then a subtract (two roundings)
        const svfloat32_t sz = svld1(pw, reinterpret_cast<const float*>(header + 64) + s * sve::kLanes<N>);
        return svmla_x(pw, svsub_x(pw, acc, svmul_n_f32_x(pw, sz, asum)), sc, dot);
    }
    return svmla_x(pw, acc, sc, svsub_n_f32_x(pw, dot, 8.0f * asum));
}

template <int N>
inline void store_row_sve(const uint8_t* row, int s, svfloat32_t acc, float* out) {
    svst1(sve::words<N>(), out + s * sve::kLanes<N>, svmul_n_f32_x(sve::words<N>(), acc, act_scale(row) / 128.0f));
}

template <bool kRaw, int N>
void panel_dot_sve(const L::int4::Geometry& geo, const uint8_t* panel, const uint8_t* row, int64_t K, float out[16]) {
    const int8_t *hi = act_hi(row), *lo = act_lo(row, K);
    const svbool_t pb = sve::bytes<N>();
    svfloat32_t a0 = svdup_n_f32(0.0f), a1 = a0;
    for (int64_t g0 = 0; g0 < K; g0 += geo.g) {
        const uint8_t* header = panel + size_t(g0 / geo.g) * geo.group_bytes();
        const uint8_t* chunks = header + geo.header_bytes();
        svint32_t h0 = svdup_n_s32(0), h1 = h0, l0 = h0, l1 = h0;
        for (int64_t c = 0; c < geo.g / 8; c += 2) {   // chunks c, c + 1: 16 k per ld1rq, indexed sdot
            const svint8_t xh = svld1rq(svptrue_b8(), hi + g0 + 8 * c), xl = svld1rq(svptrue_b8(), lo + g0 + 8 * c);
            for (int t = 0; t < 2; ++t)
                sve::for_parts<N>([&](auto s) {
                    const svuint8_t w = svld1(pb, chunks + size_t(c + t) * 64 + s * sve::kBytes<N>);
                    const svint8_t w0 = svreinterpret_s8(svand_n_u8_x(pb, w, 0x0f)), w1 = svreinterpret_s8(svlsr_n_u8_x(pb, w, 4));
                    svint32_t &h = sve::pick<s>(h0, h1), &l = sve::pick<s>(l0, l1);
                    h = sve::dot_lane(sve::dot_lane(h, w0, xh, 2 * t), w1, xh, 2 * t + 1);
                    l = sve::dot_lane(sve::dot_lane(l, w0, xl, 2 * t), w1, xl, 2 * t + 1);
                });
        }
        const float asum = group_asum(geo, row, K, g0);
        sve::for_parts<N>([&](auto s) {
            svfloat32_t& a = sve::pick<s>(a0, a1);
            a = group_epilogue_sve<kRaw, N>(geo, header, asum, s, sve::pick<s>(h0, h1), sve::pick<s>(l0, l1), a);
        });
    }
    sve::for_parts<N>([&](auto s) { store_row_sve<N>(row, s, sve::pick<s>(a0, a1), out); });
}

#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
// Two rows through SVE's `smmla`: part s's low and high nibble planes zipped into channel pairs.
template <bool kRaw, int N>
void panel_dot_pair_sve(const L::int4::Geometry& geo, const uint8_t* panel, const uint8_t* row0, const uint8_t* row1,
                        int64_t K, float out[2][16]) {
    const int8_t *h0 = act_hi(row0), *h1 = act_hi(row1), *l0 = act_lo(row0, K), *l1 = act_lo(row1, K);
    const svbool_t pb = sve::bytes<N>();
    svfloat32_t r00 = svdup_n_f32(0.0f), r01 = r00, r10 = r00, r11 = r00;
    for (int64_t g0 = 0; g0 < K; g0 += geo.g) {
        const uint8_t* header = panel + size_t(g0 / geo.g) * geo.group_bytes();
        const uint8_t* chunks = header + geo.header_bytes();
        svint32_t ha0 = svdup_n_s32(0), ha1 = ha0, hb0 = ha0, hb1 = ha0;
        svint32_t la0 = ha0, la1 = ha0, lb0 = ha0, lb1 = ha0;
        for (int64_t c = 0; c < geo.g / 8; ++c) {
            const int64_t k = g0 + 8 * c;
            const svint8_t xh = svreinterpret_s8(sve::rows2(h0 + k, h1 + k)), xl = svreinterpret_s8(sve::rows2(l0 + k, l1 + k));
            sve::for_parts<N>([&](auto s) {
                const svuint8_t w = svld1(pb, chunks + size_t(c) * 64 + s * sve::kBytes<N>);
                mmla_part(svreinterpret_s32(svand_n_u8_x(pb, w, 0x0f)), svreinterpret_s32(svlsr_n_u8_x(pb, w, 4)), xh, xl,
                          sve::pick<s>(ha0, ha1), sve::pick<s>(hb0, hb1), sve::pick<s>(la0, la1), sve::pick<s>(lb0, lb1));
            });
        }
        const float asum0 = group_asum(geo, row0, K, g0), asum1 = group_asum(geo, row1, K, g0);
        sve::for_parts<N>([&](auto s) {
            const svint32_t ha = sve::pick<s>(ha0, ha1), hb = sve::pick<s>(hb0, hb1);
            const svint32_t la = sve::pick<s>(la0, la1), lb = sve::pick<s>(lb0, lb1);
            svfloat32_t &r0 = sve::pick<s>(r00, r01), &r1 = sve::pick<s>(r10, r11);
            r0 = group_epilogue_sve<kRaw, N>(geo, header, asum0, s, sve::row0(ha, hb), sve::row0(la, lb), r0);
            r1 = group_epilogue_sve<kRaw, N>(geo, header, asum1, s, sve::row1(ha, hb), sve::row1(la, lb), r1);
        });
    }
    sve::for_parts<N>([&](auto s) {
        store_row_sve<N>(row0, s, sve::pick<s>(r00, r01), out[0]);
        store_row_sve<N>(row1, s, sve::pick<s>(r10, r11), out[1]);
    });
}
#endif
#endif  // __ARM_FEATURE_SVE

// run(dot, pair) with this group geometry: NEON's, the pair kernel where smmla or sdot is.
template <bool kRaw, class Run>
void with_neon_kernels(const L::int4::Geometry& geo, Run run) {
    const auto dot = [&geo](const uint8_t* panel, const uint8_t* row, int64_t K, float* o) { panel_dot<kRaw>(geo, panel, row, K, o); };
#if defined(__ARM_FEATURE_MATMUL_INT8) || defined(__ARM_FEATURE_DOTPROD)
    run(dot, [&geo](const uint8_t* panel, const uint8_t* r0, const uint8_t* r1, int64_t K, float (*o)[16]) {
        panel_dot_pair<kRaw>(geo, panel, r0, r1, K, o);
    });
#else
    run(dot, NoPair{});
#endif
}

#if defined(__ARM_FEATURE_SVE)
// The SVE kernels for this CPU's vector length, NEON's at 128 bits.
template <bool kRaw, class Run>
void with_kernels(const L::int4::Geometry& geo, Run run) {
    const bool wide = sve::with_parts([&]<int N>() {
        const auto dot = [&geo](const uint8_t* panel, const uint8_t* row, int64_t K, float* o) {
            panel_dot_sve<kRaw, N>(geo, panel, row, K, o);
        };
#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
        run(dot, [&geo](const uint8_t* panel, const uint8_t* r0, const uint8_t* r1, int64_t K, float (*o)[16]) {
            panel_dot_pair_sve<kRaw, N>(geo, panel, r0, r1, K, o);
        });
#else
        run(dot, NoPair{});
#endif
    });
    if (!wide) with_neon_kernels<kRaw>(geo, run);
}
#else
template <bool kRaw, class Run>
void with_kernels(const L::int4::Geometry& geo, Run run) { with_neon_kernels<kRaw>(geo, run); }
#endif

template <bool kRaw>
kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    const L::int4::Geometry geo = geometry<kRaw>(c);
    with_kernels<kRaw>(geo, [&](auto dot, auto pair) {
        gate_up_panels(c, geo.expert(c->hidden, c->intermediate), packed, act, act_row_bytes(c->hidden), rows, n0, n1, out, ldo,
                       dot, pair);
    });
    return KT_OK;
}

template <bool kRaw>
kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    const L::int4::Geometry geo = geometry<kRaw>(c);
    with_kernels<kRaw>(geo, [&](auto dot, auto pair) {
        gate_up_raw_panels(c, geo.expert(c->hidden, c->intermediate), packed, act, act_row_bytes(c->hidden), rows, n0, n1,
                           out_gate, out_up, ldo, dot, pair);
    });
    return KT_OK;
}

template <bool kRaw>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    const L::int4::Geometry geo = geometry<kRaw>(c);
    with_kernels<kRaw>(geo, [&](auto dot, auto pair) {
        down_panels(c, geo.expert(c->hidden, c->intermediate), packed, act, act_row_bytes(c->intermediate), rows, n0, n1, out,
                    ldo, dot, pair);
    });
    return KT_OK;
}

}  // namespace

kt_method_kernels int4_kernels(const char* kernel_id) {
    return method_table("INT4", L::int4::kId, kernel_id, packed_bytes<false>, pack, act_row_bytes, quantize_int8_activations,
                        gate_up<false>, down<false>, gate_up_raw<false>);
}

kt_method_kernels rawint4_kernels(const char* kernel_id) {
    return method_table("RAWINT4", L::int4::kRawId, kernel_id, packed_bytes<true>, pack_raw, act_row_bytes,
                        quantize_int8_activations, gate_up<true>, down<true>, gate_up_raw<true>);
}

}  // namespace KT_TARGET_NAMESPACE
