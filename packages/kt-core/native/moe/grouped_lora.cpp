// The LoRA products of grouped_lora.h. A rank-r adapter makes skinny GEMMs ([rows, 2048] x [2048, 8]):
// a BLAS call per expert spends more on dispatch than on arithmetic (torch's grouped GEMM over 128
// experts ran them at ~10 GFLOP/s), so these are register-tiled loops of one form (`product` below),
// every inner loop running along a contiguous dimension with no reduction in it (so the compiler
// vectorizes it without reassociating sums): K or N, or the rank padded to whole vectors.
//
// Compiled for the baseline ISA like the rest of kt-core; the loop bodies are instantiated a second
// and third time inside AVX2 / AVX-512 target attributes and picked after host detection (as
// probes/compute_peak.cpp does), so no wider instruction runs on a host (or under a KT_MAX_ISA)
// without it.
#include "moe/grouped_lora.h"
#include "moe/tiles.h"
#include "moe/vectors.h"

#include "abi/host_api.h"
#include "pool/thread_pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kt {
namespace {

using namespace vectors;

// Work below this many multiply-adds stays on the calling thread.
constexpr int64_t kSerialMacs = int64_t(1) << 18;

// --- the one product all six are --------------------------------------------------------------
// C[o][l] (+)= sum over t < T of coef[o * co + t * ct] * V[t * sv + l], for o < O and l < L: each
// output row a combination of V's rows, the vector dimension l contiguous in V and C. With the rank
// on one side, every LoRA product has this form (t running over K, N, the rank or the rows):
//   xa  = x A_eᵀ     O rows, T = K,  L = rank  (V = A_eᵀ, [K, rank])
//   out += sxa B_eᵀ  O rows, T = rank, L = N   (V = B_eᵀ, [rank, N])
//   g   = dy B_e     O rows, T = N,  L = rank  (V = B_e, [N, rank])
//   dBᵀ = xaᵀ dy     O = rank, T = rows, L = N (coef = xa read down its columns)
//   dA  = gᵀ x       O = rank, T = rows, L = K
//   dx += g A_e      O rows, T = rank, L = K
// A register tile holds kO outputs x kNV vectors; each step loads kNV vectors of one V row and
// broadcasts kO coefficients, so V streams once per kO outputs and C leaves registers once.
// Measured against the per-row loops this replaces (Qwen3-30B-A3B layer, 2048 tokens, rank 16,
// 2 cores): docs/performance.md.
//
// The vector type is each ISA's own register (vectors.h).

// kStream: V is the big operand, read from memory kNV lines per row and the rows ~8 KiB apart (a
// column block of x or dy): the hardware prefetchers do not follow that, so each step prefetches
// the lines kAhead rows on (~5 % of the LoRA step).
constexpr int64_t kAhead = 8;

template <class W, int kO, int kNV, bool kStream = false>
[[gnu::always_inline]] inline void tile(int64_t T, const float* coef, int64_t co, int64_t ct, const float* V, int64_t sv,
                                        float* C, int64_t sc, bool add) {
    // Fully unrolled, so the accumulators live in registers (GCC left a partly unrolled array of
    // them in memory, copied each step).
    typename W::V acc[kO][kNV];
#pragma GCC unroll 16
    for (int o = 0; o < kO; ++o)
#pragma GCC unroll 16
        for (int v = 0; v < kNV; ++v) acc[o][v] = add ? W::load(C + o * sc + v * W::kLanes) : typename W::V{};
    for (int64_t t = 0; t < T; ++t) {
        typename W::V w[kNV];
#pragma GCC unroll 16
        for (int v = 0; v < kNV; ++v) {
            w[v] = W::load(V + t * sv + v * W::kLanes);
            if constexpr (kStream) __builtin_prefetch(V + (t + kAhead) * sv + v * W::kLanes);
        }
#pragma GCC unroll 16
        for (int o = 0; o < kO; ++o) {
            const typename W::V c = W::splat(coef[o * co + t * ct]);
#pragma GCC unroll 16
            for (int v = 0; v < kNV; ++v) acc[o][v] += c * w[v];
        }
    }
#pragma GCC unroll 16
    for (int o = 0; o < kO; ++o)
#pragma GCC unroll 16
        for (int v = 0; v < kNV; ++v) W::store(C + o * sc + v * W::kLanes, acc[o][v]);
}

// Columns [0, kNV lanes) of every output, kO at a time.
template <class W, int kO, int kNV, bool kStream = false>
[[gnu::always_inline]] inline void column_block(int64_t O, int64_t T, const float* coef, int64_t co, int64_t ct,
                                                const float* V, int64_t sv, float* C, int64_t sc, bool add) {
    int64_t o = 0;
    for (; o + kO <= O; o += kO) tile<W, kO, kNV, kStream>(T, coef + o * co, co, ct, V, sv, C + o * sc, sc, add);
    for (; o < O; ++o) tile<W, 1, kNV, kStream>(T, coef + o * co, co, ct, V, sv, C + o * sc, sc, add);
}

// Outputs [0, O) (at most kO of them when called per output block), every column: blocks of kNV
// vectors, single vectors, then the columns past the last whole vector one at a time (shapes
// whose K or N is not a multiple of the lanes).
template <class W, int kO, int kNV, bool kStream>
[[gnu::always_inline]] inline void all_columns(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct,
                                               const float* V, int64_t sv, float* C, int64_t sc, bool add) {
    constexpr int64_t kBlock = kNV * W::kLanes;
    const int64_t whole = L / kBlock * kBlock, vectors = L / W::kLanes * W::kLanes;
    for (int64_t l = 0; l < whole; l += kBlock)
        column_block<W, kO, kNV, kStream>(O, T, coef, co, ct, V + l, sv, C + l, sc, add);
    for (int64_t l = whole; l < vectors; l += W::kLanes)
        column_block<W, kO, 1, kStream>(O, T, coef, co, ct, V + l, sv, C + l, sc, add);
    for (int64_t l = vectors; l < L; ++l)
        for (int64_t o = 0; o < O; ++o) {
            float acc = add ? C[o * sc + l] : 0.0f;
            for (int64_t t = 0; t < T; ++t) acc += coef[o * co + t * ct] * V[t * sv + l];
            C[o * sc + l] = acc;
        }
}

// The whole product. The larger of C and V is walked once, row by row, the smaller re-read from
// cache: with C the bigger (out, dx: O = the expert's rows, T = the rank) kO outputs take every
// column block before the next kO (C's rows stream in order, V's few rows stay in L1/L2); with V
// the bigger (dA, dBᵀ: O = the rank, T = the rows) each column block of V serves every output first.
// (No lambdas here: GCC compiles a lambda for the baseline ISA even inside a target-attributed
// function, and the vectors in it with it.)
template <class W, int kO, int kNV>
[[gnu::always_inline]] inline void product(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct,
                                           const float* V, int64_t sv, float* C, int64_t sc, bool add) {
    if (T >= O) return all_columns<W, kO, kNV, true>(O, T, L, coef, co, ct, V, sv, C, sc, add);
    for (int64_t o = 0; o < O; o += kO)
        all_columns<W, kO, kNV, false>(std::min<int64_t>(kO, O - o), T, L, coef + o * co, co, ct, V, sv, C + o * sc, sc, add);
}

// The rank is padded to whole groups of 16 (one AVX-512 vector, two AVX2 ones, four SSE ones).
constexpr int64_t kRankGroup = 16;

// Register tiles per ISA: the vector, the wide products' tile (L = N or K) and the rank products'
// (L = the rank padded to 16, 32, 48 or 64: kRankO[q] outputs of q 16-float groups), each within
// the ISA's registers (32 zmm, 16 ymm, 16 xmm).
struct Avx512Tiles {
    using W = Avx512Vec;
    static constexpr int kWideO = 4, kWideNV = 4, kRankO[5] = {0, 8, 6, 4, 3};
};
struct Avx2Tiles {
    using W = Avx2Vec;
    static constexpr int kWideO = 6, kWideNV = 2, kRankO[5] = {0, 6, 2, 1, 1};
};
struct BaselineTiles {
    using W = BaselineVec;
    static constexpr int kWideO = 6, kWideNV = 2, kRankO[5] = {0, 2, 1, 1, 1};
};

template <class Tiles>
[[gnu::always_inline]] inline void wide(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct,
                                        const float* V, int64_t sv, float* C, int64_t sc, bool add) {
    product<typename Tiles::W, Tiles::kWideO, Tiles::kWideNV>(O, T, L, coef, co, ct, V, sv, C, sc, add);
}

// L = rp, the rank padded to a multiple of kRankGroup up to kMaxLoraRank: one tile spans it.
template <class Tiles>
[[gnu::always_inline]] inline void rank_wide(int64_t O, int64_t T, int64_t rp, const float* coef, int64_t co, int64_t ct,
                                             const float* V, float* C) {
    using W = typename Tiles::W;
    constexpr int kPerGroup = int(kRankGroup / W::kLanes);   // vectors per rank group
    switch (rp / kRankGroup) {
        case 1: return column_block<W, Tiles::kRankO[1], kPerGroup>(O, T, coef, co, ct, V, rp, C, rp, false);
        case 2: return column_block<W, Tiles::kRankO[2], 2 * kPerGroup>(O, T, coef, co, ct, V, rp, C, rp, false);
        case 3: return column_block<W, Tiles::kRankO[3], 3 * kPerGroup>(O, T, coef, co, ct, V, rp, C, rp, false);
        default: return column_block<W, Tiles::kRankO[4], 4 * kPerGroup>(O, T, coef, co, ct, V, rp, C, rp, false);
    }
}

// One expert's adapter in the layouts the products read, the rank padded to whole vectors (rp):
// A_eᵀ [K, rp], B_e [N, rp] and B_eᵀ [r, N], with zeros beyond r and off a block-diagonal B's
// blocks. Scratch reused across calls on each pool thread: a fresh MB-sized buffer per expert and
// call cost page faults.
struct Layouts {
    int64_t rp = 0;
    std::vector<float> at, bn, bt, rows, dbt;

    static int64_t padded_rank(const LoraShape& s) { return (s.rank + kRankGroup - 1) / kRankGroup * kRankGroup; }
    // fn(n, j, i) for the entries of B_e's blocks: entry (n, j) of the dense B_e is b_e[i] (row n
    // of block q holds rank slice q). The one place that knows B's block-diagonal layout.
    template <class Fn>
    static void each_b(const LoraShape& s, Fn&& fn) {
        const int64_t rb = s.rank / s.blocks, nb = s.n / s.blocks;
        for (int64_t n = 0; n < s.n; ++n) {
            const int64_t j0 = n / nb * rb;
            for (int64_t j = 0; j < rb; ++j) fn(n, j0 + j, n * rb + j);
        }
    }
    void forward(const LoraShape& s, const float* a_e, const float* b_e) {
        rp = padded_rank(s);
        at.assign(size_t(s.k * rp), 0.0f);
        for (int64_t k = 0; k < s.k; ++k)   // rows of at written in order; A's rank rows stay in L1
            for (int64_t j = 0; j < s.rank; ++j) at[size_t(k * rp + j)] = a_e[j * s.k + k];
        bt.assign(size_t(s.rank * s.n), 0.0f);
        each_b(s, [&](int64_t n, int64_t j, int64_t i) { bt[size_t(j * s.n + n)] = b_e[i]; });
    }
    void backward(const LoraShape& s, const float* b_e) {
        rp = padded_rank(s);
        bn.assign(size_t(s.n * rp), 0.0f);
        each_b(s, [&](int64_t n, int64_t j, int64_t i) { bn[size_t(n * rp + j)] = b_e[i]; });
    }
};
thread_local Layouts t_layouts;

// One expert's forward: xa = x A_eᵀ (kept for backward), then out += scaling xa B_eᵀ, block by
// block for a block-diagonal B (its zeros never multiplied).
template <class Tiles>
[[gnu::always_inline]] inline void forward_rows(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                const float* b, float scaling, float* xa, float* out) {
    Layouts& p = t_layouts;
    p.forward(s, a, b);
    p.rows.resize(size_t(rows * p.rp));
    float* sxa = p.rows.data();   // [rows, rp]: xa, then scaled in place
    rank_wide<Tiles>(rows, s.k, p.rp, x, s.k, 1, p.at.data(), sxa);
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < s.rank; ++j) {
            xa[i * s.rank + j] = sxa[i * p.rp + j];
            sxa[i * p.rp + j] *= scaling;
        }
    const int64_t rb = s.rank / s.blocks, nb = s.n / s.blocks;
    for (int64_t q = 0; q < s.blocks; ++q)
        wide<Tiles>(rows, rb, nb, sxa + q * rb, p.rp, 1, p.bt.data() + q * rb * s.n + q * nb, s.n, out + q * nb, s.n, true);
}

// One expert's backward: g = scaling dy B_e, dBᵀ = scaling xaᵀ dy (block by block), dA = gᵀ x and
// dx (+)= g A_e.
template <class Tiles>
[[gnu::always_inline]] inline void backward_rows(const LoraShape& s, int64_t rows, const float* dy, const float* x,
                                                 const float* xa, const float* a, const float* b, float scaling,
                                                 float* dx, float* da, float* db, bool accumulate_dx) {
    Layouts& p = t_layouts;
    p.backward(s, b);
    p.rows.resize(size_t(rows * p.rp));
    float* g = p.rows.data();   // [rows, rp]
    rank_wide<Tiles>(rows, s.n, p.rp, dy, s.n, 1, p.bn.data(), g);
    for (int64_t i = 0; i < rows * p.rp; ++i) g[i] *= scaling;
    const int64_t rb = s.rank / s.blocks, nb = s.n / s.blocks;
    p.dbt.resize(size_t(s.rank * s.n));
    for (int64_t q = 0; q < s.blocks; ++q)
        wide<Tiles>(rb, rows, nb, xa + q * rb, 1, s.rank, dy + q * nb, s.n, p.dbt.data() + q * rb * s.n + q * nb, s.n, false);
    Layouts::each_b(s, [&](int64_t n, int64_t j, int64_t i) { db[i] = scaling * p.dbt[size_t(j * s.n + n)]; });
    wide<Tiles>(s.rank, rows, s.k, g, 1, p.rp, x, s.k, da, s.k, false);
    wide<Tiles>(rows, s.rank, s.k, g, p.rp, 1, a, s.k, dx, s.k, accumulate_dx);
}

using ForwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, float, float*, float*);
using BackwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, const float*,
                            const float*, float, float*, float*, float*, bool);

void forward_baseline(const LoraShape& s, int64_t rows, const float* x, const float* a, const float* b, float scaling,
                      float* xa, float* out) {
    forward_rows<BaselineTiles>(s, rows, x, a, b, scaling, xa, out);
}
void backward_baseline(const LoraShape& s, int64_t rows, const float* dy, const float* x, const float* xa,
                       const float* a, const float* b, float scaling, float* dx, float* da, float* db, bool acc) {
    backward_rows<BaselineTiles>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void forward_avx2(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                      const float* b, float scaling, float* xa, float* out) {
    forward_rows<Avx2Tiles>(s, rows, x, a, b, scaling, xa, out);
}
__attribute__((target("avx2,fma"))) void backward_avx2(const LoraShape& s, int64_t rows, const float* dy,
                                                       const float* x, const float* xa, const float* a, const float* b,
                                                       float scaling, float* dx, float* da, float* db, bool acc) {
    backward_rows<Avx2Tiles>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void forward_avx512(const LoraShape& s, int64_t rows,
                                                                        const float* x, const float* a, const float* b,
                                                                        float scaling, float* xa, float* out) {
    forward_rows<Avx512Tiles>(s, rows, x, a, b, scaling, xa, out);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void backward_avx512(const LoraShape& s, int64_t rows,
                                                                         const float* dy, const float* x,
                                                                         const float* xa, const float* a,
                                                                         const float* b, float scaling, float* dx,
                                                                         float* da, float* db, bool acc) {
    backward_rows<Avx512Tiles>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
}
#endif

// body(e) for every expert with rows, on the pool when the work is large enough.
template <class Body>
void each_expert(const LoraShape& s, const int64_t* counts, Body&& body) {
    const bool serial = s.rows * s.rank * (s.k + s.n) < kSerialMacs;
    if (serial) {
        for (int64_t e = 0; e < s.experts; ++e) body(e);
        return;
    }
    global_pool().parallel_for(
        size_t(s.experts), [](void* ctx, size_t e) { (*static_cast<Body*>(ctx))(int64_t(e)); }, &body);
    (void)counts;
}

std::vector<int64_t> first_rows(const LoraShape& s, const int64_t* counts) {
    std::vector<int64_t> first(size_t(s.experts) + 1, 0);
    for (int64_t e = 0; e < s.experts; ++e) first[size_t(e) + 1] = first[size_t(e)] + counts[e];
    return first;
}

}  // namespace

void grouped_lora_forward(const LoraShape& s, const int64_t* counts, const float* x, const float* a, const float* b,
                          float scaling, float* xa, float* out) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const ForwardFn fn = widest<ForwardFn>(forward_avx512, forward_avx2, forward_baseline);
#else
    const ForwardFn fn = forward_baseline;
#endif
    const std::vector<int64_t> first = first_rows(s, counts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        if (n)
            fn(s, n, x + r0 * s.k, a + e * s.rank * s.k, b + e * s.n * (s.rank / s.blocks), scaling, xa + r0 * s.rank,
               out + r0 * s.n);
    });
}

void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db,
                           bool accumulate_dx) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const BackwardFn fn = widest<BackwardFn>(backward_avx512, backward_avx2, backward_baseline);
#else
    const BackwardFn fn = backward_baseline;
#endif
    const std::vector<int64_t> first = first_rows(s, counts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        float* dae = da + e * s.rank * s.k;
        const int64_t b_size = s.n * (s.rank / s.blocks);
        float* dbe = db + e * b_size;
        if (!n) {
            std::fill(dae, dae + s.rank * s.k, 0.0f);
            std::fill(dbe, dbe + b_size, 0.0f);
            return;
        }
        fn(s, n, dy + r0 * s.n, x + r0 * s.k, xa + r0 * s.rank, a + e * s.rank * s.k, b + e * b_size, scaling,
           dx + r0 * s.k, dae, dbe, accumulate_dx);
    });
}

}  // namespace kt
