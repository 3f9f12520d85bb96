// Prefill on widened panels, for AVX2 (x86-64-v3): the f32 GEMM of many activation rows by one
// or two 16-channel panels whose weights are first widened to f32, a block of k at a time.
//
// A kernel that widens each weight next to its FMAs (a shift, a mask, an F16C conversion) pays
// that once per row block, and on AVX2's 16 registers it must keep the row block small to leave
// room for the widened values: BF16 ran at ~40 % of the FMA peak that way, FP8 (F16C) at ~25 %.
// Here a block of kn k's is widened once into an L1-resident f32 copy [k][P x 16] (the gate and up
// panels side by side, or a down panel pair), and a register-blocked kernel of MR rows runs over it:
// per k, 2P vector loads, MR broadcasts and 2P x MR FMAs into 12 accumulators. Its sums run in k
// order, one accumulator per output, as the in-register kernels' do; a method whose scales change
// along k (FP8's 128-k blocks) gets a partial sum per block, multiplied in as the block ends.
//
// The methods supply `widen(k0, kn, w)`: the P panels' weights of k in [k0, k0 + kn) as w[k - k0]
// [P * kPanel] f32, and for scaled blocks `scales(block, s)`: s[P * kPanel], the block's scales.
#pragma once
#include "common.h"

#include <algorithm>
#include <vector>

namespace KT_TARGET_NAMESPACE {

#if !defined(__AVX512F__)
namespace wide {

// What the tile writes per row: common.h's PanelMode (one panel's 16 outputs, the gated activation
// of a gate/up pair, or a pair's 32 outputs).
using KT_TARGET_NAMESPACE::kFused;
using KT_TARGET_NAMESPACE::kPair;
using KT_TARGET_NAMESPACE::kSingle;
constexpr int panels_of(int mode) { return mode == kSingle ? 1 : 2; }
constexpr int kMr[3] = {6, 3, 3};   // rows per register block, per mode: 12 ymm accumulators of 16
constexpr int64_t kMinRows = 4;     // from here widening once beats widening per row block (docs/performance.md)
constexpr int64_t kL2Activations = int64_t(1) << 20;   // activation bytes of a tile L2 keeps (tile()'s prefetch)

// acc[m][P * kPanel] for MR rows (stride P * kPanel) over a widened block w[kn][P * kPanel]:
// kScaled: acc (+)= (x . w) * s, the block's partial sum scaled as it ends; otherwise acc (+)= x . w.
// `first`: acc holds nothing yet.
// kPrefetch: `next` holds the next row block's activations (next_rows rows), fetched into L1 a line
// per row per 16 k while this block runs (tiles whose activations overflow L2; see tile()).
template <int MR, int P, bool kScaled, bool kPrefetch>
void rows(const float* x, int64_t ldx, int64_t kn, const float* w, const float* s, float* acc, bool first,
          const float* next, int next_rows) {
    constexpr int V = P * kVecsPerPanel;
    VF a[MR][V];
    for (int m = 0; m < MR; ++m)
        for (int i = 0; i < V; ++i) a[m][i] = first || kScaled ? vzero() : vload(acc + m * P * kPanel + i * kLanes);
    for (int64_t k = 0; k < kn; ++k) {
        if (kPrefetch && k % 16 == 0)
            for (int m = 0; m < next_rows; ++m) _mm_prefetch(reinterpret_cast<const char*>(next + m * ldx + k), _MM_HINT_T0);
        VF wv[V];
        for (int i = 0; i < V; ++i) wv[i] = vload(w + k * P * kPanel + i * kLanes);
        for (int m = 0; m < MR; ++m) {
            const VF xb = vset1(x[m * ldx + k]);
            for (int i = 0; i < V; ++i) a[m][i] = vfma(wv[i], xb, a[m][i]);
        }
    }
    for (int m = 0; m < MR; ++m)
        for (int i = 0; i < V; ++i) {
            float* o = acc + m * P * kPanel + i * kLanes;
            if constexpr (kScaled) a[m][i] = first ? vmul(a[m][i], vload(s + i * kLanes)) : vfma(a[m][i], vload(s + i * kLanes), vload(o));
            vstore(o, a[m][i]);
        }
}

// rows x (the mode's panels) over all of k, kn k's per widened block (the scale block when
// kScaled), written to out (row stride ldo, `cols` valid outputs of 16 or, kPair, 32).
template <int kMode, bool kScaled, class Widen, class Scales>
void tile(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t block, const Widen& widen, const Scales& scales,
          float* out, int64_t ldo, int cols) {
    constexpr int P = panels_of(kMode);
    // Grow-only per thread: a pool thread reuses them task after task.
    thread_local std::vector<float> w_buf, acc_buf;
    w_buf.resize(size_t(block * P * kPanel));
    acc_buf.resize(size_t(rows * P * kPanel));
    float* w = w_buf.data();
    float* acc = acc_buf.data();
    alignas(32) float s[P * kPanel];
    // Every k block walks all rows' activations: once they overflow L2 each row block's first loads
    // wait on L3 (short 512-byte runs 8 KiB apart, which the prefetchers do not follow), so the row
    // block before fetches them. Measured (BF16, 2 threads, x86-64-v3, two A/B runs): 512 rows of
    // 2048 k 4-13 % faster; 64 rows, within L2, 6-10 % slower when it prefetched too — hence the threshold.
    const bool prefetch = rows * ldx * int64_t(sizeof(float)) > kL2Activations;
    for (int64_t k0 = 0; k0 < k; k0 += block) {
        const int64_t kn = std::min(block, k - k0);
        widen(k0, kn, w);
        if constexpr (kScaled) scales(k0 / block, s);
        for_row_blocks<kMr[kMode]>(rows, [&]<int M>(int64_t r) {
            const int64_t after = std::min<int64_t>(kMr[kMode], rows - r - M);
            const float* xr = x + r * ldx + k0;
            if (prefetch && after > 0)
                wide::rows<M, P, kScaled, true>(xr, ldx, kn, w, s, acc + r * P * kPanel, k0 == 0, xr + M * ldx, int(after));
            else
                wide::rows<M, P, kScaled, false>(xr, ldx, kn, w, s, acc + r * P * kPanel, k0 == 0, nullptr, 0);
        });
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = acc + r * P * kPanel;
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n <= 0) continue;
            const VF first = vload(a + v * kLanes);
            vstore_partial(out + r * ldo + v * kLanes, kMode == kFused ? gate_mul(first, vload(a + kPanel + v * kLanes)) : first, n);
            if constexpr (kMode == kPair) {
                const int n2 = std::min(kLanes, cols - kPanel - v * kLanes);
                if (n2 > 0) vstore_partial(out + r * ldo + kPanel + v * kLanes, vload(a + kPanel + v * kLanes), n2);
            }
        }
    }
}

// The integer methods' activation rows (common.h: a scale s_a, hi and lo int8 planes) as f32
// rows of the values their two-pass integer kernels multiply, s_a * (hi + lo / 128): 128 hi + lo is
// an exact integer in f32 and s_a / 128 an exact power-of-two step of s_a, so each value is rounded
// once. Widened into a per-thread buffer of rows x ldx (returned through ldx: k rounded up to 16,
// rows on 64-byte lines).
inline const float* int8_activations(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, int64_t& ldx) {
    thread_local std::vector<float> buf;   // grow-only, reused task after task
    ldx = round_up(k, 16);
    buf.resize(size_t(rows * ldx));
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = x + size_t(r) * row_bytes;
        const auto* hi = reinterpret_cast<const int8_t*>(int8_hi(row));
        const auto* lo = reinterpret_cast<const int8_t*>(int8_lo(row, k));
        const float sa = reinterpret_cast<const Int8Header*>(row)->scale;
        const VF step = vset1(sa * (1.0f / 128.0f)), c128 = vset1(128.0f);
        float* o = buf.data() + r * ldx;
        for (int64_t c = 0; c < ldx; c += kLanes) {   // codes are zero-padded to 64: reading to ldx is safe
            const VF h = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi + c))));
            const VF l = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo + c))));
            vstore(o + c, vmul(vfma(h, c128, l), step));
        }
    }
    return buf.data();
}

// A chunk of a tile's activation rows, [r0, r0 + rows), widened once (int8_activations) for all of
// the tile's panels.
struct Int8Rows {
    const float* x;
    int64_t ldx, r0, rows;
};

// body(Int8Rows) over the tile's rows in even chunks of at most kRowChunk: the per-thread buffer
// stays within kRowChunk x K floats (2 MiB at K = 2048) however many rows a hot expert gets, for the
// price of widening the panels once more per chunk (under 1 % of a chunk's FMAs).
constexpr int64_t kRowChunk = 256;
template <class Body>
void for_int8_row_chunks(const void* act, size_t row_bytes, int64_t rows, int64_t k, const Body& body) {
    const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk, per = (rows + chunks - 1) / chunks;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        Int8Rows a{nullptr, 0, r0, std::min(per, rows - r0)};
        a.x = int8_activations(static_cast<const uint8_t*>(act) + size_t(r0) * row_bytes, row_bytes, a.rows, k, a.ldx);
        body(a);
    }
}

}  // namespace wide
#endif

}  // namespace KT_TARGET_NAMESPACE
