// Per-expert LoRA over rows grouped by expert (kt.training's adapters): the products of a low-rank
// adapter delta W_e = scaling * B_e A_e with each expert's rows, forward and backward, on the pool.
//
// Layouts (f32, row-major): x [rows, K] grouped by expert (counts[e] rows of expert e, in index
// order), A [E, r, K], B [E, N, r], xa [rows, r], out / dy [rows, N].
#pragma once
#include <cstdint>

namespace kt {

// The largest rank the loops take (their per-row scratch is sized for it).
constexpr int64_t kMaxLoraRank = 64;

struct LoraShape {
    int64_t experts, rank, k, n, rows;
};

// out += scaling * (x A_eᵀ) B_eᵀ per expert's rows; xa (= x A_eᵀ, unscaled) is written for backward.
void grouped_lora_forward(const LoraShape& s, const int64_t* counts, const float* x, const float* a, const float* b,
                          float scaling, float* xa, float* out);

// From dy (the gradient of out) and the forward's x and xa: dx = scaling * (dy B_e) A_e (overwritten),
// da_e = scaling * (dy B_e)ᵀ x, db_e = scaling * dyᵀ xa (both overwritten, zero for experts without rows).
void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db);

}  // namespace kt
