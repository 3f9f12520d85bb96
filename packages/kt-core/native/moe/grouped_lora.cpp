// The LoRA products of grouped_lora.h. A rank-r adapter makes skinny GEMMs ([rows, 2048] x [2048, 8]):
// a BLAS call per expert spends more on dispatch than on arithmetic (torch's grouped GEMM over 128
// experts ran them at ~10 GFLOP/s), so these are register-tiled loops of two forms: `product` below,
// every inner loop running along a contiguous dimension with no reduction in it (so the compiler
// vectorizes it without reassociating sums), and `dots`, the projections onto the rank (x A_eᵀ,
// dy B_e) as dot products along K or N summed across lanes once.
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

// --- the product four of the six are ----------------------------------------------------------
// C[o][l] (+)= sum over t < T of coef[o * co + t * ct] * V[t * sv + l], for o < O and l < L: each
// output row a combination of V's rows, the vector dimension l contiguous in V and C (t running
// over the rank or the rows):
//   out += sxa B_eᵀ  O rows, T = rank, L = N   (V = B_eᵀ, [rank, N])
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

// --- the rank projections: dot products along the long dimension --------------------------------
// C[o * ldc + j] = scale * sum over k < K of X_o[k] * Y[j * ldy + k], for o < O and j < J, row o of X at
// xs[o] (rows gathered by token are read where they lie): x A_eᵀ and dy B_e, the rank (J) small and
// K long. In `product`'s broadcast form these cost a load per multiply-add and the rank padded to
// whole vectors (rank 8 doubled under AVX-512); here both operands run along K in vectors, kO x kJ
// accumulators summed across their lanes once at the end (the projections of a 2048-token training
// step ~2.5x faster on Zen 4).
template <class W, int kO, int kJ>
[[gnu::always_inline]] inline void dot_tile(int64_t K, const float* const* xs, const float* Y, int64_t ldy, float* C,
                                            int64_t ldc, float scale) {
    typename W::V acc[kO][kJ];
#pragma GCC unroll 16
    for (int o = 0; o < kO; ++o)
#pragma GCC unroll 16
        for (int j = 0; j < kJ; ++j) acc[o][j] = typename W::V{};
    const int64_t whole = K / W::kLanes * W::kLanes;
    for (int64_t k = 0; k < whole; k += W::kLanes) {
        typename W::V x[kO];
#pragma GCC unroll 16
        for (int o = 0; o < kO; ++o) x[o] = W::load(xs[o] + k);
#pragma GCC unroll 16
        for (int j = 0; j < kJ; ++j) {
            const typename W::V y = W::load(Y + j * ldy + k);
#pragma GCC unroll 16
            for (int o = 0; o < kO; ++o) acc[o][j] += x[o] * y;
        }
    }
#pragma GCC unroll 16
    for (int o = 0; o < kO; ++o)
#pragma GCC unroll 16
        for (int j = 0; j < kJ; ++j) {
            float sum = W::sum(acc[o][j]);
            for (int64_t k = whole; k < K; ++k) sum += xs[o][k] * Y[j * ldy + k];
            C[o * ldc + j] = scale * sum;
        }
}

// kO rows (or fewer: the last rows of a block), every j: whole kJ blocks, then the rest (no lambdas:
// see `product`).
template <class W, int kO, int kJ>
[[gnu::always_inline]] inline void dot_rows(int64_t J, int64_t K, const float* const* xs, const float* Y, int64_t ldy,
                                            float* C, int64_t ldc, float scale) {
    int64_t j = 0;
    for (; j + kJ <= J; j += kJ) dot_tile<W, kO, kJ>(K, xs, Y + j * ldy, ldy, C + j, ldc, scale);
    for (; j < J; ++j) dot_tile<W, kO, 1>(K, xs, Y + j * ldy, ldy, C + j, ldc, scale);
}

// Rows o of X at x + (token ? token[o] : o) * ldx.
template <class W, int kO, int kJ>
[[gnu::always_inline]] inline void dots(int64_t O, int64_t J, int64_t K, const float* x, const int64_t* token, int64_t ldx,
                                        const float* Y, int64_t ldy, float* C, int64_t ldc, float scale) {
    const float* xs[kO];
    int64_t o = 0;
    for (; o + kO <= O; o += kO) {
#pragma GCC unroll 16
        for (int i = 0; i < kO; ++i) xs[i] = x + (token ? token[o + i] : o + i) * ldx;
        dot_rows<W, kO, kJ>(J, K, xs, Y, ldy, C + o * ldc, ldc, scale);
    }
    for (; o < O; ++o) {
        xs[0] = x + (token ? token[o] : o) * ldx;
        dot_rows<W, 1, kJ>(J, K, xs, Y, ldy, C + o * ldc, ldc, scale);
    }
}

// Register tiles per ISA: the vector, the wide products' tile (L = N or K) and the projections'
// (kDotO rows x kDotJ ranks), each within the ISA's registers (32 zmm, 16 ymm, 16 xmm).
struct Avx512Tiles {
    using W = Avx512Vec;
    static constexpr int kWideO = 4, kWideNV = 4, kDotO = 4, kDotJ = 6;
};
struct Avx2Tiles {
    using W = Avx2Vec;
    static constexpr int kWideO = 6, kWideNV = 2, kDotO = 3, kDotJ = 4;
};
struct BaselineTiles {
    using W = BaselineVec;
    static constexpr int kWideO = 6, kWideNV = 2, kDotO = 3, kDotJ = 4;
};

template <class Tiles>
[[gnu::always_inline]] inline void wide(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct,
                                        const float* V, int64_t sv, float* C, int64_t sc, bool add) {
    product<typename Tiles::W, Tiles::kWideO, Tiles::kWideNV>(O, T, L, coef, co, ct, V, sv, C, sc, add);
}

template <class Tiles>
[[gnu::always_inline]] inline void project(int64_t O, int64_t J, int64_t K, const float* x, const int64_t* token,
                                           int64_t ldx, const float* Y, int64_t ldy, float* C, int64_t ldc, float scale) {
    dots<typename Tiles::W, Tiles::kDotO, Tiles::kDotJ>(O, J, K, x, token, ldx, Y, ldy, C, ldc, scale);
}

// One expert's B_e [N, r / blocks] as B_eᵀ [r / blocks, N] (column n of row j: rank j of n's block's
// slice), the layout the projection dy B_e and the forward's expansion read. Scratch reused across
// calls on each pool thread: a fresh buffer per expert and call cost page faults.
struct Layouts {
    std::vector<float> bt, sxa, dbt, chunk;

    void transpose_b(const LoraShape& s, const float* b_e) {
        const int64_t rb = s.rank / s.blocks;
        bt.resize(size_t(rb * s.n));
        for (int64_t n = 0; n < s.n; ++n)
            for (int64_t j = 0; j < rb; ++j) bt[size_t(j * s.n + n)] = b_e[n * rb + j];
    }
};
thread_local Layouts t_layouts;

// One expert's forward: xa = x A_eᵀ (kept for backward), then out += scaling xa B_eᵀ, block by
// block for a block-diagonal B (its zeros never multiplied).
template <class Tiles>
[[gnu::always_inline]] inline void forward_rows(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                const float* b, float scaling, float* xa, float* out) {
    Layouts& p = t_layouts;
    p.transpose_b(s, b);
    project<Tiles>(rows, s.rank, s.k, x, nullptr, s.k, a, s.k, xa, s.rank, 1.0f);
    p.sxa.resize(size_t(rows * s.rank));
    for (int64_t i = 0; i < rows * s.rank; ++i) p.sxa[size_t(i)] = scaling * xa[i];
    const int64_t rb = s.rank / s.blocks, nb = s.n / s.blocks;
    for (int64_t q = 0; q < s.blocks; ++q)
        wide<Tiles>(rows, rb, nb, p.sxa.data() + q * rb, s.rank, 1, p.bt.data() + q * nb, s.n, out + q * nb, s.n, true);
}

// Rows of x gathered by token (a few dozen at a time) into cache-sized scratch for dA = gᵀ x, whose
// loop streams x's rows as one strided operand.
constexpr int64_t kGatherRows = 32;

const float* gathered(const float* x, const int64_t* token, int64_t k, int64_t rows, std::vector<float>& buf) {
    buf.resize(size_t(rows * k));
    for (int64_t i = 0; i < rows; ++i) std::memcpy(buf.data() + i * k, x + token[i] * k, size_t(k) * sizeof(float));
    return buf.data();
}

// One expert's backward: g = scaling dy B_e and dBᵀ = scaling xaᵀ dy (block by block), dA = gᵀ x,
// and dx (+)= g A_e — or, with dx null, g kept in g_out for the base product's tiles to add g A_e.
// Row i of x is x[token[i]] with token.
template <class Tiles>
[[gnu::always_inline]] inline void backward_rows(const LoraShape& s, int64_t rows, const float* dy, const float* x,
                                                 const int64_t* token, const float* xa, const float* a, const float* b,
                                                 float scaling, float* dx, float* da, float* db, bool accumulate_dx,
                                                 float* g_out) {
    Layouts& p = t_layouts;
    p.transpose_b(s, b);
    if (!g_out) p.sxa.resize(size_t(rows * s.rank));
    float* g = g_out ? g_out : p.sxa.data();   // [rows, r]
    const int64_t rb = s.rank / s.blocks, nb = s.n / s.blocks;
    p.dbt.resize(size_t(rb * s.n));
    // g and dBᵀ from the same rows of dy while they are in L1/L2, a chunk at a time (dBᵀ's sums
    // carried in memory between chunks, in the same order: the same result as whole).
    for (int64_t r0 = 0; r0 < rows; r0 += kGatherRows) {
        const int64_t n = std::min(kGatherRows, rows - r0);
        const float* d = dy + r0 * s.n;
        for (int64_t q = 0; q < s.blocks; ++q) {
            project<Tiles>(n, rb, nb, d + q * nb, nullptr, s.n, p.bt.data() + q * nb, s.n, g + r0 * s.rank + q * rb, s.rank,
                           scaling);
            wide<Tiles>(rb, n, nb, xa + r0 * s.rank + q * rb, 1, s.rank, d + q * nb, s.n, p.dbt.data() + q * nb, s.n, r0 > 0);
        }
    }
    for (int64_t n = 0; n < s.n; ++n)
        for (int64_t j = 0; j < rb; ++j) db[n * rb + j] = scaling * p.dbt[size_t(j * s.n + n)];
    // dA: with da null it is the caller's (gated_rows_backward_lora, from h it recomputes in cache).
    if (da && !token) {
        wide<Tiles>(s.rank, rows, s.k, g, 1, s.rank, x, s.k, da, s.k, false);
    } else if (da) {   // the same sums in the same order, a chunk of rows at a time
        for (int64_t r0 = 0; r0 < rows; r0 += kGatherRows) {
            const int64_t n = std::min(kGatherRows, rows - r0);
            const float* xr = gathered(x, token + r0, s.k, n, p.chunk);
            wide<Tiles>(s.rank, n, s.k, g + r0 * s.rank, 1, s.rank, xr, s.k, da, s.k, r0 > 0);
        }
    }
    if (dx) wide<Tiles>(rows, s.rank, s.k, g, s.rank, 1, a, s.k, dx, s.k, accumulate_dx);
}

// C += scale * coef V over one output tile, up to kGatherRows rows at a time with their coefficients
// scaled first (the same products forward_rows forms from its scaled xa).
template <class Tiles>
[[gnu::always_inline]] inline void expand_rows(int64_t O, int64_t T, int64_t L, float scale, const float* coef,
                                               int64_t co, const float* V, int64_t sv, float* C, int64_t sc) {
    Layouts& p = t_layouts;
    p.sxa.resize(size_t(kGatherRows * T));
    for (int64_t o0 = 0; o0 < O; o0 += kGatherRows) {
        const int64_t n = std::min(kGatherRows, O - o0);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t t = 0; t < T; ++t) p.sxa[size_t(i * T + t)] = scale * coef[(o0 + i) * co + t];
        wide<Tiles>(n, T, L, p.sxa.data(), T, 1, V, sv, C + o0 * sc, sc, true);
    }
}

using ForwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, float, float*, float*);
using ProductFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                           bool);
using BackwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const int64_t*, const float*,
                            const float*, const float*, float, float*, float*, float*, bool, float*);
using ProjectFn = void (*)(const LoraShape&, int64_t, const float*, const int64_t*, const float*, float*);
using ExpandFn = void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float*, int64_t);

// Each loop instantiated for one ISA level (see the top of the file).
#define KT_LORA_LOOPS(SUFFIX, TILES, TARGET)                                                                              \
    TARGET void forward_##SUFFIX(const LoraShape& s, int64_t rows, const float* x, const float* a, const float* b,       \
                                 float scaling, float* xa, float* out) {                                                 \
        forward_rows<TILES>(s, rows, x, a, b, scaling, xa, out);                                                          \
    }                                                                                                                     \
    TARGET void backward_##SUFFIX(const LoraShape& s, int64_t rows, const float* dy, const float* x, const int64_t* tok, \
                                  const float* xa, const float* a, const float* b, float scaling, float* dx, float* da,   \
                                  float* db, bool acc, float* g) {                                                        \
        backward_rows<TILES>(s, rows, dy, x, tok, xa, a, b, scaling, dx, da, db, acc, g);                                \
    }                                                                                                                     \
    TARGET void project_##SUFFIX(const LoraShape& s, int64_t rows, const float* x, const int64_t* tok, const float* a_e, \
                                 float* xa) {                                                                             \
        project<TILES>(rows, s.rank, s.k, x, tok, s.k, a_e, s.k, xa, s.rank, 1.0f);                                     \
    }                                                                                                                     \
    TARGET void expand_##SUFFIX(int64_t O, int64_t T, int64_t L, float scale, const float* coef, int64_t co,             \
                                const float* V, int64_t sv, float* C, int64_t sc) {                                       \
        expand_rows<TILES>(O, T, L, scale, coef, co, V, sv, C, sc);                                                       \
    }                                                                                                                     \
    TARGET void product_##SUFFIX(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct,             \
                                 const float* V, int64_t sv, float* C, int64_t sc, bool add) {                            \
        wide<TILES>(O, T, L, coef, co, ct, V, sv, C, sc, add);                                                            \
    }

KT_LORA_LOOPS(baseline, BaselineTiles, )
#if defined(__x86_64__)
KT_LORA_LOOPS(avx2, Avx2Tiles, __attribute__((target("avx2,fma"))))
KT_LORA_LOOPS(avx512, Avx512Tiles, __attribute__((target("avx512f,avx512vl,avx2,fma"))))
#define KT_LORA_WIDEST(NAME) widest(NAME##_avx512, NAME##_avx2, NAME##_baseline)
#else
#define KT_LORA_WIDEST(NAME) NAME##_baseline
#endif
#undef KT_LORA_LOOPS


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

}  // namespace

void grouped_lora_forward(const LoraShape& s, const int64_t* counts, const float* x, const float* a, const float* b,
                          float scaling, float* xa, float* out) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
    const ForwardFn fn = KT_LORA_WIDEST(forward);
    const std::vector<int64_t> first = row_offsets(counts, s.experts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        if (n)
            fn(s, n, x + r0 * s.k, a + e * s.rank * s.k, b + e * s.n * (s.rank / s.blocks), scaling, xa + r0 * s.rank,
               out + r0 * s.n);
    });
}

void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db,
                           bool accumulate_dx, float* g, const int64_t* token) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
    const BackwardFn fn = KT_LORA_WIDEST(backward);
    const std::vector<int64_t> first = row_offsets(counts, s.experts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        float* dae = da ? da + e * s.rank * s.k : nullptr;
        const int64_t b_size = s.n * (s.rank / s.blocks);
        float* dbe = db + e * b_size;
        if (!n) {
            if (dae) std::fill(dae, dae + s.rank * s.k, 0.0f);
            std::fill(dbe, dbe + b_size, 0.0f);
            return;
        }
        fn(s, n, dy + r0 * s.n, token || !x ? x : x + r0 * s.k, token ? token + r0 : nullptr, xa + r0 * s.rank,
           a + e * s.rank * s.k, b + e * b_size, scaling, dx ? dx + r0 * s.k : nullptr, dae, dbe, accumulate_dx,
           g ? g + r0 * s.rank : nullptr);
    });
}

// The two pieces a base product runs inside its own passes (no lock: the product holds it).
void lora_project(const LoraShape& s, int64_t rows, const float* x, const int64_t* token, const float* a_e, float* xa) {
    const ProjectFn fn = KT_LORA_WIDEST(project);
    fn(s, rows, x, token, a_e, xa);
}

void lora_product(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct, const float* V, int64_t sv,
                  float* C, int64_t sc, bool add) {
    const ProductFn fn = KT_LORA_WIDEST(product);
    fn(O, T, L, coef, co, ct, V, sv, C, sc, add);
}

void lora_expand(int64_t O, int64_t T, int64_t L, float scale, const float* coef, int64_t co, const float* V, int64_t sv,
                 float* C, int64_t sc) {
    const ExpandFn fn = KT_LORA_WIDEST(expand);
    fn(O, T, L, scale, coef, co, V, sv, C, sc);
}

}  // namespace kt
