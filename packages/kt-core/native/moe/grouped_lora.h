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
void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db,
                           bool accumulate_dx = false);

}  // namespace kt
