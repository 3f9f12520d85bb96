// A third-party kt backend written against nothing but kt/plugin.h and nanobind. It shows
// both ways the ABI lets a backend run an MoE layer:
//  - BF16 hands kt-core tile kernels and lets the core orchestrate (bucketing, threading);
//  - FP32 hands kt-core a whole-op moe_forward and orchestrates itself on the host's pool.
// Every ABI entry point reports failures as a kt_status plus host->set_error and never
// throws: a C++ exception must not cross the C boundary.
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

namespace nb = nanobind;

namespace {

const kt_host_api* g_host = nullptr;

// Formats into a stack buffer rather than std::string so that reporting an error cannot throw.
__attribute__((format(printf, 2, 3))) kt_status fail(kt_status code, const char* format, ...) {
    char message[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof(message), format, args);
    va_end(args);
    g_host->set_error(message);
    return code;
}

bool known_dtype(kt_dtype dtype) {
    return dtype == KT_DTYPE_F32 || dtype == KT_DTYPE_BF16 || dtype == KT_DTYPE_F16 || dtype == KT_DTYPE_F64;
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// Round to nearest even, NaN kept NaN: the same bits torch and kt_core.testing.bf16_round give.
uint16_t f32_to_bf16(float f) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h) {
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    float magnitude;
    if (exp == 0)  // zero and subnormals: mant * 2^-24 is exact in float
        magnitude = std::ldexp(float(mant), -24);
    else if (exp == 0x1f)
        magnitude = std::bit_cast<float>(0x7f800000u | (mant << 13));
    else
        magnitude = std::bit_cast<float>(((exp + 112u) << 23) | (mant << 13));
    return (h & 0x8000u) ? -magnitude : magnitude;
}

// Converts elements [offset, offset + n) of `data`; the caller has checked the dtype.
void to_f32(const void* data, kt_dtype dtype, int64_t offset, int64_t n, float* out) {
    switch (dtype) {
        case KT_DTYPE_F32:
            std::memcpy(out, static_cast<const float*>(data) + offset, size_t(n) * sizeof(float));
            return;
        case KT_DTYPE_BF16:
            for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(static_cast<const uint16_t*>(data)[offset + i]);
            return;
        case KT_DTYPE_F16:
            for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(static_cast<const uint16_t*>(data)[offset + i]);
            return;
        case KT_DTYPE_F64:
            for (int64_t i = 0; i < n; ++i) out[i] = float(static_cast<const double*>(data)[offset + i]);
            return;
    }
}

struct Bf16 {
    using Element = uint16_t;
    static Element encode(float v) { return f32_to_bf16(v); }
    static float decode(Element e) { return bf16_to_f32(e); }
};
struct F32 {
    using Element = float;
    static Element encode(float v) { return v; }
    static float decode(Element e) { return e; }
};

// Packed expert, both methods: for each intermediate row n, gate row n then up row n
// (2 * hidden elements), so the fused gate/up loop streams one buffer front to back; then
// down [hidden, intermediate] row-major.
template <class W>
struct PackedView {
    const typename W::Element* gate_up;
    const typename W::Element* down;
};

template <class W>
PackedView<W> view(const kt_moe_config* s, const void* packed) {
    const auto* base = static_cast<const typename W::Element*>(packed);
    return {base, base + 2 * s->intermediate * s->hidden};
}

template <class W>
size_t packed_expert_bytes(const kt_moe_config* s) {
    return size_t(3) * size_t(s->hidden) * size_t(s->intermediate) * sizeof(typename W::Element);
}

kt_status check_matrix(const kt_matrix& m, int64_t rows, int64_t cols, const char* name) {
    if (m.rows != rows || m.cols != cols)
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: %s expected [%" PRId64 ", %" PRId64 "], found [%" PRId64
                    ", %" PRId64 "]", name, rows, cols, m.rows, m.cols);
    if (rows > 1 && m.row_stride < cols)
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: %s row stride expected >= %" PRId64 ", found %" PRId64,
                    name, cols, m.row_stride);
    if (!known_dtype(m.dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: %s dtype expected f32, bf16, f16 or f64, found code %d",
                    name, int(m.dtype));
    if (!m.data) return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: %s data expected non-NULL, found NULL", name);
    return KT_OK;
}

template <class W>
void store_row(const kt_matrix& m, int64_t row, float* scratch, typename W::Element* dst) {
    to_f32(m.data, m.dtype, row * m.row_stride, m.cols, scratch);
    for (int64_t c = 0; c < m.cols; ++c) dst[c] = W::encode(scratch[c]);
}

template <class W>
kt_status pack_expert(const kt_moe_config* s, const kt_expert_weights* src, void* dst) {
    const int64_t H = s->hidden, I = s->intermediate;
    kt_status st;
    if ((st = check_matrix(src->gate.values, I, H, "gate")) != KT_OK || (st = check_matrix(src->up.values, I, H, "up")) != KT_OK ||
        (st = check_matrix(src->down.values, H, I, "down")) != KT_OK)
        return st;
    const int64_t longest_row = std::max(H, I);
    float* scratch = static_cast<float*>(g_host->alloc(size_t(longest_row) * sizeof(float), 64, -1, 0));
    if (!scratch) return fail(KT_ERROR_OUT_OF_MEMORY, "example backend: no memory for a %" PRId64 "-float row", longest_row);
    auto* out = static_cast<typename W::Element*>(dst);
    for (int64_t n = 0; n < I; ++n) {
        store_row<W>(src->gate.values, n, scratch, out + 2 * n * H);
        store_row<W>(src->up.values, n, scratch, out + 2 * n * H + H);
    }
    for (int64_t h = 0; h < H; ++h) store_row<W>(src->down.values, h, scratch, out + 2 * I * H + h * I);
    g_host->free(scratch);
    return KT_OK;
}

// Activations stay f32 so the only rounding this backend adds is the weight format's.
size_t activation_row_bytes(int64_t k) { return size_t(k) * sizeof(float); }

kt_status quantize_activations(const void* in, kt_dtype in_dtype, int64_t rows, int64_t k, int64_t in_row_stride,
                               void* out) {
    if (!known_dtype(in_dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT,
                    "example backend: activation dtype expected f32, bf16, f16 or f64, found code %d", int(in_dtype));
    if (rows > 1 && in_row_stride < k)
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: activation row stride expected >= %" PRId64
                    ", found %" PRId64, k, in_row_stride);
    for (int64_t r = 0; r < rows; ++r) to_f32(in, in_dtype, r * in_row_stride, k, static_cast<float*>(out) + r * k);
    return KT_OK;
}

// Float accumulation: cheaper than the reference's double, and well inside bf16's error.
template <class W>
float dot(const float* x, const typename W::Element* w, int64_t k) {
    float acc = 0.f;
    for (int64_t i = 0; i < k; ++i) acc += x[i] * W::decode(w[i]);
    return acc;
}

// out[n - n0] = SiLU(gate_n·x) * (up_n·x) for intermediate rows n in [n0, n1).
template <class W>
void gate_up_rows(const PackedView<W>& p, int64_t H, const float* x, int64_t n0, int64_t n1, float* out) {
    for (int64_t n = n0; n < n1; ++n) {
        const typename W::Element* row = p.gate_up + 2 * n * H;
        const float g = dot<W>(x, row, H), u = dot<W>(x, row + H, H);
        out[n - n0] = g / (1.f + std::exp(-g)) * u;
    }
}

kt_status check_tile(const char* kernel, int64_t rows, int64_t n0, int64_t n1, int64_t n) {
    if (rows < 0 || n0 < 0 || n0 > n1 || n1 > n)
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: %s expected rows >= 0 and 0 <= n0 <= n1 <= %" PRId64
                    ", found rows=%" PRId64 " n0=%" PRId64 " n1=%" PRId64, kernel, n, rows, n0, n1);
    return KT_OK;
}

kt_status bf16_gate_up_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                            int64_t n1, float* out, int64_t out_stride) {
    if (kt_status st = check_tile("gate_up_tile", rows, n0, n1, s->intermediate); st != KT_OK) return st;
    const PackedView<Bf16> p = view<Bf16>(s, packed);
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r) gate_up_rows(p, s->hidden, x + r * s->hidden, n0, n1, out + r * out_stride + n0);
    return KT_OK;
}

kt_status bf16_down_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                         int64_t n1, float* out, int64_t out_stride) {
    if (kt_status st = check_tile("down_tile", rows, n0, n1, s->hidden); st != KT_OK) return st;
    const int64_t I = s->intermediate;
    const PackedView<Bf16> p = view<Bf16>(s, packed);
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) out[r * out_stride + n] = dot<Bf16>(x + r * I, p.down + n * I, I);
    return KT_OK;
}

struct ForwardJob {
    const kt_moe_config* shape;
    const void* const* packed;
    const void* hidden;
    kt_dtype hidden_dtype;
    const int64_t* ids;
    const float* weights;
    float* out;
    int64_t tokens, chunks;
    float* scratch;  // hidden + intermediate floats per chunk, so chunks share nothing
};

void f32_forward_chunk(void* ctx, size_t chunk) {
    const auto& job = *static_cast<const ForwardJob*>(ctx);
    const int64_t H = job.shape->hidden, I = job.shape->intermediate, K = job.shape->top_k;
    const int64_t c = int64_t(chunk), t0 = c * job.tokens / job.chunks, t1 = (c + 1) * job.tokens / job.chunks;
    float* x = job.scratch + c * (H + I);
    float* inter = x + H;
    for (int64_t t = t0; t < t1; ++t) {
        float* out = job.out + t * H;
        to_f32(job.hidden, job.hidden_dtype, t * H, H, x);
        std::memset(out, 0, size_t(H) * sizeof(float));
        for (int64_t j = 0; j < K; ++j) {
            const int64_t e = job.ids[t * K + j];
            if (e < 0 || !job.packed[e]) continue;  // no expert, or one that lives on the GPU
            const PackedView<F32> p = view<F32>(job.shape, job.packed[e]);
            gate_up_rows(p, H, x, 0, I, inter);
            const float w = job.weights[t * K + j];
            for (int64_t h = 0; h < H; ++h) out[h] += w * dot<F32>(inter, p.down + h * I, I);
        }
    }
}

kt_status f32_moe_forward(const kt_moe_config* s, const void* const* packed_experts, const void* hidden,
                          kt_dtype hidden_dtype, int64_t tokens, const int64_t* topk_ids, const float* topk_weights,
                          float* out) {
    if (tokens < 0)
        return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: tokens expected >= 0, found %" PRId64, tokens);
    if (!known_dtype(hidden_dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT,
                    "example backend: hidden dtype expected f32, bf16, f16 or f64, found code %d", int(hidden_dtype));
    for (int64_t i = 0; i < tokens * s->top_k; ++i)
        if (topk_ids[i] >= s->num_experts)
            return fail(KT_ERROR_INVALID_ARGUMENT, "example backend: topk_ids[%" PRId64 ", %" PRId64 "] expected < %" PRId64
                        " (num_experts) or negative, found %" PRId64, i / s->top_k, i % s->top_k, s->num_experts,
                        topk_ids[i]);
    if (tokens == 0) return KT_OK;
    // A few chunks per thread balance tokens whose experts are skipped, and bound the
    // scratch by the thread count instead of the batch size.
    const int64_t chunks = std::min<int64_t>(tokens, 4 * int64_t(g_host->num_threads()));
    const size_t scratch_bytes = size_t(chunks) * size_t(s->hidden + s->intermediate) * sizeof(float);
    auto* scratch = static_cast<float*>(g_host->alloc(scratch_bytes, 64, -1, 0));
    if (!scratch) return fail(KT_ERROR_OUT_OF_MEMORY, "example backend: no memory for %zu bytes of scratch", scratch_bytes);
    ForwardJob job{s, packed_experts, hidden, hidden_dtype, topk_ids, topk_weights, out, tokens, chunks, scratch};
    g_host->parallel_for(size_t(chunks), f32_forward_chunk, &job);
    g_host->free(scratch);
    return KT_OK;
}

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

const kt_method_kernels kMethods[] = {
    {
        .struct_size = sizeof(kt_method_kernels),
        .method = "BF16",
        .layout_id = "example-bf16-interleaved-v1",
        .kernel_id = "moe.bf16.f32.example-portable",
        .gate_up_block = 8,
        .down_block = 8,
        .declines = nullptr,
        .packed_expert_bytes = packed_expert_bytes<Bf16>,
        .pack_expert = pack_expert<Bf16>,
        .activation_row_bytes = activation_row_bytes,
        .quantize_activations = quantize_activations,
        .gate_up_tile = bf16_gate_up_tile,
        .down_tile = bf16_down_tile,
        .moe_forward = nullptr,
    },
    {
        // Whole-op: the core calls moe_forward only, so the tile entries stay empty.
        .struct_size = sizeof(kt_method_kernels),
        .method = "FP32",
        .layout_id = "example-f32-interleaved-v1",
        .kernel_id = "moe.f32.f32.example-portable-whole-op",
        .gate_up_block = 0,
        .down_block = 0,
        .declines = nullptr,
        .packed_expert_bytes = packed_expert_bytes<F32>,
        .pack_expert = pack_expert<F32>,
        .activation_row_bytes = nullptr,
        .quantize_activations = nullptr,
        .gate_up_tile = nullptr,
        .down_tile = nullptr,
        .moe_forward = f32_moe_forward,
    },
};

const kt_backend_api kApi = {
    .struct_size = sizeof(kt_backend_api),
    .abi_major = KT_PLUGIN_ABI_MAJOR,
    .abi_minor = KT_PLUGIN_ABI_MINOR,
    .name = "example",
    .variant = "portable",
    .required_features = "",
    .init = init,
    .num_methods = sizeof(kMethods) / sizeof(kMethods[0]),
    .methods = kMethods,
};

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "kt example backend (BF16 tile kernels, FP32 whole-op moe_forward)";
    m.def("backend_api", [](const std::string& variant) {
        if (variant != "portable")
            throw nb::value_error(("example backend has one variant, 'portable'; asked for '" + variant + "'").c_str());
        return nb::capsule(static_cast<const void*>(&kApi), KT_BACKEND_CAPSULE_NAME);
    });
}
