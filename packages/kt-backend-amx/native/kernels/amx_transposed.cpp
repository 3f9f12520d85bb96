// Plugin ABI 1.5's transposed tiles (training's backward) on AMX-BF16:
// out[r, k] = sum_n grad[r, n] W[n, k] for k in [k0, k1), from the packed panels as they are.
//
// A tile product reduces over its A tile's columns, here the channels n, and its B tile must hold
// (W[n][k], W[n + 1][k]) pairs: 16 rows of channel pairs by 16 columns k. The panels hold the
// weights the other way (pairs along k), so for each 64-column block, a run of channels is
// re-packed into such B tiles (L1/L2-resident), then every 16-row block of gradients runs over
// them four C tiles wide, the accumulators kept in a buffer between runs. The re-packing, per
// format (the *Tiles structs below):
//   BF16: the panels' bf16 words transposed and interleaved (bf16_pair_words): exact, one plane,
//         the columns in pair-word order, put back as the block is stored;
//   INT8: the codes (exact in bf16), one plane; the channel's scale, constant along k, goes
//         into the gradient as it is split;
//   INT4, RAWINT4, GPTQ_INT4, MXFP4: the codes into pair rows as INT8's (the E2M1 ones
//         looked up as u = 2 value + 12 first), then the values (their scales change along k, so
//         they cannot go into the gradient) computed per pair and split into bf16 hi + lo planes.
//   FP8, FP8_PERCHANNEL: the E4M3 codes of the v2 panels' four-row groups into pair rows by a
//         byte swap and dword permutes, decoded exactly and times the 128-k block's scales (which
//         change along k), split into bf16 hi + lo planes.
//
// Precision: gradients arrive in f32 and are split into bf16 hi + lo planes (16 significant
// bits); the tiles sum ghi·whi + glo·whi (+ ghi·wlo for split weights) in f32 — all but 2^-16-
// relative terms, so the products are within ~2e-5 of f32 ones (the conformance tolerance is
// 4e-5). A layer with fast_activations takes bf16 gradients alone, as kt-backend-avx's vdpbf16ps
// path does.
//
// Experts with fewer rows than kMinRows take kt-backend-avx's FMA kernels: a run's re-packing
// costs the same for one row as for sixteen.
#include "amx_common.h"
#include "methods.h"
#include "transposed_weights.h"

#include <initializer_list>
#include <string>

namespace KT_TARGET_NAMESPACE {
namespace {

using namespace transposed;

constexpr int64_t kChunk = 32;   // channels per tile step: a B tile's 16 pair rows
constexpr int64_t kTileRun = 128;  // channels whose B tiles are built at once (256 and 768 measured no faster)
static_assert(kKBlock == 64 && kTileRun % kChunk == 0, "a block is 4 C tiles of 16 columns; runs hold whole chunks");
constexpr int64_t kMinRows = 16;  // rows per expert from which the tiles pay (docs/performance.md)

// The avx kernels this file's functions hand small experts to, per method slot.
enum Slot : int { kBf16, kInt8, kInt4, kRaw, kMxfp4, kFp8, kFp8PerChannel, kSlots };
struct AvxTransposed {
    decltype(kt_method_kernels::gate_up_transposed_tile) gate_up;
    decltype(kt_method_kernels::down_transposed_tile) down;
};
AvxTransposed g_avx[kSlots];

inline int64_t min_rows() { return g_amx_min_rows >= 0 ? g_amx_min_rows : kMinRows; }

struct Part {
    size_t first_panel, panel_stride;
    int64_t N;
    const float* grad;
};

// Gradient rows f32 [rows, N] (row stride gs) -> bf16 planes hi (and lo = bf16(g - hi)) at
// columns [at, at + round_up(N, 32)) of rows `ld` wide, the padding zero. kScaled: each channel's
// gradient times its INT8 scale (Int8Columns::scales of its panel).
template <bool kScaled>
void split_gradients(const uint8_t* base, const Part& p, int64_t gs, int64_t rows, uint16_t* hi, uint16_t* lo, int64_t ld,
                     int64_t at) {
    const int64_t padded = round_up(p.N, kChunk);
    for (int64_t n = 0; n < padded; n += 16) {
        const __mmask16 m = n + 16 <= p.N ? __mmask16(0xffff) : n < p.N ? __mmask16((1u << (p.N - n)) - 1) : __mmask16(0);
        __m512 scale = _mm512_set1_ps(1.0f);
        if constexpr (kScaled)
            if (m) scale = _mm512_loadu_ps(Int8Columns::scales(base + p.first_panel + size_t(n / kPanel) * p.panel_stride));
        for (int64_t r = 0; r < rows; ++r) {
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p.grad + r * gs + n), scale);
            const __m256bh h = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * ld + at + n), (__m256i)h);
            if (lo)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * ld + at + n), (__m256i)bf16_lo(v, h));
        }
    }
}

// B tiles: tile (j, chunk c) of a run at b + (j * kTileRun / 2 + c * 16) * 16 words, row p = the
// pair words (W[2p][k], W[2p + 1][k]) of its 16 columns. Each format fills them one panel (16
// channels, 8 pair rows) at a time: pack_panel(col, base, part, n, K, kb, bhi, blo) writes the
// rows of channels [n, n + 16) at bhi (blo: the lo plane), already offset to the panel's first pair.

// The pair rows of channels past the last panel: zero weights.
void zero_panel(uint32_t* bhi, uint32_t* blo) {
    for (int64_t p = 0; p < kPanel / 2; ++p)
        for (int j = 0; j < 4; ++j) {
            const size_t at = size_t(j * kTileRun / 2 + p) * 16;
            _mm512_store_si512(bhi + at, _mm512_setzero_si512());
            if (blo) _mm512_store_si512(blo + at, _mm512_setzero_si512());
        }
}

struct Bf16Tiles {
    using Format = Bf16Format;
    static constexpr bool kSplitWeights = false, kScaledGradients = false, kPairWordColumns = true;
    static Bf16Columns columns(const kt_moe_config*) { return {}; }
    static void pack_panel(const Bf16Columns&, const uint8_t* base, const Part& p, int64_t n, int64_t K, int64_t kb,
                           uint32_t* bhi, uint32_t*) {
        bf16_pair_words(base, p.first_panel, p.panel_stride, n, kPanel, K, kb, reinterpret_cast<__m512i*>(bhi), 1, kTileRun / 2);
    }
};

// Byte codes of 16 channels x 16 k (c[i]: chunk i, k = 4 i .. 4 i + 3, byte 4 lane + k % 4 — the
// INT8 panels' chunk layout) -> pair rows: rows[r] holds pair first(r)'s 16 k in its low 256 bits
// and pair first(r) + 2's in its high, each 128-bit quarter 8 k with the pair's two channels
// interleaved byte by byte (channel 2p at even bytes). A byte shuffle pairs channels 2p, 2p + 1
// within each 8-byte channel pair, then an 8 x 4 transpose of those 8-byte pieces gives each pair's 16 k.
constexpr int kPairRowFirst[4] = {0, 1, 4, 5};
inline void pair_rows(const __m512i c_in[4], __m512i rows[4]) {
    const __m512i pair_bytes = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15));
    const __m512i low_rows = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), high_rows = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m512i c[4];
    for (int i = 0; i < 4; ++i) c[i] = _mm512_shuffle_epi8(c_in[i], pair_bytes);
    // Qword p of chunk i: pair p's 4 k.
    const __m512i t0 = _mm512_unpacklo_epi64(c[0], c[1]), t1 = _mm512_unpackhi_epi64(c[0], c[1]);
    const __m512i t2 = _mm512_unpacklo_epi64(c[2], c[3]), t3 = _mm512_unpackhi_epi64(c[2], c[3]);
    rows[0] = _mm512_permutex2var_epi64(t0, low_rows, t2);
    rows[1] = _mm512_permutex2var_epi64(t1, low_rows, t3);
    rows[2] = _mm512_permutex2var_epi64(t0, high_rows, t2);
    rows[3] = _mm512_permutex2var_epi64(t1, high_rows, t3);
}

// Two 8-k halves of a pair's bf16 words as one B tile row (the first 8 k in the low 256 bits).
inline __m512i join(__m256bh first, __m256bh second) {
    return _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)first), (__m256i)second, 1);
}

// Where pair q's B tile row of column group j goes (bhi / blo offset to the panel's first pair).
inline size_t pair_row_at(int j, int q) { return (size_t(j) * kTileRun / 2 + size_t(q)) * 16; }

// Pair q's B tile row of column group j from its values: the first 8 k (first) and the next 8
// (second), each lane pair the two channels, split into the hi and lo planes.
inline void store_split_row(uint32_t* bhi, uint32_t* blo, int j, int q, __m512 first, __m512 second) {
    const __m256bh h0 = _mm512_cvtneps_pbh(first), h1 = _mm512_cvtneps_pbh(second);
    _mm512_store_si512(bhi + pair_row_at(j, q), join(h0, h1));
    _mm512_store_si512(blo + pair_row_at(j, q), join(bf16_lo(first, h0), bf16_lo(second, h1)));
}

// Column group j's rows of every pair as zero weights, both planes (columns past K).
inline void zero_split_rows(uint32_t* bhi, uint32_t* blo, int j) {
    for (int q = 0; q < kPanel / 2; ++q) {
        _mm512_store_si512(bhi + pair_row_at(j, q), _mm512_setzero_si512());
        _mm512_store_si512(blo + pair_row_at(j, q), _mm512_setzero_si512());
    }
}

struct Int8Tiles {
    using Format = Int8Format;
    static constexpr bool kSplitWeights = false, kScaledGradients = true, kPairWordColumns = false;
    struct Codes {};
    static Codes columns(const kt_moe_config*) { return {}; }
    // The codes straight into pair words (no f32 rows: widening them was half the INT8 products'
    // time at 32 rows per expert): per 16 columns, 4 chunks (16 channels x 4 k each) into pair rows,
    // int8 -> f32 -> bf16 (exact: 8 significant bits) keeping the pairs' order. The channel scales
    // went into the gradients.
    static void pack_panel(const Codes&, const uint8_t* base, const Part& p, int64_t n, int64_t K, int64_t kb,
                           uint32_t* bhi, uint32_t*) {
        const uint8_t* chunks = base + p.first_panel + size_t(n / kPanel) * p.panel_stride + kt::layouts::int8::kHeaderBytes;
        for (int j = 0; j < 4; ++j) {
            __m512i c[4], rows[4];
            for (int i = 0; i < 4; ++i) {
                const int64_t k = kb + 16 * j + 4 * i;
                c[i] = k < K ? _mm512_loadu_si512(chunks + size_t(k / 4) * 64) : _mm512_setzero_si512();
            }
            pair_rows(c, rows);
            for (int r = 0; r < 4; ++r)
                for (int h = 0; h < 2; ++h) {
                    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(rows[r], 2 * h)));
                    const __m512 y = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(rows[r], 2 * h + 1)));
                    _mm512_store_si512(bhi + pair_row_at(j, kPairRowFirst[r] + 2 * h), (__m512i)_mm512_cvtne2ps_pbh(y, x));
                }
        }
    }
};

// F: Int4Format<kRaw> (INT4, GPTQ_INT4, RAWINT4) or Fp4Format<false> (MXFP4: E2M1 codes; this
// backend does not serve NVFP4, whose per-panel vector it would multiply in).
template <class F>
struct Int4Tiles {
    using Format = F;
    static constexpr bool kSplitWeights = true, kScaledGradients = false, kPairWordColumns = false;
    static Int4Columns columns(const kt_moe_config* c) { return Format::columns(c); }
    // The codes into pair rows as INT8's (an 8-k chunk's low nibbles are an INT8 chunk of its first
    // 4 k, its high nibbles of the next 4), then each pair's values s * (u - 8) (or s * u - s*z)
    // with its two channels' scales (constant over the 16 k: groups are multiples of 16), computed
    // as Int4Columns does (the same f32 values), split into bf16 hi + lo — no f32 rows, no 16 x 16
    // transposes (that widening was ~45 % of INT4's transposed products at 32 rows per expert: 62 -> 35 ms).
    // E2M1 codes go through one byte shuffle to u = 2 value + 12 first and take s * (u - 12) (s the
    // halved scale).
    static void pack_panel(const Int4Columns& col, const uint8_t* base, const Part& p, int64_t n, int64_t K, int64_t kb,
                           uint32_t* bhi, uint32_t* blo) {
        const Int4Layout& lay = col.lay;
        const uint8_t* panel = base + p.first_panel + size_t(n / kPanel) * p.panel_stride;
        const __m512i nibble = _mm512_set1_epi8(15);
        const __m512i alternate = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
        const __m512i e2m1 = _mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(kt::layouts::mxfp4::kDoubledPlusOffset)));
        const __m512 offset = _mm512_set1_ps(col.e2m1 ? float(kt::layouts::mxfp4::kOffset) : 8.0f);
        for (int j = 0; j < 4; ++j) {
            const int64_t k = kb + 16 * j;
            if (k >= K) {   // columns past K (K is a multiple of the group size, so of 16): zero weights
                zero_split_rows(bhi, blo, j);
                continue;
            }
            const uint8_t* header = panel + lay.group_at(k / lay.g);
            const uint8_t* codes = header + lay.header_bytes() + size_t(k % lay.g / 8) * 64;
            const __m512i a = _mm512_loadu_si512(codes), b = _mm512_loadu_si512(codes + 64);
            __m512i c[4] = {_mm512_and_si512(a, nibble), _mm512_and_si512(_mm512_srli_epi16(a, 4), nibble),
                            _mm512_and_si512(b, nibble), _mm512_and_si512(_mm512_srli_epi16(b, 4), nibble)};
            if (col.e2m1)
                for (__m512i& ci : c) ci = _mm512_shuffle_epi8(e2m1, ci);
            __m512i rows[4];
            pair_rows(c, rows);
            const __m512 s = lay.scale(header, 0);
            const __m512 sz = lay.zero_point ? lay.scale_times_zero(header, 0) : _mm512_setzero_ps();
            for (int r = 0; r < 4; ++r)
                for (int h = 0; h < 2; ++h) {
                    const int q = kPairRowFirst[r] + 2 * h;
                    const __m512i lanes = _mm512_add_epi32(alternate, _mm512_set1_epi32(2 * q));   // channels 2q, 2q + 1
                    const __m512 sq = _mm512_permutexvar_ps(lanes, s);
                    __m512 v[2];
                    for (int half = 0; half < 2; ++half) {
                        const __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(rows[r], 2 * h + half)));
                        v[half] = lay.zero_point ? _mm512_sub_ps(_mm512_mul_ps(sq, u), _mm512_permutexvar_ps(lanes, sz))
                                                 : _mm512_mul_ps(sq, _mm512_sub_ps(u, offset));
                    }
                    store_split_row(bhi, blo, j, q, v[0], v[1]);
                }
        }
    }
};

template <kt::inputs::Fp8Scales kScales>
struct Fp8Tiles {
    using Format = Fp8Format<kScales>;
    static constexpr bool kSplitWeights = true, kScaledGradients = false, kPairWordColumns = false;
    static Fp8Columns<kScales> columns(const kt_moe_config*) { return {}; }
    // The v2 panels' codes into pair rows without f32 rows: in a four-row group, dword
    // 4 (q / 2) + 2 h + q % 2 holds pair q's channels at rows 2h, 2h + 1 (fp8::Geometry::
    // code_offset), so a byte swap per dword interleaves them (c[2q][k], c[2q + 1][k], ...) and two
    // rounds of dword permutes gather each pair's 16 k from the four groups. The E4M3 bytes then
    // decode exactly (value / 256), times the pair's two channels' scales of the 128-k block (constant
    // over the 16 k) — the f32 values Fp8Columns makes — split into bf16 hi + lo.
    static void pack_panel(const Fp8Columns<kScales>&, const uint8_t* base, const Part& p, int64_t n, int64_t K, int64_t kb,
                           uint32_t* bhi, uint32_t* blo) {
        static_assert(kFp8RowGroup == 4, "AMX targets pack FP8's v2 (four-row) panels");
        constexpr fp8_layout::Geometry kGeo = Fp8Columns<kScales>::kGeo;
        const uint8_t* panel = base + p.first_panel + size_t(n / kPanel) * p.panel_stride;
        const uint8_t* codes = panel + kGeo.codes_at(K);
        const __m512i swap = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15));
        const __m512i alternate = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
        // Round 1, for pairs 4 s .. 4 s + 3: slot 4 i + t of (group a, group b) = pair 4 s + i's rows
        // (a: t = 0, 1 the h; b: t = 2, 3). Round 2, pairs 2 u, 2 u + 1 of such a set: the first's 4
        // dwords from (G0, G1) then from (G2, G3), the same for the second.
        alignas(64) static constexpr int32_t kRound1[2][16] = {
            {0, 2, 16, 18, 1, 3, 17, 19, 4, 6, 20, 22, 5, 7, 21, 23},
            {8, 10, 24, 26, 9, 11, 25, 27, 12, 14, 28, 30, 13, 15, 29, 31}};
        alignas(64) static constexpr int32_t kRound2[2][16] = {
            {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23},
            {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}};
        for (int j = 0; j < 4; ++j) {
            const int64_t k = kb + 16 * j;
            if (k >= K) {   // columns past K: zero weights
                zero_split_rows(bhi, blo, j);
                continue;
            }
            __m512i g[4];
            for (int i = 0; i < 4; ++i)   // groups past the panel's last code row hold no bytes: zero codes
                g[i] = k + 4 * i < K ? _mm512_shuffle_epi8(_mm512_loadu_si512(codes + size_t(k + 4 * i) * kPanel), swap)
                                     : _mm512_setzero_si512();
            const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(panel + size_t(k / kGeo.block) * kFp8ScaleBytes));
            for (int set = 0; set < 2; ++set) {
                const __m512i r1 = _mm512_load_si512(kRound1[set]);
                const __m512i a = _mm512_permutex2var_epi32(g[0], r1, g[1]), b = _mm512_permutex2var_epi32(g[2], r1, g[3]);
                for (int u = 0; u < 2; ++u) {
                    const __m512i rows = _mm512_permutex2var_epi32(a, _mm512_load_si512(kRound2[u]), b);
                    for (int h = 0; h < 2; ++h) {   // pair 4 set + 2 u + h: 16 k in the 256-bit half h
                        const int q = 4 * set + 2 * u + h;
                        const __m512 sq = _mm512_permutexvar_ps(_mm512_add_epi32(alternate, _mm512_set1_epi32(2 * q)), s);
                        const __m512 x = _mm512_mul_ps(vcvt_e4m3_over_256(_mm512_extracti32x4_epi32(rows, 2 * h)), sq);
                        const __m512 y = _mm512_mul_ps(vcvt_e4m3_over_256(_mm512_extracti32x4_epi32(rows, 2 * h + 1)), sq);
                        store_split_row(bhi, blo, j, q, x, y);
                    }
                }
            }
        }
    }
};

// Columns [16 q, 16 q + 16) of a block whose four 16-lane vectors a hold the pair-word order of
// bf16_pair_words: q's 32-column half is in vectors 2 (q / 2) and 2 (q / 2) + 1.
inline __m512 pair_word_columns(const float* a, int q) {
    const float* v = a + 32 * (q / 2);
    return transposed::pair_word_columns(_mm512_load_ps(v), _mm512_load_ps(v + 16), q % 2);
}

// C tile J += the chunk's products: A4 = gradient hi, A5 = lo (two_grad), B6 = weights hi,
// B7 = lo (two_w).
template <int J>
inline void chunk_step(const uint32_t* bhi, const uint32_t* blo, bool two_grad) {
    tiles::load<6>(bhi + size_t(J) * kTileRun / 2 * 16, 64);
    tiles::dpbf16ps<J, 4, 6>();
    if (two_grad) tiles::dpbf16ps<J, 5, 6>();
    if (blo) {
        tiles::load<7>(blo + size_t(J) * kTileRun / 2 * 16, 64);
        tiles::dpbf16ps<J, 4, 7>();
    }
}

template <int J>
inline void load_or_zero(const float* acc, bool zero) {
    if (zero) tiles::zero<J>();
    else tiles::load<J>(acc + 16 * J, kKBlock * 4);
}

struct Scratch {
    TileScratch<uint16_t> grads;   // [2 planes][rows][ld] bf16
    TileScratch<uint32_t> b;       // a run's B tiles, hi then lo
    TileScratch<float> acc;        // [rows][kKBlock]
};

template <class T>
kt_status transposed_tiles(const kt_moe_config* c, const uint8_t* base, std::initializer_list<Part> parts, int64_t K,
                           int64_t gs, int64_t rows, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    const bool two_grad = !one_activation_pass(c);
    const auto col = T::columns(c);
    thread_local Scratch s;
    int64_t ld = 0;
    for (const Part& p : parts) ld += round_up(p.N, kChunk);
    uint16_t* ghi = s.grads.get(size_t(2 * rows * ld));
    uint16_t* glo = two_grad ? ghi + rows * ld : nullptr;
    for (int64_t at = 0; const Part& p : parts) {
        split_gradients<T::kScaledGradients>(base, p, gs, rows, ghi, glo, ld, at);
        at += round_up(p.N, kChunk);
    }
    const size_t plane = size_t(kTileRun / 2 * 4 * 16);   // words of one plane of a run's B tiles
    uint32_t* bhi = s.b.get(2 * plane);
    uint32_t* blo = T::kSplitWeights ? bhi + plane : nullptr;
    float* acc = s.acc.get(size_t(rows * kKBlock));
    tiles::Session session;
    for (int64_t kb = k0; kb < k1; kb += kKBlock) {
        bool first = true;
        for (int64_t at = 0; const Part& p : parts) {
            for (int64_t n0 = 0; n0 < p.N; n0 += kTileRun) {
                const int64_t count = round_up(std::min(kTileRun, p.N - n0), kChunk);
                for (int64_t u = 0; u < count / kPanel; ++u) {
                    const size_t pair0 = size_t(u) * kPanel / 2 * 16;
                    if (n0 + u * kPanel < p.N)
                        T::pack_panel(col, base, p, n0 + u * kPanel, K, kb, bhi + pair0, blo ? blo + pair0 : nullptr);
                    else zero_panel(bhi + pair0, blo ? blo + pair0 : nullptr);   // channels past N: zero weights
                }
                for (int64_t m0 = 0; m0 < rows; m0 += 16) {
                    const int mr = int(std::min<int64_t>(16, rows - m0));
                    session.use(tile_config(mr, 64));
                    float* a = acc + m0 * kKBlock;
                    load_or_zero<0>(a, first);
                    load_or_zero<1>(a, first);
                    load_or_zero<2>(a, first);
                    load_or_zero<3>(a, first);
                    for (int64_t ch = 0; ch < count; ch += kChunk) {
                        const size_t col0 = size_t(at + n0 + ch);
                        tiles::load<4>(ghi + m0 * ld + col0, size_t(ld) * 2);
                        if (two_grad) tiles::load<5>(glo + m0 * ld + col0, size_t(ld) * 2);
                        const uint32_t* bh = bhi + ch / 2 * 16;
                        const uint32_t* bl = blo ? blo + ch / 2 * 16 : nullptr;
                        chunk_step<0>(bh, bl, two_grad);
                        chunk_step<1>(bh, bl, two_grad);
                        chunk_step<2>(bh, bl, two_grad);
                        chunk_step<3>(bh, bl, two_grad);
                    }
                    tiles::store<0>(a, kKBlock * 4);
                    tiles::store<1>(a + 16, kKBlock * 4);
                    tiles::store<2>(a + 32, kKBlock * 4);
                    tiles::store<3>(a + 48, kKBlock * 4);
                }
                first = false;
            }
            at += round_up(p.N, kChunk);
        }
        const int64_t width = std::min(kKBlock, k1 - kb);
        for (int64_t r = 0; r < rows; ++r) {
            const float* a = acc + r * kKBlock;
            float* o = out + r * ldo + kb;
            if constexpr (T::kPairWordColumns) {   // C tile v's lane i: column 32 (v / 2) + 8 (i / 4) + 4 (v % 2) + i % 4
                for (int q = 0; q < 4 && 16 * q < width; ++q)
                    vstore_partial(o + 16 * q, pair_word_columns(a, q), int(std::min<int64_t>(16, width - 16 * q)));
            } else {
                std::copy_n(a, width, o);
            }
        }
    }
    return KT_OK;
}

template <class T, int kSlot>
kt_status gate_up_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad_gate,
                                  const float* grad_up, int64_t gs, int64_t rows, int64_t k0, int64_t k1, float* out,
                                  int64_t ldo) {
    if (rows < min_rows()) return g_avx[kSlot].gate_up(c, packed, grad_gate, grad_up, gs, rows, k0, k1, out, ldo);
    if (const kt_status st = check(T::Format::kName, k0, k1, c->hidden)) return st;
    const ExpertPanels l = T::Format::panels(c);
    const size_t stride = 2 * l.gate_up_panel;   // gate and up panels alternate
    return transposed_tiles<T>(c, static_cast<const uint8_t*>(packed),
                               {Part{l.gate(0), stride, c->intermediate, grad_gate}, Part{l.up(0), stride, c->intermediate, grad_up}},
                               c->hidden, gs, rows, k0, k1, out, ldo);
}

template <class T, int kSlot>
kt_status down_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad, int64_t gs, int64_t rows,
                               int64_t k0, int64_t k1, float* out, int64_t ldo) {
    if (rows < min_rows()) return g_avx[kSlot].down(c, packed, grad, gs, rows, k0, k1, out, ldo);
    if (const kt_status st = check(T::Format::kName, k0, k1, c->intermediate)) return st;
    const ExpertPanels l = T::Format::panels(c);
    return transposed_tiles<T>(c, static_cast<const uint8_t*>(packed), {Part{l.down(0), l.down_panel, c->hidden, grad}},
                               c->intermediate, gs, rows, k0, k1, out, ldo);
}

template <class T, int kSlot>
void set(kt_method_kernels& m) {
    g_avx[kSlot] = {m.gate_up_transposed_tile, m.down_transposed_tile};
    m.gate_up_transposed_tile = gate_up_transposed_tile<T, kSlot>;
    m.down_transposed_tile = down_transposed_tile<T, kSlot>;
}

}  // namespace

void add_amx_transposed_tiles(kt_method_kernels& m) {
    add_transposed_tiles(m);   // avx's: the small experts' kernels, and the methods without a tile form
    if (!m.gate_up_transposed_tile) return;
    const std::string method = m.method;
    if (method == "BF16") set<Bf16Tiles, kBf16>(m);
    else if (method == "INT8") set<Int8Tiles, kInt8>(m);
    else if (method == "INT4" || method == "GPTQ_INT4") set<Int4Tiles<Int4Format<false>>, kInt4>(m);
    else if (method == "RAWINT4") set<Int4Tiles<Int4Format<true>>, kRaw>(m);
    else if (method == "MXFP4") set<Int4Tiles<Fp4Format<false>>, kMxfp4>(m);
    else if (method == "FP8") set<Fp8Tiles<kt::inputs::Fp8Scales::kBlock128>, kFp8>(m);
    else if (method == "FP8_PERCHANNEL") set<Fp8Tiles<kt::inputs::Fp8Scales::kPerChannel>, kFp8PerChannel>(m);
}

}  // namespace KT_TARGET_NAMESPACE
