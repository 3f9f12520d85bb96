// What the gated activations on GCC vectors (vectors.h) share, as templates on the vector type: one
// instantiation per ISA level, inlined into target-attributed wrappers by their users — the
// activation itself (gated_activation.cpp) and its gradients (training_rows.cpp). SiLU's sigmoid has
// its own exp (range reduction + degree-6 polynomial, ~2 ulp, as kt-backend-avx's). Internal
// linkage: each translation unit compiles its own copies.
#pragma once
#include "moe/vectors.h"

#include <kt/formats/gated_activation.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kt {
namespace {

// 1 / (1 + e^-g), clamped so e^-g stays finite; NaN propagates.
template <class W>
[[gnu::always_inline]] inline typename W::V sigmoid(typename W::V g) {
    using V = typename W::V;
    using VI = typename W::VI;
    V x = -g;
    x = x < W::splat(-87.3f) ? W::splat(-87.3f) : x;   // (vector ?: : elementwise; NaN compares false: kept)
    x = x > W::splat(88.3f) ? W::splat(88.3f) : x;
    const V t = x * 1.44269504088896341f;
    const V n = __builtin_convertvector(__builtin_convertvector(t + (t < W::splat(0.0f) ? W::splat(-0.5f) : W::splat(0.5f)), VI), V);
    V r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    V p = W::splat(1.0f / 720);
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
    V scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return 1.0f / (1.0f + p * scale);
}

// The gated activation of a row's gate g and up u, as kt/formats/gated_activation.h computes it:
// SiLU(g) * u; a limit > 0 first clamps g' = min(g, limit), u' = clamp(u, -limit, limit)
// (DeepSeek-V4's clamped SiLU: SiLU(g') * u'); alpha > 0 then gives GPT-OSS's clamped SwiGLU,
// (u' + 1) * g' * sigmoid(alpha g'). Both are the "shaped" kernels below: sigmoid slope a (alpha,
// or 1 for SiLU) and up shift (1, or 0 for SiLU), the limit +inf when unset. `after`: the limit
// applies to SiLU(g) instead, min(SiLU(g), limit) * clamp(u, -limit, limit) (Step-3.5, Ling-2.5).
// `gelu`: GELU-tanh(g) * u = g sigmoid(z) * u, z = 2c (g + 0.044715 g^3) (Gemma 4; gated_activation.h).
struct Gate {
    float limit = 0.0f, alpha = 0.0f;   // both 0: SiLU
    bool after = false, gelu = false;
    Gate(float l, float a, activation::GatedForm form)
        : limit(l), alpha(a), after(form == activation::GatedForm::silu_limit_after),
          gelu(form == activation::GatedForm::gelu_tanh) {}
    bool shaped() const { return limit != 0.0f || alpha != 0.0f; }
    float bound() const { return limit > 0.0f ? limit : std::numeric_limits<float>::infinity(); }
    float slope() const { return alpha > 0.0f ? alpha : 1.0f; }
    float shift() const { return alpha > 0.0f ? 1.0f : 0.0f; }
};

// GELU-tanh's sigmoid argument z = 2c (g + 0.044715 g^3) and dz/dg = 2c (1 + 3 * 0.044715 g^2).
template <class T>
[[gnu::always_inline]] inline T gelu_arg(T g) {
    return (g + g * g * g * activation::kGeluTanhCubic) * activation::kGeluTanhScale;
}
template <class T>
[[gnu::always_inline]] inline T gelu_arg_slope(T g) {
    return (g * g * (3.0f * activation::kGeluTanhCubic) + 1.0f) * activation::kGeluTanhScale;
}

}  // namespace
}  // namespace kt
