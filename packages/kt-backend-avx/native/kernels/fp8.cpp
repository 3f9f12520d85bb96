// FP8 experts, consumed as the checkpoint ships them (docs/formats.md): E4M3 bytes with
// DeepSeek-V3's 128x128 block scales (FP8) or one scale per output channel (FP8_PERCHANNEL).
//
// Packed layout "kt-fp8-p16-v1": per matrix, panels of 16 channels; a panel is a header of
// one 64-byte f32[16] scale vector per 128-wide k block (a block format repeats its scalar,
// a per-channel one its 16 channels' scales) followed by K rows of 16 code bytes.
//
// Decoding is exact and branch-free: E4M3 (bias 7) placed in an IEEE half's bit positions
// reads as the same value times 2^-8 (bias 15), subnormals included; F16C widens it to f32,
// and the 2^8 is folded into the block scales at pack time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "methods.h"

namespace KT_TARGET_NAMESPACE {
namespace {

constexpr int64_t kBlock = 128;
constexpr size_t kScaleBytes = 64;

int64_t kblocks(int64_t k) { return (k + kBlock - 1) / kBlock; }
size_t panel_bytes(int64_t k) { return size_t(kblocks(k)) * kScaleBytes + size_t(k) * kPanel; }

// 16 E4M3 codes -> 16 floats equal to value / 256.
#if defined(__AVX512F__)
inline __m512 decode16(const uint8_t* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
}
#else
inline __m256 decode8(const uint8_t* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}
#endif

inline VF decode(const uint8_t* p, int v) {
#if defined(__AVX512F__)
    (void)v;
    return decode16(p);
#else
    return decode8(p + v * kLanes);
#endif
}

float scale_at(const kt_matrix& s, int64_t r, int64_t c) {
    const int64_t at = r * s.row_stride + c;
    return s.dtype == KT_DTYPE_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(s.data)[at]) : static_cast<const float*>(s.data)[at];
}

template <bool kPerChannel>
kt_status check(const kt_weight& w, int64_t N, int64_t K, const char* name) {
    const char* method = kPerChannel ? "FP8_PERCHANNEL" : "FP8";
    if (w.values.dtype != KT_DTYPE_U8 || w.values.rows != N || w.values.cols != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s should be E4M3 bytes (uint8 or float8_e4m3fn) [%lld, %lld], got %s [%lld, %lld]",
                    method, name, (long long)N, (long long)K, dtype_name(w.values.dtype), (long long)w.values.rows,
                    (long long)w.values.cols);
    const int64_t sr = kPerChannel ? N : kblocks(N), sc = kPerChannel ? 1 : kblocks(K);
    if (!w.scales.data)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s scale is missing (float32 [%lld, %lld] expected)", method, name,
                    (long long)sr, (long long)sc);
    if ((w.scales.dtype != KT_DTYPE_F32 && w.scales.dtype != KT_DTYPE_BF16) || w.scales.rows != sr || w.scales.cols != sc)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s scale should be float32 [%lld, %lld], got %s [%lld, %lld]", method, name,
                    (long long)sr, (long long)sc, dtype_name(w.scales.dtype), (long long)w.scales.rows, (long long)w.scales.cols);
    if (w.zeros.data) return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s takes no zero points", method, name);
    for (int64_t r = 0; r < N; ++r) {
        const auto* codes = static_cast<const uint8_t*>(w.values.data) + r * w.values.row_stride;
        for (int64_t c = 0; c < K; ++c)
            if ((codes[c] & 0x7f) == 0x7f)
                return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s holds the E4M3 NaN code 0x%02X at [%lld, %lld]; kt refuses "
                            "non-finite weights at load", method, name, codes[c], (long long)r, (long long)c);
    }
    for (int64_t r = 0; r < sr; ++r)
        for (int64_t c = 0; c < sc; ++c)
            if (!std::isfinite(scale_at(w.scales, r, c)))
                return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s scale [%lld, %lld] is not finite", method, name, (long long)r,
                            (long long)c);
    return KT_OK;
}

template <bool kPerChannel>
void pack_matrix(const kt_weight& w, int64_t N, int64_t K, uint8_t* dst, size_t stride_panels) {
    const size_t pb = panel_bytes(K);
    for (int64_t p = 0; p < panels(N); ++p) {
        uint8_t* panel = dst + size_t(p) * stride_panels * pb;
        auto* scales = reinterpret_cast<float*>(panel);
        uint8_t* codes = panel + size_t(kblocks(K)) * kScaleBytes;
        for (int lane = 0; lane < kPanel && p * kPanel + lane < N; ++lane) {
            const int64_t n = p * kPanel + lane;
            for (int64_t kb = 0; kb < kblocks(K); ++kb)
                scales[kb * kPanel + lane] = 256.0f * (kPerChannel ? scale_at(w.scales, n, 0) : scale_at(w.scales, n / kBlock, kb));
            const auto* src = static_cast<const uint8_t*>(w.values.data) + n * w.values.row_stride;
            for (int64_t k = 0; k < K; ++k) codes[size_t(k) * kPanel + size_t(lane)] = src[k];
        }
    }
}

ExpertPanels layout(const kt_moe_config* c) {
    return {c->hidden, c->intermediate, panel_bytes(c->hidden), panel_bytes(c->intermediate)};
}

size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes(); }

template <bool kPerChannel>
kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    kt_status st;
    if ((st = check<kPerChannel>(src->gate, I, H, "gate")) != KT_OK) return st;
    if ((st = check<kPerChannel>(src->up, I, H, "up")) != KT_OK) return st;
    if ((st = check<kPerChannel>(src->down, H, I, "down")) != KT_OK) return st;
    auto* out = static_cast<uint8_t*>(dst);
    const ExpertPanels l = layout(c);
    pack_matrix<kPerChannel>(src->gate, I, H, out + l.gate(0), 2);
    pack_matrix<kPerChannel>(src->up, I, H, out + l.up(0), 2);
    pack_matrix<kPerChannel>(src->down, H, I, out + l.down(0), 1);
    return KT_OK;
}

#if defined(__AVX512F__)
constexpr int kMrFused = 6, kMrPlain = 12;
#else
constexpr int kMrFused = 2, kMrPlain = 4;
#endif

// MR f32 activation rows x one panel (gate/up pair when kFused), block by block over K.
// kDecoded: the panels' codes were already widened into `decoded` (f32 [K][16] per panel).
template <int MR, bool kFused, bool kDecoded>
void panel_kernel(const uint8_t* xb, size_t row_bytes, int64_t k, const uint8_t* pa, const uint8_t* pb,
                  const float* const* decoded, float* out, int64_t ldo, int cols) {
    constexpr int F = kFused ? 2 : 1;
    const auto* x = reinterpret_cast<const float*>(xb);
    const int64_t ldx = int64_t(row_bytes / sizeof(float));
    const uint8_t* panel[2] = {pa, pb};
    const size_t codes_at = size_t(kblocks(k)) * kScaleBytes;
    VF acc[MR][F][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) acc[m][f][v] = vzero();
    for (int64_t kb = 0; kb < kblocks(k); ++kb) {
        VF part[MR][F][kVecsPerPanel];
        for (int m = 0; m < MR; ++m)
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) part[m][f][v] = vzero();
        const int64_t k1 = std::min(k, (kb + 1) * kBlock);
        for (int64_t kk = kb * kBlock; kk < k1; ++kk)
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    const VF w = kDecoded ? vload(decoded[f] + size_t(kk) * kPanel + size_t(v) * kLanes)
                                          : decode(panel[f] + codes_at + size_t(kk) * kPanel, v);
                    for (int m = 0; m < MR; ++m) part[m][f][v] = vfma(w, vset1(x[m * ldx + kk]), part[m][f][v]);
                }
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                const VF s = vload(reinterpret_cast<const float*>(panel[f] + size_t(kb) * kScaleBytes) + v * kLanes);
                for (int m = 0; m < MR; ++m) acc[m][f][v] = vfma(part[m][f][v], s, acc[m][f][v]);
            }
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) {
            VF r = acc[m][0][v];
            if constexpr (kFused) r = silu_mul(acc[m][0][v], acc[m][F - 1][v]);
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + m * ldo + v * kLanes, r, n);
        }
}

// Widens a panel's K x 16 codes to f32 once, for tiles with several row blocks.
void decode_panel(const uint8_t* panel, int64_t k, float* dst) {
    const uint8_t* codes = panel + size_t(kblocks(k)) * kScaleBytes;
    for (int64_t kk = 0; kk < k; ++kk)
        for (int v = 0; v < kVecsPerPanel; ++v) vstore(dst + kk * kPanel + v * kLanes, decode(codes + kk * kPanel, v));
}

// One row block decodes the codes in registers as it streams them (decode: weights are read
// once); more row blocks widen each panel once into an L2-resident f32 copy and reuse it, so
// prefill pays the E4M3 decode once per panel, not once per MR rows.
template <int MR, bool kFused>
void rows_kernel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* pa, const uint8_t* pb,
                 float* out, int64_t ldo, int cols) {
    if (rows <= MR) {
        for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
            panel_kernel<M, kFused, false>(x + r * row_bytes, row_bytes, k, pa, pb, nullptr, out + r * ldo, ldo, cols);
        });
        return;
    }
    thread_local std::vector<float> buffer;
    buffer.resize(size_t((kFused ? 2 : 1) * k * kPanel));
    const float* decoded[2] = {buffer.data(), buffer.data() + k * kPanel};
    decode_panel(pa, k, buffer.data());
    if constexpr (kFused) decode_panel(pb, k, buffer.data() + k * kPanel);
    for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
        panel_kernel<M, kFused, true>(x + r * row_bytes, row_bytes, k, pa, pb, decoded, out + r * ldo, ldo, cols);
    });
}

#if defined(__AVX512BF16__)
// Prefill on BF16-capable targets: each panel's codes become bf16 (k, k+1) pairs once — exact,
// as E4M3 values have 4 significant bits — the tile's activations become split bf16 (hi + lo)
// once, and vdpbf16ps does 32 multiply-adds per instruction, with per-128-k partial sums for
// the block scales. Decode keeps the F16C path: it reads each weight once either way.
constexpr int kMrBf16Fused = 4, kMrBf16Plain = 8;

// Panel codes -> [ceil(K/2)][16] 32-bit lanes holding bf16(w[k]) | bf16(w[k+1]) << 16 (value / 256).
void widen_panel_bf16(const uint8_t* panel, int64_t k, uint32_t* dst) {
    const uint8_t* codes = panel + size_t(kblocks(k)) * kScaleBytes;
    const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
    for (int64_t j = 0; j < (k + 1) / 2; ++j) {
        const __m512i a = _mm512_castps_si512(decode16(codes + size_t(2 * j) * kPanel));
        const __m512i b = 2 * j + 1 < k ? _mm512_castps_si512(decode16(codes + size_t(2 * j + 1) * kPanel))
                                        : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + j * kPanel, _mm512_or_si512(_mm512_srli_epi32(a, 16), _mm512_and_si512(b, high)));
    }
}

// f32 activation rows -> hi and lo bf16 pair planes, [rows][ceil(K/2)] each. Sixteen floats
// convert to sixteen bf16 that, read as eight 32-bit lanes, are already the (k, k+1) pairs.
// has_lo[r]: row r has a nonzero low half (rows that were bf16 already, as a bf16 model's
// hidden states are, skip that pass).
void split_rows_bf16(const uint8_t* act, size_t row_bytes, int64_t rows, int64_t k, uint32_t* hi, uint32_t* lo,
                     uint8_t* has_lo) {
    const int64_t kc = (k + 1) / 2, padded = 2 * kc;
    for (int64_t r = 0; r < rows; ++r) {
        const auto* x = reinterpret_cast<const float*>(act + size_t(r) * row_bytes);   // padded to even k
        uint32_t* h = hi + r * kc;
        uint32_t* l = lo + r * kc;
        int64_t c = 0;
        for (; c + 16 <= padded; c += 16) {
            const __m512 v = _mm512_loadu_ps(x + c);
            const __m256bh vh = _mm512_cvtneps_pbh(v);
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)vh), 16));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + c / 2), (__m256i)vh);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + c / 2), (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back)));
        }
        for (; c < padded; c += 2) {
            uint16_t hh[2], ll[2];
            for (int e = 0; e < 2; ++e) {
                hh[e] = f32_to_bf16(x[c + e]);
                ll[e] = f32_to_bf16(x[c + e] - bf16_to_f32(hh[e]));
            }
            h[c / 2] = uint32_t(hh[0]) | uint32_t(hh[1]) << 16;
            l[c / 2] = uint32_t(ll[0]) | uint32_t(ll[1]) << 16;
        }
        uint32_t any = 0;
        for (int64_t j = 0; j < kc; ++j) any |= l[j] & 0x7fff7fffu;   // -0 counts as zero
        has_lo[r] = any != 0;
    }
}

template <int MR, bool kFused, bool kLo>
void panel_kernel_bf16(const uint32_t* hi, const uint32_t* lo, int64_t k, const uint32_t* const* w,
                       const uint8_t* const* panel, float* out, int64_t ldo, int cols) {
    constexpr int F = kFused ? 2 : 1;
    const int64_t kc = (k + 1) / 2, chunks_per_block = kBlock / 2;
    __m512 acc[MR][F], part[MR][F];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f) acc[m][f] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < kblocks(k); ++kb) {
        for (int m = 0; m < MR; ++m)
            for (int f = 0; f < F; ++f) part[m][f] = _mm512_setzero_ps();
        const int64_t j1 = std::min(kc, (kb + 1) * chunks_per_block);
        for (int64_t j = kb * chunks_per_block; j < j1; ++j) {
            __m512bh wv[F];
            for (int f = 0; f < F; ++f) wv[f] = (__m512bh)_mm512_loadu_si512(w[f] + j * kPanel);
            for (int m = 0; m < MR; ++m) {
                const __m512bh xh = (__m512bh)_mm512_set1_epi32(int(hi[m * kc + j]));
                for (int f = 0; f < F; ++f) part[m][f] = _mm512_dpbf16_ps(part[m][f], wv[f], xh);
                if constexpr (kLo) {
                    const __m512bh xl = (__m512bh)_mm512_set1_epi32(int(lo[m * kc + j]));
                    for (int f = 0; f < F; ++f) part[m][f] = _mm512_dpbf16_ps(part[m][f], wv[f], xl);
                }
            }
        }
        for (int f = 0; f < F; ++f) {
            const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(panel[f] + size_t(kb) * kScaleBytes));
            for (int m = 0; m < MR; ++m) acc[m][f] = _mm512_fmadd_ps(part[m][f], s, acc[m][f]);
        }
    }
    for (int m = 0; m < MR; ++m)
        vstore_partial(out + m * ldo, kFused ? silu_mul(acc[m][0], acc[m][F - 1]) : acc[m][0], cols);
}

// The BF16 path for one tile: activations split once, each panel (pair) widened once.
template <bool kFused>
void tile_bf16(const uint8_t* act, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* first_panel, size_t stride,
               size_t next, int64_t n0, int64_t n1, float* out, int64_t ldo) {
    const int64_t kc = (k + 1) / 2;
    thread_local std::vector<uint32_t> x_planes, w_planes;
    thread_local std::vector<uint8_t> has_lo;
    x_planes.resize(size_t(2 * rows * kc));
    has_lo.resize(size_t(rows));
    w_planes.resize(size_t((kFused ? 2 : 1) * kc * kPanel));
    uint32_t* hi = x_planes.data();
    uint32_t* lo = hi + rows * kc;
    split_rows_bf16(act, row_bytes, rows, k, hi, lo, has_lo.data());
    const uint8_t* lo_flags = has_lo.data();
    const uint32_t* w[2] = {w_planes.data(), w_planes.data() + kc * kPanel};
    for (int64_t n = n0; n < n1; n += kPanel) {
        const uint8_t* panel[2] = {first_panel + size_t((n - n0) / kPanel) * stride, nullptr};
        panel[1] = panel[0] + next;
        widen_panel_bf16(panel[0], k, w_planes.data());
        if constexpr (kFused) widen_panel_bf16(panel[1], k, w_planes.data() + kc * kPanel);
        const int cols = int(std::min<int64_t>(kPanel, n1 - n));
        constexpr int MR = kFused ? kMrBf16Fused : kMrBf16Plain;
        for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
            bool any_lo = false;
            for (int m = 0; m < M; ++m) any_lo |= lo_flags[r + m] != 0;
            if (any_lo) {
                panel_kernel_bf16<M, kFused, true>(hi + r * kc, lo + r * kc, k, w, panel, out + n + r * ldo, ldo, cols);
            } else {
                panel_kernel_bf16<M, kFused, false>(hi + r * kc, lo + r * kc, k, w, panel, out + n + r * ldo, ldo, cols);
            }
        });
    }
}
#endif

kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    const int64_t H = c->hidden;
    if (const kt_status st = check_tile("FP8", "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if defined(__AVX512BF16__)
    if (rows > kMrFused) {
        tile_bf16<true>(static_cast<const uint8_t*>(act), f32_row_bytes(H), rows, H, base + l.gate(n0 / kPanel), l.gate(1),
                        l.up(0), n0, n1, out, ldo);
        return KT_OK;
    }
#endif
    for (int64_t n = n0; n < n1; n += kPanel)
        rows_kernel<kMrFused, true>(static_cast<const uint8_t*>(act), f32_row_bytes(H), rows, H, base + l.gate(n / kPanel),
                                    base + l.up(n / kPanel), out + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
    return KT_OK;
}

kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    const int64_t I = c->intermediate;
    if (const kt_status st = check_tile("FP8", "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if defined(__AVX512BF16__)
    if (rows > kMrPlain) {
        tile_bf16<false>(static_cast<const uint8_t*>(act), f32_row_bytes(I), rows, I, base + l.down(n0 / kPanel),
                         l.down_panel, 0, n0, n1, out, ldo);
        return KT_OK;
    }
#endif
    for (int64_t n = n0; n < n1; n += kPanel)
        rows_kernel<kMrPlain, false>(static_cast<const uint8_t*>(act), f32_row_bytes(I), rows, I, base + l.down(n / kPanel),
                                     nullptr, out + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
    return KT_OK;
}

template <bool kPerChannel>
kt_method_kernels fp8_table(const char* method, const char* kernel_id) {
    return method_table(method, "kt-fp8-p16-v1", kernel_id, packed_bytes, pack<kPerChannel>, f32_row_bytes,
                        quantize_f32_rows, gate_up_tile, down_tile);
}

}  // namespace

kt_method_kernels fp8_kernels(const char* kernel_id) { return fp8_table<false>("FP8", kernel_id); }
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id) { return fp8_table<true>("FP8_PERCHANNEL", kernel_id); }

}  // namespace KT_TARGET_NAMESPACE
