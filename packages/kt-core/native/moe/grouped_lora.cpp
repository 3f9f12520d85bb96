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
// kV: A [rp, Kp] and Bᵀ [rp, Np] (zeros beyond r, K and N, and off a block-diagonal B's blocks), so
// every loop below runs whole blocks and is right over the zeros; `banded` says the blocks are
// aligned to whole vectors and rank blocks, and the loops may skip the zeros.
struct Padded {
    int64_t rp, kp, np, rb, nb;
    bool banded;
    std::vector<float> a, bt;
    Padded(const LoraShape& s, const float* a_e, const float* b_e)
        : rp((s.rank + kR - 1) / kR * kR), kp((s.k + kV - 1) / kV * kV), np((s.n + kV - 1) / kV * kV),
          rb(s.rank / s.blocks), nb(s.n / s.blocks), banded(s.blocks > 1 && nb % kV == 0 && rb % kR == 0),
          a(static_cast<size_t>(rp * kp), 0.0f), bt(static_cast<size_t>(rp * np), 0.0f) {
        for (int64_t j = 0; j < s.rank; ++j) {
            std::memcpy(a.data() + j * kp, a_e + j * s.k, size_t(s.k) * 4);
            const int64_t q = j / rb;
            for (int64_t n = q * nb; n < (q + 1) * nb; ++n) bt[size_t(j * np + n)] = b_e[n * rb + j - q * rb];
        }
    }
    // The ranks column vector c reads, and the columns rank block j0 reads: a block's own, or all.
    int64_t rank_lo(int64_t c) const { return banded ? c / nb * rb : 0; }
    int64_t rank_hi(int64_t c) const { return banded ? (c / nb + 1) * rb : rp; }
    int64_t col_lo(int64_t j0) const { return banded ? j0 / rb * nb : 0; }
    int64_t col_hi(int64_t j0) const { return banded ? (j0 / rb + 1) * nb : np; }
};

// A row of `len` floats copied into a zero-padded buffer of `padded` (when len is not a multiple of kV).
inline const float* padded_row(const float* row, int64_t len, int64_t padded, std::vector<float>& buf) {
    if (len == padded) return row;
    buf.assign(size_t(padded), 0.0f);
    std::memcpy(buf.data(), row, size_t(len) * 4);
    return buf.data();
}

// Rows handled together: each pass over an expert's A (and dA) or Bᵀ (and dBᵀ) — the operands the
// loops stream from L2 for every row, L2's bandwidth being what bounded them — serves this many rows.
// Measured on a Qwen3-30B-A3B layer at 2048 tokens (rank 16, gate and up as one call, AVX-512, 2
// cores): the backward's x side 2 -> 4 -> 8 rows took the whole backward 329 -> 224 -> 175-197 ms, the
// forward 1 -> 2 rows 123 -> 91-112 ms. The dy side and the forward keep 2 rows: their 2 x 8
// accumulators already fill half the AVX-512 registers (4 rows would spill).
constexpr int kDyRows = 2, kMaxXRows = 8;

// One expert's forward for kRows rows: xa = x A_eᵀ (kR dot products per block of the rank, one load
// of each A row per column block for all rows), then out += scaling * xa B_eᵀ along N (one load of
// each Bᵀ row for all rows). Always inlined into each target's wrapper, so it is compiled (and its
// vectors mapped to registers) once per ISA.
template <int kRows>
[[gnu::always_inline]] inline void forward_block(const LoraShape& s, const Padded& p, int64_t i, const float* x,
                                                 float scaling, float* xa, float* out, std::vector<float> (&buf)[kMaxXRows][2]) {
    const float* xr[kRows];
    float dots[kRows][kMaxLoraRank], sdots[kRows][kMaxLoraRank];   // the rank padded to kR: at most kMaxLoraRank
    for (int q = 0; q < kRows; ++q) xr[q] = padded_row(x + (i + q) * s.k, s.k, p.kp, buf[q][0]);
    for (int64_t j0 = 0; j0 < p.rp; j0 += kR) {
        V16 acc[kRows][kR] = {};
        const float* m = p.a.data() + j0 * p.kp;
        for (int64_t c = 0; c < p.kp; c += kV) {
            V16 v[kRows];
            for (int q = 0; q < kRows; ++q) v[q] = load(xr[q] + c);
            for (int64_t j = 0; j < kR; ++j) {
                const V16 aj = load(m + j * p.kp + c);
                for (int q = 0; q < kRows; ++q) acc[q][j] += v[q] * aj;
            }
        }
        for (int q = 0; q < kRows; ++q)
            for (int64_t j = 0; j < kR; ++j) {
                dots[q][j0 + j] = sum(acc[q][j]);
                sdots[q][j0 + j] = scaling * dots[q][j0 + j];
            }
    }
    float* o[kRows];
    for (int q = 0; q < kRows; ++q) {
        for (int64_t j = 0; j < s.rank; ++j) xa[(i + q) * s.rank + j] = dots[q][j];
        o[q] = out + (i + q) * s.n;
        if (s.n != p.np) {
            buf[q][1].assign(size_t(p.np), 0.0f);
            std::memcpy(buf[q][1].data(), o[q], size_t(s.n) * 4);
            o[q] = buf[q][1].data();
        }
    }
    for (int64_t c = 0; c < p.np; c += kV) {
        V16 acc[kRows];
        for (int q = 0; q < kRows; ++q) acc[q] = load(o[q] + c);
        for (int64_t j = p.rank_lo(c); j < p.rank_hi(c); ++j) {
            const V16 bj = load(p.bt.data() + j * p.np + c);
            for (int q = 0; q < kRows; ++q) acc[q] += sdots[q][j] * bj;
        }
        for (int q = 0; q < kRows; ++q) store(o[q] + c, acc[q]);
    }
    if (s.n != p.np)
        for (int q = 0; q < kRows; ++q) std::memcpy(out + (i + q) * s.n, o[q], size_t(s.n) * 4);
}

[[gnu::always_inline]] inline void forward_rows(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                const float* b, float scaling, float* xa, float* out) {
    const Padded p(s, a, b);
    std::vector<float> buf[kMaxXRows][2];
    int64_t i = 0;
    for (; i + kDyRows <= rows; i += kDyRows) forward_block<kDyRows>(s, p, i, x, scaling, xa, out, buf);
    for (; i < rows; ++i) forward_block<1>(s, p, i, x, scaling, xa, out, buf);
}

// The backward's dy side for kRows rows: g = scaling * dy B_e (kR dot products along N per block of the
// rank, a block's own columns only when B is banded) while dBᵀ += dy ⊗ scaling * xa, one pass over dy.
template <int kRows>
[[gnu::always_inline]] inline void backward_dy(const LoraShape& s, const Padded& p, int64_t i, const float* dy,
                                               const float* xa, float scaling, float* dbt, float (*g)[kMaxLoraRank],
                                               std::vector<float> (&buf)[kMaxXRows][3]) {
    const float* dyr[kRows];
    float sxa[kRows][kMaxLoraRank];
    for (int q = 0; q < kRows; ++q) {
        dyr[q] = padded_row(dy + (i + q) * s.n, s.n, p.np, buf[q][0]);
        for (int64_t j = 0; j < p.rp; ++j) sxa[q][j] = j < s.rank ? scaling * xa[(i + q) * s.rank + j] : 0.0f;
    }
    for (int64_t j0 = 0; j0 < p.rp; j0 += kR) {
        V16 acc[kRows][kR] = {};
        float* dbj = dbt + j0 * p.np;
        const float* btj = p.bt.data() + j0 * p.np;
        for (int64_t c = p.col_lo(j0); c < p.col_hi(j0); c += kV) {
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
}

// The backward's x side for kRows rows: dx = g A_e (written, or added to dx) while dA += g ⊗ x, one
// pass over x and dx and one over A and dA for all kRows rows.
template <int kRows>
[[gnu::always_inline]] inline void backward_x(const LoraShape& s, const Padded& p, int64_t i, const float* x,
                                              const float (*g)[kMaxLoraRank], float* dx, float* dap,
                                              std::vector<float> (&buf)[kMaxXRows][3], bool accumulate_dx) {
    const float* xr[kRows];
    for (int q = 0; q < kRows; ++q) xr[q] = padded_row(x + (i + q) * s.k, s.k, p.kp, buf[q][1]);
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
    for (int q = 0; q < kRows; ++q) {
        float* dxq = dx + (i + q) * s.k;
        if (!accumulate_dx) {
            std::memcpy(dxq, buf[q][2].data(), size_t(s.k) * 4);
            continue;
        }
        const float* add = buf[q][2].data();
        int64_t c = 0;
        for (; c + kV <= s.k; c += kV) store(dxq + c, load(dxq + c) + load(add + c));
        for (; c < s.k; ++c) dxq[c] += add[c];
    }
}

// One expert's backward: the dy side for pairs of rows, the x side for groups of kXRows (8 where
// AVX-512's 32 registers hold their 2 x 8 vectors, 4 with 16); dA and dBᵀ accumulate in the padded
// layouts and are copied out at the end.
template <int kXRows>
[[gnu::always_inline]] inline void backward_rows(const LoraShape& s, int64_t rows, const float* dy, const float* x,
                                                 const float* xa, const float* a, const float* b, float scaling,
                                                 float* dx, float* da, float* db, bool accumulate_dx) {
    const Padded p(s, a, b);
    std::vector<float> dap(size_t(p.rp * p.kp), 0.0f), dbt(size_t(p.rp * p.np), 0.0f);
    std::vector<float> buf[kMaxXRows][3];
    for (auto& q : buf) q[2].resize(size_t(p.kp));
    float g[kMaxXRows][kMaxLoraRank];
    int64_t i = 0;
    for (; i + kXRows <= rows; i += kXRows) {
        for (int q = 0; q < kXRows; q += kDyRows) backward_dy<kDyRows>(s, p, i + q, dy, xa, scaling, dbt.data(), g + q, buf);
        backward_x<kXRows>(s, p, i, x, g, dx, dap.data(), buf, accumulate_dx);
    }
    for (; i < rows; ++i) {
        backward_dy<1>(s, p, i, dy, xa, scaling, dbt.data(), g, buf);
        backward_x<1>(s, p, i, x, g, dx, dap.data(), buf, accumulate_dx);
    }
    for (int64_t j = 0; j < s.rank; ++j) {
        std::memcpy(da + j * s.k, dap.data() + j * p.kp, size_t(s.k) * 4);
        const int64_t q = j / p.rb;
        for (int64_t n = q * p.nb; n < (q + 1) * p.nb; ++n) db[n * p.rb + j - q * p.rb] = dbt[size_t(j * p.np + n)];
    }
}

using ForwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, float, float*, float*);
using BackwardFn = void (*)(const LoraShape&, int64_t, const float*, const float*, const float*, const float*,
                            const float*, float, float*, float*, float*, bool);

void forward_baseline(const LoraShape& s, int64_t rows, const float* x, const float* a, const float* b, float scaling,
                      float* xa, float* out) {
    forward_rows(s, rows, x, a, b, scaling, xa, out);
}
void backward_baseline(const LoraShape& s, int64_t rows, const float* dy, const float* x, const float* xa,
                       const float* a, const float* b, float scaling, float* dx, float* da, float* db, bool acc) {
    backward_rows<4>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void forward_avx2(const LoraShape& s, int64_t rows, const float* x, const float* a,
                                                      const float* b, float scaling, float* xa, float* out) {
    forward_rows(s, rows, x, a, b, scaling, xa, out);
}
__attribute__((target("avx2,fma"))) void backward_avx2(const LoraShape& s, int64_t rows, const float* dy,
                                                       const float* x, const float* xa, const float* a, const float* b,
                                                       float scaling, float* dx, float* da, float* db, bool acc) {
    backward_rows<4>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
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
                                                                         float* da, float* db, bool acc) {
    backward_rows<8>(s, rows, dy, x, xa, a, b, scaling, dx, da, db, acc);
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
        if (n)
            fn(s, n, x + r0 * s.k, a + e * s.rank * s.k, b + e * s.n * (s.rank / s.blocks), scaling, xa + r0 * s.rank,
               out + r0 * s.n);
    });
}

void grouped_lora_backward(const LoraShape& s, const int64_t* counts, const float* dy, const float* x, const float* xa,
                           const float* a, const float* b, float scaling, float* dx, float* da, float* db,
                           bool accumulate_dx) {
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
        const int64_t b_size = s.n * (s.rank / s.blocks);
        float* dbe = db + e * b_size;
        if (!n) {
            std::fill(dae, dae + s.rank * s.k, 0.0f);
            std::fill(dbe, dbe + b_size, 0.0f);
            return;
        }
        fn(s, n, dy + r0 * s.n, x + r0 * s.k, xa + r0 * s.rank, a + e * s.rank * s.k, b + e * b_size, scaling,
           dx + r0 * s.k, dae, dbe, accumulate_dx);
    });
}

}  // namespace kt
