// What every aarch64 method shares: the host table, error reporting, source matrices as f32 rows,
// the gated activation (kt/plugin.h ABI 1.2) and the walk over a tile's 16-channel panels.
// Compiled once per target (KT_TARGET_NAMESPACE, -march flags of targets.json).
#pragma once
#include <kt/formats/packed_layouts.h>
#include <kt/plugin.h>

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "sve.h"

namespace KT_TARGET_NAMESPACE {

extern const kt_host_api* g_host;
namespace L = kt::layouts;
constexpr int kPanel = L::kPanel;

inline kt_status fail(kt_status code, const char* fmt, ...) {
    char buffer[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buffer, sizeof buffer, fmt, args);
    va_end(args);
    if (g_host) g_host->set_error(buffer);
    return code;
}

inline float bf16_to_f32(uint16_t h) { return L::bf16_bits_to_float(h); }

// Row r of a source matrix as f32 (F32, BF16 or F16 values); false for another dtype.
inline bool row_f32(const kt_matrix& m, int64_t r, float* out) {
    switch (m.dtype) {
    case KT_DTYPE_F32: std::memcpy(out, static_cast<const float*>(m.data) + r * m.row_stride, size_t(m.cols) * 4); return true;
    case KT_DTYPE_BF16: {
        const auto* h = static_cast<const uint16_t*>(m.data) + r * m.row_stride;
        for (int64_t c = 0; c < m.cols; ++c) out[c] = bf16_to_f32(h[c]);
        return true;
    }
    case KT_DTYPE_F16: {
        const auto* h = static_cast<const __fp16*>(m.data) + r * m.row_stride;
        for (int64_t c = 0; c < m.cols; ++c) out[c] = float(h[c]);
        return true;
    }
    default: return false;
    }
}

// Activation rows from the core: F32 or BF16, `stride` elements apart.
inline bool activation_row(const void* in, kt_dtype dtype, int64_t r, int64_t k, int64_t stride, float* out) {
    const kt_matrix m{in, dtype, r + 1, k, stride};
    return row_f32(m, r, out);
}

// Exact f32 activation rows (BF16 without bfdot, FP8): K floats per row.
inline size_t f32_row_bytes(int64_t k) { return size_t(k) * 4; }
inline kt_status quantize_f32_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    for (int64_t r = 0; r < rows; ++r)
        if (!activation_row(in, dtype, r, k, stride, static_cast<float*>(out) + r * k))
            return fail(KT_ERROR_UNSUPPORTED, "kml: activations must be float32 or bfloat16 (kt_dtype %d)", int(dtype));
    return KT_OK;
}

// Whether the target has BF16's dot products (bfdot / bfmmla): BF16's activation rows and kernels.
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
constexpr bool kBf16Dot = true;
#else
constexpr bool kBf16Dot = false;
#endif

// SiLU(gate) * up, or the clamped SwiGLU a layer asks for.
struct Gate {
    float limit = 0.0f, alpha = 0.0f;
    explicit Gate(const kt_moe_config* c) {
        if (KT_HAS_FIELD(c, kt_moe_config, swiglu_alpha)) limit = c->swiglu_limit, alpha = c->swiglu_alpha;
    }
    float operator()(float g, float u) const {
        if (limit > 0.0f) {
            g = std::min(g, limit);
            u = std::clamp(u, -limit, limit);
        }
        if (alpha > 0.0f) return g * (u + 1.0f) / (1.0f + std::exp(-alpha * g));
        return g * u / (1.0f + std::exp(-g));
    }
};

// The three matrices of an expert in the order of kt_expert_weights, with where their panels go.
struct Part {
    const kt_weight* w;
    int64_t rows, cols;
    int which;   // 0 gate, 1 up, 2 down
};
inline size_t panel_at(const L::ExpertPanels& l, int which, int64_t p) {
    return which == 0 ? l.gate(p) : which == 1 ? l.up(p) : l.down(p);
}

// The tile walk every method shares: for each 16-channel panel in [n0, n1) and each of `rows`
// activation rows (`row_bytes` apart), dot(panel, row, K, out16) gives the panel's 16 outputs. A
// method with a two-row kernel (the ARMv8.6 `smmla` ones: a 2 x 8 by 8 x 2 integer product per
// instruction) passes it as `pair`, pair(panel, row0, row1, K, out[2][16]): rows go through it two
// at a time, an odd last row through dot.
struct NoPair {};

// The gate/up walk: put(row, column, gate, up) for every activation row and column in [n0, n1).
template <class Put, class Dot, class Pair = NoPair>
void gate_up_walk(const kt_moe_config* c, const L::ExpertPanels& l, const void* packed, const void* act, size_t row_bytes,
                  int64_t rows, int64_t n0, int64_t n1, Put put, Dot dot, Pair pair = {}) {
    const auto* base = static_cast<const uint8_t*>(packed);
    for (int64_t p = n0 / kPanel; p * kPanel < n1; ++p) {
        const int lanes = int(std::min<int64_t>(kPanel, n1 - p * kPanel));
        int64_t m = 0;
        if constexpr (!std::is_same_v<Pair, NoPair>)
            for (; m + 2 <= rows; m += 2) {
                const auto* r0 = static_cast<const uint8_t*>(act) + size_t(m) * row_bytes;
                float g[2][16], u[2][16];
                pair(base + l.gate(p), r0, r0 + row_bytes, c->hidden, g);
                pair(base + l.up(p), r0, r0 + row_bytes, c->hidden, u);
                for (int r = 0; r < 2; ++r)
                    for (int lane = 0; lane < lanes; ++lane) put(m + r, p * kPanel + lane, g[r][lane], u[r][lane]);
            }
        for (; m < rows; ++m) {
            const auto* row = static_cast<const uint8_t*>(act) + size_t(m) * row_bytes;
            float g[16], u[16];
            dot(base + l.gate(p), row, c->hidden, g);
            dot(base + l.up(p), row, c->hidden, u);
            for (int lane = 0; lane < lanes; ++lane) put(m, p * kPanel + lane, g[lane], u[lane]);
        }
    }
}

// gate_up_tile: the layer's gated activation of each pair (out's columns absolute).
template <class Dot, class Pair = NoPair>
void gate_up_panels(const kt_moe_config* c, const L::ExpertPanels& l, const void* packed, const void* act,
                    size_t row_bytes, int64_t rows, int64_t n0, int64_t n1, float* out, int64_t ldo, Dot dot, Pair pair = {}) {
    const Gate gate(c);
    gate_up_walk(c, l, packed, act, row_bytes, rows, n0, n1,
                 [&](int64_t m, int64_t n, float g, float u) { out[m * ldo + n] = gate(g, u); }, dot, pair);
}

// gate_up_raw_tile (plugin ABI 1.4): both products as they are, column n at n - n0, for what kt-core
// applies itself (expert biases, the limit after SiLU, GELU-tanh).
template <class Dot, class Pair = NoPair>
void gate_up_raw_panels(const kt_moe_config* c, const L::ExpertPanels& l, const void* packed, const void* act,
                        size_t row_bytes, int64_t rows, int64_t n0, int64_t n1, float* out_gate, float* out_up, int64_t ldo,
                        Dot dot, Pair pair = {}) {
    gate_up_walk(c, l, packed, act, row_bytes, rows, n0, n1,
                 [&](int64_t m, int64_t n, float g, float u) {
                     out_gate[m * ldo + n - n0] = g;
                     out_up[m * ldo + n - n0] = u;
                 },
                 dot, pair);
}

template <class Dot, class Pair = NoPair>
void down_panels(const kt_moe_config* c, const L::ExpertPanels& l, const void* packed, const void* act,
                 size_t row_bytes, int64_t rows, int64_t n0, int64_t n1, float* out, int64_t ldo, Dot dot, Pair pair = {}) {
    const auto* base = static_cast<const uint8_t*>(packed);
    for (int64_t p = n0 / kPanel; p * kPanel < n1; ++p) {
        const int lanes = int(std::min<int64_t>(kPanel, n1 - p * kPanel));
        int64_t m = 0;
        if constexpr (!std::is_same_v<Pair, NoPair>)
            for (; m + 2 <= rows; m += 2) {
                const auto* r0 = static_cast<const uint8_t*>(act) + size_t(m) * row_bytes;
                float s[2][16];
                pair(base + l.down(p), r0, r0 + row_bytes, c->intermediate, s);
                for (int r = 0; r < 2; ++r)
                    for (int lane = 0; lane < lanes; ++lane) out[(m + r) * ldo + p * kPanel + lane] = s[r][lane];
            }
        for (; m < rows; ++m) {
            float s[16];
            dot(base + l.down(p), static_cast<const uint8_t*>(act) + size_t(m) * row_bytes, c->intermediate, s);
            for (int lane = 0; lane < lanes; ++lane) out[m * ldo + p * kPanel + lane] = s[lane];
        }
    }
}

// The method tables (bf16.cpp, int8.cpp, int4.cpp, fp8.cpp, ggml.cpp).
kt_method_kernels bf16_kernels(const char* kernel_id);
kt_method_kernels int8_kernels(const char* kernel_id);
kt_method_kernels int4_kernels(const char* kernel_id);
kt_method_kernels rawint4_kernels(const char* kernel_id);
kt_method_kernels fp8_kernels(const char* kernel_id);
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id);
kt_method_kernels mxfp8_kernels(const char* kernel_id);
kt_method_kernels llamafile_kernels(const char* kernel_id);

inline kt_method_kernels method_table(const char* method, const char* layout_id, const char* kernel_id,
                                      size_t (*bytes)(const kt_moe_config*),
                                      kt_status (*pack)(const kt_moe_config*, const kt_expert_weights*, void*),
                                      size_t (*row_bytes)(int64_t),
                                      kt_status (*quantize)(const void*, kt_dtype, int64_t, int64_t, int64_t, void*),
                                      kt_status (*gate_up)(const kt_moe_config*, const void*, const void*, int64_t, int64_t,
                                                           int64_t, float*, int64_t),
                                      kt_status (*down)(const kt_moe_config*, const void*, const void*, int64_t, int64_t,
                                                        int64_t, float*, int64_t),
                                      kt_status (*gate_up_raw)(const kt_moe_config*, const void*, const void*, int64_t,
                                                               int64_t, int64_t, float*, float*, int64_t)) {
    kt_method_kernels m{};
    m.struct_size = sizeof(kt_method_kernels);
    m.method = method;
    m.layout_id = layout_id;
    m.kernel_id = kernel_id;
    m.gate_up_block = kPanel;
    m.down_block = kPanel;
    m.packed_expert_bytes = bytes;
    m.pack_expert = pack;
    m.activation_row_bytes = row_bytes;
    m.quantize_activations = quantize;
    m.gate_up_tile = gate_up;
    m.down_tile = down;
    m.activations = KT_ACTIVATION_SWIGLU;
    m.gate_up_raw_tile = gate_up_raw;   // ABI 1.4
    return m;
}

}  // namespace KT_TARGET_NAMESPACE
