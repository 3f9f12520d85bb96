// FP8 experts, consumed as the checkpoint ships them (docs/formats.md): E4M3 bytes with
// DeepSeek-V3's 128x128 block scales (FP8), one scale per output channel (FP8_PERCHANNEL) or
// an E8M0 exponent per 32 k of each channel (MXFP8, MiniMax-M3), repacked into 16-channel
// panels (fp8_layout.h: "kt-fp8-p16-v2" / "kt-mxfp8-p16-v2" on AVX512_BF16 targets, "-v1" on
// the others). The three differ only in the scale vectors a panel carries (one per 128 k, or
// per 32 k for MXFP8): one kernel, templated on the scale block.
//
// Decoding is exact and branch-free, to value / 256 (the 2^8 is folded into the block scales at
// pack time). AVX512_BF16 targets look each code's bf16 bytes up in two 128-entry byte tables
// (vpermi2b) and run vdpbf16ps; the others widen codes through F16C (vload_e4m3_over_256) —
// AVX2 prefill one scale block at a time into an L1 copy under a register-blocked kernel
// (wide_panels.h), AVX-512 per panel into an L2 copy.
#include <algorithm>
#include <cmath>
#include <vector>

#include <kt/formats/checkpoint_inputs.h>

#include "fp8_layout.h"
#include "methods.h"
#include "wide_panels.h"

namespace KT_TARGET_NAMESPACE {
namespace {

#if !defined(__AVX512BF16__)
// Codes kLanes * v.. of a 16-code row -> floats equal to value / 256 (simd.h).
inline VF decode(const uint8_t* p, int v) { return vload_e4m3_over_256(p + v * kLanes); }
#endif

// How a method's checkpoint scales its E4M3 codes; the checks and the packer are kt-core's
// (kt/formats/checkpoint_inputs.h), shared with kt-backend-kml.
using Scales = kt::inputs::Fp8Scales;
constexpr const char* method_name(Scales k) { return kt::inputs::fp8_method_name(k); }
template <Scales kScales>
constexpr fp8_layout::Geometry geometry() { return kScales == Scales::kMx ? kMxfp8Geometry : kFp8Geometry; }
template <Scales kScales>
constexpr int64_t kBlockOf = geometry<kScales>().block;
// The kernels need only the scale block (128 or 32 k per scale vector) of their method's layout.
template <int64_t kBlk>
constexpr fp8_layout::Geometry kGeo{kFp8RowGroup, kBlk};

template <Scales kScales>
ExpertPanels layout(const kt_moe_config* c) {
    return geometry<kScales>().expert(c->hidden, c->intermediate);
}

template <Scales kScales>
size_t packed_bytes(const kt_moe_config* c) { return layout<kScales>(c).bytes(); }

template <Scales kScales>
kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const std::string err = kt::inputs::check_fp8_expert(c, src, kScales);
    if (!err.empty()) return fail(KT_ERROR_INVALID_ARGUMENT, "%s", err.c_str());
    kt::inputs::pack_fp8_expert(c, src, kScales, geometry<kScales>(), dst);
    return KT_OK;
}

#if !defined(__AVX512BF16__)
// Targets without AVX512_BF16: f32 FMAs on codes widened through F16C.
#if defined(__AVX512F__)
constexpr int kMrFused = 6, kMrPlain = 12;
#else
constexpr int kMrFused = 2, kMrPlain = 4;
#endif

// MR f32 activation rows x one panel (gate/up pair when kFused), block by block over K.
// kDecoded: the panels' codes were already widened into `decoded` (f32 [K][16] per panel).
template <int64_t kBlk, int MR, bool kFused, bool kDecoded>
void panel_kernel(const uint8_t* xb, size_t row_bytes, int64_t k, const uint8_t* pa, const uint8_t* pb,
                  const float* const* decoded, float* out, int64_t ldo, int cols) {
    constexpr int F = kFused ? 2 : 1;
    const auto* x = reinterpret_cast<const float*>(xb);
    const int64_t ldx = int64_t(row_bytes / sizeof(float));
    const uint8_t* panel[2] = {pa, pb};
    const size_t codes_at = kGeo<kBlk>.codes_at(k);
    VF acc[MR][F][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) acc[m][f][v] = vzero();
    for (int64_t kb = 0; kb < kGeo<kBlk>.kblocks(k); ++kb) {
        VF part[MR][F][kVecsPerPanel];
        for (int m = 0; m < MR; ++m)
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) part[m][f][v] = vzero();
        const int64_t k1 = std::min(k, (kb + 1) * kBlk);
        for (int64_t kk = kb * kBlk; kk < k1; ++kk)
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    const VF w = kDecoded ? vload(decoded[f] + size_t(kk) * kPanel + size_t(v) * kLanes)
                                          : decode(panel[f] + codes_at + size_t(kk) * kPanel, v);
                    for (int m = 0; m < MR; ++m) part[m][f][v] = vfma(w, vset1(x[m * ldx + kk]), part[m][f][v]);
                }
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                const VF s = vload(reinterpret_cast<const float*>(panel[f] + size_t(kb) * kFp8ScaleBytes) + v * kLanes);
                for (int m = 0; m < MR; ++m) acc[m][f][v] = vfma(part[m][f][v], s, acc[m][f][v]);
            }
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) {
            VF r = acc[m][0][v];
            if constexpr (kFused) r = gate_mul(acc[m][0][v], acc[m][F - 1][v]);
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + m * ldo + v * kLanes, r, n);
        }
}

// Widens a panel's K x 16 codes to f32 once, for tiles with several row blocks.
template <int64_t kBlk>
void decode_panel(const uint8_t* panel, int64_t k, float* dst) {
    const uint8_t* codes = panel + kGeo<kBlk>.codes_at(k);
    for (int64_t kk = 0; kk < k; ++kk)
        for (int v = 0; v < kVecsPerPanel; ++v) vstore(dst + kk * kPanel + v * kLanes, decode(codes + kk * kPanel, v));
}

// One row block decodes the codes in registers as it streams them (decode: weights are read
// once); more row blocks widen each panel once into an L2-resident f32 copy and reuse it, so
// prefill pays the E4M3 decode once per panel, not once per MR rows. AVX2 tiles of wide::kMinRows
// rows and more go to wide_panels.h instead (its sums and scale steps in the same order: same bits).
template <int64_t kBlk, int MR, bool kFused>
void rows_kernel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* pa, const uint8_t* pb,
                 float* out, int64_t ldo, int cols) {
#if !defined(__AVX512F__)
    if (rows >= wide::kMinRows) {   // AVX2 prefill: each 128-k (MXFP8: 32-k) block of codes widened once (wide_panels.h)
        constexpr int P = kFused ? 2 : 1;
        const uint8_t* panel[2] = {pa, pb};
        const size_t codes_at = kGeo<kBlk>.codes_at(k);
        const auto widen = [&](int64_t k0, int64_t kn, float* w) {
            for (int64_t kk = 0; kk < kn; ++kk)
                for (int p = 0; p < P; ++p)
                    for (int v = 0; v < kVecsPerPanel; ++v)
                        vstore(w + (kk * P + p) * kPanel + v * kLanes, decode(panel[p] + codes_at + size_t(k0 + kk) * kPanel, v));
        };
        const auto scales = [&](int64_t block, float* s) {
            for (int p = 0; p < P; ++p)
                std::copy_n(reinterpret_cast<const float*>(panel[p] + size_t(block) * kFp8ScaleBytes), kPanel, s + p * kPanel);
        };
        wide::tile<kFused ? wide::kFused : wide::kSingle, true>(reinterpret_cast<const float*>(x), int64_t(row_bytes / sizeof(float)),
                                                                rows, k, kBlk, widen, scales, out, ldo, cols);
        return;
    }
#endif
    if (rows <= MR) {
        for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
            panel_kernel<kBlk, M, kFused, false>(x + r * row_bytes, row_bytes, k, pa, pb, nullptr, out + r * ldo, ldo, cols);
        });
        return;
    }
    thread_local std::vector<float> buffer;
    buffer.resize(size_t((kFused ? 2 : 1) * k * kPanel));
    const float* decoded[2] = {buffer.data(), buffer.data() + k * kPanel};
    decode_panel<kBlk>(pa, k, buffer.data());
    if constexpr (kFused) decode_panel<kBlk>(pb, k, buffer.data() + k * kPanel);
    for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
        panel_kernel<kBlk, M, kFused, true>(x + r * row_bytes, row_bytes, k, pa, pb, decoded, out + r * ldo, ldo, cols);
    });
}
#endif

#if defined(__AVX512BF16__)
// BF16-capable targets run every batch on vdpbf16ps (32 multiply-adds per instruction): the
// codes become exact bf16 (k, k+1) pairs — E4M3 values have 4 significant bits — and the
// activations split bf16 (hi + lo; one pass for rows that were bf16 already), with per-128-k
// partial sums for the block scales. A single row block (decode) converts the codes in
// registers as it streams them; more row blocks convert each panel (pair) once into an
// L1/L2-resident copy. The F16C path this replaced for decode spent ~20 vector operations per
// 32 weights on the conversion (10.8 GB/s per core on cache-resident weights: decode was
// compute-bound at 34-58 % of the read bandwidth).
constexpr int kMrBf16Fused = 4, kMrBf16Plain = 8;
// Tiles of up to this many rows stream their panels one at a time in address order: gate then
// up (gate_up_in_order, common.h), down panel by panel rather than in pairs (measured in
// docs/performance.md; more rows gain less).
constexpr int64_t kInOrderRows = 2;

// f32 activation rows -> hi and lo bf16 pair planes, [rows][ceil(K/2)] each. Sixteen floats
// convert to sixteen bf16 that, read as eight 32-bit lanes, are already the (k, k+1) pairs.
// has_lo[r]: row r has a nonzero low half (rows that were bf16 already, as a bf16 model's
// hidden states are, skip that pass).
// one_pass (KT_QUANT_FAST_ACTIVATIONS): every row is rounded to bf16 and has_lo is 0.
void split_rows_bf16(const uint8_t* act, size_t row_bytes, int64_t rows, int64_t k, uint32_t* hi, uint32_t* lo,
                     uint8_t* has_lo, bool one_pass) {
    const int64_t kc = (k + 1) / 2, padded = 2 * kc;
    for (int64_t r = 0; r < rows; ++r) {
        const auto* x = reinterpret_cast<const float*>(act + size_t(r) * row_bytes);   // padded to even k
        uint32_t* h = hi + r * kc;
        uint32_t* l = lo + r * kc;
        int64_t c = 0;
        for (; c + 16 <= padded; c += 16) {
            const __m512 v = _mm512_loadu_ps(x + c);
            const __m256bh vh = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + c / 2), (__m256i)vh);
            if (one_pass) continue;
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)vh), 16));
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
        for (int64_t j = 0; j < kc && !one_pass; ++j) any |= l[j] & 0x7fff7fffu;   // -0 counts as zero
        has_lo[r] = any != 0;
    }
}

// What a tile computes from its one or two panels: one panel, the gate/up pair with SiLU(gate) * up,
// or two neighbouring panels at once (down: each activation broadcast feeds two vdpbf16ps).
enum TileMode { kSinglePanel, kGateUp, kPanelPair };

// MR rows x one panel (pair), two k-pairs per step (a 128-k block holds 32 steps). kFly: w[f] are
// the panels' codes, converted here as they stream by (one row block); otherwise the widened
// [ceil(K/2)][16] copies. With one or two accumulators (decode), the two pairs of a step and the
// hi and lo passes sum into separate registers: chained on one, decode ran at vdpbf16ps's
// latency. Larger blocks have enough chains already, and no registers to spare.
template <int64_t kBlk, int MR, int kMode, bool kLo, bool kFly, bool kAhead = false>
void panel_kernel_bf16(const E4M3Converter& cv, const uint32_t* hi, const uint32_t* lo, int64_t k, const void* const* w,
                       const uint8_t* const* panel, float* out, int64_t ldo, int cols, PrefetchAhead ahead = {}) {
    constexpr int F = kMode == kSinglePanel ? 1 : 2;
    constexpr bool kSplit = MR * F <= 2;
    constexpr int P = kSplit ? 2 : 1, L = kLo && kSplit ? 2 : 1;   // accumulators per pair parity, per plane
    constexpr int64_t steps_per_block = kBlk / 4;
    const int64_t kc = (k + 1) / 2;
    __m512 acc[MR][F], part[P][L][MR][F];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f) acc[m][f] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < kGeo<kBlk>.kblocks(k); ++kb) {
        for (int p = 0; p < P; ++p)
            for (int l = 0; l < L; ++l)
                for (int m = 0; m < MR; ++m)
                    for (int f = 0; f < F; ++f) part[p][l][m][f] = _mm512_setzero_ps();
        const int64_t q0 = kb * steps_per_block, q1 = std::min((kc + 1) / 2, (kb + 1) * steps_per_block);
        // One step: k rows 4q..4q+3. kWhole: all four exist (every step but a K % 4 != 0 tail),
        // so both pair indices are in range without clamps; decode
        // (kFly) also prefetches its stream (prefetch_decode_stream, common.h). The figures, and
        // what was tried and not kept (a second accumulator set, converting a step ahead), are
        // in docs/performance.md.
        const auto step = [&]<bool kWhole>(int64_t q) {
            if constexpr (kAhead) ahead.step();
            __m512i wv[F][2];
            for (int f = 0; f < F; ++f) {
                if constexpr (kFly) {   // the codes are padded to whole row groups (fp8_layout.h)
                    const auto* codes = static_cast<const uint8_t*>(w[f]) + size_t(4 * q) * kPanel;
                    if constexpr (kWhole) prefetch_decode_stream<8192>(codes);
                    cv.convert(_mm512_loadu_si512(codes), wv[f]);
                } else {
                    wv[f][0] = _mm512_loadu_si512(static_cast<const uint32_t*>(w[f]) + 2 * q * kPanel);
                    wv[f][1] = kWhole || 2 * q + 1 < kc
                                   ? _mm512_loadu_si512(static_cast<const uint32_t*>(w[f]) + (2 * q + 1) * kPanel)
                                   : _mm512_setzero_si512();
                }
            }
            for (int pair = 0; pair < 2; ++pair) {
                // An odd pair count's last step: its weights are zero, the clamped index is any valid one.
                const int64_t j = kWhole ? 2 * q + pair : std::min(2 * q + pair, kc - 1);
                const int p = pair % P;
                for (int m = 0; m < MR; ++m)
                    for (int plane = 0; plane < (kLo ? 2 : 1); ++plane) {
                        const __m512bh x = (__m512bh)_mm512_set1_epi32(int((plane ? lo : hi)[m * kc + j]));
                        const int l = plane % L;
                        for (int f = 0; f < F; ++f)
                            part[p][l][m][f] = _mm512_dpbf16_ps(part[p][l][m][f], (__m512bh)wv[f][pair], x);
                    }
            }
        };
        const int64_t whole = std::clamp<int64_t>(k / 4, q0, q1);
        for (int64_t q = q0; q < whole; ++q) step.template operator()<true>(q);
        for (int64_t q = whole; q < q1; ++q) step.template operator()<false>(q);
        for (int f = 0; f < F; ++f) {
            const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(panel[f] + size_t(kb) * kFp8ScaleBytes));
            for (int m = 0; m < MR; ++m) {
                __m512 sum = part[0][0][m][f];
                for (int p = 0; p < P; ++p)
                    for (int l = 0; l < L; ++l)
                        if (p + l > 0) sum = _mm512_add_ps(sum, part[p][l][m][f]);
                acc[m][f] = _mm512_fmadd_ps(sum, s, acc[m][f]);
            }
        }
    }
    for (int m = 0; m < MR; ++m) {
        vstore_partial(out + m * ldo, kMode == kGateUp ? gate_mul(acc[m][0], acc[m][F - 1]) : acc[m][0], std::min(cols, kPanel));
        if (kMode == kPanelPair && cols > kPanel) vstore_partial(out + m * ldo + kPanel, acc[m][F - 1], cols - kPanel);
    }
}

// One panel (pair) for every row block of a tile: converted once into w_planes, or in registers
// as it streams by when the rows make a single block (decode).
template <int64_t kBlk, int kMode, int MR>
void panels_bf16(const E4M3Converter& cv, const uint32_t* hi, const uint32_t* lo, const uint8_t* lo_flags, int64_t rows,
                 int64_t k, const uint8_t* const* panel, uint32_t* w_planes, float* out, int64_t ldo, int cols,
                 const uint8_t* next = nullptr, size_t next_bytes = 0) {
    constexpr int F = kMode == kSinglePanel ? 1 : 2;
    const int64_t kc = (k + 1) / 2;
    const bool fly = rows <= MR;
    const void* w[2];
    for (int f = 0; f < F; ++f) {
        if (fly) {
            w[f] = panel[f] + kGeo<kBlk>.codes_at(k);
        } else {
            widen_fp8_panel(cv, panel[f], k, w_planes + f * kc * kPanel, kGeo<kBlk>);
            w[f] = w_planes + f * kc * kPanel;
        }
    }
    for_row_blocks<MR>(rows, [=, &cv]<int M>(int64_t r) {
        bool any_lo = false;
        for (int m = 0; m < M; ++m) any_lo |= lo_flags[r + m] != 0;
        float* o = out + r * ldo;
        if (fly && any_lo) {
            panel_kernel_bf16<kBlk, M, kMode, true, true>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols);
        } else if (fly) {
            panel_kernel_bf16<kBlk, M, kMode, false, true>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols);
        } else {
            // The first row block fetches the next panels' codes into L2 while it computes, so
            // widening them does not wait on DRAM (a sixth of prefill's samples did; the gain is
            // in docs/performance.md).
            bool ahead = false;
            if constexpr (M == MR) ahead = r == 0 && next_bytes;
            const PrefetchAhead fetch(next, next_bytes, (kc + 1) / 2);
            if (ahead && any_lo)
                panel_kernel_bf16<kBlk, M, kMode, true, false, true>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols, fetch);
            else if (ahead)
                panel_kernel_bf16<kBlk, M, kMode, false, false, true>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols, fetch);
            else if (any_lo)
                panel_kernel_bf16<kBlk, M, kMode, true, false>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols);
            else
                panel_kernel_bf16<kBlk, M, kMode, false, false>(cv, hi + r * kc, lo + r * kc, k, w, panel, o, ldo, cols);
        }
    });
}

// The BF16 path for one tile: activations split once. kGateUp: panel p of gate and of up (`next`
// bytes apart); otherwise the tile's panels two at a time (`stride` apart), an odd last one alone.
template <int64_t kBlk, bool kFused>
void tile_bf16(const uint8_t* act, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* first_panel, size_t stride,
               size_t next, int64_t n0, int64_t n1, float* out, int64_t ldo, bool one_pass) {
    const int64_t kc = (k + 1) / 2;
    static const E4M3Converter cv;
    thread_local std::vector<uint32_t> x_planes, w_planes;
    thread_local std::vector<uint8_t> has_lo;
    x_planes.resize(size_t(2 * rows * kc));
    has_lo.resize(size_t(rows));
    if (rows > std::min(kMrBf16Fused, kMrBf16Plain)) w_planes.resize(size_t(2 * kc * kPanel));   // some panel is widened
    uint32_t* hi = x_planes.data();
    uint32_t* lo = hi + rows * kc;
    split_rows_bf16(act, row_bytes, rows, k, hi, lo, has_lo.data(), one_pass);
    if (rows <= kInOrderRows) {
        if constexpr (kFused) {
            gate_up_in_order<kInOrderRows>(rows, first_panel, first_panel + next, stride, n0, n1, out, ldo, [&](const uint8_t* p, float* o) {
                const uint8_t* panel[2] = {p, nullptr};
                panels_bf16<kBlk, kSinglePanel, kMrBf16Plain>(cv, hi, lo, has_lo.data(), rows, k, panel, w_planes.data(), o, kPanel, kPanel);
            });
        } else {
            for (int64_t n = n0; n < n1; n += kPanel) {
                const uint8_t* panel[2] = {first_panel + size_t((n - n0) / kPanel) * stride, nullptr};
                panels_bf16<kBlk, kSinglePanel, kMrBf16Plain>(cv, hi, lo, has_lo.data(), rows, k, panel, w_planes.data(), out + n,
                                                        ldo, int(std::min<int64_t>(kPanel, n1 - n)));
            }
        }
        return;
    }
    for (int64_t n = n0; n < n1;) {
        const uint8_t* p0 = first_panel + size_t((n - n0) / kPanel) * stride;
        const int64_t left = n1 - n;
        if constexpr (kFused) {
            const uint8_t* panel[2] = {p0, p0 + next};
            // The next gate/up pair follows this one: two panels of `next` bytes.
            const size_t ahead = left > kPanel ? 2 * next : 0;
            panels_bf16<kBlk, kGateUp, kMrBf16Fused>(cv, hi, lo, has_lo.data(), rows, k, panel, w_planes.data(), out + n, ldo,
                                               int(std::min<int64_t>(kPanel, left)), p0 + stride, ahead);
            n += kPanel;
        } else if (left > kPanel) {
            const uint8_t* panel[2] = {p0, p0 + stride};
            const size_t ahead = size_t(std::clamp<int64_t>((left - 2 * kPanel + kPanel - 1) / kPanel, 0, 2)) * stride;
            panels_bf16<kBlk, kPanelPair, kMrBf16Fused>(cv, hi, lo, has_lo.data(), rows, k, panel, w_planes.data(), out + n,
                                                  ldo, int(std::min<int64_t>(2 * kPanel, left)), p0 + 2 * stride, ahead);
            n += 2 * kPanel;
        } else {
            const uint8_t* panel[2] = {p0, nullptr};
            panels_bf16<kBlk, kSinglePanel, kMrBf16Plain>(cv, hi, lo, has_lo.data(), rows, k, panel, w_planes.data(), out + n,
                                                    ldo, int(left));
            n += kPanel;
        }
    }
}
#endif

template <Scales kScales>
kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    constexpr int64_t kBlk = kBlockOf<kScales>;
    const GateScope activation(c);   // the layer's gated activation, for the epilogues below
    const int64_t H = c->hidden;
    if (const kt_status st = check_tile(method_name(kScales), "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout<kScales>(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if defined(__AVX512BF16__)
    tile_bf16<kBlk, true>(static_cast<const uint8_t*>(act), f32_row_bytes(H), rows, H, base + l.gate(n0 / kPanel), l.gate(1),
                          l.up(0), n0, n1, out, ldo, one_activation_pass(c));
#else
    for (int64_t n = n0; n < n1; n += kPanel)
        rows_kernel<kBlk, kMrFused, true>(static_cast<const uint8_t*>(act), f32_row_bytes(H), rows, H, base + l.gate(n / kPanel),
                                          base + l.up(n / kPanel), out + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
#endif
    return KT_OK;
}

template <Scales kScales>
kt_status gate_up_raw_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    constexpr int64_t kBlk = kBlockOf<kScales>;
    const int64_t H = c->hidden;
    if (const kt_status st = check_tile(method_name(kScales), "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout<kScales>(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    const auto* x = static_cast<const uint8_t*>(act);
#if defined(__AVX512BF16__)
    // Gate's panels, then up's, each as a run of panels l.gate(1) apart (tile_bf16 writes column n
    // at out + n, so the tile-local outputs are passed shifted by n0).
    tile_bf16<kBlk, false>(x, f32_row_bytes(H), rows, H, base + l.gate(n0 / kPanel), l.gate(1), 0, n0, n1, out_gate - n0, ldo,
                           one_activation_pass(c));
    tile_bf16<kBlk, false>(x, f32_row_bytes(H), rows, H, base + l.up(n0 / kPanel), l.gate(1), 0, n0, n1, out_up - n0, ldo,
                           one_activation_pass(c));
#else
    gate_up_raw(l, base, n0, n1, out_gate, out_up, ldo, [&](const uint8_t* panel, float* o, int64_t ld, int cols) {
        rows_kernel<kBlk, kMrPlain, false>(x, f32_row_bytes(H), rows, H, panel, nullptr, o, ld, cols);
    });
#endif
    return KT_OK;
}

template <Scales kScales>
kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    constexpr int64_t kBlk = kBlockOf<kScales>;
    const int64_t I = c->intermediate;
    if (const kt_status st = check_tile(method_name(kScales), "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout<kScales>(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if defined(__AVX512BF16__)
    tile_bf16<kBlk, false>(static_cast<const uint8_t*>(act), f32_row_bytes(I), rows, I, base + l.down(n0 / kPanel), l.down_panel,
                           0, n0, n1, out, ldo, one_activation_pass(c));
#else
    for (int64_t n = n0; n < n1; n += kPanel)
        rows_kernel<kBlk, kMrPlain, false>(static_cast<const uint8_t*>(act), f32_row_bytes(I), rows, I, base + l.down(n / kPanel),
                                           nullptr, out + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
#endif
    return KT_OK;
}

template <Scales kScales>
kt_method_kernels fp8_table(const char* kernel_id, const char* layout_id) {
    return method_table(method_name(kScales), layout_id, kernel_id, packed_bytes<kScales>, pack<kScales>, f32_row_bytes,
                        quantize_f32_rows, gate_up_tile<kScales>, down_tile<kScales>, gate_up_raw_tile<kScales>);
}

}  // namespace

kt_method_kernels fp8_kernels(const char* kernel_id) { return fp8_table<Scales::kBlock128>(kernel_id, kFp8LayoutId); }
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id) {
    return fp8_table<Scales::kPerChannel>(kernel_id, kFp8LayoutId);
}
kt_method_kernels mxfp8_kernels(const char* kernel_id) { return fp8_table<Scales::kMx>(kernel_id, kMxfp8LayoutId); }

}  // namespace KT_TARGET_NAMESPACE
