// training_rows.h's passes. The gated activation is elementwise over [rows, I] with an exponential
// per element; scalar expf was the cost, so it runs on GCC vectors — the forward by
// gated_activation.h's pass, the gradients here (gated_vectors.h), compiled per ISA level inside
// target attributes and picked after host detection, like grouped_lora.cpp.
#include "moe/training_rows.h"
#include "moe/gated_activation.h"
#include "moe/gated_vectors.h"
#include "moe/grouped_lora.h"
#include "moe/tiles.h"
#include "moe/vectors.h"

#include "abi/host_api.h"
#include "pool/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kt {
namespace {

using namespace vectors;

constexpr int64_t kSerialElements = int64_t(1) << 16;   // below this the calling thread does it all

// body(begin, end) over [0, n) in chunks on the pool (or at once when small).
template <class Body>
void chunks(int64_t n, int64_t cost_per_item, Body&& body) {
    if (n * cost_per_item < kSerialElements) {
        body(int64_t(0), n);
        return;
    }
    ThreadPool& pool = global_pool();
    const int64_t parts = std::min<int64_t>(n, int64_t(pool.num_threads()) * 4);
    struct Ctx {
        Body* body;
        int64_t n, parts;
    } ctx{&body, n, parts};
    pool.parallel_for(
        size_t(parts),
        [](void* c, size_t p) {
            auto* x = static_cast<Ctx*>(c);
            const int64_t b = x->n * int64_t(p) / x->parts, e = x->n * (int64_t(p) + 1) / x->parts;
            (*x->body)(b, e);
        },
        &ctx);
}

// Rows [b, e) of gated_rows_forward: each row's activation times its weight, by the forward's own
// vector pass (gated_activation.h).
void forward_rows(const float* gu, const float* w, int64_t b, int64_t e, int64_t I, float limit, float alpha,
                  activation::GatedForm form, float* h) {
    for (int64_t i = b; i < e; ++i)
        gated_activation(gu + i * 2 * I, gu + i * 2 * I + I, I, limit, alpha, form, h + i * I, w[i]);
}

// d(g * sigmoid(a g)) / dg = s (1 + a g (1 - s)), s = sigmoid(a g); the clamps pass the gradient
// where their input is inside the limits, ends included (torch's clamp backward).
// With the limit after SiLU: d/dg passes where SiLU(g) <= limit, d/du where u is inside the limits.
// GELU-tanh: d(g sigmoid(z)) / dg = s + g s (1 - s) dz/dg, s = sigmoid(z).
template <class W, bool kShaped, bool kAfter = false, bool kGelu = false>
[[gnu::always_inline]] inline void backward_range(const float* dh, const float* gu, const float* w, int64_t b,
                                                  int64_t e, int64_t I, Gate gate, float* dgu, float* dw) {
    using V = typename W::V;
    const float limit = gate.bound(), a = kShaped ? gate.slope() : 1.0f, shift = gate.shift();
    const V lim = W::splat(limit), neg = W::splat(-limit), zero = W::splat(0.0f);
    for (int64_t i = b; i < e; ++i) {
        const float* g = gu + i * 2 * I;
        const float* u = g + I;
        const float* d = dh + i * I;
        float* dg = dgu + i * 2 * I;
        float* du = dg + I;
        const float wi = w[i];
        V acc = {};
        float tail = 0.0f;
        int64_t c = 0;
        for (; c + W::kLanes <= I; c += W::kLanes) {
            V gv = W::load(g + c), uv = W::load(u + c);
            const V dv = W::load(d + c);
            if constexpr (kGelu) {
                const V s = sigmoid<W>(gelu_arg(gv)), gelu = gv * s;
                acc += dv * gelu * uv;
                W::store(du + c, dv * gelu * wi);
                W::store(dg + c, dv * uv * wi * (s + gelu * (1.0f - s) * gelu_arg_slope(gv)));
            } else if constexpr (kAfter) {
                const V s = sigmoid<W>(gv), silu = gv * s, sc = silu > lim ? lim : silu;
                const V uc = uv > lim ? lim : (uv < neg ? neg : uv);
                acc += dv * sc * uc;
                W::store(du + c, (uv >= neg) & (uv <= lim) ? dv * sc * wi : zero);
                W::store(dg + c, silu <= lim ? dv * uc * wi * s * (1.0f + gv * (1.0f - s)) : zero);
            } else if constexpr (kShaped) {
                const V graw = gv, uraw = uv;
                gv = gv > lim ? lim : gv;
                uv = uv > lim ? lim : (uv < neg ? neg : uv);
                const V s = sigmoid<W>(gv * a), glu = gv * s, up1 = uv + shift;
                acc += dv * up1 * glu;
                W::store(du + c, (uraw >= neg) & (uraw <= lim) ? dv * glu * wi : zero);
                W::store(dg + c, graw <= lim ? dv * up1 * wi * s * (1.0f + a * gv * (1.0f - s)) : zero);
            } else {
                const V s = sigmoid<W>(gv), silu = gv * s;
                acc += dv * silu * uv;
                W::store(du + c, dv * silu * wi);
                W::store(dg + c, dv * uv * wi * s * (1.0f + gv * (1.0f - s)));
            }
        }
        for (; c < I; ++c) {
            if constexpr (kGelu) {
                const float s = 1.0f / (1.0f + std::exp(-gelu_arg(g[c]))), gelu = g[c] * s;
                tail += d[c] * gelu * u[c];
                du[c] = d[c] * gelu * wi;
                dg[c] = d[c] * u[c] * wi * (s + gelu * (1.0f - s) * gelu_arg_slope(g[c]));
                continue;
            }
            if constexpr (kAfter) {
                const float s = 1.0f / (1.0f + std::exp(-g[c])), silu = g[c] * s;
                const float sc = silu > limit ? limit : silu;
                const bool u_in = !(u[c] > limit) && !(u[c] < -limit);
                const float uc = u_in ? u[c] : (u[c] > limit ? limit : -limit);
                tail += d[c] * sc * uc;
                du[c] = u_in ? d[c] * sc * wi : 0.0f;
                dg[c] = silu <= limit ? d[c] * uc * wi * s * (1.0f + g[c] * (1.0f - s)) : 0.0f;
                continue;
            }
            float gc = g[c], uc = u[c];
            bool g_in = true, u_in = true;
            if constexpr (kShaped) {
                g_in = !(gc > limit);
                u_in = !(uc > limit) && !(uc < -limit);
                gc = g_in ? gc : limit;
                uc = u_in ? uc : (uc > limit ? limit : -limit);
            }
            const float s = 1.0f / (1.0f + std::exp(-a * gc)), glu = gc * s, up = kShaped ? uc + shift : uc;
            tail += d[c] * glu * up;
            du[c] = u_in ? d[c] * glu * wi : 0.0f;
            dg[c] = g_in ? d[c] * up * wi * s * (1.0f + a * gc * (1.0f - s)) : 0.0f;
        }
        dw[i] = tail + W::sum(acc);
    }
}

using BackwardFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, Gate, float*, float*);

// The gradients' pass, one function per ISA level; the gate kind is chosen inside (once per chunk).
#define KT_GATED_ROWS(SUFFIX, ATTR, VEC)                                                                                  \
    ATTR void backward_##SUFFIX(const float* dh, const float* gu, const float* w, int64_t b, int64_t e, int64_t I, \
                                Gate gate, float* dgu, float* dw) {                                                \
        if (gate.gelu)                                                                                             \
            backward_range<VEC, false, false, true>(dh, gu, w, b, e, I, gate, dgu, dw);                            \
        else if (gate.after)                                                                                       \
            backward_range<VEC, false, true>(dh, gu, w, b, e, I, gate, dgu, dw);                                   \
        else if (gate.shaped())                                                                                    \
            backward_range<VEC, true>(dh, gu, w, b, e, I, gate, dgu, dw);                                          \
        else                                                                                                       \
            backward_range<VEC, false>(dh, gu, w, b, e, I, gate, dgu, dw);                                         \
    }

KT_GATED_ROWS(baseline, , BaselineVec)
#if defined(__x86_64__)
KT_GATED_ROWS(avx2, __attribute__((target("avx2,fma"))), Avx2Vec)
KT_GATED_ROWS(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), Avx512Vec)
#endif
#undef KT_GATED_ROWS

}  // namespace

void gather_rows(const float* x, int64_t width, const int64_t* token, int64_t n_rows, float* rows) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
    chunks(n_rows, width, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) std::memcpy(rows + i * width, x + token[i] * width, size_t(width) * 4);
    });
}

void sum_rows(const float* rows, int64_t width, const int64_t* row_of_slot, int64_t tokens, int64_t picks, float* out) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
    // A token's rows are read a column block each in turn, every block prefetching the same row's
    // next block and the last one the next token's rows: in random row order the hardware
    // prefetchers lost each row's start. One row after another took 14.1-14.7 ms for 16384 rows of
    // 2048 on Zen 4, this 11.0-11.2 (a plain sum of those bytes ~5); the blocks alone, without the
    // prefetches, were slower still (18). Each sum still adds the rows in slot order.
    constexpr int64_t kBlock = 256;
    chunks(tokens, width * picks, [&](int64_t b, int64_t e) {
        std::vector<const float*> src(static_cast<size_t>(picks));
        for (int64_t t = b; t < e; ++t) {
            int64_t n = 0;
            for (int64_t j = 0; j < picks; ++j)
                if (const int64_t r = row_of_slot[t * picks + j]; r >= 0) src[size_t(n++)] = rows + r * width;
            const int64_t next = t + 1 < e ? t + 1 : -1;
            float* o = out + t * width;
            for (int64_t c0 = 0; c0 < width; c0 += kBlock) {
                const int64_t cw = std::min(kBlock, width - c0);
                float acc[kBlock] = {};
                for (int64_t j = 0; j < n; ++j) {
                    const float* s = src[size_t(j)] + c0;
                    if (c0 + kBlock < width)   // the same row's next block
                        for (int64_t c = 0; c < kBlock; c += 16) __builtin_prefetch(s + kBlock + c);
                    for (int64_t c = 0; c < cw; ++c) acc[c] += s[c];
                }
                if (c0 + kBlock >= width && next >= 0)   // the next token's first blocks
                    for (int64_t j = 0; j < picks; ++j)
                        if (const int64_t r = row_of_slot[next * picks + j]; r >= 0)
                            for (int64_t c = 0; c < std::min(kBlock, width); c += 16) __builtin_prefetch(rows + r * width + c);
                std::memcpy(o + c0, acc, size_t(cw) * sizeof(float));
            }
        }
    });
}

void gated_rows_forward(const float* gate_up, const float* w, int64_t n_rows, int64_t inter, float limit, float alpha,
                        activation::GatedForm form, float* h) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
    chunks(n_rows, inter, [&](int64_t b, int64_t e) { forward_rows(gate_up, w, b, e, inter, limit, alpha, form, h); });
}

void gated_rows_backward(const float* dh, const float* gate_up, const float* w, int64_t n_rows, int64_t inter,
                         float limit, float alpha, activation::GatedForm form, float* dgate_up, float* dw) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const BackwardFn fn = widest<BackwardFn>(backward_avx512, backward_avx2, backward_baseline);
#else
    const BackwardFn fn = backward_baseline;
#endif
    const Gate gate(limit, alpha, form);
    chunks(n_rows, 2 * inter, [&](int64_t b, int64_t e) { fn(dh, gate_up, w, b, e, inter, gate, dgate_up, dw); });
}

void gated_rows_backward_lora(const float* dh, const float* gate_up, const float* w, int64_t n_rows, int64_t inter,
                              float limit, float alpha, activation::GatedForm form, float* dgate_up, float* dw, const int64_t* counts,
                              int64_t experts, const float* g, int64_t rank, float* da) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const BackwardFn backward = widest<BackwardFn>(backward_avx512, backward_avx2, backward_baseline);
#else
    const BackwardFn backward = backward_baseline;
#endif
    const Gate gate(limit, alpha, form);
    const std::vector<int64_t> first = row_offsets(counts, experts);
    // dA's sums carried in memory from chunk to chunk, in row order: as the whole rows' product.
    constexpr int64_t kRows = 32;
    auto expert = [&](size_t i) {
        const int64_t e = int64_t(i);
        thread_local std::vector<float> h;
        h.resize(size_t(kRows * inter));
        float* dae = da + e * rank * inter;
        if (!counts[e]) {
            std::fill(dae, dae + rank * inter, 0.0f);
            return;
        }
        for (int64_t b = first[size_t(e)]; b < first[size_t(e) + 1]; b += kRows) {
            const int64_t n = std::min(kRows, first[size_t(e) + 1] - b);
            backward(dh, gate_up, w, b, b + n, inter, gate, dgate_up, dw);
            forward_rows(gate_up + b * 2 * inter, w + b, 0, n, inter, limit, alpha, form, h.data());
            lora_product(rank, n, inter, g + b * rank, 1, rank, h.data(), inter, dae, inter, b > first[size_t(e)]);
        }
    };
    parallel(n_rows * 2 * inter < kSerialElements ? nullptr : &global_pool(), size_t(experts), expert);
}

}  // namespace kt
