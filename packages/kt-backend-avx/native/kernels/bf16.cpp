// BF16 experts. Packed layout "kt-bf16-p16k2-v1" (kt/formats/packed_layouts.h): each matrix [N, K] becomes panels of 16
// output channels; a panel is K/2 chunks of 64 bytes, chunk j holding (w[n][2j], w[n][2j+1])
// for its 16 channels n — one AVX-512 register, the operand order of vdpbf16ps. Gate and up
// panels alternate ([gate 0][up 0][gate 1][up 1]...) so the fused gate/up kernel streams one
// buffer; down panels follow. N pads to 16 and K to 2 with zeros.
//
// Targets with AVX512_BF16 take split-bf16 activations (hi + lo, f32-like accuracy; one pass
// when the input was bf16 already; always one with KT_QUANT_FAST_ACTIVATIONS, which rounds the
// f32 intermediate to bf16 as kt-kernel and torch do) and vdpbf16ps (32 MACs per instruction); the others take
// f32 activations and widen the weights exactly (a shift and a mask).
// Every weight byte is read once per row block of MR tokens: decode (MR >= tokens) streams
// the expert once; prefill reuses each panel from L2 across row blocks. AVX2 prefill (4 rows and
// more) widens each 128-k block of its panels once and runs a register-blocked f32 kernel over it
// (wide_panels.h): the in-register widening left its FMAs at ~40 % of the peak.
#include "lanes.h"
#include "methods.h"
#include "wide_panels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace KT_TARGET_NAMESPACE {
namespace {

constexpr size_t kChunkBytes = kPanel * 2 * sizeof(uint16_t);   // 16 channels x 2 k

int64_t chunks(int64_t k) { return round_up(k, 2) / 2; }
namespace layout_bf16 = kt::layouts::bf16;   // the layout's geometry: kt-core's public definition

// Packs rows [n0, n0+16) of a matrix into one panel (missing rows stay zero).
// Chunk c of a panel holds the k pair (2c, 2c+1) of each channel: a 32-bit word per lane, moved
// by lanes.h. bf16 input is copied bit-exactly; other types are widened once and rounded into
// `converted` (kPanel rows of K).
void pack_panel(const kt_matrix& m, int64_t n0, uint16_t* dst, std::vector<float>& row, std::vector<uint16_t>& converted) {
    const int64_t K = m.cols;
    const uint8_t* rows[kPanel] = {};
    for (int64_t i = 0; i < kPanel && n0 + i < m.rows; ++i) {
        const uint16_t* src;
        if (m.dtype == KT_DTYPE_BF16) {
            src = static_cast<const uint16_t*>(m.data) + (n0 + i) * m.row_stride;
        } else {
            load_row(m, n0 + i, row.data());
            uint16_t* out = converted.data() + i * K;
            for (int64_t k = 0; k < K; ++k) out[k] = f32_to_bf16(row[size_t(k)]);
            src = out;
        }
        rows[i] = reinterpret_cast<const uint8_t*>(src);
        if (K % 2) dst[(K / 2) * kPanel * 2 + i * 2] = src[K - 1];
    }
    pack_lanes(rows, K / 2, reinterpret_cast<uint8_t*>(dst));
}

ExpertPanels layout(const kt_moe_config* c) { return layout_bf16::expert(c->hidden, c->intermediate); }

size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes(); }

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    kt_status st;
    if ((st = expect_float_weight(src->gate, I, H, "gate", "BF16")) != KT_OK) return st;
    if ((st = expect_float_weight(src->up, I, H, "up", "BF16")) != KT_OK) return st;
    if ((st = expect_float_weight(src->down, H, I, "down", "BF16")) != KT_OK) return st;
    std::vector<float> row(size_t(std::max(H, I)));
    std::vector<uint16_t> converted(size_t(kPanel * std::max(H, I)));
    auto* out = static_cast<uint8_t*>(dst);
    const ExpertPanels l = layout(c);
    for (int64_t p = 0; p < panels(I); ++p) {
        pack_panel(src->gate.values, p * kPanel, reinterpret_cast<uint16_t*>(out + l.gate(p)), row, converted);
        pack_panel(src->up.values, p * kPanel, reinterpret_cast<uint16_t*>(out + l.up(p)), row, converted);
    }
    for (int64_t p = 0; p < panels(H); ++p)
        pack_panel(src->down.values, p * kPanel, reinterpret_cast<uint16_t*>(out + l.down(p)), row, converted);
    return KT_OK;
}

// ---- microkernels ----------------------------------------------------------------------
// A microkernel streams one panel, or two (common.h's PanelMode): gate and up of the same channels
// (fused: the output is SiLU(gate)*up, or raw: both), or two adjacent down panels (pair: 32
// outputs). Two panels share every activation broadcast, which halves the broadcasts per multiply.

// Writes a result row: `cols` valid outputs of 16 (single/fused) or 32 (pair).
template <int kMode>
inline void store_row(float* out, const VF* a, const VF* b, int cols) {
    for (int v = 0; v < kVecsPerPanel; ++v) {
        const VF r = kMode == kFused ? gate_mul(a[v], b[v]) : a[v];
        const int n = std::min(kLanes, cols - v * kLanes);
        if (n > 0) vstore_partial(out + v * kLanes, r, n);
        if constexpr (kMode == kPair) {
            const int n2 = std::min(kLanes, cols - kPanel - v * kLanes);
            if (n2 > 0) vstore_partial(out + kPanel + v * kLanes, b[v], n2);
        }
    }
}
// MR activation rows x one or two panels over all of K. `x` rows are `row_bytes` apart; out
// rows have stride ldo.

#if defined(__AVX512BF16__)
constexpr int kMrFused = 8, kMrPlain = 12;

// x: split-bf16 rows (see common.h); kLo adds the low halves' pass.
template <int MR, int kMode, bool kLo>
void panel_kernel_split(const uint8_t* x, size_t row_bytes, int64_t kc, const uint8_t* pa, const uint8_t* pb, float* out,
                        int64_t ldo, int cols) {
    constexpr bool kTwo = kMode != kSingle;
    __m512 acc_a[MR], acc_b[MR];
    for (int m = 0; m < MR; ++m) acc_a[m] = acc_b[m] = _mm512_setzero_ps();
    const uint8_t* hi = x + sizeof(SplitBf16Header);
    const size_t lo_offset = size_t(kc) * 4;
    for (int64_t j = 0; j < kc; ++j) {
        const __m512bh wa = (__m512bh)_mm512_loadu_si512(pa + size_t(j) * kChunkBytes);
        __m512bh wb;
        if constexpr (kTwo) wb = (__m512bh)_mm512_loadu_si512(pb + size_t(j) * kChunkBytes);
        for (int m = 0; m < MR; ++m) {
            int32_t pair;
            std::memcpy(&pair, hi + m * row_bytes + size_t(j) * 4, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            acc_a[m] = _mm512_dpbf16_ps(acc_a[m], wa, xv);
            if constexpr (kTwo) acc_b[m] = _mm512_dpbf16_ps(acc_b[m], wb, xv);
            if constexpr (kLo) {
                std::memcpy(&pair, hi + m * row_bytes + lo_offset + size_t(j) * 4, 4);
                const __m512bh xl = (__m512bh)_mm512_set1_epi32(pair);
                acc_a[m] = _mm512_dpbf16_ps(acc_a[m], wa, xl);
                if constexpr (kTwo) acc_b[m] = _mm512_dpbf16_ps(acc_b[m], wb, xl);
            }
        }
    }
    for (int m = 0; m < MR; ++m) store_row<kMode>(out + m * ldo, &acc_a[m], &acc_b[m], cols);
}

// One row (decode). With one row the kernel above keeps a single accumulator per panel, and every
// chunk's vdpbf16ps (two with the low halves) waits on the previous one: its latency, not the
// weight stream, set the pace (37 GB/s from L3 against the f32 kernel's 51). Here each panel
// gets kChains independent accumulators (chunk parity x hi/lo), summed once at the end.
template <int kMode, bool kLo>
void panel_row_split(const uint8_t* x, int64_t kc, const uint8_t* pa, const uint8_t* pb, float* out, int cols) {
    constexpr bool kTwo = kMode != kSingle;
    constexpr int kChains = kLo ? 4 : 2;
    __m512 acc_a[kChains], acc_b[kChains];
    for (int i = 0; i < kChains; ++i) acc_a[i] = acc_b[i] = _mm512_setzero_ps();
    const uint8_t* hi = x + sizeof(SplitBf16Header);
    const uint8_t* lo = hi + size_t(kc) * 4;
    auto step = [&](int64_t j, int parity) {
        const __m512bh wa = (__m512bh)_mm512_loadu_si512(pa + size_t(j) * kChunkBytes);
        __m512bh wb;
        if constexpr (kTwo) wb = (__m512bh)_mm512_loadu_si512(pb + size_t(j) * kChunkBytes);
        int32_t pair;
        std::memcpy(&pair, hi + size_t(j) * 4, 4);
        const __m512bh xh = (__m512bh)_mm512_set1_epi32(pair);
        acc_a[parity] = _mm512_dpbf16_ps(acc_a[parity], wa, xh);
        if constexpr (kTwo) acc_b[parity] = _mm512_dpbf16_ps(acc_b[parity], wb, xh);
        if constexpr (kLo) {
            std::memcpy(&pair, lo + size_t(j) * 4, 4);
            const __m512bh xl = (__m512bh)_mm512_set1_epi32(pair);
            acc_a[2 + parity] = _mm512_dpbf16_ps(acc_a[2 + parity], wa, xl);
            if constexpr (kTwo) acc_b[2 + parity] = _mm512_dpbf16_ps(acc_b[2 + parity], wb, xl);
        }
    };
    int64_t j = 0;
    for (; j + 2 <= kc; j += 2) {
        step(j, 0);
        step(j + 1, 1);
    }
    if (j < kc) step(j, 0);
    // Sum order (even + odd), then hi + lo: the low halves are the small correction.
    __m512 a = _mm512_add_ps(acc_a[0], acc_a[1]), b = _mm512_add_ps(acc_b[0], acc_b[1]);
    if constexpr (kLo) {
        a = _mm512_add_ps(a, _mm512_add_ps(acc_a[2], acc_a[3]));
        b = _mm512_add_ps(b, _mm512_add_ps(acc_b[2], acc_b[3]));
    }
    store_row<kMode>(out, &a, &b, cols);
}

// one_pass: the layer asked for fast activations (KT_QUANT_FAST_ACTIVATIONS), so the low halves
// are left out even where they are nonzero: bf16 activations, kt-kernel's and torch's precision.
template <int MR, int kMode>
void panel_kernel(const uint8_t* x, size_t row_bytes, int64_t kc, const uint8_t* pa, const uint8_t* pb, float* out,
                  int64_t ldo, int cols, bool one_pass) {
    bool lo = false;
    for (int m = 0; m < MR && !one_pass; ++m) lo |= reinterpret_cast<const SplitBf16Header*>(x + m * row_bytes)->has_lo != 0;
    if constexpr (MR == 1) {
        if (lo) {
            panel_row_split<kMode, true>(x, kc, pa, pb, out, cols);
        } else {
            panel_row_split<kMode, false>(x, kc, pa, pb, out, cols);
        }
    } else if (lo) {
        panel_kernel_split<MR, kMode, true>(x, row_bytes, kc, pa, pb, out, ldo, cols);
    } else {
        panel_kernel_split<MR, kMode, false>(x, row_bytes, kc, pa, pb, out, ldo, cols);
    }
}
#else
#if defined(__AVX512F__)
constexpr int kMrFused = 6, kMrPlain = 8;
#else
constexpr int kMrFused = 2, kMrPlain = 4;
#endif

// x: f32 rows (exact f32 products: no faster mode, so one_pass changes nothing here).
template <int MR, int kMode>
void panel_kernel(const uint8_t* xb, size_t row_bytes, int64_t kc, const uint8_t* pa, const uint8_t* pb, float* out,
                  int64_t ldo, int cols, bool /*one_pass*/) {
    const auto* x = reinterpret_cast<const float*>(xb);
    const int64_t ldx = int64_t(row_bytes / sizeof(float));
    constexpr bool kTwo = kMode != kSingle;
    if constexpr (MR == 1) {   // decode: even and odd k into their own accumulators (two chains, not one)
        VF a_even[kVecsPerPanel], a_odd[kVecsPerPanel], b_even[kVecsPerPanel], b_odd[kVecsPerPanel];
        for (int v = 0; v < kVecsPerPanel; ++v) a_even[v] = a_odd[v] = b_even[v] = b_odd[v] = vzero();
        for (int64_t j = 0; j < kc; ++j) {
            const VF x0 = vset1(x[2 * j]), x1 = vset1(x[2 * j + 1]);
            for (int v = 0; v < kVecsPerPanel; ++v) {
                const VI wa = vloadi(pa + size_t(j) * kChunkBytes + size_t(v) * kLanes * 4);
                a_even[v] = vfma(bf16_even(wa), x0, a_even[v]);
                a_odd[v] = vfma(bf16_odd(wa), x1, a_odd[v]);
                if constexpr (kTwo) {
                    const VI wb = vloadi(pb + size_t(j) * kChunkBytes + size_t(v) * kLanes * 4);
                    b_even[v] = vfma(bf16_even(wb), x0, b_even[v]);
                    b_odd[v] = vfma(bf16_odd(wb), x1, b_odd[v]);
                }
            }
        }
        for (int v = 0; v < kVecsPerPanel; ++v) {
            a_even[v] = vadd(a_even[v], a_odd[v]);
            b_even[v] = vadd(b_even[v], b_odd[v]);
        }
        store_row<kMode>(out, a_even, b_even, cols);
        return;
    }
    VF acc_a[MR][kVecsPerPanel], acc_b[MR][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) acc_a[m][v] = acc_b[m][v] = vzero();
    for (int64_t j = 0; j < kc; ++j) {
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const VI wa = vloadi(pa + size_t(j) * kChunkBytes + size_t(v) * kLanes * 4);
            const VF a0 = bf16_even(wa), a1 = bf16_odd(wa);
            VF b0, b1;
            if constexpr (kTwo) {
                const VI wb = vloadi(pb + size_t(j) * kChunkBytes + size_t(v) * kLanes * 4);
                b0 = bf16_even(wb);
                b1 = bf16_odd(wb);
            }
            for (int m = 0; m < MR; ++m) {
                const VF x0 = vset1(x[m * ldx + 2 * j]), x1 = vset1(x[m * ldx + 2 * j + 1]);
                acc_a[m][v] = vfma(a1, x1, vfma(a0, x0, acc_a[m][v]));
                if constexpr (kTwo) acc_b[m][v] = vfma(b1, x1, vfma(b0, x0, acc_b[m][v]));
            }
        }
    }
    for (int m = 0; m < MR; ++m) store_row<kMode>(out + m * ldo, acc_a[m], acc_b[m], cols);
}
#endif

// Row blocks of MR, then the remainder through the matching smaller instantiation.
template <int MR, int kMode>
void rows_kernel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t kc, const uint8_t* pa, const uint8_t* pb,
                 float* out, int64_t ldo, int cols, bool one_pass) {
    for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
        panel_kernel<M, kMode>(x + r * row_bytes, row_bytes, kc, pa, pb, out + r * ldo, ldo, cols, one_pass);
    });
}

#if defined(__AVX512BF16__)
inline size_t act_row_bytes(int64_t k) { return split_bf16_row_bytes(k); }
#else
inline size_t act_row_bytes(int64_t k) { return f32_row_bytes(k); }
#endif

template <int kMode>
void run_rows(const kt_moe_config* c, const void* x, int64_t k, int64_t rows, const uint8_t* pa, const uint8_t* pb,
              float* out, int64_t ldo, int cols) {
    const auto* xb = static_cast<const uint8_t*>(x);
    const bool one_pass = one_activation_pass(c);
#if !defined(__AVX512F__)
    if (rows >= wide::kMinRows) {   // AVX2 prefill: each block of panels widened once (wide_panels.h)
        constexpr int P = wide::panels_of(kMode);
        constexpr int64_t kBlock = 128;   // k per widened block: 2 panels x 128 k x 64 B = 16 KiB, in L1
        const uint8_t* panel[2] = {pa, pb};
        const auto widen = [&](int64_t k0, int64_t kn, float* w) {
            for (int64_t j = 0; j < chunks(kn); ++j)
                for (int p = 0; p < P; ++p)
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        const VI c = vloadi(panel[p] + size_t(k0 / 2 + j) * kChunkBytes + size_t(v) * kLanes * 4);
                        vstore(w + (2 * j) * P * kPanel + p * kPanel + v * kLanes, bf16_even(c));
                        vstore(w + (2 * j + 1) * P * kPanel + p * kPanel + v * kLanes, bf16_odd(c));
                    }
        };
        wide::tile<kMode, false>(static_cast<const float*>(x), int64_t(act_row_bytes(k) / sizeof(float)), rows, k, kBlock,
                                 widen, nullptr, out, ldo, cols);
        return;
    }
#endif
    if constexpr (kMode == kSingle) {
        rows_kernel<kMrPlain, kSingle>(xb, act_row_bytes(k), rows, chunks(k), pa, pb, out, ldo, cols, one_pass);
    } else {
        rows_kernel<kMrFused, kMode>(xb, act_row_bytes(k), rows, chunks(k), pa, pb, out, ldo, cols, one_pass);
    }
}

// Down tiles of up to this many rows stream their panels one at a time in address order, not in
// adjacent pairs (two streams a panel apart, which the hardware prefetchers follow worse; INT8,
// INT4 and FP8 decode do the same). Measured on Zen 4, 1-token decode of a Qwen3-30B-A3B layer:
// 84-87 % -> 93-94 % of the read bandwidth (1 thread), 89-90 -> 94-96 % (2), x86-64-v3 20.8-21.0
// -> 23.8-24.2 GB/s; gate then up in order as well added 0-2 % (docs/performance.md). With more
// rows the pair's shared activation loads pay.
constexpr int64_t kDownInOrderRows = 1;

kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    const GateScope activation(c);   // the layer's gated activation, for the epilogues below
    if (const kt_status st = check_tile("BF16", "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    for (int64_t n = n0; n < n1; n += kPanel)
        run_rows<kFused>(c, act, c->hidden, rows, base + l.gate(n / kPanel), base + l.up(n / kPanel), out + n, ldo,
                         int(std::min<int64_t>(kPanel, n1 - n)));
    return KT_OK;
}

// Raw gate/up tiles (training's forward, expert biases) of this many rows and more run gate and up
// panel n as the pair kernel does two down panels — each activation broadcast feeds both — instead
// of one panel after the other (kMrPlain rows, a broadcast per product). Measured on Zen 4, the
// grouped raw gate/up of a Qwen3-30B-A3B layer (128 experts, 2 threads, bf16 activations): 32 rows
// per expert 244-252 -> 169-178 ms, 128 rows 353-410 -> 317-379 ms; x86-64-v3 at 32 rows 418-452 ->
// 367-422, x86-64-v4 311-382 -> 309-357; at 4 rows even (65-73 against 67-77 ms), where the two
// streams cost what the shared broadcasts save (decode-sized tiles keep one stream).
constexpr int64_t kRawPairRows = 8;

kt_status gate_up_raw_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    if (const kt_status st = check_tile("BF16", "gate/up", n0, n1, c->intermediate)) return st;
    if (rows >= kRawPairRows) {   // gate and up panels as one pair, the rows through a tile-local buffer
        gate_up_raw_pairs(layout(c), static_cast<const uint8_t*>(packed), rows, n0, n1, out_gate, out_up, ldo,
                          [&](const uint8_t* gate, const uint8_t* up, float* both) {
                              run_rows<kPair>(c, act, c->hidden, rows, gate, up, both, 2 * kPanel, 2 * kPanel);
                          });
        return KT_OK;
    }
    gate_up_raw(layout(c), static_cast<const uint8_t*>(packed), n0, n1, out_gate, out_up, ldo,
                [&](const uint8_t* panel, float* o, int64_t ld, int cols) {
                    run_rows<kSingle>(c, act, c->hidden, rows, panel, nullptr, o, ld, cols);
                });
    return KT_OK;
}

kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    const int64_t I = c->intermediate;
    if (const kt_status st = check_tile("BF16", "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    const auto single = [&](int64_t n, int cols) {
        run_rows<kSingle>(c, act, I, rows, base + l.down(n / kPanel), nullptr, out + n, ldo, cols);
    };
    if (rows <= kDownInOrderRows) {   // decode: one forward stream, panel by panel
        for (int64_t n = n0; n < n1; n += kPanel) single(n, int(std::min<int64_t>(kPanel, n1 - n)));
        return KT_OK;
    }
    down_panel_pairs(
        n0, n1,
        [&](int64_t n, int cols) {
            run_rows<kPair>(c, act, I, rows, base + l.down(n / kPanel), base + l.down(n / kPanel + 1), out + n, ldo, cols);
        },
        single);
    return KT_OK;
}

}  // namespace

kt_method_kernels bf16_kernels(const char* kernel_id) {
#if defined(__AVX512BF16__)
    constexpr QuantizeFn quantize = quantize_split_bf16_rows;
#else
    constexpr QuantizeFn quantize = quantize_f32_rows;
#endif
    return method_table("BF16", layout_bf16::kId, kernel_id, packed_bytes, pack, act_row_bytes, quantize, gate_up_tile,
                        down_tile, gate_up_raw_tile);
}

}  // namespace KT_TARGET_NAMESPACE
