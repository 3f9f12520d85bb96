// What the reference backend's translation units share: the host table, error reporting,
// element conversions, the f32 activation path and the method tables each file provides.
#pragma once

#include <kt/formats/gated_activation.h>
#include <kt/plugin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace kt_reference {

extern const kt_host_api* g_host;

// Records `message` with the host (the core turns it into the Python exception) and
// returns `code`, so packers can write `return fail(...)`.
kt_status fail(kt_status code, const std::string& message);

// bf16 is the top half of an IEEE float; rounding to nearest-even keeps the packer
// bit-identical to torch's float->bfloat16 conversion (NaN stays NaN).
inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

// The gated activation of kt_moe_config (kt/plugin.h, ABI 1.2), in double: SiLU(g) * u, or the
// clamped SwiGLU of GPT-OSS and DeepSeek-V4: g = min(g, limit) and u in [-limit, limit] when
// limit > 0; g * sigmoid(alpha g) * (u + 1) when alpha > 0.
inline double gated(const kt_moe_config* s, double g, double u) {
    return kt::activation::gated<double>(s->swiglu_limit, s->swiglu_alpha, g, u);
}

// Where a method's gate/up products go (its gate_up_pairs(..., emit) calls emit(r, n, g, u) for
// each row and column of the tile): gate_up_tile's gated activation, or gate_up_raw_tile's plain
// products in tile-local columns (plugin ABI 1.4).
struct GatedOut {
    const kt_moe_config* s;
    float* out;
    int64_t stride;
    void operator()(int64_t r, int64_t n, double g, double u) const { out[r * stride + n] = float(gated(s, g, u)); }
};
struct RawOut {
    float* gate;
    float* up;
    int64_t stride, n0;
    void operator()(int64_t r, int64_t n, double g, double u) const {
        gate[r * stride + n - n0] = float(g);
        up[r * stride + n - n0] = float(u);
    }
};

// Plugin ABI 1.5's transposed products, for every method from its row reader:
// row(part, n, k0, k1, w) writes the weights k in [k0, k1) of row n of matrix `part` (0 gate,
// 1 up, 2 down) as doubles into w[k - k0]. out[r, k] = sum over the listed matrices of
// sum_n grad[r, n] * part[n, k], accumulated in double.
struct GradOf {
    int part;
    const float* grad;
};
template <class Row>
kt_status transposed_products(const kt_moe_config* s, const Row& row, std::initializer_list<GradOf> terms,
                              int64_t grad_stride, int64_t rows, int64_t k0, int64_t k1, float* out, int64_t out_stride) {
    const int64_t width = k1 - k0;
    std::vector<double> acc(size_t(rows * width), 0.0);
    std::vector<double> w(static_cast<size_t>(width));
    for (const GradOf& t : terms) {
        const int64_t N = t.part == 2 ? s->hidden : s->intermediate;
        for (int64_t n = 0; n < N; ++n) {
            row(t.part, n, k0, k1, w.data());
            for (int64_t r = 0; r < rows; ++r) {
                const double g = t.grad[r * grad_stride + n];
                for (int64_t k = 0; k < width; ++k) acc[size_t(r * width + k)] += g * w[size_t(k)];
            }
        }
    }
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < width; ++k) out[r * out_stride + k0 + k] = float(acc[size_t(r * width + k)]);
    return KT_OK;
}

// The two ABI 1.5 entries of a method whose row reader is `Reader::row(s, packed, part, n, k0, k1, w)`.
template <class Reader>
kt_status gate_up_transposed_tile(const kt_moe_config* s, const void* packed, const float* grad_gate, const float* grad_up,
                                  int64_t grad_stride, int64_t rows, int64_t k0, int64_t k1, float* out, int64_t out_stride) {
    const auto row = [&](int part, int64_t n, int64_t a, int64_t b, double* w) { Reader::row(s, packed, part, n, a, b, w); };
    return transposed_products(s, row, {{0, grad_gate}, {1, grad_up}}, grad_stride, rows, k0, k1, out, out_stride);
}
template <class Reader>
kt_status down_transposed_tile(const kt_moe_config* s, const void* packed, const float* grad, int64_t grad_stride,
                               int64_t rows, int64_t k0, int64_t k1, float* out, int64_t out_stride) {
    const auto row = [&](int part, int64_t n, int64_t a, int64_t b, double* w) { Reader::row(s, packed, part, n, a, b, w); };
    return transposed_products(s, row, {{2, grad}}, grad_stride, rows, k0, k1, out, out_stride);
}
template <class Reader>
kt_method_kernels with_transposed(kt_method_kernels m) {
    m.transposed_block = 16;
    m.gate_up_transposed_tile = gate_up_transposed_tile<Reader>;
    m.down_transposed_tile = down_transposed_tile<Reader>;
    return m;
}

// IEEE half -> f32, exact (subnormals, infinities and NaN included).
float f16_to_f32(uint16_t h);

bool is_floating(kt_dtype dtype);
const char* dtype_name(kt_dtype dtype);
// "bfloat16 [64, 128]": how error messages describe what a caller passed.
std::string describe(const kt_matrix& m);

// Element `index` of floating data, widened exactly to f32 (f64 is rounded to nearest).
float load_element(const void* data, kt_dtype dtype, int64_t index);

// Activations stay f32 for every method: the reference's job is to show the weight
// format's error alone.
size_t activation_row_bytes(int64_t k);
kt_status quantize_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out);

// A method table with the reference's common parts (f32 activations, 16-column tiles).
kt_method_kernels method_table(const char* name, const char* layout_id, const char* kernel_id,
                               size_t (*packed_expert_bytes)(const kt_moe_config*),
                               kt_status (*pack_expert)(const kt_moe_config*, const kt_expert_weights*, void*),
                               decltype(kt_method_kernels::gate_up_tile) gate_up_tile,
                               decltype(kt_method_kernels::down_tile) down_tile,
                               decltype(kt_method_kernels::gate_up_raw_tile) gate_up_raw_tile);

// reference_float.cpp
kt_method_kernels bf16_method();
kt_method_kernels fp32_method();
// reference_quantized.cpp
kt_method_kernels int8_method();
kt_method_kernels int4_method();
kt_method_kernels rawint4_method();
kt_method_kernels fp8_method();
kt_method_kernels fp8_perchannel_method();
kt_method_kernels mxfp4_method();
kt_method_kernels gptq_int4_method();
kt_method_kernels mxfp8_method();
kt_method_kernels nvfp4_method();
// reference_ggml.cpp
kt_method_kernels llamafile_method();
// ggml blocks -> f32 exactly as gguf-py dequantizes them; false (with *error) for a type it does not read.
bool ggml_dequantize(kt_dtype dtype, const uint8_t* data, int64_t blocks, float* out, std::string* error);
int64_t ggml_block_bytes(kt_dtype dtype);   // 0 for a type it does not read
int64_t ggml_block_elems(kt_dtype dtype);

}  // namespace kt_reference
