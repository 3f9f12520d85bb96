// kt's packed expert layouts (docs/formats.md): where each weight of an expert sits in the bytes
// a backend's pack_expert writes, for the layouts more than one backend reads. kt-backend-avx
// packs them; kt-backend-amx computes on the same bytes, and any backend (BLIS, KML, a third
// party's) that wants to serve an avx-packed layer without a second copy of the weights reads
// them through this header. The SIMD code that streams a layout stays in the backend that owns
// it; this is the byte geometry and a scalar reader per layout (its specification, and the
// oracle tests unpack avx's bytes with).
//
// A layout id names exactly one byte format; a change to it gets a new id (…-v3), never an
// edit under the old one. Internal linkage on purpose, as in quant_rules.h: backends compile
// this into translation units with different ISA flags.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kt::layouts {
namespace {

// Output channels per packed panel, in every layout here: one 64-byte line holds one 32-bit
// word of each of 16 channels (an AVX-512 register, four NEON registers).
constexpr int kPanel = 16;

inline int64_t panel_count(int64_t n) { return (n + kPanel - 1) / kPanel; }

inline float bf16_bits_to_float(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// IEEE half bits -> f32, exact (subnormals included), without F16C or __fp16.
inline float f16_bits_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
    uint32_t bits;
    if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else {   // zero or subnormal m * 2^-24: an exact f32 product
        const float v = float(m) * 0x1p-24f;
        std::memcpy(&bits, &v, 4);
        bits |= sign;
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// --- the expert: which panel is where ----------------------------------------------------
// Gate and up panels alternate ([gate 0][up 0][gate 1][up 1]...) so a fused gate/up kernel
// streams one buffer; the down panels follow. A gate/up panel has K = hidden, a down panel
// K = intermediate; their byte sizes are the layout's. Offsets in bytes from the expert start.
struct ExpertPanels {
    int64_t hidden, intermediate;
    size_t gate_up_panel, down_panel;

    size_t gate(int64_t p) const { return size_t(2 * p) * gate_up_panel; }
    size_t up(int64_t p) const { return gate(p) + gate_up_panel; }
    size_t down(int64_t p) const { return gate(panel_count(intermediate)) + size_t(p) * down_panel; }
    size_t bytes() const { return down(panel_count(hidden)); }
};

// --- "kt-bf16-p16k2-v1" -------------------------------------------------------------------
// A panel is ceil(K/2) chunks of 64 bytes; chunk j holds the bf16 pair (w[n][2j], w[n][2j+1])
// of each of its 16 channels, lane-major (vdpbf16ps's operand order). N pads to 16 and K to 2
// with zeros.
namespace bf16 {
constexpr const char* kId = "kt-bf16-p16k2-v1";
inline size_t panel_bytes(int64_t k) { return size_t((k + 1) / 2) * 64; }
inline ExpertPanels expert(int64_t hidden, int64_t intermediate) {
    return {hidden, intermediate, panel_bytes(hidden), panel_bytes(intermediate)};
}
inline size_t offset(int64_t k, int lane) { return size_t(k / 2) * 64 + size_t(lane) * 4 + size_t(k % 2) * 2; }
inline float weight(const uint8_t* panel, int64_t k, int lane) {
    uint16_t h;
    std::memcpy(&h, panel + offset(k, lane), 2);
    return bf16_bits_to_float(h);
}
}  // namespace bf16

// --- "kt-int8-p16k4-v1" -------------------------------------------------------------------
// A panel is a 128-byte header {f32 scale[16]; i32 comp[16] = 128 * sum_k q} and then
// ceil(K/4) chunks of 64 bytes: chunk j holds the int8 codes of k = 4j..4j+3 of each channel,
// lane-major (vpdpbusd's operand order). w = scale * q, q in [-127, 127].
namespace int8 {
constexpr const char* kId = "kt-int8-p16k4-v1";
constexpr size_t kHeaderBytes = 128;
inline size_t panel_bytes(int64_t k) { return kHeaderBytes + size_t((k + 3) / 4) * 64; }
inline ExpertPanels expert(int64_t hidden, int64_t intermediate) {
    return {hidden, intermediate, panel_bytes(hidden), panel_bytes(intermediate)};
}
inline size_t code_offset(int64_t k, int lane) { return kHeaderBytes + size_t(k / 4) * 64 + size_t(lane) * 4 + size_t(k % 4); }
inline float scale(const uint8_t* panel, int lane) {
    float s;
    std::memcpy(&s, panel + size_t(lane) * 4, 4);
    return s;
}
inline float weight(const uint8_t* panel, int64_t k, int lane) {
    return scale(panel, lane) * float(int8_t(panel[code_offset(k, lane)]));
}
}  // namespace int8

// --- E4M3 bytes (FP8 codes, NVFP4 scales) ------------------------------------------------
namespace e4m3 {
// E4M3 magnitude code c (0..127) -> the bf16 bits of its value / 256, exact (0x7f, NaN, is
// refused at load).
constexpr uint16_t e4m3_bf16_bits(int c) {
    const int e = c >> 3, m = c & 7;
    if (e == 0) {   // zero and the subnormals m * 2^-17 (after the / 256) = 1.f * 2^(t - 17), t = log2(m)
        if (m == 0) return 0;
        const int t = m >= 4 ? 2 : m >= 2 ? 1 : 0;
        return uint16_t(((t + 110) << 7) | ((m << (7 - t)) & 0x7f));
    }
    return uint16_t(((e + 112) << 7) | (m << 4));
}
static_assert(e4m3_bf16_bits(0x08) == 0x3880 && e4m3_bf16_bits(0x01) == 0x3700 && e4m3_bf16_bits(0x03) == 0x37C0 &&
                  e4m3_bf16_bits(0x07) == 0x3860 && e4m3_bf16_bits(0x7e) == 0x3FE0,
              "E4M3 -> bf16(value / 256): 2^-14, 2^-17, 1.5 * 2^-16, 1.75 * 2^-15, 448 / 256");

// A code byte (sign bit 7) -> its value / 256 as f32.
inline float e4m3_over_256(uint8_t code) {
    const float v = bf16_bits_to_float(e4m3_bf16_bits(code & 0x7f));
    return (code & 0x80) ? -v : v;
}

}  // namespace e4m3

// --- E8M0 bytes (MXFP4's block scales) ------------------------------------------------------
// An E8M0 byte e is the scale 2^(e - 127); MXFP4's codes decode to 2 value, so its layout reads
// e as half that: 2^(e - 128), exact in f32 (e = 0 and 1 subnormal; 0xFF, NaN, is refused at
// load). The vector kernels compute the same bits as max(e << 23, 2^-127's bits) times 0.5.
inline float e8m0_half(uint8_t e) {
    const int x = int(e) - 128;   // -128 .. 126: normal from -126, subnormal below
    const uint32_t bits = x >= -126 ? uint32_t(x + 127) << 23 : 1u << (x + 149);   // 2^x = 2^(x + 149) * 2^-149
    float s;
    std::memcpy(&s, &bits, 4);
    return s;
}

// --- "kt-int4-p16-v2" (INT4) and "kt-rawint4-p16-v1" (RAWINT4) ------------------------------
// Per panel, per group of G consecutive k (32, 64 or 128), a header and then G/8 chunks of
// 64 bytes: byte lane*4 + b of chunk c holds u[lane][8c + b] in its low nibble and
// u[lane][8c + 4 + b] in its high one. w = s * (u - z).
// - INT4: header {f32 s[16]} for symmetric groups (z = 8), {f32 s[16]; f32 s*z[16]} with zero
//   points (the kernels apply s*u - s*z).
// - RAWINT4 (G = 32, symmetric, bf16 scales as compressed-tensors checkpoints ship them):
//   header {bf16 s[16]}, 32 bytes, so a group is 288 bytes rather than 320.
namespace int4 {
constexpr const char* kId = "kt-int4-p16-v2";
constexpr const char* kRawId = "kt-rawint4-p16-v1";

struct Geometry {
    int64_t g;                 // group size: 32, 64 or 128 (NVFP4: 16)
    bool zero_point;           // asymmetric groups: the header holds s*z too
    bool bf16_scales;          // RAWINT4: s as bf16, no s*z
    bool e4m3_scales = false;  // NVFP4: s as E4M3 bytes (value / 256)
    size_t prefix_bytes = 0;   // NVFP4: the panel's f32[16] global-scale vector before its groups
    bool e8m0_scales = false;  // MXFP4: s as the file's E8M0 exponent bytes e, read as 2^(e - 128)

    size_t header_bytes() const { return zero_point ? 128 : bf16_scales ? 32 : (e4m3_scales || e8m0_scales) ? 16 : 64; }
    size_t group_bytes() const { return header_bytes() + size_t(g) * 8; }
    size_t group_at(int64_t grp) const { return prefix_bytes + size_t(grp) * group_bytes(); }
    size_t panel_bytes(int64_t k) const { return group_at(k / g); }
    ExpertPanels expert(int64_t hidden, int64_t intermediate) const {
        return {hidden, intermediate, panel_bytes(hidden), panel_bytes(intermediate)};
    }
    // The byte holding u[lane][k], and whether it is the high nibble.
    size_t code_offset(int64_t k, int lane) const {
        const int64_t within = k % g, b = within % 8;
        return group_at(k / g) + header_bytes() + size_t(within / 8) * 64 + size_t(lane) * 4 + size_t(b % 4);
    }
    static bool high_nibble(int64_t k) { return (k % 8) >= 4; }

    float scale(const uint8_t* panel, int64_t k, int lane) const {
        const uint8_t* header = panel + group_at(k / g);
        if (e4m3_scales) return e4m3::e4m3_over_256(header[lane]);
        if (e8m0_scales) return e8m0_half(header[lane]);
        if (bf16_scales) {
            uint16_t h;
            std::memcpy(&h, header + size_t(lane) * 2, 2);
            return bf16_bits_to_float(h);
        }
        float s;
        std::memcpy(&s, header + size_t(lane) * 4, 4);
        return s;
    }
    int code(const uint8_t* panel, int64_t k, int lane) const {
        const uint8_t byte = panel[code_offset(k, lane)];
        return high_nibble(k) ? byte >> 4 : byte & 15;
    }
    // s * u - s*z as the kernels apply it (s * (u - 8) for symmetric groups).
    float weight(const uint8_t* panel, int64_t k, int lane) const {
        const float s = scale(panel, k, lane);
        const int u = code(panel, k, lane);
        if (!zero_point) return s * float(u - 8);
        float sz;
        std::memcpy(&sz, panel + group_at(k / g) + 64 + size_t(lane) * 4, 4);
        return s * float(u) - sz;
    }
};

// RAWINT4 is always G = 32, symmetric; INT4 takes the layer's group size and zero-point flag.
inline Geometry geometry(bool raw, int64_t group_size, bool zero_point) {
    if (raw) return {32, false, true};
    return {group_size, zero_point, false};
}
}  // namespace int4

// --- "kt-mxfp4-p16-v2" (MXFP4: OCP microscaling FP4, GPT-OSS's expert format) -------------
// INT4's symmetric group layout with G = 32, holding E2M1 codes c (sign bit 3, magnitudes 0,
// 0.5, 1, 1.5, 2, 3, 4, 6) where INT4 holds u. Doubled, every E2M1 value is an integer in
// [-12, 12], so the kernels look c up as u = 2 value + 12 in [0, 24] (one byte shuffle) and run
// INT4's integer dot with 12 where INT4 subtracts 8: w = s * (u - 12). A group's header is the 16
// channels' E8M0 scale bytes as the file stores them, read as s = 2^(e - 128) (the block's scale
// halved, e8m0_half): 272 bytes per 16 x 32 weights, the file's 4.25 bits per weight
// (v1 held s as f32: 5 bits, +17.6 %, which decode read in full).
namespace mxfp4 {
constexpr const char* kId = "kt-mxfp4-p16-v2";
constexpr int64_t kBlock = 32;      // elements per E8M0 scale
constexpr int kOffset = 12;         // u = 2 value + kOffset
constexpr uint8_t kDoubledPlusOffset[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

inline int4::Geometry geometry() { return {kBlock, false, false, false, 0, true}; }

inline float weight(const int4::Geometry& geo, const uint8_t* panel, int64_t k, int lane) {
    return geo.scale(panel, k, lane) * float(int(kDoubledPlusOffset[geo.code(panel, k, lane)]) - kOffset);
}
}  // namespace mxfp4

// --- "kt-fp8-p16-v1" and "kt-fp8-p16-v2" (FP8 E4M3, block or per-channel scales) ------------
// A panel is a header of one 64-byte f32[16] scale vector per 128-wide k block (a block format
// repeats its scalar, a per-channel one its 16 channels' scales; 2^8 folded in, since codes
// decode to value / 256), then the code bytes:
// - v1: K rows of 16 codes, row k's code of channel `lane` at 16 k + lane.
// - v2: K padded with zero codes to a multiple of 4, in groups of four k rows (64 bytes); in a
//   group, row r's code of channel `lane` sits at 16 (lane / 4) + 8 (r / 2) + 2 (lane % 4) +
//   r % 2 — the order in which two byte-table lookups and two byte unpacks give vdpbf16ps its
//   (k, k+1) bf16 pairs.
namespace fp8 {
constexpr const char* kIdRows = "kt-fp8-p16-v1";
constexpr const char* kIdQuads = "kt-fp8-p16-v2";
constexpr int64_t kBlock = 128;        // k (and, for block scales, n) per scale block
constexpr size_t kScaleBytes = 64;     // one f32[16] scale vector per k block

struct Geometry {
    int64_t row_group;        // 1 (v1) or 4 (v2)
    int64_t block = kBlock;   // k per scale vector: 128 (FP8, FP8_PERCHANNEL), 32 (MXFP8)

    int64_t kblocks(int64_t k) const { return (k + block - 1) / block; }
    int64_t code_rows(int64_t k) const { return (k + row_group - 1) / row_group * row_group; }
    size_t codes_at(int64_t k) const { return size_t(kblocks(k)) * kScaleBytes; }
    size_t panel_bytes(int64_t k) const { return codes_at(k) + size_t(code_rows(k)) * kPanel; }
    ExpertPanels expert(int64_t hidden, int64_t intermediate) const {
        return {hidden, intermediate, panel_bytes(hidden), panel_bytes(intermediate)};
    }
    // Byte offset, from the panel's first code, of row k's code for channel `lane`.
    size_t code_offset(int64_t k, int lane) const {
        if (row_group == 1) return size_t(k) * kPanel + size_t(lane);
        const int r = int(k % 4);
        return size_t(k - r) * kPanel + size_t(16 * (lane / 4) + 8 * (r / 2) + 2 * (lane % 4) + r % 2);
    }
};
inline Geometry geometry(bool quads) { return {quads ? 4 : 1, kBlock}; }

using e4m3::e4m3_bf16_bits;
using e4m3::e4m3_over_256;

// Weight (lane, k) of a panel of K columns.
inline float weight(const Geometry& geo, const uint8_t* panel, int64_t K, int64_t k, int lane) {
    float s;
    std::memcpy(&s, panel + size_t(k / geo.block) * kScaleBytes + size_t(lane) * 4, 4);
    return s * e4m3_over_256(panel[geo.codes_at(K) + geo.code_offset(k, lane)]);
}
}  // namespace fp8

// --- "kt-mxfp8-p16-v1" and "kt-mxfp8-p16-v2" (MXFP8: OCP microscaling FP8, MiniMax-M3) --------
// FP8's panels (v1 rows / v2 quads, as the target's FP8 layout) with one scale vector per 32 k:
// the E8M0 exponent e of each channel's block as 2^(e - 127) * 2^8 = 2^(e - 119), exact and normal
// in f32 for every e but 0xFF (NaN, refused at load).
namespace mxfp8 {
constexpr const char* kIdRows = "kt-mxfp8-p16-v1";
constexpr const char* kIdQuads = "kt-mxfp8-p16-v2";
constexpr int64_t kBlock = 32;   // elements per E8M0 scale
inline fp8::Geometry geometry(bool quads) { return {quads ? 4 : 1, kBlock}; }
inline float header_scale(uint8_t e) {
    const uint32_t bits = uint32_t(e + 8) << 23;   // 2^(e - 119) = 2^((e + 8) - 127)
    float s;
    std::memcpy(&s, &bits, 4);
    return s;
}
}  // namespace mxfp8

// --- "kt-nvfp4-p16-v1" (NVFP4: ModelOpt's FP4, E4M3 scales per 16 and a per-tensor scale) -----
// MXFP4's codes and u = 2 value + 12 lookup in INT4's group layout at G = 16, with two changes
// that keep a panel at the file's 4.5 bits per weight: a group's header is the 16 channels' E4M3
// scale bytes as the checkpoint ships them (16 bytes, read as value / 256 like FP8's codes), and
// each panel starts with one 64-byte f32[16] vector holding the tensor's global scale
// (weight_scale_2) times 128 (the 2^8 of the E4M3 decode, halved for u's doubling):
// w = global * e4m3 * value = P * (s / 256) * (u - 12), P the panel's vector, s the header's.
namespace nvfp4 {
constexpr const char* kId = "kt-nvfp4-p16-v1";
constexpr int64_t kBlock = 16;   // elements per E4M3 scale
inline int4::Geometry geometry() { return {kBlock, false, false, true, 64}; }

inline float panel_scale(const uint8_t* panel, int lane) {
    float p;
    std::memcpy(&p, panel + size_t(lane) * 4, 4);
    return p;
}
inline float weight(const uint8_t* panel, int64_t k, int lane) {
    const int4::Geometry geo = geometry();
    return panel_scale(panel, lane) * geo.scale(panel, k, lane) *
           float(int(mxfp4::kDoubledPlusOffset[geo.code(panel, k, lane)]) - mxfp4::kOffset);
}
}  // namespace nvfp4

}  // namespace
}  // namespace kt::layouts
