// The reference backend: plain portable C++ compiled for the baseline ISA, built only
// against kt/plugin.h like any third-party backend. It is the correctness oracle that
// every other backend is compared with (accumulation in double, no blocking tricks), and
// the worked example of the plugin contract. Being fast is not its job.
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstring>
#include <string>

namespace nb = nanobind;

namespace {

const kt_host_api* g_host = nullptr;

kt_status fail(kt_status code, const std::string& message) {
    if (g_host) g_host->set_error(message.c_str());
    return code;
}

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
inline float f16_to_f32(uint16_t h) {
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

float load_element(const void* data, kt_dtype dtype, int64_t index) {
    switch (dtype) {
        case KT_DTYPE_F32: return static_cast<const float*>(data)[index];
        case KT_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[index]);
        case KT_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t*>(data)[index]);
        case KT_DTYPE_F64: return float(static_cast<const double*>(data)[index]);
    }
    return NAN;
}

bool supported_dtype(kt_dtype dtype) {
    return dtype == KT_DTYPE_F32 || dtype == KT_DTYPE_BF16 || dtype == KT_DTYPE_F16 ||
           dtype == KT_DTYPE_F64;
}

// Weight storage element: the packed layout is gate [I,H], up [I,H], down [H,I], row-major.
struct Bf16Weights {
    using Element = uint16_t;
    static Element encode(float v) { return f32_to_bf16(v); }
    static double decode(Element e) { return bf16_to_f32(e); }
};
struct F32Weights {
    using Element = float;
    static Element encode(float v) { return v; }
    static double decode(Element e) { return e; }
};

template <class W>
size_t packed_expert_bytes(const kt_moe_config* s) {
    return size_t(3) * size_t(s->hidden) * size_t(s->intermediate) * sizeof(typename W::Element);
}

kt_status check_matrix(const kt_matrix& m, int64_t rows, int64_t cols, const char* name) {
    if (m.rows != rows || m.cols != cols)
        return fail(KT_ERROR_INVALID_ARGUMENT,
                    std::string("reference backend: ") + name + " should be [" + std::to_string(rows) +
                        ", " + std::to_string(cols) + "], got [" + std::to_string(m.rows) + ", " +
                        std::to_string(m.cols) + "]");
    if (!supported_dtype(m.dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT, std::string("reference backend: ") + name +
                                                   " must be floating point (float32, bfloat16, float16, float64) for this "
                                                   "method, got integer codes");
    return KT_OK;
}

template <class W>
kt_status pack_expert(const kt_moe_config* s, const kt_expert_weights* src, void* dst) {
    const int64_t H = s->hidden, I = s->intermediate;
    kt_status st;
    if ((st = check_matrix(src->gate.values, I, H, "gate")) != KT_OK) return st;
    if ((st = check_matrix(src->up.values, I, H, "up")) != KT_OK) return st;
    if ((st = check_matrix(src->down.values, H, I, "down")) != KT_OK) return st;
    auto* out = static_cast<typename W::Element*>(dst);
    for (const kt_matrix* m : {&src->gate.values, &src->up.values, &src->down.values})
        for (int64_t r = 0; r < m->rows; ++r)
            for (int64_t c = 0; c < m->cols; ++c)
                *out++ = W::encode(load_element(m->data, m->dtype, r * m->row_stride + c));
    return KT_OK;
}

// Activations stay f32: the reference's job is to show the weight format's error alone.
size_t activation_row_bytes(int64_t k) { return size_t(k) * sizeof(float); }

kt_status quantize_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k,
                               int64_t stride, void* out) {
    if (!supported_dtype(dtype)) return fail(KT_ERROR_UNSUPPORTED, "reference backend: unsupported activation dtype");
    auto* o = static_cast<float*>(out);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < k; ++c) o[r * k + c] = load_element(in, dtype, r * stride + c);
    return KT_OK;
}

template <class W>
double dot(const float* x, const typename W::Element* w, int64_t k) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i) acc += double(x[i]) * W::decode(w[i]);
    return acc;
}

template <class W>
kt_status gate_up_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows,
                       int64_t n0, int64_t n1, float* out, int64_t out_stride) {
    const int64_t H = s->hidden, I = s->intermediate;
    const auto* gate = static_cast<const typename W::Element*>(packed);
    const auto* up = gate + I * H;
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) {
            const double g = dot<W>(x + r * H, gate + n * H, H);
            const double u = dot<W>(x + r * H, up + n * H, H);
            out[r * out_stride + n] = float(g / (1.0 + std::exp(-g)) * u);
        }
    return KT_OK;
}

template <class W>
kt_status down_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows,
                    int64_t n0, int64_t n1, float* out, int64_t out_stride) {
    const int64_t H = s->hidden, I = s->intermediate;
    const auto* down = static_cast<const typename W::Element*>(packed) + 2 * I * H;
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) out[r * out_stride + n] = float(dot<W>(x + r * I, down + n * I, I));
    return KT_OK;
}

template <class W>
kt_method_kernels method(const char* name, const char* layout, const char* kernel) {
    kt_method_kernels m{};
    m.struct_size = sizeof(kt_method_kernels);
    m.method = name;
    m.layout_id = layout;
    m.kernel_id = kernel;
    m.gate_up_block = 16;
    m.down_block = 16;
    m.declines = nullptr;
    m.packed_expert_bytes = packed_expert_bytes<W>;
    m.pack_expert = pack_expert<W>;
    m.activation_row_bytes = activation_row_bytes;
    m.quantize_activations = quantize_activations;
    m.gate_up_tile = gate_up_tile<W>;
    m.down_tile = down_tile<W>;
    m.moe_forward = nullptr;
    return m;
}

const kt_method_kernels kMethods[] = {
    method<Bf16Weights>("BF16", "kt-bf16-rowmajor-v1", "moe.bf16.f32.reference"),
    method<F32Weights>("FP32", "kt-f32-rowmajor-v1", "moe.f32.f32.reference"),
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

NB_MODULE(_native, m) {
    m.doc() = "kt reference backend (portable C++, the correctness oracle)";
    m.def("backend_api", [](const std::string& variant) {
        if (variant != "baseline")
            throw nb::value_error(("reference backend has one variant, 'baseline'; asked for '" + variant + "'").c_str());
        return nb::capsule(static_cast<const void*>(&kApi), KT_BACKEND_CAPSULE_NAME);
    });
}
