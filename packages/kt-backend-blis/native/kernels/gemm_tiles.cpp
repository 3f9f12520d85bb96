// Tile kernels on BLIS sgemm (gemm_tiles.h). Per task: widen the block's gate and up panels (or
// down panels) into one f32 matrix B [K, width] of a thread's scratch, C = A · B with BLIS on this
// thread only, then the gated activation (gate/up) or the copy into the output columns (down).
// A panel is widened once per task and reused for every row of the expert, so the widening costs
// K x 16 conversions against 2 x rows x K x 16 flops of GEMM: the more rows, the smaller its share,
// which is why BLIS serves only batches with many rows per expert (crossover.h).
#include "gemm_tiles.h"

#include <blis.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include <kt/formats/packed_layouts.h>

namespace KT_TARGET_NAMESPACE {
namespace {

namespace L = kt::layouts;
using kt_blis::Method;
constexpr int kPanel = L::kPanel;

float bits_to_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// --- widening: one panel of K rows into dst[k * ldb + lane], lane < 16 ---------------------

// "kt-bf16-p16k2-v1": 64-byte chunk j holds the (2j, 2j + 1) bf16 pair of each lane.
void widen_bf16(const uint8_t* panel, int64_t K, float* dst, int64_t ldb) {
    for (int64_t j = 0; 2 * j < K; ++j) {
        uint32_t w[kPanel];
        std::memcpy(w, panel + size_t(j) * 64, 64);
        float* even = dst + 2 * j * ldb;
        for (int l = 0; l < kPanel; ++l) even[l] = bits_to_float(w[l] << 16);
        if (2 * j + 1 < K) {
            float* odd = even + ldb;
            for (int l = 0; l < kPanel; ++l) odd[l] = bits_to_float(w[l] & 0xffff0000u);
        }
    }
}

// "kt-int8-p16k4-v1": scales in the header, chunk j holds codes k = 4j..4j+3 of each lane.
void widen_int8(const uint8_t* panel, int64_t K, float* dst, int64_t ldb) {
    float s[kPanel];
    std::memcpy(s, panel, sizeof(s));
    for (int64_t j = 0; 4 * j < K; ++j) {
        const auto* q = reinterpret_cast<const int8_t*>(panel + L::int8::kHeaderBytes + size_t(j) * 64);
        for (int b = 0; b < 4 && 4 * j + b < K; ++b) {
            float* row = dst + (4 * j + b) * ldb;
            for (int l = 0; l < kPanel; ++l) row[l] = s[l] * float(q[l * 4 + b]);
        }
    }
}

// "kt-int4-p16-v2", "kt-rawint4-p16-v1" and "kt-mxfp4-p16-v2": per group a header and g / 8
// chunks; byte lane * 4 + b of chunk c holds u[8c + b] (low nibble) and u[8c + 4 + b] (high).
// value[u] maps a code to the integer the scale multiplies (INT4: u - 8, MXFP4: 2 * E2M1).
void widen_int4(const L::int4::Geometry& geo, const float* value, const uint8_t* panel, int64_t K, float* dst,
                int64_t ldb) {
    for (int64_t g0 = 0; g0 < K; g0 += geo.g) {
        const uint8_t* header = panel + size_t(g0 / geo.g) * geo.group_bytes();
        float s[kPanel], sz[kPanel] = {};
        for (int l = 0; l < kPanel; ++l) s[l] = geo.scale(panel, g0, l);
        if (geo.zero_point) std::memcpy(sz, header + 64, sizeof(sz));
        const uint8_t* codes = header + geo.header_bytes();
        for (int64_t c = 0; c < geo.g / 8; ++c) {
            const uint8_t* chunk = codes + size_t(c) * 64;
            for (int b = 0; b < 4; ++b) {
                float* lo = dst + (g0 + 8 * c + b) * ldb;
                float* hi = lo + 4 * ldb;
                for (int l = 0; l < kPanel; ++l) {
                    const uint8_t byte = chunk[l * 4 + b];
                    lo[l] = s[l] * value[byte & 15] - sz[l];
                    hi[l] = s[l] * value[byte >> 4] - sz[l];
                }
            }
        }
    }
}

// "kt-fp8-p16-v1" / "-v2": one f32[16] scale vector per 128 k, then the E4M3 codes (rows of 16,
// or quads in vdpbf16ps's pair order), each code's value / 256 from a table.
struct Fp8Table {
    float v[256];
    Fp8Table() {
        for (int c = 0; c < 256; ++c) v[c] = L::fp8::e4m3_over_256(uint8_t(c));
    }
};
const Fp8Table kFp8;

void widen_fp8(const uint8_t* panel, int64_t K, float* dst, int64_t ldb) {
    const L::fp8::Geometry geo = L::fp8::geometry(KT_FP8_QUADS != 0);
    const uint8_t* codes = panel + geo.codes_at(K);
    for (int64_t k = 0; k < K; ++k) {
        float s[kPanel];
        std::memcpy(s, panel + size_t(k / L::fp8::kBlock) * L::fp8::kScaleBytes, sizeof(s));
        float* row = dst + k * ldb;
        for (int l = 0; l < kPanel; ++l) row[l] = s[l] * kFp8.v[codes[geo.code_offset(k, l)]];
    }
}

// --- one method: its layout geometry and widener ------------------------------------------

struct Format {
    L::ExpertPanels panels;
    Method method;
    L::int4::Geometry int4{};
    const float* values = nullptr;   // the INT4-family code values

    void widen(const uint8_t* panel, int64_t K, float* dst, int64_t ldb) const {
        switch (method) {
        case Method::kBf16: return widen_bf16(panel, K, dst, ldb);
        case Method::kInt8: return widen_int8(panel, K, dst, ldb);
        case Method::kFp8:
        case Method::kFp8PerChannel: return widen_fp8(panel, K, dst, ldb);
        default: return widen_int4(int4, values, panel, K, dst, ldb);
        }
    }
};

constexpr float kInt4Values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
constexpr float kInt4ZeroPointValues[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
struct Mxfp4Values {
    float v[16];
    Mxfp4Values() {
        for (int c = 0; c < 16; ++c) v[c] = float(int(L::mxfp4::kDoubledPlusOffset[c]) - L::mxfp4::kOffset);
    }
};
const Mxfp4Values kMxfp4;

Format format(Method m, const kt_moe_config* c) {
    Format f{};
    f.method = m;
    const int64_t H = c->hidden, I = c->intermediate;
    const bool zp = (c->quant_flags & KT_QUANT_ZERO_POINT) != 0;
    switch (m) {
    case Method::kBf16: f.panels = L::bf16::expert(H, I); break;
    case Method::kInt8: f.panels = L::int8::expert(H, I); break;
    case Method::kFp8:
    case Method::kFp8PerChannel: f.panels = L::fp8::geometry(KT_FP8_QUADS != 0).expert(H, I); break;
    case Method::kMxfp4:
        f.int4 = L::mxfp4::geometry();
        f.values = kMxfp4.v;
        f.panels = f.int4.expert(H, I);
        break;
    default:
        f.int4 = L::int4::geometry(m == Method::kRawInt4, c->group_size == 0 ? 128 : c->group_size, zp);
        f.values = f.int4.zero_point ? kInt4ZeroPointValues : kInt4Values;
        f.panels = f.int4.expert(H, I);
        break;
    }
    return f;
}

// --- the gated activation (kt/plugin.h, ABI 1.2) --------------------------------------------

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

// --- scratch and the GEMM ------------------------------------------------------------------

struct Scratch {
    std::vector<float> b, c;
};
thread_local Scratch t_scratch;

// C[m, n] = A[m, k] · B[k, n], row-major, on the calling thread only: BLIS's own threading
// stays off (one thread pool per process, kt-core's).
void sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
           int64_t ldc) {
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, dim_t(m), dim_t(n), dim_t(k), &one, const_cast<float*>(a),
                 inc_t(lda), 1, const_cast<float*>(b), inc_t(ldb), 1, &zero, c, inc_t(ldc), 1, nullptr, &rntm);
}

// Columns [n0, n1) of gate and of up for every row, in t_scratch.c: row m's gate product of column
// n0 + j at c[m * 2 * width + j], its up product at c[m * 2 * width + width + j] (width: whole panels).
template <Method M>
kt_status gate_up_products(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, int64_t& width) {
    if (n0 % kPanel) return fail(KT_ERROR_INVALID_ARGUMENT, "blis %s gate/up: block start %lld is not a multiple of 16",
                                 kt_blis::kMethodNames[M], (long long)n0);
    const Format f = format(M, c);
    const int64_t K = c->hidden, panels = (n1 - n0 + kPanel - 1) / kPanel;
    width = panels * kPanel;
    const auto* base = static_cast<const uint8_t*>(packed);
    Scratch& s = t_scratch;
    s.b.resize(size_t(K * 2 * width));
    for (int64_t i = 0; i < panels; ++i) {
        const int64_t p = n0 / kPanel + i;
        f.widen(base + f.panels.gate(p), K, s.b.data() + i * kPanel, 2 * width);
        f.widen(base + f.panels.up(p), K, s.b.data() + width + i * kPanel, 2 * width);
    }
    s.c.resize(size_t(rows * 2 * width));
    sgemm(rows, 2 * width, K, static_cast<const float*>(act), K, s.b.data(), 2 * width, s.c.data(), 2 * width);
    return KT_OK;
}

template <Method M>
kt_status gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ldo) {
    int64_t width = 0;
    if (const kt_status st = gate_up_products<M>(c, packed, act, rows, n0, n1, width)) return st;
    const Gate gate(c);
    for (int64_t m = 0; m < rows; ++m) {
        const float* g = t_scratch.c.data() + m * 2 * width;
        float* o = out + m * ldo + n0;
        for (int64_t j = 0; j < n1 - n0; ++j) o[j] = gate(g[j], g[width + j]);
    }
    return KT_OK;
}

// Plugin ABI 1.4's raw tile: the same products as they are (column n at n - n0), for the
// activations kt-core applies itself (expert biases, the limit after SiLU, GELU-tanh).
template <Method M>
kt_status gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out_gate, float* out_up, int64_t ldo) {
    int64_t width = 0;
    if (const kt_status st = gate_up_products<M>(c, packed, act, rows, n0, n1, width)) return st;
    for (int64_t m = 0; m < rows; ++m) {
        const float* g = t_scratch.c.data() + m * 2 * width;
        std::memcpy(out_gate + m * ldo, g, size_t(n1 - n0) * 4);
        std::memcpy(out_up + m * ldo, g + width, size_t(n1 - n0) * 4);
    }
    return KT_OK;
}

template <Method M>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    if (n0 % kPanel) return fail(KT_ERROR_INVALID_ARGUMENT, "blis %s down: block start %lld is not a multiple of 16",
                                 kt_blis::kMethodNames[M], (long long)n0);
    const Format f = format(M, c);
    const int64_t K = c->intermediate, panels = (n1 - n0 + kPanel - 1) / kPanel, width = panels * kPanel;
    const auto* base = static_cast<const uint8_t*>(packed);
    Scratch& s = t_scratch;
    s.b.resize(size_t(K * width));
    for (int64_t i = 0; i < panels; ++i)
        f.widen(base + f.panels.down(n0 / kPanel + i), K, s.b.data() + i * kPanel, width);
    if (width == n1 - n0) {   // whole panels: straight into the output columns
        sgemm(rows, width, K, static_cast<const float*>(act), K, s.b.data(), width, out + n0, ldo);
        return KT_OK;
    }
    s.c.resize(size_t(rows * width));
    sgemm(rows, width, K, static_cast<const float*>(act), K, s.b.data(), width, s.c.data(), width);
    for (int64_t m = 0; m < rows; ++m) std::memcpy(out + m * ldo + n0, s.c.data() + m * width, size_t(n1 - n0) * 4);
    return KT_OK;
}

// Activations stay exact: f32 rows (bf16 input widened), so BLIS's accuracy is the f32 GEMM's.
size_t row_bytes(int64_t k) { return size_t(k) * 4; }

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    auto* o = static_cast<float*>(out);
    if (dtype == KT_DTYPE_F32) {
        for (int64_t r = 0; r < rows; ++r) std::memcpy(o + r * k, static_cast<const float*>(in) + r * stride, size_t(k) * 4);
        return KT_OK;
    }
    if (dtype == KT_DTYPE_BF16) {
        for (int64_t r = 0; r < rows; ++r) {
            const auto* h = static_cast<const uint16_t*>(in) + r * stride;
            for (int64_t i = 0; i < k; ++i) o[r * k + i] = bits_to_float(uint32_t(h[i]) << 16);
        }
        return KT_OK;
    }
    return fail(KT_ERROR_UNSUPPORTED, "blis: activations must be float32 or bfloat16 (kt_dtype %d given)", int(dtype));
}

template <Method M>
int declines(const kt_moe_config* c, int64_t tokens) {
    const int64_t min_rows = kt_blis::g_min_rows[M];
    if (min_rows == kt_blis::kNever) return 1;
    return tokens * c->top_k < min_rows * c->num_experts;   // fewer rows per expert than the crossover
}

template <Method M>
kt_method_kernels table(const char* layout_id, const char* kernel_id) {
    kt_method_kernels m{};
    m.struct_size = sizeof(kt_method_kernels);
    m.method = kt_blis::kMethodNames[M];
    m.layout_id = layout_id;
    m.kernel_id = kernel_id;
    // Output columns per task: each sgemm call packs A (rows x K) once for this many columns of
    // work (gate/up: twice this many), so wider blocks pay less packing per flop.
    m.gate_up_block = kBlock;
    m.down_block = kBlock;
    m.declines = declines<M>;
    m.packed_expert_bytes = nullptr;   // kt-backend-avx packs (plugin ABI 1.3)
    m.pack_expert = nullptr;
    m.activation_row_bytes = row_bytes;
    m.quantize_activations = quantize;
    m.gate_up_tile = gate_up<M>;
    m.down_tile = down<M>;
    m.gate_up_raw_tile = gate_up_raw<M>;   // ABI 1.4
    m.activations = KT_ACTIVATION_SWIGLU;
    return m;
}

}  // namespace

const kt_host_api* g_host = nullptr;

kt_status fail(kt_status status, const char* fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(message, sizeof(message), fmt, args);
    va_end(args);
    if (g_host) g_host->set_error(message);
    return status;
}

kt_method_kernels gemm_method(Method method, const char* layout_id, const char* kernel_id) {
    switch (method) {
    case Method::kBf16: return table<Method::kBf16>(layout_id, kernel_id);
    case Method::kInt8: return table<Method::kInt8>(layout_id, kernel_id);
    case Method::kInt4: return table<Method::kInt4>(layout_id, kernel_id);
    case Method::kRawInt4: return table<Method::kRawInt4>(layout_id, kernel_id);
    case Method::kFp8: return table<Method::kFp8>(layout_id, kernel_id);
    case Method::kFp8PerChannel: return table<Method::kFp8PerChannel>(layout_id, kernel_id);
    case Method::kMxfp4: return table<Method::kMxfp4>(layout_id, kernel_id);
    default: return table<Method::kGptqInt4>(layout_id, kernel_id);
    }
}

}  // namespace KT_TARGET_NAMESPACE
