// The forward's gated activation of raw gate / up products, for MoeLayer (moe_layer.cpp): expert
// biases, the limit after SiLU and GELU-tanh have no backend kernel, so kt-core applies them.
#pragma once
#include <kt/formats/gated_activation.h>

#include <cstdint>

namespace kt {

// out[c] = act(g[c], u[c]) for c < n on the host's widest vectors, as training's gated_rows_forward
// computes it (weight 1): SiLU, the clamped SwiGLU (limit, alpha), the limit after SiLU or GELU-tanh
// (form). No pool, no lock: the caller's thread.
void gated_activation(const float* g, const float* u, int64_t n, float limit, float alpha, activation::GatedForm form,
                      float* out);

}  // namespace kt
