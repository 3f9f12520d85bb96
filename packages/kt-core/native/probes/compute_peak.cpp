// Compiled for the baseline ISA like the rest of kt-core: each loop carries its ISA in a target
// attribute and runs only after host detection has found that ISA (host_has_feature), so a
// host without it never executes one of its instructions.
#include "probes/compute_peak.h"

#include "abi/host_api.h"
#include "pool/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>

namespace kt {
namespace {

// Twelve accumulators: enough independent chains to cover a 4-cycle latency on two pipes.
constexpr int kChains = 12;

#if defined(__x86_64__)

// Each loop returns multiply-adds done; the accumulators are summed into `sink` so the
// compiler keeps them.
__attribute__((target("avx2,fma"))) int64_t fma_avx2(int64_t iters, float* sink) {
    __m256 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(float(c));
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __m256 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm256_add_ps(s, acc[c]);
    *sink += _mm256_cvtss_f32(s);
    return iters * kChains * 8;
}

__attribute__((target("avx512f"))) int64_t fma_avx512(int64_t iters, float* sink) {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(float(c));
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
    *sink += _mm512_reduce_add_ps(s);
    return iters * kChains * 16;
}

__attribute__((target("avx512f,avx512bf16"))) int64_t bf16_dot(int64_t iters, float* sink) {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);  // 1.0, ~1e-3
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
    *sink += _mm512_reduce_add_ps(s);
    return iters * kChains * 32;   // 16 lanes, a pair of products each
}

__attribute__((target("avx512f,avx512vnni"))) int64_t int8_dot_vnni(int64_t iters, float* sink) {
    __m512i acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_si512();
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    __m512i s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm512_add_epi32(s, acc[c]);
    *sink += float(_mm512_reduce_add_epi32(s));
    return iters * kChains * 64;   // 16 lanes, four products each
}

// Without VNNI an int8 dot is vpmaddubsw (pairs into int16) then vpmaddwd (into int32): two
// instructions per 32 products at 256 bits, as kt-backend-avx's x86-64-v3 kernels do it.
__attribute__((target("avx2"))) int64_t int8_dot_avx2(int64_t iters, float* sink) {
    __m256i acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_setzero_si256();
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c)
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
    __m256i s = acc[0];
    for (int c = 1; c < kChains; ++c) s = _mm256_add_epi32(s, acc[c]);
    *sink += float(_mm256_extract_epi32(s, 0));
    return iters * kChains * 32;
}

#elif defined(__aarch64__)

// NEON is part of the aarch64 baseline: 4 f32 lanes per fused multiply-add.
int64_t fma_neon(int64_t iters, float* sink) {
    float32x4_t acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_f32(float(c));
    const float32x4_t a = vdupq_n_f32(0.999f), b = vdupq_n_f32(1e-3f);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = vfmaq_f32(b, acc[c], a);
    float32x4_t s = acc[0];
    for (int c = 1; c < kChains; ++c) s = vaddq_f32(s, acc[c]);
    *sink += vaddvq_f32(s);
    return iters * kChains * 4;
}

// ARMv8.2 dot product (asimddp): sdot, four int8 products into each of 4 int32 lanes.
__attribute__((target("arch=armv8.2-a+dotprod"))) int64_t int8_dot_sdot(int64_t iters, float* sink) {
    int32x4_t acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_s32(0);
    const int8x16_t a = vdupq_n_s8(3), b = vdupq_n_s8(-2);
    for (int64_t i = 0; i < iters; ++i)
        for (int c = 0; c < kChains; ++c) acc[c] = vdotq_s32(acc[c], a, b);
    int32x4_t s = acc[0];
    for (int c = 1; c < kChains; ++c) s = vaddq_s32(s, acc[c]);
    *sink += float(vaddvq_s32(s));
    return iters * kChains * 16;
}

#endif

using Loop = int64_t (*)(int64_t, float*);

// The widest loop of `kind` this host runs, or nullptr.
Loop loop_for(const std::string& kind) {
#if defined(__x86_64__)
    const bool avx512 = host_has_feature("avx512f");
    if (kind == "f32_fma") {
        if (avx512) return fma_avx512;
        if (host_has_feature("avx2") && host_has_feature("fma")) return fma_avx2;
    } else if (kind == "bf16_dot") {
        if (avx512 && host_has_feature("avx512_bf16")) return bf16_dot;
    } else if (kind == "int8_dot") {
        if (avx512 && host_has_feature("avx512_vnni")) return int8_dot_vnni;
        if (host_has_feature("avx2")) return int8_dot_avx2;
    }
#elif defined(__aarch64__)
    if (kind == "f32_fma" && host_has_feature("neon")) return fma_neon;
    if (kind == "int8_dot" && host_has_feature("asimddp")) return int8_dot_sdot;
#endif
    (void)kind;
    return nullptr;
}

}  // namespace

std::vector<std::string> compute_peak_kinds() {
    std::vector<std::string> out;
    for (const char* kind : {"f32_fma", "bf16_dot", "int8_dot"})
        if (loop_for(kind)) out.push_back(kind);
    return out;
}

double compute_peak_macs(const std::string& kind, double seconds) {
    const Loop loop = loop_for(kind);
    if (!loop)
        throw std::invalid_argument("this host cannot measure '" + kind + "' (it measures: " + [] {
            std::string s;
            for (const auto& k : compute_peak_kinds()) s += (s.empty() ? "" : ", ") + k;
            return s.empty() ? std::string("none") : s;
        }() + ")");
    // Calibrate on this thread: iterations for ~1/20 of the time, then every pool thread runs
    // the same count at once; the rate is all their work over the time the last one took.
    float sink = 0.0f;
    int64_t iters = 1 << 14;
    for (;;) {
        const auto t0 = std::chrono::steady_clock::now();
        loop(iters, &sink);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s >= seconds / 20 || iters > (int64_t(1) << 40)) {
            iters = std::max<int64_t>(1, int64_t(double(iters) * seconds / std::max(s, 1e-9)));
            break;
        }
        iters *= 4;
    }
    auto& pool = global_pool();
    struct Ctx {
        Loop loop;
        int64_t iters;
        std::atomic<int64_t> macs{0};
        float sinks[256][16] = {};
    } ctx{loop, iters};
    const size_t threads = size_t(pool.num_threads());
    // The best of three: a worker woken late leaves its share to another thread, which then
    // runs two in a row and halves that round's rate; noise only ever slows a round down.
    double best = 0.0;
    for (int round = 0; round < 3; ++round) {
        ctx.macs = 0;
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(threads, [](void* c, size_t i) {
            auto* x = static_cast<Ctx*>(c);
            x->macs += x->loop(x->iters, &x->sinks[i % 256][0]);
        }, &ctx);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(ctx.macs.load()) / s);
    }
    return best;
}

}  // namespace kt
