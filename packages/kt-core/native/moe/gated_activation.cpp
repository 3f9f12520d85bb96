// gated_activation.h: one row segment through gated_vectors.h's gated_span, compiled per ISA level
// inside target attributes and picked once after host detection.
#include "moe/gated_activation.h"
#include "moe/gated_vectors.h"

namespace kt {
namespace {

using namespace vectors;
using SpanFn = void (*)(const float*, const float*, int64_t, Gate, float*);

#define KT_GATED_SPAN(SUFFIX, ATTR, VEC)                                                      \
    ATTR void span_##SUFFIX(const float* g, const float* u, int64_t n, Gate gate, float* out) { \
        if (gate.gelu)                                                                         \
            gated_span<VEC, false, false, true>(g, u, n, gate, 1.0f, out);                     \
        else if (gate.after)                                                                   \
            gated_span<VEC, false, true>(g, u, n, gate, 1.0f, out);                            \
        else if (gate.shaped())                                                                \
            gated_span<VEC, true>(g, u, n, gate, 1.0f, out);                                   \
        else                                                                                   \
            gated_span<VEC, false>(g, u, n, gate, 1.0f, out);                                  \
    }

KT_GATED_SPAN(baseline, , BaselineVec)
#if defined(__x86_64__)
KT_GATED_SPAN(avx2, __attribute__((target("avx2,fma"))), Avx2Vec)
KT_GATED_SPAN(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), Avx512Vec)
#endif
#undef KT_GATED_SPAN

}  // namespace

void gated_activation(const float* g, const float* u, int64_t n, float limit, float alpha, activation::GatedForm form,
                      float* out) {
#if defined(__x86_64__)
    static const SpanFn fn = widest<SpanFn>(span_avx512, span_avx2, span_baseline);   // the host's, once
#else
    const SpanFn fn = span_baseline;
#endif
    fn(g, u, n, Gate(limit, alpha, form), out);
}

}  // namespace kt
