// The LoRA products of grouped_lora.h. A rank-r adapter makes skinny GEMMs ([rows, 2048] x [2048, 8]):
// a BLAS call per expert spends more on dispatch than on arithmetic (torch's grouped GEMM over 128
// experts ran them at ~10 GFLOP/s), so these are plain loops, one pass over each big operand, every
// inner loop running along a contiguous dimension with no reduction in it (so the compiler vectorizes
// it without reassociating sums): K or N with r broadcast factors, or r with one broadcast.
//
// Compiled for the baseline ISA like the rest of kt-core; the loop bodies are instantiated a second
// and third time inside AVX2 / AVX-512 target attributes and picked after host detection (as
// probes/compute_peak.cpp does), so no wider instruction runs on a host (or under a KT_MAX_ISA)
// without it.
#include "moe/grouped_lora.h"
#include "moe/tiles.h"
#include "moe/vec16.h"

#include "abi/host_api.h"
#include "pool/thread_pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kt {
namespace {

using namespace vec16;

// Work below this many multiply-adds stays on the calling thread.
constexpr int64_t kSerialMacs = int64_t(1) << 18;

constexpr int64_t kR = 8;   // adapter rows per block: the rank is padded to a multiple of 8 with zeros

// One expert's adapter with its rank padded to a multiple of kR and its columns to a multiple of
// kV: A [rp, Kp] and Bᵀ [rp, Np] (zeros beyond r, K and N), so every loop below runs whole blocks.
struct Padded {
    int64_t rp, kp, np;
    std::vector<float> a, bt;
    Padded(const LoraShape& s, const float* a_e, const float* b_e)
        : rp((s.rank + kR - 1) / kR * kR), kp((s.k + kV - 1) / kV * kV), np((s.n + kV - 1) / kV * kV),
          a(static_cast<size_t>(rp * kp), 0.0f), bt(static_cast<size_t>(rp * np), 0.0f) {
        for (int64_t j = 0; j < s.rank; ++j) {
            std::memcpy(a.data() + j * kp, a_e + j * s.k, size_t(s.k) * 4);
            for (int64_t n = 0; n < s.n; ++n) bt[size_t(j * np + n)] = b_e[n * s.rank + j];
        }
    }
};

// A row of `len` floats copied into a zero-padded buffer of `padded` (when len is not a multiple of kV).
inline const float* padded_row(const float* row, int64_t len, int64_t padded, std::vector<float>& buf) {
    if (len == padded) return row;
    buf.assign(size_t(padded), 0.0f);
    std::memcpy(buf.data(), row, size_t(len) * 4);
    return buf.data();
}

// dots[j] = row . m_j for the kR rows m_j of a block (row stride ld), over `len` (a multiple of kV)
// columns: kR vector accumulators, one load of the row per column block.
[[gnu::always_inline]] inline void dots8(const float* row, const float* m, int64_t ld, int64_t len, float* dots) {
    V16 acc[kR] = {};
    for (int64_t c = 0; c < len; c += kV) {
        const V16 v = load(row + c);
        for (int64_t j = 0; j < kR; ++j) acc[j] += v * load(m + j * ld + c);
    }
    for (int64_t j = 0; j < kR; ++j) dots[j] = sum(acc[j]);
}

// One expert's forward: per row, xa = x A_eᵀ (kR dot products per block of the rank), then
// out += scaling * xa B_eᵀ along N. Always inlined into each target's wrapper, so it is compiled
// (and its vectors mapped to registers) once per ISA.
[[gnu::always_inline]] inline void forward_rows(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                const float* b, float scaling, float* xa, float* out) {
    const Padded p(s, a, b);
    std::vector<float> xbuf, obuf(size_t(p.np)), dots(size_t(p.rp));
    for (int64_t i = 0; i < rows; ++i) {
        const float* xi = padded_row(x + i * s.k, s.k, p.kp, xbuf);
        for (int64_t j0 = 0; j0 < p.rp; j0 += kR) dots8(xi, p.a.data() + j0 * p.kp, p.kp, p.kp, dots.data() + j0);
        for (int64_t j = 0; j < s.rank; ++j) xa[i * s.rank + j] = dots[size_t(j)];
        float* oi = s.n == p.np ? out + i * s.n : obuf.data();
        if (oi == obuf.data()) std::memcpy(oi, out + i * s.n, size_t(s.n) * 4);
        for (int64_t c = 0; c < p.np; c += kV) {
            V16 acc = load(oi + c);
            for (int64_t j = 0; j < p.rp; ++j) acc += (scaling * dots[size_t(j)]) * load(p.bt.data() + j * p.np + c);
            store(oi + c, acc);
        }
        if (oi == obuf.data()) std::memcpy(out + i * s.n, oi, size_t(s.n) * 4);
    }
}

// One expert's backward, two rows at a time (so the dA and dBᵀ accumulators are loaded and stored
// once per pair): per row, g = scaling * dy B_e (kR dot products along N per block) while dBᵀ += dy ⊗
// scaling * xa (one pass over dy); then dx = g A_e while dA += g ⊗ x (one pass over x and dx). dA and
// dBᵀ accumulate in the padded layouts and are copied out at the end.
template <int kRows>
[[gnu::always_inline]] inline void backward_block(const LoraShape& s, const Padded& p, int64_t i, const float* dy,
                                                  const float* x, const float* xa, float scaling, float* dx, float* dap,
                                                  float* dbt, std::vector<float> (&buf)[2][3]) {
    const float* dyr[kRows];
    const float* xr[kRows];
    float sxa[kRows][kMaxLoraRank], g[kRows][kMaxLoraRank];   // the rank padded to kR: at most kMaxLoraRank
    for (int q = 0; q < kRows; ++q) {
        dyr[q] = padded_row(dy + (i + q) * s.n, s.n, p.np, buf[q][0]);
        xr[q] = padded_row(x + (i + q) * s.k, s.k, p.kp, buf[q][1]);
        for (int64_t j = 0; j < p.rp; ++j) sxa[q][j] = j < s.rank ? scaling * xa[(i + q) * s.rank + j] : 0.0f;
    }
    for (int64_t j0 = 0; j0 < p.rp; j0 += kR) {
        V16 acc[kRows][kR] = {};
        float* dbj = dbt + j0 * p.np;
        const float* btj = p.bt.data() + j0 * p.np;
        for (int64_t c = 0; c < p.np; c += kV) {
            V16 v[kRows];
            for (int q = 0; q < kRows; ++q) v[q] = load(dyr[q] + c);
            for (int64_t j = 0; j < kR; ++j) {
                const V16 bj = load(btj + j * p.np + c);
                V16 d = load(dbj + j * p.np + c);
                for (int q = 0; q < kRows; ++q) {
                    acc[q][j] += v[q] * bj;
                    d += sxa[q][j0 + j] * v[q];
                }
                store(dbj + j * p.np + c, d);
            }
        }
        for (int q = 0; q < kRows; ++q)
            for (int64_t j = 0; j < kR; ++j) g[q][j0 + j] = scaling * sum(acc[q][j]);
    }
    for (int64_t c = 0; c < p.kp; c += kV) {
        V16 v[kRows], out[kRows] = {};
        for (int q = 0; q < kRows; ++q) v[q] = load(xr[q] + c);
        for (int64_t j = 0; j < p.rp; ++j) {
            const V16 aj = load(p.a.data() + j * p.kp + c);
            V16 d = load(dap + j * p.kp + c);
            for (int q = 0; q < kRows; ++q) {
                out[q] += g[q][j] * aj;
                d += g[q][j] * v[q];
            }
            store(dap + j * p.kp + c, d);
        }
        for (int q = 0; q < kRows; ++q) store(buf[q][2].data() + c, out[q]);
    }
    for (int q = 0; q < kRows; ++q) std::memcpy(dx + (i + q) * s.k, buf[q][2].data(), size_t(s.k) * 4);
}

[[gnu::always_inline]] inline void backward_rows(const LoraShape& s, int64_t rows, const float* dy, const float* x,
                                                 const float* xa, const float* a, const float* b, float scaling,
                                                 float* dx, float* da, float* db) {
    const Padded p(s, a, b);
    std::vector<float> dap(size_t(p.rp * p.kp), 0.0f), dbt(size_t(p.rp * p.np), 0.0f);
    std::vector<float> buf[2][3];
    for (auto& q : buf) q[2].resize(size_t(p.kp));
    int64_t i = 0;
    for (; i + 2 <= rows; i += 2) backward_block<2>(s, p, i, dy, x, xa, scaling, dx, dap.data(), dbt.data(), buf);
    for (; i < rows; ++i) backward_block<1>(s, p, i, dy, x, xa, scaling, dx, dap.data(), dbt.data(), buf);
    for (int64_t j = 0; j < s.rank; ++j) {
        std::memcpy(da + j * s.k, dap.data() + j * p.kp, size_t(s.k) * 4);
        for (int64_t n = 0; n < s.n; ++n) db[n * s.rank + j] = dbt[size_t(j * p.np + n)];
    }
}

using ForwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, float, float*, float*);
using BackwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, const float*,
                            const float*, float, float*, float*, float*);

void forward_baseline(const LoraShape& s, int64_t rows, const float* x, const float* a, const float* b, float scaling,
                      float* xa, float* out) {
    forward_rows(s, rows, x, a, b, scaling, xa, out);
}
void backward_baseline(const LoraShape& s, int64_t rows, const float* dy, const float* x, const float* xa,
                       const float* a, const float* b, float scaling, float* dx, float* da, float* db) {
    backward_rows(s, rows, dy, x, xa, a, b, scaling, dx, da, db);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void forward_avx2(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                      const float* b, float scaling, float* xa, float* out) {
    forward_rows(s, rows, x, a, b, scaling, xa, out);
}
__attribute__((target("avx2,fma"))) void backward_avx2(const LoraShape& s, int64_t rows, const float* dy,
                                                       const float* x, const float* xa, const float* a, const float* b,
                                                       float scaling, float* dx, float* da, float* db) {
    backward_rows(s, rows, dy, x, xa, a, b, scaling, dx, da, db);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void forward_avx512(const LoraShape& s, int64_t rows,
                                                                        const float* x, const float* a, const float* b,
                                                                        float scaling, float* xa, float* out) {
    forward_rows(s, rows, x, a, b, scaling, xa, out);
}
__attribute__((target("avx512f,avx512vl,avx2,fma"))) void backward_avx512(const LoraShape& s, int64_t rows,
                                                                         const float* dy, const float* x,
                                                                         const float* xa, const float* a,
                                                                         const float* b, float scaling, float* dx,
                                                                         float* da, float* db) {
    backward_rows(s, rows, dy, x, xa, a, b, scaling, dx, da, db);
}
#endif

// body(e) for every expert with rows, on the pool when the work is large enough.
template <class Body>
void each_expert(const LoraShape& s, const int64_t* counts, Body&& body) {
    const bool serial = s.rows * s.rank * (s.k + s.n) < kSerialMacs;
    if (serial) {
        for (int64_t e = 0; e < s.experts; ++e) body(e);
        return;
    }
    global_pool().parallel_for(
        size_t(s.experts), [](void* ctx, size_t e) { (*static_cast<Body*>(ctx))(int64_t(e)); }, &body);
    (void)counts;
}

std::vector<int64_t> first_rows(const LoraShape& s, const int64_t* counts) {
    std::vector<int64_t> first(size_t(s.experts) + 1, 0);
    for (int64_t e = 0; e < s.experts; ++e) first[size_t(e) + 1] = first[size_t(e)] + counts[e];
    return first;
}

}  // namespace

void grouped_lora_forward(const LoraShape& s, const int64_t* counts, const float* x, const float* a, const float* b,
                          float scaling, float* xa, float* out) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const ForwardFn fn = widest<ForwardFn>(forward_avx512, forward_avx2, forward_baseline);
#else
    const ForwardFn fn = forward_baseline;
#endif
    const std::vector<int64_t> first = first_rows(s, counts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        if (n) fn(s, n, x + r0 * s.k, a + e * s.rank * s.k, b + e * s.n * s.rank, scaling, xa + r0 * s.rank, out + r0 * s.n);
    });
}

void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db) {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // the pool is the forwards' (tiles.h)
#if defined(__x86_64__)
    const BackwardFn fn = widest<BackwardFn>(backward_avx512, backward_avx2, backward_baseline);
#else
    const BackwardFn fn = backward_baseline;
#endif
    const std::vector<int64_t> first = first_rows(s, counts);
    each_expert(s, counts, [&](int64_t e) {
        const int64_t r0 = first[size_t(e)], n = counts[e];
        float* dae = da + e * s.rank * s.k;
        float* dbe = db + e * s.n * s.rank;
        if (!n) {
            std::fill(dae, dae + s.rank * s.k, 0.0f);
            std::fill(dbe, dbe + s.n * s.rank, 0.0f);
            return;
        }
        fn(s, n, dy + r0 * s.n, x + r0 * s.k, xa + r0 * s.rank, a + e * s.rank * s.k, b + e * s.n * s.rank, scaling,
           dx + r0 * s.k, dae, dbe);
    });
}

}  // namespace kt
