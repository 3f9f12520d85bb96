// Pre-quantized checkpoint weights as they reach a backend's packer (kt_weight: codes, scales,
// zero points): the checks that refuse malformed ones with a message naming what was expected and
// what was found, and the readers and packers every backend needs for them — FP8 / FP8_PERCHANNEL /
// MXFP8 (E4M3 bytes) and RAWINT4 (compressed-tensors int32 words). kt-core's public definition, so
// kt-backend-avx (x86) and kt-backend-kml (aarch64) refuse the same inputs with the same words and
// pack the same bytes into the shared layouts of packed_layouts.h.
//
// Portable C++ (no intrinsics), internal linkage like quant_rules.h: backends compile it into
// translation units built with different ISA flags. A check returns "" when the input is fine,
// else the message; the backend hands it to its host's set_error.
#pragma once
#include <kt/formats/packed_layouts.h>
#include <kt/plugin.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace kt::inputs {
namespace {

inline const char* dtype_name(kt_dtype d) {
    switch (d) {
        case KT_DTYPE_F32: return "float32";
        case KT_DTYPE_BF16: return "bfloat16";
        case KT_DTYPE_F16: return "float16";
        case KT_DTYPE_F64: return "float64";
        case KT_DTYPE_I8: return "int8";
        case KT_DTYPE_U8: return "uint8";
        case KT_DTYPE_I32: return "int32";
        default: break;   // ggml block types: the LLAMAFILE packers name them
    }
    return "unknown";
}

inline std::string message(const char* fmt, ...) {
    char buffer[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buffer, sizeof buffer, fmt, args);
    va_end(args);
    return buffer;
}

// Element `at` of a floating matrix as f32 (exact for bf16 / f16; f64 rounds).
inline float float_at(const kt_matrix& m, int64_t at) {
    switch (m.dtype) {
        case KT_DTYPE_BF16: return layouts::bf16_bits_to_float(static_cast<const uint16_t*>(m.data)[at]);
        case KT_DTYPE_F16: return layouts::f16_bits_to_float(static_cast<const uint16_t*>(m.data)[at]);
        case KT_DTYPE_F64: return float(static_cast<const double*>(m.data)[at]);
        default: return static_cast<const float*>(m.data)[at];
    }
}

// Index of the first of n values `bad` holds for, or -1. Loads read every weight: the scan is
// branch-free so it vectorises, and the position is searched for only when there is one.
template <class T, class Pred>
int64_t find_first(const T* p, int64_t n, Pred bad) {
    int any = 0;
    for (int64_t i = 0; i < n; ++i) any |= bad(p[i]);
    if (!any) return -1;
    int64_t i = 0;
    while (!bad(p[i])) ++i;
    return i;
}

// ---- FP8 (E4M3 bytes) --------------------------------------------------------------------
// How a method's checkpoint scales its codes: DeepSeek-V3's 128 x 128 blocks (FP8), one scale per
// output channel (FP8_PERCHANNEL), an E8M0 exponent per 32 k of each channel (MXFP8).
enum class Fp8Scales { kBlock128, kPerChannel, kMx };
constexpr const char* fp8_method_name(Fp8Scales k) {
    return k == Fp8Scales::kBlock128 ? "FP8" : k == Fp8Scales::kPerChannel ? "FP8_PERCHANNEL" : "MXFP8";
}
// The layout geometry (row group 1: v1 rows, 4: v2 quads) of a method's panels.
constexpr layouts::fp8::Geometry fp8_geometry(Fp8Scales k, int64_t row_group) {
    return {row_group, k == Fp8Scales::kMx ? layouts::mxfp8::kBlock : layouts::fp8::kBlock};
}

// MXFP8's E8M0 exponents e: 0xFF is NaN, and above 246 kt's 2^8 fold would leave f32's range
// (weights beyond 2^120: no model has them; refused rather than overflowed).
constexpr int kMaxMxExponent = 246;

inline std::string check_mx_scales(const kt_matrix& sc, int64_t N, int64_t K, const char* name) {
    if (!sc.data || sc.dtype != KT_DTYPE_U8 || sc.rows != N || sc.cols * 32 != K)
        return message("MXFP8: %s scales should be uint8 E8M0 exponents [%lld, %lld] (one per 32 elements), got %s [%lld, %lld]",
                       name, (long long)N, (long long)(K / 32), sc.data ? dtype_name(sc.dtype) : "none", (long long)sc.rows,
                       (long long)sc.cols);
    for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < K / 32; ++c) {
            const uint8_t e = static_cast<const uint8_t*>(sc.data)[r * sc.row_stride + c];
            if (e > kMaxMxExponent)
                return message("MXFP8: %s scale [%lld, %lld] is E8M0 0x%02X (%s); kt takes exponents up to %d (scales up to "
                               "2^119)", name, (long long)r, (long long)c, e,
                               e == 0xFF ? "NaN" : "beyond f32 once kt folds in its 2^8", kMaxMxExponent);
        }
    return {};
}

// The checkpoint's block or per-channel f32 / bf16 scales: present, shaped, finite.
inline std::string check_float_scales(const kt_matrix& scales, bool per_channel, int64_t N, int64_t K, const char* method,
                                      const char* name) {
    const int64_t blk = layouts::fp8::kBlock;
    const int64_t sr = per_channel ? N : (N + blk - 1) / blk, sc = per_channel ? 1 : (K + blk - 1) / blk;
    if (!scales.data)
        return message("%s: %s scale is missing (float32 [%lld, %lld] expected)", method, name, (long long)sr, (long long)sc);
    if ((scales.dtype != KT_DTYPE_F32 && scales.dtype != KT_DTYPE_BF16) || scales.rows != sr || scales.cols != sc)
        return message("%s: %s scale should be float32 [%lld, %lld], got %s [%lld, %lld]", method, name, (long long)sr,
                       (long long)sc, dtype_name(scales.dtype), (long long)scales.rows, (long long)scales.cols);
    for (int64_t r = 0; r < sr; ++r)
        for (int64_t c = 0; c < sc; ++c)
            if (!std::isfinite(float_at(scales, r * scales.row_stride + c)))
                return message("%s: %s scale [%lld, %lld] is not finite", method, name, (long long)r, (long long)c);
    return {};
}

// One FP8 weight [N, K] (gate, up: [I, H]; down: [H, I]) with its scales: every code finite.
inline std::string check_fp8(const kt_weight& w, Fp8Scales kind, int64_t N, int64_t K, const char* name) {
    const char* method = fp8_method_name(kind);
    if (w.values.dtype != KT_DTYPE_U8 || w.values.rows != N || w.values.cols != K)
        return message("%s: %s should be E4M3 bytes (uint8 or float8_e4m3fn) [%lld, %lld], got %s [%lld, %lld]", method, name,
                       (long long)N, (long long)K, dtype_name(w.values.dtype), (long long)w.values.rows,
                       (long long)w.values.cols);
    if (w.zeros.data) return message("%s: %s takes no zero points", method, name);
    std::string err;
    if (kind == Fp8Scales::kMx) {
        if (K % 32) return message("MXFP8: %s's K = %lld is not a multiple of 32, the scale block", name, (long long)K);
        err = check_mx_scales(w.scales, N, K, name);
    } else {
        err = check_float_scales(w.scales, kind == Fp8Scales::kPerChannel, N, K, method, name);
    }
    if (!err.empty()) return err;
    for (int64_t r = 0; r < N; ++r) {
        const auto* codes = static_cast<const uint8_t*>(w.values.data) + r * w.values.row_stride;
        const int64_t c = find_first(codes, K, [](uint8_t b) { return (b & 0x7f) == 0x7f; });
        if (c >= 0)
            return message("%s: %s holds the E4M3 NaN code 0x%02X at [%lld, %lld]; kt refuses non-finite weights at load",
                           method, name, codes[c], (long long)r, (long long)c);
    }
    return {};
}

// The scale vector entry of channel n for k block kb, with the 2^8 of the code decode
// (codes decode to value / 256) folded in.
inline float fp8_packed_scale(Fp8Scales kind, const kt_matrix& sc, int64_t n, int64_t kb) {
    if (kind == Fp8Scales::kMx) return layouts::mxfp8::header_scale(static_cast<const uint8_t*>(sc.data)[n * sc.row_stride + kb]);
    if (kind == Fp8Scales::kPerChannel) return 256.0f * float_at(sc, n * sc.row_stride);
    return 256.0f * float_at(sc, (n / layouts::fp8::kBlock) * sc.row_stride + kb);
}

// Packs one checked FP8 weight [N, K] into panels of `geo` at dst, panel p at dst + p *
// stride_panels * panel_bytes (gate and up panels alternate: stride 2). The buffer comes zeroed.
inline void pack_fp8_matrix(const kt_weight& w, Fp8Scales kind, const layouts::fp8::Geometry& geo, int64_t N, int64_t K,
                            uint8_t* dst, size_t stride_panels) {
    const size_t pb = geo.panel_bytes(K);
    constexpr int P = layouts::kPanel;
    for (int64_t p = 0; p < layouts::panel_count(N); ++p) {
        uint8_t* panel = dst + size_t(p) * stride_panels * pb;
        auto* scales = reinterpret_cast<float*>(panel);
        uint8_t* codes = panel + geo.codes_at(K);
        for (int lane = 0; lane < P && p * P + lane < N; ++lane) {
            const int64_t n = p * P + lane;
            for (int64_t kb = 0; kb < geo.kblocks(K); ++kb) scales[kb * P + lane] = fp8_packed_scale(kind, w.scales, n, kb);
            const auto* src = static_cast<const uint8_t*>(w.values.data) + n * w.values.row_stride;
            size_t at[4];   // this lane's offsets within a row group
            for (int r = 0; r < geo.row_group; ++r) at[r] = geo.code_offset(r, lane);
            for (int64_t k0 = 0; k0 < K; k0 += geo.row_group)
                for (int r = 0; r < geo.row_group && k0 + r < K; ++r) codes[size_t(k0) * P + at[r]] = src[k0 + r];
        }
        // v2 pads K to whole row groups: zero codes, so the padding adds nothing to the dots.
        for (int64_t k = K; k < geo.code_rows(K); ++k)
            for (int lane = 0; lane < P; ++lane) codes[geo.code_offset(k, lane)] = 0;
    }
}

// One expert of a layer (hidden H, intermediate I, the layer's group_size): MXFP8's group size, then
// gate [I, H], up [I, H], down [H, I] checked; "" when all are fine.
inline std::string check_fp8_expert(const kt_moe_config* c, const kt_expert_weights* src, Fp8Scales kind) {
    if (kind == Fp8Scales::kMx && c->group_size != 0 && c->group_size != 32)
        return message("MXFP8: its scales cover 32 elements; group_size must be 0 or 32, got %lld", (long long)c->group_size);
    const int64_t H = c->hidden, I = c->intermediate;
    std::string err = check_fp8(src->gate, kind, I, H, "gate");
    if (err.empty()) err = check_fp8(src->up, kind, I, H, "up");
    if (err.empty()) err = check_fp8(src->down, kind, H, I, "down");
    return err;
}

// Packs one checked expert into its panels of `geo` (gate and up panels alternate, down after them).
inline void pack_fp8_expert(const kt_moe_config* c, const kt_expert_weights* src, Fp8Scales kind,
                            const layouts::fp8::Geometry& geo, void* dst) {
    const int64_t H = c->hidden, I = c->intermediate;
    const layouts::ExpertPanels l = geo.expert(H, I);
    auto* out = static_cast<uint8_t*>(dst);
    pack_fp8_matrix(src->gate, kind, geo, I, H, out + l.gate(0), 2);
    pack_fp8_matrix(src->up, kind, geo, I, H, out + l.up(0), 2);
    pack_fp8_matrix(src->down, kind, geo, H, I, out + l.down(0), 1);
}

// ---- RAWINT4 (compressed-tensors pack-quantized, Kimi-K2) --------------------------------
// int32 words of 8 codes (element k in bits 4 (k % 8)), stored q + 8; a bf16 scale per 32
// elements (f32 accepted where each is a bf16 value: the layout keeps bf16).
inline std::string check_rawint4(const kt_weight& w, int64_t N, int64_t K, const char* name) {
    if (w.values.dtype != KT_DTYPE_I32 || w.values.rows != N || w.values.cols * 8 != K)
        return message("RAWINT4: %s weight_packed should be int32 [%lld, %lld], got %s [%lld, %lld]", name, (long long)N,
                       (long long)(K / 8), dtype_name(w.values.dtype), (long long)w.values.rows, (long long)w.values.cols);
    if (!w.scales.data)
        return message("RAWINT4: %s weight_scale is missing (bf16 [%lld, %lld] expected)", name, (long long)N, (long long)(K / 32));
    if ((w.scales.dtype != KT_DTYPE_BF16 && w.scales.dtype != KT_DTYPE_F32) || w.scales.rows != N || w.scales.cols * 32 != K)
        return message("RAWINT4: %s weight_scale should be bf16 [%lld, %lld], got %s [%lld, %lld]", name, (long long)N,
                       (long long)(K / 32), dtype_name(w.scales.dtype), (long long)w.scales.rows, (long long)w.scales.cols);
    if (w.zeros.data) return message("RAWINT4: %s is symmetric; zero points must not be given", name);
    if (w.scales.dtype == KT_DTYPE_F32)
        for (int64_t r = 0; r < N; ++r)
            for (int64_t c = 0; c < K / 32; ++c) {
                const float v = static_cast<const float*>(w.scales.data)[r * w.scales.row_stride + c];
                uint32_t bits;
                std::memcpy(&bits, &v, 4);
                if ((bits & 0xffffu) != 0 || v != v)   // not a bf16 value, or NaN
                    return message("RAWINT4: %s weight_scale [%lld, %lld] = %g is not a bf16 value; RAWINT4 takes the "
                                   "checkpoint's bf16 scales (f32 ones only if each is a bf16 value; INT4 takes f32 scales)",
                                   name, (long long)r, (long long)c, double(v));
            }
    return {};
}

// Channel n of a checked RAWINT4 weight: its K codes u (0..15, w = s (u - 8)) and K / 32 scales.
inline void rawint4_channel(const kt_weight& w, int64_t n, uint8_t* u, float* s) {
    const auto* words = static_cast<const uint32_t*>(w.values.data) + n * w.values.row_stride;
    for (int64_t k = 0; k < w.values.cols * 8; ++k) u[k] = uint8_t((words[k / 8] >> (4 * (k % 8))) & 15u);
    for (int64_t grp = 0; grp < w.scales.cols; ++grp) s[grp] = float_at(w.scales, n * w.scales.row_stride + grp);
}

}  // namespace
}  // namespace kt::inputs
