// INT4 experts, group-wise (docs/formats.md): unsigned 4-bit codes u with w = s * (u - z) per
// group of G consecutive k (32, 64 or 128); symmetric groups store u = q + 8 and z = 8.
// RAWINT4 (compressed-tensors, Kimi-K2) is the same thing with G = 32 and z = 8, so its codes
// and bf16 scales are repacked bit-exactly into its own variant of the layout (int4_layout.h:
// "kt-int4-p16-v2" for INT4, "kt-rawint4-p16-v1" with bf16 scales for RAWINT4).
// MXFP4 (OCP microscaling, GPT-OSS) rides the same kernel: its E2M1 codes sit where INT4's
// codes do, a byte shuffle turns each into u = 2 value + 12 (0..24), and the group epilogue
// subtracts 12 instead of 8; its group headers are the file's E8M0 bytes ("kt-mxfp4-p16-v2",
// packed_layouts.h): 4.25 bits per weight, as the file. NVFP4 (ModelOpt) is the
// same E2M1 arithmetic in groups of 16 whose headers are E4M3 bytes, times a per-panel vector
// holding the tensor's global scale ("kt-nvfp4-p16-v1"): 4.5 bits per weight, as the file.
//
// Kernel: per group, exact integer dots of the codes with both int8 activation planes
// (vpdpbusd: unsigned codes x signed activations; without VNNI vpmaddubsw cannot saturate
// since u <= 15), then acc += s * dot - s*z * sum(activations in the group), the row's
// activation scale s_a applied once at the end.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <kt/formats/checkpoint_inputs.h>
#include <kt/formats/quant_rules.h>

#include "int4_layout.h"
#include "int_dot.h"
#include "lanes.h"
#include "methods.h"
#include "wide_panels.h"

namespace KT_TARGET_NAMESPACE {
namespace {

constexpr size_t kChunkBytes = 64;

// One group of one channel: codes u (0..15) and (s, z) by kt-core's INT4 rules (kt/formats/quant_rules.h),
// the arithmetic every backend and kt convert share.
void quantize_group(const float* w, int64_t g, bool zero_point, uint8_t* u, float* s_out, float* z_out) {
    if (!zero_point) {
        int8_t q[128];   // g <= 128 (check_group)
        *s_out = kt::quant::quantize_symmetric(w, g, 7.0f, -8, 7, q);
        for (int64_t i = 0; i < g; ++i) u[i] = uint8_t(q[i] + 8);
        *z_out = 8.0f;
        return;
    }
    int z = 0;
    *s_out = kt::quant::quantize_asymmetric(w, g, u, &z);
    *z_out = float(z);
}

// Writes one group block for 16 channels from their codes u[lane][G] and (s, z) per lane.
void write_block(const Int4Layout& lay, uint8_t* dst, const uint8_t* u, const float* s, const float* z) {
    auto* scale = reinterpret_cast<float*>(dst);
    auto* sz = reinterpret_cast<float*>(dst + 64);
    uint8_t* chunks = dst + lay.header_bytes();
    for (int lane = 0; lane < kPanel; ++lane) {
        if (lay.bf16_scales)
            reinterpret_cast<uint16_t*>(dst)[lane] = f32_to_bf16(s[lane]);   // exact: check_raw
        else
            scale[lane] = s[lane];
        if (lay.zero_point) sz[lane] = s[lane] * z[lane];
        for (int64_t c = 0; c < lay.g / 8; ++c)
            for (int b = 0; b < 4; ++b)
                chunks[size_t(c) * kChunkBytes + size_t(lane) * 4 + size_t(b)] =
                    uint8_t(u[lane * lay.g + c * 8 + b] | (u[lane * lay.g + c * 8 + 4 + b] << 4));
    }
}

kt_status check_group(const char* method, int64_t g, int64_t H, int64_t I) {
    if (g != 32 && g != 64 && g != 128)
        return fail(KT_ERROR_INVALID_ARGUMENT, "%s: group_size %lld is not supported; use 32, 64 or 128", method, (long long)g);
    if (H % g || I % g)
        return fail(KT_ERROR_INVALID_ARGUMENT,
                    "%s: group_size %lld must divide hidden (%lld) and intermediate (%lld), the K of gate/up and of down",
                    method, (long long)g, (long long)H, (long long)I);
    return KT_OK;
}

// Source of one channel's codes and group parameters, for either method's input.
struct Source {
    virtual void channel(int64_t n, uint8_t* u, float* s, float* z) const = 0;
    virtual ~Source() = default;
};

struct FloatSource final : Source {
    const kt_matrix& m;
    int64_t g;
    bool zero_point;
    mutable std::vector<float> row;
    FloatSource(const kt_matrix& matrix, int64_t group, bool zp) : m(matrix), g(group), zero_point(zp), row(size_t(m.cols)) {}
    void channel(int64_t n, uint8_t* u, float* s, float* z) const override {
        load_row(m, n, row.data());
        for (int64_t grp = 0; grp < m.cols / g; ++grp)
            quantize_group(row.data() + grp * g, g, zero_point, u + grp * g, s + grp, z + grp);
    }
};

// compressed-tensors pack-quantized (RAWINT4): kt-core reads the codes and scales
// (kt/formats/checkpoint_inputs.h, shared with kt-backend-kml).
struct RawSource final : Source {
    const kt_weight& w;
    explicit RawSource(const kt_weight& weight) : w(weight) {}
    void channel(int64_t n, uint8_t* u, float* s, float* z) const override {
        kt::inputs::rawint4_channel(w, n, u, s);
        for (int64_t grp = 0; grp < w.scales.cols; ++grp) z[grp] = 8.0f;
    }
};

kt_status check_codes(const kt_weight& w, int64_t N, int64_t K, int64_t g, bool zp, const char* name) {
    if (w.values.dtype != KT_DTYPE_U8 || w.values.rows != N || w.values.cols * 2 != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "INT4: %s codes should be uint8 [%lld, %lld] (two per byte), got %s [%lld, %lld]",
                    name, (long long)N, (long long)(K / 2), dtype_name(w.values.dtype), (long long)w.values.rows,
                    (long long)w.values.cols);
    if (!w.scales.data || w.scales.dtype != KT_DTYPE_F32 || w.scales.rows != N || w.scales.cols * g != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "INT4: %s codes need f32 scales [%lld, %lld] (group %lld), got %s [%lld, %lld]",
                    name, (long long)N, (long long)(K / g), (long long)g,
                    w.scales.data ? dtype_name(w.scales.dtype) : "none", (long long)w.scales.rows, (long long)w.scales.cols);
    if (!zp) {
        if (w.zeros.data)
            return fail(KT_ERROR_INVALID_ARGUMENT, "INT4: %s zero points given to a symmetric layer (zero_point=False)", name);
        return KT_OK;
    }
    if (!w.zeros.data || w.zeros.dtype != KT_DTYPE_U8 || w.zeros.rows != N || w.zeros.cols * g != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "INT4: %s needs uint8 zero points [%lld, %lld] (zero_point=True), got %s", name,
                    (long long)N, (long long)(K / g), w.zeros.data ? dtype_name(w.zeros.dtype) : "none");
    for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K / g; ++c)
            if (static_cast<const uint8_t*>(w.zeros.data)[r * w.zeros.row_stride + c] > 15)
                return fail(KT_ERROR_INVALID_ARGUMENT, "INT4: %s zero points must be in [0, 15]; got %d at [%lld, %lld]", name,
                            int(static_cast<const uint8_t*>(w.zeros.data)[r * w.zeros.row_stride + c]), (long long)r,
                            (long long)c);
    return KT_OK;
}

void pack_matrix(const Source& src, const Int4Layout& lay, int64_t N, int64_t K, uint8_t* dst, size_t stride_panels) {
    const int64_t g = lay.g;
    std::vector<uint8_t> u(size_t(kPanel * K));
    std::vector<float> s(size_t(kPanel * (K / g))), z(size_t(kPanel * (K / g)));
    std::vector<uint8_t> block_u(size_t(kPanel * g));
    float bs[kPanel], bz[kPanel];
    for (int64_t p = 0; p < panels(N); ++p) {
        std::fill(u.begin(), u.end(), uint8_t(0));
        std::fill(s.begin(), s.end(), 0.0f);
        std::fill(z.begin(), z.end(), 0.0f);
        for (int lane = 0; lane < kPanel && p * kPanel + lane < N; ++lane)
            src.channel(p * kPanel + lane, u.data() + lane * K, s.data() + lane * (K / g), z.data() + lane * (K / g));
        uint8_t* panel = dst + size_t(p) * stride_panels * lay.panel_bytes(K);
        for (int64_t grp = 0; grp < K / g; ++grp) {
            for (int lane = 0; lane < kPanel; ++lane) {
                std::copy_n(u.data() + lane * K + grp * g, g, block_u.data() + lane * g);
                bs[lane] = s[size_t(lane * (K / g) + grp)];
                bz[lane] = z[size_t(lane * (K / g) + grp)];
            }
            write_block(lay, panel + size_t(grp) * lay.group_bytes(), block_u.data(), bs, bz);
        }
    }
}

// kt's stored codes straight into the layout, a 32-bit word at a time: a stored word holds
// u0..u7 as nibble pairs (u0|u1<<4, u2|u3<<4, ...); the layout's word for the same 8 k holds
// (u0|u4<<4, u1|u5<<4, u2|u6<<4, u3|u7<<4). Loading converted folders runs through here.
struct LayoutWord {
    static uint32_t scalar(uint32_t x) {
        const uint32_t even = x & 0x0F0F0F0Fu, odd = (x >> 4) & 0x0F0F0F0Fu;   // bytes u0 u2 u4 u6 / u1 u3 u5 u7
        const uint32_t first = (even & 0xFFu) | (odd & 0xFFu) << 8 | ((even >> 8) & 0xFFu) << 16 | ((odd >> 8) & 0xFFu) << 24;
        const uint32_t second = ((even >> 16) & 0xFFu) | ((odd >> 16) & 0xFFu) << 8 | ((even >> 24) & 0xFFu) << 16 |
                                ((odd >> 24) & 0xFFu) << 24;
        return first | second << 4;
    }
#if defined(__AVX512F__)
    // Byte shuffles within each word: index (0x80 = zero) for word d of a 128-bit lane.
    static constexpr int32_t pick(int d, int a, int b, bool odd_slots) {
        const uint32_t lo = odd_slots ? 0x80u : uint32_t(4 * d + a), hi = odd_slots ? uint32_t(4 * d + a) : 0x80u;
        const uint32_t lo2 = odd_slots ? 0x80u : uint32_t(4 * d + b), hi2 = odd_slots ? uint32_t(4 * d + b) : 0x80u;
        return int32_t(lo | hi << 8 | lo2 << 16 | hi2 << 24);
    }
    static __m512i vector(__m512i x) {
        const __m512i nib = _mm512_set1_epi32(0x0F0F0F0F);
        const __m512i even = _mm512_and_si512(x, nib), odd = _mm512_and_si512(_mm512_srli_epi32(x, 4), nib);
        const __m512i e_first = _mm512_set4_epi32(pick(3, 0, 1, false), pick(2, 0, 1, false), pick(1, 0, 1, false), pick(0, 0, 1, false));
        const __m512i o_first = _mm512_set4_epi32(pick(3, 0, 1, true), pick(2, 0, 1, true), pick(1, 0, 1, true), pick(0, 0, 1, true));
        const __m512i e_second = _mm512_set4_epi32(pick(3, 2, 3, false), pick(2, 2, 3, false), pick(1, 2, 3, false), pick(0, 2, 3, false));
        const __m512i o_second = _mm512_set4_epi32(pick(3, 2, 3, true), pick(2, 2, 3, true), pick(1, 2, 3, true), pick(0, 2, 3, true));
        const __m512i first = _mm512_or_si512(_mm512_shuffle_epi8(even, e_first), _mm512_shuffle_epi8(odd, o_first));
        const __m512i second = _mm512_or_si512(_mm512_shuffle_epi8(even, e_second), _mm512_shuffle_epi8(odd, o_second));
        return _mm512_or_si512(first, _mm512_slli_epi32(second, 4));
    }
#endif
};

// scale_of(n, group) -> the header's f32 scale of channel n's group.
template <class ScaleOf>
void pack_codes_matrix(const kt_weight& w, const Int4Layout& lay, int64_t N, int64_t K, uint8_t* dst, size_t stride_panels,
                       ScaleOf scale_of) {
    const int64_t g = lay.g;
    const auto* codes = static_cast<const uint8_t*>(w.values.data);
    const auto* zeros = static_cast<const uint8_t*>(w.zeros.data);
    const int64_t groups = K / g;
    for (int64_t p = 0; p < panels(N); ++p) {
        uint8_t* panel = dst + size_t(p) * stride_panels * lay.panel_bytes(K);
        for (int64_t grp = 0; grp < groups; ++grp) {
            uint8_t* block = panel + size_t(grp) * lay.group_bytes();
            auto* scale = reinterpret_cast<float*>(block);
            auto* sz = reinterpret_cast<float*>(block + 64);
            const uint8_t* rows[kPanel] = {};
            for (int lane = 0; lane < kPanel; ++lane) {
                const int64_t n = p * kPanel + lane;
                if (n >= N) continue;      // rows past N stay zero, as the buffer came
                const float s = scale_of(n, grp);
                scale[lane] = s;
                if (lay.zero_point) sz[lane] = s * float(zeros[n * w.zeros.row_stride + grp]);
                rows[lane] = codes + n * w.values.row_stride + grp * g / 2;
            }
            pack_lanes<LayoutWord>(rows, g / 8, block + lay.header_bytes());
        }
    }
}

kt_status pack_int4(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const Int4Layout lay = int4_layout(c, false);
    const int64_t H = c->hidden, I = c->intermediate, g = lay.g;
    kt_status st;
    if ((st = check_group("INT4", g, H, I)) != KT_OK) return st;
    const bool zp = lay.zero_point;
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    const char* names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i) {
        st = w[i]->values.dtype == KT_DTYPE_U8 ? check_codes(*w[i], rows[i], cols[i], g, zp, names[i])
                                               : expect_float_weight(*w[i], rows[i], cols[i], names[i], "INT4");
        if (st != KT_OK) return st;
    }
    auto* out = static_cast<uint8_t*>(dst);
    const ExpertPanels l = lay.expert(c);
    const size_t offsets[3] = {l.gate(0), l.up(0), l.down(0)}, strides[3] = {2, 2, 1};
    for (int i = 0; i < 3; ++i) {
        if (w[i]->values.dtype == KT_DTYPE_U8) {
            const kt_matrix& sc = w[i]->scales;
            pack_codes_matrix(*w[i], lay, rows[i], cols[i], out + offsets[i], strides[i], [&](int64_t n, int64_t grp) {
                return static_cast<const float*>(sc.data)[n * sc.row_stride + grp];
            });
        } else
            pack_matrix(FloatSource(w[i]->values, g, zp), lay, rows[i], cols[i], out + offsets[i], strides[i]);
    }
    return KT_OK;
}

// Symmetric GPTQ-Int4 (sym=true, desc_act=false), K-major as AutoGPTQ stores it: qweight int32
// [K/8, N] with element k of column n in bits 4*(k%8) of word [k/8, n], stored u = q + 8, and
// scales [K/G, N] (f32, f16 or bf16). It is INT4's symmetric format transposed, so it packs into
// INT4's layout and runs INT4's kernels (and any backend that reads that layout).
struct GptqSource final : Source {
    const kt_weight& w;
    explicit GptqSource(const kt_weight& weight) : w(weight) {}
    void channel(int64_t n, uint8_t* u, float* s, float* z) const override {
        const auto* words = static_cast<const uint32_t*>(w.values.data);
        for (int64_t k = 0; k < w.values.rows * 8; ++k) u[k] = uint8_t((words[(k / 8) * w.values.row_stride + n] >> (4 * (k % 8))) & 15u);
        for (int64_t grp = 0; grp < w.scales.rows; ++grp) {
            s[grp] = float_at(w.scales, grp * w.scales.row_stride + n);
            z[grp] = 8.0f;
        }
    }
};

kt_status check_gptq(const kt_weight& w, int64_t N, int64_t K, int64_t g, const char* name) {
    if (w.values.dtype != KT_DTYPE_I32 || w.values.rows * 8 != K || w.values.cols != N)
        return fail(KT_ERROR_INVALID_ARGUMENT, "GPTQ_INT4: %s qweight should be int32 [%lld, %lld] (K-major, 8 codes per word), got %s [%lld, %lld]",
                    name, (long long)(K / 8), (long long)N, dtype_name(w.values.dtype), (long long)w.values.rows,
                    (long long)w.values.cols);
    const bool dtype_ok = w.scales.dtype == KT_DTYPE_F32 || w.scales.dtype == KT_DTYPE_F16 || w.scales.dtype == KT_DTYPE_BF16;
    if (!w.scales.data || !dtype_ok || w.scales.rows * g != K || w.scales.cols != N)
        return fail(KT_ERROR_INVALID_ARGUMENT, "GPTQ_INT4: %s scales should be float [%lld, %lld] (K-major, group %lld), got %s [%lld, %lld]",
                    name, (long long)(K / g), (long long)N, (long long)g, w.scales.data ? dtype_name(w.scales.dtype) : "none",
                    (long long)w.scales.rows, (long long)w.scales.cols);
    if (w.zeros.data) return fail(KT_ERROR_INVALID_ARGUMENT, "GPTQ_INT4: %s is symmetric; zero points must not be given", name);
    return KT_OK;
}

kt_status pack_gptq(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    if (c->quant_flags & KT_QUANT_ZERO_POINT)
        return fail(KT_ERROR_INVALID_ARGUMENT, "GPTQ_INT4: zero_point=True is an INT4 option; GPTQ_INT4 is the symmetric GPTQ format");
    const Int4Layout lay = int4_layout(c, false);
    const int64_t H = c->hidden, I = c->intermediate;
    kt_status st;
    if ((st = check_group("GPTQ_INT4", lay.g, H, I)) != KT_OK) return st;
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    const char* names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i)
        if ((st = check_gptq(*w[i], rows[i], cols[i], lay.g, names[i])) != KT_OK) return st;
    auto* out = static_cast<uint8_t*>(dst);
    const ExpertPanels l = lay.expert(c);
    pack_matrix(GptqSource(src->gate), lay, I, H, out + l.gate(0), 2);
    pack_matrix(GptqSource(src->up), lay, I, H, out + l.up(0), 2);
    pack_matrix(GptqSource(src->down), lay, H, I, out + l.down(0), 1);
    return KT_OK;
}

kt_status check_raw(const kt_weight& w, int64_t N, int64_t K, const char* name) {
    const std::string err = kt::inputs::check_rawint4(w, N, K, name);
    return err.empty() ? KT_OK : fail(KT_ERROR_INVALID_ARGUMENT, "%s", err.c_str());
}

kt_status pack_raw(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    kt_status st;
    if ((st = check_group("RAWINT4", 32, H, I)) != KT_OK) return st;
    if ((st = check_raw(src->gate, I, H, "gate")) != KT_OK) return st;
    if ((st = check_raw(src->up, I, H, "up")) != KT_OK) return st;
    if ((st = check_raw(src->down, H, I, "down")) != KT_OK) return st;
    auto* out = static_cast<uint8_t*>(dst);
    const Int4Layout lay = int4_layout(c, true);
    const ExpertPanels l = lay.expert(c);
    pack_matrix(RawSource(src->gate), lay, I, H, out + l.gate(0), 2);
    pack_matrix(RawSource(src->up), lay, I, H, out + l.up(0), 2);
    pack_matrix(RawSource(src->down), lay, H, I, out + l.down(0), 1);
    return KT_OK;
}

// Packs the codes of a format whose group headers are one byte per channel as the checkpoint ships
// them (MXFP4's E8M0, NVFP4's E4M3): byte_of(n, grp) gives channel n's header byte of group grp.
// Panel prefixes (NVFP4's) are the caller's.
template <class ByteOf>
void pack_byte_header_matrix(const kt_weight& w, const Int4Layout& lay, int64_t N, int64_t K, uint8_t* dst,
                             size_t stride_panels, ByteOf byte_of) {
    const auto* codes = static_cast<const uint8_t*>(w.values.data);
    for (int64_t p = 0; p < panels(N); ++p) {
        uint8_t* panel = dst + size_t(p) * stride_panels * lay.panel_bytes(K);
        for (int64_t grp = 0; grp < K / lay.g; ++grp) {
            uint8_t* block = panel + lay.group_at(grp);
            const uint8_t* lane_codes[kPanel] = {};
            for (int lane = 0; lane < kPanel; ++lane) {
                const int64_t n = p * kPanel + lane;
                if (n >= N) continue;   // rows past N stay zero, as the buffer came
                block[lane] = byte_of(n, grp);
                lane_codes[lane] = codes + n * w.values.row_stride + grp * lay.g / 2;
            }
            pack_lanes<LayoutWord>(lane_codes, lay.g / 8, block + lay.header_bytes());
        }
    }
}

// MXFP4 as checkpoints store it (GPT-OSS's *_blocks / *_scales): uint8 [N, K/2], element 2j in
// the low nibble of byte j, and one scale per 32 elements [N, K/32]: the uint8 E8M0 exponents,
// or their values as bf16 / f32 (kt-kernel's wrapper takes bf16 ones), which must then be the
// powers of two an E8M0 byte holds: the layout keeps the byte.
// The E8M0 byte of a float scale 2^(e - 127), or -1 when the value is not one.
int e8m0_of(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (bits == 0x00400000u) return 0;   // 2^-127, subnormal
    const uint32_t exponent = bits >> 23;   // the sign bit makes it >= 256: refused
    return (bits & 0x7fffffu) == 0 && exponent >= 1 && exponent <= 254 ? int(exponent) : -1;
}

uint8_t mx_scale_byte(const kt_matrix& sc, int64_t n, int64_t grp) {
    const int64_t at = n * sc.row_stride + grp;
    if (sc.dtype == KT_DTYPE_U8) return static_cast<const uint8_t*>(sc.data)[at];
    return uint8_t(e8m0_of(float_at(sc, at)));   // check_mx refused the others
}

kt_status check_mx(const kt_weight& w, int64_t N, int64_t K, const char* name) {
    if (w.values.dtype != KT_DTYPE_U8 || w.values.rows != N || w.values.cols * 2 != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: %s blocks should be uint8 [%lld, %lld] (two E2M1 codes per byte), got %s [%lld, %lld]",
                    name, (long long)N, (long long)(K / 2), dtype_name(w.values.dtype), (long long)w.values.rows,
                    (long long)w.values.cols);
    const bool dtype_ok = w.scales.dtype == KT_DTYPE_U8 || w.scales.dtype == KT_DTYPE_BF16 || w.scales.dtype == KT_DTYPE_F32;
    if (!w.scales.data || !dtype_ok || w.scales.rows != N || w.scales.cols * 32 != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: %s scales should be uint8 E8M0 (or bf16, f32) [%lld, %lld] (one per 32 elements), got %s [%lld, %lld]",
                    name, (long long)N, (long long)(K / 32), w.scales.data ? dtype_name(w.scales.dtype) : "none",
                    (long long)w.scales.rows, (long long)w.scales.cols);
    if (w.zeros.data) return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: %s is symmetric; zero points must not be given", name);
    for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K / 32; ++c) {
            const int64_t at = r * w.scales.row_stride + c;
            if (w.scales.dtype == KT_DTYPE_U8) {
                if (static_cast<const uint8_t*>(w.scales.data)[at] == 0xFF)
                    return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: %s scale [%lld, %lld] is E8M0 0xFF (NaN); kt refuses non-finite "
                                "weights", name, (long long)r, (long long)c);
            } else if (e8m0_of(float_at(w.scales, at)) < 0) {
                return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: %s scale [%lld, %lld] = %g is not an E8M0 scale (a power of two "
                            "from 2^-127 to 2^127); float MXFP4 scales must hold the file's exponents", name, (long long)r,
                            (long long)c, double(float_at(w.scales, at)));
            }
        }
    return KT_OK;
}

kt_status pack_mxfp4(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    if (c->quant_flags & KT_QUANT_ZERO_POINT)
        return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: zero_point=True is an INT4 option; MXFP4 is symmetric");
    if (c->group_size != 0 && c->group_size != 32)
        return fail(KT_ERROR_INVALID_ARGUMENT, "MXFP4: its scales cover 32 elements; group_size must be 0 or 32, got %lld",
                    (long long)c->group_size);
    kt_status st;
    if ((st = check_group("MXFP4", 32, H, I)) != KT_OK) return st;
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    const char* names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i)
        if ((st = check_mx(*w[i], rows[i], cols[i], names[i])) != KT_OK) return st;
    auto* out = static_cast<uint8_t*>(dst);
    const Int4Layout lay = mxfp4_layout();
    const ExpertPanels l = lay.expert(c);
    const size_t offsets[3] = {l.gate(0), l.up(0), l.down(0)}, strides[3] = {2, 2, 1};
    for (int i = 0; i < 3; ++i) {
        const kt_matrix& sc = w[i]->scales;
        pack_byte_header_matrix(*w[i], lay, rows[i], cols[i], out + offsets[i], strides[i],
                                [&](int64_t n, int64_t grp) { return mx_scale_byte(sc, n, grp); });
    }
    return KT_OK;
}

// NVFP4 as ModelOpt checkpoints store it: weight uint8 [N, K/2] (E2M1 pairs, low nibble first,
// as MXFP4), weight_scale E4M3 bytes [N, K/16], and weight_scale_2, the tensor's f32 global
// scale, which reaches the ABI in the zeros slot as a [1, 1] f32 matrix (docs/plugin-abi.md).
kt_status check_nv(const kt_weight& w, int64_t N, int64_t K, const char* name) {
    if (w.values.dtype != KT_DTYPE_U8 || w.values.rows != N || w.values.cols * 2 != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: %s weight should be uint8 [%lld, %lld] (two E2M1 codes per byte), got %s [%lld, %lld]",
                    name, (long long)N, (long long)(K / 2), dtype_name(w.values.dtype), (long long)w.values.rows,
                    (long long)w.values.cols);
    if (!w.scales.data || w.scales.dtype != KT_DTYPE_U8 || w.scales.rows != N || w.scales.cols * 16 != K)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: %s weight_scale should be E4M3 bytes (uint8 or float8_e4m3fn) [%lld, %lld] "
                    "(one per 16 elements), got %s [%lld, %lld]", name, (long long)N, (long long)(K / 16),
                    w.scales.data ? dtype_name(w.scales.dtype) : "none", (long long)w.scales.rows, (long long)w.scales.cols);
    if (!w.zeros.data || w.zeros.dtype != KT_DTYPE_F32 || w.zeros.rows * w.zeros.cols != 1)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: %s weight_scale_2 (the tensor's global scale) should be one float32, got %s [%lld, %lld]",
                    name, w.zeros.data ? dtype_name(w.zeros.dtype) : "none", (long long)w.zeros.rows, (long long)w.zeros.cols);
    const float global = *static_cast<const float*>(w.zeros.data);
    if (!std::isfinite(global) || !std::isfinite(128.0f * global))
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: %s weight_scale_2 = %g is not a finite scale kt can hold", name, double(global));
    for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K / 16; ++c) {
            const uint8_t b = static_cast<const uint8_t*>(w.scales.data)[r * w.scales.row_stride + c];
            if ((b & 0x7f) == 0x7f)
                return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: %s weight_scale [%lld, %lld] is the E4M3 NaN code 0x%02X; kt "
                            "refuses non-finite weights", name, (long long)r, (long long)c, b);
        }
    return KT_OK;
}

kt_status pack_nvfp4(const kt_moe_config* c, const kt_expert_weights* src, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    if (c->quant_flags & KT_QUANT_ZERO_POINT)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: zero_point=True is an INT4 option; NVFP4 is symmetric");
    if (c->group_size != 0 && c->group_size != 16)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: its scales cover 16 elements; group_size must be 0 or 16, got %lld",
                    (long long)c->group_size);
    if (H % 16 || I % 16)
        return fail(KT_ERROR_INVALID_ARGUMENT, "NVFP4: hidden (%lld) and intermediate (%lld) must be multiples of 16, its scale block",
                    (long long)H, (long long)I);
    kt_status st;
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    const int64_t rows[3] = {I, I, H}, cols[3] = {H, H, I};
    const char* names[3] = {"gate", "up", "down"};
    for (int i = 0; i < 3; ++i)
        if ((st = check_nv(*w[i], rows[i], cols[i], names[i])) != KT_OK) return st;
    auto* out = static_cast<uint8_t*>(dst);
    const Int4Layout lay = nvfp4_layout();
    const ExpertPanels l = lay.expert(c);
    const size_t offsets[3] = {l.gate(0), l.up(0), l.down(0)}, strides[3] = {2, 2, 1};
    for (int i = 0; i < 3; ++i) {
        const kt_weight& wi = *w[i];
        const float panel_scale = 128.0f * *static_cast<const float*>(wi.zeros.data);
        for (int64_t p = 0; p < panels(rows[i]); ++p) {
            auto* prefix = reinterpret_cast<float*>(out + offsets[i] + size_t(p) * strides[i] * lay.panel_bytes(cols[i]));
            for (int lane = 0; lane < kPanel; ++lane) prefix[lane] = panel_scale;
        }
        const auto* scales = static_cast<const uint8_t*>(wi.scales.data);
        pack_byte_header_matrix(wi, lay, rows[i], cols[i], out + offsets[i], strides[i],
                                [&](int64_t n, int64_t grp) { return scales[n * wi.scales.row_stride + grp]; });
    }
    return KT_OK;
}

// ---- kernel --------------------------------------------------------------------------------

// The four formats of this file: one kernel, four packers and layouts.
enum class Kind { kInt4, kRaw, kMx, kNv };
constexpr const char* kind_name(Kind kind) {
    return kind == Kind::kInt4 ? "INT4" : kind == Kind::kRaw ? "RAWINT4" : kind == Kind::kMx ? "MXFP4" : "NVFP4";
}
inline Int4Layout layout_of(const kt_moe_config* c, Kind kind) {
    return kind == Kind::kMx ? mxfp4_layout() : kind == Kind::kNv ? nvfp4_layout() : int4_layout(c, kind == Kind::kRaw);
}
// MXFP4 and NVFP4 hold E2M1 codes: looked up as u = 2 value + 12.
constexpr bool is_e2m1(Kind kind) { return kind == Kind::kMx || kind == Kind::kNv; }
// The activation rows' sum block (common.h): NVFP4's groups are 16 k, the others' 32 or more.
constexpr int64_t sum_block(Kind kind) { return kind == Kind::kNv ? 16 : 32; }

// Registers: per row and panel two int accumulators (activation planes) and one float
// accumulator, plus two unpacked weight vectors per panel and four broadcasts, within 32
// (AVX-512) or 16 (AVX2) vector registers.
#if defined(__AVX512F__)
constexpr int kMrFused = 3, kMrPlain = 6;
#else
constexpr int kMrFused = 1, kMrPlain = 1;
#endif
// Gate/up tiles of up to this many rows stream gate then up (gate_up_in_order, common.h); at 4
// rows the fused kernel's shared activation loads already win (docs/performance.md).
constexpr int64_t kInOrderRows = 2;

// kStream: decode-sized tiles also prefetch their own stream (prefetch_decode_stream, common.h).
// MXFP4 and NVFP4 codes are E2M1, looked up as u = 2 value + 12 (mxfp4::kDoubledPlusOffset).
// kMode (common.h's PanelMode): one panel, a gate/up pair's gated activation, or the pair's raw
// products (32 outputs per row).
template <int MR, int kMode, bool kTwoPass, Kind kKind, bool kAhead = false, bool kStream = false>
void panel_kernel(const uint8_t* x, size_t row_bytes, int64_t k, Int4Layout lay, const uint8_t* pa, const uint8_t* pb,
                  float* out, int64_t ldo, int cols, PrefetchAhead ahead = {}) {
    constexpr bool kMx = is_e2m1(kKind);
    constexpr int64_t kSum = sum_block(kKind);
    constexpr int F = kMode == kSingle ? 1 : 2;
    // Each 64-byte chunk holds two codes per lane and k-quad (low and high nibble): two vpdpbusd
    // per accumulator, one waiting on the other. With few accumulators (decode: one row, one
    // panel) that latency chain sets the pace. kSplit gives the high nibbles accumulators of their
    // own, summed at the group's end (exact: integers, so results are bit-identical). One core on
    // cache-resident experts (benchmarks/decode_ceiling.py): INT4 25.4 -> 30.0 GB/s, RAWINT4 (a
    // group epilogue every 4 chunks) 29.6 -> 30.6. AVX2's dot chains through a one-cycle vpaddd
    // instead, and has no registers to spare.
#if defined(__AVX512VNNI__)
    constexpr bool kSplit = MR * F * kVecsPerPanel <= 2;
#else
    constexpr bool kSplit = false;
#endif
    const int64_t g = lay.g;
    const size_t header_bytes = lay.header_bytes();
    VF acc[MR][F][kVecsPerPanel];
    for (int m = 0; m < MR; ++m)
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) acc[m][f][v] = vzero();
    const uint8_t* panel[2] = {pa, pb};
    const VI low4 = vset1i(0x0f0f0f0f);
    const int64_t groups = k / g, blocks_per_group = g / kSum;
    for (int64_t grp = 0; grp < groups; ++grp) {
        VI hi[MR][F][kVecsPerPanel], lo[MR][F][kVecsPerPanel], hi1[MR][F][kVecsPerPanel], lo1[MR][F][kVecsPerPanel];
        for (int m = 0; m < MR; ++m)
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) hi[m][f][v] = lo[m][f][v] = hi1[m][f][v] = lo1[m][f][v] = vzeroi();
        const size_t block = lay.group_at(grp);
        for (int64_t c = 0; c < g / 8; ++c) {
            if constexpr (kAhead) ahead.step();
            VI w0[F][kVecsPerPanel], w1[F][kVecsPerPanel];
            for (int f = 0; f < F; ++f)
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    if constexpr (kStream)
                        if (v == 0) prefetch_decode_stream<4096>(panel[f] + block + header_bytes + size_t(c) * kChunkBytes);
                    VI w = vloadi(panel[f] + block + header_bytes + size_t(c) * kChunkBytes + size_t(v) * kLanes * 4);
                    // Pin the loaded chunk to a register: otherwise GCC 12 (fused decode) stored it
                    // to the stack and re-read it as two memory operands, a 64-byte store-to-load
                    // forward per chunk that Zen 4 cannot do (a quarter of decode's samples stalled).
                    asm("" : "+v"(w));
                    w0[f][v] = vand(w, low4);
                    w1[f][v] = vand(vsrl16<4>(w), low4);
                    if constexpr (kMx) {
                        w0[f][v] = vlookup16(kt::layouts::mxfp4::kDoubledPlusOffset, w0[f][v]);
                        w1[f][v] = vlookup16(kt::layouts::mxfp4::kDoubledPlusOffset, w1[f][v]);
                    }
                }
            for (int m = 0; m < MR; ++m) {
                const uint8_t* row = x + m * row_bytes;
                const size_t at = size_t(grp * g + c * 8);
                // Four 4-byte loads, each broadcast straight from memory (vpbroadcastd m32 runs on a
                // load port; one 8-byte load split in a GPR took two ALU-pipe broadcasts per pair).
                const VI ah0 = vset1i(load_i32(int8_hi(row) + at)), ah1 = vset1i(load_i32(int8_hi(row) + at + 4));
                const VI al0 = vset1i(load_i32(int8_lo(row, k) + at)), al1 = vset1i(load_i32(int8_lo(row, k) + at + 4));
                for (int f = 0; f < F; ++f)
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        if constexpr (kSplit) {
                            hi[m][f][v] = dot_u8s8(hi[m][f][v], w0[f][v], ah0);
                            hi1[m][f][v] = dot_u8s8(hi1[m][f][v], w1[f][v], ah1);
                            if constexpr (kTwoPass) {
                                lo[m][f][v] = dot_u8s8(lo[m][f][v], w0[f][v], al0);
                                lo1[m][f][v] = dot_u8s8(lo1[m][f][v], w1[f][v], al1);
                            }
                        } else {
                            hi[m][f][v] = dot_u8s8(dot_u8s8(hi[m][f][v], w0[f][v], ah0), w1[f][v], ah1);
                            if constexpr (kTwoPass) lo[m][f][v] = dot_u8s8(dot_u8s8(lo[m][f][v], w0[f][v], al0), w1[f][v], al1);
                        }
                    }
            }
        }
        // The group's epilogue must unroll, or GCC keeps it a loop over memory and moves every
        // int accumulator through the stack once per group. It did while this loop's runtime
        // trip count and Int4Layout::update's runtime header tests sat inside it; hence the rows'
        // activation sums first, in a loop of their own, the headers read once per group, and the
        // header kind chosen outside the rows (prefill gain, bit-identical, in docs/performance.md).
        float asums[MR];
        for (int m = 0; m < MR; ++m) {
            const uint8_t* row = x + m * row_bytes;
            int32_t sum_hi = 0, sum_lo = 0;
            for (int64_t b = 0; b < blocks_per_group; ++b) {
                sum_hi += int8_sums_hi<kSum>(row, k)[grp * blocks_per_group + b];
                sum_lo += int8_sums_lo<kSum>(row, k)[grp * blocks_per_group + b];
            }
            asums[m] = int4_raw_sum(sum_hi, sum_lo, kTwoPass);
        }
        VF s[F][kVecsPerPanel], sz[F][kVecsPerPanel];
        for (int f = 0; f < F; ++f)
            for (int v = 0; v < kVecsPerPanel; ++v) {
                s[f][v] = lay.scale(panel[f] + block, v);
                sz[f][v] = lay.zero_point ? lay.scale_times_zero(panel[f] + block, v) : vzero();
            }
        const auto finish_group = [&]<bool kZeroPoint>() {
            for (int m = 0; m < MR; ++m) {
                const VF asum = vset1(asums[m]);
                for (int f = 0; f < F; ++f)
                    for (int v = 0; v < kVecsPerPanel; ++v) {
                        if constexpr (kSplit) {
                            hi[m][f][v] = vaddi(hi[m][f][v], hi1[m][f][v]);
                            lo[m][f][v] = vaddi(lo[m][f][v], lo1[m][f][v]);
                        }
                        acc[m][f][v] = Int4Layout::apply<kZeroPoint, kMx ? kt::layouts::mxfp4::kOffset : 8>(
                                                                     s[f][v], sz[f][v], acc[m][f][v],
                                                                     int4_raw_dot(hi[m][f][v], lo[m][f][v], kTwoPass), asum);
                    }
            }
        };
        if (lay.zero_point)
            finish_group.template operator()<true>();
        else
            finish_group.template operator()<false>();
    }
    for (int m = 0; m < MR; ++m)
        for (int v = 0; v < kVecsPerPanel; ++v) {
            const VF sa = vset1(int4_row_scale(reinterpret_cast<const Int8Header*>(x + m * row_bytes)->scale, kTwoPass));
            VF r = vmul(acc[m][0][v], lay.prefix_bytes ? vmul(sa, Int4Layout::panel_scale(panel[0], v)) : sa);
            if constexpr (kMode != kSingle) {
                const VF r1 = vmul(acc[m][F - 1][v], lay.prefix_bytes ? vmul(sa, Int4Layout::panel_scale(panel[F - 1], v)) : sa);
                if constexpr (kMode == kPair) {
                    const int n1 = std::min(kLanes, cols - kPanel - v * kLanes);
                    if (n1 > 0) vstore_partial(out + m * ldo + kPanel + v * kLanes, r1, n1);
                } else {
                    r = gate_mul(r, r1);
                }
            }
            const int n = std::min(kLanes, cols - v * kLanes);
            if (n > 0) vstore_partial(out + m * ldo + v * kLanes, r, n);
        }
}

template <int MR, int kMode, bool kTwoPass, Kind kKind>
void rows_kernel(const uint8_t* x, size_t row_bytes, int64_t rows, int64_t k, Int4Layout lay, const uint8_t* pa,
                 const uint8_t* pb, float* out, int64_t ldo, int cols, const uint8_t* next, size_t next_bytes) {
    if (rows <= kInOrderRows) {   // decode: prefetched (kStream), in the row blocks the path below forms
        constexpr int kDecodeMr = MR < int(kInOrderRows) ? MR : int(kInOrderRows);
        for_row_blocks<kDecodeMr>(rows, [=]<int M>(int64_t r) {
            panel_kernel<M, kMode, kTwoPass, kKind, false, true>(x + r * row_bytes, row_bytes, k, lay, pa, pb, out + r * ldo, ldo, cols);
        });
        return;
    }
    for_row_blocks<MR>(rows, [=]<int M>(int64_t r) {
        if constexpr (M == MR)
            if (r == 0 && next_bytes) {
                panel_kernel<M, kMode, kTwoPass, kKind, true>(x, row_bytes, k, lay, pa, pb, out, ldo, cols,
                                                       PrefetchAhead(next, next_bytes, k / 8));
                return;
            }
        panel_kernel<M, kMode, kTwoPass, kKind>(x + r * row_bytes, row_bytes, k, lay, pa, pb, out + r * ldo, ldo, cols);
    });
}

// The activation passes a layer asked for: one with KT_QUANT_FAST_ACTIVATIONS, else two.
template <int kMode, int MR, Kind kKind>
void run_rows(const kt_moe_config* c, const void* act, int64_t k, Int4Layout lay, int64_t rows, const uint8_t* pa,
              const uint8_t* pb, float* out, int64_t ldo, int cols, const uint8_t* next = nullptr, size_t next_bytes = 0) {
    const auto* x = static_cast<const uint8_t*>(act);
    // The first row block fetches `next` (the following panel or pair) into L2: PrefetchAhead.
    if (rows <= MR) next_bytes = 0;   // one row block: nothing to overlap with the fetch
    if (one_activation_pass(c)) {
        rows_kernel<MR, kMode, false, kKind>(x, int8_row_bytes<sum_block(kKind)>(k), rows, k, lay, pa, pb, out, ldo, cols, next, next_bytes);
    } else {
        rows_kernel<MR, kMode, true, kKind>(x, int8_row_bytes<sum_block(kKind)>(k), rows, k, lay, pa, pb, out, ldo, cols, next, next_bytes);
    }
}

#if !defined(__AVX512F__)
// AVX2 prefill (tiles of many rows, two activation passes: wide_prefill below): the activation rows
// widened to f32 once per tile (chunks of <= 256 rows), each 128-k block of a panel's codes widened
// to its weights (u - offset) s, or s u - s z with zero points (NVFP4: times the panel's global
// scale), then f32 FMAs (wide_panels.h). AVX2 holds one row block of one row here (kMrPlain above):
// a panel's codes are unpacked once per row, and each pass of the integer dot costs vpmaddubsw +
// vpmaddwd + vpaddd per 32 products where an FMA does 8. Same codes, same activation values, summed
// in f32.
// Where the widened panels start to win depends on what the integer kernel does per group: MXFP4's
// and NVFP4's code lookup, 32-k groups' epilogues every 4 chunks (12 rows), 128-k groups least (24
// rows; figures in docs/performance.md). One pass (KT_QUANT_FAST_ACTIVATIONS) halves the integer
// kernels' work: they stayed 1.2-1.7x faster at 16 and 64 rows (NVFP4: even, then 0.86x), so fast
// activations keep them.
template <Kind kKind>
bool wide_prefill(const kt_moe_config* c, const Int4Layout& lay, int64_t rows) {
    const int64_t min_rows = is_e2m1(kKind) ? 8 : lay.g >= 64 ? 24 : 12;
    return rows >= min_rows && !one_activation_pass(c);
}

// Byte b of each 32-bit lane as f32 (the codes here are unsigned).
template <int b>
inline VF lane_byte(VI q) {
    return vcvt(_mm256_srli_epi32(_mm256_slli_epi32(q, 24 - 8 * b), 24));
}

template <int kMode, Kind kKind>
void wide_tile(const wide::Int8Rows& a, const Int4Layout& lay, int64_t k, const uint8_t* pa, const uint8_t* pb,
               float* out, int64_t ldo, int cols) {
    constexpr int P = wide::panels_of(kMode);
    constexpr int64_t kBlock = 128;   // k per widened block (every group size divides it): 16 KiB of f32, in L1
    constexpr bool kMx = is_e2m1(kKind);
    const VF offset = vset1(kMx ? float(kt::layouts::mxfp4::kOffset) : 8.0f);
    const VI low4 = vset1i(0x0f0f0f0f);
    const uint8_t* panel[2] = {pa, pb};
    const int64_t g = lay.g;
    const auto widen = [&](int64_t k0, int64_t kn, float* w) {
        for (int p = 0; p < P; ++p)
            for (int64_t grp = k0 / g; grp < (k0 + kn) / g; ++grp) {
                const uint8_t* block = panel[p] + lay.group_at(grp);
                for (int v = 0; v < kVecsPerPanel; ++v) {
                    VF s = lay.scale(block, v);
                    if (lay.prefix_bytes) s = vmul(s, Int4Layout::panel_scale(panel[p], v));
                    const VF sz = lay.zero_point ? lay.scale_times_zero(block, v) : vzero();
                    // The weight of code u: (u - offset) s, the value the format defines, or, with
                    // zero points, s u - s z; each rounded once.
                    const auto weight = [&](VF u) { return lay.zero_point ? vfma(s, u, vsub(vzero(), sz)) : vmul(vsub(u, offset), s); };
                    for (int64_t c = 0; c < g / 8; ++c) {
                        const VI q = vloadi(block + lay.header_bytes() + size_t(c) * kChunkBytes + size_t(v) * kLanes * 4);
                        VI nib[2] = {vand(q, low4), vand(vsrl16<4>(q), low4)};   // k = 8c + b, then 8c + 4 + b
                        if constexpr (kMx)
                            for (VI& n : nib) n = vlookup16(kt::layouts::mxfp4::kDoubledPlusOffset, n);
                        float* dst = w + (grp * g - k0 + 8 * c) * P * kPanel + p * kPanel + v * kLanes;
                        for (int h = 0; h < 2; ++h) {
                            float* d = dst + 4 * h * P * kPanel;
                            vstore(d, weight(lane_byte<0>(nib[h])));
                            vstore(d + P * kPanel, weight(lane_byte<1>(nib[h])));
                            vstore(d + 2 * P * kPanel, weight(lane_byte<2>(nib[h])));
                            vstore(d + 3 * P * kPanel, weight(lane_byte<3>(nib[h])));
                        }
                    }
                }
            }
    };
    wide::tile<kMode, false>(a.x, a.ldx, a.rows, k, kBlock, widen, nullptr, out, ldo, cols);
}
#endif

template <Kind kKind>
kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    return quantize_int8_rows(in, dtype, rows, k, stride, out, false, sum_block(kKind));
}

template <Kind kKind>
size_t packed_bytes(const kt_moe_config* c) { return layout_of(c, kKind).expert(c).bytes(); }

template <Kind kKind>
kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                       float* out, int64_t ldo) {
    const GateScope activation(c);   // the layer's gated activation, for the epilogues below
    const Int4Layout lay = layout_of(c, kKind);
    if (const kt_status st = check_tile(kind_name(kKind), "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = lay.expert(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if !defined(__AVX512F__)
    if (wide_prefill<kKind>(c, lay, rows)) {
        wide::for_int8_row_chunks(act, int8_row_bytes<sum_block(kKind)>(c->hidden), rows, c->hidden, [&](const wide::Int8Rows& a) {
            for (int64_t n = n0; n < n1; n += kPanel)
                wide_tile<wide::kFused, kKind>(a, lay, c->hidden, base + l.gate(n / kPanel), base + l.up(n / kPanel),
                                        out + a.r0 * ldo + n, ldo, int(std::min<int64_t>(kPanel, n1 - n)));
        });
        return KT_OK;
    }
#endif
    if (rows <= kInOrderRows) {
        gate_up_in_order<kInOrderRows>(rows, base + l.gate(n0 / kPanel), base + l.up(n0 / kPanel), l.gate(1), n0, n1, out, ldo,
                         [&](const uint8_t* panel, float* o) {
                             run_rows<kSingle, kMrPlain, kKind>(c, act, c->hidden, lay, rows, panel, nullptr, o, kPanel, kPanel);
                         });
        return KT_OK;
    }
    for (int64_t n = n0; n < n1; n += kPanel)
        run_rows<kFused, kMrFused, kKind>(c, act, c->hidden, lay, rows, base + l.gate(n / kPanel), base + l.up(n / kPanel), out + n,
                                          ldo, int(std::min<int64_t>(kPanel, n1 - n)), base + l.gate(n / kPanel + 1),
                                          n + kPanel < n1 ? 2 * l.gate_up_panel : 0);
    return KT_OK;
}

template <Kind kKind>
kt_status gate_up_raw_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out_gate, float* out_up, int64_t ldo) {
    const Int4Layout lay = layout_of(c, kKind);
    if (const kt_status st = check_tile(kind_name(kKind), "gate/up", n0, n1, c->intermediate)) return st;
#if !defined(__AVX512F__)
    if (wide_prefill<kKind>(c, lay, rows)) {
        wide::for_int8_row_chunks(act, int8_row_bytes<sum_block(kKind)>(c->hidden), rows, c->hidden, [&](const wide::Int8Rows& a) {
            gate_up_raw_pairs(lay.expert(c), static_cast<const uint8_t*>(packed), a.rows, n0, n1, out_gate + a.r0 * ldo,
                              out_up + a.r0 * ldo, ldo, [&](const uint8_t* gate, const uint8_t* up, float* both) {
                                  wide_tile<wide::kPair, kKind>(a, lay, c->hidden, gate, up, both, 2 * kPanel, 2 * kPanel);
                              });
        });
        return KT_OK;
    }
#endif
    if (rows > kInOrderRows) {   // gate and up as one pair, as the fused tile (gate_up_raw_pairs)
        gate_up_raw_pairs(lay.expert(c), static_cast<const uint8_t*>(packed), rows, n0, n1, out_gate, out_up, ldo,
                          [&](const uint8_t* gate, const uint8_t* up, float* both) {
                              run_rows<kPair, kMrFused, kKind>(c, act, c->hidden, lay, rows, gate, up, both, 2 * kPanel,
                                                               2 * kPanel);
                          });
        return KT_OK;
    }
    gate_up_raw(lay.expert(c), static_cast<const uint8_t*>(packed), n0, n1, out_gate, out_up, ldo,
                [&](const uint8_t* panel, float* o, int64_t ld, int cols) {
                    run_rows<kSingle, kMrPlain, kKind>(c, act, c->hidden, lay, rows, panel, nullptr, o, ld, cols);
                });
    return KT_OK;
}

template <Kind kKind>
kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                    float* out, int64_t ldo) {
    const Int4Layout lay = layout_of(c, kKind);
    if (const kt_status st = check_tile(kind_name(kKind), "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = lay.expert(c);
    const auto* base = static_cast<const uint8_t*>(packed);
#if !defined(__AVX512F__)
    if (wide_prefill<kKind>(c, lay, rows)) {   // panel pairs, as BF16's down tiles
        const int64_t I = c->intermediate;
        wide::for_int8_row_chunks(act, int8_row_bytes<sum_block(kKind)>(I), rows, I, [&](const wide::Int8Rows& a) {
            float* o = out + a.r0 * ldo;
            down_panel_pairs(
                n0, n1,
                [&](int64_t n, int cols) {
                    wide_tile<wide::kPair, kKind>(a, lay, I, base + l.down(n / kPanel), base + l.down(n / kPanel + 1), o + n, ldo,
                                                  cols);
                },
                [&](int64_t n, int cols) {
                    wide_tile<wide::kSingle, kKind>(a, lay, I, base + l.down(n / kPanel), nullptr, o + n, ldo, cols);
                });
        });
        return KT_OK;
    }
#endif
    for (int64_t n = n0; n < n1; n += kPanel)
        run_rows<kSingle, kMrPlain, kKind>(c, act, c->intermediate, lay, rows, base + l.down(n / kPanel), nullptr, out + n, ldo,
                                  int(std::min<int64_t>(kPanel, n1 - n)), base + l.down(n / kPanel + 1),
                                  n + kPanel < n1 ? l.down_panel : 0);
    return KT_OK;
}

template <Kind kKind>
kt_method_kernels int4_table(const char* method, const char* kernel_id, const char* layout_id, PackFn pack) {
    return method_table(method, layout_id, kernel_id, packed_bytes<kKind>, pack, int8_row_bytes<sum_block(kKind)>, quantize<kKind>,
                        gate_up_tile<kKind>, down_tile<kKind>, gate_up_raw_tile<kKind>);
}

}  // namespace

kt_method_kernels int4_kernels(const char* kernel_id) {
    return int4_table<Kind::kInt4>("INT4", kernel_id, int4_layout_id(false), pack_int4);
}
kt_method_kernels rawint4_kernels(const char* kernel_id) {
    return int4_table<Kind::kRaw>("RAWINT4", kernel_id, int4_layout_id(true), pack_raw);
}
kt_method_kernels mxfp4_kernels(const char* kernel_id) {
    return int4_table<Kind::kMx>("MXFP4", kernel_id, kt::layouts::mxfp4::kId, pack_mxfp4);
}
kt_method_kernels nvfp4_kernels(const char* kernel_id) {
    return int4_table<Kind::kNv>("NVFP4", kernel_id, kt::layouts::nvfp4::kId, pack_nvfp4);
}
kt_method_kernels gptq_int4_kernels(const char* kernel_id) {
    return int4_table<Kind::kInt4>("GPTQ_INT4", kernel_id, int4_layout_id(false), pack_gptq);
}

}  // namespace KT_TARGET_NAMESPACE
