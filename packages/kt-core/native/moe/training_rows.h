// The row passes of a training step around the expert products (kt.training): tokens gathered into
// rows grouped by expert, the gated activation with the routing weight, and the rows summed back into
// tokens — each one pass over memory on kt's pool (torch's index_select / index_add and its
// elementwise chain took several passes each, at a few GB/s, on [rows, hidden] tensors).
#pragma once
#include <kt/formats/gated_activation.h>

#include <cstdint>

namespace kt {

// rows[i] = x[token[i]]; x [tokens, width], rows [n_rows, width], token in [0, tokens).
void gather_rows(const float* x, int64_t width, const int64_t* token, int64_t n_rows, float* rows);

// out[t] = sum over j of rows[row_of_slot[t * picks + j]] (slots of -1 skipped, in slot order: deterministic).
void sum_rows(const float* rows, int64_t width, const int64_t* row_of_slot, int64_t tokens, int64_t picks, float* out);

// h[i] = act(gate_up[i, :I], gate_up[i, I:]) * w[i]  (gate_up [n_rows, 2I], h [n_rows, I]), act = SiLU(g) * u,
// or with limit > 0 GPT-OSS's clamped SwiGLU: (clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha g'), g' = min(g, limit);
// form silu_limit_after: min(SiLU(g), limit) * clamp(u, -limit, limit) (alpha 0); gelu_tanh: GELU-tanh(g) * u.
void gated_rows_forward(const float* gate_up, const float* w, int64_t n_rows, int64_t inter, float limit, float alpha,
                        activation::GatedForm form, float* h);

// From dh [n_rows, I]: dgate_up [n_rows, 2I] (d gate | d up) and dw [n_rows] of gated_rows_forward.
void gated_rows_backward(const float* dh, const float* gate_up, const float* w, int64_t n_rows, int64_t inter,
                         float limit, float alpha, activation::GatedForm form, float* dgate_up, float* dw);

// The same pass over rows grouped by expert (counts[e] rows of expert e), one expert's rows per task,
// that also gives the down adapter's dA_e = sum over e's rows of g[i]ᵀ h[i] (g [n_rows, rank] from
// grouped_lora_backward, da [experts, rank, I] overwritten, zero for experts without rows): h is
// recomputed a few rows at a time in cache, not by a gated_rows_forward pass of its own and read back.
void gated_rows_backward_lora(const float* dh, const float* gate_up, const float* w, int64_t n_rows, int64_t inter,
                              float limit, float alpha, activation::GatedForm form, float* dgate_up, float* dw, const int64_t* counts,
                              int64_t experts, const float* g, int64_t rank, float* da);

}  // namespace kt
