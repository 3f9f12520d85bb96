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
// --- every format, gradients in bf16 (the layer's fast_activations): vdpbf16ps ----------------
// Twice the multiply-adds per instruction of the f32 path, at bf16's rounding of the gradients
// (what a bf16 training run's backward does anyway). The panels' pairs run along k, the product
// needs pairs along n: the format's pair-word maker (transposed_weights.h) makes them, in an order
// of k that each accumulator keeps, put back when a row is stored. BF16's words are its weights;
// INT8's are its codes (exact in bf16), its per-channel scales multiplying the gradients before
// they are rounded: sum_n g[r, n] s[n] q[n, k] = sum_n (g[r, n] s[n]) q[n, k]; the other formats'
// are their dequantized weights rounded to bf16.
//
// Per 64-column block, every channel's pair words are made once into an L2-resident buffer (all
// parts' channels one after another: 196 KiB for Qwen3-30B-A3B's gate/up, 256 KiB for its down);
// then, per 32-column half, kMr gradient rows keep their sums in registers over every channel
// pair, streaming the half's two pair-word vectors per pair, as the forward kernels stream a
// gate/up panel pair, and each row's 32 columns are stored once. (It was 4 rows x 64 columns per
// 128-channel run in L1, with the sums carried in a row buffer between runs; alternated builds on
// Zen 4, Qwen3-30B-A3B layer: gate/up^T 300-305 -> 279-280 ms, down^T the same; DeepSeek-V3-shaped
// experts the same; docs/performance.md.)
namespace bf16dot {

constexpr int kMr = 12;            // 24 accumulators, 2 pair-word vectors, the broadcast
constexpr int64_t kPairBlock = 64;  // bf16_pair_words' columns per block

// Rows [0, MR) of g (pairs g[i * gs + p]) times the half's pair words (lo[p], hi[p]) over every
// pair p: out[i][0 .. width) (width <= 32).
template <int MR>
inline void rows_half(const uint32_t* g, int64_t gs, int64_t pairs, const __m512i* lo, const __m512i* hi, float* out,
                      int64_t ldo, int width) {
    __m512 a[MR][2];
    for (int i = 0; i < MR; ++i) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
        const __m512bh w0 = (__m512bh)_mm512_load_si512(lo + p), w1 = (__m512bh)_mm512_load_si512(hi + p);
        for (int i = 0; i < MR; ++i) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32(int(g[i * gs + p]));
            a[i][0] = _mm512_dpbf16_ps(a[i][0], b, w0);
            a[i][1] = _mm512_dpbf16_ps(a[i][1], b, w1);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int q = 0; q < 2; ++q) {
            const int n = std::min(16, width - 16 * q);
            if (n > 0) vstore_partial(out + i * ldo + 16 * q, pair_word_columns(a[i][0], a[i][1], q), n);
        }
}

// Gradient rows [rows, N] f32 (times scale[n] per channel where scale is given) -> bf16 pairs at
// dst[r * ld .. + pairs) (nearest even, as f32_to_bf16; channels N .. 2 pairs padded with 0).
void to_pairs(const float* grad, int64_t gs, int64_t rows, int64_t N, const float* scale, int64_t pairs, uint32_t* dst,
              int64_t ld) {
    const __m512i one = _mm512_set1_epi32(1), round = _mm512_set1_epi32(0x7fff), abs = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x40);
    for (int64_t r = 0; r < rows; ++r) {
        auto* d = reinterpret_cast<uint16_t*>(dst + r * ld);
        const float* src = grad + r * gs;
        for (int64_t n = 0; n < 2 * pairs; n += 16) {
            const __mmask16 m = n + 16 <= N ? __mmask16(0xffff) : n < N ? __mmask16((1u << (N - n)) - 1) : __mmask16(0);
            __m512 v = _mm512_maskz_loadu_ps(m, src + n);
            if (scale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, scale + n));
            const __m512i bits = _mm512_castps_si512(v);
            const __m512i rounded = _mm512_srli_epi32(
                _mm512_add_epi32(bits, _mm512_add_epi32(round, _mm512_and_si512(_mm512_srli_epi32(bits, 16), one))), 16);
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs), inf);
            const __m512i h = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), quiet);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + n), _mm512_cvtepi32_epi16(h));
        }
    }
}

struct Part {
    size_t first_panel, panel_stride;
    int64_t N;
    const float* grad;
};

// The weights of the next 64-column block (each panel's 2 KiB at that block, from DRAM) prefetched
// into L2 a share at a time while this block computes, so making its pair words does not wait on
// DRAM: every panel's lines once, spread over `steps` calls of step().
class NextBlockPrefetch {
public:
    NextBlockPrefetch(const std::vector<const uint8_t*>& panels, int64_t kb, int64_t K, int64_t steps)
        : panels_(panels), lines_(kb < K ? (std::min(kb + kPairBlock, round_up(K, 2)) - kb) * kPanel * 2 / 64 : 0),
          offset_(size_t(kb / 2) * 64),
          per_step_((int64_t(panels.size()) * lines_ + steps - 1) / std::max<int64_t>(1, steps)) {}
    void step() {
        for (int64_t i = 0; i < per_step_ && panel_ < panels_.size(); ++i) {
            _mm_prefetch(reinterpret_cast<const char*>(panels_[panel_] + offset_ + size_t(line_) * 64), _MM_HINT_T1);
            if (++line_ == lines_) line_ = 0, ++panel_;
        }
    }

private:
    const std::vector<const uint8_t*>& panels_;
    int64_t lines_;
    size_t offset_;
    int64_t per_step_;
    size_t panel_ = 0;
    int64_t line_ = 0;
};

// words: the format's pair-word maker (transposed_weights.h).
template <class Words>
kt_status transposed(const Words& words, const uint8_t* base, std::initializer_list<Part> parts, int64_t K, int64_t gs,
                     int64_t rows, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    // Each part's channels padded to whole panels (the packed panels' zero channels), so the
    // parts' pairs follow one another in both buffers.
    int64_t T = 0;
    for (const Part& p : parts) T += round_up(p.N, kPanel) / 2;
    thread_local std::vector<uint32_t> g;
    thread_local std::vector<__m512i> P;   // lo / hi of half 0, lo / hi of half 1: T vectors each
    // The gradient rows' pairs, each row 64 bytes longer than its T pairs: rows_half broadcasts from
    // kMr rows at once, and at T = 1024 (down^T of H = 2048) rows 4 KiB apart all fall in one L1
    // set — 12 lines in an 8-way set, every broadcast an L1 miss. (Zen 4, Qwen3-30B-A3B layer at
    // 2048 tokens, alternated: down^T 147-149 -> 136 ms; gate/up^T, rows 3 KiB apart, unchanged.)
    const int64_t ld = T + 16;
    g.resize(size_t(rows * ld));
    P.resize(size_t(4 * T));
    // Words that are codes carry each channel's factor (scale), which moves onto the gradients.
    constexpr bool kScaled = requires(const uint8_t* panel) { Words::scale(panel, 0); };
    thread_local std::vector<float> scale;
    int64_t at = 0;
    for (const Part& p : parts) {
        if constexpr (kScaled) {
            scale.resize(size_t(p.N));
            for (int64_t n = 0; n < p.N; ++n)
                scale[size_t(n)] = Words::scale(base + p.first_panel + size_t(n / kPanel) * p.panel_stride, int(n % kPanel));
        }
        to_pairs(p.grad, gs, rows, p.N, kScaled ? scale.data() : nullptr, round_up(p.N, kPanel) / 2, g.data() + at, ld);
        at += round_up(p.N, kPanel) / 2;
    }
    thread_local std::vector<const uint8_t*> panels;
    panels.clear();
    for (const Part& p : parts)
        for (int64_t n = 0; n < p.N; n += kPanel) panels.push_back(base + p.first_panel + size_t(n / kPanel) * p.panel_stride);
    const uint32_t* gp = g.data();
    const int64_t blocks_per_half = (rows + kMr - 1) / kMr;
    for (int64_t kb = k0; kb < k1; kb += kPairBlock) {
        at = 0;
        for (const Part& p : parts) {
            words(base, p.first_panel, p.panel_stride, round_up(p.N, kPanel), K, kb, P.data() + at, size_t(T));
            at += round_up(p.N, kPanel) / 2;
        }
        NextBlockPrefetch next(panels, kb + kPairBlock < k1 ? kb + kPairBlock : K, K, 2 * blocks_per_half);
        for (int half = 0; half < 2; ++half) {
            const int width = int(std::min<int64_t>(32, k1 - kb - 32 * half));
            if (width <= 0) break;
            const __m512i* lo = P.data() + 2 * half * T;
            const __m512i* hi = lo + T;
            float* o = out + kb + 32 * half;
            for (int64_t r = 0; r < rows; r += kMr) {
                next.step();
                const auto block = [=]<int MR>(int64_t r0) { rows_half<MR>(gp + r0 * ld, ld, T, lo, hi, o + r0 * ldo, ldo, width); };
                for_row_blocks<kMr>(std::min<int64_t>(kMr, rows - r), block, r);
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
    if (one_activation_pass(c))
        return bf16dot::transposed(F::pair_words(c), static_cast<const uint8_t*>(packed),
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
    if (one_activation_pass(c))
        return bf16dot::transposed(F::pair_words(c), static_cast<const uint8_t*>(packed),
                                   {bf16dot::Part{l.down(0), l.down_panel, c->hidden, grad}}, c->intermediate, gs, rows, k0, k1,
                                   out, ldo);
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
