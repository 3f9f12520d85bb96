// Plugin ABI 1.5's transposed tiles (training's backward) on AMX-BF16:
// out[r, k] = sum_n grad[r, n] W[n, k] for k in [k0, k1), from the packed panels as they are.
//
// A tile product reduces over its A tile's columns, here the channels n, and a B tile must hold
// (W[n][k], W[n + 1][k]) pairs: 16 rows of channel pairs by 16 columns k. The panels hold the
// weights the other way (pairs along k), so each run of kRun channels of a 64-column block is
// widened to f32 rows W[n][k-block] by kt-backend-avx's column readers (transposed_weights.h) and
// re-packed into such B tiles (L1-resident), then every 16-row block of gradients runs over them,
// four C tiles wide (64 columns), the accumulators kept in a buffer between runs.
//
// Precision: gradients arrive in f32 and are split into bf16 hi + lo planes (16 significant
// bits), and so are the weights unless they are bf16 already (BF16's panels); the tiles sum
// ghi·whi + glo·whi + ghi·wlo in f32 — all but glo·wlo, a 2^-16-relative term, so the products are
// within ~1e-5 of f32 ones (the conformance tolerance). A layer with fast_activations takes
// bf16 gradients alone, as kt-backend-avx's vdpbf16ps path does.
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
static_assert(kKBlock == 64 && kRun % kChunk == 0, "a block is 4 C tiles of 16 columns; runs hold whole chunks");
constexpr int64_t kMinRows = 16;  // rows per expert from which the tiles pay (docs/performance.md)

// The avx kernels this file's functions hand small experts to, per method slot.
enum Slot : int { kBf16, kInt8, kInt4, kRaw, kSlots };
struct AvxTransposed {
    decltype(kt_method_kernels::gate_up_transposed_tile) gate_up;
    decltype(kt_method_kernels::down_transposed_tile) down;
};
AvxTransposed g_avx[kSlots];

inline int64_t min_rows() { return g_amx_min_rows >= 0 ? g_amx_min_rows : kMinRows; }

inline __m512 bf16_to_f32(__m256bh h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

// Gradient rows f32 [rows, N] (row stride gs) -> bf16 planes hi (and lo = bf16(g - hi)) at
// columns [at, at + round_up(N, 32)) of rows `ld` wide, the padding zero.
void split_gradients(const float* g, int64_t gs, int64_t rows, int64_t N, uint16_t* hi, uint16_t* lo, int64_t ld,
                     int64_t at) {
    const int64_t padded = round_up(N, kChunk);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < padded; n += 16) {
            const __mmask16 m = n + 16 <= N ? __mmask16(0xffff) : n < N ? __mmask16((1u << (N - n)) - 1) : __mmask16(0);
            const __m512 v = _mm512_maskz_loadu_ps(m, g + r * gs + n);
            const __m256bh h = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * ld + at + n), (__m256i)h);
            if (lo)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * ld + at + n),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, bf16_to_f32(h))));
        }
}

// B tiles of one run from its W rows (w: [count][kKBlock] f32, count a multiple of kChunk):
// tile (j, chunk c) at b + (j * kRun / 2 + c * 16) * 16 words, row p = the pair words
// (W[2p][k], W[2p + 1][k]) of its 16 columns k = 16 j .. 16 j + 15. blo (if any) gets the
// pairs of w - bf16(w).
void pack_pairs(const float* w, int64_t count, uint32_t* bhi, uint32_t* blo) {
    for (int64_t p = 0; p < count / 2; ++p)
        for (int j = 0; j < 4; ++j) {
            const __m512 r0 = _mm512_load_ps(w + (2 * p) * kKBlock + 16 * j);
            const __m512 r1 = _mm512_load_ps(w + (2 * p + 1) * kKBlock + 16 * j);
            const __m256bh h0 = _mm512_cvtneps_pbh(r0), h1 = _mm512_cvtneps_pbh(r1);
            const auto words = [](__m256bh a, __m256bh b) {
                return _mm512_or_si512(_mm512_cvtepu16_epi32((__m256i)a), _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)b), 16));
            };
            const size_t at = size_t(j * kRun / 2 + p) * 16;
            _mm512_store_si512(bhi + at, words(h0, h1));
            if (blo)
                _mm512_store_si512(blo + at, words(_mm512_cvtneps_pbh(_mm512_sub_ps(r0, bf16_to_f32(h0))),
                                                   _mm512_cvtneps_pbh(_mm512_sub_ps(r1, bf16_to_f32(h1)))));
        }
}

// C tile J += the chunk's products: A4 = gradient hi, A5 = lo (two_grad), B6 = weights hi,
// B7 = lo (two_w).
template <int J>
inline void chunk_step(const uint32_t* bhi, const uint32_t* blo, bool two_grad) {
    tiles::load<6>(bhi + size_t(J) * kRun / 2 * 16, 64);
    tiles::dpbf16ps<J, 4, 6>();
    if (two_grad) tiles::dpbf16ps<J, 5, 6>();
    if (blo) {
        tiles::load<7>(blo + size_t(J) * kRun / 2 * 16, 64);
        tiles::dpbf16ps<J, 4, 7>();
    }
}

template <int J>
inline void load_or_zero(const float* acc, bool zero) {
    if (zero) tiles::zero<J>();
    else tiles::load<J>(acc + 16 * J, kKBlock * 4);
}

struct Part {
    size_t first_panel, panel_stride;
    int64_t N;
    const float* grad;
};

struct Scratch {
    TileScratch<uint16_t> grads;   // [2 planes][rows][ld] bf16
    TileScratch<float> w;          // a run's W rows
    TileScratch<uint32_t> b;       // a run's B tiles, hi then lo
    TileScratch<float> acc;        // [rows][kKBlock]
};

template <class F>
kt_status transposed_tiles(const kt_moe_config* c, const uint8_t* base, std::initializer_list<Part> parts, int64_t K,
                           int64_t gs, int64_t rows, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    const bool two_grad = !one_activation_pass(c), two_w = !F::kBf16Values;
    const auto col = F::columns(c);
    thread_local Scratch s;
    int64_t ld = 0;
    for (const Part& p : parts) ld += round_up(p.N, kChunk);
    uint16_t* ghi = s.grads.get(size_t(2 * rows * ld));
    uint16_t* glo = two_grad ? ghi + rows * ld : nullptr;
    int64_t at = 0;
    for (const Part& p : parts) {
        split_gradients(p.grad, gs, rows, p.N, ghi, glo, ld, at);
        at += round_up(p.N, kChunk);
    }
    float* w = s.w.get(size_t(kRun * kKBlock));
    uint32_t* bhi = s.b.get(size_t(2 * kRun / 2 * 4 * 16));
    uint32_t* blo = two_w ? bhi + kRun / 2 * 4 * 16 : nullptr;
    float* acc = s.acc.get(size_t(rows * kKBlock));
    tiles::Session session;
    for (int64_t kb = k0; kb < k1; kb += kKBlock) {
        bool first = true;
        at = 0;
        for (const Part& p : parts) {
            for (int64_t n0 = 0; n0 < p.N; n0 += kRun) {
                const int64_t count = round_up(std::min(kRun, p.N - n0), kChunk);
                const int64_t panels = std::min(count, round_up(p.N - n0, kPanel));
                widen_run(col, base, p.first_panel, p.panel_stride, n0, panels, K, kb, w);
                std::fill(w + panels * kKBlock, w + count * kKBlock, 0.0f);   // channels past N: zero weights
                pack_pairs(w, count, bhi, blo);
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
        for (int64_t r = 0; r < rows; ++r) std::copy_n(acc + r * kKBlock, width, out + r * ldo + kb);
    }
    return KT_OK;
}

template <class F, int kSlot>
kt_status gate_up_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad_gate,
                                  const float* grad_up, int64_t gs, int64_t rows, int64_t k0, int64_t k1, float* out,
                                  int64_t ldo) {
    if (rows < min_rows()) return g_avx[kSlot].gate_up(c, packed, grad_gate, grad_up, gs, rows, k0, k1, out, ldo);
    if (const kt_status st = check(F::kName, k0, k1, c->hidden)) return st;
    const ExpertPanels l = F::panels(c);
    const size_t stride = 2 * l.gate_up_panel;   // gate and up panels alternate
    return transposed_tiles<F>(c, static_cast<const uint8_t*>(packed),
                               {Part{l.gate(0), stride, c->intermediate, grad_gate}, Part{l.up(0), stride, c->intermediate, grad_up}},
                               c->hidden, gs, rows, k0, k1, out, ldo);
}

template <class F, int kSlot>
kt_status down_transposed_tile(const kt_moe_config* c, const void* packed, const float* grad, int64_t gs, int64_t rows,
                               int64_t k0, int64_t k1, float* out, int64_t ldo) {
    if (rows < min_rows()) return g_avx[kSlot].down(c, packed, grad, gs, rows, k0, k1, out, ldo);
    if (const kt_status st = check(F::kName, k0, k1, c->intermediate)) return st;
    const ExpertPanels l = F::panels(c);
    return transposed_tiles<F>(c, static_cast<const uint8_t*>(packed), {Part{l.down(0), l.down_panel, c->hidden, grad}},
                               c->intermediate, gs, rows, k0, k1, out, ldo);
}

template <class F, int kSlot>
void set(kt_method_kernels& m) {
    g_avx[kSlot] = {m.gate_up_transposed_tile, m.down_transposed_tile};
    m.gate_up_transposed_tile = gate_up_transposed_tile<F, kSlot>;
    m.down_transposed_tile = down_transposed_tile<F, kSlot>;
}

}  // namespace

void add_amx_transposed_tiles(kt_method_kernels& m) {
    add_transposed_tiles(m);   // avx's: the small experts' kernels, and the methods without a tile form
    if (!m.gate_up_transposed_tile) return;
    const std::string method = m.method;
    if (method == "BF16") set<Bf16Format, kBf16>(m);
    else if (method == "INT8") set<Int8Format, kInt8>(m);
    else if (method == "INT4" || method == "GPTQ_INT4") set<Int4Format<false>, kInt4>(m);
    else if (method == "RAWINT4") set<Int4Format<true>, kRaw>(m);
}

}  // namespace KT_TARGET_NAMESPACE
