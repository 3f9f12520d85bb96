// LLAMAFILE's packed layout "kt-ggml-v8" (docs/formats.md): GGUF's ggml blocks regrouped into
// panels of 16 output channels — every type's codes and scales as the file holds them, nothing
// dequantized — so that one outer-product kernel per ISA runs them all, decode and prefill (IQ2_XXS
// and IQ3_XXS, grid-index types, have their own). kt-backend-avx (x86) and kt-backend-kml (aarch64,
// without the grid types) both pack and compute on it; this header is
// its byte geometry, the file-block checks, the packer (scalar: it runs at load, not in the hot
// loop) and a scalar reader per type (the layout's specification, and the oracle the tests unpack
// packed experts with). The kernels that stream it stay in the backends.
//
// An expert is gate, up and down one after another, each starting on 64 bytes, each its panels
// of 16 channels, each panel K / block of the type's panel blocks. Each type is a group-wise
// integer format in disguise, w = s * u - s*z per sub-block of 16 or 32 k (Q4_K: s = d * sc,
// s*z = dmin * m; Q4_0: s = d, z = 8; IQ4_XS: a table lookup first). 4-bit codes sit as INT4's
// (chunk c of 64 bytes holds k = 8c..8c+3 in its low nibbles and 8c+4..8c+7 in its high ones,
// byte lane * 4 + b: the int8 dot products' operand order), 8-bit ones as kt-int8-p16k4-v1's
// (chunk c holds k = 4c..4c+3), 2-bit ones four k-quads to a chunk. Each panel form below gives
// its block's bytes, e.g.
//   Q4_K (256 k): f16 d[16], f16 dmin[16], u8 sc[8][16], u8 m[8][16], 32 chunks of 64 bytes
//                 (2368 bytes for 4096 weights: 4.625 bits each, the file's 4.5);
//   Q8_0 (32 k):  f16 d[16], 8 chunks of 64 bytes (544 bytes for 512 weights: the file's 8.5 bits).
// History: v2 kept Q2_K, Q3_K, Q4_0, Q5_K and IQ4_XS as the file's rows (run a block at a time
// from L1, at a third to two thirds of llama.cpp's decode speed); v3 kept Q8_0's d as f32 (9 bits
// per weight); v4 held Q6_K's 6-bit codes in bytes (8.6 bits per weight against the file's 6.56),
// v5 splits them into INT4's nibbles and a line of high bit pairs (6.63); v6 keeps Q4_K's and
// Q5_K's d and dmin f16 as the file does (v5 widened them to f32: 4.75 and 5.75 bits per weight);
// v7 adds IQ2_XXS and IQ3_XXS (the others' bytes unchanged), whose grid indices need a kernel of
// their own; v8 adds the 32-element Q4_1, Q5_0, Q5_1 and IQ4_NL, then IQ1_S, IQ1_M, IQ2_XS, IQ2_S and
// IQ3_S (the others' bytes unchanged).
//
// Internal linkage, portable C++, as packed_layouts.h: backends compile it into translation
// units with different ISA flags.
#pragma once
#include <kt/formats/checkpoint_inputs.h>
#include <kt/formats/packed_layouts.h>
#include <kt/plugin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace kt::layouts::ggml {
namespace {

constexpr const char* kId = "kt-ggml-v8";
constexpr size_t kChunkBytes = 64;

// ---- the file's blocks ---------------------------------------------------------------------

struct BlockType {
    kt_dtype dtype;
    const char* name;
    int64_t elems, bytes;
    int scale_at[2];   // offsets of the block's f16 scales (-1: none), checked for NaN/Inf at load
};
constexpr BlockType kBlockTypes[] = {
    {KT_DTYPE_GGML_Q4_0, "Q4_0", 32, 18, {0, -1}},      {KT_DTYPE_GGML_Q8_0, "Q8_0", 32, 34, {0, -1}},
    {KT_DTYPE_GGML_Q2_K, "Q2_K", 256, 84, {80, 82}},    {KT_DTYPE_GGML_Q3_K, "Q3_K", 256, 110, {108, -1}},
    {KT_DTYPE_GGML_Q4_K, "Q4_K", 256, 144, {0, 2}},     {KT_DTYPE_GGML_Q5_K, "Q5_K", 256, 176, {0, 2}},
    {KT_DTYPE_GGML_Q6_K, "Q6_K", 256, 210, {208, -1}},  {KT_DTYPE_GGML_IQ4_XS, "IQ4_XS", 256, 136, {0, -1}},
    {KT_DTYPE_GGML_IQ2_XXS, "IQ2_XXS", 256, 66, {0, -1}}, {KT_DTYPE_GGML_IQ3_XXS, "IQ3_XXS", 256, 98, {0, -1}},
    {KT_DTYPE_GGML_Q4_1, "Q4_1", 32, 20, {0, 2}},       {KT_DTYPE_GGML_Q5_0, "Q5_0", 32, 22, {0, -1}},
    {KT_DTYPE_GGML_Q5_1, "Q5_1", 32, 24, {0, 2}},       {KT_DTYPE_GGML_IQ4_NL, "IQ4_NL", 32, 18, {0, -1}},
    {KT_DTYPE_GGML_IQ1_S, "IQ1_S", 256, 50, {0, -1}},
    {KT_DTYPE_GGML_IQ1_M, "IQ1_M", 256, 56, {-1, -1}},   // its f16 d is spread over four words: iq1m_d_bits
    {KT_DTYPE_GGML_IQ2_XS, "IQ2_XS", 256, 74, {0, -1}},  {KT_DTYPE_GGML_IQ2_S, "IQ2_S", 256, 82, {0, -1}},
    {KT_DTYPE_GGML_IQ3_S, "IQ3_S", 256, 110, {0, -1}},
};
constexpr const char* kSupported =
    "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S";

constexpr const BlockType* block_type(kt_dtype d) {
    for (const BlockType& t : kBlockTypes)
        if (t.dtype == d) return &t;
    return nullptr;
}

inline float f16_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_bits_to_float(h);
}

// A 256-element K-quant block's unsigned codes u in element order (ggml's bit layouts), for the
// packer; the scales are read from the block where the packer needs them.
inline void q2k_codes(const uint8_t* b, uint8_t* u) {   // w = d * (sc & 15) * u - dmin * (sc >> 4)
    for (int e = 0; e < 256; ++e) u[e] = uint8_t((b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
}
inline void q3k_codes(const uint8_t* b, uint8_t* u) {   // u = q + 4: the low 2 bits, + 4 where hmask is set
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        u[e] = uint8_t(((b[32 + 32 * h + l] >> (2 * s)) & 3) | (((b[l] >> (4 * h + s)) & 1) << 2));
    }
}
// The j-th 16-element group's scale of a Q3_K block, sc - 32, from its 12 packed 6-bit scales.
inline int q3k_scale(const uint8_t* b, int j) {
    const uint8_t* sc = b + 96;
    const int lo = (j < 8 ? sc[j] : sc[j - 8] >> 4) & 15, hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}
inline void q4k_codes(const uint8_t* b, uint8_t* u) {
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            u[64 * c + l] = b[16 + 32 * c + l] & 15;
            u[64 * c + 32 + l] = b[16 + 32 * c + l] >> 4;
        }
}
inline void q5k_codes(const uint8_t* b, uint8_t* u) {   // Q4_K's nibbles + 16 * the qh bit
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t q = b[48 + 32 * c + l], qh = b[16 + l];
            u[64 * c + l] = uint8_t((q & 15) | (((qh >> (2 * c)) & 1) << 4));
            u[64 * c + 32 + l] = uint8_t((q >> 4) | (((qh >> (2 * c + 1)) & 1) << 4));
        }
}
inline void q6k_codes(const uint8_t* b, uint8_t* u) {   // u = q + 32, 6 bits: w = d * sc * (u - 32)
    for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
            const uint8_t a = b[64 * h + l], c = b[64 * h + 32 + l], qh = b[128 + 32 * h + l];
            uint8_t* o = u + 128 * h + l;
            o[0] = uint8_t((a & 15) | ((qh & 3) << 4));
            o[32] = uint8_t((c & 15) | (((qh >> 2) & 3) << 4));
            o[64] = uint8_t((a >> 4) | (((qh >> 4) & 3) << 4));
            o[96] = uint8_t((c >> 4) | (((qh >> 6) & 3) << 4));
        }
}
// ggml's get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K block's 12 scale bytes.
inline void scale_min_k4(const uint8_t* q, int j, uint8_t* sc, uint8_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = uint8_t((q[j + 4] & 15) | ((q[j - 4] >> 6) << 4));
        *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
// IQ4_XS: 4-bit indices into a fixed non-linear table of int8 values; 6-bit scales - 32.
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline int iq4_scale(const uint8_t* b, int j) {   // low 4 bits in scales_l, high 2 in scales_h
    const int scales_h = b[2] | (b[3] << 8);
    return ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4);
}
// The 32-element types' codes in element order: 16 bytes of nibbles at `qs` (element j in the low
// nibble of byte j, element j + 16 in its high one) and, for Q5_0 / Q5_1, the fifth bits as one
// little-endian u32 at `qh` (bit j: element j's).
inline void nibble_codes(const uint8_t* qs, const uint8_t* qh, uint8_t* u) {
    uint32_t h = 0;
    if (qh) std::memcpy(&h, qh, 4);
    for (int j = 0; j < 16; ++j) {
        u[j] = uint8_t((qs[j] & 15) | (((h >> j) & 1) << 4));
        u[j + 16] = uint8_t((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4));
    }
}

// IQ2_XXS (2.0625 bits per weight): per 256 k an f16 d, then per 32 k two little-endian words:
// four bytes, each the index of one 8-element group's magnitudes in a fixed grid of 256
// (every magnitude 8, 25 or 43), and a word holding the four groups' 7-bit sign indices (bits
// 7l..7l+6) and a 4-bit scale ls (bits 28..31). A sign index s7 expands to the byte s7 |
// parity(s7) << 7 (an even number of negatives per 8), bit t negating element t; the element is
// d * (0.5 + ls) * 0.25 * magnitude * sign. The grid, two bits per magnitude (0, 1, 2 -> 8, 25,
// 43; element t at bits 2t), is the format's data: gguf-py's IQ2_XXS grid, checked entry by
// entry in the tests (the reference backend's dequantizer against gguf-py's, bit for bit).
constexpr uint8_t kIq2Magnitude[3] = {8, 25, 43};
constexpr uint16_t kIq2xxsGrid[256] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0020, 0x0022, 0x0028, 0x002a, 0x0041,
    0x0044, 0x0050, 0x0058, 0x0061, 0x0064, 0x0080, 0x0082, 0x008a, 0x00a2, 0x0101, 0x0104, 0x0110,
    0x0115, 0x0140, 0x0184, 0x0198, 0x0200, 0x0202, 0x0222, 0x0282, 0x0401, 0x0404, 0x0410, 0x0421,
    0x0424, 0x0440, 0x0442, 0x0448, 0x0460, 0x0481, 0x0484, 0x0490, 0x04a4, 0x0500, 0x0502, 0x0508,
    0x0520, 0x0546, 0x0569, 0x0580, 0x0591, 0x0609, 0x0610, 0x0640, 0x0684, 0x06a4, 0x0800, 0x0805,
    0x0808, 0x0814, 0x0828, 0x0841, 0x0844, 0x0850, 0x0852, 0x0888, 0x0904, 0x0940, 0x0a02, 0x0a14,
    0x1001, 0x1004, 0x1010, 0x1021, 0x1040, 0x1060, 0x1084, 0x1090, 0x1095, 0x1100, 0x1108, 0x1120,
    0x1150, 0x115a, 0x1180, 0x1224, 0x1245, 0x1400, 0x1408, 0x1420, 0x1425, 0x1449, 0x1480, 0x1518,
    0x1562, 0x1600, 0x1616, 0x1801, 0x1804, 0x1810, 0x1840, 0x1881, 0x1900, 0x1905, 0x19a0, 0x1a51,
    0x2000, 0x2002, 0x200a, 0x2044, 0x2061, 0x2080, 0x2082, 0x2129, 0x2148, 0x2200, 0x2202, 0x2401,
    0x2404, 0x2410, 0x2440, 0x2456, 0x2500, 0x2541, 0x2564, 0x2690, 0x2808, 0x2820, 0x2894, 0x2a44,
    0x4001, 0x4004, 0x4010, 0x4018, 0x4021, 0x4024, 0x4040, 0x4048, 0x4056, 0x4060, 0x4081, 0x4084,
    0x4090, 0x4100, 0x4120, 0x4161, 0x4180, 0x4185, 0x4201, 0x4210, 0x4248, 0x4256, 0x4268, 0x4400,
    0x4408, 0x4420, 0x4480, 0x4499, 0x4512, 0x4524, 0x4600, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845,
    0x4900, 0x4958, 0x4961, 0x4982, 0x4a45, 0x4a90, 0x5000, 0x5008, 0x5011, 0x5019, 0x5020, 0x5080,
    0x5088, 0x5104, 0x5142, 0x51a4, 0x5291, 0x5490, 0x5492, 0x550a, 0x5601, 0x5654, 0x5800, 0x5811,
    0x5819, 0x5864, 0x5940, 0x5a08, 0x6004, 0x6010, 0x6040, 0x6068, 0x6100, 0x6155, 0x6218, 0x6260,
    0x6400, 0x6405, 0x6510, 0x6512, 0x6584, 0x6842, 0x8000, 0x8002, 0x800a, 0x8041, 0x8082, 0x8104,
    0x8118, 0x8140, 0x8211, 0x8401, 0x8404, 0x8410, 0x8415, 0x8440, 0x8460, 0x8500, 0x8546, 0x8594,
    0x8609, 0x8640, 0x8660, 0x8802, 0x8904, 0x8a11, 0x9004, 0x9010, 0x9024, 0x9040, 0x90a1, 0x9116,
    0x9180, 0x9245, 0x9400, 0x9422, 0x9444, 0x9551, 0x9881, 0x9920, 0xa002, 0xa050, 0xa085, 0xa109,
    0xa200, 0xa418, 0xa850, 0xa904,
};
constexpr uint8_t iq2_sign_byte(uint32_t s7) { return uint8_t(s7 | ((__builtin_popcount(s7) & 1) << 7)); }
// Element t (0..7) of grid entry i.
constexpr uint8_t iq2xxs_magnitude(int i, int t) { return kIq2Magnitude[(kIq2xxsGrid[i] >> (2 * t)) & 3]; }

// IQ2_XS (2.3125 bits per weight): per 256 k an f16 d, per 8-element group a u16 (a 9-bit index into
// a grid of 512 entries of IQ2_XXS's magnitudes, and the 7-bit sign index of IQ2_XXS above it), and
// per 32 k a byte of two 4-bit scales ls, one per 16 k; the element is d * (0.5 + ls) * 0.25 *
// magnitude * sign. The grid (2 bits per magnitude as kIq2xxsGrid's) is gguf-py's, checked as the others.
constexpr uint16_t kIq2xsGrid[512] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0016, 0x0019, 0x0020, 0x0022, 0x0025,
    0x0028, 0x0041, 0x0044, 0x0046, 0x0049, 0x0050, 0x0052, 0x0055, 0x0058, 0x0061, 0x0064, 0x0080,
    0x0082, 0x0085, 0x0088, 0x0091, 0x0094, 0x0099, 0x00a0, 0x0101, 0x0104, 0x0106, 0x0109, 0x0110,
    0x0112, 0x0115, 0x0118, 0x011a, 0x0121, 0x0124, 0x0140, 0x0142, 0x0145, 0x0148, 0x0151, 0x0154,
    0x0160, 0x0168, 0x0181, 0x0184, 0x0190, 0x0200, 0x0202, 0x0205, 0x0208, 0x0211, 0x0214, 0x0220,
    0x0241, 0x0244, 0x0250, 0x0255, 0x0280, 0x028a, 0x0401, 0x0404, 0x0406, 0x0409, 0x0410, 0x0412,
    0x0415, 0x0418, 0x0421, 0x0424, 0x0440, 0x0442, 0x0445, 0x0448, 0x0451, 0x0454, 0x0456, 0x0460,
    0x0481, 0x0484, 0x0490, 0x0500, 0x0502, 0x0505, 0x0508, 0x0511, 0x0514, 0x0520, 0x0541, 0x0544,
    0x0550, 0x0561, 0x0580, 0x0601, 0x0604, 0x0610, 0x0626, 0x0640, 0x0642, 0x0684, 0x0800, 0x0802,
    0x0805, 0x0808, 0x080a, 0x0811, 0x0814, 0x0820, 0x0825, 0x0841, 0x0844, 0x0850, 0x0858, 0x0880,
    0x08a0, 0x08aa, 0x0901, 0x0904, 0x0910, 0x0940, 0x0981, 0x0989, 0x0a00, 0x0a20, 0x0a28, 0x0a96,
    0x0aa0, 0x1001, 0x1004, 0x1006, 0x1009, 0x1010, 0x1012, 0x1015, 0x1018, 0x1021, 0x1024, 0x1040,
    0x1042, 0x1045, 0x1048, 0x1051, 0x1054, 0x1060, 0x106a, 0x1081, 0x1084, 0x1090, 0x1100, 0x1102,
    0x1105, 0x1108, 0x1111, 0x1114, 0x1120, 0x1141, 0x1144, 0x1150, 0x1180, 0x1194, 0x1196, 0x1201,
    0x1204, 0x1206, 0x1210, 0x1240, 0x1260, 0x1400, 0x1402, 0x1405, 0x1408, 0x1411, 0x1414, 0x1420,
    0x1441, 0x1444, 0x1449, 0x1450, 0x1464, 0x1480, 0x1501, 0x1504, 0x1510, 0x1540, 0x1600, 0x1614,
    0x1649, 0x1801, 0x1804, 0x1810, 0x1812, 0x1840, 0x1854, 0x1886, 0x1900, 0x1905, 0x1966, 0x1a51,
    0x1aa9, 0x2000, 0x2002, 0x2005, 0x2008, 0x200a, 0x2011, 0x2014, 0x2020, 0x2041, 0x2044, 0x2050,
    0x2080, 0x20a0, 0x2101, 0x2104, 0x2110, 0x2140, 0x2148, 0x2165, 0x2200, 0x2222, 0x2280, 0x22a8,
    0x2401, 0x2404, 0x2410, 0x2429, 0x2440, 0x2500, 0x2541, 0x2552, 0x2599, 0x2601, 0x261a, 0x26a6,
    0x2800, 0x2808, 0x280a, 0x2820, 0x2855, 0x2888, 0x28a2, 0x2968, 0x2990, 0x2a08, 0x2a20, 0x2a82,
    0x2a88, 0x2a8a, 0x4001, 0x4004, 0x4006, 0x4009, 0x4010, 0x4012, 0x4015, 0x4018, 0x4021, 0x4024,
    0x4040, 0x4042, 0x4045, 0x4048, 0x404a, 0x4051, 0x4054, 0x4060, 0x4065, 0x4081, 0x4084, 0x4090,
    0x4100, 0x4102, 0x4105, 0x4108, 0x4111, 0x4114, 0x4120, 0x4141, 0x4144, 0x4150, 0x4180, 0x4185,
    0x41a2, 0x4201, 0x4204, 0x4210, 0x4212, 0x4229, 0x4240, 0x4400, 0x4402, 0x4405, 0x4408, 0x4411,
    0x4414, 0x4419, 0x4420, 0x4441, 0x4444, 0x4450, 0x4480, 0x4494, 0x4501, 0x4504, 0x4510, 0x4524,
    0x4540, 0x459a, 0x4600, 0x460a, 0x4644, 0x4650, 0x4801, 0x4804, 0x4810, 0x4840, 0x4845, 0x4854,
    0x4862, 0x4900, 0x4911, 0x4944, 0x4950, 0x4969, 0x4a04, 0x5000, 0x5002, 0x5005, 0x5008, 0x5011,
    0x5014, 0x5020, 0x5028, 0x5041, 0x5044, 0x5050, 0x5080, 0x5101, 0x5104, 0x5110, 0x5115, 0x5140,
    0x5142, 0x5200, 0x5244, 0x52aa, 0x5401, 0x5404, 0x5410, 0x5421, 0x5440, 0x5460, 0x5481, 0x54a1,
    0x5500, 0x5508, 0x5580, 0x5588, 0x5621, 0x5668, 0x56a1, 0x5800, 0x5814, 0x5841, 0x5850, 0x5899,
    0x591a, 0x5940, 0x5942, 0x5a85, 0x6001, 0x6004, 0x6010, 0x6040, 0x6054, 0x6062, 0x6086, 0x60a9,
    0x6100, 0x6224, 0x624a, 0x6292, 0x6400, 0x6416, 0x6510, 0x6540, 0x6545, 0x65a4, 0x6801, 0x686a,
    0x6925, 0x6a06, 0x6a54, 0x6a62, 0x8000, 0x8002, 0x8005, 0x8008, 0x8011, 0x8014, 0x8020, 0x802a,
    0x8041, 0x8044, 0x8050, 0x8080, 0x8082, 0x80a8, 0x80aa, 0x8101, 0x8104, 0x8106, 0x8110, 0x8140,
    0x8151, 0x8159, 0x8200, 0x8220, 0x8280, 0x8282, 0x82a0, 0x82a8, 0x8401, 0x8404, 0x8410, 0x8412,
    0x8415, 0x8440, 0x8460, 0x8489, 0x8500, 0x8544, 0x85a5, 0x8618, 0x866a, 0x8800, 0x8808, 0x8825,
    0x885a, 0x8880, 0x8882, 0x88a8, 0x8906, 0x8a22, 0x8a80, 0x8a88, 0x8a96, 0x8aa8, 0x9001, 0x9004,
    0x9010, 0x9040, 0x9056, 0x9084, 0x9100, 0x9122, 0x9164, 0x9256, 0x9289, 0x9400, 0x9405, 0x9444,
    0x9450, 0x9458, 0x9529, 0x9590, 0x9592, 0x9641, 0x9851, 0x98a6, 0x9949, 0x9a15, 0x9a60, 0xa000,
    0xa002, 0xa008, 0xa00a, 0xa020, 0xa02a, 0xa0a0, 0xa151, 0xa159, 0xa1a6, 0xa200, 0xa202, 0xa208,
    0xa22a, 0xa280, 0xa2a0, 0xa440, 0xa495, 0xa665, 0xa698, 0xa80a, 0xa820, 0xa822, 0xa828, 0xa8a0,
    0xa8a8, 0xa904, 0xa984, 0xa986, 0xaa28, 0xaa2a, 0xaa91, 0xaaaa,
};
constexpr uint8_t iq2xs_magnitude(int i, int t) { return kIq2Magnitude[(kIq2xsGrid[i] >> (2 * t)) & 3]; }

// IQ3_XXS (3.0625 bits per weight): per 256 k an f16 d, then the 64 grid indices of its 8-element
// groups' halves (two per group: elements 0..3 and 4..7) and 8 sign-and-scale words laid out as
// IQ2_XXS's; a grid entry is 4 magnitudes of 8 levels (4, 12, ..., 52, 62); the element is
// d * (0.5 + ls) * 0.5 * magnitude * sign. The grid, 4 bits per magnitude (element t at bits
// 4t), is gguf-py's IQ3_XXS grid, checked as IQ2_XXS's.
constexpr uint8_t kIq3Magnitude[8] = {4, 12, 20, 28, 36, 44, 52, 62};
constexpr uint16_t kIq3xxsGrid[256] = {
    0x0000, 0x0002, 0x0004, 0x0011, 0x0013, 0x0017, 0x0020, 0x0022, 0x0031, 0x0042, 0x0073, 0x0075,
    0x0101, 0x0103, 0x0110, 0x0112, 0x0121, 0x0125, 0x0130, 0x0132, 0x0141, 0x0154, 0x0170, 0x0200,
    0x0202, 0x0204, 0x0211, 0x0220, 0x0222, 0x0231, 0x0233, 0x0237, 0x0251, 0x0257, 0x0275, 0x0301,
    0x0307, 0x0310, 0x0312, 0x0325, 0x0370, 0x0413, 0x0437, 0x0444, 0x0457, 0x0473, 0x0475, 0x0501,
    0x0507, 0x0532, 0x0552, 0x0635, 0x0664, 0x0710, 0x0714, 0x0716, 0x0743, 0x0761, 0x1001, 0x1003,
    0x1010, 0x1012, 0x1021, 0x1023, 0x1030, 0x1032, 0x1034, 0x1047, 0x1050, 0x1100, 0x1102, 0x1111,
    0x1120, 0x1122, 0x1201, 0x1203, 0x1210, 0x1212, 0x1221, 0x1230, 0x1272, 0x1300, 0x1302, 0x1320,
    0x1331, 0x1346, 0x1366, 0x1401, 0x1405, 0x1450, 0x1520, 0x1524, 0x1546, 0x1571, 0x1605, 0x1722,
    0x1740, 0x2000, 0x2002, 0x2011, 0x2013, 0x2020, 0x2022, 0x2026, 0x2031, 0x2042, 0x2101, 0x2103,
    0x2105, 0x2110, 0x2112, 0x2121, 0x2130, 0x2163, 0x2167, 0x2170, 0x2200, 0x2202, 0x2211, 0x2217,
    0x2220, 0x2222, 0x2237, 0x2240, 0x2255, 0x2301, 0x2310, 0x2314, 0x2370, 0x2374, 0x2435, 0x2453,
    0x2503, 0x2527, 0x2541, 0x2574, 0x2701, 0x2703, 0x2716, 0x2745, 0x3001, 0x3010, 0x3012, 0x3021,
    0x3023, 0x3050, 0x3065, 0x3072, 0x3100, 0x3102, 0x3120, 0x3131, 0x3144, 0x3146, 0x3201, 0x3203,
    0x3210, 0x3225, 0x3252, 0x3272, 0x3311, 0x3333, 0x3430, 0x3447, 0x3472, 0x3500, 0x3506, 0x3522,
    0x3555, 0x3614, 0x3636, 0x3663, 0x3733, 0x3760, 0x4004, 0x4017, 0x4035, 0x4037, 0x4053, 0x4057,
    0x4174, 0x4220, 0x4237, 0x4240, 0x4260, 0x4266, 0x4307, 0x4345, 0x4404, 0x4451, 0x4464, 0x4525,
    0x4543, 0x4570, 0x4705, 0x4710, 0x4712, 0x4730, 0x5012, 0x5041, 0x5070, 0x5100, 0x5106, 0x5126,
    0x5155, 0x5214, 0x5232, 0x5272, 0x5302, 0x5353, 0x5410, 0x5423, 0x5427, 0x5472, 0x5502, 0x5531,
    0x5650, 0x5724, 0x5742, 0x6024, 0x6044, 0x6046, 0x6064, 0x6121, 0x6161, 0x6217, 0x6264, 0x6330,
    0x6336, 0x6444, 0x6505, 0x6552, 0x6633, 0x6703, 0x6721, 0x7003, 0x7005, 0x7007, 0x7010, 0x7032,
    0x7052, 0x7126, 0x7140, 0x7212, 0x7245, 0x7252, 0x7300, 0x7315, 0x7333, 0x7360, 0x7421, 0x7441,
    0x7500, 0x7502, 0x7524, 0x7630,
};
// Element t (0..3) of grid entry i.
constexpr uint8_t iq3xxs_magnitude(int i, int t) { return kIq3Magnitude[(kIq3xxsGrid[i] >> (4 * t)) & 7]; }

// IQ1_S (1.5625 bits per weight): per 256 k an f16 d, the low 8 bits of each 8-element group's
// 11-bit index into a grid of 2048 entries of 8 values in {-1, 0, 1} (qs[32]), and per 32 k a u16
// qh: the four groups' high 3 index bits (bits 3l..3l+2), a 3-bit scale s (bits 12..14) and the sign
// of a shift delta = +-1/8 (bit 15 set: negative); the element is d * (2 s + 1) * (value + delta).
// The grid, 2 bits per value (value + 1; element t at bits 2t), is gguf-py's IQ1_S grid, checked as
// IQ2_XXS's.
constexpr uint16_t kIq1sGrid[2048] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0015, 0x0020, 0x0022, 0x0028, 0x002a, 0x0045,
    0x0051, 0x0054, 0x0056, 0x0065, 0x0080, 0x0082, 0x0088, 0x008a, 0x0095, 0x00a0, 0x00a2, 0x00a8,
    0x00aa, 0x0104, 0x0105, 0x0111, 0x0114, 0x0116, 0x0119, 0x011a, 0x0125, 0x0141, 0x0146, 0x0149,
    0x0152, 0x0155, 0x015a, 0x0161, 0x0164, 0x0166, 0x0168, 0x0185, 0x0191, 0x0194, 0x0196, 0x01a5,
    0x0200, 0x0202, 0x0208, 0x020a, 0x0215, 0x0220, 0x0222, 0x0228, 0x022a, 0x0245, 0x0251, 0x0259,
    0x0264, 0x0269, 0x0280, 0x0282, 0x0288, 0x028a, 0x0291, 0x0295, 0x0299, 0x02a0, 0x02a2, 0x02a8,
    0x02aa, 0x0411, 0x0414, 0x0416, 0x0425, 0x0441, 0x0449, 0x0455, 0x045a, 0x0464, 0x0465, 0x0491,
    0x0499, 0x04a5, 0x0501, 0x0504, 0x0505, 0x0506, 0x0515, 0x0518, 0x051a, 0x0529, 0x0540, 0x0545,
    0x054a, 0x0550, 0x0551, 0x0554, 0x0555, 0x0556, 0x0559, 0x0560, 0x0562, 0x0565, 0x0568, 0x056a,
    0x0581, 0x0591, 0x0595, 0x0598, 0x059a, 0x05a1, 0x05a4, 0x05a5, 0x05a6, 0x05a9, 0x0614, 0x0619,
    0x0641, 0x0644, 0x0650, 0x0652, 0x0655, 0x0658, 0x0660, 0x0661, 0x0666, 0x0669, 0x0685, 0x0691,
    0x0694, 0x0699, 0x0800, 0x0802, 0x0808, 0x080a, 0x0815, 0x0820, 0x0822, 0x0828, 0x082a, 0x0845,
    0x0851, 0x0856, 0x0865, 0x0880, 0x0882, 0x0888, 0x088a, 0x0895, 0x08a0, 0x08a2, 0x08a8, 0x08aa,
    0x0905, 0x0911, 0x0914, 0x0919, 0x0924, 0x0925, 0x0941, 0x0950, 0x0951, 0x0955, 0x0961, 0x0964,
    0x0969, 0x0991, 0x0994, 0x0996, 0x0999, 0x09a5, 0x0a00, 0x0a02, 0x0a08, 0x0a0a, 0x0a15, 0x0a20,
    0x0a22, 0x0a28, 0x0a2a, 0x0a45, 0x0a51, 0x0a59, 0x0a61, 0x0a65, 0x0a80, 0x0a82, 0x0a85, 0x0a88,
    0x0a8a, 0x0a95, 0x0aa0, 0x0aa2, 0x0aa8, 0x0aaa, 0x1010, 0x1011, 0x1014, 0x1019, 0x1024, 0x1025,
    0x1041, 0x1044, 0x1050, 0x1055, 0x1058, 0x1061, 0x1064, 0x1065, 0x1069, 0x1091, 0x1094, 0x1096,
    0x10a1, 0x10a5, 0x1101, 0x1104, 0x1106, 0x1109, 0x1110, 0x1112, 0x1115, 0x1118, 0x1121, 0x1124,
    0x1129, 0x1145, 0x114a, 0x1150, 0x1151, 0x1152, 0x1154, 0x1155, 0x1156, 0x1159, 0x1160, 0x1165,
    0x1184, 0x1192, 0x1195, 0x11a1, 0x11a4, 0x1211, 0x1214, 0x1216, 0x1225, 0x1240, 0x1246, 0x1249,
    0x1252, 0x1255, 0x1258, 0x125a, 0x1264, 0x1266, 0x1285, 0x1291, 0x1294, 0x1296, 0x12a5, 0x1401,
    0x1406, 0x1409, 0x1414, 0x1415, 0x1418, 0x1419, 0x1421, 0x1426, 0x1441, 0x1445, 0x1446, 0x1448,
    0x144a, 0x1451, 0x1454, 0x1455, 0x1456, 0x1459, 0x1462, 0x1465, 0x1468, 0x1484, 0x1489, 0x1490,
    0x1494, 0x1495, 0x1498, 0x1499, 0x149a, 0x14a1, 0x14a4, 0x14a5, 0x14a9, 0x1502, 0x1505, 0x150a,
    0x1511, 0x1514, 0x1515, 0x1516, 0x1519, 0x1520, 0x1522, 0x1525, 0x1528, 0x152a, 0x1541, 0x1544,
    0x1545, 0x1546, 0x1551, 0x1552, 0x1554, 0x1555, 0x1556, 0x1559, 0x155a, 0x1561, 0x1564, 0x1565,
    0x1566, 0x1569, 0x1580, 0x1582, 0x1584, 0x1585, 0x1588, 0x158a, 0x1590, 0x1591, 0x1594, 0x1595,
    0x1596, 0x1599, 0x159a, 0x15a0, 0x15a2, 0x15a5, 0x1601, 0x1604, 0x1605, 0x1606, 0x1615, 0x1616,
    0x1618, 0x161a, 0x1621, 0x1626, 0x1640, 0x1642, 0x1644, 0x1645, 0x1648, 0x164a, 0x1651, 0x1655,
    0x1656, 0x1658, 0x1659, 0x1661, 0x1664, 0x1665, 0x1668, 0x1669, 0x166a, 0x1686, 0x168a, 0x1692,
    0x1695, 0x16a4, 0x16a9, 0x1811, 0x1816, 0x1825, 0x1841, 0x1844, 0x1846, 0x1849, 0x1850, 0x1855,
    0x1858, 0x185a, 0x1860, 0x1861, 0x1864, 0x1866, 0x1869, 0x1885, 0x1891, 0x1894, 0x18a5, 0x1910,
    0x1912, 0x1915, 0x191a, 0x1921, 0x1925, 0x1942, 0x1944, 0x1945, 0x1948, 0x1951, 0x1954, 0x1955,
    0x1956, 0x1959, 0x195a, 0x1960, 0x1965, 0x196a, 0x1989, 0x1991, 0x1992, 0x1995, 0x1998, 0x19a1,
    0x19a6, 0x19a9, 0x1a09, 0x1a16, 0x1a24, 0x1a26, 0x1a44, 0x1a46, 0x1a49, 0x1a50, 0x1a52, 0x1a55,
    0x1a58, 0x1a61, 0x1a66, 0x1a69, 0x1a85, 0x1a91, 0x1a96, 0x1a9a, 0x2000, 0x2002, 0x2008, 0x200a,
    0x2015, 0x2020, 0x2022, 0x2025, 0x2028, 0x202a, 0x2045, 0x2051, 0x2059, 0x2061, 0x2065, 0x2080,
    0x2082, 0x2088, 0x208a, 0x2095, 0x20a0, 0x20a2, 0x20a5, 0x20a8, 0x20aa, 0x2105, 0x2111, 0x2114,
    0x2119, 0x2125, 0x2142, 0x2144, 0x2149, 0x2155, 0x2158, 0x215a, 0x2161, 0x2164, 0x2165, 0x2166,
    0x2185, 0x2190, 0x2196, 0x2199, 0x21a5, 0x2201, 0x2208, 0x220a, 0x2211, 0x2215, 0x2220, 0x2222,
    0x2228, 0x222a, 0x2245, 0x2251, 0x2256, 0x2259, 0x2265, 0x2281, 0x2288, 0x228a, 0x2291, 0x2295,
    0x22a0, 0x22a2, 0x22a8, 0x22aa, 0x2405, 0x2414, 0x2416, 0x2419, 0x2425, 0x2444, 0x2445, 0x2446,
    0x2449, 0x2452, 0x2455, 0x2458, 0x245a, 0x2466, 0x2485, 0x2491, 0x2494, 0x2499, 0x24a1, 0x24a5,
    0x2509, 0x2515, 0x2521, 0x2529, 0x2540, 0x2545, 0x2548, 0x2551, 0x2554, 0x2555, 0x2559, 0x2562,
    0x2565, 0x2568, 0x2589, 0x2590, 0x2594, 0x2595, 0x2598, 0x259a, 0x25a1, 0x25a4, 0x25a6, 0x25a9,
    0x2605, 0x2610, 0x2612, 0x2619, 0x2625, 0x2641, 0x2649, 0x2655, 0x2660, 0x2661, 0x2669, 0x2684,
    0x2686, 0x2690, 0x269a, 0x2800, 0x2802, 0x2808, 0x280a, 0x2815, 0x2820, 0x2822, 0x2828, 0x282a,
    0x2845, 0x2851, 0x2854, 0x2865, 0x2880, 0x2882, 0x2888, 0x288a, 0x28a0, 0x28a2, 0x28a8, 0x28aa,
    0x2909, 0x2911, 0x2914, 0x2919, 0x2925, 0x2946, 0x2949, 0x2952, 0x2955, 0x2961, 0x2964, 0x2966,
    0x2969, 0x2985, 0x2990, 0x2996, 0x2999, 0x29a4, 0x29a5, 0x2a00, 0x2a02, 0x2a08, 0x2a0a, 0x2a20,
    0x2a22, 0x2a28, 0x2a2a, 0x2a45, 0x2a51, 0x2a56, 0x2a59, 0x2a65, 0x2a80, 0x2a82, 0x2a88, 0x2a8a,
    0x2a95, 0x2aa0, 0x2aa2, 0x2aa8, 0x2aaa, 0x4005, 0x4011, 0x4016, 0x4025, 0x4049, 0x4052, 0x4055,
    0x4058, 0x405a, 0x4061, 0x4064, 0x4066, 0x4094, 0x4099, 0x40a1, 0x40a6, 0x4100, 0x4101, 0x4104,
    0x4106, 0x4109, 0x4112, 0x4115, 0x4116, 0x4118, 0x411a, 0x4121, 0x4126, 0x4129, 0x4145, 0x4148,
    0x414a, 0x4151, 0x4154, 0x4155, 0x4156, 0x4159, 0x415a, 0x4165, 0x4168, 0x416a, 0x4181, 0x4184,
    0x4186, 0x4190, 0x4192, 0x4195, 0x41a0, 0x41a1, 0x41a2, 0x4205, 0x4211, 0x4214, 0x4216, 0x4225,
    0x4241, 0x4252, 0x4255, 0x425a, 0x4264, 0x4269, 0x4289, 0x4294, 0x42a5, 0x4401, 0x4415, 0x4419,
    0x4429, 0x4445, 0x4448, 0x444a, 0x4451, 0x4454, 0x4455, 0x4456, 0x4461, 0x4462, 0x4465, 0x4468,
    0x446a, 0x4481, 0x4486, 0x4489, 0x4490, 0x4492, 0x4495, 0x44a0, 0x44a1, 0x44a9, 0x4501, 0x4502,
    0x4505, 0x450a, 0x4511, 0x4514, 0x4515, 0x4516, 0x4519, 0x4520, 0x4525, 0x452a, 0x4541, 0x4544,
    0x4545, 0x4546, 0x4549, 0x4550, 0x4551, 0x4554, 0x4555, 0x4556, 0x4558, 0x4559, 0x4561, 0x4564,
    0x4565, 0x4566, 0x4569, 0x4582, 0x4584, 0x4585, 0x4588, 0x4591, 0x4594, 0x4595, 0x4596, 0x4599,
    0x459a, 0x45a5, 0x45a8, 0x45aa, 0x4601, 0x4605, 0x4609, 0x4614, 0x4615, 0x4618, 0x461a, 0x4621,
    0x4624, 0x4629, 0x4640, 0x4642, 0x4645, 0x4648, 0x4650, 0x4651, 0x4652, 0x4655, 0x4656, 0x4659,
    0x4662, 0x4665, 0x4668, 0x4681, 0x4685, 0x468a, 0x4694, 0x4695, 0x46a1, 0x46a4, 0x46a6, 0x4805,
    0x4811, 0x4815, 0x481a, 0x4825, 0x4842, 0x4849, 0x4850, 0x4855, 0x4858, 0x4861, 0x4864, 0x4866,
    0x4869, 0x4885, 0x4891, 0x4894, 0x4896, 0x4899, 0x48a5, 0x4901, 0x4905, 0x4906, 0x490a, 0x4910,
    0x4914, 0x4915, 0x4918, 0x4921, 0x4924, 0x4926, 0x4940, 0x4945, 0x494a, 0x4951, 0x4952, 0x4954,
    0x4955, 0x4956, 0x4959, 0x4960, 0x4962, 0x4965, 0x4966, 0x496a, 0x4986, 0x4989, 0x4992, 0x4995,
    0x4996, 0x4998, 0x49a1, 0x49a4, 0x49a6, 0x49a9, 0x4a16, 0x4a44, 0x4a46, 0x4a49, 0x4a55, 0x4a58,
    0x4a5a, 0x4a64, 0x4a69, 0x4a94, 0x4aa5, 0x5001, 0x5004, 0x5005, 0x5006, 0x5009, 0x5012, 0x5015,
    0x501a, 0x5021, 0x5024, 0x5029, 0x5040, 0x5045, 0x5048, 0x5051, 0x5054, 0x5055, 0x5056, 0x5059,
    0x5065, 0x5068, 0x5086, 0x5089, 0x5095, 0x5098, 0x50a0, 0x50a1, 0x50a6, 0x50a9, 0x5105, 0x5108,
    0x5109, 0x510a, 0x5111, 0x5114, 0x5115, 0x5116, 0x5118, 0x5119, 0x5120, 0x5125, 0x5126, 0x5128,
    0x512a, 0x5141, 0x5144, 0x5145, 0x5146, 0x5149, 0x5150, 0x5151, 0x5152, 0x5154, 0x5155, 0x5156,
    0x5158, 0x5159, 0x515a, 0x5161, 0x5164, 0x5165, 0x5166, 0x5169, 0x5182, 0x5185, 0x5191, 0x5194,
    0x5195, 0x5196, 0x5199, 0x51a0, 0x51a5, 0x51aa, 0x5201, 0x5206, 0x5212, 0x5215, 0x521a, 0x5221,
    0x5224, 0x5242, 0x5245, 0x524a, 0x5251, 0x5254, 0x5255, 0x5256, 0x5259, 0x5262, 0x5265, 0x5285,
    0x5290, 0x5292, 0x5295, 0x5299, 0x529a, 0x52a4, 0x5404, 0x5405, 0x5411, 0x5414, 0x5415, 0x5416,
    0x5418, 0x5419, 0x5421, 0x5425, 0x5428, 0x542a, 0x5441, 0x5444, 0x5445, 0x5446, 0x5449, 0x544a,
    0x5450, 0x5451, 0x5454, 0x5455, 0x5456, 0x5458, 0x5459, 0x545a, 0x5461, 0x5462, 0x5464, 0x5465,
    0x5466, 0x5469, 0x5480, 0x5488, 0x548a, 0x5491, 0x5494, 0x5495, 0x5496, 0x5499, 0x54a1, 0x54a4,
    0x54a5, 0x54aa, 0x5501, 0x5502, 0x5504, 0x5505, 0x5506, 0x5509, 0x5510, 0x5511, 0x5512, 0x5514,
    0x5515, 0x5516, 0x5519, 0x551a, 0x5521, 0x5524, 0x5525, 0x5526, 0x5529, 0x5540, 0x5541, 0x5542,
    0x5544, 0x5545, 0x5546, 0x5548, 0x5549, 0x5550, 0x5551, 0x5552, 0x5554, 0x5555, 0x5556, 0x5558,
    0x5559, 0x555a, 0x5560, 0x5561, 0x5564, 0x5565, 0x5566, 0x5568, 0x5569, 0x556a, 0x5581, 0x5584,
    0x5585, 0x5589, 0x558a, 0x5590, 0x5591, 0x5594, 0x5595, 0x5596, 0x5598, 0x5599, 0x55a1, 0x55a4,
    0x55a5, 0x55a6, 0x55a9, 0x5600, 0x5601, 0x5602, 0x5604, 0x5606, 0x5608, 0x5609, 0x5611, 0x5614,
    0x5615, 0x5618, 0x5619, 0x5620, 0x5621, 0x5622, 0x5624, 0x5625, 0x5626, 0x5628, 0x5629, 0x5641,
    0x5645, 0x5646, 0x5648, 0x5649, 0x564a, 0x5650, 0x5651, 0x5652, 0x5654, 0x5655, 0x5656, 0x5658,
    0x5659, 0x565a, 0x5661, 0x5664, 0x5665, 0x5669, 0x5682, 0x5685, 0x5686, 0x5688, 0x5689, 0x568a,
    0x5691, 0x5695, 0x569a, 0x56a2, 0x56a5, 0x56a6, 0x56a8, 0x56a9, 0x5804, 0x5805, 0x5806, 0x5809,
    0x5810, 0x5815, 0x5818, 0x5821, 0x582a, 0x5845, 0x5848, 0x584a, 0x5851, 0x5854, 0x5855, 0x5856,
    0x5858, 0x5859, 0x5860, 0x5862, 0x5864, 0x5865, 0x5882, 0x5889, 0x5890, 0x5892, 0x5895, 0x5898,
    0x58a1, 0x58a9, 0x5901, 0x5902, 0x5905, 0x590a, 0x5911, 0x5914, 0x5915, 0x5916, 0x5919, 0x5925,
    0x5941, 0x5944, 0x5945, 0x5946, 0x5949, 0x5950, 0x5951, 0x5952, 0x5954, 0x5955, 0x5956, 0x5958,
    0x5959, 0x595a, 0x5961, 0x5964, 0x5965, 0x5966, 0x5969, 0x5981, 0x5985, 0x5989, 0x5991, 0x5994,
    0x5995, 0x5996, 0x5998, 0x5999, 0x59a5, 0x5a04, 0x5a08, 0x5a15, 0x5a1a, 0x5a20, 0x5a25, 0x5a26,
    0x5a29, 0x5a45, 0x5a48, 0x5a49, 0x5a51, 0x5a55, 0x5a56, 0x5a58, 0x5a59, 0x5a62, 0x5a65, 0x5a68,
    0x5a6a, 0x5a81, 0x5a8a, 0x5a92, 0x5a95, 0x5a96, 0x5a98, 0x5a9a, 0x5aa1, 0x6005, 0x6014, 0x6016,
    0x6019, 0x6025, 0x6044, 0x6050, 0x6055, 0x6056, 0x6058, 0x605a, 0x6061, 0x6064, 0x6066, 0x6069,
    0x6081, 0x6096, 0x60a5, 0x6101, 0x6104, 0x6106, 0x6109, 0x6112, 0x6115, 0x6121, 0x6122, 0x6126,
    0x6129, 0x6145, 0x6149, 0x6151, 0x6155, 0x6156, 0x6159, 0x6165, 0x6166, 0x616a, 0x6184, 0x618a,
    0x6192, 0x6195, 0x61a1, 0x61a6, 0x61a9, 0x6211, 0x6216, 0x6219, 0x6240, 0x6241, 0x6246, 0x6255,
    0x6256, 0x6258, 0x6260, 0x6285, 0x6291, 0x6296, 0x62a5, 0x6411, 0x6412, 0x6415, 0x6416, 0x641a,
    0x6421, 0x6426, 0x6429, 0x6440, 0x6442, 0x6445, 0x6448, 0x644a, 0x6451, 0x6454, 0x6455, 0x6456,
    0x6459, 0x645a, 0x6460, 0x6462, 0x6465, 0x6484, 0x6485, 0x6489, 0x6490, 0x6492, 0x6494, 0x6495,
    0x6496, 0x6498, 0x649a, 0x64a1, 0x64a4, 0x64a9, 0x6505, 0x6508, 0x650a, 0x6511, 0x6515, 0x6516,
    0x6519, 0x6544, 0x6545, 0x6546, 0x6549, 0x6550, 0x6551, 0x6554, 0x6555, 0x6556, 0x6559, 0x6561,
    0x6564, 0x6565, 0x6566, 0x6569, 0x6586, 0x6589, 0x658a, 0x6591, 0x6595, 0x6596, 0x6599, 0x659a,
    0x65a2, 0x65a5, 0x65a6, 0x65a8, 0x6602, 0x6609, 0x6615, 0x6620, 0x6626, 0x6628, 0x6629, 0x6640,
    0x6645, 0x6648, 0x664a, 0x6651, 0x6654, 0x6655, 0x6656, 0x6658, 0x665a, 0x6660, 0x6665, 0x6668,
    0x6680, 0x6682, 0x6685, 0x668a, 0x6694, 0x6696, 0x6698, 0x6699, 0x66a0, 0x66a4, 0x66a6, 0x66aa,
    0x6816, 0x6819, 0x6825, 0x6841, 0x6852, 0x6855, 0x685a, 0x6861, 0x6869, 0x6885, 0x6891, 0x6898,
    0x68a6, 0x6901, 0x6904, 0x6910, 0x6915, 0x6921, 0x6924, 0x6926, 0x6929, 0x6940, 0x6941, 0x6945,
    0x6946, 0x6948, 0x6951, 0x6954, 0x6955, 0x6956, 0x6959, 0x6960, 0x6965, 0x696a, 0x6982, 0x6984,
    0x698a, 0x6995, 0x69a1, 0x69a4, 0x69a5, 0x69a9, 0x6a11, 0x6a16, 0x6a18, 0x6a41, 0x6a44, 0x6a49,
    0x6a50, 0x6a55, 0x6a58, 0x6a5a, 0x6a64, 0x6a65, 0x6a69, 0x6a86, 0x6a94, 0x6a98, 0x6a9a, 0x6aa6,
    0x8000, 0x8002, 0x8008, 0x800a, 0x8020, 0x8022, 0x8028, 0x802a, 0x8045, 0x8050, 0x8051, 0x8054,
    0x8056, 0x8059, 0x8065, 0x8080, 0x8082, 0x8088, 0x808a, 0x8095, 0x80a0, 0x80a2, 0x80a8, 0x80aa,
    0x8105, 0x8111, 0x8114, 0x8116, 0x8119, 0x8125, 0x8141, 0x8144, 0x8149, 0x8150, 0x8152, 0x8155,
    0x8156, 0x8158, 0x8159, 0x8164, 0x8166, 0x8169, 0x8185, 0x8189, 0x8194, 0x8196, 0x8199, 0x81a5,
    0x8200, 0x8202, 0x8208, 0x820a, 0x8215, 0x8220, 0x8222, 0x8228, 0x822a, 0x8251, 0x8254, 0x8259,
    0x8265, 0x8280, 0x8282, 0x8288, 0x828a, 0x8295, 0x82a0, 0x82a2, 0x82a8, 0x82aa, 0x8414, 0x8419,
    0x8441, 0x8444, 0x8451, 0x8455, 0x845a, 0x8461, 0x8464, 0x8469, 0x8494, 0x8499, 0x8501, 0x8509,
    0x8512, 0x8515, 0x851a, 0x8526, 0x8529, 0x8540, 0x8541, 0x8545, 0x8548, 0x8551, 0x8554, 0x8555,
    0x8556, 0x8559, 0x855a, 0x8565, 0x8566, 0x8568, 0x856a, 0x8581, 0x8584, 0x8586, 0x8589, 0x8590,
    0x8592, 0x8595, 0x8598, 0x85a6, 0x8611, 0x8616, 0x8619, 0x8625, 0x8641, 0x8644, 0x8649, 0x864a,
    0x8650, 0x8655, 0x8659, 0x865a, 0x8661, 0x8666, 0x866a, 0x8685, 0x8691, 0x869a, 0x86a4, 0x8800,
    0x8802, 0x8808, 0x880a, 0x8815, 0x8820, 0x8822, 0x8828, 0x882a, 0x8841, 0x8845, 0x8851, 0x8854,
    0x8859, 0x8865, 0x8869, 0x8880, 0x8882, 0x8888, 0x888a, 0x8895, 0x88a0, 0x88a2, 0x88a8, 0x88aa,
    0x8905, 0x8906, 0x8911, 0x8914, 0x8916, 0x8925, 0x8941, 0x8944, 0x8946, 0x8949, 0x8950, 0x8952,
    0x8955, 0x895a, 0x8961, 0x8964, 0x8985, 0x8996, 0x8999, 0x89a5, 0x8a00, 0x8a02, 0x8a08, 0x8a0a,
    0x8a15, 0x8a20, 0x8a22, 0x8a28, 0x8a2a, 0x8a45, 0x8a51, 0x8a54, 0x8a56, 0x8a80, 0x8a82, 0x8a88,
    0x8a8a, 0x8a95, 0x8aa0, 0x8aa2, 0x8aa8, 0x8aaa, 0x9005, 0x9011, 0x9016, 0x9018, 0x9019, 0x9025,
    0x9041, 0x9046, 0x9049, 0x9055, 0x9058, 0x905a, 0x9069, 0x906a, 0x9085, 0x9091, 0x9094, 0x9096,
    0x9099, 0x90a5, 0x9101, 0x9104, 0x9106, 0x9109, 0x9110, 0x9115, 0x9118, 0x911a, 0x9121, 0x9124,
    0x9126, 0x9129, 0x9140, 0x9145, 0x9150, 0x9151, 0x9154, 0x9155, 0x9156, 0x9159, 0x9162, 0x9165,
    0x9184, 0x9186, 0x9192, 0x9195, 0x9198, 0x91a1, 0x91a4, 0x91a6, 0x91a9, 0x9205, 0x9211, 0x9214,
    0x9219, 0x9225, 0x9244, 0x9246, 0x9249, 0x9250, 0x9252, 0x9255, 0x9258, 0x9266, 0x9269, 0x9285,
    0x9294, 0x9296, 0x92a9, 0x9401, 0x9404, 0x9406, 0x9410, 0x9415, 0x9418, 0x9426, 0x9440, 0x944a,
    0x9451, 0x9454, 0x9455, 0x9456, 0x9458, 0x9459, 0x9460, 0x9461, 0x9462, 0x9465, 0x9484, 0x9486,
    0x9492, 0x9494, 0x9495, 0x9498, 0x94a1, 0x94a9, 0x9500, 0x9505, 0x9508, 0x950a, 0x9510, 0x9511,
    0x9514, 0x9515, 0x9516, 0x9519, 0x9521, 0x9525, 0x9529, 0x952a, 0x9541, 0x9544, 0x9545, 0x9546,
    0x9549, 0x9550, 0x9551, 0x9552, 0x9554, 0x9555, 0x9556, 0x9558, 0x9559, 0x955a, 0x9561, 0x9564,
    0x9565, 0x9566, 0x9569, 0x9581, 0x9585, 0x9588, 0x9591, 0x9592, 0x9594, 0x9595, 0x9596, 0x9599,
    0x959a, 0x95a0, 0x95a2, 0x95a5, 0x95a8, 0x95aa, 0x9601, 0x9604, 0x9610, 0x9615, 0x9619, 0x9620,
    0x9626, 0x9629, 0x9645, 0x9648, 0x9649, 0x9651, 0x9652, 0x9655, 0x9656, 0x9659, 0x9665, 0x9668,
    0x9682, 0x9684, 0x9689, 0x968a, 0x9692, 0x9694, 0x9695, 0x96a4, 0x96a6, 0x96a9, 0x9805, 0x9816,
    0x9819, 0x9825, 0x9841, 0x9846, 0x9850, 0x9852, 0x9855, 0x9856, 0x985a, 0x9864, 0x9865, 0x9885,
    0x9891, 0x9896, 0x9899, 0x98a5, 0x9904, 0x9906, 0x9909, 0x9910, 0x9912, 0x9915, 0x9918, 0x991a,
    0x9920, 0x9921, 0x9924, 0x9926, 0x9940, 0x9942, 0x9945, 0x9948, 0x994a, 0x9951, 0x9954, 0x9955,
    0x9956, 0x9959, 0x9962, 0x9965, 0x9966, 0x996a, 0x9981, 0x9984, 0x9990, 0x9992, 0x9995, 0x999a,
    0x99a1, 0x99a6, 0x9a05, 0x9a15, 0x9a25, 0x9a44, 0x9a46, 0x9a49, 0x9a50, 0x9a55, 0x9a58, 0x9a61,
    0x9a85, 0x9a91, 0x9a94, 0x9a95, 0x9a96, 0xa000, 0xa002, 0xa008, 0xa00a, 0xa015, 0xa020, 0xa022,
    0xa028, 0xa02a, 0xa045, 0xa051, 0xa054, 0xa056, 0xa059, 0xa080, 0xa082, 0xa088, 0xa08a, 0xa095,
    0xa0a0, 0xa0a2, 0xa0a8, 0xa0aa, 0xa105, 0xa109, 0xa111, 0xa114, 0xa116, 0xa119, 0xa11a, 0xa146,
    0xa149, 0xa151, 0xa155, 0xa158, 0xa15a, 0xa161, 0xa164, 0xa185, 0xa190, 0xa192, 0xa196, 0xa199,
    0xa202, 0xa208, 0xa20a, 0xa210, 0xa219, 0xa222, 0xa228, 0xa22a, 0xa245, 0xa251, 0xa256, 0xa259,
    0xa265, 0xa280, 0xa282, 0xa288, 0xa28a, 0xa295, 0xa2a0, 0xa2a2, 0xa2a8, 0xa2aa, 0xa419, 0xa425,
    0xa441, 0xa444, 0xa450, 0xa454, 0xa455, 0xa458, 0xa45a, 0xa461, 0xa465, 0xa466, 0xa468, 0xa469,
    0xa485, 0xa506, 0xa509, 0xa510, 0xa512, 0xa515, 0xa518, 0xa526, 0xa529, 0xa542, 0xa545, 0xa551,
    0xa554, 0xa555, 0xa556, 0xa559, 0xa565, 0xa56a, 0xa581, 0xa584, 0xa585, 0xa586, 0xa589, 0xa592,
    0xa595, 0xa598, 0xa605, 0xa611, 0xa616, 0xa61a, 0xa621, 0xa625, 0xa644, 0xa646, 0xa64a, 0xa652,
    0xa655, 0xa656, 0xa658, 0xa660, 0xa662, 0xa686, 0xa690, 0xa695, 0xa696, 0xa699, 0xa6a1, 0xa6a4,
    0xa6a6, 0xa800, 0xa802, 0xa808, 0xa80a, 0xa820, 0xa822, 0xa828, 0xa82a, 0xa851, 0xa854, 0xa856,
    0xa859, 0xa880, 0xa882, 0xa888, 0xa88a, 0xa895, 0xa8a0, 0xa8a2, 0xa8a8, 0xa8aa, 0xa905, 0xa914,
    0xa919, 0xa921, 0xa925, 0xa941, 0xa950, 0xa955, 0xa95a, 0xa961, 0xa966, 0xa969, 0xa990, 0xa996,
    0xaa00, 0xaa02, 0xaa08, 0xaa0a, 0xaa20, 0xaa22, 0xaa28, 0xaa2a, 0xaa51, 0xaa54, 0xaa56, 0xaa80,
    0xaa82, 0xaa88, 0xaa8a, 0xaa95, 0xaaa0, 0xaaa2, 0xaaa8, 0xaaaa,
};
// Element t (0..7) of grid entry i, in {-1, 0, 1}.
constexpr int iq1s_value(int i, int t) { return int((kIq1sGrid[i] >> (2 * t)) & 3) - 1; }
constexpr float kIq1sDelta = 0.125f;

// IQ2_S (2.5625 bits per weight): per 256 k an f16 d, the low 8 bits of each 8-element group's
// 10-bit index into a grid of 1024 entries of IQ2_XXS's magnitudes (qs[32]), each group's sign byte
// as it is (signs[32]: bit t negates element t, no parity rule), per 32 k a byte qh of its four
// groups' top 2 index bits (bits 2l, 2l + 1) and a byte of two 4-bit scales ls (one per 16 k); the
// element is d * (0.5 + ls) * 0.25 * magnitude * sign. The grid, encoded as kIq2xsGrid's (its first
// 512 entries are not IQ2_XS's), is gguf-py's, checked as the others.
constexpr uint16_t kIq2sGrid[1024] = {
    0x0000, 0x0002, 0x0005, 0x0008, 0x000a, 0x0011, 0x0014, 0x0016, 0x0019, 0x0020, 0x0022, 0x0025,
    0x0028, 0x0041, 0x0044, 0x0046, 0x0049, 0x0050, 0x0052, 0x0055, 0x0058, 0x0061, 0x0064, 0x0066,
    0x0069, 0x0080, 0x0082, 0x0085, 0x0088, 0x0091, 0x0094, 0x00a0, 0x00a5, 0x00aa, 0x0101, 0x0104,
    0x0106, 0x0109, 0x0110, 0x0112, 0x0115, 0x0118, 0x0121, 0x0124, 0x0140, 0x0142, 0x0145, 0x0148,
    0x0151, 0x0154, 0x0156, 0x0159, 0x0160, 0x0165, 0x0168, 0x0181, 0x0184, 0x0190, 0x0192, 0x0195,
    0x01a1, 0x01a4, 0x0200, 0x0202, 0x0205, 0x0208, 0x0211, 0x0214, 0x0220, 0x022a, 0x0241, 0x0244,
    0x0246, 0x0249, 0x0250, 0x0255, 0x0280, 0x0285, 0x028a, 0x0294, 0x02a2, 0x0401, 0x0404, 0x0406,
    0x0409, 0x0410, 0x0412, 0x0415, 0x0418, 0x0421, 0x0424, 0x0426, 0x0429, 0x0440, 0x0442, 0x0445,
    0x0448, 0x044a, 0x0451, 0x0454, 0x0456, 0x0459, 0x0460, 0x0462, 0x0465, 0x0481, 0x0484, 0x0486,
    0x0489, 0x0490, 0x0495, 0x0498, 0x04a1, 0x04a4, 0x0500, 0x0502, 0x0505, 0x0508, 0x050a, 0x0511,
    0x0514, 0x0516, 0x0519, 0x0520, 0x0525, 0x0528, 0x0541, 0x0544, 0x0546, 0x0549, 0x0550, 0x0552,
    0x0555, 0x0558, 0x0561, 0x0564, 0x0580, 0x0582, 0x0585, 0x0588, 0x0591, 0x0594, 0x05a0, 0x0601,
    0x0604, 0x0606, 0x0609, 0x0610, 0x0615, 0x0640, 0x0645, 0x0648, 0x0651, 0x0654, 0x0660, 0x0681,
    0x0684, 0x0690, 0x0800, 0x0802, 0x0805, 0x0808, 0x0811, 0x0814, 0x0816, 0x0819, 0x0820, 0x0825,
    0x082a, 0x0841, 0x0844, 0x0846, 0x0849, 0x0850, 0x0852, 0x0855, 0x0858, 0x0861, 0x0864, 0x0880,
    0x0885, 0x0894, 0x08aa, 0x0901, 0x0904, 0x0910, 0x0912, 0x0915, 0x0918, 0x0921, 0x0940, 0x0945,
    0x0948, 0x0951, 0x0954, 0x0960, 0x0981, 0x0990, 0x0a00, 0x0a11, 0x0a14, 0x0a22, 0x0a28, 0x0a2a,
    0x0a50, 0x0a99, 0x1001, 0x1004, 0x1006, 0x1009, 0x1010, 0x1012, 0x1015, 0x1018, 0x1021, 0x1024,
    0x1026, 0x1040, 0x1042, 0x1045, 0x1048, 0x1051, 0x1054, 0x1056, 0x1059, 0x1060, 0x1062, 0x1065,
    0x1068, 0x1081, 0x1084, 0x1086, 0x1090, 0x1095, 0x1098, 0x10a1, 0x10a4, 0x1100, 0x1102, 0x1105,
    0x1108, 0x110a, 0x1111, 0x1114, 0x1116, 0x1119, 0x1120, 0x1122, 0x1125, 0x1128, 0x1141, 0x1144,
    0x1146, 0x1149, 0x1150, 0x1152, 0x1155, 0x1158, 0x1161, 0x1164, 0x1180, 0x1182, 0x1185, 0x1188,
    0x1191, 0x1194, 0x1201, 0x1204, 0x1209, 0x1210, 0x1215, 0x1221, 0x1224, 0x1240, 0x1245, 0x1251,
    0x1254, 0x1281, 0x1284, 0x1290, 0x1400, 0x1402, 0x1405, 0x1408, 0x1411, 0x1414, 0x1416, 0x1419,
    0x1420, 0x1425, 0x1428, 0x1441, 0x1444, 0x1446, 0x1449, 0x1450, 0x1452, 0x1455, 0x1458, 0x1461,
    0x1464, 0x1480, 0x1482, 0x1485, 0x1488, 0x1491, 0x1494, 0x14a0, 0x1501, 0x1504, 0x1506, 0x1509,
    0x1510, 0x1512, 0x1515, 0x1518, 0x1521, 0x1524, 0x1540, 0x1542, 0x1545, 0x1548, 0x1551, 0x1554,
    0x1560, 0x1581, 0x1584, 0x1590, 0x1600, 0x1605, 0x1608, 0x1611, 0x1614, 0x1620, 0x1641, 0x1644,
    0x1650, 0x1680, 0x16aa, 0x1801, 0x1804, 0x1806, 0x1809, 0x1810, 0x1815, 0x1818, 0x1821, 0x1840,
    0x1842, 0x1845, 0x1848, 0x1851, 0x1854, 0x1860, 0x1881, 0x1884, 0x1900, 0x1902, 0x1905, 0x1908,
    0x1911, 0x1914, 0x1920, 0x1941, 0x1944, 0x1950, 0x1969, 0x19a2, 0x1a04, 0x1a10, 0x1a40, 0x1a56,
    0x2000, 0x2002, 0x2005, 0x2008, 0x2011, 0x2014, 0x2016, 0x2019, 0x2020, 0x2025, 0x202a, 0x2041,
    0x2044, 0x2050, 0x2052, 0x2055, 0x2064, 0x2080, 0x208a, 0x2094, 0x20aa, 0x2101, 0x2104, 0x2110,
    0x2112, 0x2115, 0x2121, 0x2140, 0x2142, 0x2145, 0x2151, 0x2154, 0x2160, 0x2181, 0x2184, 0x2190,
    0x2200, 0x220a, 0x2222, 0x2228, 0x222a, 0x2244, 0x2250, 0x2288, 0x228a, 0x22a8, 0x2401, 0x2404,
    0x2406, 0x2409, 0x2410, 0x2415, 0x2418, 0x2421, 0x2424, 0x2440, 0x2442, 0x2445, 0x2448, 0x2451,
    0x2454, 0x2460, 0x2481, 0x2484, 0x2490, 0x2500, 0x2505, 0x2508, 0x2511, 0x2514, 0x2520, 0x2541,
    0x2544, 0x2550, 0x2566, 0x2580, 0x2601, 0x2604, 0x2610, 0x2640, 0x2659, 0x2800, 0x2805, 0x2811,
    0x2814, 0x2841, 0x2844, 0x2850, 0x288a, 0x28aa, 0x2901, 0x2904, 0x2910, 0x2995, 0x2a0a, 0x2a22,
    0x2a64, 0x2a88, 0x2a8a, 0x4001, 0x4004, 0x4006, 0x4009, 0x4010, 0x4012, 0x4015, 0x4018, 0x401a,
    0x4021, 0x4024, 0x4026, 0x4040, 0x4042, 0x4045, 0x4048, 0x404a, 0x4051, 0x4054, 0x4056, 0x4059,
    0x4060, 0x4062, 0x4065, 0x4081, 0x4084, 0x4090, 0x4095, 0x4098, 0x40a1, 0x40a4, 0x4100, 0x4102,
    0x4105, 0x4108, 0x4111, 0x4114, 0x4116, 0x4119, 0x4120, 0x4122, 0x4125, 0x4141, 0x4144, 0x4146,
    0x4149, 0x4150, 0x4152, 0x4155, 0x4158, 0x4161, 0x4164, 0x4180, 0x4182, 0x4185, 0x4188, 0x4191,
    0x4194, 0x41a0, 0x4201, 0x4204, 0x4210, 0x4212, 0x4215, 0x4218, 0x4224, 0x4240, 0x4245, 0x4248,
    0x4251, 0x4254, 0x4260, 0x4281, 0x4284, 0x4400, 0x4402, 0x4405, 0x4408, 0x440a, 0x4411, 0x4414,
    0x4416, 0x4419, 0x4420, 0x4422, 0x4425, 0x4428, 0x4441, 0x4444, 0x4446, 0x4449, 0x4450, 0x4452,
    0x4455, 0x4458, 0x4461, 0x4464, 0x4480, 0x4482, 0x4485, 0x4488, 0x4491, 0x4494, 0x44a0, 0x4501,
    0x4504, 0x4506, 0x4509, 0x4510, 0x4512, 0x4515, 0x4518, 0x4521, 0x4524, 0x4540, 0x4542, 0x4545,
    0x4548, 0x4551, 0x4554, 0x4560, 0x456a, 0x4581, 0x4584, 0x4590, 0x4600, 0x4602, 0x4605, 0x4608,
    0x4611, 0x4614, 0x4620, 0x4641, 0x4644, 0x4650, 0x4680, 0x46a5, 0x4801, 0x4804, 0x4809, 0x4810,
    0x4812, 0x4815, 0x4818, 0x4821, 0x4824, 0x4840, 0x4842, 0x4845, 0x4848, 0x4851, 0x4854, 0x4860,
    0x4884, 0x4890, 0x4900, 0x4902, 0x4905, 0x4908, 0x4911, 0x4914, 0x4920, 0x4941, 0x4944, 0x4950,
    0x4980, 0x4996, 0x4a01, 0x4a04, 0x4a10, 0x4a40, 0x5000, 0x5002, 0x5005, 0x5008, 0x5011, 0x5014,
    0x5016, 0x5019, 0x5020, 0x5022, 0x5025, 0x5028, 0x5041, 0x5044, 0x5046, 0x5049, 0x5050, 0x5052,
    0x5055, 0x5058, 0x5061, 0x5064, 0x5080, 0x5082, 0x5085, 0x5088, 0x5091, 0x5094, 0x5101, 0x5104,
    0x5106, 0x5109, 0x5110, 0x5112, 0x5115, 0x5118, 0x5121, 0x5124, 0x5140, 0x5142, 0x5145, 0x5148,
    0x5151, 0x5154, 0x5160, 0x5181, 0x5184, 0x5190, 0x5200, 0x5205, 0x5208, 0x5211, 0x5214, 0x5220,
    0x5241, 0x5244, 0x5250, 0x5269, 0x5280, 0x5401, 0x5404, 0x5406, 0x5409, 0x5410, 0x5412, 0x5415,
    0x5418, 0x5421, 0x5424, 0x5440, 0x5442, 0x5445, 0x5448, 0x5451, 0x5454, 0x5460, 0x5481, 0x5484,
    0x5490, 0x5500, 0x5502, 0x5505, 0x5508, 0x5511, 0x5514, 0x5520, 0x5541, 0x5544, 0x5550, 0x5580,
    0x5601, 0x5604, 0x5610, 0x5626, 0x5640, 0x5800, 0x5802, 0x5805, 0x5808, 0x5811, 0x5814, 0x5820,
    0x5841, 0x5844, 0x5850, 0x585a, 0x5880, 0x5901, 0x5904, 0x5910, 0x5940, 0x5a00, 0x5a19, 0x5a85,
    0x5aa8, 0x6001, 0x6004, 0x6006, 0x6010, 0x6012, 0x6015, 0x6018, 0x6021, 0x6024, 0x6040, 0x6045,
    0x6048, 0x6051, 0x6054, 0x6060, 0x6084, 0x6090, 0x6100, 0x6102, 0x6105, 0x6108, 0x6111, 0x6114,
    0x6120, 0x6141, 0x6144, 0x6150, 0x6180, 0x6199, 0x6204, 0x6210, 0x6240, 0x6256, 0x62a1, 0x6400,
    0x6405, 0x6408, 0x6411, 0x6414, 0x6420, 0x6441, 0x6444, 0x6450, 0x6480, 0x6501, 0x6504, 0x6510,
    0x6540, 0x654a, 0x6568, 0x6592, 0x6600, 0x6694, 0x6801, 0x6804, 0x6810, 0x6865, 0x6898, 0x6900,
    0x692a, 0x6a42, 0x6aa1, 0x8000, 0x8002, 0x8005, 0x8008, 0x8011, 0x8014, 0x8019, 0x8020, 0x8025,
    0x8041, 0x8044, 0x8050, 0x8052, 0x8055, 0x8058, 0x8061, 0x8080, 0x8085, 0x8091, 0x8094, 0x8101,
    0x8104, 0x8109, 0x8110, 0x8112, 0x8115, 0x8118, 0x8121, 0x8124, 0x8140, 0x8142, 0x8145, 0x8148,
    0x8151, 0x8154, 0x8181, 0x8184, 0x8190, 0x81a9, 0x8200, 0x8205, 0x820a, 0x8211, 0x8214, 0x8241,
    0x8244, 0x8250, 0x8401, 0x8404, 0x8406, 0x8409, 0x8410, 0x8412, 0x8415, 0x8418, 0x8421, 0x8440,
    0x8442, 0x8445, 0x8448, 0x8451, 0x8454, 0x8460, 0x8481, 0x8484, 0x8490, 0x8500, 0x8502, 0x8505,
    0x8508, 0x8511, 0x8514, 0x8520, 0x8541, 0x8544, 0x8550, 0x8580, 0x858a, 0x8601, 0x8604, 0x8610,
    0x8629, 0x8640, 0x8800, 0x8805, 0x8811, 0x8814, 0x8841, 0x8844, 0x8850, 0x88a2, 0x8901, 0x8904,
    0x8940, 0x8965, 0x8a22, 0x8a58, 0x8a5a, 0x8a82, 0x8aa2, 0x9001, 0x9004, 0x9009, 0x9010, 0x9012,
    0x9015, 0x9018, 0x9024, 0x9040, 0x9042, 0x9045, 0x9048, 0x9051, 0x9054, 0x9060, 0x9081, 0x9084,
    0x9090, 0x9100, 0x9105, 0x9111, 0x9114, 0x9141, 0x9144, 0x9150, 0x915a, 0x9201, 0x9204, 0x9210,
    0x9240, 0x92a6, 0x9400, 0x9402, 0x9405, 0x9408, 0x9411, 0x9414, 0x9420, 0x9441, 0x9444, 0x9450,
    0x9480, 0x9496, 0x9501, 0x9504, 0x9510, 0x9540, 0x9598, 0x95a1, 0x9600, 0x9646, 0x9664, 0x9801,
    0x9804, 0x9810, 0x9826, 0x9840, 0x98a9, 0x9900, 0x9949, 0x9952, 0x9a90, 0xa000, 0xa005, 0xa00a,
    0xa014, 0xa022, 0xa02a, 0xa041, 0xa044, 0xa050, 0xa0a2, 0xa0aa, 0xa140, 0xa165, 0xa202, 0xa20a,
    0xa222, 0xa228, 0xa22a, 0xa282, 0xa288, 0xa28a, 0xa2a8, 0xa401, 0xa404, 0xa410, 0xa440, 0xa489,
    0xa4a4, 0xa500, 0xa519, 0xa651, 0xa80a, 0xa828, 0xa8a2, 0xa954, 0xa986, 0xaa08, 0xaa0a, 0xaa20,
    0xaa22, 0xaa28, 0xaa88, 0xaaaa,
};
constexpr uint8_t iq2s_magnitude(int i, int t) { return kIq2Magnitude[(kIq2sGrid[i] >> (2 * t)) & 3]; }

// IQ3_S (3.4375 bits per weight): per 256 k an f16 d, the low 8 bits of each 4-element half group's
// 9-bit index into a grid of 512 entries of 4 magnitudes in {1, 3, ..., 15} (qs[64]), per 32 k a
// byte qh of its eight indices' ninth bits (bit i: index i), per 8 elements a sign byte as IQ2_S's
// (signs[32]), and per 32 k a 4-bit scale s (scales[4]: sub-block j's at bits 4j of the four bytes
// read little-endian); the element is d * (2 s + 1) * magnitude * sign. The grid, 4 bits per
// magnitude (element t at bits 4t: (magnitude - 1) / 2), is gguf-py's, checked as the others.
constexpr uint16_t kIq3sGrid[512] = {
    0x0000, 0x0001, 0x0002, 0x0005, 0x0007, 0x0010, 0x0011, 0x0012, 0x0014, 0x0016, 0x0020, 0x0021,
    0x0025, 0x0033, 0x0040, 0x0042, 0x0045, 0x0047, 0x0051, 0x0053, 0x0060, 0x0062, 0x0071, 0x0074,
    0x0077, 0x0100, 0x0101, 0x0102, 0x0104, 0x0110, 0x0111, 0x0115, 0x0120, 0x0123, 0x0127, 0x0131,
    0x0135, 0x0144, 0x0161, 0x0165, 0x0172, 0x0200, 0x0201, 0x0205, 0x0207, 0x0210, 0x0213, 0x0216,
    0x0221, 0x0225, 0x0230, 0x0234, 0x0242, 0x0245, 0x0247, 0x0251, 0x0253, 0x0270, 0x0273, 0x0303,
    0x0311, 0x0315, 0x0320, 0x0322, 0x0331, 0x0333, 0x0336, 0x0344, 0x0350, 0x0352, 0x0367, 0x0371,
    0x0375, 0x0400, 0x0413, 0x0417, 0x0421, 0x0424, 0x0432, 0x0440, 0x0443, 0x0451, 0x0470, 0x0502,
    0x0504, 0x0520, 0x0522, 0x0526, 0x0533, 0x0541, 0x0545, 0x0547, 0x0566, 0x0573, 0x0606, 0x0611,
    0x0613, 0x0631, 0x0652, 0x0671, 0x0700, 0x0702, 0x0704, 0x0720, 0x0722, 0x0726, 0x0733, 0x0750,
    0x0754, 0x1000, 0x1001, 0x1002, 0x1004, 0x1010, 0x1011, 0x1013, 0x1015, 0x1017, 0x1020, 0x1022,
    0x1031, 0x1034, 0x1036, 0x1054, 0x1056, 0x1061, 0x1072, 0x1100, 0x1101, 0x1103, 0x1106, 0x1110,
    0x1114, 0x1121, 0x1130, 0x1133, 0x1141, 0x1150, 0x1152, 0x1170, 0x1176, 0x1200, 0x1212, 0x1215,
    0x1217, 0x1220, 0x1224, 0x1232, 0x1240, 0x1243, 0x1255, 0x1260, 0x1272, 0x1301, 0x1304, 0x1307,
    0x1310, 0x1313, 0x1321, 0x1327, 0x1330, 0x1334, 0x1341, 0x1362, 0x1370, 0x1403, 0x1405, 0x1412,
    0x1414, 0x1431, 0x1433, 0x1442, 0x1446, 0x1450, 0x1454, 0x1501, 0x1510, 0x1513, 0x1521, 0x1530,
    0x1532, 0x1551, 0x1620, 0x1624, 0x1627, 0x1644, 0x1646, 0x1701, 0x1703, 0x1710, 0x1712, 0x1721,
    0x1735, 0x1741, 0x1762, 0x1770, 0x2000, 0x2001, 0x2003, 0x2005, 0x2007, 0x2010, 0x2012, 0x2014,
    0x2016, 0x2021, 0x2023, 0x2027, 0x2030, 0x2032, 0x2041, 0x2043, 0x2045, 0x2050, 0x2052, 0x2067,
    0x2070, 0x2073, 0x2075, 0x2100, 0x2102, 0x2110, 0x2113, 0x2117, 0x2122, 0x2125, 0x2131, 0x2134,
    0x2142, 0x2151, 0x2201, 0x2204, 0x2207, 0x2221, 0x2223, 0x2230, 0x2237, 0x2241, 0x2253, 0x2257,
    0x2271, 0x2274, 0x2300, 0x2302, 0x2305, 0x2311, 0x2322, 0x2324, 0x2331, 0x2333, 0x2342, 0x2350,
    0x2366, 0x2401, 0x2407, 0x2420, 0x2423, 0x2432, 0x2435, 0x2441, 0x2472, 0x2475, 0x2504, 0x2511,
    0x2522, 0x2537, 0x2540, 0x2553, 0x2570, 0x2600, 0x2602, 0x2607, 0x2621, 0x2655, 0x2661, 0x2705,
    0x2711, 0x2726, 0x2730, 0x2743, 0x2750, 0x3002, 0x3011, 0x3013, 0x3015, 0x3017, 0x3022, 0x3031,
    0x3033, 0x3035, 0x3042, 0x3044, 0x3047, 0x3051, 0x3063, 0x3071, 0x3101, 0x3103, 0x3105, 0x3114,
    0x3121, 0x3123, 0x3140, 0x3160, 0x3172, 0x3176, 0x3200, 0x3212, 0x3220, 0x3232, 0x3234, 0x3250,
    0x3301, 0x3310, 0x3314, 0x3321, 0x3323, 0x3327, 0x3330, 0x3341, 0x3343, 0x3347, 0x3355, 0x3373,
    0x3403, 0x3411, 0x3416, 0x3422, 0x3431, 0x3452, 0x3460, 0x3464, 0x3501, 0x3510, 0x3512, 0x3525,
    0x3532, 0x3544, 0x3556, 0x3573, 0x3616, 0x3641, 0x3701, 0x3703, 0x3720, 0x3722, 0x3735, 0x4000,
    0x4004, 0x4012, 0x4020, 0x4024, 0x4027, 0x4032, 0x4041, 0x4050, 0x4070, 0x4102, 0x4107, 0x4111,
    0x4113, 0x4122, 0x4130, 0x4135, 0x4143, 0x4151, 0x4155, 0x4201, 0x4203, 0x4210, 0x4215, 0x4221,
    0x4233, 0x4240, 0x4257, 0x4262, 0x4270, 0x4304, 0x4311, 0x4313, 0x4320, 0x4322, 0x4331, 0x4335,
    0x4400, 0x4402, 0x4424, 0x4437, 0x4440, 0x4471, 0x4505, 0x4507, 0x4521, 0x4562, 0x4613, 0x4634,
    0x4660, 0x4710, 0x4715, 0x4730, 0x4743, 0x4751, 0x5002, 0x5010, 0x5014, 0x5022, 0x5040, 0x5044,
    0x5047, 0x5052, 0x5066, 0x5074, 0x5101, 0x5103, 0x5105, 0x5112, 0x5121, 0x5132, 0x5172, 0x5200,
    0x5211, 0x5223, 0x5230, 0x5236, 0x5253, 0x5302, 0x5307, 0x5310, 0x5327, 0x5344, 0x5351, 0x5365,
    0x5373, 0x5401, 0x5404, 0x5420, 0x5432, 0x5446, 0x5512, 0x5526, 0x5551, 0x5553, 0x5642, 0x5702,
    0x5704, 0x5722, 0x6011, 0x6013, 0x6015, 0x6031, 0x6033, 0x6060, 0x6100, 0x6120, 0x6127, 0x6164,
    0x6212, 0x6234, 0x6242, 0x6255, 0x6262, 0x6270, 0x6300, 0x6314, 0x6321, 0x6340, 0x6425, 0x6443,
    0x6462, 0x6500, 0x6503, 0x6534, 0x6560, 0x6605, 0x6640, 0x6711, 0x6713, 0x7000, 0x7004, 0x7007,
    0x7020, 0x7022, 0x7036, 0x7040, 0x7054, 0x7062, 0x7102, 0x7111, 0x7124, 0x7143, 0x7145, 0x7201,
    0x7204, 0x7210, 0x7216, 0x7221, 0x7230, 0x7251, 0x7302, 0x7332, 0x7335, 0x7353, 0x7401, 0x7405,
    0x7413, 0x7420, 0x7450, 0x7522, 0x7542, 0x7602, 0x7631, 0x7700,
};
constexpr uint8_t iq3s_magnitude(int i, int t) { return uint8_t(2 * ((kIq3sGrid[i] >> (4 * t)) & 15) + 1); }

// IQ1_M (1.75 bits per weight): per 256 k the low index bytes as IQ1_S's (qs[32], first), per pair
// of groups a byte qh[16] (group g's nibble: its 3 high index bits and, in bit 3, a negative delta),
// and four u16 words: 3-bit scales s, one per 16 k (word m's bits 3i..3i+2: the scale of k 16 (4 m
// + i) ..), and in their top nibbles the f16 d (word m's nibble at d's bits 4m..4m+3). The element
// is d * (2 s + 1) * (value + delta), IQ1_S's grid and delta.
constexpr size_t kIq1mWords = 48;   // the four words' offset in the file's block
inline uint16_t iq1m_d_bits(const uint8_t* words) {   // words: the four, little-endian
    uint16_t d = 0;
    for (int m = 0; m < 4; ++m) d = uint16_t(d | ((words[2 * m + 1] >> 4) << (4 * m)));
    return d;
}
// Whether one of a file block's f16 scales is NaN or Inf (an all-ones exponent): those at
// scale_at, and IQ1_M's d, spread over its four scale words. The packers' check and the reference's.
inline bool non_finite_scale(const BlockType& t, const uint8_t* block) {
    bool bad = false;
    for (int at : t.scale_at)
        if (at >= 0) bad |= (block[at + 1] & 0x7c) == 0x7c;
    if (t.dtype == KT_DTYPE_GGML_IQ1_M) bad |= (iq1m_d_bits(block + kIq1mWords) & 0x7c00) == 0x7c00;
    return bad;
}

// ---- panel forms: one 16-channel panel's block --------------------------------------------
// kSubK: k per scale (sub-block); kBits: how the codes are stored (2-bit, 4-bit nibbles, bytes);
// kBig: 8-bit codes up to 255 (Q8_0's q + 128) or signed table values up to 128 in magnitude
// (IQ4_XS), which a u8 x s8 dot cannot take as they are (Q6_K's u <= 63 can).

struct Q4K {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q4_K;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 144, kD = 0, kDmin = 32, kSc = 64, kM = 192, kCodes = 320;
    static constexpr size_t kBlockBytes = kCodes + 32 * kChunkBytes;
};
// w = d * (ls_j - 32) * kIq4Values[q]: 4-bit indices in INT4's chunk order, looked up by one byte
// shuffle into the signed table values; ls_j - 32 as int8 per 32-k sub-block, d kept f16 (4.31
// bits per weight against the file's 4.25).
struct IQ4X {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ4_XS;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = true;
    static constexpr size_t kFileBlock = 136, kD = 0, kSc = 32, kCodes = 160;
    static constexpr size_t kBlockBytes = kCodes + 32 * kChunkBytes;
};
// The 32-element nibble types, each the file's bytes exactly: INT4's chunks of nibbles after the
// f16 d[16] (and m[16]), then for 5-bit codes a Q5_K-style line of fifth bits. Q4_0: w = d * (u - 8),
// u in 0..15 (INT4's symmetric group of 32: 4.5 bits per weight); Q4_1: w = d * u + m (5); Q5_0:
// w = d * (u - 16), u in 0..31 (5.5); Q5_1: w = d * u + m (6); IQ4_NL: w = d * kIq4Values[u],
// IQ4_XS's table with one f16 scale per 32 (4.5). Besides Q4_0, llama-quantize's fallbacks for
// matrices whose K is not a multiple of 256 (GLM-4.5-Air's and DeepSeek-V2-Lite's 1408-wide down,
// GPT-OSS's 2880) and its older quants.
template <kt_dtype T, size_t kFile, bool kMin, bool kFifth, bool kTable>
struct Nibbles32 {
    static constexpr kt_dtype kType = T;
    static constexpr int64_t kBlockK = 32, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = kTable;
    static constexpr size_t kFileBlock = kFile, kD = 0, kDmin = 32, kCodes = kMin ? 64 : 32;   // kDmin: f16 m[16] if kMin
    static constexpr size_t kSubBytes = 4 * kChunkBytes + (kFifth ? 64 : 0);
    static constexpr size_t kBlockBytes = kCodes + kSubBytes;
    static constexpr int kZero = kMin || kTable ? 0 : kFifth ? 16 : 8;   // Q4_0's, Q5_0's code offset
};
using Q40 = Nibbles32<KT_DTYPE_GGML_Q4_0, 18, false, false, false>;
using Q41 = Nibbles32<KT_DTYPE_GGML_Q4_1, 20, true, false, false>;
using Q50 = Nibbles32<KT_DTYPE_GGML_Q5_0, 22, false, true, false>;
using Q51 = Nibbles32<KT_DTYPE_GGML_Q5_1, 24, true, true, false>;
using IQ4NL = Nibbles32<KT_DTYPE_GGML_IQ4_NL, 18, false, false, true>;
// Q5_K: Q4_K's panel (d, dmin f16; 6-bit sc and m as bytes; the low 4 bits of each code in INT4's
// chunk order) plus each code's fifth bit: each 32-k sub-block's four chunks are followed by one
// 64-byte line whose byte i holds, in bit 2cc (2cc + 1), the fifth bit of the code in byte i's
// low (high) nibble of chunk cc; a shift and an AND put it back as 16 (5.625 bits per weight
// against the file's 5.5; one stream for decode).
struct Q5K {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q5_K;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 176, kD = 0, kDmin = 32, kSc = 64, kM = 192, kCodes = 320;
    static constexpr size_t kSubBytes = 4 * kChunkBytes + 64;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
};
// Q2_K: w = d * sc * u - dmin * m per 16 k, u in 0..3. Codes stay 2-bit: byte lane*4 + b of chunk
// c holds k = 16c + 4i + b in bits 2i, 2i + 1 (i < 4), so a shift and an AND give four k-quads
// per chunk; the file's scale bytes (sc | m << 4) and f16 d, dmin as they are: the file's exact
// 2.625 bits per weight.
struct Q2K {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q2_K;
    static constexpr int64_t kBlockK = 256, kSubK = 16;
    static constexpr int kBits = 2;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 84, kD = 0, kDmin = 32, kSc = 64, kCodes = 320;
    static constexpr size_t kBlockBytes = kCodes + 16 * kChunkBytes;
};
// Q3_K: w = d * sc * (u - 4) per 16 k, u = low 2 bits + 4 * hmask bit in 0..7. Q2K's 2-bit chunks
// for the low bits; each pair of chunks is followed by one line whose byte lane*4 + b holds, in
// bit 4 * (c % 2) + i, the third bit of chunk c's code for k = 16c + 4i + b; sc - 32 as int8, d
// f16 (3.56 bits per weight against the file's 3.44).
struct Q3K {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q3_K;
    static constexpr int64_t kBlockK = 256, kSubK = 16;
    static constexpr int kBits = 2;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 110, kD = 0, kSc = 32, kCodes = 288;
    static constexpr size_t kPairBytes = 3 * kChunkBytes;
    static constexpr size_t kBlockBytes = kCodes + 8 * kPairBytes;
};
struct Q80 {   // w = d * q: codes q + 128 in bytes, the block's f16 d kept f16
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q8_0;
    static constexpr int64_t kBlockK = 32, kSubK = 32;
    static constexpr int kBits = 8;
    static constexpr bool kBig = true;
    static constexpr size_t kFileBlock = 34, kD = 0, kCodes = 32;
    static constexpr size_t kBlockBytes = kCodes + 8 * kChunkBytes;
};
// Q6_K: w = d * sc_j * (u - 32), u in 0..63, int8 sc per 16 k, d f32. Each 16-k sub-block is
// two INT4-order chunks of the codes' low 4 bits and one 64-byte line whose byte lane*4 + b
// holds the high bit pairs of the four codes that share that byte position in the two chunks
// (chunk c's low / high nibble in bits 4 (c % 2), 4 (c % 2) + 2); a shift and an AND put each
// pair back as 16 and 32 — Q5_K's fifth bit, twice (6.63 bits per weight against the file's 6.56).
struct Q6K {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q6_K;
    static constexpr int64_t kBlockK = 256, kSubK = 16;
    static constexpr int kBits = 4;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 210, kD = 0, kSc = 64, kCodes = 320;
    static constexpr size_t kSubBytes = 2 * kChunkBytes + 64;
    static constexpr size_t kBlockBytes = kCodes + 16 * kSubBytes;
};

// IQ2_XXS: the file's bytes regrouped per 16 channels, nothing widened (66 bytes per channel and
// 256 k, the file's 2.0625 bits per weight): f16 d[16], then per 32-k sub-block j the 16
// channels' grid index bytes of its four 8-k groups (group l's 16 at 16 l) and their sign and
// scale words (u32[16], at kWords). The kernels look the indices up in the grid and multiply
// u = 43 + sign * magnitude in [0, 86], subtracting 43 times the activations' sum.
struct IQ2XXS {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ2_XXS;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;   // not a chunk form: the kernels take it apart themselves
    static constexpr bool kBig = false;
    static constexpr int kIndices = 1;   // grid indices per 8-k group, each naming 8 / kIndices magnitudes
    static constexpr size_t kFileBlock = 66, kD = 0, kCodes = 32, kWords = 64 * kIndices, kSubBytes = kWords + 64;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 43;   // the largest magnitude: u = kOffset + sign * magnitude >= 0
    static constexpr float kScaleStep = 0.25f;   // d * (0.5 + ls) * kScaleStep
    // Sub-block j's sign-and-scale word in the file's block (after its four index bytes).
    static constexpr size_t file_word(int j) { return 2 + 8 * size_t(j) + 4; }
    static constexpr uint8_t magnitude(int index, int t) { return iq2xxs_magnitude(index, t); }
};
// IQ3_XXS: IQ2XXS's panel with two grid indices per 8-k group (group l's 16 channels' first-half
// indices at 32 l, second-half ones at 32 l + 16) — 98 bytes per channel and 256 k, the file's
// 3.0625 bits per weight; u = 62 + sign * magnitude in [0, 124].
struct IQ3XXS {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ3_XXS;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;
    static constexpr bool kBig = false;
    static constexpr int kIndices = 2;
    static constexpr size_t kFileBlock = 98, kD = 0, kCodes = 32, kWords = 64 * kIndices, kSubBytes = kWords + 64;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 62;
    static constexpr float kScaleStep = 0.5f;
    static constexpr size_t file_word(int j) { return 66 + 4 * size_t(j); }   // the 8 words after the 64 indices
    static constexpr uint8_t magnitude(int index, int t) { return iq3xxs_magnitude(index, t); }
};
// IQ1_S and IQ1_M: a block header of kHeader bytes for the 16 channels, then per 32-k sub-block the
// 16 channels' low index bytes of its four groups (group l's at 16 l) and their u16 qh words (at
// kWords). The kernels take each element as u = 8 (value + 1) + 2 [delta > 0] in {0, 2, 8, 10, 16,
// 18}, so that w = d (2 s + 1) / 8 * (u - 9): the delta folded into integer codes, a constant offset.
template <kt_dtype T, size_t kFile, size_t kHeader>
struct Iq1Form {
    static constexpr kt_dtype kType = T;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;   // not a chunk form (as IQ2XXS)
    static constexpr bool kBig = false;
    static constexpr int kIndices = 1;
    static constexpr size_t kFileBlock = kFile, kD = 0, kCodes = kHeader, kWords = 64, kSubBytes = kWords + 32;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 9;
};
// IQ1_S: header f16 d[16]: 50 bytes per channel and 256 k, the file's 1.5625 bits per weight.
struct IQ1S : Iq1Form<KT_DTYPE_GGML_IQ1_S, 50, 32> {
    // Sub-block j's qh word in the file's block, and group l's 11-bit index given it.
    static constexpr size_t file_qh(int j) { return 34 + 2 * size_t(j); }
    static constexpr int index(uint8_t low, uint16_t qh, int l) { return low | (((qh >> (3 * l)) & 7) << 8); }
    static constexpr bool negative_delta(uint16_t qh, int) { return qh & 0x8000; }
};
// IQ1_M: header the file's four scale words per channel (word m of the 16 channels at 32 m: d's
// nibbles and the 3-bit scales, as the file has them), each channel's sub-block qh its two bytes:
// 56 bytes per channel and 256 k, the file's 1.75 bits per weight. The delta per 8-k group, two
// scales per sub-block.
struct IQ1M : Iq1Form<KT_DTYPE_GGML_IQ1_M, 56, 128> {
    static constexpr size_t file_qh(int j) { return 32 + 2 * size_t(j); }   // groups 4j .. 4j+3's two bytes
    static constexpr int index(uint8_t low, uint16_t qh, int l) { return low | (((qh >> (4 * l)) & 7) << 8); }
    static constexpr bool negative_delta(uint16_t qh, int l) { return (qh >> (4 * l + 3)) & 1; }
    // The 3-bit scale of k 16 h .. 16 h + 15 of sub-block j, from its word of the block's header.
    static constexpr int scale(uint16_t word, int j, int h) { return (word >> (6 * (j % 2) + 3 * h)) & 7; }
};

// IQ2_XS: IQ2XXS's sub-blocks re-cut to the file's 9 bytes per channel and 32 k (2.3125 bits per
// weight exactly): the low index bytes of the four groups (group l's at 16 l); one u32 word per
// channel (at kWords) holding the four 7-bit sign indices where IQ2_XXS's word has them (bits
// 7 l..) and each index's ninth bit in bit 28 + l; each channel's scale byte (at kScales). Codes as
// IQ2_XXS's (offset 43), two scales per sub-block as IQ1_M's.
struct IQ2XS {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ2_XS;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;
    static constexpr bool kBig = false;
    static constexpr int kIndices = 1;
    static constexpr size_t kFileBlock = 74, kD = 0, kCodes = 32, kWords = 64, kScales = 128, kSubBytes = 144;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 43;
    static constexpr float kScaleStep = 0.25f;
    static constexpr size_t file_group(int j, int l) { return 2 + 2 * size_t(4 * j + l); }   // group 4j + l's u16
    static constexpr size_t file_scale(int j) { return 66 + size_t(j); }
    static constexpr int index(uint8_t low, uint32_t word, int l) { return low | (((word >> (28 + l)) & 1) << 8); }
    static constexpr uint8_t magnitude(int index, int t) { return iq2xs_magnitude(index, t); }
};

// IQ2_S and IQ3_S: their sign bytes as the file has them, four to a u32 per channel (at kWords),
// the indices' high bits a byte per channel (at kHigh) — the file's bytes exactly, re-cut.
// IQ2_S: per 32 k the low index bytes of the four groups (group l's at 16 l), the sign words, the
// qh bytes and the scale bytes (at kScales): 82 bytes per channel and 256 k, the file's 2.5625
// bits per weight. Codes as IQ2_XXS's (offset 43), two scales per sub-block as IQ2_XS's.
struct IQ2S {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ2_S;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;
    static constexpr bool kBig = false;
    static constexpr int kIndices = 1;
    static constexpr size_t kFileBlock = 82, kD = 0, kCodes = 32, kWords = 64, kHigh = 128, kScales = 144, kSubBytes = 160;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 43;
    static constexpr float kScaleStep = 0.25f;
    static constexpr size_t file_signs(int j) { return 34 + 4 * size_t(j); }
    static constexpr size_t file_qh(int j) { return 66 + size_t(j); }
    static constexpr size_t file_scale(int j) { return 74 + size_t(j); }
    static constexpr int index(uint8_t low, uint8_t high, int l, int) { return low | (((high >> (2 * l)) & 3) << 8); }
    static constexpr uint8_t magnitude(int index, int t) { return iq2s_magnitude(index, t); }
};
// IQ3_S: a block header of the 16 channels' f16 d and their four scale bytes (a u32 per channel at
// kScales), then per 32 k IQ3_XXS's two low index bytes per group (group l's halves at 32 l, 32 l +
// 16), the sign words and the qh bytes: 110 bytes per channel and 256 k, the file's 3.4375 bits per
// weight. u = 15 + sign * magnitude in [0, 30], the scale d * (2 s + 1).
struct IQ3S {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_IQ3_S;
    static constexpr int64_t kBlockK = 256, kSubK = 32;
    static constexpr int kBits = 8;
    static constexpr bool kBig = false;
    static constexpr int kIndices = 2;
    static constexpr size_t kFileBlock = 110, kD = 0, kScales = 32, kCodes = 96, kWords = 64 * kIndices, kHigh = kWords + 64,
                            kSubBytes = kHigh + 16;
    static constexpr size_t kBlockBytes = kCodes + 8 * kSubBytes;
    static constexpr int kOffset = 15;
    static constexpr size_t file_qh(int j) { return 66 + size_t(j); }
    static constexpr size_t file_signs(int j) { return 74 + 4 * size_t(j); }
    static constexpr size_t kFileScales = 106;
    static constexpr int index(uint8_t low, uint8_t high, int l, int h) { return low | (((high >> (2 * l + h)) & 1) << 8); }
    static constexpr int scale(uint32_t scales, int j) { return int(scales >> (4 * j)) & 15; }
    static constexpr uint8_t magnitude(int index, int t) { return iq3s_magnitude(index, t); }
};
// The forms with the file's sign bytes (no 7-bit sign indices).
template <class P>
constexpr bool kSignBytes = std::is_same_v<P, IQ2S> || std::is_same_v<P, IQ3S>;

// The forms whose codes are grid indices (a kernel of their own on x86).
template <class P>
constexpr bool kGridForm = std::is_same_v<P, IQ2XXS> || std::is_same_v<P, IQ3XXS> || std::is_same_v<P, IQ1S> ||
                           std::is_same_v<P, IQ1M> || std::is_same_v<P, IQ2XS> || kSignBytes<P>;

// The grid forms' indices: half h (< kIndices) of group l's in sub-block j of the file's block
// (IQ2_XXS and IQ3_XXS put a sub-block's 8 index bytes at 2 + 8 j, IQ1_S its 4 low bytes at 2 + 4 j),
// and in a panel's sub-block (16 channels side by side).
template <class P>
constexpr size_t grid_file_index(int j, int l, int h) {
    if constexpr (std::is_same_v<P, IQ1S> || std::is_same_v<P, IQ2S>) return 2 + 4 * size_t(j) + size_t(l);
    if constexpr (std::is_same_v<P, IQ1M>) return 4 * size_t(j) + size_t(l);
    return 2 + 8 * size_t(j) + size_t(P::kIndices * l + h);
}
template <class P>
constexpr size_t grid_panel_index(int l, int h) { return 16 * size_t(P::kIndices * l + h); }

// ---- the grid forms as their kernels read them --------------------------------------------
// Each grid's rows with one value per byte (magnitudes; IQ1's codes 8 (value + 1)), the per-channel
// scalar reading of a panel sub-block's groups, and the integer form of their scales: every grid
// form's sub-block scale is an odd integer 2 s + 1 times a per-block factor of d, so kernels add a
// block's dots in integers and convert once (kt-backend-avx's lone-row decode, kt-backend-kml).
template <class Entry, int N>
struct GridRows {
    alignas(64) Entry entry[N];
};
template <class Entry, int N, int T, class Value>
constexpr GridRows<Entry, N> grid_rows_of(Value value) {
    GridRows<Entry, N> g{};
    for (int i = 0; i < N; ++i)
        for (int t = 0; t < T; ++t) g.entry[i] |= Entry(value(i, t)) << (8 * t);
    return g;
}
constexpr uint8_t iq1_code(int i, int t) { return uint8_t(8 * (iq1s_value(i, t) + 1)); }
constexpr auto kGrid8 = grid_rows_of<uint64_t, 256, 8>(iq2xxs_magnitude);   // IQ2_XXS
constexpr auto kGridXs = grid_rows_of<uint64_t, 512, 8>(iq2xs_magnitude);   // IQ2_XS
constexpr auto kGrid2s = grid_rows_of<uint64_t, 1024, 8>(iq2s_magnitude);   // IQ2_S
constexpr auto kGrid4 = grid_rows_of<uint32_t, 256, 4>(iq3xxs_magnitude);   // IQ3_XXS: 4 per entry
constexpr auto kGrid3s = grid_rows_of<uint32_t, 512, 4>(iq3s_magnitude);    // IQ3_S: 4 per entry
constexpr auto kGrid1 = grid_rows_of<uint64_t, 2048, 8>(iq1_code);          // IQ1_S, IQ1_M
// The forms without signs (IQ1_S, IQ1_M): their rows are codes u = 8 (value + 1) + 2 [delta > 0]
// with the offset kOffset = 9.
template <class P>
constexpr bool kUnsignedGrid = std::is_same_v<P, IQ1S> || std::is_same_v<P, IQ1M>;
// The forms with a scale per 16 k (two per 32-k sub-block).
template <class P>
constexpr bool kHalfScales = std::is_same_v<P, IQ1M> || std::is_same_v<P, IQ2XS> || std::is_same_v<P, IQ2S>;
// The per-block factor of d: w = d * kBlockFactor * (2 s + 1) * (sign * magnitude, or IQ1's u - 9).
template <class P>
constexpr float kBlockFactor = std::is_same_v<P, IQ3S> ? 1.0f : std::is_same_v<P, IQ3XXS> ? 0.25f : 0.125f;

inline uint32_t u32_at(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint16_t u16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
// Group l's 8 values (one per byte, element t in byte t) of channel `lane` in a panel sub-block:
// magnitudes for the signed forms, codes u for IQ1.
template <class P>
inline uint64_t group_row(const uint8_t* sub, int l, int lane) {
    const uint8_t low = sub[grid_panel_index<P>(l, 0) + size_t(lane)];
    if constexpr (std::is_same_v<P, IQ2XXS>) return kGrid8.entry[low];
    if constexpr (std::is_same_v<P, IQ3XXS>)
        return kGrid4.entry[low] | uint64_t(kGrid4.entry[sub[grid_panel_index<P>(l, 1) + size_t(lane)]]) << 32;
    if constexpr (std::is_same_v<P, IQ2XS>) return kGridXs.entry[P::index(low, u32_at(sub + P::kWords + 4 * size_t(lane)), l)];
    if constexpr (std::is_same_v<P, IQ2S>) return kGrid2s.entry[P::index(low, sub[P::kHigh + size_t(lane)], l, 0)];
    if constexpr (std::is_same_v<P, IQ3S>) {
        const uint8_t high = sub[P::kHigh + size_t(lane)];
        return kGrid3s.entry[P::index(low, high, l, 0)] |
               uint64_t(kGrid3s.entry[P::index(sub[grid_panel_index<P>(l, 1) + size_t(lane)], high, l, 1)]) << 32;
    }
    if constexpr (kUnsignedGrid<P>) {
        const uint16_t qh = u16_at(sub + P::kWords + 2 * size_t(lane));
        return kGrid1.entry[P::index(low, qh, l)] + (P::negative_delta(qh, l) ? 0 : 0x0202020202020202ull);
    }
}
// The odd scale 2 s + 1 of channel `lane` for sub-block j (its half h: k 16 h .. of the sub-block).
template <class P>
inline int odd_scale(const uint8_t* blk, int j, int h, int lane) {
    const uint8_t* sub = blk + P::kCodes + size_t(j) * P::kSubBytes;
    int s;
    if constexpr (std::is_same_v<P, IQ2XXS> || std::is_same_v<P, IQ3XXS>) s = int(u32_at(sub + P::kWords + 4 * size_t(lane)) >> 28);
    if constexpr (std::is_same_v<P, IQ2XS> || std::is_same_v<P, IQ2S>) s = (sub[P::kScales + size_t(lane)] >> (4 * h)) & 15;
    if constexpr (std::is_same_v<P, IQ3S>) s = P::scale(u32_at(blk + P::kScales + 4 * size_t(lane)), j);
    if constexpr (std::is_same_v<P, IQ1S>) s = (u16_at(sub + P::kWords + 2 * size_t(lane)) >> 12) & 7;
    if constexpr (std::is_same_v<P, IQ1M>) s = P::scale(u16_at(blk + P::kD + 32 * size_t(j / 2) + 2 * size_t(lane)), j, h);
    return 2 * s + 1;
}
// Channel `lane`'s f16 d of a grid block (IQ1_M: from the top nibbles of its four scale words).
template <class P>
inline float grid_d(const uint8_t* blk, int lane) {
    if constexpr (std::is_same_v<P, IQ1M>) {
        uint8_t words[8];
        for (int m = 0; m < 4; ++m) std::memcpy(words + 2 * m, blk + P::kD + 32 * size_t(m) + 2 * size_t(lane), 2);
        return f16_bits_to_float(iq1m_d_bits(words));
    } else {
        return f16_at(blk + P::kD + 2 * size_t(lane));
    }
}

// f(P{}) with the panel form of a ggml type (Q8_0's for a type this layout does not hold:
// callers check block_type first).
template <class F>
auto with_panels(kt_dtype type, F&& f) {
    switch (type) {
        case KT_DTYPE_GGML_Q4_K: return f(Q4K{});
        case KT_DTYPE_GGML_Q6_K: return f(Q6K{});
        case KT_DTYPE_GGML_Q4_0: return f(Q40{});
        case KT_DTYPE_GGML_IQ4_XS: return f(IQ4X{});
        case KT_DTYPE_GGML_Q5_K: return f(Q5K{});
        case KT_DTYPE_GGML_Q2_K: return f(Q2K{});
        case KT_DTYPE_GGML_Q3_K: return f(Q3K{});
        case KT_DTYPE_GGML_IQ2_XXS: return f(IQ2XXS{});
        case KT_DTYPE_GGML_IQ3_XXS: return f(IQ3XXS{});
        case KT_DTYPE_GGML_Q4_1: return f(Q41{});
        case KT_DTYPE_GGML_Q5_0: return f(Q50{});
        case KT_DTYPE_GGML_Q5_1: return f(Q51{});
        case KT_DTYPE_GGML_IQ4_NL: return f(IQ4NL{});
        case KT_DTYPE_GGML_IQ1_S: return f(IQ1S{});
        case KT_DTYPE_GGML_IQ1_M: return f(IQ1M{});
        case KT_DTYPE_GGML_IQ2_XS: return f(IQ2XS{});
        case KT_DTYPE_GGML_IQ2_S: return f(IQ2S{});
        case KT_DTYPE_GGML_IQ3_S: return f(IQ3S{});
        default: return f(Q80{});
    }
}

// The code offset of a 32-element nibble type (Q4_0: 8, Q5_0: 16: w = d * (u - zero)); 0 elsewhere
// (C++17: this header is public).
template <class P, class = void>
struct NibbleZero {
    static constexpr int value = 0;
};
template <class P>
struct NibbleZero<P, std::void_t<decltype(P::kZero)>> {
    static constexpr int value = P::kZero;
};
template <class P>
constexpr int nibble_zero() { return NibbleZero<P>::value; }
// The forms with a line of fifth bits after each 32-k sub-block's four chunks (Q5_K's, Q5_0's, Q5_1's).
template <class P>
constexpr bool kFifthBits = std::is_same_v<P, Q5K> || std::is_same_v<P, Q50> || std::is_same_v<P, Q51>;
// The forms whose f16 kDmin field is a min added to every weight (Q4_1, Q5_1: w = d * u + m).
template <class P>
constexpr bool kAddedMin = std::is_same_v<P, Q41> || std::is_same_v<P, Q51>;
template <class P>
constexpr size_t fifth_bits_at(int64_t c) { return P::kCodes + size_t(c / 4) * P::kSubBytes + 4 * kChunkBytes; }
constexpr size_t third_bits_at(int64_t c) { return Q3K::kCodes + size_t(c / 2) * Q3K::kPairBytes + 2 * kChunkBytes; }
constexpr size_t high_pairs_at(int64_t c) { return Q6K::kCodes + size_t(c / 2) * Q6K::kSubBytes + 2 * kChunkBytes; }
// Where chunk c of a block's codes starts.
template <class P>
constexpr size_t chunk_at(int64_t c) {
    if constexpr (kFifthBits<P>) return P::kCodes + size_t(c / 4) * P::kSubBytes + size_t(c % 4) * kChunkBytes;
    if constexpr (std::is_same_v<P, Q3K>) return P::kCodes + size_t(c / 2) * P::kPairBytes + size_t(c % 2) * kChunkBytes;
    if constexpr (std::is_same_v<P, Q6K>) return P::kCodes + size_t(c / 2) * P::kSubBytes + size_t(c % 2) * kChunkBytes;
    return P::kCodes + size_t(c) * kChunkBytes;
}
template <class P>
size_t panel_bytes(int64_t k) { return size_t(k / P::kBlockK) * P::kBlockBytes; }

// Rows [n0, n0 + 16) of a matrix of the file's rows (`stride` bytes apart) into one panel.
template <class P>
void pack_panel(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t n0, int64_t k, uint8_t* dst) {
    std::memset(dst, 0, panel_bytes<P>(k));   // the bit lines below are OR-ed in; missing channels stay 0
    uint8_t u[256];
    for (int64_t b = 0; b < k / P::kBlockK; ++b) {
        uint8_t* out = dst + size_t(b) * P::kBlockBytes;
        for (int lane = 0; lane < kPanel && n0 + lane < n_rows; ++lane) {
            const uint8_t* blk = rows + size_t(n0 + lane) * stride + size_t(b) * P::kFileBlock;
            // The byte of chunk c holding k-offset bb (of the chunk's 4-k quad) for this lane.
            auto code = [&](int64_t c, int bb) -> uint8_t& { return out[chunk_at<P>(c) + size_t(lane) * 4 + size_t(bb)]; };
            if constexpr (std::is_same_v<P, Q80>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                for (int e = 0; e < 32; ++e) code(e / 4, e % 4) = uint8_t(int8_t(blk[2 + e]) + 128);
            } else if constexpr (std::is_same_v<P, Q2K>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk + 80, 2);   // d, dmin stay f16
                std::memcpy(out + P::kDmin + 2 * size_t(lane), blk + 82, 2);
                for (int j = 0; j < 16; ++j) out[P::kSc + 16 * j + lane] = blk[j];
                q2k_codes(blk, u);
                for (int c = 0; c < 16; ++c)
                    for (int bb = 0; bb < 4; ++bb)
                        for (int i = 0; i < 4; ++i) code(c, bb) = uint8_t(code(c, bb) | (u[16 * c + 4 * i + bb] << (2 * i)));
            } else if constexpr (std::is_same_v<P, Q3K>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk + 108, 2);   // d stays f16
                for (int j = 0; j < 16; ++j) out[P::kSc + 16 * j + lane] = uint8_t(int8_t(q3k_scale(blk, j)));
                q3k_codes(blk, u);
                for (int c = 0; c < 16; ++c)
                    for (int bb = 0; bb < 4; ++bb)
                        for (int i = 0; i < 4; ++i) {
                            const uint8_t v = u[16 * c + 4 * i + bb];
                            code(c, bb) = uint8_t(code(c, bb) | ((v & 3) << (2 * i)));
                            out[third_bits_at(c) + size_t(lane) * 4 + size_t(bb)] |= uint8_t((v >> 2) << (4 * (c % 2) + i));
                        }
            } else if constexpr (P::kBlockK == 32 && P::kBits == 4) {   // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d (and m) stay f16
                if constexpr (kAddedMin<P>) std::memcpy(out + P::kDmin + 2 * size_t(lane), blk + 2, 2);
                constexpr size_t kQh = kAddedMin<P> ? 4 : 2;   // after d (and m)
                if constexpr (kFifthBits<P>)
                    nibble_codes(blk + kQh + 4, blk + kQh, u);
                else
                    nibble_codes(blk + kQh, nullptr, u);
                for (int c = 0; c < 4; ++c)
                    for (int bb = 0; bb < 4; ++bb) {
                        const uint8_t lo = u[8 * c + bb], hi = u[8 * c + 4 + bb];
                        code(c, bb) = uint8_t((lo & 15) | ((hi & 15) << 4));
                        if constexpr (kFifthBits<P>)
                            out[fifth_bits_at<P>(c) + size_t(lane) * 4 + size_t(bb)] |=
                                uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
                    }
            } else if constexpr (std::is_same_v<P, IQ1S> || std::is_same_v<P, IQ1M>) {
                if constexpr (std::is_same_v<P, IQ1S>)
                    std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                else
                    for (int m = 0; m < 4; ++m) std::memcpy(out + P::kD + 32 * size_t(m) + 2 * size_t(lane), blk + kIq1mWords + 2 * m, 2);
                for (int j = 0; j < 8; ++j) {
                    uint8_t* sub = out + P::kCodes + size_t(j) * P::kSubBytes;
                    for (int l = 0; l < 4; ++l) sub[grid_panel_index<P>(l, 0) + lane] = blk[grid_file_index<P>(j, l, 0)];
                    std::memcpy(sub + P::kWords + 2 * size_t(lane), blk + P::file_qh(j), 2);
                }
            } else if constexpr (std::is_same_v<P, IQ2XS>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                for (int j = 0; j < 8; ++j) {
                    uint8_t* sub = out + P::kCodes + size_t(j) * P::kSubBytes;
                    uint32_t word = 0;
                    for (int l = 0; l < 4; ++l) {
                        const uint16_t g = uint16_t(blk[P::file_group(j, l)] | (blk[P::file_group(j, l) + 1] << 8));
                        sub[grid_panel_index<P>(l, 0) + lane] = uint8_t(g & 0xff);
                        word |= uint32_t(g >> 9) << (7 * l) | uint32_t((g >> 8) & 1) << (28 + l);
                    }
                    std::memcpy(sub + P::kWords + 4 * size_t(lane), &word, 4);
                    sub[P::kScales + size_t(lane)] = blk[P::file_scale(j)];
                }
            } else if constexpr (kSignBytes<P>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                if constexpr (std::is_same_v<P, IQ3S>) std::memcpy(out + P::kScales + 4 * size_t(lane), blk + P::kFileScales, 4);
                for (int j = 0; j < 8; ++j) {
                    uint8_t* sub = out + P::kCodes + size_t(j) * P::kSubBytes;
                    for (int l = 0; l < 4; ++l)
                        for (int h = 0; h < P::kIndices; ++h) sub[grid_panel_index<P>(l, h) + lane] = blk[grid_file_index<P>(j, l, h)];
                    std::memcpy(sub + P::kWords + 4 * size_t(lane), blk + P::file_signs(j), 4);
                    sub[P::kHigh + size_t(lane)] = blk[P::file_qh(j)];
                    if constexpr (std::is_same_v<P, IQ2S>) sub[P::kScales + size_t(lane)] = blk[P::file_scale(j)];
                }
            } else if constexpr (std::is_same_v<P, IQ2XXS> || std::is_same_v<P, IQ3XXS>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                for (int j = 0; j < 8; ++j) {
                    uint8_t* sub = out + P::kCodes + size_t(j) * P::kSubBytes;
                    for (int l = 0; l < 4; ++l)
                        for (int h = 0; h < P::kIndices; ++h) sub[grid_panel_index<P>(l, h) + lane] = blk[grid_file_index<P>(j, l, h)];
                    std::memcpy(sub + P::kWords + 4 * size_t(lane), blk + P::file_word(j), 4);
                }
            } else if constexpr (std::is_same_v<P, IQ4X>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                for (int j = 0; j < 8; ++j) {
                    out[P::kSc + 16 * j + lane] = uint8_t(int8_t(iq4_scale(blk, j) - 32));
                    for (int i = 0; i < 16; ++i) {
                        u[32 * j + i] = blk[8 + 16 * j + i] & 15;
                        u[32 * j + 16 + i] = blk[8 + 16 * j + i] >> 4;
                    }
                }
                for (int c = 0; c < 32; ++c)
                    for (int bb = 0; bb < 4; ++bb) code(c, bb) = uint8_t(u[8 * c + bb] | (u[8 * c + 4 + bb] << 4));
            } else if constexpr (std::is_same_v<P, Q6K>) {
                const float d = f16_at(blk + 208);
                std::memcpy(out + P::kD + 4 * size_t(lane), &d, 4);
                for (int j = 0; j < 16; ++j) out[P::kSc + 16 * j + lane] = blk[192 + j];
                q6k_codes(blk, u);
                for (int c = 0; c < 32; ++c)
                    for (int bb = 0; bb < 4; ++bb) {
                        const uint8_t lo = u[8 * c + bb], hi = u[8 * c + 4 + bb];
                        code(c, bb) = uint8_t((lo & 15) | ((hi & 15) << 4));
                        out[high_pairs_at(c) + size_t(lane) * 4 + size_t(bb)] |=
                            uint8_t(((lo >> 4) << (4 * (c % 2))) | ((hi >> 4) << (4 * (c % 2) + 2)));
                    }
            } else {   // Q4K, Q5K
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d, dmin stay f16
                std::memcpy(out + P::kDmin + 2 * size_t(lane), blk + 2, 2);
                for (int j = 0; j < 8; ++j) scale_min_k4(blk + 4, j, out + P::kSc + 16 * j + lane, out + P::kM + 16 * j + lane);
                if constexpr (std::is_same_v<P, Q4K>)
                    q4k_codes(blk, u);
                else
                    q5k_codes(blk, u);
                for (int c = 0; c < 32; ++c)
                    for (int bb = 0; bb < 4; ++bb) {
                        code(c, bb) = uint8_t((u[8 * c + bb] & 15) | ((u[8 * c + 4 + bb] & 15) << 4));
                        if constexpr (std::is_same_v<P, Q5K>)
                            out[fifth_bits_at<P>(c) + size_t(lane) * 4 + size_t(bb)] |=
                                uint8_t(((u[8 * c + bb] >> 4) << (2 * (c % 4))) | ((u[8 * c + 4 + bb] >> 4) << (2 * (c % 4) + 1)));
                    }
            }
        }
    }
}

// The weight at (k, lane) of a panel as the kernels mean it, w = s * u - s*z in f32 (the
// layout's specification; not a fast path).
template <class P>
float weight(const uint8_t* panel, int64_t k, int lane) {
    const uint8_t* blk = panel + size_t(k / P::kBlockK) * P::kBlockBytes;
    const int64_t kk = k % P::kBlockK;
    if constexpr (std::is_same_v<P, IQ1S> || std::is_same_v<P, IQ1M>) {   // gguf-py's order: (d (2 s + 1)) (value + delta)
        const int j = int(kk / 32), l = int(kk % 32 / 8), t = int(kk % 8);
        const uint8_t* sub = blk + P::kCodes + size_t(j) * P::kSubBytes;
        const uint16_t qh = u16_at(sub + P::kWords + 2 * size_t(lane));
        const float dl = grid_d<P>(blk, lane) * float(odd_scale<P>(blk, j, l / 2, lane));
        const float delta = P::negative_delta(qh, l) ? -kIq1sDelta : kIq1sDelta;
        return dl * (float(iq1s_value(P::index(sub[grid_panel_index<P>(l, 0) + lane], qh, l), t)) + delta);
    }
    if constexpr (std::is_same_v<P, IQ2XS>) {   // gguf-py's order: ((d (0.5 + ls)) 0.25 magnitude) sign
        const uint8_t* sub = blk + P::kCodes + size_t(kk / 32) * P::kSubBytes;
        const int l = int(kk % 32 / 8), t = int(kk % 8);
        uint32_t word;
        std::memcpy(&word, sub + P::kWords + 4 * size_t(lane), 4);
        const int ls = (sub[P::kScales + size_t(lane)] >> (4 * (l / 2))) & 15;
        const float db = f16_at(blk + P::kD + 2 * size_t(lane)) * (0.5f + float(ls)) * P::kScaleStep;
        const float w = db * float(P::magnitude(P::index(sub[grid_panel_index<P>(l, 0) + lane], word, l), t));
        return (iq2_sign_byte((word >> (7 * l)) & 127) >> t) & 1 ? -w : w;
    }
    if constexpr (kSignBytes<P>) {   // gguf-py's order: (d (0.5 + ls) 0.25 or d (2 s + 1)) magnitude, then the sign
        const int j = int(kk / 32), l = int(kk % 32 / 8), t = int(kk % 8);
        const uint8_t* sub = blk + P::kCodes + size_t(j) * P::kSubBytes;
        constexpr int kPer = 8 / P::kIndices;
        const float d = f16_at(blk + P::kD + 2 * size_t(lane));
        float db;
        if constexpr (std::is_same_v<P, IQ2S>)
            db = d * (0.5f + float((sub[P::kScales + size_t(lane)] >> (4 * (l / 2))) & 15)) * P::kScaleStep;
        else
            db = d * float(odd_scale<P>(blk, j, 0, lane));
        const int index = P::index(sub[grid_panel_index<P>(l, t / kPer) + lane], sub[P::kHigh + size_t(lane)], l, t / kPer);
        const float w = db * float(P::magnitude(index, t % kPer));
        return (sub[P::kWords + 4 * size_t(lane) + size_t(l)] >> t) & 1 ? -w : w;
    }
    if constexpr (std::is_same_v<P, IQ2XXS> || std::is_same_v<P, IQ3XXS>) {
        const uint8_t* sub = blk + P::kCodes + size_t(kk / 32) * P::kSubBytes;
        const int l = int(kk % 32 / 8), t = int(kk % 8);
        uint32_t word;
        std::memcpy(&word, sub + P::kWords + 4 * size_t(lane), 4);
        const float db = f16_at(blk + P::kD + 2 * size_t(lane)) * (0.5f + float(word >> 28)) * P::kScaleStep;
        constexpr int kPer = 8 / P::kIndices;   // magnitudes per index
        const float w = db * float(P::magnitude(sub[grid_panel_index<P>(l, t / kPer) + lane], t % kPer));
        return (iq2_sign_byte((word >> (7 * l)) & 127) >> t) & 1 ? -w : w;
    }
    const int j = int(kk / P::kSubK);
    auto byte = [&](size_t at, int64_t b) { return blk[at + size_t(lane) * 4 + size_t(b)]; };
    int u;
    if constexpr (P::kBits == 8) {
        u = byte(chunk_at<P>(kk / 4), kk % 4);
    } else if constexpr (P::kBits == 4) {
        const int64_t c = kk / 8, t = kk % 8;
        u = (byte(chunk_at<P>(c), t % 4) >> (t < 4 ? 0 : 4)) & 15;
        if constexpr (kFifthBits<P>) u |= ((byte(fifth_bits_at<P>(c), t % 4) >> (2 * (c % 4) + (t >= 4))) & 1) << 4;
        if constexpr (std::is_same_v<P, Q6K>) u |= ((byte(high_pairs_at(c), t % 4) >> (4 * (c % 2) + 2 * (t >= 4))) & 3) << 4;
    } else {
        const int64_t c = kk / 16, i = (kk % 16) / 4, b = kk % 4;
        u = (byte(chunk_at<P>(c), b) >> (2 * i)) & 3;
        if constexpr (std::is_same_v<P, Q3K>) u |= ((byte(third_bits_at(c), b) >> (4 * (c % 2) + i)) & 1) << 2;
    }
    const auto sc = [&](size_t at) { return blk[at + 16 * size_t(j) + size_t(lane)]; };
    const auto f32_at = [&](size_t at) {
        float f;
        std::memcpy(&f, blk + at + 4 * size_t(lane), 4);
        return f;
    };
    const float d16 = f16_at(blk + P::kD + 2 * size_t(lane));
    if constexpr (nibble_zero<P>() != 0) return d16 * float(u - nibble_zero<P>());
    if constexpr (kAddedMin<P>) return d16 * float(u) + f16_at(blk + P::kDmin + 2 * size_t(lane));
    if constexpr (std::is_same_v<P, IQ4NL>) return d16 * float(kIq4Values[u]);
    if constexpr (std::is_same_v<P, Q80>) return d16 * float(u - 128);
    if constexpr (std::is_same_v<P, IQ4X>) return d16 * float(int8_t(sc(P::kSc))) * float(kIq4Values[u]);
    if constexpr (std::is_same_v<P, Q3K>) return d16 * float(int8_t(sc(P::kSc))) * float(u - 4);
    if constexpr (std::is_same_v<P, Q2K>)
        return d16 * float(sc(P::kSc) & 15) * float(u) - f16_at(blk + P::kDmin + 2 * size_t(lane)) * float(sc(P::kSc) >> 4);
    if constexpr (std::is_same_v<P, Q6K>) return f32_at(P::kD) * float(int8_t(sc(P::kSc))) * float(u - 32);
    if constexpr (std::is_same_v<P, Q4K> || std::is_same_v<P, Q5K>)
        return d16 * float(sc(P::kSc)) * float(u) - f16_at(blk + P::kDmin + 2 * size_t(lane)) * float(sc(P::kM));
    return 0.0f;
}

// ---- an expert ----------------------------------------------------------------------------

struct Matrix {
    const BlockType* type;   // nullptr: a type this layout does not hold
    int64_t rows, cols, row_bytes;   // row_bytes: of the file's rows (what the packer takes)
    size_t panel_bytes, offset;      // panel_bytes 0: not packable (unknown type, K not a multiple)
};
struct Expert {
    Matrix m[3];   // gate, up, down
    size_t bytes;
    bool ok;       // every matrix packable
};

inline Expert expert(const kt_dtype types[3], int64_t hidden, int64_t intermediate) {
    Expert e{};
    e.ok = true;
    const int64_t rows[3] = {intermediate, intermediate, hidden}, cols[3] = {hidden, hidden, intermediate};
    size_t at = 0;
    for (int p = 0; p < 3; ++p) {
        Matrix& m = e.m[p];
        m.type = block_type(types[p]);
        m.rows = rows[p];
        m.cols = cols[p];
        m.row_bytes = m.type ? m.cols / m.type->elems * m.type->bytes : 0;
        if (m.type && m.cols % m.type->elems == 0)
            m.panel_bytes = with_panels(m.type->dtype, [&](auto form) { return panel_bytes<decltype(form)>(m.cols); });
        e.ok = e.ok && m.panel_bytes;
        m.offset = at;
        at += (size_t(panel_count(m.rows)) * m.panel_bytes + 63) / 64 * 64;
    }
    e.bytes = at;
    return e;
}

constexpr const char* kMatrixName[3] = {"gate", "up", "down"};

// "" when the layer's types and shape fit this layout, else why not (*code: the kt_status).
inline std::string check_config(const kt_moe_config* c, kt_status* code) {
    *code = KT_ERROR_INVALID_ARGUMENT;
    if (!KT_HAS_FIELD(c, kt_moe_config, weight_dtype))
        return "LLAMAFILE: the core passed no weight types (kt-core older than ABI 1.1)";
    if (c->group_size != 0 || (c->quant_flags & KT_QUANT_ZERO_POINT))
        return "LLAMAFILE: ggml blocks carry their own scales; group_size and zero_point do not apply";
    const int64_t k[3] = {c->hidden, c->hidden, c->intermediate};
    for (int p = 0; p < 3; ++p) {
        const BlockType* t = block_type(c->weight_dtype[p]);
        if (!t) {
            *code = KT_ERROR_UNSUPPORTED;
            return inputs::message("LLAMAFILE: %s is ggml type %d, which this backend does not read; supported: %s",
                                   kMatrixName[p], int(c->weight_dtype[p]) - int(KT_DTYPE_GGML_BASE), kSupported);
        }
        if (k[p] % t->elems)
            return inputs::message("LLAMAFILE: %s is %s, whose blocks hold %lld elements; K = %lld is not a multiple",
                                   kMatrixName[p], t->name, (long long)t->elems, (long long)k[p]);
    }
    return "";
}

// "" when matrix p's weight (the file's rows as uint8, no separate scales, finite block scales)
// is what the packer takes, else why not.
inline std::string check_matrix(const Matrix& m, int p, const kt_weight& w) {
    const kt_matrix& v = w.values;
    if (!v.data || v.dtype != KT_DTYPE_U8 || v.rows != m.rows || v.cols != m.row_bytes)
        return inputs::message("LLAMAFILE: %s (%s) must be uint8 [%lld, %lld] (the blocks of each row); got %s [%lld, %lld]",
                               kMatrixName[p], m.type->name, (long long)m.rows, (long long)m.row_bytes,
                               v.data ? inputs::dtype_name(v.dtype) : "nothing", (long long)v.rows, (long long)v.cols);
    if (w.scales.data || w.zeros.data)
        return inputs::message("LLAMAFILE: %s: ggml blocks hold their scales; none may be given", kMatrixName[p]);
    const auto* bytes = static_cast<const uint8_t*>(v.data);
    for (int64_t r = 0; r < m.rows; ++r) {
        const uint8_t* row = bytes + r * v.row_stride;
        bool bad = false;
        for (int64_t b = 0; b < m.row_bytes; b += m.type->bytes) bad |= non_finite_scale(*m.type, row + b);
        if (bad)
            return inputs::message("LLAMAFILE: %s (%s) row %lld has a NaN or Inf block scale; kt refuses non-finite weights "
                                   "at load", kMatrixName[p], m.type->name, (long long)r);
    }
    return "";
}

// Matrix m of an expert (checked) into its panels at `expert + m.offset`.
inline void pack_matrix(const Matrix& m, const kt_weight& w, uint8_t* expert) {
    const auto* bytes = static_cast<const uint8_t*>(w.values.data);
    with_panels(m.type->dtype, [&](auto form) {
        using P = decltype(form);
        for (int64_t q = 0; q < panel_count(m.rows); ++q)
            pack_panel<P>(bytes, size_t(w.values.row_stride), m.rows, q * kPanel, m.cols, expert + m.offset + size_t(q) * m.panel_bytes);
    });
}

// A layer's expert layout (ok = false when the core passed no weight types: check_config says why).
inline Expert expert(const kt_moe_config* c) {
    if (!KT_HAS_FIELD(c, kt_moe_config, weight_dtype)) return Expert{};
    return expert(c->weight_dtype, c->hidden, c->intermediate);
}

// One expert's gate, up and down (the file's rows) checked and packed into dst; "" when done, else
// why not (*code: the kt_status). Both backends' pack_expert.
inline std::string pack_expert(const kt_moe_config* c, const kt_expert_weights* src, void* dst, kt_status* code) {
    std::string why = check_config(c, code);
    if (!why.empty()) return why;
    *code = KT_ERROR_INVALID_ARGUMENT;
    const Expert e = expert(c);
    const kt_weight* w[3] = {&src->gate, &src->up, &src->down};
    for (int p = 0; p < 3; ++p) {
        why = check_matrix(e.m[p], p, *w[p]);
        if (!why.empty()) return why;
        pack_matrix(e.m[p], *w[p], static_cast<uint8_t*>(dst));
    }
    return "";
}

}  // namespace
}  // namespace kt::layouts::ggml
