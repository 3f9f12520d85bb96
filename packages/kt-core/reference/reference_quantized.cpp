// INT8, INT4, RAWINT4, FP8, FP8_PERCHANNEL, MXFP4, MXFP8, NVFP4 and GPTQ_INT4, exactly as
// docs/formats.md states them.
//
// All nine pack a matrix [N, K] the same way: one code byte per element [N, K], f32 scales
// [N, groups], for asymmetric INT4 int8 zero points [N, groups], and for NVFP4 the tensor's
// f32 global scale; a group is `group` consecutive k (the last one may be short, as FP8's
// 128-wide blocks need not divide K). The kernels multiply f32 activations by scale *
// (value(code) - zero) in double (times the global scale at the end): for every format that
// product is exact, so the accumulation is the only rounding the reference adds to the
// format's own.
#include "reference_common.h"
#include <kt/formats/quant_rules.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

namespace kt_reference {
namespace {

constexpr size_t kAlign = 64;
size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* const kMatrixName[3] = {"gate", "up", "down"};

// ---- packed layout ---------------------------------------------------------------------

// Where one matrix's parts lie in a packed expert (byte offsets).
struct MatrixLayout {
    int64_t rows, cols, group, groups;
    bool has_zeros, has_global;
    size_t codes, scales, zeros, global;
};

// NVFP4's second-level scale: one f32 per matrix, multiplying every dot.
template <class M>
constexpr bool kHasGlobal = requires { M::kGlobalScale; };

struct ExpertLayout {
    MatrixLayout part[3];   // gate [I, H], up [I, H], down [H, I]
    size_t bytes;
};

template <class M>
ExpertLayout layout_of(const kt_moe_config* s) {
    ExpertLayout l{};
    const int64_t rows[3] = {s->intermediate, s->intermediate, s->hidden};
    const int64_t cols[3] = {s->hidden, s->hidden, s->intermediate};
    size_t at = 0;
    for (int p = 0; p < 3; ++p) {
        MatrixLayout& m = l.part[p];
        m.rows = rows[p];
        m.cols = cols[p];
        // A group size the packer is going to refuse must still give a sane byte count,
        // because the core sizes the buffers before it calls the packer.
        m.group = std::max<int64_t>(1, M::group(s, m.cols));
        m.groups = ceil_div(m.cols, m.group);
        m.has_zeros = M::has_zeros(s);
        m.codes = at;
        at += round_up(size_t(m.rows * m.cols));
        m.scales = at;
        at += round_up(size_t(m.rows * m.groups) * sizeof(float));
        m.zeros = at;
        if (m.has_zeros) at += round_up(size_t(m.rows * m.groups));
        m.has_global = kHasGlobal<M>;
        m.global = at;
        if (m.has_global) at += kAlign;
    }
    l.bytes = at;
    return l;
}

// Codes are stored as bytes; a method's Codes type says what number a byte stands for.
struct IntCodes {
    static double value(uint8_t code) { return double(int8_t(code)); }
};

// E4M3 "fn": sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, and
// S.1111.111 is NaN (refused at load, so never decoded).
bool e4m3_is_nan(uint8_t byte) { return (byte & 0x7f) == 0x7f; }
struct E4M3Codes {
    static double value(uint8_t byte) {
        const int e = (byte >> 3) & 0xf, m = byte & 7;
        const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
        return (byte & 0x80) ? -magnitude : magnitude;
    }
};

// E2M1 (MXFP4's element): sign bit 3, then 2 exponent bits (bias 1) and 1 mantissa bit; no
// infinities or NaN. The packed byte holds the 4-bit code.
struct E2M1Codes {
    static double value(uint8_t code) {
        const int e = (code >> 1) & 3, m = code & 1;
        const double magnitude = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
        return (code & 8) ? -magnitude : magnitude;
    }
};

// ---- kernels ---------------------------------------------------------------------------

template <class M>
double dot(const float* x, const char* packed, const MatrixLayout& m, int64_t n) {
    const auto* codes = reinterpret_cast<const uint8_t*>(packed + m.codes) + n * m.cols;
    const auto* scales = reinterpret_cast<const float*>(packed + m.scales) + n * m.groups;
    const auto* zeros = m.has_zeros ? reinterpret_cast<const int8_t*>(packed + m.zeros) + n * m.groups : nullptr;
    double acc = 0.0;
    for (int64_t k = 0; k < m.cols; ++k) {
        const int64_t g = k / m.group;
        const double zero = zeros ? zeros[g] : 0.0;
        acc += double(x[k]) * (double(scales[g]) * (M::Codes::value(codes[k]) - zero));
    }
    return m.has_global ? acc * double(*reinterpret_cast<const float*>(packed + m.global)) : acc;
}

// Every (row, column) of the tile's gate and up products, handed to emit(r, n, g, u).
template <class M, class Emit>
void gate_up_pairs(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                   const Emit& emit) {
    const ExpertLayout l = layout_of<M>(s);
    const auto* base = static_cast<const char*>(packed);
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n)
            emit(r, n, dot<M>(x + r * s->hidden, base, l.part[0], n), dot<M>(x + r * s->hidden, base, l.part[1], n));
}

template <class M>
kt_status gate_up_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                       int64_t n1, float* out, int64_t out_stride) {
    gate_up_pairs<M>(s, packed, act, rows, n0, n1, GatedOut{s, out, out_stride});
    return KT_OK;
}

template <class M>
kt_status gate_up_raw_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t out_stride) {
    gate_up_pairs<M>(s, packed, act, rows, n0, n1, RawOut{out_gate, out_up, out_stride, n0});
    return KT_OK;
}

template <class M>
kt_status down_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                    int64_t n1, float* out, int64_t out_stride) {
    const ExpertLayout l = layout_of<M>(s);
    const auto* base = static_cast<const char*>(packed);
    const auto* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n)
            out[r * out_stride + n] = float(dot<M>(x + r * s->intermediate, base, l.part[2], n));
    return KT_OK;
}

// ---- input checks ----------------------------------------------------------------------

std::string prefix(const char* method) { return std::string("reference backend ") + method + ": "; }

std::string shape_text(int64_t rows, int64_t cols) {
    return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

std::string dtype_list(std::initializer_list<kt_dtype> dtypes) {
    std::string text;
    size_t i = 0;
    for (kt_dtype d : dtypes) {
        if (i) text += i + 1 == dtypes.size() ? " or " : ", ";
        text += dtype_name(d);
        ++i;
    }
    return text;
}

constexpr std::initializer_list<kt_dtype> kFloats = {KT_DTYPE_F32, KT_DTYPE_BF16, KT_DTYPE_F16, KT_DTYPE_F64};
constexpr std::initializer_list<kt_dtype> kScaleDtypes = {KT_DTYPE_F32, KT_DTYPE_BF16};

bool has_dtype(const kt_matrix& m, std::initializer_list<kt_dtype> dtypes) {
    return std::find(dtypes.begin(), dtypes.end(), m.dtype) != dtypes.end();
}

// Refuses `m` (named by `what`) unless it is present with one of `dtypes` and the shape
// [rows, cols].
kt_status expect(const kt_matrix& m, const std::string& what, std::initializer_list<kt_dtype> dtypes, int64_t rows,
                 int64_t cols, const std::string& note = "") {
    if (m.data && has_dtype(m, dtypes) && m.rows == rows && m.cols == cols) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, what + " must be " + dtype_list(dtypes) + " " + shape_text(rows, cols) +
                                               note + "; got " + describe(m));
}

kt_status expect_absent(const kt_matrix& m, const std::string& what, const char* why) {
    if (!m.data) return KT_OK;
    return fail(KT_ERROR_INVALID_ARGUMENT, what + " must not be given (" + why + "); got " + describe(m));
}

// Methods whose group is fixed by their format (or that have none) take group_size 0 or
// that fixed size, and no zero point.
kt_status check_fixed_config(const char* method, const kt_moe_config* s, int64_t fixed_group, const char* why) {
    if (s->group_size != 0 && s->group_size != fixed_group)
        return fail(KT_ERROR_INVALID_ARGUMENT, prefix(method) + why + "; group_size must be 0" +
                                                   (fixed_group ? " or " + std::to_string(fixed_group) : "") +
                                                   ", got " + std::to_string(s->group_size));
    if (s->quant_flags & KT_QUANT_ZERO_POINT)
        return fail(KT_ERROR_INVALID_ARGUMENT,
                    prefix(method) + "zero_point=True is an INT4 option; " + method + " is symmetric");
    return KT_OK;
}

kt_status check_group_divides(const char* method, const kt_moe_config* s, int64_t group) {
    if (s->hidden % group != 0)
        return fail(KT_ERROR_INVALID_ARGUMENT, prefix(method) + "group size " + std::to_string(group) +
                                                   " does not divide hidden = " + std::to_string(s->hidden) +
                                                   " (the K of gate and up)");
    if (s->intermediate % group != 0)
        return fail(KT_ERROR_INVALID_ARGUMENT, prefix(method) + "group size " + std::to_string(group) +
                                                   " does not divide intermediate = " +
                                                   std::to_string(s->intermediate) + " (the K of down)");
    return KT_OK;
}

// Floating weights the packer quantizes itself: nothing pre-quantized may come with them.
kt_status check_float_source(const char* method, const kt_weight& w, const MatrixLayout& m, const char* matrix) {
    const std::string who = prefix(method) + matrix;
    kt_status st;
    if ((st = expect(w.values, who, kFloats, m.rows, m.cols, " (" + std::string(method) +
                                                                   " quantizes float weights at load)")) != KT_OK)
        return st;
    if ((st = expect_absent(w.scales, who + " scales", "this method computes its own scales")) != KT_OK) return st;
    return expect_absent(w.zeros, who + " zeros", "this method computes its own zero points");
}

// INT8 / INT4 also take kt's own pre-quantized codes (docs/formats.md, "kt converted
// folders"): values of an integer dtype mean codes, which must come with their scales.
bool is_codes(const kt_weight& w) { return w.values.data && !is_floating(w.values.dtype); }

// INT8 codes: int8 [N, K] in [-127, 127] (-128 is refused: the kernels may negate a code)
// and f32 scales [N, 1].
kt_status check_int8_codes(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
    const std::string who = prefix("INT8") + matrix;
    kt_status st;
    if ((st = expect(w.values, who + " codes", {KT_DTYPE_I8}, m.rows, m.cols)) != KT_OK) return st;
    if ((st = expect(w.scales, who + " scales", {KT_DTYPE_F32}, m.rows, 1, " (one per row)")) != KT_OK) return st;
    if ((st = expect_absent(w.zeros, who + " zeros", "INT8 is symmetric")) != KT_OK) return st;
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c)
            if (static_cast<const int8_t*>(w.values.data)[r * w.values.row_stride + c] == -128)
                return fail(KT_ERROR_INVALID_ARGUMENT, who + " codes hold -128 at " + shape_text(r, c) +
                                                           "; INT8 codes are in [-127, 127]");
    return KT_OK;
}

// INT4 codes: uint8 [N, K/2], element 2j in the low nibble of byte j and 2j+1 in the high
// one, stored u = q + 8 (symmetric) or u = q (with zeros); f32 scales [N, K/G]; uint8
// zero points [N, K/G] in [0, 15] exactly when the layer is asymmetric.
kt_status check_int4_codes(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
    const std::string who = prefix("INT4") + matrix;
    kt_status st;
    if ((st = expect(w.values, who + " codes", {KT_DTYPE_U8}, m.rows, m.cols / 2, " (two 4-bit codes per byte)")) != KT_OK)
        return st;
    if ((st = expect(w.scales, who + " scales", {KT_DTYPE_F32}, m.rows, m.groups,
                     " (one per group of " + std::to_string(m.group) + ")")) != KT_OK)
        return st;
    if (!m.has_zeros) return expect_absent(w.zeros, who + " zeros", "the layer is symmetric (zero_point=False)");
    if ((st = expect(w.zeros, who + " zeros", {KT_DTYPE_U8}, m.rows, m.groups, " (zero_point=True)")) != KT_OK) return st;
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t g = 0; g < m.groups; ++g)
            if (static_cast<const uint8_t*>(w.zeros.data)[r * w.zeros.row_stride + g] > 15)
                return fail(KT_ERROR_INVALID_ARGUMENT, who + " zero points must be in [0, 15]; got " +
                                                           std::to_string(static_cast<const uint8_t*>(w.zeros.data)[r * w.zeros.row_stride + g]) +
                                                           " at " + shape_text(r, g));
    return KT_OK;
}

// E4M3 bytes [N, K] with no NaN code.
kt_status check_e4m3_values(const char* method, const kt_weight& w, const MatrixLayout& m, const char* matrix) {
    const std::string who = prefix(method) + matrix;
    kt_status st;
    if ((st = expect(w.values, who, {KT_DTYPE_U8}, m.rows, m.cols, " (E4M3 bytes)")) != KT_OK) return st;
    if ((st = expect_absent(w.zeros, who + " zeros", "FP8 has no zero points")) != KT_OK) return st;
    const auto* bytes = static_cast<const uint8_t*>(w.values.data);
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c)
            if (e4m3_is_nan(bytes[r * w.values.row_stride + c]))
                return fail(KT_ERROR_INVALID_ARGUMENT,
                            who + " holds the E4M3 NaN code 0x" +
                                (bytes[r * w.values.row_stride + c] == 0x7f ? "7F" : "FF") + " at " +
                                shape_text(r, c) + "; kt refuses non-finite weights at load");
    return KT_OK;
}

// ---- quantizers: kt::quant (include/kt/formats/quant_rules.h) -------------------------------

float quantize_symmetric(const float* w, int64_t count, float max_code, int lo, int hi, uint8_t* codes) {
    return kt::quant::quantize_symmetric(w, count, max_code, lo, hi, reinterpret_cast<int8_t*>(codes));
}

float quantize_asymmetric(const float* w, int64_t count, uint8_t* codes, int8_t* zero) {
    int z = 0;
    const float s = kt::quant::quantize_asymmetric(w, count, codes, &z);
    *zero = int8_t(z);
    return s;
}

struct Parts {
    uint8_t* codes;
    float* scales;
    int8_t* zeros;
};
Parts parts_of(char* dst, const MatrixLayout& m) {
    return {reinterpret_cast<uint8_t*>(dst + m.codes), reinterpret_cast<float*>(dst + m.scales),
            m.has_zeros ? reinterpret_cast<int8_t*>(dst + m.zeros) : nullptr};
}

std::vector<float> load_row(const kt_matrix& m, int64_t n) {
    std::vector<float> row(size_t(m.cols));
    for (int64_t k = 0; k < m.cols; ++k) row[size_t(k)] = load_element(m.data, m.dtype, n * m.row_stride + k);
    return row;
}

void copy_bytes(const kt_matrix& values, const MatrixLayout& m, uint8_t* codes) {
    const auto* bytes = static_cast<const uint8_t*>(values.data);
    for (int64_t n = 0; n < m.rows; ++n)
        std::memcpy(codes + n * m.cols, bytes + n * values.row_stride, size_t(m.cols));
}

// ---- methods -----------------------------------------------------------------------------

struct Int8 {
    using Codes = IntCodes;
    static constexpr const char* name = "INT8";
    static constexpr const char* layout_id = "kt-int8-rowmajor-ref-v1";
    static constexpr const char* kernel_id = "moe.int8.f32.reference";
    static int64_t group(const kt_moe_config*, int64_t k) { return k; }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_config(const kt_moe_config* s) {
        return check_fixed_config(name, s, 0, "INT8 has one scale per row");
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        return is_codes(w) ? check_int8_codes(w, m, matrix) : check_float_source(name, w, m, matrix);
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        if (is_codes(w)) {
            copy_bytes(w.values, m, p.codes);
            for (int64_t n = 0; n < m.rows; ++n) p.scales[n] = static_cast<const float*>(w.scales.data)[n * w.scales.row_stride];
            return;
        }
        for (int64_t n = 0; n < m.rows; ++n) {
            const std::vector<float> row = load_row(w.values, n);
            p.scales[n] = quantize_symmetric(row.data(), m.cols, 127.0f, -127, 127, p.codes + n * m.cols);
        }
    }
};

struct Int4 {
    using Codes = IntCodes;
    static constexpr const char* name = "INT4";
    static constexpr const char* layout_id = "kt-int4-group-ref-v1";
    static constexpr const char* kernel_id = "moe.int4.f32.reference";
    static int64_t group(const kt_moe_config* s, int64_t) { return s->group_size == 0 ? 128 : s->group_size; }
    static bool has_zeros(const kt_moe_config* s) { return s->quant_flags & KT_QUANT_ZERO_POINT; }
    static kt_status check_config(const kt_moe_config* s) { return check_config_of(name, s); }
    // INT4's group sizes, shared with GPTQ_INT4.
    static kt_status check_config_of(const char* method, const kt_moe_config* s) {
        const int64_t g = group(s, 0);
        if (g != 32 && g != 64 && g != 128)
            return fail(KT_ERROR_INVALID_ARGUMENT, prefix(method) + "group_size " + std::to_string(s->group_size) +
                                                       " is not supported; use 32, 64 or 128 (0 means 128)");
        return check_group_divides(method, s, g);
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        return is_codes(w) ? check_int4_codes(w, m, matrix) : check_float_source(name, w, m, matrix);
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        if (is_codes(w)) {
            // The packed form keeps signed codes q: u - 8 when symmetric, u with zeros z.
            const int bias = m.has_zeros ? 0 : 8;
            for (int64_t n = 0; n < m.rows; ++n) {
                const auto* bytes = static_cast<const uint8_t*>(w.values.data) + n * w.values.row_stride;
                for (int64_t k = 0; k < m.cols; ++k)
                    p.codes[n * m.cols + k] = uint8_t(int8_t(((bytes[k / 2] >> (4 * (k % 2))) & 15) - bias));
                for (int64_t g = 0; g < m.groups; ++g) {
                    p.scales[n * m.groups + g] = static_cast<const float*>(w.scales.data)[n * w.scales.row_stride + g];
                    if (m.has_zeros)
                        p.zeros[n * m.groups + g] = int8_t(static_cast<const uint8_t*>(w.zeros.data)[n * w.zeros.row_stride + g]);
                }
            }
            return;
        }
        for (int64_t n = 0; n < m.rows; ++n) {
            const std::vector<float> row = load_row(w.values, n);
            for (int64_t g = 0; g < m.groups; ++g) {
                const float* src = row.data() + g * m.group;
                uint8_t* codes = p.codes + n * m.cols + g * m.group;
                const int64_t i = n * m.groups + g;
                p.scales[i] = m.has_zeros ? quantize_asymmetric(src, m.group, codes, p.zeros + i)
                                          : quantize_symmetric(src, m.group, 7.0f, -8, 7, codes);
            }
        }
    }
};

// Checkpoint formats with one scale per 32 consecutive k and no zero points.
struct SymmetricGroup32 {
    static constexpr int64_t kGroup = 32;
    static int64_t group(const kt_moe_config*, int64_t) { return kGroup; }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_group32(const char* method, const char* why, const kt_moe_config* s) {
        const kt_status st = check_fixed_config(method, s, kGroup, why);
        return st != KT_OK ? st : check_group_divides(method, s, kGroup);
    }
};

// compressed-tensors "pack-quantized" symmetric INT4, group 32: int32 words holding eight
// codes q + 8 (element k in bits 4*(k%8) of word k/8), one scale per 32 elements.
struct RawInt4 : SymmetricGroup32 {
    using Codes = IntCodes;
    static constexpr const char* name = "RAWINT4";
    static constexpr const char* layout_id = "kt-rawint4-group32-ref-v1";
    static constexpr const char* kernel_id = "moe.rawint4.f32.reference";
    static kt_status check_config(const kt_moe_config* s) {
        return check_group32(name, "compressed-tensors INT4 groups are 32 wide", s);
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const std::string who = prefix(name) + matrix;
        kt_status st;
        if ((st = expect(w.values, who, {KT_DTYPE_I32}, m.rows, m.cols / 8,
                         " (weight_packed: 8 INT4 codes per int32 word)")) != KT_OK)
            return st;
        if ((st = expect(w.scales, who + " scales", kScaleDtypes, m.rows, m.cols / kGroup,
                         " (weight_scale: one per 32 elements)")) != KT_OK)
            return st;
        // The checkpoint's scales are bf16 (the optimized backends keep them as bf16): f32 ones
        // are taken when each is a bf16 value, as an upcast checkpoint's are.
        if (w.scales.dtype == KT_DTYPE_F32)
            for (int64_t r = 0; r < m.rows; ++r)
                for (int64_t c = 0; c < m.cols / kGroup; ++c) {
                    const float v = static_cast<const float*>(w.scales.data)[r * w.scales.row_stride + c];
                    if (bf16_to_f32(f32_to_bf16(v)) != v)
                        return fail(KT_ERROR_INVALID_ARGUMENT, who + " weight_scale [" + std::to_string(r) + ", " +
                                                                   std::to_string(c) + "] = " + std::to_string(v) +
                                                                   " is not a bf16 value; RAWINT4 takes bf16 scales "
                                                                   "(f32 ones only if each is a bf16 value)");
                }
        return expect_absent(w.zeros, who + " zeros", "RAWINT4 is symmetric");
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        const auto* words = static_cast<const int32_t*>(w.values.data);
        for (int64_t n = 0; n < m.rows; ++n) {
            for (int64_t k = 0; k < m.cols; ++k) {
                const uint32_t word = uint32_t(words[n * w.values.row_stride + k / 8]);
                const int nibble = int((word >> (4 * (k % 8))) & 0xfu);
                p.codes[n * m.cols + k] = uint8_t(int8_t(nibble - 8));
            }
            for (int64_t g = 0; g < m.groups; ++g)
                p.scales[n * m.groups + g] = load_element(w.scales.data, w.scales.dtype, n * w.scales.row_stride + g);
        }
    }
};

// DeepSeek-style FP8: E4M3 bytes with one weight_scale_inv per 128x128 block. The packed
// layout repeats a block's scale on each of its 128 rows.
struct Fp8Block {
    using Codes = E4M3Codes;
    static constexpr const char* name = "FP8";
    static constexpr const char* layout_id = "kt-fp8e4m3-block128-ref-v1";
    static constexpr const char* kernel_id = "moe.fp8.f32.reference";
    static constexpr int64_t kBlock = 128;
    static int64_t group(const kt_moe_config*, int64_t) { return kBlock; }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_config(const kt_moe_config* s) {
        return check_fixed_config(name, s, kBlock, "FP8 scales come in the checkpoint's 128x128 blocks");
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const kt_status st = check_e4m3_values(name, w, m, matrix);
        if (st != KT_OK) return st;
        return expect(w.scales, prefix(name) + matrix + " scales", kScaleDtypes, ceil_div(m.rows, kBlock),
                      ceil_div(m.cols, kBlock), " (weight_scale_inv: one per 128x128 block)");
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        copy_bytes(w.values, m, p.codes);
        for (int64_t n = 0; n < m.rows; ++n)
            for (int64_t g = 0; g < m.groups; ++g)
                p.scales[n * m.groups + g] =
                    load_element(w.scales.data, w.scales.dtype, (n / kBlock) * w.scales.row_stride + g);
    }
};

struct Fp8PerChannel {
    using Codes = E4M3Codes;
    static constexpr const char* name = "FP8_PERCHANNEL";
    static constexpr const char* layout_id = "kt-fp8e4m3-perchannel-ref-v1";
    static constexpr const char* kernel_id = "moe.fp8_perchannel.f32.reference";
    static int64_t group(const kt_moe_config*, int64_t k) { return k; }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_config(const kt_moe_config* s) {
        return check_fixed_config(name, s, 0, "FP8_PERCHANNEL has one scale per row");
    }
    // A 1-D [N] scale reaches the ABI as one row [1, N]; a checkpoint's [N, 1] as N rows.
    static bool one_row(const kt_matrix& scales, const MatrixLayout& m) {
        return scales.data && scales.rows == 1 && scales.cols == m.rows;
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const kt_status st = check_e4m3_values(name, w, m, matrix);
        if (st != KT_OK) return st;
        if (one_row(w.scales, m) && has_dtype(w.scales, kScaleDtypes)) return KT_OK;
        return expect(w.scales, prefix(name) + matrix + " scales", kScaleDtypes, m.rows, 1,
                      " (one per row; [" + std::to_string(m.rows) + "] is accepted too)");
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        copy_bytes(w.values, m, p.codes);
        const int64_t step = one_row(w.scales, m) ? 1 : w.scales.row_stride;
        for (int64_t n = 0; n < m.rows; ++n) p.scales[n] = load_element(w.scales.data, w.scales.dtype, n * step);
    }
};

// OCP MXFP4 as GPT-OSS's checkpoints store it (*_blocks, *_scales): uint8 [N, K/2] of E2M1
// codes, element 2j in the low nibble of byte j, and a uint8 E8M0 exponent e per 32 elements,
// scale 2^(e - 127) (0xFF is E8M0's NaN, refused); or the scales as values, bf16 or f32
// (kt-kernel's wrapper takes bf16 ones).
struct Mxfp4 : SymmetricGroup32 {
    using Codes = E2M1Codes;
    static constexpr const char* name = "MXFP4";
    static constexpr const char* layout_id = "kt-mxfp4-group32-ref-v1";
    static constexpr const char* kernel_id = "moe.mxfp4.f32.reference";
    // Scale element `at`: E8M0 byte e -> 2^(e - 127) (exact in f32: 2^-127 is a subnormal), 0xFF -> NaN.
    static double scale(const kt_matrix& sc, int64_t at) {
        if (sc.dtype != KT_DTYPE_U8) return load_element(sc.data, sc.dtype, at);
        const int e = static_cast<const uint8_t*>(sc.data)[at];
        return e == 0xFF ? std::nan("") : std::ldexp(1.0, e - 127);
    }
    static kt_status check_config(const kt_moe_config* s) { return check_group32(name, "MXFP4's scales cover 32 elements", s); }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const std::string who = prefix(name) + matrix;
        kt_status st;
        if ((st = expect(w.values, who + " blocks", {KT_DTYPE_U8}, m.rows, m.cols / 2,
                         " (two E2M1 codes per byte)")) != KT_OK)
            return st;
        if ((st = expect(w.scales, who + " scales", {KT_DTYPE_U8, KT_DTYPE_BF16, KT_DTYPE_F32}, m.rows, m.cols / kGroup,
                         " (E8M0 exponents or their values, one per 32 elements)")) != KT_OK)
            return st;
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t c = 0; c < m.cols / kGroup; ++c)
                if (!std::isfinite(scale(w.scales, r * w.scales.row_stride + c)))
                    return fail(KT_ERROR_INVALID_ARGUMENT, who + " scale " + shape_text(r, c) +
                                                               " is not finite (E8M0 0xFF, or a float NaN/Inf); kt "
                                                               "refuses non-finite weights");
        return expect_absent(w.zeros, who + " zeros", "MXFP4 is symmetric");
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        for (int64_t n = 0; n < m.rows; ++n) {
            const auto* bytes = static_cast<const uint8_t*>(w.values.data) + n * w.values.row_stride;
            for (int64_t k = 0; k < m.cols; ++k) p.codes[n * m.cols + k] = uint8_t((bytes[k / 2] >> (4 * (k % 2))) & 15);
            for (int64_t g = 0; g < m.groups; ++g) p.scales[n * m.groups + g] = float(scale(w.scales, n * w.scales.row_stride + g));
        }
    }
};

// OCP MXFP8 as MiniMax-M3 ships it: E4M3 bytes [N, K] and a uint8 E8M0 exponent per 32
// elements [N, K/32] (weight_scale_inv), scale 2^(e - 127); 0xFF (NaN) is refused.
struct Mxfp8 : SymmetricGroup32 {
    using Codes = E4M3Codes;
    static constexpr const char* name = "MXFP8";
    static constexpr const char* layout_id = "kt-mxfp8-group32-ref-v1";
    static constexpr const char* kernel_id = "moe.mxfp8.f32.reference";
    static kt_status check_config(const kt_moe_config* s) { return check_group32(name, "MXFP8's scales cover 32 elements", s); }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const std::string who = prefix(name) + matrix;
        kt_status st;
        if ((st = check_e4m3_values(name, w, m, matrix)) != KT_OK) return st;
        if ((st = expect(w.scales, who + " scales", {KT_DTYPE_U8}, m.rows, m.cols / kGroup,
                         " (weight_scale_inv: E8M0 exponents, one per 32 elements)")) != KT_OK)
            return st;
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t c = 0; c < m.cols / kGroup; ++c)
                if (static_cast<const uint8_t*>(w.scales.data)[r * w.scales.row_stride + c] == 0xFF)
                    return fail(KT_ERROR_INVALID_ARGUMENT, who + " scale " + shape_text(r, c) +
                                                               " is E8M0 0xFF (NaN); kt refuses non-finite weights");
        return KT_OK;
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        copy_bytes(w.values, m, p.codes);
        for (int64_t n = 0; n < m.rows; ++n)
            for (int64_t g = 0; g < m.groups; ++g)
                p.scales[n * m.groups + g] =
                    float(std::ldexp(1.0, int(static_cast<const uint8_t*>(w.scales.data)[n * w.scales.row_stride + g]) - 127));
    }
};

// NVFP4 as ModelOpt checkpoints store it: weight uint8 [N, K/2] of E2M1 codes (low nibble
// first, as MXFP4), weight_scale E4M3 bytes [N, K/16], and weight_scale_2, the tensor's f32
// global scale, which the ABI carries in the zeros slot as a [1, 1] matrix.
struct Nvfp4 {
    using Codes = E2M1Codes;
    static constexpr const char* name = "NVFP4";
    static constexpr const char* layout_id = "kt-nvfp4-group16-ref-v1";
    static constexpr const char* kernel_id = "moe.nvfp4.f32.reference";
    static constexpr int64_t kGroup = 16;
    static constexpr bool kGlobalScale = true;
    static int64_t group(const kt_moe_config*, int64_t) { return kGroup; }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_config(const kt_moe_config* s) {
        const kt_status st = check_fixed_config(name, s, kGroup, "NVFP4's scales cover 16 elements");
        return st != KT_OK ? st : check_group_divides(name, s, kGroup);
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const std::string who = prefix(name) + matrix;
        kt_status st;
        if ((st = expect(w.values, who + " weight", {KT_DTYPE_U8}, m.rows, m.cols / 2, " (two E2M1 codes per byte)")) != KT_OK)
            return st;
        if ((st = expect(w.scales, who + " weight_scale", {KT_DTYPE_U8}, m.rows, m.cols / kGroup,
                         " (E4M3 bytes, one per 16 elements)")) != KT_OK)
            return st;
        if ((st = expect(w.zeros, who + " weight_scale_2", {KT_DTYPE_F32}, 1, 1, " (the tensor's global scale)")) != KT_OK)
            return st;
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t c = 0; c < m.cols / kGroup; ++c)
                if (e4m3_is_nan(static_cast<const uint8_t*>(w.scales.data)[r * w.scales.row_stride + c]))
                    return fail(KT_ERROR_INVALID_ARGUMENT, who + " weight_scale " + shape_text(r, c) +
                                                               " is the E4M3 NaN code; kt refuses non-finite weights");
        if (!std::isfinite(*static_cast<const float*>(w.zeros.data)))
            return fail(KT_ERROR_INVALID_ARGUMENT, who + " weight_scale_2 is not finite");
        return KT_OK;
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        for (int64_t n = 0; n < m.rows; ++n) {
            const auto* bytes = static_cast<const uint8_t*>(w.values.data) + n * w.values.row_stride;
            for (int64_t k = 0; k < m.cols; ++k) p.codes[n * m.cols + k] = uint8_t((bytes[k / 2] >> (4 * (k % 2))) & 15);
            for (int64_t g = 0; g < m.groups; ++g)
                p.scales[n * m.groups + g] =
                    float(E4M3Codes::value(static_cast<const uint8_t*>(w.scales.data)[n * w.scales.row_stride + g]));
        }
        *reinterpret_cast<float*>(dst + m.global) = *static_cast<const float*>(w.zeros.data);
    }
};

// Symmetric GPTQ-Int4 (AutoGPTQ, sym=true, desc_act=false), K-major as checkpoints store it:
// qweight int32 [K/8, N] (element k of column n in bits 4*(k%8) of word [k/8, n], stored q + 8)
// and scales [K/G, N] (fp16 in checkpoints; f32, f16 or bf16 here), G the layer's group_size.
struct GptqInt4 {
    using Codes = IntCodes;
    static constexpr const char* name = "GPTQ_INT4";
    static constexpr const char* layout_id = "kt-gptq-int4-group-ref-v1";
    static constexpr const char* kernel_id = "moe.gptq_int4.f32.reference";
    static int64_t group(const kt_moe_config* s, int64_t k) { return Int4::group(s, k); }
    static bool has_zeros(const kt_moe_config*) { return false; }
    static kt_status check_config(const kt_moe_config* s) {
        if (s->quant_flags & KT_QUANT_ZERO_POINT)
            return fail(KT_ERROR_INVALID_ARGUMENT, prefix(name) + "zero_point=True is an INT4 option; GPTQ_INT4 is the "
                                                                   "symmetric GPTQ format");
        return Int4::check_config_of(name, s);
    }
    static kt_status check(const kt_weight& w, const MatrixLayout& m, const char* matrix) {
        const std::string who = prefix(name) + matrix;
        kt_status st;
        if ((st = expect(w.values, who + " qweight", {KT_DTYPE_I32}, m.cols / 8, m.rows,
                         " (K-major: 8 codes of one column per int32 word)")) != KT_OK)
            return st;
        if ((st = expect(w.scales, who + " scales", {KT_DTYPE_F32, KT_DTYPE_F16, KT_DTYPE_BF16}, m.groups, m.rows,
                         " (K-major: one row per group of " + std::to_string(m.group) + ")")) != KT_OK)
            return st;
        return expect_absent(w.zeros, who + " zeros", "GPTQ_INT4 is symmetric (qzeros of sym=true models are implied)");
    }
    static void pack(const kt_weight& w, const MatrixLayout& m, char* dst) {
        const Parts p = parts_of(dst, m);
        const auto* words = static_cast<const int32_t*>(w.values.data);
        for (int64_t n = 0; n < m.rows; ++n) {
            for (int64_t k = 0; k < m.cols; ++k) {
                const uint32_t word = uint32_t(words[(k / 8) * w.values.row_stride + n]);
                p.codes[n * m.cols + k] = uint8_t(int8_t(int((word >> (4 * (k % 8))) & 0xfu) - 8));
            }
            for (int64_t g = 0; g < m.groups; ++g)
                p.scales[n * m.groups + g] = load_element(w.scales.data, w.scales.dtype, g * w.scales.row_stride + n);
        }
    }
};

// ---- the method tables -------------------------------------------------------------------

template <class M>
size_t packed_expert_bytes(const kt_moe_config* s) {
    return layout_of<M>(s).bytes;
}

template <class M>
kt_status pack_expert(const kt_moe_config* s, const kt_expert_weights* src, void* dst) {
    kt_status st = M::check_config(s);
    if (st != KT_OK) return st;
    const ExpertLayout l = layout_of<M>(s);
    const kt_weight* weights[3] = {&src->gate, &src->up, &src->down};
    for (int p = 0; p < 3; ++p)
        if ((st = M::check(*weights[p], l.part[p], kMatrixName[p])) != KT_OK) return st;
    for (int p = 0; p < 3; ++p) M::pack(*weights[p], l.part[p], static_cast<char*>(dst));
    return KT_OK;
}

template <class M>
struct Rows {   // ABI 1.5's row reader (reference_common.h): the exact weights dot() multiplies by
    static void row(const kt_moe_config* s, const void* packed, int part, int64_t n, int64_t k0, int64_t k1, double* w) {
        const MatrixLayout& m = layout_of<M>(s).part[part];
        const auto* base = static_cast<const char*>(packed);
        const auto* codes = reinterpret_cast<const uint8_t*>(base + m.codes) + n * m.cols;
        const auto* scales = reinterpret_cast<const float*>(base + m.scales) + n * m.groups;
        const auto* zeros = m.has_zeros ? reinterpret_cast<const int8_t*>(base + m.zeros) + n * m.groups : nullptr;
        const double global = m.has_global ? double(*reinterpret_cast<const float*>(base + m.global)) : 1.0;
        for (int64_t k = k0; k < k1; ++k) {
            const int64_t g = k / m.group;
            w[k - k0] = global * (double(scales[g]) * (M::Codes::value(codes[k]) - (zeros ? zeros[g] : 0.0)));
        }
    }
};

template <class M>
kt_method_kernels method() {
    return with_transposed<Rows<M>>(method_table(M::name, M::layout_id, M::kernel_id, packed_expert_bytes<M>,
                                                 pack_expert<M>, gate_up_tile<M>, down_tile<M>, gate_up_raw_tile<M>));
}

}  // namespace

kt_method_kernels int8_method() { return method<Int8>(); }
kt_method_kernels int4_method() { return method<Int4>(); }
kt_method_kernels rawint4_method() { return method<RawInt4>(); }
kt_method_kernels fp8_method() { return method<Fp8Block>(); }
kt_method_kernels fp8_perchannel_method() { return method<Fp8PerChannel>(); }
kt_method_kernels mxfp4_method() { return method<Mxfp4>(); }
kt_method_kernels gptq_int4_method() { return method<GptqInt4>(); }
kt_method_kernels mxfp8_method() { return method<Mxfp8>(); }
kt_method_kernels nvfp4_method() { return method<Nvfp4>(); }

}  // namespace kt_reference
