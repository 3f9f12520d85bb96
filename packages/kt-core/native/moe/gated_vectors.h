// The gated activations on GCC vectors (vectors.h), as templates on the vector type: one
// instantiation per ISA level, inlined into target-attributed wrappers by their users — training's
// row passes (training_rows.cpp) and the forward's epilogue on raw gate/up products
// (gated_activation.cpp). SiLU's sigmoid has its own exp (range reduction + degree-6 polynomial,
// ~2 ulp, as kt-backend-avx's). Internal linkage: each translation unit compiles its own copies.
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

// One row's n outputs: out[c] = act(g[c], u[c]) * wi.
template <class W, bool kShaped, bool kAfter = false, bool kGelu = false>
[[gnu::always_inline]] inline void gated_span(const float* g, const float* u, int64_t n, Gate gate, float wi, float* out) {
    using V = typename W::V;
    const float limit = gate.bound(), a = gate.slope(), shift = gate.shift();
    const V lim = W::splat(limit), neg = W::splat(-limit);
    int64_t c = 0;
    for (; c + W::kLanes <= n; c += W::kLanes) {
        V gv = W::load(g + c), uv = W::load(u + c);
        if constexpr (kGelu) {
            W::store(out + c, gv * sigmoid<W>(gelu_arg(gv)) * uv * wi);
        } else if constexpr (kAfter) {
            V s = gv * sigmoid<W>(gv);
            s = s > lim ? lim : s;
            uv = uv > lim ? lim : (uv < neg ? neg : uv);
            W::store(out + c, s * uv * wi);
        } else if constexpr (kShaped) {
            gv = gv > lim ? lim : gv;   // NaN compares false: kept, as torch's clamp keeps it
            uv = uv > lim ? lim : (uv < neg ? neg : uv);
            W::store(out + c, (uv + shift) * gv * sigmoid<W>(gv * a) * wi);
        } else {
            W::store(out + c, gv * sigmoid<W>(gv) * uv * wi);
        }
    }
    for (; c < n; ++c) {
        if constexpr (kGelu) {
            out[c] = g[c] / (1.0f + std::exp(-gelu_arg(g[c]))) * u[c] * wi;
        } else if constexpr (kAfter) {
            float s = g[c] / (1.0f + std::exp(-g[c]));
            s = s > limit ? limit : s;
            const float uc = u[c] > limit ? limit : (u[c] < -limit ? -limit : u[c]);
            out[c] = s * uc * wi;
        } else if constexpr (kShaped) {
            const float gc = g[c] > limit ? limit : g[c];
            const float uc = u[c] > limit ? limit : (u[c] < -limit ? -limit : u[c]);
            out[c] = (uc + shift) * gc / (1.0f + std::exp(-a * gc)) * wi;
        } else {
            out[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c] * wi;
        }
    }
}

}  // namespace
}  // namespace kt
