// Per-expert LoRA over rows grouped by expert (kt.training's adapters): the products of a low-rank
// adapter delta W_e = scaling * B_e A_e with each expert's rows, forward and backward, on the pool.
//
// Layouts (f32, row-major): x [rows, K] grouped by expert (counts[e] rows of expert e, in index
// order), A [E, r, K], B [E, N, r / blocks], xa [rows, r], out / dy [rows, N].
//
// blocks > 1 makes B block-diagonal without storing its zeros: out's N columns are `blocks` equal
// parts and part q takes rank slice q (B's rows of part q hold that slice's r / blocks columns) —
// separate gate and up adapters run as one call on the fused [rows, 2I] product, each half its own.
#pragma once
#include <cstdint>

namespace kt {

// The largest rank the loops take (their per-row scratch is sized for it).
constexpr int64_t kMaxLoraRank = 64;

struct LoraShape {
    int64_t experts, rank, k, n, rows;
    int64_t blocks = 1;   // B block-diagonal in `blocks` parts (see above); divides rank and n
};

// out += scaling * (x A_eᵀ) B_eᵀ per expert's rows; xa (= x A_eᵀ, unscaled) is written for backward.
void grouped_lora_forward(const LoraShape& s, const int64_t* counts, const float* x, const float* a, const float* b,
                          float scaling, float* xa, float* out);

// From dy (the gradient of out) and the forward's x and xa: dx = scaling * (dy B_e) A_e (overwritten, or
// added to dx with accumulate_dx: the adapter's share of a gradient the base product already wrote),
// da_e = scaling * (dy B_e)ᵀ x, db_e = scaling * dyᵀ xa (both overwritten, zero for experts without rows).
// With dx null, g = scaling * dy B_e [rows, r] is written to `g` instead, for the base product to add
// g A_e to its own output tile by tile (ProductLoraGrad). With `token`, row i of x is x[token[i]] (x
// [tokens, K]: the rows are never gathered into a [rows, K] copy). With da null (x then unused), dA
// is the caller's (down's adapter: gated_rows_backward_lora).
void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db,
                           bool accumulate_dx = false, float* g = nullptr, const int64_t* token = nullptr);

// --- an adapter riding on a base product (MoeLayer::grouped_*) ----------------------------------
// A separate LoRA pass reads and rewrites the product's whole [rows, N] output from memory (at 2048
// tokens of Qwen3-30B-A3B ~1 GB a step); riding on the product, its term is added to each output
// tile right after the kernel wrote it, while the tile is in cache, and x A_eᵀ is taken while the
// product's pre-pass has the expert's rows in cache.

// Forward: out += scaling (x A_eᵀ) B_eᵀ, and xa = x A_eᵀ written (unscaled, for backward).
struct ProductLora {
    const float* a;       // [E, r, K]
    const float* bt;      // [E, r / blocks, N]: B_eᵀ; column block q of N (N / blocks wide) takes rank slice q
    int64_t rank, blocks;
    float scaling;
    float* xa;            // [rows, r]
};

// Backward: dx += g A_e, g = scaling dy B_e from grouped_lora_backward (dx null).
struct ProductLoraGrad {
    const float* g;       // [rows, r]
    const float* a;       // [E, r, K]
    int64_t rank;
};

// xa[i] = x_i A_eᵀ for one expert's `rows` rows of K = s.k, row i at x + (token ? token[i] : i) * s.k.
void lora_project(const LoraShape& s, int64_t rows, const float* x, const int64_t* token, const float* a_e, float* xa);

// C[o][l] (+)= sum over t < T of coef[o * co + t * ct] * V[t * sv + l], for o < O, l < L (added to
// C's values with add): the LoRA products' common form, for dA = gᵀ h outside this file.
void lora_product(int64_t O, int64_t T, int64_t L, const float* coef, int64_t co, int64_t ct, const float* V, int64_t sv,
                  float* C, int64_t sc, bool add);

// C[o][l] += scale * sum over t < T of coef[o * co + t] * V[t * sv + l], for o < O, l < L: a rank
// term added to one output tile (T = the rank or a slice of it).
void lora_expand(int64_t O, int64_t T, int64_t L, float scale, const float* coef, int64_t co, const float* V, int64_t sv,
                 float* C, int64_t sc);

}  // namespace kt
