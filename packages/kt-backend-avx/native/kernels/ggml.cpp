// LLAMAFILE experts: GGUF's ggml blocks, run as the file stores them (docs/formats.md).
//
// Packed layout "kt-ggml-v8", kt-core's public definition (kt/formats/ggml_panels.h: the panel
// forms of every type, the checks and the packer, shared with kt-backend-kml): each type's codes
// and scales regrouped into panels of 16 output channels, so the one outer-product kernel below
// runs them all, decode and prefill.
//
// Activations ("ggml-act-v2"): per group of 256 k (the last one may be shorter), one f32
// scale s_a = max|x| / 127; two int8 planes, x ~= s_a * (hi + lo / 128) (the second pass
// keeps the activation error ~1e-3 of the output RMS; KT_QUANT_FAST_ACTIVATIONS skips it, as
// llama.cpp's single Q8_K pass does); int16 sums of each plane per 16 k for the mn term.
// Layout: hi[K], lo[K], sums_hi[K/16], sums_lo[K/16] (int16), scale[ceil(K/256)] (f32).
// Then the one-pass plane of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), llama.cpp's
// Q8_0 activations (its Q8_1's values):
// per 32 k, q = x * 127 / max|x| rounded to nearest even, scale f16(max|x| / 127) held as f32;
// hi32[K], sums32[K/16], scale32[K/32].
// vpmaddubsw cannot saturate: |code| <= 63 (or |value| <= 128 with the sign moved onto the
// activation) times |activation| <= 127, two products per int16.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <kt/formats/ggml_panels.h>

#include "int_dot.h"
#include "methods.h"

namespace KT_TARGET_NAMESPACE {
namespace {

namespace G = kt::layouts::ggml;

constexpr int64_t kQK = 256;   // activation scale group; every block fits one (32 | 256)

// ---- activations --------------------------------------------------------------------------

// A row: the two int8 planes hi and lo (x ~ s (hi + lo / 128) per kQK group), their sums per
// 16, the group scales; on AVX2 also the planes joined into one int16 plane, 128 hi + lo
// (|.| <= 16320), which the signed 8-bit types multiply with vpmaddwd (kPlane16).
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr bool kPlane16 = true;
#else
constexpr bool kPlane16 = false;
#endif
int64_t act_groups(int64_t k) { return (k + kQK - 1) / kQK; }
size_t plane16_at(int64_t k) { return size_t(round_up(2 * k + k / 4 + 4 * act_groups(k), 64)); }
size_t per32_at(int64_t k) { return kPlane16 ? plane16_at(k) + size_t(round_up(2 * k, 64)) : plane16_at(k); }
size_t act_row_bytes(int64_t k) { return per32_at(k) + size_t(round_up(k + k / 8 + k / 8, 64)); }

struct ActRow {
    const int8_t* hi;
    const int8_t* lo;
    const int16_t* sums_hi;
    const int16_t* sums_lo;
    const float* scale;
    const int16_t* joined;   // kPlane16 only
};
// kPer32: the Q8_0-like plane in hi, sums_hi and scale (one pass only: lo stays the 256-k one).
template <bool kPer32 = false>
inline ActRow act_row(const uint8_t* row, int64_t k) {
    if constexpr (kPer32) {
        const uint8_t* p = row + per32_at(k);
        return {reinterpret_cast<const int8_t*>(p), reinterpret_cast<const int8_t*>(row + k),
                reinterpret_cast<const int16_t*>(p + k), nullptr, reinterpret_cast<const float*>(p + k + k / 8), nullptr};
    }
    const auto* sums = reinterpret_cast<const int16_t*>(row + 2 * k);
    return {reinterpret_cast<const int8_t*>(row), reinterpret_cast<const int8_t*>(row + k), sums, sums + k / 16,
            reinterpret_cast<const float*>(row + 2 * k + k / 4), reinterpret_cast<const int16_t*>(row + plane16_at(k))};
}

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (!is_float(dtype)) return fail(KT_ERROR_INVALID_ARGUMENT, "activations must be floating point, got %s", dtype_name(dtype));
    if (k % 32) return fail(KT_ERROR_INVALID_ARGUMENT, "LLAMAFILE: activation length %lld is not a multiple of 32", (long long)k);
    alignas(64) float x[kQK];
    for (int64_t r = 0; r < rows; ++r) {
        auto* base = static_cast<uint8_t*>(out) + size_t(r) * act_row_bytes(k);
        auto* hi = reinterpret_cast<int8_t*>(base);
        int8_t* lo = hi + k;
        auto* sums_hi = reinterpret_cast<int16_t*>(base + 2 * k);
        int16_t* sums_lo = sums_hi + k / 16;
        auto* scale = reinterpret_cast<float*>(base + 2 * k + k / 4);
        const size_t elem = dtype == KT_DTYPE_F64 ? 8 : dtype == KT_DTYPE_F32 ? 4 : 2;
        for (int64_t g = 0; g < act_groups(k); ++g) {
            const int64_t k0 = g * kQK, n = std::min(kQK, k - k0);
            kt_matrix m{static_cast<const char*>(in) + size_t(k0) * elem, dtype, r + 1, n, stride};
            load_row(m, r, x);
            bool nan = false;
            const float amax = row_amax(x, n, nan);
            // A NaN makes the group's scale NaN (and its codes 0), so the token's output shows it.
            scale[g] = nan ? NAN : amax / 127.0f;
            const float inv = !nan && amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
            // Vectors: a libm rounding call per element cost a third of a decode step (measured).
            const VF vinv = vset1(inv), s128 = vset1(128.0f), lo_max = vset1(64.0f), lo_min = vset1(-64.0f);
            for (int64_t i = 0; i < n; i += kLanes) {   // n is a multiple of 32
                const VF v = vmul(vload(x + i), vinv);
                const VF h = vroundint(v);
                store_i8(hi + k0 + i, h);
                store_i8(lo + k0 + i, vmax(lo_min, vmin(lo_max, vroundint(vmul(vsub(v, h), s128)))));
            }
            for (int64_t j = k0 / 16; j < (k0 + n) / 16; ++j) {
                int sh = 0, sl = 0;
                for (int i = 0; i < 16; ++i) {
                    sh += hi[16 * j + i];
                    sl += lo[16 * j + i];
                }
                sums_hi[j] = int16_t(sh);
                sums_lo[j] = int16_t(sl);
            }
            // The Q8_0-like plane, as ggml's x86 quantize_row_q8_0 makes it: 127 / max|x| as the
            // multiplier, the scale rounded to f16 (llama.cpp stores it so and multiplies by that).
            auto* p32 = base + per32_at(k);
            auto* hi32 = reinterpret_cast<int8_t*>(p32);
            auto* sums32 = reinterpret_cast<int16_t*>(p32 + k);
            auto* scale32 = reinterpret_cast<float*>(p32 + k + k / 8);
            for (int64_t b = 0; b < n; b += 32) {
                bool nan32 = false;
                const float amax32 = row_amax(x + b, 32, nan32);
                scale32[(k0 + b) / 32] = nan32 ? NAN : _cvtsh_ss(_cvtss_sh(amax32 / 127.0f, _MM_FROUND_TO_NEAREST_INT));
                const VF vinv = vset1(!nan32 && amax32 > 0.0f && std::isfinite(amax32) ? 127.0f / amax32 : 0.0f);
                for (int64_t i = 0; i < 32; i += kLanes) store_i8(hi32 + k0 + b + i, vroundint(vmul(vload(x + b + i), vinv)));
                for (int64_t j = (k0 + b) / 16; j < (k0 + b + 32) / 16; ++j) {
                    int sh = 0;
                    for (int i = 0; i < 16; ++i) sh += hi32[16 * j + i];
                    sums32[j] = int16_t(sh);
                }
            }
        }
        if constexpr (kPlane16) {
            auto* joined = reinterpret_cast<int16_t*>(base + plane16_at(k));
            for (int64_t i = 0; i < k; ++i) joined[i] = int16_t(128 * hi[i] + lo[i]);
        }
    }
    return KT_OK;
}

// ---- panels of 16 channels ------------------------------------------------------------------
//
// Per 16 output channels side by side and per sub-block, exact integer dots of the unsigned
// codes with both activation planes (vpdpbusd; AVX2: vpmaddubsw), then
//   acc += s_a * (s * dot - s*z * sum(activations of the sub-block)),
// on the panel forms of kt/formats/ggml_panels.h.
namespace ggml_panels {

using namespace G;   // the panel forms (Q4K, Q80, ...), chunk_at, kChunkBytes

// Q5K: bit `bit` of each byte of `bits` moved to bit 4 (16), others cleared. 16-bit shifts by at
// most 4 cannot carry a neighbouring byte's bit into bit 4.
template <int kBit>
inline VI fifth_bit(VI bits) {
    VI v = bits;
    if constexpr (kBit < 4) v = vslli16<4 - kBit>(bits);
    if constexpr (kBit > 4) v = vsrl16<kBit - 4>(bits);
    return vand(v, vset1i(0x10101010));
}

// kLanes bytes -> f32 of their low (kHigh: high) nibbles.
template <bool kHigh>
inline VF widen_nibble(const uint8_t* p) {
#if defined(__AVX512F__)
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    v = kHigh ? _mm512_srli_epi32(v, 4) : _mm512_and_si512(v, _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(v);
#else
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    v = kHigh ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
#endif
}

// kLanes f16 -> f32 (F16C: every target has it).
inline VF widen_f16(const uint8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}

// kLanes i8 -> f32.
inline VF widen_i8(const uint8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
}

// kLanes i8 -> i32.
inline VI widen_i8_i32(const uint8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#endif
}

inline VI vmullo(VI a, VI b) {
#if defined(__AVX512F__)
    return _mm512_mullo_epi32(a, b);
#else
    return _mm256_mullo_epi32(a, b);
#endif
}

// kLanes u8 -> i32, -> f32.
inline VI widen_u8_i32(const uint8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#endif
}
inline VF widen_u8(const uint8_t* p) { return vcvt(widen_u8_i32(p)); }


// 8-bit codes: VNNI's vpdpbusd takes u = q + 128 as they are (the 128 * sum term removes the
// offset); vpmaddubsw would saturate its int16 pair sums on them (2 * 255 * 127), so the other
// targets take q back and multiply |q| (<= 128 as u8, even for a stored -128) by the
// activation with q's sign (|a| <= 127): pair sums stay within int16.
#if defined(__AVX512VNNI__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
template <bool kBig>
inline VI dot8(VI acc, VI wu, VI w, VI a) {
    if constexpr (kVnni || !kBig) return dot_u8s8(acc, wu, a);
    return dot_u8s8(acc, wu, sign_i8(a, w));
}
#if defined(__AVX512F__)
inline VI vxor(VI a, VI b) { return _mm512_xor_si512(a, b); }
inline VI vor(VI a, VI b) { return _mm512_or_si512(a, b); }
#else
inline VI vxor(VI a, VI b) { return _mm256_xor_si256(a, b); }
inline VI vor(VI a, VI b) { return _mm256_or_si256(a, b); }
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
// kPlane16 (AVX2): 32 signed int8 weights (8 channels x a k-quad, lane-major) as two int16
// vectors (channels 0-3, 4-7), widened once per row block.
struct Wide16 {
    __m256i lo, hi;
};
inline Wide16 widen16(__m256i w) {
    return {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1))};
}
// acc += each channel's four-product dot of the widened weights with the quad a[0..3] of the joined
// plane (exact: |w a| pair sums < 2^22). vpmaddwd leaves two half-sums per channel and vphaddd
// adds them, leaving the lanes as channels 0 1 4 5 2 3 6 7 (plane16_order puts them back).
inline __m256i dot16(__m256i acc, const Wide16& w, const int16_t* a) {
    int64_t quad;
    std::memcpy(&quad, a, 8);
    const __m256i x = _mm256_set1_epi64x(quad);
    return _mm256_add_epi32(acc, _mm256_hadd_epi32(_mm256_madd_epi16(w.lo, x), _mm256_madd_epi16(w.hi, x)));
}
inline __m256i plane16_order(__m256i acc) { return _mm256_permute4x64_epi64(acc, 0xD8); }
#endif

// The largest unsigned code u a type's kernel multiplies (the 8-bit types: 255).
template <class P>
constexpr int max_code() {
    if constexpr (std::is_same_v<P, Q3K>) return 7;
    if constexpr (P::kBits == 2) return 3;
    if constexpr (kFifthBits<P>) return 31;
    if constexpr (std::is_same_v<P, Q6K>) return 63;
    if constexpr (P::kBits == 4 && !P::kBig) return 15;
    return 255;
}

// Rows per block of a prefill tile: AVX-512's 32 registers hold 6 rows' accumulators; AVX2's 16
// hold fewer, and how many pay was measured per type (Qwen3-30B-A3B layer, 256 tokens, one thread,
// x86-64-v3 on a Zen 4, against one row at a time: 3 rows 1.15-1.26x on the 2-, 3-, 4- and 5-bit
// types and IQ4_XS; Q5_K 4 (1.05x over 3); Q6_K best at 2 (1.14x), Q8_0 on the joined plane
// (kJoined) 2 (3: the same); docs/performance.md).
template <class P>
constexpr int row_block() {
#if defined(__AVX512F__)
    return 6;
#else
    return std::is_same_v<P, Q80> || std::is_same_v<P, Q6K> ? 2 : kFifthBits<P> ? 4 : 3;
#endif
}

// MR activation rows x one panel over all of K; writes `cols` columns of each out row.
template <class P, int MR, bool kTwoPass>
void panel_rows(const uint8_t* x, size_t row_bytes, int64_t k, const uint8_t* panel, float* out, int64_t ldo, int cols) {
    VF acc[MR][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) acc[m][v] = vzero();
    // One pass on the 32-element types dots llama.cpp's Q8_0 activations: a scale per 32 k, not per 256.
    constexpr bool kPer32 = !kTwoPass && P::kBlockK == 32;
    constexpr int64_t kScaleK = kPer32 ? 32 : kQK;
    ActRow a[MR];
    for (int m = 0; m < MR; ++m) a[m] = act_row<kPer32>(x + size_t(m) * row_bytes, k);
    const VI low4 = vset1i(0x0f0f0f0f);
    constexpr int kChunksPerSub = int(P::kSubK / (P::kBits == 2 ? 16 : P::kBits == 4 ? 8 : 4));
    // Q6_K's scales are int8 per 16 k and its activation scale one per 256-k block: its sub-block
    // epilogue stays in integers, sc_j * (dot_j - 32 * sum_j) summed exactly over the block (|sum|
    // < 2^29), and converts once per block (the float epilogue below, every 16 k, held its
    // cache-resident rate at 27.6 GB/s; this one 30.1, Q4_K's 29.6: docs/performance.md).
    constexpr bool kIntScales = std::is_same_v<P, Q6K>;
    // Without VNNI a dot is vpmaddubsw (int16 pair sums), vpmaddwd (widening to int32) and an add.
    // kPairRun: a run of kRunChunks chunks adds its pair sums in int16 and widens them once —
    // exact while |sum| <= quads * 2 * max(u) * 127 stays within int16 (Q4_K, Q4_0: 8 quads, a whole
    // sub-block; Q5_K 4; Q6_K 2; the 2-bit types a chunk). Not for the 8-bit codes (one quad fills
    // int16) nor for AVX-512's 6-row prefill blocks, whose extra accumulators would not fit the registers.
    // With AVX2's row blocks (up to 4) it is on (1.04-1.14x on prefill at one row, measured before the blocks).
    constexpr int kQuadsPerChunk = P::kBits == 2 ? 4 : P::kBits == 4 ? 2 : 1;
    constexpr int kRunChunks = std::min(kChunksPerSub, 32767 / (2 * max_code<P>() * 127) / kQuadsPerChunk);
    constexpr bool kPairRun = !kVnni && !P::kBig && MR <= 4 && kRunChunks >= 1;
    static_assert(!kPairRun || kChunksPerSub % kRunChunks == 0, "a run never crosses a sub-block");
    // Q8_0 and IQ4_XS on AVX2 (signed values up to 128 in magnitude: two passes of the sign-moving
    // vpmaddubsw dot took 8 instructions per quad and row): their values widened to int16 once per
    // row block, then vpmaddwd with the joined int16 plane, both passes at once. The dots go to lo
    // in vphaddd's lane order and come out as 128 hi + lo, which the epilogue reads as (hi + lo / 128)
    // with hi = 0. IQ4_XS's one-row decode was a little faster the old way (12.1 against 11.6 GB/s
    // from L3), its table lookups already filling the shuffle port.
    constexpr bool kJoined = kPlane16 && kTwoPass && P::kBig && (MR > 1 || std::is_same_v<P, Q80>);
    for (int64_t b = 0; b < k / P::kBlockK; ++b) {
        const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
        const int64_t k0 = b * P::kBlockK;
        VI ihi[MR][kVecsPerPanel], ilo[MR][kVecsPerPanel];
        // Q4_K's / Q5_K's f16 d and dmin (the file's), widened once per block for its 8 sub-blocks.
        VF d_block[kVecsPerPanel]{}, dmin_block[kVecsPerPanel]{};
        if constexpr (std::is_same_v<P, Q4K> || std::is_same_v<P, Q5K>)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                d_block[v] = widen_f16(blk + P::kD + 2 * size_t(v) * kLanes);
                dmin_block[v] = widen_f16(blk + P::kDmin + 2 * size_t(v) * kLanes);
            }
        if constexpr (kIntScales)
            for (int m = 0; m < MR; ++m)
                for (int v = 0; v < kVecsPerPanel; ++v) ihi[m][v] = ilo[m][v] = vzeroi();
        for (int j = 0; j < int(P::kBlockK / P::kSubK); ++j) {
            // One-row tiles (decode) of the 4-bit types stream their lines on software prefetch, as
            // INT4's do: the hardware prefetchers alone kept one core at 11–20 GB/s of ~29 (Q5_K 0.72
            // of llama.cpp's 1-thread decode, then 1.04). Each sub-block prefetches its share of the
            // block's lines, header (d, scales) and Q5_K's / Q6_K's extra bit lines included: one
            // prefetch per 64-byte chunk left those to the hardware (Q6_K: 1 line in 3 of each
            // sub-block, plus its 5 header lines). The 2-bit types run faster without it (Q2_K 1.06
            // -> 0.88); 8 KiB ahead was slower. Re-measured with this per-block scheme (session 20,
            // one thread, 3 alternations): Q2_K 0.69 -> 0.75-0.84 ms, Q3_K 0.80 -> 0.83 (x86-64-v3:
            // 0.85 -> 1.03, 1.06 -> 1.17) — still without.
            if constexpr (MR == 1 && P::kBits == 4) {
                constexpr int kLines = int((P::kBlockBytes + 63) / 64), kSubs = int(P::kBlockK / P::kSubK);
                for (int i = j * kLines / kSubs; i < (j + 1) * kLines / kSubs; ++i)
                    prefetch_decode_stream<4096>(blk + 64 * i);
            }
            VI hi[MR][kVecsPerPanel], lo[MR][kVecsPerPanel], hi16[MR][kVecsPerPanel], lo16[MR][kVecsPerPanel];
            for (int m = 0; m < MR; ++m)
                for (int v = 0; v < kVecsPerPanel; ++v) hi[m][v] = lo[m][v] = hi16[m][v] = lo16[m][v] = vzeroi();
            // acc (int32 lanes) += the four-product dots of u and a; with kPairRun into the run's int16 sums.
            auto dot = [&](VI& acc, VI& acc16, VI u, VI w, VI act) {
                if constexpr (kPairRun)
                    acc16 = pairs_u8s8(acc16, u, act);
                else
                    acc = dot8<P::kBig>(acc, u, w, act);
            };
            for (int c = kChunksPerSub * j; c < kChunksPerSub * (j + 1); ++c) {
                const uint8_t* chunk = blk + chunk_at<P>(c);
                if constexpr (P::kBits == 2) {
                    const VI low2 = vset1i(0x03030303);
                    VI w[4][kVecsPerPanel];
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        VI raw = vloadi(chunk + size_t(v) * kLanes * 4);
                        asm("" : "+v"(raw));
                        w[0][v] = vand(raw, low2);
                        w[1][v] = vand(vsrl16<2>(raw), low2);
                        w[2][v] = vand(vsrl16<4>(raw), low2);
                        w[3][v] = vand(vsrl16<6>(raw), low2);
                        if constexpr (std::is_same_v<P, Q3K>) {   // third bit -> 4
                            const VI t = vloadi(blk + third_bits_at(c) + size_t(v) * kLanes * 4), four = vset1i(0x04040404);
                            if (c % 2 == 0) {
                                w[0][v] = vor(w[0][v], vand(vslli16<2>(t), four));
                                w[1][v] = vor(w[1][v], vand(vslli16<1>(t), four));
                                w[2][v] = vor(w[2][v], vand(t, four));
                                w[3][v] = vor(w[3][v], vand(vsrl16<1>(t), four));
                            } else {
                                w[0][v] = vor(w[0][v], vand(vsrl16<2>(t), four));
                                w[1][v] = vor(w[1][v], vand(vsrl16<3>(t), four));
                                w[2][v] = vor(w[2][v], vand(vsrl16<4>(t), four));
                                w[3][v] = vor(w[3][v], vand(vsrl16<5>(t), four));
                            }
                        }
                    }
                    for (int m = 0; m < MR; ++m) {
                        const auto* h = reinterpret_cast<const uint8_t*>(a[m].hi + k0 + 16 * c);
                        for (int i = 0; i < 4; ++i) {
                            const VI ah = vset1i(load_i32(h + 4 * i));
                            for (int v = 0; v < kVecsPerPanel; ++v) dot(hi[m][v], hi16[m][v], w[i][v], w[i][v], ah);
                        }
                        if constexpr (kTwoPass) {
                            const auto* l = reinterpret_cast<const uint8_t*>(a[m].lo + k0 + 16 * c);
                            for (int i = 0; i < 4; ++i) {
                                const VI al = vset1i(load_i32(l + 4 * i));
                                for (int v = 0; v < kVecsPerPanel; ++v) dot(lo[m][v], lo16[m][v], w[i][v], w[i][v], al);
                            }
                        }
                    }
                } else if constexpr (P::kBits == 4) {
                    VI w0[kVecsPerPanel], w1[kVecsPerPanel];
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        VI w = vloadi(chunk + size_t(v) * kLanes * 4);
                        asm("" : "+v"(w));   // in a register, as int4.cpp explains
                        w0[v] = vand(w, low4);
                        w1[v] = vand(vsrl16<4>(w), low4);
                        if constexpr (std::is_same_v<P, Q6K>) {   // high bit pairs -> 16, 32
                            const VI t = vloadi(blk + high_pairs_at(c) + size_t(v) * kLanes * 4), mask = vset1i(0x30303030);
                            if (c % 2 == 0) {
                                w0[v] = vor(w0[v], vand(vslli16<4>(t), mask));
                                w1[v] = vor(w1[v], vand(vslli16<2>(t), mask));
                            } else {
                                w0[v] = vor(w0[v], vand(t, mask));
                                w1[v] = vor(w1[v], vand(vsrl16<2>(t), mask));
                            }
                        }
                        if constexpr (kFifthBits<P>) {
                            const VI bits = vloadi(blk + fifth_bits_at<P>(c) + size_t(v) * kLanes * 4);
                            switch (c % 4) {   // c's range is a constant 4-chunk window: unrolled
                                case 0: w0[v] = vor(w0[v], fifth_bit<0>(bits)); w1[v] = vor(w1[v], fifth_bit<1>(bits)); break;
                                case 1: w0[v] = vor(w0[v], fifth_bit<2>(bits)); w1[v] = vor(w1[v], fifth_bit<3>(bits)); break;
                                case 2: w0[v] = vor(w0[v], fifth_bit<4>(bits)); w1[v] = vor(w1[v], fifth_bit<5>(bits)); break;
                                default: w0[v] = vor(w0[v], fifth_bit<6>(bits)); w1[v] = vor(w1[v], fifth_bit<7>(bits));
                            }
                        }
                    }
                    // IQ4_XS, IQ4_NL: indices -> signed table values (w), and the u8 operand (wu) as Q8_0 has it.
                    VI wu0[kVecsPerPanel], wu1[kVecsPerPanel];
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        if constexpr (P::kBig) {
                            w0[v] = vlookup16(reinterpret_cast<const uint8_t*>(kIq4Values), w0[v]);
                            w1[v] = vlookup16(reinterpret_cast<const uint8_t*>(kIq4Values), w1[v]);
                            wu0[v] = kVnni ? vxor(w0[v], vset1i(int(0x80808080u))) : abs_i8(w0[v]);
                            wu1[v] = kVnni ? vxor(w1[v], vset1i(int(0x80808080u))) : abs_i8(w1[v]);
                        } else {
                            wu0[v] = w0[v];
                            wu1[v] = w1[v];
                        }
                    }
#if defined(__AVX2__) && !defined(__AVX512F__)
                    if constexpr (kJoined) {
                        Wide16 v0[kVecsPerPanel], v1[kVecsPerPanel];
                        for (int v = 0; v < kVecsPerPanel; ++v) v0[v] = widen16(w0[v]), v1[v] = widen16(w1[v]);
                        for (int m = 0; m < MR; ++m)
                            for (int v = 0; v < kVecsPerPanel; ++v)
                                lo[m][v] = dot16(dot16(lo[m][v], v0[v], a[m].joined + k0 + 8 * c), v1[v], a[m].joined + k0 + 8 * c + 4);
                        continue;
                    }
#endif
                    for (int m = 0; m < MR; ++m) {
                        const auto* h = reinterpret_cast<const uint8_t*>(a[m].hi + k0 + 8 * c);
                        const VI ah0 = vset1i(load_i32(h)), ah1 = vset1i(load_i32(h + 4));
                        for (int v = 0; v < kVecsPerPanel; ++v) {
                            dot(hi[m][v], hi16[m][v], wu0[v], w0[v], ah0);
                            dot(hi[m][v], hi16[m][v], wu1[v], w1[v], ah1);
                        }
                        if constexpr (kTwoPass) {
                            const auto* l = reinterpret_cast<const uint8_t*>(a[m].lo + k0 + 8 * c);
                            const VI al0 = vset1i(load_i32(l)), al1 = vset1i(load_i32(l + 4));
                            for (int v = 0; v < kVecsPerPanel; ++v) {
                                dot(lo[m][v], lo16[m][v], wu0[v], w0[v], al0);
                                dot(lo[m][v], lo16[m][v], wu1[v], w1[v], al1);
                            }
                        }
                    }
                } else {
                    VI w[kVecsPerPanel], wu[kVecsPerPanel];   // wu: the u8 operand (u, or |q|)
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        w[v] = wu[v] = vloadi(chunk + size_t(v) * kLanes * 4);
                        if constexpr (!kVnni && P::kBig) {
                            w[v] = vxor(w[v], vset1i(int(0x80808080u)));   // back to q, signed
                            wu[v] = abs_i8(w[v]);
                        }
                    }
#if defined(__AVX2__) && !defined(__AVX512F__)
                    if constexpr (kJoined) {
                        Wide16 wide[kVecsPerPanel];
                        for (int v = 0; v < kVecsPerPanel; ++v) wide[v] = widen16(w[v]);
                        for (int m = 0; m < MR; ++m)
                            for (int v = 0; v < kVecsPerPanel; ++v) lo[m][v] = dot16(lo[m][v], wide[v], a[m].joined + k0 + 4 * c);
                        continue;
                    }
#endif
                    for (int m = 0; m < MR; ++m) {
                        const VI ah = vset1i(load_i32(reinterpret_cast<const uint8_t*>(a[m].hi + k0 + 4 * c)));
                        for (int v = 0; v < kVecsPerPanel; ++v) hi[m][v] = dot8<P::kBig>(hi[m][v], wu[v], w[v], ah);
                        if constexpr (kTwoPass) {
                            const VI al = vset1i(load_i32(reinterpret_cast<const uint8_t*>(a[m].lo + k0 + 4 * c)));
                            for (int v = 0; v < kVecsPerPanel; ++v) lo[m][v] = dot8<P::kBig>(lo[m][v], wu[v], w[v], al);
                        }
                    }
                }
                if constexpr (kPairRun)
                    if ((c + 1) % kRunChunks == 0)   // the run's int16 sums, widened once
                        for (int m = 0; m < MR; ++m)
                            for (int v = 0; v < kVecsPerPanel; ++v) {
                                hi[m][v] = widen_pairs(hi[m][v], hi16[m][v]);
                                if constexpr (kTwoPass) lo[m][v] = widen_pairs(lo[m][v], lo16[m][v]);
                                hi16[m][v] = lo16[m][v] = vzeroi();
                            }
            }
#if defined(__AVX2__) && !defined(__AVX512F__)
            if constexpr (kJoined)
                for (int m = 0; m < MR; ++m)
                    for (int v = 0; v < kVecsPerPanel; ++v) lo[m][v] = plane16_order(lo[m][v]);
#endif
            if constexpr (kIntScales) {
                const int64_t g16 = (k0 + P::kSubK * j) / 16;
                VI sc[kVecsPerPanel];
                for (int v = 0; v < kVecsPerPanel; ++v) sc[v] = widen_i8_i32(blk + P::kSc + 16 * j + v * kLanes);
                for (int m = 0; m < MR; ++m) {
                    const VI zh = vset1i(32 * int32_t(a[m].sums_hi[g16]));
                    for (int v = 0; v < kVecsPerPanel; ++v) ihi[m][v] = vaddi(ihi[m][v], vmullo(sc[v], vsubi(hi[m][v], zh)));
                    if constexpr (kTwoPass) {
                        const VI zl = vset1i(32 * int32_t(a[m].sums_lo[g16]));
                        for (int v = 0; v < kVecsPerPanel; ++v) ilo[m][v] = vaddi(ilo[m][v], vmullo(sc[v], vsubi(lo[m][v], zl)));
                    }
                }
                continue;
            }
            VF s[kVecsPerPanel], sz[kVecsPerPanel];
            for (int v = 0; v < kVecsPerPanel; ++v) {
                if constexpr (nibble_zero<P>() != 0) {   // Q4_0, Q5_0: w = d * (u - zero)
                    s[v] = widen_f16(blk + P::kD + 2 * size_t(v) * kLanes);
                    sz[v] = vmul(s[v], vset1(float(nibble_zero<P>())));
                    continue;
                }
                if constexpr (kAddedMin<P>) {   // Q4_1, Q5_1: w = d * u + m
                    s[v] = widen_f16(blk + P::kD + 2 * size_t(v) * kLanes);
                    sz[v] = vsub(vzero(), widen_f16(blk + P::kDmin + 2 * size_t(v) * kLanes));
                    continue;
                }
                if constexpr (std::is_same_v<P, Q3K>) {
                    s[v] = vmul(widen_f16(blk + P::kD + 2 * size_t(v) * kLanes), widen_i8(blk + P::kSc + 16 * j + v * kLanes));
                    sz[v] = vmul(s[v], vset1(4.0f));
                    continue;
                }
                if constexpr (std::is_same_v<P, Q2K>) {
                    const uint8_t* sc = blk + P::kSc + 16 * j + v * kLanes;
                    s[v] = vmul(widen_f16(blk + P::kD + 2 * size_t(v) * kLanes), widen_nibble<false>(sc));
                    sz[v] = vmul(widen_f16(blk + P::kDmin + 2 * size_t(v) * kLanes), widen_nibble<true>(sc));
                    continue;
                }
                if constexpr (std::is_same_v<P, IQ4X>) {
                    s[v] = vmul(widen_f16(blk + P::kD + 2 * size_t(v) * kLanes), widen_i8(blk + P::kSc + 16 * j + v * kLanes));
                    sz[v] = kVnni ? vmul(s[v], vset1(128.0f)) : vzero();   // VNNI's codes carry + 128
                    continue;
                }
                if constexpr (std::is_same_v<P, Q80> || std::is_same_v<P, IQ4NL>) {
                    s[v] = widen_f16(blk + P::kD + 2 * size_t(v) * kLanes);
                    sz[v] = kVnni ? vmul(s[v], vset1(128.0f)) : vzero();   // the + 128 was taken off the codes
                    continue;
                }
                if constexpr (std::is_same_v<P, Q4K> || std::is_same_v<P, Q5K>) {
                    s[v] = vmul(d_block[v], widen_u8(blk + P::kSc + 16 * j + v * kLanes));
                    sz[v] = vmul(dmin_block[v], widen_u8(blk + P::kM + 16 * j + v * kLanes));
                }
            }
            const int64_t g16 = (k0 + P::kSubK * j) / 16;
            for (int m = 0; m < MR; ++m) {
                const float sa = a[m].scale[(k0 + P::kSubK * j) / kScaleK];
                float sum = float(a[m].sums_hi[g16] + (P::kSubK == 32 ? a[m].sums_hi[g16 + 1] : 0));
                if constexpr (kTwoPass)
                    sum += float(a[m].sums_lo[g16] + (P::kSubK == 32 ? a[m].sums_lo[g16 + 1] : 0)) * (1.0f / 128.0f);
                const VF asum = vset1(sa * sum);
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    const VF dot = vmul(vset1(sa), kTwoPass ? vfma(vcvt(lo[m][v]), vset1(1.0f / 128.0f), vcvt(hi[m][v]))
                                                            : vcvt(hi[m][v]));
                    acc[m][v] = vfma(s[v], dot, vsub(acc[m][v], vmul(sz[v], asum)));
                }
            }
        }
        if constexpr (kIntScales)
            for (int m = 0; m < MR; ++m) {
                const VF sa = vset1(a[m].scale[k0 / kQK]);
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    const VF d = vmul(sa, vload(reinterpret_cast<const float*>(blk + P::kD) + v * kLanes));
                    const VF t = kTwoPass ? vfma(vcvt(ilo[m][v]), vset1(1.0f / 128.0f), vcvt(ihi[m][v])) : vcvt(ihi[m][v]);
                    acc[m][v] = vfma(d, t, acc[m][v]);
                }
            }
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + m * ldo + v * kLanes, acc[m][v], n);
        }
}

// ---- the grid types: IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M (ggml_panels.h's kGridForm) ---
// Per 8-k group a channel's magnitudes are one grid entry (IQ3_XXS, IQ3_S: two half entries), one
// qword per channel: VBMI targets look grids of up to 512 entries up in registers (grid_words:
// their 2- or 4-bit code words), the others load the grid's rows (grid_rows, wide_rows); the signs
// come from the sign word (7 bits -> the byte with its parity bit, spread over the qword, tested per
// element; IQ2_S's and IQ3_S's sign bytes are stored as they are). u = offset + sign * magnitude
// (offset 43 / 62 / 15: u in 0..86 / 0..124 / 0..30) then dots 8 activations broadcast per qword:
// each channel's two dword lanes hold k 0..3 and 4..7 of the group, added at the sub-block's end.
// IQ1_S and IQ1_M have no signs and a grid of 2048 (11-bit indices, the top 3 bits in qh), IQ2_XS a
// grid of 512, IQ2_S of 1024, IQ3_S of 512 half entries: where their rows are loaded, their indices
// are made per sub-block by vector ops first (grid_indices); IQ1's rows are u = 8 (value + 1) + 2
// [delta > 0] (offset 9). IQ1_M's, IQ2_XS's and IQ2_S's scales are per 16 k: their sub-blocks finish
// in two halves.
// Prefill decodes a sub-block once for all the rows of a call (decode_sub); a lone decode row
// adds each block's dots in integers (lone_row_block).
namespace iq2 {

// The grids' rows (kGrid8, kGridXs, kGrid2s, kGrid4, kGrid3s, kGrid1) and kUnsignedGrid: ggml_panels.h.
// The forms whose indices are wider than a byte (IQ1_S, IQ1_M: 11 bits; IQ2_XS, IQ3_S: 9; IQ2_S:
// 10): made for a whole sub-block by vector ops first (grid_indices), then each row is one load.
template <class P>
constexpr bool kWideIndices = kUnsignedGrid<P> || std::is_same_v<P, IQ2XS> || kSignBytes<P>;
// The 4-magnitude grids' rows (IQ3_XXS, IQ3_S): channel i's two half rows in its qword's low and
// high dwords, for the kQLanes channels whose half indices are h0[i], h1[i] — each a dword insert
// (composing qwords by shift and OR first took twice the instructions).
template <class Grid, class Index>
inline VI half_rows(const Grid& grid, const Index* h0, const Index* h1) {
    const auto g = [&](Index i) { return int(grid.entry[i]); };
#if defined(__AVX512F__)
    return _mm512_set_epi32(g(h1[7]), g(h0[7]), g(h1[6]), g(h0[6]), g(h1[5]), g(h0[5]), g(h1[4]), g(h0[4]), g(h1[3]), g(h0[3]),
                            g(h1[2]), g(h0[2]), g(h1[1]), g(h0[1]), g(h1[0]), g(h0[0]));
#else
    return _mm256_set_epi32(g(h1[3]), g(h0[3]), g(h1[2]), g(h0[2]), g(h1[1]), g(h0[1]), g(h1[0]), g(h0[0]));
#endif
}
constexpr uint8_t kParity[16] = {0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0};   // of a nibble

#if defined(__AVX512F__)
constexpr int kQLanes = 8;   // channels per vector of qwords
// Channels q kQLanes .. of group l, their 8 magnitudes each: IQ2_XXS's one grid row, IQ3_XXS's two
// half rows (their 8-bit indices as stored). Scalar loads: faster than vpgatherdq on Zen 4.
template <class P>
inline VI grid_rows(const uint8_t* sub, int l, int q) {
    const uint8_t* at = sub + grid_panel_index<P>(l, 0) + q * kQLanes;
    if constexpr (std::is_same_v<P, IQ3XXS>) return half_rows(kGrid4, at, at + 16);
    const auto e = [&](int i) { return int64_t(kGrid8.entry[at[i]]); };
    return _mm512_set_epi64(e(7), e(6), e(5), e(4), e(3), e(2), e(1), e(0));
}
template <int kHalf>
inline VI qwords(VI words) { return _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(words, kHalf)); }
inline VI set1q(int64_t q) { return _mm512_set1_epi64(q); }
inline VI srli64_32(VI a) { return _mm512_srli_epi64(a, 32); }
inline VI shuffle_bytes(VI a, VI ctl) { return _mm512_shuffle_epi8(a, ctl); }
// Channel sums (even dword of each qword, after srli64_32 added the odd one) of the qword vectors
// t[0..kQ), in channel order: kVecsPerPanel vectors of kLanes channels.
inline void channel_order(const VI* t, VI* out) {
    out[0] = _mm512_permutex2var_epi32(t[0], _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), t[1]);
}
#else
constexpr int kQLanes = 4;
template <class P>   // as above; AVX2 hosts' gathers are slower still (Zen 2/3)
inline VI grid_rows(const uint8_t* sub, int l, int q) {
    const uint8_t* at = sub + grid_panel_index<P>(l, 0) + q * kQLanes;
    if constexpr (std::is_same_v<P, IQ3XXS>) return half_rows(kGrid4, at, at + 16);
    const auto e = [&](int i) { return int64_t(kGrid8.entry[at[i]]); };
    return _mm256_set_epi64x(e(3), e(2), e(1), e(0));
}
template <int kHalf>
inline VI qwords(VI words) { return _mm256_cvtepu32_epi64(_mm256_extracti128_si256(words, kHalf)); }
inline VI set1q(int64_t q) { return _mm256_set1_epi64x(q); }
inline VI srli64_32(VI a) { return _mm256_srli_epi64(a, 32); }
inline VI shuffle_bytes(VI a, VI ctl) { return _mm256_shuffle_epi8(a, ctl); }
inline VI add_bytes(VI a, VI b) { return _mm256_add_epi8(a, b); }
inline void channel_order(const VI* t, VI* out) {
    for (int v = 0; v < 2; ++v) {   // [c0 c1 d0 d1 | c2 c3 d2 d3] -> c0 c1 c2 c3 d0 d1 d2 d3
        const __m256 m = _mm256_shuffle_ps(_mm256_castsi256_ps(t[2 * v]), _mm256_castsi256_ps(t[2 * v + 1]), _MM_SHUFFLE(2, 0, 2, 0));
        out[v] = _mm256_permute4x64_epi64(_mm256_castps_si256(m), _MM_SHUFFLE(3, 1, 2, 0));
    }
}
#endif
constexpr int kQ = kPanel / kQLanes;   // qword vectors per panel

// kLanes u16 -> u32.
inline VI widen_u16(const uint8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}
#if defined(__AVX512F__)
inline VI srl32(VI a, int n) { return _mm512_srli_epi32(a, unsigned(n)); }
inline VI sll32(VI a, int n) { return _mm512_slli_epi32(a, unsigned(n)); }
inline VI vandnot_i(VI a, VI b) { return _mm512_andnot_si512(a, b); }   // ~a & b
inline VI add_u8(VI a, VI b) { return _mm512_add_epi8(a, b); }
inline void store_u32(uint32_t* p, VI v) { _mm512_store_si512(p, v); }
#else
inline VI srl32(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline VI sll32(VI a, int n) { return _mm256_slli_epi32(a, n); }
inline VI vandnot_i(VI a, VI b) { return _mm256_andnot_si256(a, b); }
inline VI add_u8(VI a, VI b) { return _mm256_add_epi8(a, b); }
inline void store_u32(uint32_t* p, VI v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
#endif

// A sub-block's grid indices for the kWideIndices forms: idx[kIndices l + h][i], half h of group l
// of channel i — the low byte as stored, the high bits from the channel's qh (IQ1), sign word
// (IQ2_XS) or high byte (IQ2_S, IQ3_S).
template <class P>
inline void grid_indices(const uint8_t* sub, uint32_t (*idx)[kPanel]) {
    for (int v = 0; v < kVecsPerPanel; ++v) {
        VI high;
        if constexpr (std::is_same_v<P, IQ2XS>) high = vloadi(sub + P::kWords + size_t(v) * kLanes * 4);
        else if constexpr (kSignBytes<P>) high = widen_u8_i32(sub + P::kHigh + size_t(v) * kLanes);
        else high = widen_u16(sub + P::kWords + 2 * size_t(v) * kLanes);
        for (int i = 0; i < 4 * P::kIndices; ++i) {   // i = kIndices l + h
            const int l = i / P::kIndices;
            const int at = std::is_same_v<P, IQ2XS> ? 28 + l : std::is_same_v<P, IQ1S> ? 3 * l : std::is_same_v<P, IQ2S> ? 2 * l
                         : std::is_same_v<P, IQ3S> ? i : 4 * l;
            const int mask = std::is_same_v<P, IQ2XS> || std::is_same_v<P, IQ3S> ? 1 : std::is_same_v<P, IQ2S> ? 3 : 7;
            const VI top = vand(at < 8 ? sll32(high, 8 - at) : srl32(high, at - 8), vset1i(mask << 8));   // bits 8..
            store_u32(idx[i] + v * kLanes, vor(widen_u8_i32(sub + 16 * size_t(i) + size_t(v) * kLanes), top));
        }
    }
    // The indices go through memory: left to itself the compiler kept them in vector registers and
    // took each out with vpextrd (two uops, one port on Zen) where a scalar load is one uop.
    asm volatile("" : : "r"(idx) : "memory");
}
// The rows of channels q kQLanes .. of `grid` at the given indices (scalar loads: faster than
// vpgatherdq on Zen 4, and AVX2 hosts' gathers are slower still).
template <class Grid>
inline VI rows_at(const Grid& grid, const uint32_t* idx) {
#if defined(__AVX512F__)
    return _mm512_set_epi64(int64_t(grid.entry[idx[7]]), int64_t(grid.entry[idx[6]]), int64_t(grid.entry[idx[5]]),
                            int64_t(grid.entry[idx[4]]), int64_t(grid.entry[idx[3]]), int64_t(grid.entry[idx[2]]),
                            int64_t(grid.entry[idx[1]]), int64_t(grid.entry[idx[0]]));
#else
    return _mm256_set_epi64x(int64_t(grid.entry[idx[3]]), int64_t(grid.entry[idx[2]]), int64_t(grid.entry[idx[1]]),
                             int64_t(grid.entry[idx[0]]));
#endif
}
// Group l's rows of the signed wide-index forms: one 8-magnitude row (IQ2_XS, IQ2_S), or two
// 4-magnitude half rows in the qword's low and high dwords (IQ3_S).
template <class P>
inline VI wide_rows(const uint32_t (*idx)[kPanel], int l, int q) {
    if constexpr (std::is_same_v<P, IQ2XS>) return rows_at(kGridXs, idx[l] + q * kQLanes);
    if constexpr (std::is_same_v<P, IQ2S>) return rows_at(kGrid2s, idx[l] + q * kQLanes);
    return half_rows(kGrid3s, idx[2 * l] + q * kQLanes, idx[2 * l + 1] + q * kQLanes);
}
// IQ1: the sub-block's qh words as qwords (channel q kQLanes + i in qword i of vector q), once.
template <class P>
inline void qh_qwords(const uint8_t* sub, VI* qhq) {
    for (int v = 0; v < kVecsPerPanel; ++v) {
        const VI qh = widen_u16(sub + P::kWords + 2 * size_t(v) * kLanes);
        qhq[2 * v] = qwords<0>(qh);
        qhq[2 * v + 1] = qwords<1>(qh);
    }
}
// IQ1: 2 in every byte of the channels' qwords whose group l has a positive delta (bit `at` of qh
// clear), else 0 — the bit made in each qword's low byte and spread over the qword.
template <class P>
inline void delta_up(const VI* qhq, int l, VI* up) {
    const int at = std::is_same_v<P, IQ1S> ? 15 : 4 * l + 3;
    alignas(64) static constexpr uint8_t kSpread[64] = {0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8,
                                                        0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8,
                                                        0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8,
                                                        0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8};
    for (int q = 0; q < kQ; ++q)   // qh's bits stay in the low dword: a 32-bit shift is the qword's
        up[q] = shuffle_bytes(vslli32<1>(vandnot_i(srl32(qhq[q], at), vset1i(1))), vloadi(kSpread));
}

// The sub-block's sign words as qword vectors (channel q * kQLanes + i in qword i of vector q).
// Without VBMI each word of 7-bit sign indices first becomes its four groups' sign bytes (byte l:
// the 7-bit index of group l and its parity bit, from a nibble table), once per sub-block rather
// than per group; IQ2_S's and IQ3_S's words are their sign bytes already.
template <class P>
inline void words_as_qwords(const uint8_t* words, VI* wq) {
    for (int v = 0; v < kVecsPerPanel; ++v) {
        VI w = vloadi(words + size_t(v) * kLanes * 4);
#if !defined(__AVX512VBMI__)
        if constexpr (!kSignBytes<P>) {
            const VI seven = vset1i(0x7f);
            w = vor(vor(vand(w, seven), vslli32<1>(vand(w, vset1i(0x7f << 7)))),
                    vor(vslli32<2>(vand(w, vset1i(0x7f << 14))), vslli32<3>(vand(w, vset1i(0x7f << 21)))));
            const VI low4 = vset1i(0x0f0f0f0f);
            const VI parity = vxor(vlookup16(kParity, vand(w, low4)), vlookup16(kParity, vand(vsrl16<4>(w), low4)));
            w = vor(w, vslli16<7>(parity));
        }
#endif
        wq[2 * v] = qwords<0>(w);
        wq[2 * v + 1] = qwords<1>(w);
    }
}

constexpr int64_t kBitOfByte = int64_t(0x8040201008040201ull);   // element t's sign: bit t
#if defined(__AVX512VBMI__)
// The sign byte (the 7-bit index and its parity bit: ggml's ksigns table, 128 entries in two
// registers) for every byte of a channel's qword in two instructions: vpmultishiftqb puts the 8
// bits from bit 7L of the qword in each of its bytes, vpermi2b reads the table at their low 7.
struct SignTable {
    alignas(64) uint8_t byte[128];
};
constexpr SignTable make_signs() {
    SignTable t{};
    for (int i = 0; i < 128; ++i) t.byte[i] = iq2_sign_byte(uint32_t(i));
    return t;
}
constexpr SignTable kSigns = make_signs();
// The magnitudes without gathers (Zen 4 takes ~8 cycles per 8-qword vpgatherdq): the grid's codes
// as N words (the 2-bit fields of kIq2xxsGrid and kIq2xsGrid, the 4-bit ones of kIq3xxsGrid and
// kIq3sGrid: 512 bytes or 1 KiB) looked up 32 indices i at a time by N / 64 vpermi2w over its
// 64-entry parts and a tree of blends on the indices' higher bits, then per channel vpmultishiftqb
// puts code t in byte t and vpermb maps it to its magnitude.
template <int N>
inline VI grid_words(const uint16_t* grid, VI i) {   // 32 indices (16 bits each) -> their entries
    VI part[N / 64];
    for (int t = 0; t < N / 64; ++t)
        part[t] = _mm512_permutex2var_epi16(_mm512_loadu_si512(grid + 64 * t), i, _mm512_loadu_si512(grid + 64 * t + 32));
    for (int bit = 64, n = N / 64; n > 1; bit *= 2, n /= 2) {
        const __mmask32 upper = _mm512_test_epi16_mask(i, _mm512_set1_epi16(short(bit)));
        for (int t = 0; t < n / 2; ++t) part[t] = _mm512_mask_blend_epi16(upper, part[2 * t], part[2 * t + 1]);
    }
    return part[0];
}
inline VI index_bytes(const uint8_t* idx32) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx32))); }
// IQ2_XS's and IQ3_S's indices of slots s and s + 1 (slot kIndices l + h; 16 channels each) as 32
// words: the low bytes as stored, the ninth bits from the channels' sign words (IQ2_XS) or high
// bytes (IQ3_S), shifted to bit 8 per slot.
template <class P>
inline VI wide_indices(const uint8_t* sub, int s) {
    __m256i h;   // 16 channels' words holding slot s's ninth bit at bit `at`
    int at;
    if constexpr (std::is_same_v<P, IQ2XS>) {
        h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_loadu_si512(sub + P::kWords), 20));   // bit 28 + l -> 8 + l
        at = 8 + s;
    } else {
        h = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + P::kHigh)));
        at = s;
    }
    const VI both = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);   // lanes 16.. : slot s + 1
    const VI up = _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(short(8 - at)), _mm512_set1_epi16(short(7 - at)));
    const VI shifted = at >= 8 ? _mm512_srlv_epi16(both, _mm512_sub_epi16(_mm512_setzero_si512(), up)) : _mm512_sllv_epi16(both, up);
    return _mm512_or_si512(index_bytes(sub + 16 * size_t(s)), _mm512_and_si512(shifted, _mm512_set1_epi16(0x100)));
}
struct MagnitudeTable {
    alignas(64) uint8_t byte[64];   // [i] = the magnitude of code i's low bits
};
template <class Magnitude>
constexpr MagnitudeTable make_magnitudes(int mask, Magnitude m) {
    MagnitudeTable t{};
    for (int i = 0; i < 64; ++i) t.byte[i] = m(i & mask);
    return t;
}
constexpr MagnitudeTable kMagnitudes2 = make_magnitudes(3, [](int c) { return c < 3 ? kIq2Magnitude[c] : 0; });
constexpr MagnitudeTable kMagnitudes3 = make_magnitudes(7, [](int c) { return kIq3Magnitude[c]; });
constexpr MagnitudeTable kMagnitudes3s = make_magnitudes(7, [](int c) { return 2 * c + 1; });   // IQ3_S: 1, 3, .., 15
// IQ2_XXS, IQ2_XS: words 8 kQuarter .. + 8 of two groups' grid_words (one group's 8 channels).
template <int kQuarter>
inline VI magnitudes2(VI words) {
    const VI codes = _mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(words, kQuarter));
    const VI fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0e0c0a0806040200ll), codes);   // byte t: code t
    return _mm512_permutexvar_epi8(fields, vloadi(kMagnitudes2.byte));
}
// IQ3_XXS, IQ3_S: one group's grid_words (16 channels' first halves, then their second halves);
// channels 8q .. 8q + 8, each half's 4 codes at bits 0..15 and 32..47 of its qword.
template <int kQ8, const MagnitudeTable& kTable>
inline VI magnitudes3(VI words) {
    const VI codes = _mm512_or_si512(_mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(words, kQ8)),
                                     _mm512_slli_epi64(_mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(words, 2 + kQ8)), 32));
    const VI fields = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x2c2824200c080400ll), codes);   // byte t: code t
    return _mm512_permutexvar_epi8(fields, vloadi(kTable.byte));
}
// Group L's negative elements: a bit per byte of the channels' qwords.
using SignMask = __mmask64;
template <class P, int L>
inline SignMask sign_mask(VI wq) {
    VI s8;   // group L's sign byte in every byte of its channel's qword
    if constexpr (kSignBytes<P>)
        s8 = _mm512_multishift_epi64_epi8(_mm512_set1_epi8(char(8 * L)), wq);
    else
        s8 = _mm512_permutex2var_epi8(vloadi(kSigns.byte), _mm512_multishift_epi64_epi8(_mm512_set1_epi8(char(7 * L)), wq),
                                      vloadi(kSigns.byte + 64));
    return _mm512_test_epi8_mask(s8, set1q(kBitOfByte));
}
#else
// Elsewhere the sign bytes come from words_as_qwords; one vpshufb spreads group L's over its
// channel's qword (control: byte L, or 8 + L in the upper qword of each 128-bit lane).
struct Spread {
    alignas(64) uint64_t control[4][8];
};
constexpr Spread make_spread() {
    Spread t{};
    for (int l = 0; l < 4; ++l)
        for (int i = 0; i < 8; ++i) t.control[l][i] = 0x0101010101010101ull * uint64_t(i % 2 ? 8 + l : l);
    return t;
}
constexpr Spread kSpread = make_spread();
#if defined(__AVX512F__)
using SignMask = __mmask64;
template <class P, int L>
inline SignMask sign_mask(VI sq) {
    return _mm512_test_epi8_mask(shuffle_bytes(sq, vloadi(kSpread.control[L])), set1q(kBitOfByte));
}
#else
// AVX2: a byte that is negative where the element is (its sign bit isolated, then 0x7F added with
// unsigned saturation: 0x7F where clear, >= 0x80 where set), the operand vpsignb takes.
using SignMask = VI;
template <class P, int L>
inline SignMask sign_mask(VI sq) {
    const VI bit = vand(shuffle_bytes(sq, vloadi(kSpread.control[L])), set1q(kBitOfByte));
    return _mm256_adds_epu8(bit, _mm256_set1_epi8(0x7f));
}
#endif
#endif

// x with the elements that `neg` marks negated (|x| <= 127: no overflow).
#if defined(__AVX512F__)
inline VI apply_sign(VI x, SignMask neg) { return _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x); }
#else
inline VI apply_sign(VI x, SignMask neg) { return _mm256_sign_epi8(x, neg); }
#endif
// u = offset + sign * magnitude for group L of the sub-block (offset: the largest magnitude, 43, 62
// or 15): magnitudes g, the channels' sign words as qwords wq.
template <class P, int L>
inline VI group_codes(VI g, VI wq) {
#if defined(__AVX512F__)
    const VI offset = _mm512_set1_epi8(char(P::kOffset));
    return _mm512_mask_sub_epi8(_mm512_add_epi8(g, offset), sign_mask<P, L>(wq), offset, g);
#else
    return add_bytes(apply_sign(g, sign_mask<P, L>(wq)), vset1i(P::kOffset * 0x01010101));
#endif
}

// One sub-block (32 k) of a panel decoded (prefill): the codes of its four groups and its channels'
// scales s_j = d * (0.5 + ls) * step (as the file's dequantization rounds them), laid out as the
// accumulators are: channel i of vector q in the low dword of qword i (the high dwords 0). The
// kHalfScales forms (IQ1_M, IQ2_XS, IQ2_S: a scale per 16 k) finish each sub-block in two halves.
struct SubBlock {
    VI u[4][kQ];
    VF scale[2 * kQ];   // [h * kQ + q]: kHalfScales' two halves' scales (16 k each); the others' one in h = 0
};

// f.template operator()<i>() for i = 0 .. N - 1, each i a constant.
template <int N, class F>
inline void unrolled(F&& f) {
    [&]<int... i>(std::integer_sequence<int, i...>) { (f.template operator()<i>(), ...); }(std::make_integer_sequence<int, N>{});
}

// IQ2_XXS's, IQ3_XXS's, IQ2_XS's, IQ2_S's and IQ3_S's groups: grid magnitudes and the sign words.
template <class P, class F>
inline void each_signed_group(const uint8_t* sub, F&& f) {
    VI wq[kQ];
    words_as_qwords<P>(sub + P::kWords, wq);
#if defined(__AVX512VBMI__)
    // The grids of up to 512 entries in registers (grid_words), the indices never leaving them; IQ2_S's
    // 1024 by scalar loads as elsewhere. Alternated builds, one thread, 16 experts (Zen 4): IQ3_S
    // 3.58-3.67 -> 2.76-2.82 ms (its two half rows per channel were two loads), IQ2_XS the same
    // (2.06 / 2.05), IQ2_S 2.03 -> 2.33-2.40 (sixteen vpermi2w and fifteen blends per 32 indices).
    constexpr bool kRegisterGrid = !std::is_same_v<P, IQ2S>;
    VI gw[4];   // IQ2_XXS, IQ2_XS: two groups' entries per vector; IQ3_*: one group's two halves
    if constexpr (std::is_same_v<P, IQ2XXS>) {
        gw[0] = grid_words<256>(kIq2xxsGrid, index_bytes(sub + grid_panel_index<P>(0, 0)));   // groups 0, 1
        gw[1] = grid_words<256>(kIq2xxsGrid, index_bytes(sub + grid_panel_index<P>(2, 0)));   // groups 2, 3
    } else if constexpr (std::is_same_v<P, IQ3XXS>) {
        for (int l = 0; l < 4; ++l) gw[l] = grid_words<256>(kIq3xxsGrid, index_bytes(sub + grid_panel_index<P>(l, 0)));
    } else if constexpr (std::is_same_v<P, IQ2XS>) {
        gw[0] = grid_words<512>(kIq2xsGrid, wide_indices<P>(sub, 0));
        gw[1] = grid_words<512>(kIq2xsGrid, wide_indices<P>(sub, 2));
    } else if constexpr (std::is_same_v<P, IQ3S>) {
        for (int l = 0; l < 4; ++l) gw[l] = grid_words<512>(kIq3sGrid, wide_indices<P>(sub, 2 * l));
    }
#else
    constexpr bool kRegisterGrid = false;
#endif
    alignas(64) uint32_t idx[kWideIndices<P> && !kRegisterGrid ? 4 * P::kIndices : 1][kPanel];
    if constexpr (kWideIndices<P> && !kRegisterGrid) grid_indices<P>(sub, idx);
    unrolled<4>([&]<int l>() {
        unrolled<kQ>([&]<int q>() {
            VI g;
            if constexpr (kRegisterGrid) {
#if defined(__AVX512VBMI__)
                if constexpr (P::kIndices == 1)
                    g = magnitudes2<2 * (l % 2) + q>(gw[l / 2]);
                else
                    g = magnitudes3<q, std::is_same_v<P, IQ3S> ? kMagnitudes3s : kMagnitudes3>(gw[l]);
#endif
            } else if constexpr (kWideIndices<P>) {
                g = wide_rows<P>(idx, l, q);
            } else {
                g = grid_rows<P>(sub, l, q);
            }
            f.template operator()<l, q>(g, wq[q]);
        });
    });
}

// f.template operator()<l, q>(g, sq) for group l of channels q kQLanes .. (q < kQ), l = 0..3 of the
// sub-block, q fastest (a caller that uses each at once holds one, not kQ: AVX2 has 16 registers):
// the signed forms' grid magnitudes g and sign words sq (group_codes makes their codes), the
// unsigned forms' codes g (sq unused).
template <class P, class F>
inline void each_group(const uint8_t* sub, F&& f) {
    if constexpr (kUnsignedGrid<P>) {   // no signs: the codes are the grid rows (scalar loads everywhere), delta added
        alignas(64) uint32_t idx[4][kPanel];
        grid_indices<P>(sub, idx);
        VI qhq[kQ], up[kQ];
        qh_qwords<P>(sub, qhq);
        if constexpr (std::is_same_v<P, IQ1S>) delta_up<P>(qhq, 0, up);   // one delta per sub-block
        unrolled<4>([&]<int l>() {
            if constexpr (std::is_same_v<P, IQ1M>) delta_up<P>(qhq, l, up);   // one per group
            unrolled<kQ>([&]<int q>() { f.template operator()<l, q>(add_u8(rows_at(kGrid1, idx[l] + q * kQLanes), up[q]), up[q]); });
        });
    } else {
        each_signed_group<P>(sub, f);
    }
}

// A block's f16 d per channel: the file's (IQ2_XXS, IQ3_XXS, IQ1_S), or IQ1_M's from the top
// nibbles of its four scale words.
template <class P>
inline VF block_d(const uint8_t* blk, int v) {
    if constexpr (std::is_same_v<P, IQ1M>) {
        VI bits = vzeroi();
        for (int m = 0; m < 4; ++m) {
            const VI w = widen_u16(blk + P::kD + 32 * size_t(m) + 2 * size_t(v) * kLanes);
#if defined(__AVX512F__)
            bits = vor(bits, _mm512_slli_epi32(_mm512_srli_epi32(w, 12), 4 * unsigned(m)));
        }
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits));
#else
            bits = vor(bits, _mm256_slli_epi32(_mm256_srli_epi32(w, 12), 4 * m));
        }
        return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
#endif
    } else {
        return widen_f16(blk + P::kD + 2 * size_t(v) * kLanes);
    }
}

// 16 channels' values (x >> shift) & mask, from u32 or u16 lanes, as bytes.
inline __m128i bytes_of_u32(const uint8_t* p, int shift, int mask) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_srli_epi32(_mm512_loadu_si512(p), unsigned(shift)), _mm512_set1_epi32(mask)));
#else
    const VI m = vset1i(mask);
    const VI a = vand(srl32(vloadi(p), shift), m), b = vand(srl32(vloadi(p + 32), shift), m);
    const VI w = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));   // 16 u16 in order
    return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
#endif
}
inline __m128i bytes_of_u16(const uint8_t* p, int shift, int mask) {
    const __m256i w = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), shift),
                                       _mm256_set1_epi16(short(mask)));
#if defined(__AVX512F__)
    return _mm256_cvtepi16_epi8(w);
#else
    return _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
#endif
}
// Sub-block j's (its half h's) odd scales 2 s + 1 of the 16 channels, as bytes.
template <class P>
inline __m128i odd_scales(const uint8_t* blk, const uint8_t* sub, int j, int h) {
    __m128i s;
    if constexpr (std::is_same_v<P, IQ2XS> || std::is_same_v<P, IQ2S>)
        s = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + P::kScales)), 4 * h), _mm_set1_epi8(15));
    else if constexpr (std::is_same_v<P, IQ3S>)
        s = bytes_of_u32(blk + P::kScales, 4 * j, 15);
    else if constexpr (std::is_same_v<P, IQ1S>)
        s = bytes_of_u16(sub + P::kWords, 12, 7);
    else if constexpr (std::is_same_v<P, IQ1M>)
        s = bytes_of_u16(blk + P::kD + 32 * size_t(j / 2), 6 * (j % 2) + 3 * h, 7);
    else   // IQ2_XXS, IQ3_XXS: the top nibble of each sign-and-scale word
        s = bytes_of_u32(sub + P::kWords, 28, 15);
    return _mm_or_si128(_mm_add_epi8(s, s), _mm_set1_epi8(1));
}
// Sub-block j's channel scales (its half h's for the kHalfScales forms): d * kBlockFactor * (2 s + 1),
// bit for bit the file's d * (0.5 + ls) * step, d * (2 s + 1) / 8 and d * (2 s + 1) (the factors are
// powers of two: one rounding either way).
template <class P>
inline void sub_scales(const uint8_t* sub, const VF* d, int j, VF* scale, int h = 0) {
    alignas(16) uint8_t odd[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(odd), odd_scales<P>(sub - P::kCodes - size_t(j) * P::kSubBytes, sub, j, h));
    for (int v = 0; v < kVecsPerPanel; ++v) {
        const VF s = vmul(vmul(d[v], vset1(kBlockFactor<P>)), vcvt(widen_u8_i32(odd + v * kLanes)));
#if defined(__AVX512F__)
        const VI sj = _mm512_castps_si512(s);
        scale[2 * v] = _mm512_castsi512_ps(qwords<0>(sj));
        scale[2 * v + 1] = _mm512_castsi512_ps(qwords<1>(sj));
#else
        const VI sj = _mm256_castps_si256(s);
        scale[2 * v] = _mm256_castsi256_ps(qwords<0>(sj));
        scale[2 * v + 1] = _mm256_castsi256_ps(qwords<1>(sj));
#endif
    }
}

template <class P>
inline void decode_sub(const uint8_t* sub, const VF* d, int j, SubBlock& sb) {
    each_group<P>(sub, [&]<int l, int q>(VI g, VI sq) {
        if constexpr (kUnsignedGrid<P>) sb.u[l][q] = g;
        else sb.u[l][q] = group_codes<P, l>(g, sq);
    });
    sub_scales<P>(sub, d, j, sb.scale);
    if constexpr (kHalfScales<P>) sub_scales<P>(sub, d, j, sb.scale + kQ, 1);
}

// A row's dots with group l's codes: hi (and lo) += u . the 8 activations at k0 + 32 j + 8 l.
template <bool kTwoPass>
inline void group_dots(const VI* u, const ActRow& a, int64_t at, VI* hi, VI* lo) {
    int64_t xh;
    std::memcpy(&xh, a.hi + at, 8);
    const VI ah = set1q(xh);
    for (int q = 0; q < kQ; ++q) hi[q] = dot_u8s8(hi[q], u[q], ah);
    if constexpr (kTwoPass) {
        int64_t xl;
        std::memcpy(&xl, a.lo + at, 8);
        const VI al = set1q(xl);
        for (int q = 0; q < kQ; ++q) lo[q] = dot_u8s8(lo[q], u[q], al);
    }
}

// acc[q] += s_a * s_j * (dot - offset sum(x)) over the n 16-k spans from span g16 of the row (a
// sub-block: two; IQ1_M's halves: one). Each channel's dot is its qword's two dword lanes (k 0..3
// and 4..7 of every group), added here.
template <class P, bool kTwoPass>
inline void finish_span(const VI* hi, const VI* lo, const VF* scale, const ActRow& a, int64_t k0, int64_t g16, int n,
                        VF* acc) {
    int32_t sum = a.sums_hi[g16] + (n == 2 ? a.sums_hi[g16 + 1] : 0);
    float sa = a.scale[k0 / kQK];
    if constexpr (kTwoPass) {
        sum = 128 * sum + a.sums_lo[g16] + (n == 2 ? a.sums_lo[g16 + 1] : 0);
        sa *= 1.0f / 128.0f;
    }
    const VI z = vset1i(P::kOffset * sum);   // exact: |62 * sum| < 2^25
    for (int q = 0; q < kQ; ++q) {
        VI dot = vaddi(hi[q], srli64_32(hi[q]));   // |.| < 2^19 per plane (u <= 124, 32 k)
        if constexpr (kTwoPass) dot = vaddi(vslli32<7>(dot), vaddi(lo[q], srli64_32(lo[q])));
        acc[q] = vfma(vmul(scale[q], vset1(sa)), vcvt(vsubi(dot, z)), acc[q]);
    }
}

// IQ1_M, IQ2_XS: after group l's dots, a half's end (l = 1, 3) finishes the half with its scales
// (kQ vectors) and clears the dots.
template <class P, bool kTwoPass>
inline void finish_half(int l, VI* hi, VI* lo, const VF* scale, const ActRow& a, int64_t k0, int j, VF* acc) {
    if (l % 2 == 0) return;
    finish_span<P, kTwoPass>(hi, lo, scale, a, k0, (k0 + 32 * j) / 16 + l / 2, 1, acc);
    for (int q = 0; q < kQ; ++q) hi[q] = lo[q] = vzeroi();
}

// One row's share of a decoded sub-block (prefill: the sub-block is shared by every row).
template <class P, bool kTwoPass>
inline void row_sub(const SubBlock& sb, const ActRow& a, int64_t k0, int j, VF* acc) {
    VI hi[kQ], lo[kQ];
    for (int q = 0; q < kQ; ++q) hi[q] = lo[q] = vzeroi();
    for (int l = 0; l < 4; ++l) {
        group_dots<kTwoPass>(sb.u[l], a, k0 + 32 * j + 8 * l, hi, lo);
        if constexpr (kHalfScales<P>) finish_half<P, kTwoPass>(l, hi, lo, sb.scale + (l / 2) * kQ, a, k0, j, acc);
    }
    if constexpr (!kHalfScales<P>) finish_span<P, kTwoPass>(hi, lo, sb.scale, a, k0, (k0 + 32 * j) / 16, 2, acc);
}

// ---- one row alone (decode): a block's dots in integers ----
// Every grid form's sub-block scale is an odd integer 2 s + 1 times a per-block factor of d
// (kBlockFactor: IQ2_* d / 8, IQ3_XXS d / 4, IQ1_* d / 8, IQ3_S d). A lone row therefore takes 2 s + 1 into the
// vpmaddwd that widens its group dots (VNNI: one vpmulld per scale span), and adds a whole block's
// dots in int32 (|.| < 2^26) before one conversion and multiply per block, where a float finish per
// sub-block (scales made, dots converted and multiplied) had been a fifth of the loop. The signed
// forms apply their signs to the activations (no code offset, no activation sums to subtract);
// IQ1's codes keep their offset 9, subtracted per 16 k as 9 (2 s + 1) sum(x).
// The odd scales spread over channels q kQLanes ..'s qwords: in every int16 lane (the vpmaddwd
// operand) or, with VNNI, in both dword lanes (vpmulld's); vpshufb's 0x80 bytes make the zeros.
#if defined(__AVX512VNNI__)
constexpr bool kScaleInMadd = false;
#else
constexpr bool kScaleInMadd = true;
#endif
struct ScaleSpread {
    alignas(64) uint64_t control[kQ][8];
};
constexpr ScaleSpread make_scale_spread() {
    ScaleSpread t{};
    for (int q = 0; q < kQ; ++q)
        for (int i = 0; i < 8; ++i) {
            const uint64_t c = uint64_t(q * kQLanes + i % kQLanes);   // the channel's byte of the 16
            t.control[q][i] = kScaleInMadd ? 0x8000800080008000ull | c * 0x0001000100010001ull
                                           : 0x8080800080808000ull | c * 0x0000000100000001ull;
        }
    return t;
}
constexpr ScaleSpread kScaleSpread = make_scale_spread();
template <int q>
inline VI spread_scales(__m128i s) {
#if defined(__AVX512F__)
    return shuffle_bytes(_mm512_broadcast_i32x4(s), vloadi(kScaleSpread.control[q]));
#else
    return shuffle_bytes(_mm256_broadcastsi128_si256(s), vloadi(kScaleSpread.control[q]));
#endif
}

template <class P, bool kTwoPass>
inline void lone_row_block(const uint8_t* blk, const ActRow& a, int64_t k0, VF* acc) {
    VI hi[kQ], lo[kQ], span_hi[kQ], span_lo[kQ];   // span_*: VNNI's dots of the current scale span
    for (int q = 0; q < kQ; ++q) hi[q] = lo[q] = span_hi[q] = span_lo[q] = vzeroi();
    for (int j = 0; j < 8; ++j) {
        const uint8_t* sub = blk + P::kCodes + size_t(j) * P::kSubBytes;
        // Every line of the sub-block (two lines covered only IQ2_XXS's 128 bytes: the larger
        // forms' third and fourth lines waited on memory once per sub-block)
        for (size_t at = 0; at < P::kSubBytes; at += 64) prefetch_decode_stream<4096>(sub + at);
        __m128i odd = odd_scales<P>(blk, sub, j, 0);
        VI ah = vzeroi(), al = vzeroi();   // group l's 8 activations in every qword
        each_group<P>(sub, [&]<int l, int q>(VI g, VI sq) {
            const int64_t at = k0 + 32 * j + 8 * l;
            const int64_t g16 = (k0 + 32 * j) / 16 + l / 2;   // this group's 16-k span
            if constexpr (q == 0) {
                if constexpr (kHalfScales<P> && l == 2) odd = odd_scales<P>(blk, sub, j, 1);
                int64_t x;
                std::memcpy(&x, a.hi + at, 8);
                ah = set1q(x);
                if constexpr (kTwoPass) {
                    std::memcpy(&x, a.lo + at, 8);
                    al = set1q(x);
                }
            }
            VI xh = ah, xl = al;
            if constexpr (!kUnsignedGrid<P>) {
                const SignMask neg = sign_mask<P, l>(sq);
                xh = apply_sign(ah, neg);
                if constexpr (kTwoPass) xl = apply_sign(al, neg);
            }
            const VI sc = spread_scales<q>(odd);
            if constexpr (kScaleInMadd) {
#if defined(__AVX512F__)
                const auto madd = [](VI p, VI w) { return _mm512_madd_epi16(p, w); };
                const auto pairs = [](VI u, VI x) { return _mm512_maddubs_epi16(u, x); };
#else
                const auto madd = [](VI p, VI w) { return _mm256_madd_epi16(p, w); };
                const auto pairs = [](VI u, VI x) { return _mm256_maddubs_epi16(u, x); };
#endif
                hi[q] = vaddi(hi[q], madd(pairs(g, xh), sc));
                if constexpr (kTwoPass) lo[q] = vaddi(lo[q], madd(pairs(g, xl), sc));
                if constexpr (kUnsignedGrid<P> && l % 2 == 0) {   // 9 (2 s + 1) sum(x) of the span: in one int16 lane
                    hi[q] = vsubi(hi[q], madd(sc, set1q(int64_t(uint16_t(P::kOffset * a.sums_hi[g16])))));
                    if constexpr (kTwoPass) lo[q] = vsubi(lo[q], madd(sc, set1q(int64_t(uint16_t(P::kOffset * a.sums_lo[g16])))));
                }
            } else {
#if defined(__AVX512VNNI__)   // the span's dots by vpdpbusd, scaled at its end
                span_hi[q] = dot_u8s8(span_hi[q], g, xh);
                if constexpr (kTwoPass) span_lo[q] = dot_u8s8(span_lo[q], g, xl);
                constexpr bool kSpanEnd = kHalfScales<P> || kUnsignedGrid<P> ? l % 2 == 1 : l == 3;
                if constexpr (kSpanEnd) {
                    if constexpr (kUnsignedGrid<P>) {   // the offset's share of the 16-k span
                        span_hi[q] = vsubi(span_hi[q], set1q(int64_t(uint32_t(P::kOffset * a.sums_hi[g16]))));
                        if constexpr (kTwoPass) span_lo[q] = vsubi(span_lo[q], set1q(int64_t(uint32_t(P::kOffset * a.sums_lo[g16]))));
                    }
                    hi[q] = vaddi(hi[q], _mm512_mullo_epi32(span_hi[q], sc));
                    if constexpr (kTwoPass) lo[q] = vaddi(lo[q], _mm512_mullo_epi32(span_lo[q], sc));
                    span_hi[q] = span_lo[q] = vzeroi();
                }
#endif
            }
        });
    }
    // acc += d * factor * s_a * (hi + lo / 128): each channel's two dword lanes added, then one
    // conversion and multiply-add per block.
    const float sa = a.scale[k0 / kQK] * kBlockFactor<P>;
    for (int v = 0; v < kVecsPerPanel; ++v) {
#if defined(__AVX512F__)
        const VI f = _mm512_castps_si512(vmul(block_d<P>(blk, v), vset1(sa)));
        const auto as_float = [](VI i) { return _mm512_castsi512_ps(i); };
#else
        const VI f = _mm256_castps_si256(vmul(block_d<P>(blk, v), vset1(sa)));
        const auto as_float = [](VI i) { return _mm256_castsi256_ps(i); };
#endif
        const VF fq[2] = {as_float(qwords<0>(f)), as_float(qwords<1>(f))};
        for (int h = 0; h < 2; ++h) {
            const int q = 2 * v + h;
            acc[q] = vfma(fq[h], vcvt(vaddi(hi[q], srli64_32(hi[q]))), acc[q]);
            if constexpr (kTwoPass) acc[q] = vfma(vmul(fq[h], vset1(1.0f / 128.0f)), vcvt(vaddi(lo[q], srli64_32(lo[q]))), acc[q]);
        }
    }
}

// Every row of one panel. One row (decode) keeps its accumulators in registers; more rows share
// each decoded sub-block, their accumulators in a buffer: the codes are decoded once per panel.
template <class P, bool kTwoPass>
void rows(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* panel, float* out, int64_t ldo,
          int cols) {
    thread_local std::vector<VF> many;
    VF one[kQ];
    VF* acc = one;
    if (rows > 1) {
        many.resize(size_t(rows * kQ));
        acc = many.data();
    }
    for (int64_t i = 0; i < rows * kQ; ++i) acc[i] = vzero();
    // f(sub-block pointer, k0, j, d) over the panel's sub-blocks.
    const auto each_sub = [&](auto&& f) {
        for (int64_t b = 0; b < k / P::kBlockK; ++b) {
            const uint8_t* blk = panel + size_t(b) * P::kBlockBytes;
            VF d[kVecsPerPanel];
            for (int v = 0; v < kVecsPerPanel; ++v) d[v] = block_d<P>(blk, v);
            for (int j = 0; j < 8; ++j) f(blk + P::kCodes + size_t(j) * P::kSubBytes, b * P::kBlockK, j, d);
        }
    };
    if (rows == 1) {   // decode: straight-line, the stream prefetched ahead
        const ActRow a = act_row(x, k);
        for (int64_t b = 0; b < k / P::kBlockK; ++b)
            lone_row_block<P, kTwoPass>(panel + size_t(b) * P::kBlockBytes, a, b * P::kBlockK, acc);
    } else {
        each_sub([&](const uint8_t* sub, int64_t k0, int j, const VF* d) {
            SubBlock sb;
            decode_sub<P>(sub, d, j, sb);
            for (int64_t r = 0; r < rows; ++r) row_sub<P, kTwoPass>(sb, act_row(x + size_t(r) * row_bytes, k), k0, j, acc + r * kQ);
        });
    }
    for (int64_t r = 0; r < rows; ++r) {
        VI t[kQ], lanes[kVecsPerPanel];
#if defined(__AVX512F__)
        for (int q = 0; q < kQ; ++q) t[q] = _mm512_castps_si512(acc[r * kQ + q]);
        channel_order(t, lanes);
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + r * ldo + v * kLanes, _mm512_castsi512_ps(lanes[v]), n);
        }
#else
        for (int q = 0; q < kQ; ++q) t[q] = _mm256_castps_si256(acc[r * kQ + q]);
        channel_order(t, lanes);
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + r * ldo + v * kLanes, _mm256_castsi256_ps(lanes[v]), n);
        }
#endif
    }
}

}  // namespace iq2

// Every row of one panel: out[r][0, cols) for r < rows.
template <class P>
void panel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* p, bool two_pass, float* out,
           int64_t ldo, int cols) {
    if constexpr (kGridForm<P>) {
        two_pass ? iq2::rows<P, true>(x, row_bytes, rows, k, p, out, ldo, cols)
                 : iq2::rows<P, false>(x, row_bytes, rows, k, p, out, ldo, cols);
    } else if (two_pass) {
        for_row_blocks<row_block<P>()>(rows, [=]<int M>(int64_t r) {
            panel_rows<P, M, true>(x + size_t(r) * row_bytes, row_bytes, k, p, out + r * ldo, ldo, cols);
        });
    } else {
        for_row_blocks<row_block<P>()>(rows, [=]<int M>(int64_t r) {
            panel_rows<P, M, false>(x + size_t(r) * row_bytes, row_bytes, k, p, out + r * ldo, ldo, cols);
        });
    }
}

}  // namespace ggml_panels

// ---- layout, packer (kt/formats/ggml_panels.h) -----------------------------------------------

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

// ---- tiles ----------------------------------------------------------------------------------

kt_status check_tile_range(const char* which, int64_t n0, int64_t n1, int64_t n) {
    if (0 <= n0 && n0 < n1 && n1 <= n) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, "LLAMAFILE %s tile [%lld, %lld) is outside [0, %lld)", which, (long long)n0,
                (long long)n1, (long long)n);
}

// Columns [n0, n1) of one matrix for every activation row: out[r * ldo + n - n0].
void matrix_tile(const G::Matrix& m, const uint8_t* base, const uint8_t* x, size_t ab, int64_t rows, int64_t n0, int64_t n1,
                 int pass, float* out, int64_t ldo) {
    const uint8_t* data = base + m.offset;
    const size_t bytes = m.panel_bytes;
    for (int64_t n = n0; n < n1; n += kPanel) {
        const uint8_t* p = data + size_t(n / kPanel) * bytes;
        const int cols = int(std::min<int64_t>(kPanel, n1 - n));
        G::with_panels(m.type->dtype, [&]<class P>(P) {
            ggml_panels::panel<P>(x, ab, rows, m.cols, p, pass == 1, out + (n - n0), ldo, cols);
        });
    }
}

constexpr int64_t kWholeTileRows = 8;

// Gate's and up's columns [n0, n1) for every activation row, column n at n - n0 of out_gate / out_up.
kt_status gate_up_products(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    const G::Expert l = layout(c);
    if (!l.ok) return check_config(c);
    if (const kt_status st = check_tile_range("gate/up", n0, n1, c->intermediate)) return st;
    const int pass = one_activation_pass(c) ? 0 : 1;
    const auto* base = static_cast<const uint8_t*>(packed);
    const auto* x = static_cast<const uint8_t*>(act);
    const size_t ab = act_row_bytes(c->hidden);
    matrix_tile(l.m[0], base, x, ab, rows, n0, n1, pass, out_gate, ldo);
    matrix_tile(l.m[1], base, x, ab, rows, n0, n1, pass, out_up, ldo);
    return KT_OK;
}

kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    const GateScope activation(c);   // the layer's gated activation, for the epilogue below
    // Gate's columns, then up's into scratch, then SiLU(gate) * up. Up to kWholeTileRows rows
    // (decode) the whole tile of gate and then of up: each matrix read as one forward stream,
    // not alternating between the two every panel, which the hardware prefetchers follow
    // worse (docs/performance.md). More rows take one panel's width
    // at a time, so the scratch stays L1-sized while the panel's rows are reused.
    const int64_t span = rows <= kWholeTileRows ? n1 - n0 : kPanel;
    thread_local std::vector<float> scratch;
    scratch.resize(size_t(2 * rows * span));
    float* g = scratch.data();
    float* u = g + rows * span;
    for (int64_t n = n0; n < n1; n += span) {
        const int64_t e = std::min(n1, n + span);
        if (const kt_status st = gate_up_products(c, packed, act, rows, n, e, g, u, span)) return st;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < e - n; ++i) out[r * ldo + n + i] = gate_mul(g[r * span + i], u[r * span + i]);
    }
    return KT_OK;
}

// Plugin ABI 1.4's raw tile: the same products as they are, for the activations kt-core applies
// itself (expert biases, the limit after SiLU, GELU-tanh).
kt_status gate_up_raw_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    return gate_up_products(c, packed, act, rows, n0, n1, out_gate, out_up, ldo);
}

kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    const G::Expert l = layout(c);
    if (!l.ok) return check_config(c);
    if (const kt_status st = check_tile_range("down", n0, n1, c->hidden)) return st;
    const int pass = one_activation_pass(c) ? 0 : 1;
    matrix_tile(l.m[2], static_cast<const uint8_t*>(packed), static_cast<const uint8_t*>(act), act_row_bytes(c->intermediate),
                rows, n0, n1, pass, out + n0, ldo);
    return KT_OK;
}

}  // namespace

kt_method_kernels llamafile_kernels(const char* kernel_id) {
    return method_table("LLAMAFILE", G::kId, kernel_id, packed_bytes, pack, act_row_bytes, quantize, gate_up_tile,
                        down_tile, gate_up_raw_tile);
}

}  // namespace KT_TARGET_NAMESPACE
