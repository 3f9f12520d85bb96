// LLAMAFILE (GGUF's ggml blocks) in "kt-ggml-v8", kt-core's layout (kt/formats/ggml_panels.h):
// the bytes kt-backend-avx packs, read here by NEON (and by SVE: the vla section). Every type is a
// group-wise integer format in disguise, w = s * u - s*z per sub-block of 16 or 32 k, so one kernel
// runs them all: per 16-channel
// panel and sub-block, exact integer dots of the codes with the two int8 activation passes
// (`sdot` on ARMv8.2, `smull` + pairwise adds on ARMv8.0, `smmla` for row pairs on ARMv8.6: the
// same sums), then in f32
//   acc += s_a / 128 * (s * (128 dot_hi + dot_lo) - s*z * (128 sum_hi + sum_lo)).
// The codes are unsigned and small (u <= 63) except Q8_0's q + 128 and IQ4_XS's / IQ4_NL's table values,
// which `sdot` takes signed as they are (q back by an EOR; the table by one `tbl`): no sign
// juggling as on x86's vpmaddubsw.
//
// Activations ("ggml-act-v1", as kt-backend-avx's): per group of 256 k one f32 scale
// s_a = max|x| / 127 and two int8 planes x ~= s_a (hi + lo / 128), rounded to nearest even, so
// both backends feed the same integers to their dots; int16 sums of each plane per 16 k for the
// s*z term. KT_QUANT_FAST_ACTIVATIONS (llama.cpp's one Q8_K pass) skips the lo plane's dots;
// on the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) it dots a plane of its own instead,
// llama.cpp's Q8_0 activations (its Q8_1's values): per 32 k,
// q = x * 127 / max|x| rounded to nearest even, scale f16(max|x| / 127).
// Row ("ggml-act-v2"): scale[ceil(K/256)] (f32, padded to 16 bytes), hi[K], lo[K],
// sums_hi[K/16], sums_lo[K/16]; then scale32[K/32] (f32), hi32[K], sums32[K/16].
#include <algorithm>

#include <kt/formats/ggml_panels.h>

#include "common.h"
#include "int8_activations.h"

namespace KT_TARGET_NAMESPACE {
namespace {

namespace G = kt::layouts::ggml;
constexpr int64_t kQK = 256;   // activation scale group; every ggml block fits in one (32 | 256)

// ---- activations --------------------------------------------------------------------------

int64_t act_groups(int64_t k) { return (k + kQK - 1) / kQK; }
size_t scales_bytes(int64_t k) { return size_t((4 * act_groups(k) + 15) / 16 * 16); }
size_t per32_at(int64_t k) { return scales_bytes(k) + 2 * size_t(k) + 4 * size_t(k / 16); }
size_t act_bytes(int64_t k) { return per32_at(k) + size_t(k / 8 + k + k / 8); }

struct ActRow {
    const float* scale;   // scale[k >> scale_shift]
    const int8_t* hi;
    const int8_t* lo;
    const int16_t* sums_hi;
    const int16_t* sums_lo;
    const uint8_t* per32;   // the Q8_0-like plane's region
    int scale_shift;
};
inline ActRow act_row(const uint8_t* row, int64_t k) {
    const auto* hi = reinterpret_cast<const int8_t*>(row + scales_bytes(k));
    const auto* sums = reinterpret_cast<const int16_t*>(hi + 2 * k);
    return {reinterpret_cast<const float*>(row), hi, hi + k, sums, sums + k / 16, row + per32_at(k), 8};
}
// The row's Q8_0-like plane as its one pass (lo stays the 256-k one: a one-pass kernel reads none).
inline ActRow per32_row(const ActRow& a, int64_t k) {
    return {reinterpret_cast<const float*>(a.per32), reinterpret_cast<const int8_t*>(a.per32 + k / 8), a.lo,
            reinterpret_cast<const int16_t*>(a.per32 + k / 8 + k), nullptr, a.per32, 5};
}

// max|x| over n floats, and whether one was NaN.
inline float group_amax(const float* x, int64_t n, bool& nan) {
    float amax = 0.0f;
    nan = false;
    for (int64_t i = 0; i < n; ++i) {
        amax = std::max(amax, std::fabs(x[i]));
        nan |= x[i] != x[i];
    }
    return amax;
}

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (k % 32) return fail(KT_ERROR_INVALID_ARGUMENT, "LLAMAFILE: activation length %lld is not a multiple of 32", (long long)k);
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        if (!activation_row(in, dtype, r, k, stride, x.data()))
            return fail(KT_ERROR_UNSUPPORTED, "kml LLAMAFILE: activations must be float32 or bfloat16 (kt_dtype %d)", int(dtype));
        auto* base = static_cast<uint8_t*>(out) + size_t(r) * act_bytes(k);
        auto* scale = reinterpret_cast<float*>(base);
        auto* hi = reinterpret_cast<int8_t*>(base + scales_bytes(k));
        int8_t* lo = hi + k;
        auto* sums_hi = reinterpret_cast<int16_t*>(lo + k);
        int16_t* sums_lo = sums_hi + k / 16;
        auto* scale32 = reinterpret_cast<float*>(base + per32_at(k));
        auto* hi32 = reinterpret_cast<int8_t*>(scale32 + k / 32);
        auto* sums32 = reinterpret_cast<int16_t*>(hi32 + k);
        for (int64_t g = 0; g < act_groups(k); ++g) {
            const int64_t k0 = g * kQK, n = std::min(kQK, k - k0);
            bool nan;
            const float amax = group_amax(&x[size_t(k0)], n, nan);
            // A NaN makes the group's scale NaN (and its codes 0), so the token's output shows it.
            scale[g] = nan ? NAN : amax / 127.0f;
            const float inv = !nan && amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
            // 16 at a time (n is a multiple of 32); frintn rounds to nearest, ties to even, as
            // x86's vroundps does, so both backends quantize alike.
            for (int64_t i = k0; i < k0 + n; i += 16) {
                int32x4_t hq[4], lq[4];
                for (int q = 0; q < 4; ++q) {
                    const float32x4_t v = vmulq_n_f32(vld1q_f32(&x[size_t(i + 4 * q)]), inv), h = vrndnq_f32(v);
                    const float32x4_t l = vrndnq_f32(vmulq_n_f32(vsubq_f32(v, h), 128.0f));
                    hq[q] = vcvtq_s32_f32(h);
                    lq[q] = vcvtq_s32_f32(vminq_f32(vmaxq_f32(l, vdupq_n_f32(-64.0f)), vdupq_n_f32(64.0f)));
                }
                const auto narrow = [](const int32x4_t* q) {
                    return vcombine_s8(vmovn_s16(vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]))),
                                       vmovn_s16(vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]))));
                };
                vst1q_s8(hi + i, narrow(hq));
                vst1q_s8(lo + i, narrow(lq));
            }
            for (int64_t j = k0 / 16; j < (k0 + n) / 16; ++j) {
                int sh = 0, sl = 0;
                for (int i = 0; i < 16; ++i) sh += hi[16 * j + i], sl += lo[16 * j + i];
                sums_hi[j] = int16_t(sh);
                sums_lo[j] = int16_t(sl);
            }
            // The Q8_0-like plane, as ggml's x86 quantize_row_q8_0 makes it (kt-backend-avx's):
            // 127 / max|x| as the multiplier, the scale rounded to f16.
            for (int64_t b = k0; b < k0 + n; b += 32) {
                bool nan32;
                const float amax32 = group_amax(&x[size_t(b)], 32, nan32);
                scale32[b / 32] = nan32 ? NAN : vgetq_lane_f32(vcvt_f32_f16(vcvt_f16_f32(vdupq_n_f32(amax32 / 127.0f))), 0);
                const float inv = !nan32 && amax32 > 0.0f && std::isfinite(amax32) ? 127.0f / amax32 : 0.0f;
                for (int64_t i = b; i < b + 32; ++i) {   // a NaN product (NaN, or Inf * 0) codes as 0
                    const float q = std::nearbyint(x[size_t(i)] * inv);
                    hi32[i] = q == q ? int8_t(q) : int8_t(0);
                }
                for (int64_t j = b / 16; j < b / 16 + 2; ++j) {
                    int sh = 0;
                    for (int i = 0; i < 16; ++i) sh += hi32[16 * j + i];
                    sums32[j] = int16_t(sh);
                }
            }
        }
    }
    return KT_OK;
}


// ---- the panel kernel ---------------------------------------------------------------------

inline float32x4_t f16x4(const uint8_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p)))); }
inline float32x4_t f32x4(const uint8_t* p) { return vld1q_f32(reinterpret_cast<const float*>(p)); }
// Each byte's bits moved from bit `from` up or down to bit `to` (one `ushl` by a count that is a
// constant once the chunk loop is unrolled), then kept under `mask`: Q3_K's, Q5_K's and Q6_K's
// extra code bits back into place, two instructions each.
inline uint8x16_t move_bits(uint8x16_t v, int from, int to, uint8x16_t mask) {
    return vandq_u8(vshlq_u8(v, vdupq_n_s8(int8_t(to - from))), mask);
}
// The 16 channels' bytes of a scale row as int32, channels 4v..4v+3 in out[v].
inline void widen_u8(uint8x16_t b, int32x4_t out[4]) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
    out[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo)));
    out[1] = vreinterpretq_s32_u32(vmovl_high_u16(lo));
    out[2] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi)));
    out[3] = vreinterpretq_s32_u32(vmovl_high_u16(hi));
}
inline void widen_s8(int8x16_t b, int32x4_t out[4]) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    out[0] = vmovl_s16(vget_low_s16(lo));
    out[1] = vmovl_high_s16(lo);
    out[2] = vmovl_s16(vget_low_s16(hi));
    out[3] = vmovl_high_s16(hi);
}

// Per type: which codes, scales and offsets (w = s u - dmin m, or s (u - z)).
template <class P>
struct Form {
    static constexpr int64_t kChunkK = P::kBits == 2 ? 16 : P::kBits == 4 ? 8 : 4;   // k per 64-byte chunk
    static constexpr int kPerSub = int(P::kSubK / kChunkK);                         // chunks per sub-block
    static constexpr bool kFloatBlocks = P::kBlockK == 32;   // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL
    static constexpr int kZ32 = G::nibble_zero<P>();   // their code offsets (Q4_0, Q5_0)
    static constexpr bool kMin = std::is_same_v<P, G::Q4K> || std::is_same_v<P, G::Q5K> || std::is_same_v<P, G::Q2K>;
    static constexpr int kZ = std::is_same_v<P, G::Q6K> ? 32 : std::is_same_v<P, G::Q3K> ? 4 : 0;
};

// ---- code decoders: a chunk's codes as the int8 operands of the dots, channels 4v..4v+3 --------

// 4-bit forms: chunk c (the i-th of its sub-block) -> w0 (k 0-3 of the chunk), w1 (k 4-7).
template <class P>
inline void codes4(const uint8_t* blk, int64_t c, int i, int v, int8x16_t& w0, int8x16_t& w1) {
    using namespace G;
    const uint8x16_t low4 = vdupq_n_u8(0x0f);
    const uint8x16_t raw = vld1q_u8(blk + chunk_at<P>(c) + 16 * v);
    uint8x16_t u0 = vandq_u8(raw, low4), u1 = vshrq_n_u8(raw, 4);
    if constexpr (kFifthBits<P>) {   // fifth bits -> 16
        const uint8x16_t bits = vld1q_u8(blk + fifth_bits_at<P>(c) + 16 * v), b4 = vdupq_n_u8(0x10);
        u0 = vorrq_u8(u0, move_bits(bits, 2 * i, 4, b4));
        u1 = vorrq_u8(u1, move_bits(bits, 2 * i + 1, 4, b4));
    }
    if constexpr (std::is_same_v<P, Q6K>) {   // high bit pairs -> 16, 32
        const uint8x16_t t = vld1q_u8(blk + high_pairs_at(c) + 16 * v), b45 = vdupq_n_u8(0x30);
        u0 = vorrq_u8(u0, move_bits(t, 4 * i, 4, b45));
        u1 = vorrq_u8(u1, move_bits(t, 4 * i + 2, 4, b45));
    }
    if constexpr (P::kBig) {   // IQ4_XS, IQ4_NL: indices -> the table's signed values
        const int8x16_t table = vld1q_s8(kIq4Values);
        w0 = vqtbl1q_s8(table, u0);
        w1 = vqtbl1q_s8(table, u1);
    } else {
        w0 = vreinterpretq_s8_u8(u0);
        w1 = vreinterpretq_s8_u8(u1);
    }
}
// 2-bit forms: chunk c -> w[q], its four k-quads.
template <class P>
inline void codes2(const uint8_t* blk, int64_t c, int v, int8x16_t* w) {
    using namespace G;
    const uint8x16_t low2 = vdupq_n_u8(0x03), b2 = vdupq_n_u8(0x04);
    const uint8x16_t raw = vld1q_u8(blk + chunk_at<P>(c) + 16 * v);
    uint8x16_t u[4] = {vandq_u8(raw, low2), vandq_u8(vshrq_n_u8(raw, 2), low2), vandq_u8(vshrq_n_u8(raw, 4), low2),
                       vshrq_n_u8(raw, 6)};
    if constexpr (std::is_same_v<P, Q3K>) {   // third bit -> 4
        const uint8x16_t t = vld1q_u8(blk + third_bits_at(c) + 16 * v);
        for (int q = 0; q < 4; ++q) u[q] = vorrq_u8(u[q], move_bits(t, int(4 * (c % 2)) + q, 2, b2));
    }
    for (int q = 0; q < 4; ++q) w[q] = vreinterpretq_s8_u8(u[q]);
}
// Q8_0: chunk c's q (the panel's u = q + 128, back by one EOR).
inline int8x16_t codes8(const uint8_t* blk, int64_t c, int v) {
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk + G::chunk_at<G::Q80>(c) + 16 * v), vdupq_n_u8(0x80)));
}

// ---- the scale epilogues, per activation row (the one-row and two-row kernels share them) ------

// Sub-block j's activations of one pass (int16 sums per 16 k).
template <class P>
inline int sub_sum(const int16_t* sums, int64_t k0, int j) {
    const int64_t g16 = (k0 + int64_t(j) * P::kSubK) / 16;
    return sums[g16] + (P::kSubK == 32 ? sums[g16 + 1] : 0);
}

// After sub-block j's exact dots dh, dl (channels 4v..4v+3): the 32-element types finish their block
// in f32, acc += s_a (/ 128) * (d * (dot - z * asum) + m * asum) (m: Q4_1's, Q5_1's); the K-quants add sc_j * dot_j (per pass, integers) into
// the block's ihi, ilo.
template <class P, bool kTwoPass>
inline void sub_block(const uint8_t* blk, int j, const ActRow& a, int64_t k0, const int32x4_t* dh, const int32x4_t* dl,
                      int32x4_t* ihi, int32x4_t* ilo, float32x4_t* acc) {
    using F = Form<P>;
    const int sh = sub_sum<P>(a.sums_hi, k0, j), sl = sub_sum<P>(a.sums_lo, k0, j), asum = kTwoPass ? 128 * sh + sl : sh;
    if constexpr (F::kFloatBlocks) {
        const float factor = a.scale[k0 >> a.scale_shift] * (kTwoPass ? 1.0f / 128.0f : 1.0f);
        for (int v = 0; v < 4; ++v) {
            const int32x4_t t = kTwoPass ? vaddq_s32(vshlq_n_s32(dh[v], 7), dl[v]) : dh[v];
            float32x4_t r = vcvtq_f32_s32(t);
            if constexpr (F::kZ32 != 0) r = vsubq_f32(r, vdupq_n_f32(float(F::kZ32) * float(asum)));
            float32x4_t w = vmulq_f32(f16x4(blk + P::kD + 8 * size_t(v)), r);
            if constexpr (G::kAddedMin<P>) w = vfmaq_n_f32(w, f16x4(blk + P::kDmin + 8 * size_t(v)), float(asum));
            acc[v] = vfmaq_n_f32(acc[v], w, factor);
        }
    } else if constexpr (F::kMin) {   // the m term at the block's end, when the dots' registers are free
        int32x4_t sc[4];
        const uint8x16_t bytes = vld1q_u8(blk + P::kSc + 16 * size_t(j));
        widen_u8(std::is_same_v<P, G::Q2K> ? vandq_u8(bytes, vdupq_n_u8(0x0f)) : bytes, sc);   // Q2_K's byte: sc | m << 4
        for (int v = 0; v < 4; ++v) {
            ihi[v] = vmlaq_s32(ihi[v], sc[v], dh[v]);
            if constexpr (kTwoPass) ilo[v] = vmlaq_s32(ilo[v], sc[v], dl[v]);
        }
    } else {   // signed int8 scales; Q6_K, Q3_K: the codes' offset z per pass
        int32x4_t sc[4];
        widen_s8(vld1q_s8(reinterpret_cast<const int8_t*>(blk + P::kSc + 16 * size_t(j))), sc);
        for (int v = 0; v < 4; ++v) {
            ihi[v] = vmlaq_s32(ihi[v], sc[v], F::kZ ? vsubq_s32(dh[v], vdupq_n_s32(F::kZ * sh)) : dh[v]);
            if constexpr (kTwoPass) ilo[v] = vmlaq_s32(ilo[v], sc[v], F::kZ ? vsubq_s32(dl[v], vdupq_n_s32(F::kZ * sl)) : dl[v]);
        }
    }
}

// The K-quants' block end: acc += s_a (/ 128) * (d * (128 ihi + ilo) - dmin * imin), imin = sum_j m_j * asum_j.
template <class P, bool kTwoPass>
inline void block_end(const uint8_t* blk, const ActRow& a, int64_t k0, const int32x4_t* ihi, const int32x4_t* ilo,
                      float32x4_t* acc) {
    using F = Form<P>;
    if constexpr (!F::kFloatBlocks) {
        const float factor = a.scale[k0 >> a.scale_shift] * (kTwoPass ? 1.0f / 128.0f : 1.0f);
        int32x4_t imin[4];
        for (int v = 0; v < 4; ++v) imin[v] = vdupq_n_s32(0);
        if constexpr (F::kMin)
            for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
                const int sh = sub_sum<P>(a.sums_hi, k0, j), asum = kTwoPass ? 128 * sh + sub_sum<P>(a.sums_lo, k0, j) : sh;
                int32x4_t mm[4];
                if constexpr (std::is_same_v<P, G::Q2K>)
                    widen_u8(vshrq_n_u8(vld1q_u8(blk + P::kSc + 16 * size_t(j)), 4), mm);
                else
                    widen_u8(vld1q_u8(blk + P::kM + 16 * size_t(j)), mm);
                for (int v = 0; v < 4; ++v) imin[v] = vmlaq_n_s32(imin[v], mm[v], asum);
            }
        for (int v = 0; v < 4; ++v) {
            const float32x4_t t = kTwoPass ? vfmaq_n_f32(vcvtq_f32_s32(ilo[v]), vcvtq_f32_s32(ihi[v]), 128.0f)
                                           : vcvtq_f32_s32(ihi[v]);
            constexpr bool f32_d = std::is_same_v<P, G::Q6K>;   // every other type keeps the file's f16 d
            const float32x4_t d = f32_d ? f32x4(blk + P::kD + 16 * size_t(v)) : f16x4(blk + P::kD + 8 * size_t(v));
            float32x4_t r = vmulq_f32(d, t);
            if constexpr (F::kMin) {
                const float32x4_t dmin = f16x4(blk + P::kDmin + 8 * size_t(v));
                r = vmlsq_f32(r, dmin, vcvtq_f32_s32(imin[v]));
            }
            acc[v] = vfmaq_n_f32(acc[v], r, factor);
        }
    }
}

// ---- the kernels ---------------------------------------------------------------------------
//
// Q4_0 and Q8_0 (one sub-block per 32-k block) finish each block in f32. The K-quants' sub-blocks
// (16 or 32 k) carry small integer scales, so their sums stay integers through the 256-k block,
// sc_j * dot_j per pass and m_j * sum_j added by `mla`, and are converted once per block: exact,
// and a quarter of the instructions of an f32 epilogue per sub-block (int32 bounds: |sc dot| summed
// over a block <= 1.4e8 for every type, the m term <= 2.7e8). Not inlined: one call per panel and
// row costs nothing beside a K-long loop, and keeps each type's kernel one symbol whose
// instructions docs/backends.md counts.

// The 16 channels' w . x of one panel for R activation rows (`sdot`, ARMv8.0: `smull`): one row, or
// two where the target has `sdot` but no I8MM (each chunk's codes decoded once for both rows, each
// row's sums and epilogues its own — bit-identical to one row at a time).
template <class P, bool kTwoPass, int R>
__attribute__((noinline)) void panel_dot(const uint8_t* panel, const ActRow* a, int64_t K, float (*out)[16]) {
    using F = Form<P>;
    float32x4_t acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        int32x4_t ihi[R][4], ilo[R][4];   // the block's integer sums (K-quants)
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < 4; ++v) ihi[r][v] = ilo[r][v] = vdupq_n_s32(0);
        for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
            int32x4_t dh[R][4], dl[R][4];
            for (int r = 0; r < R; ++r)
                for (int v = 0; v < 4; ++v) dh[r][v] = dl[r][v] = vdupq_n_s32(0);
            // The sub-block's activations, 16 k per register (one or two per pass), read by the dots'
            // indexed form: four registers where one broadcast per four k would take up to sixteen.
            const int64_t ks = k0 + int64_t(j) * P::kSubK;
            int8x16_t xh[R][2], xl[R][2];
            for (int r = 0; r < R; ++r)
                for (int h = 0; h < int(P::kSubK / 16); ++h) {
                    xh[r][h] = vld1q_s8(a[r].hi + ks + 16 * h);
                    if constexpr (kTwoPass) xl[r][h] = vld1q_s8(a[r].lo + ks + 16 * h);
                }
            // dots += channel group v's codes w for the four k from q on (q: from the sub-block's start)
            const auto quad = [&](int v, int q, int8x16_t w) {
                for (int r = 0; r < R; ++r) {
                    dh[r][v] = dot4_lane(dh[r][v], w, xh[r][q / 16], q % 16 / 4);
                    if constexpr (kTwoPass) dl[r][v] = dot4_lane(dl[r][v], w, xl[r][q / 16], q % 16 / 4);
                }
            };
#pragma GCC unroll 8
            for (int i = 0; i < F::kPerSub; ++i) {   // i = c % kPerSub: Q5_K's and Q6_K's bit positions
                const int64_t c = int64_t(j) * F::kPerSub + i;
                const int q = i * int(F::kChunkK);
                for (int v = 0; v < 4; ++v) {
                    if constexpr (P::kBits == 8) {
                        quad(v, q, codes8(blk, c, v));
                    } else if constexpr (P::kBits == 4) {
                        int8x16_t w0, w1;
                        codes4<P>(blk, c, i, v, w0, w1);
                        quad(v, q, w0);
                        quad(v, q + 4, w1);
                    } else {   // 2-bit codes: four k-quads per chunk
                        int8x16_t q4[4];
                        codes2<P>(blk, c, v, q4);
                        for (int n = 0; n < 4; ++n) quad(v, q + 4 * n, q4[n]);
                    }
                }
            }
            for (int r = 0; r < R; ++r) sub_block<P, kTwoPass>(blk, j, a[r], k0, dh[r], dl[r], ihi[r], ilo[r], acc[r]);
        }
        for (int r = 0; r < R; ++r) block_end<P, kTwoPass>(blk, a[r], k0, ihi[r], ilo[r], acc[r]);
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < 4; ++v) vst1q_f32(out[r] + 4 * v, acc[r][v]);
}

// ---- the grid types: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (ggml_panels.h's kGridForm) ----
// Per 8-k group each channel's 8 values are one grid row, loaded by its index (ggml_panels.h's
// group_row: scalar reads of the panel's index bytes and high bits), signed by the group's sign byte
// (signs16: 16 channels' at once, one `tbl` per channel pair; `cmtst` against each element's bit,
// `bsl` with the negation) or, for IQ1, its codes less the
// offset 9 (8 value +- 1: signed already, so `sdot` needs no offset term). Two channels' rows share a
// register, dotted with the group's 8 activations in both halves (each channel's two int32 lanes
// hold k 0..3 and 4..7). Each scale span's dots (16 or 32 k) times its odd integer scale 2 s + 1
// add into the block's int32 sums (|.| < 2^26), converted and multiplied by d * factor * s_a once
// per 256-k block — x86's lone-row form. One activation row at a time, on every target (NEON).
// The 16 channels' sign bytes of group l (byte i: channel i's): the file's bytes as stored (IQ2_S,
// IQ3_S: one `ld4` deinterleaves a sub-block's words into its four groups'), or the 7-bit sign
// indices completed with their parity bit, 16 channels at once (per channel through general
// registers, `cnt` and back, they were most of the loop's instructions).
template <class P>
inline uint8x16_t signs16(const uint8_t* sub, int l) {
    if constexpr (G::kSignBytes<P>) {
        return vld4q_u8(sub + P::kWords).val[l];
    } else {
        uint16x4_t half[4];
        for (int v = 0; v < 4; ++v)
            half[v] = vmovn_u32(vandq_u32(vshlq_u32(vld1q_u32(reinterpret_cast<const uint32_t*>(sub + P::kWords) + 4 * v),
                                                    vdupq_n_s32(-7 * l)),
                                          vdupq_n_u32(127)));
        const uint8x16_t s = vcombine_u8(vmovn_u16(vcombine_u16(half[0], half[1])), vmovn_u16(vcombine_u16(half[2], half[3])));
        return vorrq_u8(s, vshlq_n_u8(vandq_u8(vcntq_u8(s), vdupq_n_u8(1)), 7));
    }
}
// vqtbl1q_u8 controls spreading channel 2p's byte over bytes 0..7 and 2p + 1's over 8..15.
struct PairSpread {
    alignas(16) uint8_t byte[8][16];
};
constexpr PairSpread make_pair_spread() {
    PairSpread t{};
    for (int p = 0; p < 8; ++p)
        for (int i = 0; i < 16; ++i) t.byte[p][i] = uint8_t(2 * p + i / 8);
    return t;
}
constexpr PairSpread kPairSpread = make_pair_spread();

template <class P, bool kTwoPass>
__attribute__((noinline)) void grid_panel_dot(const uint8_t* panel, const ActRow& a, int64_t K, float* out) {
    const uint8x16_t bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));   // element t's bit
    float32x4_t acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        int32x4_t ihi[8], ilo[8], sh[8], sl[8];   // the block's sums; the scale span's dots (channels 2p, 2p + 1)
        for (int p = 0; p < 8; ++p) ihi[p] = ilo[p] = sh[p] = sl[p] = vdupq_n_s32(0);
        for (int j = 0; j < 8; ++j) {
            const uint8_t* sub = blk + P::kCodes + size_t(j) * P::kSubBytes;
            for (int l = 0; l < 4; ++l) {
                const int64_t at = k0 + 32 * j + 8 * l;
                int64_t x;
                std::memcpy(&x, a.hi + at, 8);
                const int8x16_t xh = vreinterpretq_s8_s64(vdupq_n_s64(x));
                int8x16_t xl = xh;
                if constexpr (kTwoPass) {
                    std::memcpy(&x, a.lo + at, 8);
                    xl = vreinterpretq_s8_s64(vdupq_n_s64(x));
                }
                uint8x16_t s16 = vdupq_n_u8(0);
                if constexpr (!G::kUnsignedGrid<P>) s16 = signs16<P>(sub, l);
#pragma GCC unroll 8
                for (int p = 0; p < 8; ++p) {
                    const int8x16_t row = vreinterpretq_s8_u8(
                        vcombine_u8(vcreate_u8(G::group_row<P>(sub, l, 2 * p)), vcreate_u8(G::group_row<P>(sub, l, 2 * p + 1))));
                    int8x16_t w;
                    if constexpr (G::kUnsignedGrid<P>) {
                        w = vsubq_s8(row, vdupq_n_s8(int8_t(P::kOffset)));
                    } else {
                        const uint8x16_t signs = vqtbl1q_u8(s16, vld1q_u8(kPairSpread.byte[p]));
                        w = vbslq_s8(vtstq_u8(signs, bits), vnegq_s8(row), row);
                    }
                    sh[p] = dot4(sh[p], w, xh);
                    if constexpr (kTwoPass) sl[p] = dot4(sl[p], w, xl);
                }
                if (G::kHalfScales<P> ? l % 2 == 1 : l == 3) {   // the span's end: times 2 s + 1 into the block's sums
                    alignas(16) int32_t odd[16];
                    for (int lane = 0; lane < 16; ++lane) odd[lane] = G::odd_scale<P>(blk, j, l / 2, lane);
                    for (int v = 0; v < 4; ++v) {
                        const int32x4_t o = vld1q_s32(odd + 4 * v);
                        const int32x4_t pair[2] = {vzip1q_s32(o, o), vzip2q_s32(o, o)};   // channel 2p's twice, 2p + 1's twice
                        for (int h = 0; h < 2; ++h) {
                            const int p = 2 * v + h;
                            ihi[p] = vmlaq_s32(ihi[p], sh[p], pair[h]);
                            if constexpr (kTwoPass) ilo[p] = vmlaq_s32(ilo[p], sl[p], pair[h]);
                            sh[p] = sl[p] = vdupq_n_s32(0);
                        }
                    }
                }
            }
        }
        const float sa = a.scale[k0 >> a.scale_shift] * G::kBlockFactor<P>;
        alignas(16) float d[16];
        for (int lane = 0; lane < 16; ++lane) d[lane] = G::grid_d<P>(blk, lane) * sa;
        for (int v = 0; v < 4; ++v) {   // each channel's two lanes added: channels 4v .. 4v + 3
            const float32x4_t f = vld1q_f32(d + 4 * v);
            acc[v] = vfmaq_f32(acc[v], vcvtq_f32_s32(vpaddq_s32(ihi[2 * v], ihi[2 * v + 1])), f);
            if constexpr (kTwoPass)
                acc[v] = vfmaq_f32(acc[v], vcvtq_f32_s32(vpaddq_s32(ilo[2 * v], ilo[2 * v + 1])), vmulq_n_f32(f, 1.0f / 128.0f));
        }
    }
    for (int v = 0; v < 4; ++v) vst1q_f32(out + 4 * v, acc[v]);
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// Two activation rows at once (prefill, I8MM): per sub-block, 8 consecutive k of a channel pair
// (two 4-k code vectors zipped: channel_pair0/1) against 8 k of both rows, one `smmla` per pair and
// pass — then the tiles are split into each row's dots and finished by the same epilogues as
// panel_dot's: the same integers, bit-identical outputs. A panel block's codes are decoded once for
// both rows.
template <class P, bool kTwoPass>
__attribute__((noinline)) void panel_dot_pair(const uint8_t* panel, const ActRow* a, int64_t K, float (*out)[16]) {
    using F = Form<P>;
    float32x4_t acc[2][4];
    for (int v = 0; v < 4; ++v) acc[0][v] = acc[1][v] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        int32x4_t ihi[2][4], ilo[2][4];
        for (int v = 0; v < 4; ++v) ihi[0][v] = ihi[1][v] = ilo[0][v] = ilo[1][v] = vdupq_n_s32(0);
        for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
            int32x4_t th[8], tl[8];   // tiles: channel pair t of group t / 2, rows 0 and 1
            for (int t = 0; t < 8; ++t) th[t] = tl[t] = vdupq_n_s32(0);
            // k from kq: w0[v] its first four, w1[v] the next four.
            const auto octet = [&](int64_t kq, const int8x16_t* w0, const int8x16_t* w1) {
                const int8x16_t xh = rows2x8(a[0].hi + kq, a[1].hi + kq);
                [[maybe_unused]] int8x16_t xl;
                if constexpr (kTwoPass) xl = rows2x8(a[0].lo + kq, a[1].lo + kq);
                for (int v = 0; v < 4; ++v) {
                    const int8x16_t p0 = channel_pair0(w0[v], w1[v]), p1 = channel_pair1(w0[v], w1[v]);
                    th[2 * v] = mmla(th[2 * v], xh, p0);
                    th[2 * v + 1] = mmla(th[2 * v + 1], xh, p1);
                    if constexpr (kTwoPass) {
                        tl[2 * v] = mmla(tl[2 * v], xl, p0);
                        tl[2 * v + 1] = mmla(tl[2 * v + 1], xl, p1);
                    }
                }
            };
            if constexpr (P::kBits == 8) {   // chunk pairs (c, c + 1): k 4c..4c+7
                for (int i = 0; i < F::kPerSub; i += 2) {
                    const int64_t c = int64_t(j) * F::kPerSub + i;
                    int8x16_t w0[4], w1[4];
                    for (int v = 0; v < 4; ++v) w0[v] = codes8(blk, c, v), w1[v] = codes8(blk, c + 1, v);
                    octet(k0 + c * F::kChunkK, w0, w1);
                }
            } else {
#pragma GCC unroll 8
                for (int i = 0; i < F::kPerSub; ++i) {
                    const int64_t c = int64_t(j) * F::kPerSub + i, kc = k0 + c * F::kChunkK;
                    if constexpr (P::kBits == 4) {   // a chunk's two quads are one octet
                        int8x16_t w0[4], w1[4];
                        for (int v = 0; v < 4; ++v) codes4<P>(blk, c, i, v, w0[v], w1[v]);
                        octet(kc, w0, w1);
                    } else {   // four quads: two octets
                        int8x16_t w[4][4], q4[4];
                        for (int v = 0; v < 4; ++v) {
                            codes2<P>(blk, c, v, q4);
                            for (int q = 0; q < 4; ++q) w[q][v] = q4[q];
                        }
                        octet(kc, w[0], w[1]);
                        octet(kc + 8, w[2], w[3]);
                    }
                }
            }
            int32x4_t dh[2][4], dl[2][4];
            untile(th, dh[0], dh[1]);
            untile(tl, dl[0], dl[1]);
            for (int r = 0; r < 2; ++r) sub_block<P, kTwoPass>(blk, j, a[r], k0, dh[r], dl[r], ihi[r], ilo[r], acc[r]);
        }
        for (int r = 0; r < 2; ++r) block_end<P, kTwoPass>(blk, a[r], k0, ihi[r], ilo[r], acc[r]);
    }
    for (int r = 0; r < 2; ++r)
        for (int v = 0; v < 4; ++v) vst1q_f32(out[r] + 4 * v, acc[r][v]);
}
#endif

#if defined(__ARM_FEATURE_SVE)
// ---- SVE kernels (sve.h: vectors of 256 bits and wider) -----------------------------------
//
// The NEON kernels above with a part of a chunk (8 or 16 channels) per vector where NEON has a
// channel group of 4: the same decoders, the same integer dots, the same epilogues in the same f32
// order — bit-identical outputs. Scale bytes and f16 scales load straight into 32-bit lanes
// (ld1ub / ld1sb / ld1uh: no widening steps), f16 converts from each lane's low half.
namespace vla {

template <int N> inline svuint8_t part(const uint8_t* chunk, int s) { return svld1(sve::bytes<N>(), chunk + s * sve::kBytes<N>); }
template <int N> inline svfloat32_t f16_part(const uint8_t* p, int s) {
    const svbool_t pw = sve::words<N>();
    return svcvt_f32_f16_x(pw, svreinterpret_f16(svld1uh_u32(pw, reinterpret_cast<const uint16_t*>(p) + s * sve::kLanes<N>)));
}
template <int N> inline svfloat32_t f32_part(const uint8_t* p, int s) {
    return svld1(sve::words<N>(), reinterpret_cast<const float*>(p) + s * sve::kLanes<N>);
}
template <int N> inline svint32_t u8_part(const uint8_t* p, int s) {   // 16 channels' bytes, zero-extended
    return svreinterpret_s32(svld1ub_u32(sve::words<N>(), p + s * sve::kLanes<N>));
}
template <int N> inline svint32_t s8_part(const uint8_t* p, int s) {
    return svld1sb_s32(sve::words<N>(), reinterpret_cast<const int8_t*>(p) + s * sve::kLanes<N>);
}
// move_bits above: bits from `from` to `to`, kept under mask.
template <int N> inline svuint8_t move_bits(svuint8_t v, int from, int to, uint8_t mask) {
    const svbool_t pb = sve::bytes<N>();
    return svand_n_u8_x(pb, to >= from ? svlsl_n_u8_x(pb, v, uint8_t(to - from)) : svlsr_n_u8_x(pb, v, uint8_t(from - to)), mask);
}

template <class P, int N>
inline void codes4(const uint8_t* blk, int64_t c, int i, int s, svint8_t& w0, svint8_t& w1) {
    using namespace G;
    const svbool_t pb = sve::bytes<N>();
    const svuint8_t raw = part<N>(blk + chunk_at<P>(c), s);
    svuint8_t u0 = svand_n_u8_x(pb, raw, 0x0f), u1 = svlsr_n_u8_x(pb, raw, 4);
    if constexpr (kFifthBits<P>) {
        const svuint8_t bits = part<N>(blk + fifth_bits_at<P>(c), s);
        u0 = svorr_x(pb, u0, move_bits<N>(bits, 2 * i, 4, 0x10));
        u1 = svorr_x(pb, u1, move_bits<N>(bits, 2 * i + 1, 4, 0x10));
    }
    if constexpr (std::is_same_v<P, Q6K>) {
        const svuint8_t t = part<N>(blk + high_pairs_at(c), s);
        u0 = svorr_x(pb, u0, move_bits<N>(t, 4 * i, 4, 0x30));
        u1 = svorr_x(pb, u1, move_bits<N>(t, 4 * i + 2, 4, 0x30));
    }
    if constexpr (P::kBig) {   // IQ4_XS, IQ4_NL: the 16-entry table in a vector's first 16 bytes
        const svint8_t table = svld1(svptrue_pat_b8(SV_VL16), kIq4Values);
        w0 = svtbl(table, u0);
        w1 = svtbl(table, u1);
    } else {
        w0 = svreinterpret_s8(u0);
        w1 = svreinterpret_s8(u1);
    }
}
template <class P, int N>
inline void codes2(const uint8_t* blk, int64_t c, int s, svint8_t& q0, svint8_t& q1, svint8_t& q2, svint8_t& q3) {
    using namespace G;
    const svbool_t pb = sve::bytes<N>();
    const svuint8_t raw = part<N>(blk + chunk_at<P>(c), s);
    svuint8_t u0 = svand_n_u8_x(pb, raw, 0x03), u1 = svand_n_u8_x(pb, svlsr_n_u8_x(pb, raw, 2), 0x03);
    svuint8_t u2 = svand_n_u8_x(pb, svlsr_n_u8_x(pb, raw, 4), 0x03), u3 = svlsr_n_u8_x(pb, raw, 6);
    if constexpr (std::is_same_v<P, Q3K>) {
        const svuint8_t t = part<N>(blk + third_bits_at(c), s);
        const int at = int(4 * (c % 2));
        u0 = svorr_x(pb, u0, move_bits<N>(t, at, 2, 0x04));
        u1 = svorr_x(pb, u1, move_bits<N>(t, at + 1, 2, 0x04));
        u2 = svorr_x(pb, u2, move_bits<N>(t, at + 2, 2, 0x04));
        u3 = svorr_x(pb, u3, move_bits<N>(t, at + 3, 2, 0x04));
    }
    q0 = svreinterpret_s8(u0), q1 = svreinterpret_s8(u1), q2 = svreinterpret_s8(u2), q3 = svreinterpret_s8(u3);
}
template <int N> inline svint8_t codes8(const uint8_t* blk, int64_t c, int s) {
    return svreinterpret_s8(sveor_n_u8_x(sve::bytes<N>(), part<N>(blk + G::chunk_at<G::Q80>(c), s), 0x80));
}

// sub_block above, for part s.
template <class P, bool kTwoPass, int N>
inline void sub_block(const uint8_t* blk, int j, const ActRow& a, int64_t k0, int s, svint32_t dh, svint32_t dl, svint32_t& ihi,
                      svint32_t& ilo, svfloat32_t& acc) {
    using F = Form<P>;
    const svbool_t pw = sve::words<N>();
    const int sh = sub_sum<P>(a.sums_hi, k0, j), sl = sub_sum<P>(a.sums_lo, k0, j), asum = kTwoPass ? 128 * sh + sl : sh;
    if constexpr (F::kFloatBlocks) {
        const float factor = a.scale[k0 >> a.scale_shift] * (kTwoPass ? 1.0f / 128.0f : 1.0f);
        svfloat32_t r = svcvt_f32_x(pw, kTwoPass ? svadd_x(pw, svlsl_n_s32_x(pw, dh, 7), dl) : dh);
        if constexpr (F::kZ32 != 0) r = svsub_n_f32_x(pw, r, float(F::kZ32) * float(asum));
        svfloat32_t w = svmul_x(pw, f16_part<N>(blk + P::kD, s), r);
        if constexpr (G::kAddedMin<P>) w = svmla_n_f32_x(pw, w, f16_part<N>(blk + P::kDmin, s), float(asum));
        acc = svmla_n_f32_x(pw, acc, w, factor);
    } else if constexpr (F::kMin) {
        svint32_t sc = u8_part<N>(blk + P::kSc + 16 * size_t(j), s);
        if constexpr (std::is_same_v<P, G::Q2K>) sc = svand_n_s32_x(pw, sc, 0x0f);
        ihi = svmla_x(pw, ihi, sc, dh);
        if constexpr (kTwoPass) ilo = svmla_x(pw, ilo, sc, dl);
    } else {
        const svint32_t sc = s8_part<N>(blk + P::kSc + 16 * size_t(j), s);
        ihi = svmla_x(pw, ihi, sc, F::kZ ? svsub_n_s32_x(pw, dh, F::kZ * sh) : dh);
        if constexpr (kTwoPass) ilo = svmla_x(pw, ilo, sc, F::kZ ? svsub_n_s32_x(pw, dl, F::kZ * sl) : dl);
    }
}

// block_end above, for part s.
template <class P, bool kTwoPass, int N>
inline void block_end(const uint8_t* blk, const ActRow& a, int64_t k0, int s, svint32_t ihi, svint32_t ilo, svfloat32_t& acc) {
    using F = Form<P>;
    if constexpr (!F::kFloatBlocks) {
        const svbool_t pw = sve::words<N>();
        const float factor = a.scale[k0 >> a.scale_shift] * (kTwoPass ? 1.0f / 128.0f : 1.0f);
        svint32_t imin = svdup_n_s32(0);
        if constexpr (F::kMin)
            for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
                const int sh = sub_sum<P>(a.sums_hi, k0, j), asum = kTwoPass ? 128 * sh + sub_sum<P>(a.sums_lo, k0, j) : sh;
                svint32_t mm;
                if constexpr (std::is_same_v<P, G::Q2K>)   // Q2_K's byte: sc | m << 4
                    mm = svasr_n_s32_x(pw, u8_part<N>(blk + P::kSc + 16 * size_t(j), s), 4);
                else
                    mm = u8_part<N>(blk + P::kM + 16 * size_t(j), s);
                imin = svmla_n_s32_x(pw, imin, mm, asum);
            }
        const svfloat32_t t = kTwoPass ? svmla_n_f32_x(pw, svcvt_f32_x(pw, ilo), svcvt_f32_x(pw, ihi), 128.0f) : svcvt_f32_x(pw, ihi);
        constexpr bool f32_d = std::is_same_v<P, G::Q6K>;   // every other type keeps the file's f16 d
        svfloat32_t r = svmul_x(pw, f32_d ? f32_part<N>(blk + P::kD, s) : f16_part<N>(blk + P::kD, s), t);
        if constexpr (F::kMin) {
            const svfloat32_t dmin = f16_part<N>(blk + P::kDmin, s);
            r = svsub_x(pw, r, svmul_x(pw, dmin, svcvt_f32_x(pw, imin)));   // NEON's vmlsq: a multiply, then a subtract
        }
        acc = svmla_n_f32_x(pw, acc, r, factor);
    }
}

// panel_dot above.
template <class P, bool kTwoPass, int N>
__attribute__((noinline)) void panel_dot(const uint8_t* panel, const ActRow& a, int64_t K, float out[16]) {
    using F = Form<P>;
    svfloat32_t acc0 = svdup_n_f32(0.0f), acc1 = acc0;
    for (int64_t b = 0; b < K / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        svint32_t ihi0 = svdup_n_s32(0), ihi1 = ihi0, ilo0 = ihi0, ilo1 = ihi0;
        for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
            svint32_t dh0 = svdup_n_s32(0), dh1 = dh0, dl0 = dh0, dl1 = dh0;
            // part s's sums += its codes w against the four k from kq on
            // The sub-block's activations, 16 k in every 128-bit segment (`ld1rq`), read by the
            // indexed `sdot`: one load per 16 k and pass instead of one broadcast per four k.
            const int64_t ks = k0 + int64_t(j) * P::kSubK;
            const svbool_t all = svptrue_b8();
            const svint8_t xh0 = svld1rq(all, a.hi + ks), xh1 = P::kSubK > 16 ? svld1rq(all, a.hi + ks + 16) : xh0;
            const svint8_t xl0 = kTwoPass ? svld1rq(all, a.lo + ks) : xh0;
            const svint8_t xl1 = kTwoPass && P::kSubK > 16 ? svld1rq(all, a.lo + ks + 16) : xl0;
            const auto quad = [&](auto s, int64_t kq, svint8_t w) {
                svint32_t &dh = sve::pick<s>(dh0, dh1), &dl = sve::pick<s>(dl0, dl1);
                const int q = int(kq - ks);
                dh = sve::dot_lane(dh, w, q < 16 ? xh0 : xh1, q % 16 / 4);
                if constexpr (kTwoPass) dl = sve::dot_lane(dl, w, q < 16 ? xl0 : xl1, q % 16 / 4);
            };
#pragma GCC unroll 8
            for (int i = 0; i < F::kPerSub; ++i) {
                const int64_t c = int64_t(j) * F::kPerSub + i, kc = k0 + c * F::kChunkK;
                sve::for_parts<N>([&](auto s) {
                    if constexpr (P::kBits == 8) {
                        quad(s, kc, codes8<N>(blk, c, s));
                    } else if constexpr (P::kBits == 4) {
                        svint8_t w0, w1;
                        codes4<P, N>(blk, c, i, s, w0, w1);
                        quad(s, kc, w0);
                        quad(s, kc + 4, w1);
                    } else {
                        svint8_t q0, q1, q2, q3;
                        codes2<P, N>(blk, c, s, q0, q1, q2, q3);
                        quad(s, kc, q0);
                        quad(s, kc + 4, q1);
                        quad(s, kc + 8, q2);
                        quad(s, kc + 12, q3);
                    }
                });
            }
            sve::for_parts<N>([&](auto s) {
                sub_block<P, kTwoPass, N>(blk, j, a, k0, s, sve::pick<s>(dh0, dh1), sve::pick<s>(dl0, dl1), sve::pick<s>(ihi0, ihi1),
                                          sve::pick<s>(ilo0, ilo1), sve::pick<s>(acc0, acc1));
            });
        }
        sve::for_parts<N>([&](auto s) {
            block_end<P, kTwoPass, N>(blk, a, k0, s, sve::pick<s>(ihi0, ihi1), sve::pick<s>(ilo0, ilo1), sve::pick<s>(acc0, acc1));
        });
    }
    sve::for_parts<N>([&](auto s) { svst1(sve::words<N>(), out + s * sve::kLanes<N>, sve::pick<s>(acc0, acc1)); });
}

#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
// panel_dot_pair above: two rows through SVE's `smmla`, part s's 8 k of each channel pair zipped from
// two 4-k code vectors (mmla_part), the tiles split back per part into each row's dots.
template <class P, bool kTwoPass, int N>
__attribute__((noinline)) void panel_dot_pair(const uint8_t* panel, const ActRow* a, int64_t K, float (*out)[16]) {
    using F = Form<P>;
    const svint32_t zero = svdup_n_s32(0);
    svfloat32_t acc00 = svdup_n_f32(0.0f), acc01 = acc00, acc10 = acc00, acc11 = acc00;   // row, part
    for (int64_t b = 0; b < K / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        svint32_t ih00 = zero, ih01 = zero, ih10 = zero, ih11 = zero, il00 = zero, il01 = zero, il10 = zero, il11 = zero;
        for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
            svint32_t ha0 = zero, ha1 = zero, hb0 = zero, hb1 = zero, la0 = zero, la1 = zero, lb0 = zero, lb1 = zero;
            // part s: w0 the first four of 8 k from kq, w1 the next four
            const auto octet = [&](auto s, int64_t kq, svint8_t w0, svint8_t w1) {
                const svint8_t xh = svreinterpret_s8(sve::rows2(a[0].hi + kq, a[1].hi + kq));
                const svint8_t xl = kTwoPass ? svreinterpret_s8(sve::rows2(a[0].lo + kq, a[1].lo + kq)) : svdup_n_s8(0);
                mmla_part(svreinterpret_s32(w0), svreinterpret_s32(w1), xh, xl, sve::pick<s>(ha0, ha1), sve::pick<s>(hb0, hb1),
                          sve::pick<s>(la0, la1), sve::pick<s>(lb0, lb1));
            };
            if constexpr (P::kBits == 8) {   // chunk pairs (c, c + 1): k 4c..4c+7
                for (int i = 0; i < F::kPerSub; i += 2) {
                    const int64_t c = int64_t(j) * F::kPerSub + i;
                    sve::for_parts<N>([&](auto s) { octet(s, k0 + c * F::kChunkK, codes8<N>(blk, c, s), codes8<N>(blk, c + 1, s)); });
                }
            } else {
#pragma GCC unroll 8
                for (int i = 0; i < F::kPerSub; ++i) {
                    const int64_t c = int64_t(j) * F::kPerSub + i, kc = k0 + c * F::kChunkK;
                    sve::for_parts<N>([&](auto s) {
                        if constexpr (P::kBits == 4) {
                            svint8_t w0, w1;
                            codes4<P, N>(blk, c, i, s, w0, w1);
                            octet(s, kc, w0, w1);
                        } else {
                            svint8_t q0, q1, q2, q3;
                            codes2<P, N>(blk, c, s, q0, q1, q2, q3);
                            octet(s, kc, q0, q1);
                            octet(s, kc + 8, q2, q3);
                        }
                    });
                }
            }
            sve::for_parts<N>([&](auto s) {
                const svint32_t ha = sve::pick<s>(ha0, ha1), hb = sve::pick<s>(hb0, hb1);
                const svint32_t la = sve::pick<s>(la0, la1), lb = sve::pick<s>(lb0, lb1);
                sub_block<P, kTwoPass, N>(blk, j, a[0], k0, s, sve::row0(ha, hb), sve::row0(la, lb), sve::pick<s>(ih00, ih01),
                                          sve::pick<s>(il00, il01), sve::pick<s>(acc00, acc01));
                sub_block<P, kTwoPass, N>(blk, j, a[1], k0, s, sve::row1(ha, hb), sve::row1(la, lb), sve::pick<s>(ih10, ih11),
                                          sve::pick<s>(il10, il11), sve::pick<s>(acc10, acc11));
            });
        }
        sve::for_parts<N>([&](auto s) {
            block_end<P, kTwoPass, N>(blk, a[0], k0, s, sve::pick<s>(ih00, ih01), sve::pick<s>(il00, il01), sve::pick<s>(acc00, acc01));
            block_end<P, kTwoPass, N>(blk, a[1], k0, s, sve::pick<s>(ih10, ih11), sve::pick<s>(il10, il11), sve::pick<s>(acc10, acc11));
        });
    }
    sve::for_parts<N>([&](auto s) {
        svst1(sve::words<N>(), out[0] + s * sve::kLanes<N>, sve::pick<s>(acc00, acc01));
        svst1(sve::words<N>(), out[1] + s * sve::kLanes<N>, sve::pick<s>(acc10, acc11));
    });
}
#endif

// Panel `panel` of type P against `nr` activation rows, N parts per chunk.
template <class P, int N>
inline void panel_rows(const uint8_t* panel, const ActRow* a, int nr, bool two_pass, int64_t K, float (*out)[16]) {
#if defined(__ARM_FEATURE_SVE_MATMUL_INT8)
    if (nr == 2) {
        two_pass ? panel_dot_pair<P, true, N>(panel, a, K, out) : panel_dot_pair<P, false, N>(panel, a, K, out);
        return;
    }
#endif
    for (int r = 0; r < nr; ++r)
        two_pass ? panel_dot<P, true, N>(panel, a[r], K, out[r]) : panel_dot<P, false, N>(panel, a[r], K, out[r]);
}

}  // namespace vla
#endif

// Panel p of matrix m against `nr` activation rows (two: the pair kernel, where the target has one):
// the SVE kernels where vectors are 256 bits or wider, the NEON ones elsewhere.
inline void matrix_dot(const G::Matrix& m, const uint8_t* expert, int64_t p, const ActRow* a, int nr, bool two_pass,
                       float (*out)[16]) {
    const uint8_t* panel = expert + m.offset + size_t(p) * m.panel_bytes;
    G::with_panels(m.type->dtype, [&](auto form) {
        using P = decltype(form);
        if constexpr (G::kGridForm<P>) {
            for (int r = 0; r < nr; ++r)
                two_pass ? grid_panel_dot<P, true>(panel, a[r], m.cols, out[r]) : grid_panel_dot<P, false>(panel, a[r], m.cols, out[r]);
        } else {
            ActRow one[2];   // (nr <= 2) the 32-element types in one pass: llama.cpp's Q8_0 activations, a scale per 32 k
            const ActRow* ar = a;
            if (!two_pass && P::kBlockK == 32) {
                for (int r = 0; r < nr; ++r) one[r] = per32_row(a[r], m.cols);
                ar = one;
            }
#if defined(__ARM_FEATURE_SVE)
            if (sve::with_parts([&]<int N>() { vla::panel_rows<P, N>(panel, ar, nr, two_pass, m.cols, out); })) return;
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8)
            if (nr == 2) {
                two_pass ? panel_dot_pair<P, true>(panel, ar, m.cols, out) : panel_dot_pair<P, false>(panel, ar, m.cols, out);
                return;
            }
#elif defined(__ARM_FEATURE_DOTPROD)
            if (nr == 2 && !std::is_same_v<P, G::Q40>) {   // Q4_0's pair counted 24.8 against 23.1 per row
                two_pass ? panel_dot<P, true, 2>(panel, ar, m.cols, out) : panel_dot<P, false, 2>(panel, ar, m.cols, out);
                return;
            }
#endif
            for (int r = 0; r < nr; ++r)
                two_pass ? panel_dot<P, true, 1>(panel, ar + r, m.cols, out + r) : panel_dot<P, false, 1>(panel, ar + r, m.cols, out + r);
        }
    });
}

// ---- layout, packer, tiles ---------------------------------------------------------------

G::Expert layout(const kt_moe_config* c) { return G::expert(c); }
size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes; }

kt_status check_config(const kt_moe_config* c) {
    kt_status code;
    const std::string why = G::check_config(c, &code);
    return why.empty() ? KT_OK : fail(code, "%s", why.c_str());
}

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    kt_status code;
    const std::string why = G::pack_expert(c, src, dst, &code);
    return why.empty() ? KT_OK : fail(code, "%s", why.c_str());
}

kt_status check_range(const char* which, int64_t n0, int64_t n1, int64_t n) {
    if (0 <= n0 && n0 % kPanel == 0 && n0 < n1 && n1 <= n) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, "kml LLAMAFILE %s tile [%lld, %lld) does not start on a panel inside [0, %lld)",
                which, (long long)n0, (long long)n1, (long long)n);
}

bool two_pass(const kt_moe_config* c) { return (c->quant_flags & KT_QUANT_FAST_ACTIVATIONS) == 0; }

// Activation rows per panel pass: two where the target has I8MM (smmla) or the dot product, else one.
#if defined(__ARM_FEATURE_DOTPROD)
constexpr int kRowsAtOnce = 2;
#else
constexpr int kRowsAtOnce = kMmla ? 2 : 1;
#endif

// put(row, column, gate, up) for every activation row and column in [n0, n1), kRowsAtOnce rows per pass.
template <class Put>
kt_status gate_up_walk(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       Put put) {
    const G::Expert l = layout(c);
    if (!l.ok) return check_config(c);
    if (const kt_status st = check_range("gate/up", n0, n1, c->intermediate)) return st;
    const auto* base = static_cast<const uint8_t*>(packed);
    for (int64_t p = n0 / kPanel; p * kPanel < n1; ++p)
        for (int64_t m = 0; m < rows; m += kRowsAtOnce) {
            const int nr = int(std::min<int64_t>(kRowsAtOnce, rows - m));
            ActRow a[kRowsAtOnce];
            for (int r = 0; r < nr; ++r)
                a[r] = act_row(static_cast<const uint8_t*>(act) + size_t(m + r) * act_bytes(c->hidden), c->hidden);
            float g[kRowsAtOnce][16], u[kRowsAtOnce][16];
            matrix_dot(l.m[0], base, p, a, nr, two_pass(c), g);
            matrix_dot(l.m[1], base, p, a, nr, two_pass(c), u);
            for (int r = 0; r < nr; ++r)
                for (int lane = 0; lane < kPanel && p * kPanel + lane < n1; ++lane)
                    put(m + r, p * kPanel + lane, g[r][lane], u[r][lane]);
        }
    return KT_OK;
}

kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    const Gate gate(c);
    return gate_up_walk(c, packed, act, rows, n0, n1,
                        [&](int64_t m, int64_t n, float g, float u) { out[m * ldo + n] = gate(g, u); });
}

// Plugin ABI 1.4's raw tile: both products, column n at n - n0 (common.h's gate_up_raw_panels).
kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    return gate_up_walk(c, packed, act, rows, n0, n1, [&](int64_t m, int64_t n, float g, float u) {
        out_gate[m * ldo + n - n0] = g;
        out_up[m * ldo + n - n0] = u;
    });
}

kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    const G::Expert l = layout(c);
    if (!l.ok) return check_config(c);
    if (const kt_status st = check_range("down", n0, n1, c->hidden)) return st;
    const auto* base = static_cast<const uint8_t*>(packed);
    for (int64_t p = n0 / kPanel; p * kPanel < n1; ++p)
        for (int64_t m = 0; m < rows; m += kRowsAtOnce) {
            const int nr = int(std::min<int64_t>(kRowsAtOnce, rows - m));
            ActRow a[kRowsAtOnce];
            for (int r = 0; r < nr; ++r)
                a[r] = act_row(static_cast<const uint8_t*>(act) + size_t(m + r) * act_bytes(c->intermediate), c->intermediate);
            float s[kRowsAtOnce][16];
            matrix_dot(l.m[2], base, p, a, nr, two_pass(c), s);
            for (int r = 0; r < nr; ++r)
                for (int lane = 0; lane < kPanel && p * kPanel + lane < n1; ++lane) out[(m + r) * ldo + p * kPanel + lane] = s[r][lane];
        }
    return KT_OK;
}

}  // namespace

kt_method_kernels llamafile_kernels(const char* kernel_id) {
    return method_table("LLAMAFILE", G::kId, kernel_id, packed_bytes, pack, act_bytes, quantize, gate_up, down, gate_up_raw);
}

}  // namespace KT_TARGET_NAMESPACE
