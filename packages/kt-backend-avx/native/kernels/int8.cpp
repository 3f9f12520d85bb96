// INT8 experts: symmetric per-output-channel int8 weights (docs/formats.md), two-pass int8
// activations (common.h) quantized once per token. Packed layout "kt-int8-p16k4-v1" (kt/formats/packed_layouts.h): per matrix, panels of 16
// channels, each a 128-byte header {f32 scale[16]; i32 comp[16] = 128 * sum_k q} followed by
// K/4 chunks of 64 bytes (16 channels x 4 consecutive k) — the operand layout of vpdpbusd.
// Gate and up panels alternate; down panels follow.
//
// VNNI targets feed activations as q + 128 (vpdpbusd multiplies unsigned by signed) and take
// 128 * sum(w) back out with comp; the others move each activation's sign onto the weights so
// vpmaddubsw's int16 pair sums cannot saturate (127 * 127 * 2 < 32767).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <kt/formats/quant_rules.h>

#include "int_dot.h"
#include "lanes.h"
#include "methods.h"
#include "wide_panels.h"

namespace KT_TARGET_NAMESPACE {
namespace {

namespace layout_int8 = kt::layouts::int8;   // the layout's geometry: kt-core's public definition
constexpr size_t kHeaderBytes = layout_int8::kHeaderBytes, kChunkBytes = kPanel * 4;
#if defined(__AVX512VNNI__)
constexpr bool kOffsetActivations = true;
#else
constexpr bool kOffsetActivations = false;
#endif

int64_t chunks(int64_t k) { return round_up(k, 4) / 4; }

// One channel's codes and scale: kt's pre-quantized int8 codes with their f32 scale
// (docs/formats.md) used in place, or quantized from floats into q.
const int8_t* channel_codes(const kt_weight& w, int64_t n, int8_t* q, float* scale, std::vector<float>& row) {
    const kt_matrix& m = w.values;
    if (m.dtype == KT_DTYPE_I8) {
        *scale = static_cast<const float*>(w.scales.data)[n * w.scales.row_stride];
        return static_cast<const int8_t*>(m.data) + n * m.row_stride;
    }
    load_row(m, n, row.data());
    *scale = kt::quant::quantize_symmetric(row.data(), m.cols, 127.0f, -127, 127, q);   // kt/formats/quant_rules.h
    return q;
}

// Lane i of chunk c is the 4 bytes of k = 4c..4c+3 of channel n0 + i (lanes.h moves them).
// q holds kPanel rows of K codes for channels quantized here.
void pack_panel(const kt_weight& w, int64_t n0, uint8_t* dst, std::vector<float>& row, std::vector<int8_t>& q) {
    const kt_matrix& m = w.values;
    const int64_t K = m.cols, full = K / 4;
    auto* scale = reinterpret_cast<float*>(dst);
    auto* comp = reinterpret_cast<int32_t*>(dst + 64);
    uint8_t* codes = dst + kHeaderBytes;
    const uint8_t* rows[kPanel] = {};
    for (int64_t i = 0; i < kPanel && n0 + i < m.rows; ++i) {
        const int8_t* src = channel_codes(w, n0 + i, q.data() + i * K, scale + i, row);
        int32_t sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += src[k];
        comp[i] = 128 * sum;
        rows[i] = reinterpret_cast<const uint8_t*>(src);
        for (int64_t k = 4 * full; k < K; ++k) codes[size_t(full) * kChunkBytes + size_t(i) * 4 + size_t(k % 4)] = uint8_t(src[k]);
    }
    pack_lanes(rows, full, codes);
}

// kt's INT8 codes: int8 [N, K] in [-127, 127] with f32 scales [N, 1] (a -128 would overflow
// when the non-VNNI kernels move an activation's sign onto the weight).
kt_status expect_int8_codes(const kt_weight& w, int64_t rows, int64_t cols, const char* name) {
    if (w.values.rows != rows || w.values.cols != cols)
        return fail(KT_ERROR_INVALID_ARGUMENT, "INT8: %s codes should be int8 [%lld, %lld], got [%lld, %lld]", name,
                    (long long)rows, (long long)cols, (long long)w.values.rows, (long long)w.values.cols);
    if (!w.scales.data || w.scales.dtype != KT_DTYPE_F32 || w.scales.rows != rows || w.scales.cols != 1)
        return fail(KT_ERROR_INVALID_ARGUMENT, "INT8: %s codes need f32 scales [%lld, 1], got %s", name, (long long)rows,
                    w.scales.data ? dtype_name(w.scales.dtype) : "none");
    if (w.zeros.data) return fail(KT_ERROR_INVALID_ARGUMENT, "INT8: %s is symmetric; zero points must not be given", name);
    for (int64_t r = 0; r < rows; ++r) {
        const int8_t* row = static_cast<const int8_t*>(w.values.data) + r * w.values.row_stride;
        const int64_t c = find_first(row, cols, [](int8_t q) { return q == -128; });
        if (c >= 0)
            return fail(KT_ERROR_INVALID_ARGUMENT, "INT8: %s codes hold -128 at [%lld, %lld]; INT8 codes are in [-127, 127]",
                        name, (long long)r, (long long)c);
    }
    return KT_OK;
}

kt_status expect_weight(const kt_weight& w, int64_t rows, int64_t cols, const char* name) {
    return w.values.dtype == KT_DTYPE_I8 ? expect_int8_codes(w, rows, cols, name)
                                         : expect_float_weight(w, rows, cols, name, "INT8");
}

ExpertPanels layout(const kt_moe_config* c) { return layout_int8::expert(c->hidden, c->intermediate); }

size_t packed_bytes(const kt_moe_config* c) { return layout(c).bytes(); }

kt_status pack(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    kt_status st;
    if ((st = expect_weight(src->gate, I, H, "gate")) != KT_OK) return st;
    if ((st = expect_weight(src->up, I, H, "up")) != KT_OK) return st;
    if ((st = expect_weight(src->down, H, I, "down")) != KT_OK) return st;
    std::vector<float> row(size_t(std::max(H, I)));
    std::vector<int8_t> q(size_t(kPanel * std::max(H, I)));
    auto* out = static_cast<uint8_t*>(dst);
    const ExpertPanels l = layout(c);
    for (int64_t p = 0; p < panels(I); ++p) {
        pack_panel(src->gate, p * kPanel, out + l.gate(p), row, q);
        pack_panel(src->up, p * kPanel, out + l.up(p), row, q);
    }
    for (int64_t p = 0; p < panels(H); ++p) pack_panel(src->down, p * kPanel, out + l.down(p), row, q);
    return KT_OK;
}

// Registers: 2 planes x MR x (1 or 2 panels) accumulators + the panel's weights + two
// broadcasts must fit in 32 (AVX-512) or 16 (AVX2) vector registers, or the loop spills.
#if defined(__AVX512F__)
constexpr int kMrFused = 6, kMrPlain = 12;
#else
constexpr int kMrFused = 1, kMrPlain = 2;
#endif
// Gate/up tiles of one row stream gate then up (gate_up_in_order, common.h); from two rows the
// fused kernel wins, as INT8's kernel does less per byte than INT4's (docs/performance.md).
constexpr int64_t kInOrderRows = 1;

// One int8 pass of code plane `a` against one weight vector.
inline VI dot_pass(VI acc, VI a, VI w) {
    if constexpr (kOffsetActivations) {
        return dot_u8s8(acc, a, w);
    } else {
        return dot_u8s8(acc, abs_i8(a), sign_i8(w, a));
    }
}

// MR activation rows x one panel, or a gate/up pair (kFused: their gated activation, kPair: both,
// 32 outputs per row), over all of K, both code planes.
template <int MR, int kMode, bool kTwoPass, bool kAhead = false>
void panel_kernel(const uint8_t* x, size_t row_bytes, int64_t k, const uint8_t* pa, const uint8_t* pb, float* out,
                  int64_t ldo, int cols, PrefetchAhead ahead = {}) {
    constexpr int F = kMode == kSingle ? 1 : 2;
    VI hi[MR][F][kVecsPerPanel], lo[MR][F][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) hi[m][f][v] = lo[m][f][v] = vzeroi();
    const uint8_t* codes_hi = int8_hi(x);
    const uint8_t* codes_lo = int8_lo(x, k);
    const uint8_t* panel[2] = {pa + kHeaderBytes, pb ? pb + kHeaderBytes : nullptr};
    const int64_t kc = chunks(k);
    for (int64_t j = 0; j < kc; ++j) {
        if constexpr (kAhead) ahead.step();
        VI w[F][kVecsPerPanel];
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v)
                w[f][v] = vloadi(panel[f] + size_t(j) * kChunkBytes + size_t(v) * kLanes * 4);
        for (int m = 0; m < MR; ++m) {
            int32_t quad[2];
            std::memcpy(&quad[0], codes_hi + m * row_bytes + size_t(j) * 4, 4);
            std::memcpy(&quad[1], codes_lo + m * row_bytes + size_t(j) * 4, 4);
            const VI ah = vset1i(quad[0]), al = vset1i(quad[1]);
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    hi[m][f][v] = dot_pass(hi[m][f][v], ah, w[f][v]);
                    if constexpr (kTwoPass) lo[m][f][v] = dot_pass(lo[m][f][v], al, w[f][v]);
                }
        }
    }
    const uint8_t* headers[2] = {pa, pb};
    for (int m = 0; m < MR; ++m) {
        const float sa = reinterpret_cast<const Int8Header*>(x + m * row_bytes)->scale;
        for (int v = 0; v < kVecsPerPanel; ++v) {
            VF r[F];
            for (int f = 0; f < F; ++f) {
                VI h = hi[m][f][v], l = lo[m][f][v];
                if constexpr (kOffsetActivations) {
                    const VI comp = vloadi(headers[f] + 64 + size_t(v) * kLanes * 4);
                    h = vsubi(h, comp);
                    l = vsubi(l, comp);
                }
                const VF dot = kTwoPass ? vfma(vcvt(l), vset1(1.0f / 128.0f), vcvt(h)) : vcvt(h);
                r[f] = vmul(dot, vmul(vload(reinterpret_cast<const float*>(headers[f]) + v * kLanes), vset1(sa)));
            }
            if constexpr (kMode == kPair) {
                for (int f = 0; f < 2; ++f) {
                    const int n = std::min(kLanes, cols - f * kPanel - v * kLanes);
                    if (n > 0) vstore_partial(out + m * ldo + f * kPanel + v * kLanes, r[f], n);
                }
                continue;
            }
            VF res = r[0];
            if constexpr (kMode == kFused) res = gate_mul(r[0], r[1]);
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + m * ldo + v * kLanes, res, n);
        }
    }
}

template <int MR, int kMode, bool kTwoPass>
void rows_kernel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, const uint8_t* pa, const uint8_t* pb,
                 float* out, int64_t ldo, int cols, const uint8_t* next, size_t next_bytes) {
    for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
        if constexpr (M == MR)
            if (r == 0 && next_bytes) {
                panel_kernel<M, kMode, kTwoPass, true>(x, row_bytes, k, pa, pb, out, ldo, cols,
                                                       PrefetchAhead(next, next_bytes, chunks(k)));
                return;
            }
        panel_kernel<M, kMode, kTwoPass>(x + r * row_bytes, row_bytes, k, pa, pb, out + r * ldo, ldo, cols);
    });
}

// The activation passes a layer asked for: one with KT_QUANT_FAST_ACTIVATIONS, else two.
template <int kMode, int MR>
void run_rows(const kt_moe_config* c, const void* act, int64_t k, int64_t rows, const uint8_t* pa, const uint8_t* pb,
              float* out, int64_t ldo, int cols, const uint8_t* next = nullptr, size_t next_bytes = 0) {
    const auto* x = static_cast<const uint8_t*>(act);
    // The first row block fetches `next` (the following panel or pair) into L2: PrefetchAhead.
    if (rows <= MR) next_bytes = 0;   // one row block: nothing to overlap with the fetch
    if (one_activation_pass(c)) {
        rows_kernel<MR, kMode, false>(x, int8_row_bytes(k), rows, k, pa, pb, out, ldo, cols, next, next_bytes);
    } else {
        rows_kernel<MR, kMode, true>(x, int8_row_bytes(k), rows, k, pa, pb, out, ldo, cols, next, next_bytes);
    }
}

#if !defined(__AVX512F__)
// AVX2 prefill (tiles of kWideMinRows rows and more, two activation passes): the activation rows
// widened to f32 once per tile (chunks of <= 256 rows) and each 128-k block of a panel's codes
// widened times its channel scales, then f32 FMAs (wide_panels.h). Without VNNI an int8 pass costs
// vpsignb + vpmaddubsw + vpmaddwd + vpaddd per 32 products, two passes twice that, where an FMA
// does 8 (docs/performance.md). The products are the integer kernel's (the same codes, the same
// activation values), summed in f32 instead of int32.
// From 8 rows: at 4 rows per expert the integer kernels were faster (widening the panels and the
// rows costs what 4 rows' FMAs save), at 8 the widened ones by 4-6 % (docs/performance.md).
// One pass (KT_QUANT_FAST_ACTIVATIONS) halves the integer kernels' work: they stayed 1.3-1.5x faster
// than the widened panels from 8 to 256 rows, so fast activations keep them.
constexpr int64_t kWideMinRows = 8;
inline bool wide_prefill(const kt_moe_config* c, int64_t rows) { return rows >= kWideMinRows && !one_activation_pass(c); }

template <int kMode>
void wide_tile(const wide::Int8Rows& a, int64_t k, const uint8_t* pa, const uint8_t* pb, float* out, int64_t ldo,
               int cols) {
    constexpr int P = wide::panels_of(kMode);
    constexpr int64_t kBlock = 128;   // k per widened block: 2 panels x 128 k x 64 B f32 = 16 KiB, in L1
    const uint8_t* panel[2] = {pa, pb};
    const auto widen = [&](int64_t k0, int64_t kn, float* w) {
        for (int p = 0; p < P; ++p)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                const VF scale = vload(reinterpret_cast<const float*>(panel[p]) + v * kLanes);
                for (int64_t j = 0; j < chunks(kn); ++j) {
                    // Lane i: the codes of k = 4j..4j+3 of channel v * 8 + i; byte b sign-extended.
                    const VI q = vloadi(panel[p] + kHeaderBytes + size_t(k0 / 4 + j) * kChunkBytes + size_t(v) * kLanes * 4);
                    float* dst = w + 4 * j * P * kPanel + p * kPanel + v * kLanes;
                    vstore(dst, vmul(vcvt(_mm256_srai_epi32(_mm256_slli_epi32(q, 24), 24)), scale));
                    vstore(dst + P * kPanel, vmul(vcvt(_mm256_srai_epi32(_mm256_slli_epi32(q, 16), 24)), scale));
                    vstore(dst + 2 * P * kPanel, vmul(vcvt(_mm256_srai_epi32(_mm256_slli_epi32(q, 8), 24)), scale));
                    vstore(dst + 3 * P * kPanel, vmul(vcvt(_mm256_srai_epi32(q, 24)), scale));
                }
            }
    };
    wide::tile<kMode, false>(a.x, a.ldx, a.rows, k, kBlock, widen, nullptr, out, ldo, cols);
}
#endif

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    return quantize_int8_rows(in, dtype, rows, k, stride, out, kOffsetActivations);
}

kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    const GateScope activation(c);   // the layer's gated activation, for the epilogues below
    if (const kt_status st = check_tile("INT8", "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if !defined(__AVX512F__)
    if (wide_prefill(c, rows)) {
        wide::for_int8_row_chunks(act, int8_row_bytes(c->hidden), rows, c->hidden, [&](const wide::Int8Rows& a) {
            for (int64_t n = n0; n < n1; n += kPanel)
                wide_tile<wide::kFused>(a, c->hidden, base + l.gate(n / kPanel), base + l.up(n / kPanel),
                                        out + a.r0 * ldo + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
        });
        return KT_OK;
    }
#endif
    if (rows <= kInOrderRows) {
        gate_up_in_order<kInOrderRows>(rows, base + l.gate(n0 / kPanel), base + l.up(n0 / kPanel), l.gate(1), n0, n1, out, ldo,
                         [&](const uint8_t* panel, float* o) {
                             run_rows<kSingle, kMrPlain>(c, act, c->hidden, rows, panel, nullptr, o, kPanel, kPanel);
                         });
        return KT_OK;
    }
    for (int64_t n = n0; n < n1; n += kPanel)
        run_rows<kFused, kMrFused>(c, act, c->hidden, rows, base + l.gate(n / kPanel), base + l.up(n / kPanel), out + n, ldo,
                                   int(std::min<int64_t>(kPanel, n1 - n)), base + l.gate(n / kPanel + 1),
                                   n + kPanel < n1 ? 2 * l.gate_up_panel : 0);
    return KT_OK;
}

kt_status gate_up_raw_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    if (const kt_status st = check_tile("INT8", "gate/up", n0, n1, c->intermediate)) return st;
#if !defined(__AVX512F__)
    if (wide_prefill(c, rows)) {
        wide::for_int8_row_chunks(act, int8_row_bytes(c->hidden), rows, c->hidden, [&](const wide::Int8Rows& a) {
            gate_up_raw_pairs(layout(c), static_cast<const uint8_t*>(packed), a.rows, n0, n1, out_gate + a.r0 * ldo,
                              out_up + a.r0 * ldo, ldo, [&](const uint8_t* gate, const uint8_t* up, float* both) {
                                  wide_tile<wide::kPair>(a, c->hidden, gate, up, both, 2 * kPanel, 2 * kPanel);
                              });
        });
        return KT_OK;
    }
#endif
    if (rows > kInOrderRows) {   // gate and up as one pair, as the fused tile (gate_up_raw_pairs)
        gate_up_raw_pairs(layout(c), static_cast<const uint8_t*>(packed), rows, n0, n1, out_gate, out_up, ldo,
                          [&](const uint8_t* gate, const uint8_t* up, float* both) {
                              run_rows<kPair, kMrFused>(c, act, c->hidden, rows, gate, up, both, 2 * kPanel, 2 * kPanel);
                          });
        return KT_OK;
    }
    gate_up_raw(layout(c), static_cast<const uint8_t*>(packed), n0, n1, out_gate, out_up, ldo,
                [&](const uint8_t* panel, float* o, int64_t ld, int cols) {
                    run_rows<kSingle, kMrPlain>(c, act, c->hidden, rows, panel, nullptr, o, ld, cols);
                });
    return KT_OK;
}

kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    if (const kt_status st = check_tile("INT8", "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if !defined(__AVX512F__)
    if (wide_prefill(c, rows)) {   // panel pairs, as BF16's down tiles
        const int64_t I = c->intermediate;
        wide::for_int8_row_chunks(act, int8_row_bytes(I), rows, I, [&](const wide::Int8Rows& a) {
            float* o = out + a.r0 * ldo;
            down_panel_pairs(
                n0, n1,
                [&](int64_t n, int cols) {
                    wide_tile<wide::kPair>(a, I, base + l.down(n / kPanel), base + l.down(n / kPanel + 1), o + n, ldo, cols);
                },
                [&](int64_t n, int cols) { wide_tile<wide::kSingle>(a, I, base + l.down(n / kPanel), nullptr, o + n, ldo, cols); });
        });
        return KT_OK;
    }
#endif
    for (int64_t n = n0; n < n1; n += kPanel)
        run_rows<kSingle, kMrPlain>(c, act, c->intermediate, rows, base + l.down(n / kPanel), nullptr, out + n, ldo,
                                  int(std::min<int64_t>(kPanel, n1 - n)), base + l.down(n / kPanel + 1),
                                  n + kPanel < n1 ? l.down_panel : 0);
    return KT_OK;
}

}  // namespace

kt_method_kernels int8_kernels(const char* kernel_id) {
    return method_table("INT8", layout_int8::kId, kernel_id, packed_bytes, pack, int8_row_bytes, quantize, gate_up_tile,
                        down_tile, gate_up_raw_tile);
}

}  // namespace KT_TARGET_NAMESPACE
