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
// their own; v8 adds the 32-element Q4_1, Q5_0, Q5_1 and IQ4_NL (the others' bytes unchanged).
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
};
constexpr const char* kSupported = "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ2_XXS, IQ3_XXS";

inline const BlockType* block_type(kt_dtype d) {
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
// w = d * (u - 8), u in 0..15: INT4's symmetric group of 32 with the block's f16 d kept as f16,
// so the panel takes the file's 4.5 bits per weight exactly.
struct Q40 {
    static constexpr kt_dtype kType = KT_DTYPE_GGML_Q4_0;
    static constexpr int64_t kBlockK = 32, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = false;
    static constexpr size_t kFileBlock = 18, kD = 0, kCodes = 32;   // f16 d[16], then 4 chunks
    static constexpr size_t kBlockBytes = kCodes + 4 * kChunkBytes;
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
// The other 32-element types, each the file's bytes exactly (Q4_0's chunks of nibbles, a Q5_K-style
// line of fifth bits after them, llama-quantize's fallbacks for matrices whose K is not a multiple
// of 256 — GLM-4.5-Air's and DeepSeek-V2-Lite's 1408-wide down, GPT-OSS's 2880 — and its older
// quants): Q4_1: w = d * u + m (f16 d[16], f16 m[16]: 5 bits per weight); Q5_0: w = d * (u - 16),
// u in 0..31 (5.5); Q5_1: w = d * u + m (6); IQ4_NL: w = d * kIq4Values[u], IQ4_XS's table with
// one f16 scale per 32 (4.5).
template <kt_dtype T, size_t kFile, bool kMin, bool kFifth, bool kTable>
struct Nibbles32 {
    static constexpr kt_dtype kType = T;
    static constexpr int64_t kBlockK = 32, kSubK = 32;
    static constexpr int kBits = 4;
    static constexpr bool kBig = kTable;
    static constexpr size_t kFileBlock = kFile, kD = 0, kDmin = 32, kCodes = kMin ? 64 : 32;   // kDmin: f16 m[16] if kMin
    static constexpr size_t kSubBytes = 4 * kChunkBytes + (kFifth ? 64 : 0);
    static constexpr size_t kBlockBytes = kCodes + kSubBytes;
};
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
// The grid forms' indices: half h (< kIndices) of group l's in sub-block j of the file's block
// (both types put a sub-block's 8 index bytes at 2 + 8 j), and in a panel's sub-block (16 channels
// side by side).
template <class P>
constexpr size_t grid_file_index(int j, int l, int h) { return 2 + 8 * size_t(j) + size_t(P::kIndices * l + h); }
template <class P>
constexpr size_t grid_panel_index(int l, int h) { return 16 * size_t(P::kIndices * l + h); }

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
        default: return f(Q80{});
    }
}

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
            if constexpr (std::is_same_v<P, Q40>) {
                std::memcpy(out + P::kD + 2 * size_t(lane), blk, 2);   // d stays f16
                for (int j = 0; j < 16; ++j) {
                    u[j] = blk[2 + j] & 15;        // ggml: element j in the low nibble of byte j,
                    u[j + 16] = blk[2 + j] >> 4;   // element j + 16 in its high nibble
                }
                for (int c = 0; c < 4; ++c)
                    for (int bb = 0; bb < 4; ++bb) code(c, bb) = uint8_t(u[8 * c + bb] | (u[8 * c + 4 + bb] << 4));
            } else if constexpr (std::is_same_v<P, Q80>) {
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
            } else if constexpr (P::kBlockK == 32 && P::kBits == 4) {   // Q4_1, Q5_0, Q5_1, IQ4_NL
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
    if constexpr (std::is_same_v<P, Q40>) return d16 * float(u - 8);
    if constexpr (std::is_same_v<P, Q50>) return d16 * float(u - 16);
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
        bool bad = false;   // f16 scales with an all-ones exponent are NaN or Inf
        for (int64_t b = 0; b < m.row_bytes; b += m.type->bytes)
            for (int at : m.type->scale_at)
                if (at >= 0) bad |= (row[b + at + 1] & 0x7c) == 0x7c;
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
