// BF16 and FP32: the weights are stored as given (BF16 rounded to nearest even), packed
// gate [I,H], up [I,H], down [H,I], row-major.
#include "reference_common.h"

#include <cmath>

namespace kt_reference {
namespace {

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
    if (!is_floating(m.dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT, std::string("reference backend: ") + name +
                                                   " must be floating point (float32, bfloat16, float16, float64) for this "
                                                   "method, got integer codes (" + dtype_name(m.dtype) + ")");
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

template <class W>
double dot(const float* x, const typename W::Element* w, int64_t k) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i) acc += double(x[i]) * W::decode(w[i]);
    return acc;
}

// Every (row, column) of the tile's gate and up products, handed to emit(r, n, g, u).
template <class W, class Emit>
void gate_up_pairs(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                   const Emit& emit) {
    const int64_t H = s->hidden, I = s->intermediate;
    const auto* gate = static_cast<const typename W::Element*>(packed);
    const auto* up = gate + I * H;
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n)
            emit(r, n, dot<W>(x + r * H, gate + n * H, H), dot<W>(x + r * H, up + n * H, H));
}

template <class W>
kt_status gate_up_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows,
                       int64_t n0, int64_t n1, float* out, int64_t out_stride) {
    gate_up_pairs<W>(s, packed, act, rows, n0, n1, GatedOut{s, out, out_stride});
    return KT_OK;
}

template <class W>
kt_status gate_up_raw_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t out_stride) {
    gate_up_pairs<W>(s, packed, act, rows, n0, n1, RawOut{out_gate, out_up, out_stride, n0});
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
struct Rows {   // ABI 1.5's row reader (reference_common.h)
    static void row(const kt_moe_config* s, const void* packed, int part, int64_t n, int64_t k0, int64_t k1, double* w) {
        const int64_t H = s->hidden, I = s->intermediate, K = part == 2 ? I : H;
        const auto* m = static_cast<const typename W::Element*>(packed) + part * I * H + n * K;
        for (int64_t k = k0; k < k1; ++k) w[k - k0] = W::decode(m[k]);
    }
};

template <class W>
kt_method_kernels method(const char* name, const char* layout, const char* kernel) {
    return with_transposed<Rows<W>>(method_table(name, layout, kernel, packed_expert_bytes<W>, pack_expert<W>,
                                                 gate_up_tile<W>, down_tile<W>, gate_up_raw_tile<W>));
}

}  // namespace

kt_method_kernels bf16_method() { return method<Bf16Weights>("BF16", "kt-bf16-rowmajor-v1", "moe.bf16.f32.reference"); }
kt_method_kernels fp32_method() { return method<F32Weights>("FP32", "kt-f32-rowmajor-v1", "moe.f32.f32.reference"); }

}  // namespace kt_reference
