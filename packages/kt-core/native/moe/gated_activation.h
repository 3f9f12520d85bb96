// The gated activation kt-core computes itself: the forward's epilogue on raw gate / up products
// (moe_layer.cpp: expert biases, the limit after SiLU and GELU-tanh have no backend kernel) and
// training's weighted rows (training_rows.cpp's gated_rows_forward).
#pragma once
#include <kt/formats/gated_activation.h>

#include <cstdint>

namespace kt {

// out[c] = act(g[c], u[c]) * weight for c < n on the host's widest vectors: SiLU, the clamped
// SwiGLU (limit, alpha), the limit after SiLU or GELU-tanh (form). No pool, no lock: the caller's thread.
void gated_activation(const float* g, const float* u, int64_t n, float limit, float alpha, activation::GatedForm form,
                      float* out, float weight = 1.0f);

}  // namespace kt
