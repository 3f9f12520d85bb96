// gated_activation.h: one row segment on gated_vectors.h's sigmoid, compiled per ISA level inside
// target attributes and picked once after host detection.
#include "moe/gated_activation.h"
#include "moe/gated_vectors.h"

namespace kt {
namespace {

using namespace vectors;
using SpanFn = void (*)(const float*, const float*, int64_t, Gate, float, float*);

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


#define KT_GATED_SPAN(SUFFIX, ATTR, VEC)                                                      \
    ATTR void span_##SUFFIX(const float* g, const float* u, int64_t n, Gate gate, float w, float* out) { \
        if (gate.gelu)                                                                                  \
            gated_span<VEC, false, false, true>(g, u, n, gate, w, out);                                 \
        else if (gate.after)                                                                            \
            gated_span<VEC, false, true>(g, u, n, gate, w, out);                                        \
        else if (gate.shaped())                                                                         \
            gated_span<VEC, true>(g, u, n, gate, w, out);                                               \
        else                                                                                            \
            gated_span<VEC, false>(g, u, n, gate, w, out);                                              \
    }

KT_GATED_SPAN(baseline, , BaselineVec)
#if defined(__x86_64__)
KT_GATED_SPAN(avx2, __attribute__((target("avx2,fma"))), Avx2Vec)
KT_GATED_SPAN(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), Avx512Vec)
#endif
#undef KT_GATED_SPAN

}  // namespace

void gated_activation(const float* g, const float* u, int64_t n, float limit, float alpha, activation::GatedForm form,
                      float* out, float weight) {
#if defined(__x86_64__)
    static const SpanFn fn = widest<SpanFn>(span_avx512, span_avx2, span_baseline);   // the host's, once
#else
    const SpanFn fn = span_baseline;
#endif
    fn(g, u, n, Gate(limit, alpha, form), weight, out);
}

}  // namespace kt
