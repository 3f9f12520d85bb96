// Plugin ABI 1.5's transposed tiles, training's backward: out[r, k] = sum_n grad[r, n] W[n, k]
// for k in [k0, k1), straight from the packed panels (no transposed copy of the weights).
//
// A panel holds 16 output channels n and, per input column k, one 16-lane vector of their
// weights. The product wants the opposite: per channel n, a vector over k, to be multiplied by
// the broadcast gradient grad[r, n]. So each block of kKBlock columns of a run of channels is
// widened to f32 16 columns at a time, transposed in registers into rows W[n][k..k+kKBlock)
// (an L1-resident buffer), and a register-blocked kernel adds grad[r, n] * W[n][k-block] over the
// run for kMr rows at a time. Each weight is widened once per tile, the gradient rows are read
// in their own layout once per column block, and the accumulators leave registers once per run.
// Gradients are used as given (f32), so the products are as exact as the packed weights.
//
// Formats: BF16, INT8, the INT4 layouts with integer codes (INT4 symmetric or with zero points,
// RAWINT4, GPTQ_INT4), the FP4 formats on that layout (MXFP4, NVFP4) and the FP8 family (FP8's
// 128 x 128 blocks, FP8_PERCHANNEL, MXFP8), which is what frozen base weights of LoRA training come in.
#include "methods.h"
#include "transposed_weights.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace KT_TARGET_NAMESPACE {
namespace {

using namespace transposed;   // the column readers, widen_run and the formats (transposed_weights.h)

constexpr int kMr = kLanes == 16 ? 4 : 3;          // rows per register block: 16 / 12 accumulators

// acc rows [r, r + MR) of the tile buffer (kKBlock floats each) += grad[r][n0 + c] * W[c][.]
// over the run's `count` channels.
template <int MR>
inline void run_rows(const float* grad, int64_t gs, int64_t r, int64_t n0, int64_t count, const float* w, float* acc) {
    VF a[MR][kVecs];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kVecs; ++v) a[i][v] = vload(acc + (r + i) * kKBlock + v * kLanes);
    const float* g = grad + r * gs + n0;
    for (int64_t c = 0; c < count; ++c) {
        const float* wr = w + c * kKBlock;
        VF wv[kVecs];
        for (int v = 0; v < kVecs; ++v) wv[v] = vload(wr + v * kLanes);
        for (int i = 0; i < MR; ++i) {
            const VF b = vset1(g[i * gs + c]);
            for (int v = 0; v < kVecs; ++v) a[i][v] = vfma(b, wv[v], a[i][v]);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kVecs; ++v) vstore(acc + (r + i) * kKBlock + v * kLanes, a[i][v]);
}

// One matrix's share of a tile: acc[r][.] += sum over all N channels of grad[r][n] W[n][kb + .].
template <class Columns>
void add_matrix(const Columns& col, const uint8_t* base, size_t first_panel, size_t panel_stride, int64_t N, int64_t K,
                const float* grad, int64_t gs, int64_t rows, int64_t kb, float* acc) {
    alignas(64) float w[kRun * kKBlock];
    for (int64_t n0 = 0; n0 < N; n0 += kRun) {
        const int64_t count = std::min(kRun, N - n0);
        widen_run(col, base, first_panel, panel_stride, n0, (count + kPanel - 1) / kPanel * kPanel, K, kb, w);
        const float* rows_of_w = w;   // captured as a pointer: a by-value lambda would copy the array
        const auto block = [=]<int MR>(int64_t r) { run_rows<MR>(grad, gs, r, n0, count, rows_of_w, acc); };
        for_row_blocks<kMr>(rows, block);
    }
}

struct Part {
    size_t first_panel, panel_stride;
    int64_t N;
    const float* grad;
};

// out[r, k0 .. k1) = sum over the parts of grad[r] . W over [k0, k1), column block by block.
template <class Columns>
kt_status transposed(const Columns& col, const uint8_t* base, std::initializer_list<Part> parts, int64_t K, int64_t gs,
                     int64_t rows, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    thread_local std::vector<float> acc;
    acc.resize(size_t(rows * kKBlock));
    for (int64_t kb = k0; kb < k1; kb += kKBlock) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (const Part& p : parts) add_matrix(col, base, p.first_panel, p.panel_stride, p.N, K, p.grad, gs, rows, kb, acc.data());
        const int64_t width = std::min(kKBlock, k1 - kb);
        for (int64_t r = 0; r < rows; ++r) std::copy_n(acc.data() + r * kKBlock, width, out + r * ldo + kb);
    }
    return KT_OK;
}

#if defined(__AVX512BF16__)
// --- BF16 weights, gradients in bf16 (the layer's fast_activations): vdpbf16ps -------------
// Twice the multiply-adds per instruction of the f32 path, at bf16's rounding of the gradients
// (what a bf16 training run's backward does anyway). The panels' bf16 pairs run along k, the
// product needs pairs along n: bf16_pair_words (transposed_weights.h) makes them, in an order of k
// that each accumulator keeps, put back when the block is stored.
namespace bf16dot {

constexpr int64_t kKBlock = 64;   // two 32-k halves, four accumulators per row
constexpr int kMr = 4;
constexpr int64_t kRun = 128;     // channels per run: 64 pairs x 256 bytes of pair words in L1

// acc rows [r, r + MR) (four vectors each, in pair-word k order) += the run's pairs' products.
template <int MR>
inline void run_rows(const uint32_t* g, int64_t gs, int64_t r, int64_t pair0, int64_t pairs, const __m512i* P,
                     float* acc) {
    __m512 a[MR][4];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < 4; ++v) a[i][v] = _mm512_loadu_ps(acc + (r + i) * kKBlock + v * 16);
    for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh w0 = (__m512bh)P[4 * p], w1 = (__m512bh)P[4 * p + 1], w2 = (__m512bh)P[4 * p + 2],
                       w3 = (__m512bh)P[4 * p + 3];
        for (int i = 0; i < MR; ++i) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32(int(g[(r + i) * gs + pair0 + p]));
            a[i][0] = _mm512_dpbf16_ps(a[i][0], b, w0);
            a[i][1] = _mm512_dpbf16_ps(a[i][1], b, w1);
            a[i][2] = _mm512_dpbf16_ps(a[i][2], b, w2);
            a[i][3] = _mm512_dpbf16_ps(a[i][3], b, w3);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < 4; ++v) _mm512_storeu_ps(acc + (r + i) * kKBlock + v * 16, a[i][v]);
}

// Gradient rows [rows, N] f32 -> bf16 pairs [rows, ceil(N / 2)] (nearest even; an odd N's last pair
// padded with 0).
void to_pairs(const float* grad, int64_t gs, int64_t rows, int64_t N, std::vector<uint32_t>& out) {
    const int64_t pairs = (N + 1) / 2;
    out.assign(size_t(rows * pairs), 0u);
    for (int64_t r = 0; r < rows; ++r) {
        auto* dst = reinterpret_cast<uint16_t*>(out.data() + r * pairs);
        for (int64_t n = 0; n < N; ++n) dst[n] = f32_to_bf16(grad[r * gs + n]);
    }
}

struct Part {
    size_t first_panel, panel_stride;
    int64_t N;
    const float* grad;
};

kt_status transposed(const uint8_t* base, std::initializer_list<Part> parts, int64_t K, int64_t gs, int64_t rows,
                     int64_t k0, int64_t k1, float* out, int64_t ldo) {
    thread_local std::vector<float> acc;
    thread_local std::vector<uint32_t> gpairs[2];
    alignas(64) __m512i P[4 * kRun / 2];
    acc.resize(size_t(rows * kKBlock));
    int which = 0;
    for (const Part& p : parts) to_pairs(p.grad, gs, rows, p.N, gpairs[which++]);
    for (int64_t kb = k0; kb < k1; kb += kKBlock) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        which = 0;
        for (const Part& p : parts) {
            const uint32_t* g = gpairs[which++].data();
            const int64_t gpairs_stride = (p.N + 1) / 2;
            for (int64_t n0 = 0; n0 < p.N; n0 += kRun) {
                const int64_t count = std::min(kRun, p.N - n0);
                bf16_pair_words(base, p.first_panel, p.panel_stride, n0, (count + kPanel - 1) / kPanel * kPanel, K, kb, P, 4, 1);
                const __m512i* pp = P;
                const int64_t pair0 = n0 / 2, pairs = (count + 1) / 2;
                float* accp = acc.data();
                const auto block = [=]<int MR>(int64_t r) { run_rows<MR>(g, gpairs_stride, r, pair0, pairs, pp, accp); };
                for_row_blocks<kMr>(rows, block);
            }
        }
        // Accumulator v holds the k of pair-word vector v.
        const int64_t width = std::min(kKBlock, k1 - kb);
        for (int64_t r = 0; r < rows; ++r) {
            const float* a = acc.data() + r * kKBlock;
            float* o = out + r * ldo + kb;
            for (int v = 0; v < 4; ++v)
                for (int i = 0; i < 16; ++i) {
                    const int64_t k = pair_word_column(v, i);
                    if (k < width) o[k] = a[v * 16 + i];
                }
        }
    }
    return KT_OK;
}

}  // namespace bf16dot
#endif

template <class F>
kt_status gate_up_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad_gate,
                                  const float* grad_up, int64_t gs, int64_t rows, int64_t k0, int64_t k1, float* out,
                                  int64_t ldo) {
    if (const kt_status st = check(F::kName, k0, k1, c->hidden)) return st;
    const ExpertPanels l = F::panels(c);
    // Gate and up panels alternate: each matrix's panels are two panel sizes apart.
    const size_t stride = 2 * l.gate_up_panel;
#if defined(__AVX512BF16__)
    if constexpr (F::kBf16Values)
        if (one_activation_pass(c))
            return bf16dot::transposed(static_cast<const uint8_t*>(packed),
                                       {bf16dot::Part{l.gate(0), stride, c->intermediate, grad_gate},
                                        bf16dot::Part{l.up(0), stride, c->intermediate, grad_up}},
                                       c->hidden, gs, rows, k0, k1, out, ldo);
#endif
    return transposed(F::columns(c), static_cast<const uint8_t*>(packed),
                      {Part{l.gate(0), stride, c->intermediate, grad_gate}, Part{l.up(0), stride, c->intermediate, grad_up}},
                      c->hidden, gs, rows, k0, k1, out, ldo);
}

template <class F>
kt_status down_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad, int64_t gs, int64_t rows,
                               int64_t k0, int64_t k1, float* out, int64_t ldo) {
    if (const kt_status st = check(F::kName, k0, k1, c->intermediate)) return st;
    const ExpertPanels l = F::panels(c);
#if defined(__AVX512BF16__)
    if constexpr (F::kBf16Values)
        if (one_activation_pass(c))
            return bf16dot::transposed(static_cast<const uint8_t*>(packed), {bf16dot::Part{l.down(0), l.down_panel, c->hidden, grad}},
                                       c->intermediate, gs, rows, k0, k1, out, ldo);
#endif
    return transposed(F::columns(c), static_cast<const uint8_t*>(packed), {Part{l.down(0), l.down_panel, c->hidden, grad}},
                      c->intermediate, gs, rows, k0, k1, out, ldo);
}

template <class F>
void set(kt_method_kernels& m) {
    m.transposed_block = kTileBlock;
    m.gate_up_transposed_tile = gate_up_transposed_tile<F>;
    m.down_transposed_tile = down_transposed_tile<F>;
}

}  // namespace

void add_transposed_tiles(kt_method_kernels& m) {
    const std::string method = m.method;
    if (method == "BF16") set<Bf16Format>(m);
    else if (method == "INT8") set<Int8Format>(m);
    else if (method == "INT4" || method == "GPTQ_INT4") set<Int4Format<false>>(m);   // GPTQ_INT4 packs INT4's layout
    else if (method == "RAWINT4") set<Int4Format<true>>(m);
    else if (method == "MXFP4") set<Fp4Format<false>>(m);
    else if (method == "NVFP4") set<Fp4Format<true>>(m);
    else if (method == "FP8") set<Fp8Format<kt::inputs::Fp8Scales::kBlock128>>(m);
    else if (method == "FP8_PERCHANNEL") set<Fp8Format<kt::inputs::Fp8Scales::kPerChannel>>(m);
    else if (method == "MXFP8") set<Fp8Format<kt::inputs::Fp8Scales::kMx>>(m);
}

}  // namespace KT_TARGET_NAMESPACE
