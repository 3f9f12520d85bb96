// Training's transposed products read the packed panels column by column (the panels run the
// other way: 16 output channels n, per input column k one 16-lane vector): each format's column
// reader, and widen_run, which turns a run of channels' columns into rows W[n][k-block] in f32.
// Shared by kt-backend-avx's FMA kernels (transposed.cpp) and kt-backend-amx's tile kernels,
// which build their B tiles from the same rows.
#pragma once
#include <kt/formats/checkpoint_inputs.h>
#include <kt/formats/packed_layouts.h>

#include "fp8_layout.h"
#include "int4_layout.h"
#include "int_dot.h"
#include "lanes.h"

namespace KT_TARGET_NAMESPACE::transposed {

constexpr int kVecs = 4;                           // k-vectors per row of a W block
constexpr int64_t kKBlock = kVecs * kLanes;        // columns per block: 64 (AVX-512), 32 (AVX2)
constexpr int64_t kRun = 128;                      // channels per run: W rows of a run stay in L1
constexpr int64_t kTileBlock = 64;                 // transposed_block: a multiple of every kKBlock

// --- widening: the 16 lanes of column k of a panel, as f32 ---------------------------------
// Each format writes lanes [v * kLanes, (v + 1) * kLanes) of column k (k < K).

struct Bf16Columns {
    VF operator()(const uint8_t* panel, int64_t k, int v) const {
        const VI w = vloadi(panel + size_t(k / 2) * 64 + size_t(v) * kLanes * 4);
        return (k & 1) ? bf16_odd(w) : bf16_even(w);
    }
};

struct Int8Columns {
    // The codes alone (exact in f32 and in bf16); the value is codes * the channel's scale.
    static VF codes(const uint8_t* panel, int64_t k, int v) {
        namespace l8 = kt::layouts::int8;
        const VI w = vloadi(panel + l8::kHeaderBytes + size_t(k / 4) * 64 + size_t(v) * kLanes * 4);
        // Byte k % 4 of each lane, sign-extended: shift it to the top, then arithmetically down.
        const int up = 24 - 8 * int(k % 4);
#if defined(__AVX512F__)
        return vcvt(_mm512_srai_epi32(_mm512_sllv_epi32(w, _mm512_set1_epi32(up)), 24));
#else
        return vcvt(_mm256_srai_epi32(_mm256_sllv_epi32(w, _mm256_set1_epi32(up)), 24));
#endif
    }
    static const float* scales(const uint8_t* panel) { return reinterpret_cast<const float*>(panel); }
    VF operator()(const uint8_t* panel, int64_t k, int v) const { return vmul(codes(panel, k, v), vload(scales(panel) + v * kLanes)); }
};

// The INT4 family's layout: INT4, RAWINT4, GPTQ_INT4 (u - 8, or u times s minus s*z), and with e2m1
// MXFP4 and NVFP4, whose E2M1 codes are looked up as u = 2 value + 12 (packed_layouts.h) and whose
// halved scales make w = s (u - 12) — times NVFP4's per-panel vector.
struct Int4Columns {
    Int4Layout lay;
    bool e2m1 = false;
    VF operator()(const uint8_t* panel, int64_t k, int v) const {
        const uint8_t* header = panel + lay.group_at(k / lay.g);
        const int64_t within = k % lay.g, b = within % 8;
        const VI w = vloadi(header + lay.header_bytes() + size_t(within / 8) * 64 + size_t(v) * kLanes * 4);
        // Byte b % 4 of each lane holds k in its low nibble for b < 4, in its high one after.
        const int shift = 8 * int(b % 4) + (b >= 4 ? 4 : 0);
#if defined(__AVX512F__)
        const VI u = _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_set1_epi32(shift)), _mm512_set1_epi32(15));
#else
        const VI u = _mm256_and_si256(_mm256_srlv_epi32(w, _mm256_set1_epi32(shift)), _mm256_set1_epi32(15));
#endif
        const VF s = lay.scale(header, v);
        if (lay.zero_point) return vsub(vmul(s, vcvt(u)), lay.scale_times_zero(header, v));
        if (!e2m1) return vmul(s, vsub(vcvt(u), vset1(8.0f)));
        // pshufb looks the low byte up; the lanes' zero high bytes would read entry 0: masked off.
#if defined(__AVX512F__)
        const VI doubled = _mm512_and_si512(vlookup16(kt::layouts::mxfp4::kDoubledPlusOffset, u), _mm512_set1_epi32(0xff));
#else
        const VI doubled = _mm256_and_si256(vlookup16(kt::layouts::mxfp4::kDoubledPlusOffset, u), _mm256_set1_epi32(0xff));
#endif
        const VF value = vmul(s, vsub(vcvt(doubled), vset1(float(kt::layouts::mxfp4::kOffset))));
        return lay.prefix_bytes ? vmul(value, Int4Layout::panel_scale(panel, v)) : value;
    }
};

// FP8 (a scale vector per 128 k), FP8_PERCHANNEL (the same vector in every block) and MXFP8 (per
// 32 k): the E4M3 codes decoded exactly to value / 256 (the 2^8 is in the packed scales) times
// their block's scale vector. The codes follow the matrix's scale vectors, so where they start
// depends on K: widen_run binds the reader to it (bound).
template <kt::inputs::Fp8Scales kScales>
struct Fp8Columns {
    static constexpr fp8_layout::Geometry kGeo = kt::inputs::fp8_geometry(kScales, kFp8RowGroup);
    size_t codes = 0;   // the codes' offset in a panel of the bound K
    Fp8Columns bound(int64_t K) const { return {kGeo.codes_at(K)}; }
    VF operator()(const uint8_t* panel, int64_t k, int v) const {
        const VF s = vload(reinterpret_cast<const float*>(panel + size_t(k / kGeo.block) * kFp8ScaleBytes) + v * kLanes);
        return vmul(decode(panel + codes, k, v), s);
    }
    static VF decode(const uint8_t* codes, int64_t k, int v) {
        if constexpr (kFp8RowGroup == 1) {   // v1: row k's 16 codes in lane order
            return vload_e4m3_over_256(codes + size_t(k) * kPanel + size_t(v) * kLanes);
        } else {
#if defined(__AVX512VBMI__)
            // v2: rows k - k % 4 .. + 3 in one 64-byte group, lane l's code of row r at byte
            // 16 (l / 4) + 8 (r / 2) + 2 (l % 4) + r % 2 (fp8::Geometry::code_offset): one byte permute.
            const int r = int(k % 4);
            const __m512i at = _mm512_add_epi8(
                _mm512_castsi128_si512(_mm_setr_epi8(0, 2, 4, 6, 16, 18, 20, 22, 32, 34, 36, 38, 48, 50, 52, 54)),
                _mm512_set1_epi8(char(8 * (r / 2) + r % 2)));
            const __m512i group = _mm512_loadu_si512(codes + size_t(k - r) * kPanel);
            return vcvt_e4m3_over_256(_mm512_castsi512_si128(_mm512_permutexvar_epi8(at, group)));
#else
            static_assert(kFp8RowGroup == 1, "v2 (four-row) FP8 panels are packed only on targets with AVX512-VBMI");
            return vzero();
#endif
        }
    }
};

// A column reader bound to the matrix's K where it needs it (Fp8Columns), as it is otherwise.
template <class Columns>
Columns bind(const Columns& col, int64_t K) {
    if constexpr (requires { col.bound(K); }) return col.bound(K);
    else return col;
}

// Rows W[n][0 .. kKBlock) for the channels [n0, n0 + count) (count <= kRun, panel-aligned n0) of
// a matrix with K columns, columns [kb, kb + kKBlock) of it; columns >= K are zero.
template <class Columns>
void widen_run(const Columns& column_reader, const uint8_t* base, size_t first_panel, size_t panel_stride, int64_t n0,
               int64_t count, int64_t K, int64_t kb, float* w) {
    const Columns col = bind(column_reader, K);
    alignas(64) float t[kPanel * kPanel];   // 16 columns x 16 lanes, column-major
    for (int64_t n = n0; n < n0 + count; n += kPanel) {
        const uint8_t* panel = base + first_panel + size_t(n / kPanel) * panel_stride;
        float* rows = w + (n - n0) * kKBlock;   // W rows of this panel's 16 channels
        for (int64_t k16 = kb; k16 < kb + kKBlock; k16 += kPanel) {
#if defined(__AVX512F__)
            __m512i r[16];
            for (int j = 0; j < 16; ++j)
                r[j] = k16 + j < K ? _mm512_castps_si512(col(panel, k16 + j, 0)) : _mm512_setzero_si512();
            transpose16x16(r);   // r[lane] = columns k16 .. k16 + 15 of channel n + lane
            for (int lane = 0; lane < 16; ++lane) _mm512_storeu_si512(rows + lane * kKBlock + (k16 - kb), r[lane]);
#else
            for (int j = 0; j < 16; ++j)
                for (int v = 0; v < kVecsPerPanel; ++v)
                    vstore(t + j * kPanel + v * kLanes, k16 + j < K ? col(panel, k16 + j, v) : vzero());
            for (int lane = 0; lane < kPanel; ++lane)
                for (int j = 0; j < kPanel; ++j) rows[lane * kKBlock + (k16 - kb) + j] = t[j * kPanel + lane];
#endif
        }
    }
}

inline kt_status check(const char* method, int64_t k0, int64_t k1, int64_t K) {
    if (k0 % kTileBlock == 0 && k0 < k1 && k1 <= K) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, "%s transposed tile [%lld, %lld) is not %lld-aligned within [0, %lld)", method,
                (long long)k0, (long long)k1, (long long)kTileBlock, (long long)K);
}

#if defined(__AVX512F__)
// Pair words for products that sum over channel pairs (vdpbf16ps, AMX-BF16): 16 channels' rows of
// 32 bf16 values each (k in order: row[lane] = W[n + lane][k .. k + 31], one 32-k half of a 64-column
// block) interleaved 16 bits at a time give the words (W[n][k], W[n + 1][k]) for k = 0-3, 8-11,
// 16-19, 24-27 of the 32 (unpacklo) and 4-7, 12-15, ... (unpackhi). Vector v = 2 * half + (0:
// unpacklo, 1: unpackhi) of pair p goes to P[p * pair_stride + v * v_stride]; its lane i holds
// k = kb + 32 half + 8 (i / 4) + 4 (v % 2) + i % 4 (pair_word_columns puts sums back in order). `pair0` is
// the pair of row 0.
inline void pair_words_from_rows(const __m512i row[16], int half, __m512i* P, size_t pair0, size_t pair_stride,
                                 size_t v_stride) {
    for (int lane = 0; lane < 16; lane += 2) {
        __m512i* pair = P + (pair0 + size_t(lane / 2)) * pair_stride + size_t(2 * half) * v_stride;
        pair[0] = _mm512_unpacklo_epi16(row[lane], row[lane + 1]);
        pair[v_stride] = _mm512_unpackhi_epi16(row[lane], row[lane + 1]);
    }
}

// BF16's panels as pair words: channels [n0, n0 + count) (panel-aligned, count a multiple of 16),
// columns [kb, kb + 64). 16 chunks of a panel transposed give each channel's row of 32 bf16.
inline void bf16_pair_words(const uint8_t* base, size_t first_panel, size_t stride, int64_t n0, int64_t count, int64_t K,
                            int64_t kb, __m512i* P, size_t pair_stride, size_t v_stride) {
    for (int64_t n = n0; n < n0 + count; n += kPanel) {
        const uint8_t* panel = base + first_panel + size_t(n / kPanel) * stride;
        for (int half = 0; half < 2; ++half) {
            const int64_t k = kb + 32 * half;   // chunks k/2 .. k/2 + 15
            __m512i r[16];
            for (int c = 0; c < 16; ++c)
                r[c] = 2 * (k / 2 + c) < K ? _mm512_loadu_si512(panel + size_t(k / 2 + c) * 64) : _mm512_setzero_si512();
            transpose16x16(r);   // r[lane] = bf16 W[n + lane][k .. k + 31]
            pair_words_from_rows(r, half, P, size_t(n - n0) / 2, pair_stride, v_stride);
        }
    }
}

#if defined(__AVX512BF16__)
// Pair-word makers, one per format: words(base, first_panel, panel_stride, count, K, kb, P, T)
// writes channels [0, count)'s pair words for columns [kb, kb + 64) with pair_stride 1 and
// v_stride T. A maker whose words are codes also has scale(panel, lane): the factor of each channel
// that the products move onto the gradients.
struct Bf16Words {   // the packed values: exact
    void operator()(const uint8_t* base, size_t first, size_t stride, int64_t count, int64_t K, int64_t kb, __m512i* P,
                    size_t T) const {
        bf16_pair_words(base, first, stride, 0, count, K, kb, P, 1, T);
    }
};
// INT8's codes as bf16 (exact: |q| <= 127 has 7 significant bits), its per-channel scales moved
// onto the gradients. 16 chunks of 4 codes per lane transposed give each channel's 64 codes.
struct Int8Words {
    static float scale(const uint8_t* panel, int lane) { return kt::layouts::int8::scale(panel, lane); }
    void operator()(const uint8_t* base, size_t first, size_t stride, int64_t count, int64_t K, int64_t kb, __m512i* P,
                    size_t T) const {
        namespace l8 = kt::layouts::int8;
        for (int64_t n = 0; n < count; n += kPanel) {
            const uint8_t* codes = base + first + size_t(n / kPanel) * stride + l8::kHeaderBytes;
            __m512i r[16];
            for (int c = 0; c < 16; ++c)
                r[c] = 4 * (kb / 4 + c) < K ? _mm512_loadu_si512(codes + size_t(kb / 4 + c) * 64) : _mm512_setzero_si512();
            transpose16x16(r);   // r[lane] = codes of W[n + lane][kb .. kb + 63]
            for (int half = 0; half < 2; ++half) {
                __m512i row[16];
                for (int lane = 0; lane < 16; ++lane) {
                    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(r[lane], 0)));
                    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(r[lane], 1)));
                    row[lane] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);   // k in order: lo's 16, then hi's
                    r[lane] = _mm512_shuffle_i32x4(r[lane], r[lane], 0x4e);   // the other 32 codes down, for half 1
                }
                pair_words_from_rows(row, half, P, size_t(n) / 2, 1, T);
            }
        }
    }
};
// The INT4 layout with integer codes (INT4, RAWINT4, GPTQ_INT4): each 32-column half lies in one
// group (G is 32, 64 or 128 and divides K), so its four chunks of eight nibbles per channel are
// transposed once, unpacked in k order and dequantized as s u - s z (s z = 8 s for symmetric
// groups: the f32 value of the column reader's s (u - 8)) before the bf16 rounding. Through the
// column reader (DequantizedWords) instead, a Qwen3-30B-A3B layer's gate/up^T took 334 ms and its
// down^T 174 (128 experts x 128 rows, 2 Zen 4 cores); this way 309 and 158-166.
struct Int4Words {
    Int4Layout lay;
    void operator()(const uint8_t* base, size_t first, size_t stride, int64_t count, int64_t K, int64_t kb, __m512i* P,
                    size_t T) const {
        // Nibbles of word c at lanes 4c..4c+3 (low: k 8c + j, high: k 8c + 4 + j) -> k order.
        alignas(64) static constexpr int32_t kOrder[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                                              {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
        const __m512i order0 = _mm512_load_si512(kOrder[0]), order1 = _mm512_load_si512(kOrder[1]);
        const __m512i nibble = _mm512_set1_epi32(15);
        for (int64_t n = 0; n < count; n += kPanel) {
            const uint8_t* panel = base + first + size_t(n / kPanel) * stride;
            for (int half = 0; half < 2; ++half) {
                const int64_t k = kb + 32 * half;
                __m512i row[16];
                if (k >= K) {
                    for (__m512i& r : row) r = _mm512_setzero_si512();
                    pair_words_from_rows(row, half, P, size_t(n) / 2, 1, T);
                    continue;
                }
                const uint8_t* header = panel + lay.group_at(k / lay.g);
                const uint8_t* codes = header + lay.header_bytes() + size_t(k % lay.g / 8) * 64;
                __m512i r[16];
                for (int c = 0; c < 16; ++c) r[c] = c < 4 ? _mm512_loadu_si512(codes + size_t(c) * 64) : _mm512_setzero_si512();
                transpose16x16(r);   // r[lane]'s first four words: the 32 codes of channel n + lane
                alignas(64) float s[16], sz[16];
                const VF sv = lay.scale(header, 0);
                _mm512_store_ps(s, sv);
                _mm512_store_ps(sz, lay.zero_point ? lay.scale_times_zero(header, 0) : _mm512_mul_ps(sv, _mm512_set1_ps(8.0f)));
                for (int lane = 0; lane < 16; ++lane) {
                    const __m512i bytes = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(r[lane]));
                    const __m512i lo = _mm512_and_si512(bytes, nibble), hi = _mm512_srli_epi32(bytes, 4);
                    const __m512 scale = _mm512_set1_ps(s[lane]), zero = _mm512_set1_ps(sz[lane]);
                    const __m512 w0 = _mm512_fmsub_ps(scale, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, order0, hi)), zero);
                    const __m512 w1 = _mm512_fmsub_ps(scale, _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, order1, hi)), zero);
                    row[lane] = (__m512i)_mm512_cvtne2ps_pbh(w1, w0);
                }
                pair_words_from_rows(row, half, P, size_t(n) / 2, 1, T);
            }
        }
    }
};

// Every other format: its weights dequantized by its column reader (widen_run, as the f32 kernels
// read them) and rounded to bf16 — the rounding QLoRA's bf16 compute applies to its NF4 weights,
// 2^-9 of each weight, next to the gradients' own.
template <class Columns>
struct DequantizedWords {
    Columns col;
    void operator()(const uint8_t* base, size_t first, size_t stride, int64_t count, int64_t K, int64_t kb, __m512i* P,
                    size_t T) const {
        static_assert(kKBlock == 64, "one widened block is one pair-word block");
        alignas(64) float w[kPanel * kKBlock];
        for (int64_t n = 0; n < count; n += kPanel) {
            widen_run(col, base, first, stride, n, kPanel, K, kb, w);   // w[lane * 64 + j] = W[n + lane][kb + j]
            for (int half = 0; half < 2; ++half) {
                __m512i row[16];
                for (int lane = 0; lane < 16; ++lane) {
                    const float* r = w + lane * kKBlock + 32 * half;
                    row[lane] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(r + 16), _mm512_load_ps(r));
                }
                pair_words_from_rows(row, half, P, size_t(n) / 2, 1, T);
            }
        }
    }
};
#endif

// Columns [16 q, 16 q + 16) of a 32-column half in order, from sums in its two pair-word vectors
// (lo = vector 2 h, hi = 2 h + 1): column 16 q + 8 u + 4 w + t is lane 4 (2 q + u) + t of lo (w = 0)
// or hi (w = 1).
inline __m512 pair_word_columns(__m512 lo, __m512 hi, int q) {
    alignas(64) static constexpr int32_t kIndex[2][16] = {{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
                                                           {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
    return _mm512_permutex2var_ps(lo, _mm512_load_si512(kIndex[q]), hi);
}
#endif

// The columns reader and expert geometry of each format.
struct Bf16Format {
    static constexpr const char* kName = "BF16";
#if defined(__AVX512BF16__)
    static Bf16Words pair_words(const kt_moe_config*) { return {}; }
#endif
    static Bf16Columns columns(const kt_moe_config*) { return {}; }
    static ExpertPanels panels(const kt_moe_config* c) { return kt::layouts::bf16::expert(c->hidden, c->intermediate); }
};
struct Int8Format {
    static constexpr const char* kName = "INT8";
#if defined(__AVX512BF16__)
    static Int8Words pair_words(const kt_moe_config*) { return {}; }
#endif
    static Int8Columns columns(const kt_moe_config*) { return {}; }
    static ExpertPanels panels(const kt_moe_config* c) { return kt::layouts::int8::expert(c->hidden, c->intermediate); }
};
template <bool kRaw>
struct Int4Format {
    static constexpr const char* kName = kRaw ? "RAWINT4" : "INT4";
#if defined(__AVX512BF16__)
    static Int4Words pair_words(const kt_moe_config* c) { return {int4_layout(c, kRaw)}; }
#endif
    static Int4Columns columns(const kt_moe_config* c) { return {int4_layout(c, kRaw)}; }
    static ExpertPanels panels(const kt_moe_config* c) { return int4_layout(c, kRaw).expert(c); }
};

template <bool kNv>
struct Fp4Format {   // MXFP4, NVFP4
    static constexpr const char* kName = kNv ? "NVFP4" : "MXFP4";
#if defined(__AVX512BF16__)
    static auto pair_words(const kt_moe_config* c) { return DequantizedWords<decltype(columns(c))>{columns(c)}; }
#endif
    static Int4Layout layout() { return kNv ? nvfp4_layout() : mxfp4_layout(); }
    static Int4Columns columns(const kt_moe_config*) { return {layout(), true}; }
    static ExpertPanels panels(const kt_moe_config* c) { return layout().expert(c); }
};

template <kt::inputs::Fp8Scales kScales>
struct Fp8Format {
    static constexpr const char* kName = kt::inputs::fp8_method_name(kScales);
#if defined(__AVX512BF16__)
    static auto pair_words(const kt_moe_config* c) { return DequantizedWords<decltype(columns(c))>{columns(c)}; }
#endif
    static Fp8Columns<kScales> columns(const kt_moe_config*) { return {}; }
    static ExpertPanels panels(const kt_moe_config* c) { return Fp8Columns<kScales>::kGeo.expert(c->hidden, c->intermediate); }
};

}  // namespace KT_TARGET_NAMESPACE::transposed
