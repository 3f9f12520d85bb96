// LLAMAFILE: GGUF experts in their ggml block types, kept as the file stores them.
//
// Packed layout "kt-ggml-rows-ref-v1": gate rows [I][row bytes], up rows, down rows [H][row
// bytes], each matrix starting on 64 bytes; a row is the file's blocks, unchanged. The
// kernels dequantize one weight row to f32 exactly as gguf-py's `gguf.quants.dequantize`
// does (same f32 operations in the same order: the bit-for-bit oracle, tested against it),
// then take the dot product with the f32 activations in double — or, for a layer with
// KT_QUANT_FAST_ACTIVATIONS, with the activations one int8 plane carries: llama.cpp's Q8_K or
// Q8_0 blocks, whichever llama.cpp dots the matrix's type against (one_plane_rows below).
#include "reference_common.h"

#include <kt/formats/ggml_panels.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kt_reference {

namespace {

constexpr size_t kAlign = 64;
size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
float f16(const uint8_t* p) { return f16_to_f32(u16(p)); }

// The arithmetic below is f32 with one rounding per operation, as NumPy does it; this file is
// compiled for the baseline ISA, which has no FMA for the compiler to contract `a * b - c` into.

void dq_q4_0(const uint8_t* b, float* y) {
    const float d = f16(b);
    for (int l = 0; l < 16; ++l) {
        y[l] = d * float(int(b[2 + l] & 15) - 8);
        y[l + 16] = d * float(int(b[2 + l] >> 4) - 8);
    }
}

// Q4_1, Q5_0, Q5_1: ggml's 32-element codes (kt/formats/ggml_panels.h's nibble_codes), then
// gguf-py's arithmetic: d * q + m, d * (q - 16).
void dq_q4_1(const uint8_t* b, float* y) {
    const float d = f16(b), m = f16(b + 2);
    uint8_t u[32];
    kt::layouts::ggml::nibble_codes(b + 4, nullptr, u);
    for (int l = 0; l < 32; ++l) y[l] = d * float(u[l]) + m;
}

void dq_q5_0(const uint8_t* b, float* y) {
    const float d = f16(b);
    uint8_t u[32];
    kt::layouts::ggml::nibble_codes(b + 6, b + 2, u);
    for (int l = 0; l < 32; ++l) y[l] = d * float(int(u[l]) - 16);
}

void dq_q5_1(const uint8_t* b, float* y) {
    const float d = f16(b), m = f16(b + 2);
    uint8_t u[32];
    kt::layouts::ggml::nibble_codes(b + 8, b + 4, u);
    for (int l = 0; l < 32; ++l) y[l] = d * float(u[l]) + m;
}

void dq_q8_0(const uint8_t* b, float* y) {
    const float d = f16(b);
    for (int l = 0; l < 32; ++l) y[l] = float(int8_t(b[2 + l])) * d;
}

void dq_q2_k(const uint8_t* b, float* y) {
    const uint8_t* scales = b;
    const uint8_t* qs = b + 16;
    const float d = f16(b + 80), dmin = f16(b + 82);
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        const float dl = d * float(scales[e / 16] & 15), ml = dmin * float(scales[e / 16] >> 4);
        const float q = float((qs[h * 32 + l] >> (2 * s)) & 3);
        y[e] = dl * q - ml;
    }
}

void dq_q3_k(const uint8_t* b, float* y) {
    const uint8_t* hmask = b;
    const uint8_t* qs = b + 32;
    const uint8_t* sc = b + 96;
    const float d = f16(b + 108);
    for (int e = 0; e < 256; ++e) {
        const int j = e / 16;
        const int lo = (j < 8 ? sc[j] : sc[j - 8] >> 4) & 15, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        const float dl = d * float((lo | (hi << 4)) - 32);
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        const int q = ((qs[h * 32 + l] >> (2 * s)) & 3) - (((hmask[l] >> (e / 32)) & 1) ? 0 : 4);
        y[e] = dl * float(q);
    }
}

// Q4_K/Q5_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

void dq_q4_k(const uint8_t* b, float* y) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* qs = b + 16;
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const float dl = d * float(sc), ml = dmin * float(m);
        for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * float((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) - ml;
    }
}

void dq_q5_k(const uint8_t* b, float* y) {
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const float dl = d * float(sc), ml = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
            const int q = ((qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15) | (((qh[l] >> j) & 1) << 4);
            y[32 * j + l] = dl * float(q) - ml;
        }
    }
}

void dq_q6_k(const uint8_t* b, float* y) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, i = e % 128;
        const int q = (((ql[h * 64 + i % 64] >> (4 * (i / 64))) & 15) | (((qh[h * 32 + i % 32] >> (2 * (i / 32))) & 3) << 4)) - 32;
        y[e] = (d * float(scales[e / 16])) * float(q);
    }
}


void dq_iq4_xs(const uint8_t* b, float* y) {
    const float d = f16(b);
    const uint16_t scales_h = u16(b + 2);
    const uint8_t* scales_l = b + 4;
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 8; ++j) {
        const int ls = (((scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
        const float dl = d * float(ls);
        for (int l = 0; l < 16; ++l) {
            y[32 * j + l] = dl * float(kt::layouts::ggml::kIq4Values[qs[16 * j + l] & 15]);
            y[32 * j + 16 + l] = dl * float(kt::layouts::ggml::kIq4Values[qs[16 * j + l] >> 4]);
        }
    }
}

void dq_iq4_nl(const uint8_t* b, float* y) {
    const float d = f16(b);
    for (int l = 0; l < 16; ++l) {
        y[l] = d * float(kt::layouts::ggml::kIq4Values[b[2 + l] & 15]);
        y[l + 16] = d * float(kt::layouts::ggml::kIq4Values[b[2 + l] >> 4]);
    }
}

// IQ2_XXS and IQ3_XXS: per 32 elements grid indices (one per 8 elements, or two per 8 naming 4
// magnitudes each) and a word of four 7-bit sign indices and a 4-bit scale. The forms of
// kt/formats/ggml_panels.h hold the grids and where each part sits in the file's block: the one
// copy of the format's tables.
template <class F>
void dq_grid(const uint8_t* b, float* y) {
    namespace G = kt::layouts::ggml;
    constexpr int kPer = 8 / F::kIndices;   // magnitudes per index
    const float d = f16(b);
    for (int j = 0; j < 8; ++j) {
        const uint8_t* w = b + F::file_word(j);
        const uint32_t word = uint32_t(w[0]) | uint32_t(w[1]) << 8 | uint32_t(w[2]) << 16 | uint32_t(w[3]) << 24;
        const float db = d * (0.5f + float(word >> 28)) * F::kScaleStep;
        for (int l = 0; l < 4; ++l) {
            const uint8_t signs = G::iq2_sign_byte((word >> (7 * l)) & 127);
            for (int t = 0; t < 8; ++t) {
                const float v = db * float(F::magnitude(b[G::grid_file_index<F>(j, l, t / kPer)], t % kPer));
                y[32 * j + 8 * l + t] = (signs >> t) & 1 ? -v : v;
            }
        }
    }
}

// IQ1_S: per 32 elements a u16 qh of the four groups' high index bits, a 3-bit scale and the sign
// of the shift delta; per 8 elements an 11-bit index into the grid of values in {-1, 0, 1}
// (kt/formats/ggml_panels.h's IQ1S and kIq1sGrid).
void dq_iq1_s(const uint8_t* b, float* y) {
    namespace G = kt::layouts::ggml;
    const float d = f16(b);
    for (int j = 0; j < 8; ++j) {
        const uint16_t qh = u16(b + G::IQ1S::file_qh(j));
        const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -G::kIq1sDelta : G::kIq1sDelta;
        for (int l = 0; l < 4; ++l) {
            const int index = G::IQ1S::index(b[G::grid_file_index<G::IQ1S>(j, l, 0)], qh, l);
            for (int t = 0; t < 8; ++t) y[32 * j + 8 * l + t] = dl * (float(G::iq1s_value(index, t)) + delta);
        }
    }
}

// IQ1_M: IQ1_S's grid and delta (per 8 elements), a 3-bit scale per 16, d spread over four words.
void dq_iq1_m(const uint8_t* b, float* y) {
    namespace G = kt::layouts::ggml;
    const float d = f16_to_f32(G::iq1m_d_bits(b + G::kIq1mWords));
    for (int j = 0; j < 8; ++j) {
        const uint16_t qh = u16(b + G::IQ1M::file_qh(j)), word = u16(b + G::kIq1mWords + 2 * (j / 2));
        for (int l = 0; l < 4; ++l) {
            const float dl = d * float(2 * G::IQ1M::scale(word, j, l / 2) + 1);
            const float delta = G::IQ1M::negative_delta(qh, l) ? -G::kIq1sDelta : G::kIq1sDelta;
            const int index = G::IQ1M::index(b[G::grid_file_index<G::IQ1M>(j, l, 0)], qh, l);
            for (int t = 0; t < 8; ++t) y[32 * j + 8 * l + t] = dl * (float(G::iq1s_value(index, t)) + delta);
        }
    }
}

// IQ2_XS: per 8 elements a u16 of a 9-bit grid index and IQ2_XXS's 7-bit sign index; a 4-bit scale
// per 16 (kt/formats/ggml_panels.h's IQ2XS, kIq2xsGrid).
void dq_iq2_xs(const uint8_t* b, float* y) {
    namespace G = kt::layouts::ggml;
    const float d = f16(b);
    for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 4; ++l) {
            const uint16_t g = u16(b + G::IQ2XS::file_group(j, l));
            const float db = d * (0.5f + float((b[G::IQ2XS::file_scale(j)] >> (4 * (l / 2))) & 15)) * G::IQ2XS::kScaleStep;
            const uint8_t signs = G::iq2_sign_byte(g >> 9);
            for (int t = 0; t < 8; ++t) {
                const float v = db * float(G::iq2xs_magnitude(g & 511, t));
                y[32 * j + 8 * l + t] = (signs >> t) & 1 ? -v : v;
            }
        }
}

// IQ2_S and IQ3_S: per 8 elements a sign byte as the file has it; grid indices of 10 bits (IQ2_S,
// one per 8 elements, a 4-bit scale per 16) or 9 bits (IQ3_S, one per 4 elements, a 4-bit scale per
// 32, d (2 s + 1)); kt/formats/ggml_panels.h's IQ2S / IQ3S and their grids.
template <class F>
void dq_sign_bytes(const uint8_t* b, float* y) {
    namespace G = kt::layouts::ggml;
    constexpr int kPer = 8 / F::kIndices;   // magnitudes per index
    const float d = f16(b);
    for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 4; ++l) {
            float db;
            if constexpr (std::is_same_v<F, G::IQ2S>)
                db = d * (0.5f + float((b[F::file_scale(j)] >> (4 * (l / 2))) & 15)) * F::kScaleStep;
            else
                db = d * float(2 * F::scale(G::u32_at(b + F::kFileScales), j) + 1);
            const uint8_t signs = b[F::file_signs(j) + size_t(l)];
            for (int t = 0; t < 8; ++t) {
                const int h = t / kPer;
                const float v = db * float(F::magnitude(F::index(b[G::grid_file_index<F>(j, l, h)], b[F::file_qh(j)], l, h), t % kPer));
                y[32 * j + 8 * l + t] = (signs >> t) & 1 ? -v : v;
            }
        }
}

// A type the reference reads: its name and block geometry from kt/formats/ggml_panels.h's
// kBlockTypes (the one list of them; a type missing there fails to compile here), its dequantizer.
struct TypeInfo {
    const kt::layouts::ggml::BlockType* block;
    void (*dequantize)(const uint8_t*, float*);
};
constexpr const kt::layouts::ggml::BlockType* listed(kt_dtype d) {
    return kt::layouts::ggml::block_type(d) ? kt::layouts::ggml::block_type(d) : throw "a type kBlockTypes does not list";
}

constexpr TypeInfo kTypes[] = {
    {listed(KT_DTYPE_GGML_Q4_0), dq_q4_0},
    {listed(KT_DTYPE_GGML_Q4_1), dq_q4_1},
    {listed(KT_DTYPE_GGML_Q5_0), dq_q5_0},
    {listed(KT_DTYPE_GGML_Q5_1), dq_q5_1},
    {listed(KT_DTYPE_GGML_Q8_0), dq_q8_0},
    {listed(KT_DTYPE_GGML_Q2_K), dq_q2_k},
    {listed(KT_DTYPE_GGML_Q3_K), dq_q3_k},
    {listed(KT_DTYPE_GGML_Q4_K), dq_q4_k},
    {listed(KT_DTYPE_GGML_Q5_K), dq_q5_k},
    {listed(KT_DTYPE_GGML_Q6_K), dq_q6_k},
    {listed(KT_DTYPE_GGML_IQ4_NL), dq_iq4_nl},
    {listed(KT_DTYPE_GGML_IQ4_XS), dq_iq4_xs},
    {listed(KT_DTYPE_GGML_IQ1_S), dq_iq1_s},
    {listed(KT_DTYPE_GGML_IQ1_M), dq_iq1_m},
    {listed(KT_DTYPE_GGML_IQ2_XS), dq_iq2_xs},
    {listed(KT_DTYPE_GGML_IQ2_S), dq_sign_bytes<kt::layouts::ggml::IQ2S>},
    {listed(KT_DTYPE_GGML_IQ2_XXS), dq_grid<kt::layouts::ggml::IQ2XXS>},
    {listed(KT_DTYPE_GGML_IQ3_XXS), dq_grid<kt::layouts::ggml::IQ3XXS>},
    {listed(KT_DTYPE_GGML_IQ3_S), dq_sign_bytes<kt::layouts::ggml::IQ3S>},
};

const TypeInfo* type_info(kt_dtype dtype) {
    for (const TypeInfo& t : kTypes)
        if (t.block->dtype == dtype) return &t;
    return nullptr;
}

std::string supported_list() {
    std::string s;
    for (const TypeInfo& t : kTypes) s += (s.empty() ? "" : ", ") + std::string(t.block->name);
    return s;
}

const char* const kMatrixName[3] = {"gate", "up", "down"};

struct MatrixLayout {
    const TypeInfo* type;
    int64_t rows, cols, row_bytes;
    size_t offset;
};

// Layout of one expert; `ok` is false when a type is not one this backend reads (the packer
// then refuses, naming it; the size is still a sane number, as the core asks for it first).
struct ExpertLayout {
    MatrixLayout part[3];
    size_t bytes;
    bool ok;
};

ExpertLayout layout_of(const kt_moe_config* s) {
    ExpertLayout l{};
    l.ok = KT_HAS_FIELD(s, kt_moe_config, weight_dtype);
    const int64_t rows[3] = {s->intermediate, s->intermediate, s->hidden};
    const int64_t cols[3] = {s->hidden, s->hidden, s->intermediate};
    size_t at = 0;
    for (int p = 0; p < 3; ++p) {
        MatrixLayout& m = l.part[p];
        m.type = l.ok ? type_info(s->weight_dtype[p]) : nullptr;
        l.ok = l.ok && m.type;
        m.rows = rows[p];
        m.cols = cols[p];
        m.row_bytes = m.type ? m.cols / m.type->block->elems * m.type->block->bytes : 0;
        m.offset = at;
        at += round_up(size_t(m.rows * m.row_bytes));
    }
    l.bytes = at;
    return l;
}

size_t packed_expert_bytes(const kt_moe_config* s) { return layout_of(s).bytes; }

const std::string kWho = "reference backend LLAMAFILE: ";

std::string type_name(kt_dtype d) {
    if (const TypeInfo* t = type_info(d)) return t->block->name;
    if (d >= KT_DTYPE_GGML_BASE) return "ggml type " + std::to_string(int(d) - KT_DTYPE_GGML_BASE);
    return dtype_name(d);
}

kt_status check_config(const kt_moe_config* s) {
    if (!KT_HAS_FIELD(s, kt_moe_config, weight_dtype))
        return fail(KT_ERROR_INVALID_ARGUMENT, kWho + "the core passed no weight types (kt-core older than ABI 1.1)");
    if (s->group_size != 0 || (s->quant_flags & KT_QUANT_ZERO_POINT))
        return fail(KT_ERROR_INVALID_ARGUMENT, kWho + "ggml blocks carry their own scales; group_size and zero_point "
                                                      "do not apply");
    const int64_t k[3] = {s->hidden, s->hidden, s->intermediate};
    for (int p = 0; p < 3; ++p) {
        const TypeInfo* t = type_info(s->weight_dtype[p]);
        if (!t)
            return fail(KT_ERROR_UNSUPPORTED, kWho + kMatrixName[p] + " is " + type_name(s->weight_dtype[p]) +
                                                  "; supported ggml types: " + supported_list());
        if (k[p] % t->block->elems)
            return fail(KT_ERROR_INVALID_ARGUMENT, kWho + kMatrixName[p] + " is " + t->block->name + ", whose blocks hold " +
                                                       std::to_string(t->block->elems) + " elements; K = " +
                                                       std::to_string(k[p]) + " is not a multiple");
    }
    return KT_OK;
}

kt_status pack_expert(const kt_moe_config* s, const kt_expert_weights* src, void* dst) {
    kt_status st = check_config(s);
    if (st != KT_OK) return st;
    const ExpertLayout l = layout_of(s);
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    for (int p = 0; p < 3; ++p) {
        const MatrixLayout& m = l.part[p];
        const kt_matrix& v = w[p]->values;
        const std::string who = kWho + kMatrixName[p] + " (" + m.type->block->name + ")";
        if (!v.data || v.dtype != KT_DTYPE_U8 || v.rows != m.rows || v.cols != m.row_bytes)
            return fail(KT_ERROR_INVALID_ARGUMENT, who + " must be uint8 [" + std::to_string(m.rows) + ", " +
                                                       std::to_string(m.row_bytes) + "] (the blocks of each row); got " +
                                                       describe(v));
        if (w[p]->scales.data || w[p]->zeros.data)
            return fail(KT_ERROR_INVALID_ARGUMENT, who + ": ggml blocks hold their scales; none may be given");
        const auto* bytes = static_cast<const uint8_t*>(v.data);
        for (int64_t r = 0; r < m.rows; ++r)
            for (int64_t b = 0; b < m.row_bytes; b += m.type->block->bytes) {
                if (kt::layouts::ggml::non_finite_scale(*m.type->block, bytes + r * v.row_stride + b))
                    return fail(KT_ERROR_INVALID_ARGUMENT,
                                who + " row " + std::to_string(r) + " block " + std::to_string(b / m.type->block->bytes) +
                                    " has a NaN or Inf scale; kt refuses non-finite weights at load");
            }
    }
    for (int p = 0; p < 3; ++p) {
        const MatrixLayout& m = l.part[p];
        const kt_matrix& v = w[p]->values;
        for (int64_t r = 0; r < m.rows; ++r)
            std::memcpy(static_cast<char*>(dst) + m.offset + size_t(r * m.row_bytes),
                        static_cast<const uint8_t*>(v.data) + r * v.row_stride, size_t(m.row_bytes));
    }
    return KT_OK;
}

void dequantize_row(const MatrixLayout& m, const char* packed, int64_t n, float* y) {
    const auto* row = reinterpret_cast<const uint8_t*>(packed + m.offset) + n * m.row_bytes;
    for (int64_t b = 0; b < m.cols / m.type->block->elems; ++b)
        m.type->dequantize(row + b * m.type->block->bytes, y + b * m.type->block->elems);
}

double dot(const float* x, const float* w, int64_t k) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i) acc += double(x[i]) * double(w[i]);
    return acc;
}

// f32 -> the nearest f16 (ties to even), as f32: llama.cpp keeps its Q8_0 activation scales as
// f16. Bitwise, for this file's baseline ISA has no F16C.
float f16_round(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    const uint32_t a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) return v;                    // Inf, NaN
    float r;
    if (a >= 0x477ff000u) {                            // from 65520 up: Inf
        r = INFINITY;
    } else if (a < 0x38800000u) {                      // below 2^-14: f16 subnormals, steps of 2^-24
        r = std::nearbyint(std::fabs(v) * 16777216.0f) / 16777216.0f;
    } else {                                           // 10 of the 23 mantissa bits, ties to even
        const uint32_t rounded = (a + 0xfffu + ((a >> 13) & 1u)) & ~0x1fffu;
        std::memcpy(&r, &rounded, 4);
    }
    return (b >> 31) ? -r : r;
}

// The activations a layer with KT_QUANT_FAST_ACTIVATIONS carries into a matrix of type t: one
// int8 plane in llama.cpp's form for that type (the kernels' one-pass planes): Q8_K for the
// 256-element types — per group of 256 k (the last may be shorter), s = max|x| / 127 — and Q8_0
// for the 32-element ones — per 32 k, s = f16(max|x| / 127); x ~ s * q, q = x * (127 / max|x|) rounded
// to nearest, ties to even (Q4_1's and Q5_1's Q8_1 blocks hold these values too, plus an f16 of
// s * sum(q) for the min term, which kt takes exact). A NaN makes its group NaN; an all-zero group stays zero. Without the
// flag: x as given.
const float* one_plane_rows(const kt_moe_config* s, const TypeInfo* t, const void* act, int64_t rows, int64_t k,
                            std::vector<float>& held) {
    const auto* x = static_cast<const float*>(act);
    if (!(s->quant_flags & KT_QUANT_FAST_ACTIVATIONS)) return x;
    const int64_t group = t->block->elems == 32 ? 32 : 256;
    held.assign(size_t(rows * k), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t k0 = 0; k0 < k; k0 += group) {
            const float* in = x + r * k + k0;
            float* out = held.data() + r * k + k0;
            const int64_t n = std::min<int64_t>(group, k - k0);
            float amax = 0.0f;
            bool nan = false;
            for (int64_t i = 0; i < n; ++i) {
                amax = std::max(amax, std::fabs(in[i]));
                nan |= in[i] != in[i];
            }
            const float scale = nan ? NAN : group == 32 ? f16_round(amax / 127.0f) : amax / 127.0f;
            const float inv = !nan && amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
            for (int64_t i = 0; i < n; ++i) out[i] = std::nearbyint(in[i] * inv) * scale;
        }
    return held.data();
}

// Every (row, column) of the tile's gate and up products, handed to emit(r, n, g, u).
template <class Emit>
kt_status gate_up_pairs(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                        const Emit& emit) {
    const ExpertLayout l = layout_of(s);
    if (!l.ok) return check_config(s);
    const auto* base = static_cast<const char*>(packed);
    std::vector<float> held_g, held_u;
    const float* xg = one_plane_rows(s, l.part[0].type, act, rows, s->hidden, held_g);
    const float* xu = one_plane_rows(s, l.part[1].type, act, rows, s->hidden, held_u);
    std::vector<float> g(size_t(s->hidden)), u(size_t(s->hidden));
    for (int64_t n = n0; n < n1; ++n) {
        dequantize_row(l.part[0], base, n, g.data());
        dequantize_row(l.part[1], base, n, u.data());
        for (int64_t r = 0; r < rows; ++r)
            emit(r, n, dot(xg + r * s->hidden, g.data(), s->hidden), dot(xu + r * s->hidden, u.data(), s->hidden));
    }
    return KT_OK;
}

kt_status gate_up_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                       int64_t n1, float* out, int64_t out_stride) {
    return gate_up_pairs(s, packed, act, rows, n0, n1, GatedOut{s, out, out_stride});
}

kt_status gate_up_raw_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t out_stride) {
    return gate_up_pairs(s, packed, act, rows, n0, n1, RawOut{out_gate, out_up, out_stride, n0});
}

kt_status down_tile(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0,
                    int64_t n1, float* out, int64_t out_stride) {
    const ExpertLayout l = layout_of(s);
    if (!l.ok) return check_config(s);
    const auto* base = static_cast<const char*>(packed);
    std::vector<float> held;
    const float* x = one_plane_rows(s, l.part[2].type, act, rows, s->intermediate, held);
    std::vector<float> d(size_t(s->intermediate));
    for (int64_t n = n0; n < n1; ++n) {
        dequantize_row(l.part[2], base, n, d.data());
        for (int64_t r = 0; r < rows; ++r)
            out[r * out_stride + n] = float(dot(x + r * s->intermediate, d.data(), s->intermediate));
    }
    return KT_OK;
}

}  // namespace

bool ggml_dequantize(kt_dtype dtype, const uint8_t* data, int64_t blocks, float* out, std::string* error) {
    const TypeInfo* t = type_info(dtype);
    if (!t) {
        *error = "ggml type " + type_name(dtype) + " is not one the reference backend reads; supported: " + supported_list();
        return false;
    }
    for (int64_t b = 0; b < blocks; ++b) t->dequantize(data + b * t->block->bytes, out + b * t->block->elems);
    return true;
}

int64_t ggml_block_bytes(kt_dtype dtype) {
    const TypeInfo* t = type_info(dtype);
    return t ? t->block->bytes : 0;
}

int64_t ggml_block_elems(kt_dtype dtype) {
    const TypeInfo* t = type_info(dtype);
    return t ? t->block->elems : 0;
}

namespace {
struct Rows {   // ABI 1.5's row reader (reference_common.h): the whole row dequantized, the range kept
    static void row(const kt_moe_config* s, const void* packed, int part, int64_t n, int64_t k0, int64_t k1, double* w) {
        const ExpertLayout l = layout_of(s);
        thread_local std::vector<float> y;
        y.resize(size_t(l.part[part].cols));
        dequantize_row(l.part[part], static_cast<const char*>(packed), n, y.data());
        for (int64_t k = k0; k < k1; ++k) w[k - k0] = y[size_t(k)];
    }
};
}  // namespace

kt_method_kernels llamafile_method() {
    return with_transposed<Rows>(method_table("LLAMAFILE", "kt-ggml-rows-ref-v1", "moe.ggml.f32.reference",
                                              packed_expert_bytes, pack_expert, gate_up_tile, down_tile, gate_up_raw_tile));
}

}  // namespace kt_reference
