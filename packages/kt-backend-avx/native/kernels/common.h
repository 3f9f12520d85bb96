// What every kernel file of a target shares: the host table, error reporting, reading the
// user's weight matrices, and the activation formats.
#pragma once
#include <kt/formats/checkpoint_inputs.h>
#include <kt/plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "simd.h"

namespace KT_TARGET_NAMESPACE {

extern const kt_host_api* g_host;

// What a panel kernel writes per row: one panel's 16 outputs (kSingle), the gated activation of a
// gate/up pair (kFused: gate_mul), or a pair's 32 outputs, the second panel's after the first's
// (kPair: two adjacent down panels, or a gate/up pair's raw products).
enum PanelMode { kSingle = 0, kFused = 1, kPair = 2 };

// Records a printf-style message with the host and returns `code`; never throws across the ABI.
inline kt_status fail(kt_status code, const char* fmt, ...) {
    char buffer[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buffer, sizeof buffer, fmt, args);
    va_end(args);
    if (g_host) g_host->set_error(buffer);
    return code;
}

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline int64_t panels(int64_t n) { return kt::layouts::panel_count(n); }

// dtype names, float_at and find_first: kt-core's (kt/formats/checkpoint_inputs.h), shared with kt-backend-kml.
using kt::inputs::dtype_name;
using kt::inputs::find_first;
using kt::inputs::float_at;

inline bool is_float(kt_dtype d) {
    return d == KT_DTYPE_F32 || d == KT_DTYPE_BF16 || d == KT_DTYPE_F16 || d == KT_DTYPE_F64;
}

inline float bf16_to_f32(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// One row of a floating matrix as f32 (exact for bf16/f16; f64 rounds).
inline void load_row(const kt_matrix& m, int64_t row, float* out) {
    const int64_t at = row * m.row_stride;
    switch (m.dtype) {
        case KT_DTYPE_F32: std::memcpy(out, static_cast<const float*>(m.data) + at, size_t(m.cols) * 4); break;
        case KT_DTYPE_BF16:
            for (int64_t c = 0; c < m.cols; ++c) out[c] = bf16_to_f32(static_cast<const uint16_t*>(m.data)[at + c]);
            break;
        case KT_DTYPE_F16:
            for (int64_t c = 0; c < m.cols; ++c) out[c] = f16_to_f32(static_cast<const uint16_t*>(m.data)[at + c]);
            break;
        case KT_DTYPE_F64:
            for (int64_t c = 0; c < m.cols; ++c) out[c] = float(static_cast<const double*>(m.data)[at + c]);
            break;
        default: break;
    }
}

// Checks a floating weight of the layer's shape, as every quantize-at-load method needs.
inline kt_status expect_float_weight(const kt_weight& w, int64_t rows, int64_t cols, const char* name,
                                     const char* method) {
    if (!is_float(w.values.dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s must be floating point (float32, bfloat16, float16, float64), got %s",
                    method, name, dtype_name(w.values.dtype));
    if (w.values.rows != rows || w.values.cols != cols)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s should be [%lld, %lld], got [%lld, %lld]", method, name,
                    (long long)rows, (long long)cols, (long long)w.values.rows, (long long)w.values.cols);
    if (w.scales.data || w.zeros.data)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: %s takes plain floating weights; it quantizes them itself, so "
                    "scales/zero points must not be given", method, name);
    return KT_OK;
}

// --- the gated activation -----------------------------------------------------------------

// The layer's gated activation (kt_moe_config.swiglu_limit / swiglu_alpha, kt/plugin.h): plain
// SiLU(g) * u, or the clamped SwiGLU of GPT-OSS and DeepSeek-V4. It is a layer setting that the
// fused gate/up epilogues of every method apply once per output vector, after the whole K loop;
// a thread-local set at each gate_up_tile entry (GateScope), on the thread that runs the tile,
// carries it there instead of one more argument through every method's five template layers.
struct GateActivation {
    float limit = 0.0f, alpha = 0.0f;
};
inline thread_local GateActivation t_gate;

struct GateScope {
    explicit GateScope(const kt_moe_config* c) {
        t_gate = KT_HAS_FIELD(c, kt_moe_config, swiglu_alpha) ? GateActivation{c->swiglu_limit, c->swiglu_alpha}
                                                              : GateActivation{};
    }
};

// The activation of gate g and up u: SiLU(g) * u; with a limit, g = min(g, limit) and u in
// [-limit, limit] first; with alpha, g * sigmoid(alpha g) * (u + 1) instead.
inline VF gate_mul(VF g, VF u) {
    const GateActivation a = t_gate;
    if (a.limit == 0.0f && a.alpha == 0.0f) return silu_mul(g, u);
    if (a.limit > 0.0f) {
        g = vmin(vset1(a.limit), g);
        u = vmax(vset1(-a.limit), vmin(vset1(a.limit), u));
    }
    if (a.alpha == 0.0f) return silu_mul(g, u);
    return vdiv(vmul(g, vadd(u, vset1(1.0f))), vadd(vset1(1.0f), vexp(vmul(vset1(-a.alpha), g))));
}

inline float gate_mul(float g, float u) {
    const GateActivation a = t_gate;
    if (a.limit > 0.0f) {
        g = std::min(g, a.limit);
        u = std::clamp(u, -a.limit, a.limit);
    }
    if (a.alpha > 0.0f) return g * (u + 1.0f) / (1.0f + std::exp(-a.alpha * g));
    return g * u / (1.0f + std::exp(-g));
}

// --- the expert layout every method shares ------------------------------------------------

// Gate and up panels alternate, then the down panels (kt::layouts::ExpertPanels).
using kt::layouts::ExpertPanels;

// --- tile plumbing shared by every method ------------------------------------------------

// Runs block.template operator()<MR>(row) for row blocks of MR, then the remainder through
// ceil(MR/2), ceil(MR/4), ..., 1 (so 2 rows left of MR = 3 run as one block of 2, not two of 1):
// about log2(MR) more instantiations of each microkernel. Blocks must
// capture by value: a by-reference closure inlined into a microkernel made GCC reload its
// sizes inside the hot loop (INT4 prefill a third slower).
template <int MR, class Block>
void for_row_blocks(int64_t rows, const Block& block, int64_t first = 0) {
    int64_t r = 0;
    for (; r + MR <= rows; r += MR) block.template operator()<MR>(first + r);
    if constexpr (MR > 1)
        if (r < rows) for_row_blocks<(MR + 1) / 2>(rows - r, block, first + r);
}

// Gate/up tiles of decode-sized batches (rows <= kMaxRows): the one-matrix kernel
// over gate panel p, then over up panel p, which follows it in the layout, so the tile reads its
// bytes as one forward stream. The fused kernel streams both panels at once, two streams a panel
// apart, which the hardware prefetchers follow worse: a core then waits on DRAM more, most where
// the kernel has the most arithmetic per byte (BF16 gains nothing and keeps the fused kernel).
// With more rows the fused kernel's shared activation loads win (figures: docs/performance.md).
// `plain(panel, out)` runs the one-matrix kernel on all `rows`, kPanel outputs per row.
template <int64_t kMaxRows, class Plain>
void gate_up_in_order(int64_t rows, const uint8_t* gate, const uint8_t* up, size_t panel_stride, int64_t n0, int64_t n1,
                      float* out, int64_t ldo, const Plain& plain) {
    alignas(64) float g[kMaxRows * kPanel], u[kMaxRows * kPanel];
    for (int64_t n = n0; n < n1; n += kPanel) {
        const size_t at = size_t((n - n0) / kPanel) * panel_stride;
        plain(gate + at, g);
        plain(up + at, u);
        const int cols = int(std::min<int64_t>(kPanel, n1 - n));
        for (int64_t r = 0; r < rows; ++r)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                const int left = std::min(kLanes, cols - v * kLanes);
                if (left > 0)
                    vstore_partial(out + r * ldo + n + v * kLanes,
                                   gate_mul(vload(g + r * kPanel + v * kLanes), vload(u + r * kPanel + v * kLanes)), left);
            }
    }
}

// gate_up_raw_tile through a method's pair kernel, pair(gate panel, up panel, both): a gate/up
// panel pair's rows as [gate 16 | up 16] (kPair, row stride 2 * kPanel) into a tile-local buffer
// — one pass over the activations for both panels, each broadcast feeding both — then copied into
// the two outputs (column n at n - n0).
template <class Pair>
void gate_up_raw_pairs(const ExpertPanels& l, const uint8_t* base, int64_t rows, int64_t n0, int64_t n1, float* out_gate,
                       float* out_up, int64_t ldo, const Pair& pair) {
    thread_local std::vector<float> both;   // grow-only, per pool thread
    if (both.size() < size_t(rows) * 2 * kPanel) both.resize(size_t(rows) * 2 * kPanel);
    for (int64_t n = n0; n < n1; n += kPanel) {
        const int64_t cols = std::min<int64_t>(kPanel, n1 - n);
        pair(base + l.gate(n / kPanel), base + l.up(n / kPanel), both.data());
        for (int64_t r = 0; r < rows; ++r) {
            std::copy_n(both.data() + r * 2 * kPanel, cols, out_gate + r * ldo + (n - n0));
            std::copy_n(both.data() + r * 2 * kPanel + kPanel, cols, out_up + r * ldo + (n - n0));
        }
    }
}

// Plugin ABI 1.4's gate_up_raw_tile from a method's one-panel kernel, plain(panel, out, ldo,
// cols): every 16-column panel of gate, then of up, written straight into the tile-local
// outputs (column n at n - n0). The core adds expert biases and the activation itself.
template <class Plain>
void gate_up_raw(const ExpertPanels& l, const uint8_t* base, int64_t n0, int64_t n1, float* out_gate, float* out_up,
                 int64_t ldo, const Plain& plain) {
    for (int64_t n = n0; n < n1; n += kPanel) {
        const int cols = int(std::min<int64_t>(kPanel, n1 - n));
        plain(base + l.gate(n / kPanel), out_gate + (n - n0), ldo, cols);
        plain(base + l.up(n / kPanel), out_up + (n - n0), ldo, cols);
    }
}

// Down tiles two panels at a time where the kernel has a pair mode (one pass over the rows gives 32
// outputs): pair(n, cols) for columns [n, n + cols), cols <= 2 * kPanel, then single(n, cols) for
// a last lone panel.
template <class Pair, class Single>
void down_panel_pairs(int64_t n0, int64_t n1, const Pair& pair, const Single& single) {
    int64_t n = n0;
    for (; n + kPanel < n1; n += 2 * kPanel) pair(n, int(std::min<int64_t>(2 * kPanel, n1 - n)));
    if (n < n1) single(n, int(n1 - n));
}

// How a decode-sized tile prefetches the weight stream it reads, once per 64-byte line: into L2
// 16 KiB ahead, and from there into L1 kL1Ahead bytes ahead (FP8 8 KiB, INT4 / RAWINT4 and
// LLAMAFILE's 4-bit types 4 KiB). FP8's and INT4's decode loops do enough per line that the
// hardware prefetchers do not keep one core's share of DRAM in flight, and a prefetch only 2 KiB
// ahead into L1 caps a core near 2 KiB per DRAM latency. INT8's lighter loop streams on the
// hardware prefetch (a software prefetch slowed it), so INT8, BF16 and LLAMAFILE's 2- and 8-bit
// types do without. The distances were chosen by call-by-call A/B runs; their figures are in
// docs/performance.md (its decode prefetch section).
constexpr size_t kDecodePrefetchL2 = 16384;
template <size_t kL1Ahead>
inline void prefetch_decode_stream(const void* line) {
    _mm_prefetch(static_cast<const char*>(line) + kL1Ahead, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(line) + kDecodePrefetchL2, _MM_HINT_T1);
}

// Prefetches `bytes` from `p` into L2, spread over `steps` calls of step(). Prefill tiles give it
// the next panel (pair) while the current panel's first row block computes, so that the next
// panel's first row block (FP8: its widening) does not wait on DRAM. Kernels take it behind a
// template flag, so the other row blocks' inner loops do not even test it (left in, the test cost
// BF16's register-bound down kernel ~30 %). Paired A/B (a runtime switch between the prefetching
// and the plain first block), Qwen3-30B-A3B layer, 256 tokens, 2 threads: FP8 1.18x, INT8 1.10x,
// INT4 1.06x; BF16 0.96x, so BF16 does not use it.
class PrefetchAhead {
public:
    PrefetchAhead() = default;
    PrefetchAhead(const uint8_t* p, size_t bytes, int64_t steps)
        : at_(p), end_(p + bytes), lines_(int64_t(bytes / 64) / std::max<int64_t>(1, steps) + 1) {}
    void step() {
        for (int64_t i = 0; i < lines_ && at_ < end_; ++i, at_ += 64) _mm_prefetch(reinterpret_cast<const char*>(at_), _MM_HINT_T1);
    }

private:
    const uint8_t* at_ = nullptr;
    const uint8_t* end_ = nullptr;
    int64_t lines_ = 0;
};

// The layer asked for one activation pass (KT_QUANT_FAST_ACTIVATIONS): one int8 plane for the
// integer kernels, bf16 without the low half for the split-bf16 ones.
inline bool one_activation_pass(const kt_moe_config* c) { return (c->quant_flags & KT_QUANT_FAST_ACTIVATIONS) != 0; }

// The core hands tiles that start on a panel and stay inside the matrix; say so if not.
inline kt_status check_tile(const char* method, const char* which, int64_t n0, int64_t n1, int64_t n) {
    if (n0 % kPanel == 0 && n0 < n1 && n1 <= n) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, "%s %s tile [%lld, %lld) is not panel-aligned within [0, %lld)", method, which,
                (long long)n0, (long long)n1, (long long)n);
}

using PackedBytesFn = size_t (*)(const kt_moe_config*);
using PackFn = kt_status (*)(const kt_moe_config*, const kt_expert_weights*, void*);
using RowBytesFn = size_t (*)(int64_t);
using QuantizeFn = kt_status (*)(const void*, kt_dtype, int64_t, int64_t, int64_t, void*);
using TileFn = kt_status (*)(const kt_moe_config*, const void*, const void*, int64_t, int64_t, int64_t, float*, int64_t);

// A method's kernel table: every method here tiles in whole panels.
using RawTileFn = decltype(kt_method_kernels::gate_up_raw_tile);
inline kt_method_kernels method_table(const char* method, const char* layout_id, const char* kernel_id,
                                      PackedBytesFn packed_bytes, PackFn pack, RowBytesFn row_bytes, QuantizeFn quantize,
                                      TileFn gate_up, TileFn down, RawTileFn gate_up_raw = nullptr) {
    kt_method_kernels m{};
    m.struct_size = sizeof(kt_method_kernels);
    m.method = method;
    m.layout_id = layout_id;
    m.kernel_id = kernel_id;
    m.gate_up_block = kPanel;
    m.down_block = kPanel;
    m.packed_expert_bytes = packed_bytes;
    m.pack_expert = pack;
    m.activation_row_bytes = row_bytes;
    m.quantize_activations = quantize;
    m.gate_up_tile = gate_up;
    m.down_tile = down;
    m.activations = KT_ACTIVATION_SWIGLU;   // every gate/up epilogue applies gate_mul
    m.gate_up_raw_tile = gate_up_raw;         // ABI 1.4 (expert biases), where the method has one
    return m;
}

// --- activation formats ---------------------------------------------------------------
// F32 rows, padded to an even length with zeros so kernels read (k, k+1) pairs.
inline size_t f32_row_bytes(int64_t k) { return size_t(round_up(k, 2)) * 4; }
kt_status quantize_f32_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out);
// Split-BF16 rows for vdpbf16ps: x = hi + lo with hi = bf16(x), lo = bf16(x - hi), which keeps
// ~16 mantissa bits (f32-like error) while the hardware multiplies bf16 pairs. A 64-byte
// header says whether any lo is nonzero: rows that were bf16 already (the hidden states
// of a bf16 model) cost one vdpbf16ps pass, not two. Layout: header, hi[K2], lo[K2].
struct SplitBf16Header {
    int32_t has_lo;
    int32_t reserved[15];
};
inline size_t split_bf16_row_bytes(int64_t k) { return sizeof(SplitBf16Header) + size_t(round_up(k, 2)) * 4; }
kt_status quantize_split_bf16_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out);

// Two-pass int8 rows, the input of the integer kernels: x ~= s * (q_hi + q_lo / 128) with
// s = max|x| / 127, q_hi = round(x / s), q_lo = round((x - s * q_hi) * 128 / s) in [-64, 64].
// One int8 pass alone costs up to ~15% of the output RMS at the largest element on real
// shapes (measured); the second pass brings that to ~1e-3 for one more vpdpbusd per weight
// chunk, while every weight byte is still read once. Layout: header {scale}, hi codes and lo
// codes (each padded to 64 with zeros; stored + 128 when `offset`: VNNI's unsigned operand),
// then int32 sums of hi and of lo codes per kSum elements (the INT4-family kernels take a
// group's sum: its zero point, or MXFP4's / NVFP4's +12 offset). kSum is 32, or 16 for NVFP4's
// 16-k groups (more sums cost the quantizer a horizontal add per 16 elements: 5-10 % of
// INT4 prefill, so only NVFP4 pays it).
struct Int8Header {
    float scale;
    int32_t reserved[15];
};
inline int64_t int8_codes_bytes(int64_t k) { return round_up(k, 64); }
template <int64_t kSum = 32>
inline int64_t int8_blocks(int64_t k) { return round_up(k, 32) / kSum; }
template <int64_t kSum = 32>
inline size_t int8_row_bytes(int64_t k) {
    return sizeof(Int8Header) + 2 * size_t(int8_codes_bytes(k)) + 2 * size_t(int8_blocks<kSum>(k)) * 4;
}
inline const uint8_t* int8_hi(const uint8_t* row) { return row + sizeof(Int8Header); }
inline const uint8_t* int8_lo(const uint8_t* row, int64_t k) { return row + sizeof(Int8Header) + int8_codes_bytes(k); }
template <int64_t kSum = 32>
inline const int32_t* int8_sums_hi(const uint8_t* row, int64_t k) {
    return reinterpret_cast<const int32_t*>(row + sizeof(Int8Header) + 2 * int8_codes_bytes(k));
}
template <int64_t kSum = 32>
inline const int32_t* int8_sums_lo(const uint8_t* row, int64_t k) { return int8_sums_hi<kSum>(row, k) + int8_blocks<kSum>(k); }
kt_status quantize_int8_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out,
                             bool offset, int64_t sum_block = 32);

}  // namespace KT_TARGET_NAMESPACE
