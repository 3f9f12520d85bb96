// The reference backend: plain portable C++ compiled for the baseline ISA, built only
// against kt/plugin.h like any third-party backend. It is the correctness oracle that
// every other backend is compared with (accumulation in double, no blocking tricks), and
// the worked example of the plugin contract. Being fast is not its job.
//
// Files: this one holds what every method shares and the backend table;
// reference_float.cpp the BF16/FP32 methods; reference_quantized.cpp the integer and FP8
// ones, which follow docs/formats.md to the bit.
#include "reference_common.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cmath>

namespace nb = nanobind;
using namespace nb::literals;

namespace kt_reference {

const kt_host_api* g_host = nullptr;

kt_status fail(kt_status code, const std::string& message) {
    if (g_host) g_host->set_error(message.c_str());
    return code;
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal half: renormalise
        exp = 113;
        while (!(mant & 0x400u)) { mant <<= 1; --exp; }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

bool is_floating(kt_dtype dtype) {
    return dtype == KT_DTYPE_F32 || dtype == KT_DTYPE_BF16 || dtype == KT_DTYPE_F16 || dtype == KT_DTYPE_F64;
}

const char* dtype_name(kt_dtype dtype) {
    switch (dtype) {
        case KT_DTYPE_F32: return "float32";
        case KT_DTYPE_BF16: return "bfloat16";
        case KT_DTYPE_F16: return "float16";
        case KT_DTYPE_F64: return "float64";
        case KT_DTYPE_I8: return "int8";
        case KT_DTYPE_U8: return "uint8";
        case KT_DTYPE_I32: return "int32";
        default: break;   // ggml block types are named by the LLAMAFILE method
    }
    return "an unknown dtype";
}

std::string describe(const kt_matrix& m) {
    if (!m.data) return "nothing";
    return std::string(dtype_name(m.dtype)) + " [" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]";
}

float load_element(const void* data, kt_dtype dtype, int64_t index) {
    switch (dtype) {
        case KT_DTYPE_F32: return static_cast<const float*>(data)[index];
        case KT_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[index]);
        case KT_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t*>(data)[index]);
        case KT_DTYPE_F64: return float(static_cast<const double*>(data)[index]);
        default: return NAN;
    }
}

size_t activation_row_bytes(int64_t k) { return size_t(k) * sizeof(float); }

kt_status quantize_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (!is_floating(dtype))
        return fail(KT_ERROR_UNSUPPORTED, std::string("reference backend: activations must be floating point, got ") +
                                              dtype_name(dtype));
    auto* o = static_cast<float*>(out);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) o[r * k + c] = load_element(in, dtype, r * stride + c);
    return KT_OK;
}

kt_method_kernels method_table(const char* name, const char* layout_id, const char* kernel_id,
                               size_t (*packed_expert_bytes)(const kt_moe_config*),
                               kt_status (*pack_expert)(const kt_moe_config*, const kt_expert_weights*, void*),
                               decltype(kt_method_kernels::gate_up_tile) gate_up_tile,
                               decltype(kt_method_kernels::down_tile) down_tile,
                               decltype(kt_method_kernels::gate_up_raw_tile) gate_up_raw_tile) {
    kt_method_kernels m{};
    m.struct_size = sizeof(kt_method_kernels);
    m.method = name;
    m.layout_id = layout_id;
    m.kernel_id = kernel_id;
    m.gate_up_block = 16;
    m.down_block = 16;
    m.declines = nullptr;
    m.packed_expert_bytes = packed_expert_bytes;
    m.pack_expert = pack_expert;
    m.activation_row_bytes = activation_row_bytes;
    m.quantize_activations = quantize_activations;
    m.gate_up_tile = gate_up_tile;
    m.down_tile = down_tile;
    m.activations = KT_ACTIVATION_SWIGLU;   // every method's gate_up_tile applies gated() (reference_common.h)
    m.moe_forward = nullptr;
    m.gate_up_raw_tile = gate_up_raw_tile;   // ABI 1.4: the same products, no epilogue
    return m;
}

namespace {

const kt_method_kernels kMethods[] = {
    bf16_method(), fp32_method(), int8_method(), int4_method(), rawint4_method(), fp8_method(), fp8_perchannel_method(),
    llamafile_method(), mxfp4_method(), gptq_int4_method(), mxfp8_method(), nvfp4_method(),
};

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

const kt_backend_api kApi = {
    sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR,
    "reference", "baseline", "",
    init,
    sizeof(kMethods) / sizeof(kMethods[0]), kMethods,
};

}  // namespace
}  // namespace kt_reference

NB_MODULE(_native, m) {
    m.doc() = "kt reference backend (portable C++, the correctness oracle)";
    m.def("backend_api", [](const std::string& variant) {
        if (variant != "baseline")
            throw nb::value_error(("reference backend has one variant, 'baseline'; asked for '" + variant + "'").c_str());
        return nb::capsule(static_cast<const void*>(&kt_reference::kApi), KT_BACKEND_CAPSULE_NAME);
    });
    // The reference's ggml dequantizer on its own, so tests can hold it to gguf-py's bit for bit.
    m.def("ggml_dequantize", [](int dtype, nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> data) {
        const auto t = static_cast<kt_dtype>(dtype);
        const int64_t block_bytes = kt_reference::ggml_block_bytes(t), block_elems = kt_reference::ggml_block_elems(t);
        if (block_bytes && int64_t(data.shape(0)) % block_bytes)
            throw nb::value_error(("ggml_dequantize: " + std::to_string(data.shape(0)) + " bytes are not whole blocks of " +
                                   std::to_string(block_bytes)).c_str());
        const int64_t blocks = block_bytes ? int64_t(data.shape(0)) / block_bytes : 0;
        auto* out = new float[size_t(blocks * block_elems) + 1];
        nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        std::string error;
        if (!kt_reference::ggml_dequantize(t, data.data(), blocks, out, &error)) throw nb::value_error(error.c_str());
        return nb::ndarray<nb::numpy, float, nb::ndim<1>>(out, {size_t(blocks * block_elems)}, owner);
    }, "dtype"_a, "data"_a, "f32 values of ggml blocks (dtype: a KT_DTYPE_GGML_* number)");
}
