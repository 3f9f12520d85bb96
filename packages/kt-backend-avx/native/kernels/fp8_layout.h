// FP8 (E4M3) on this target: which of kt-core's FP8 panel layouts it packs
// (kt/formats/packed_layouts.h: "kt-fp8-p16-v2" on AVX512_BF16 targets, whose byte-table
// lookups and unpacks need the four-row groups; "kt-fp8-p16-v1" on the others, which widen
// codes through F16C), and the E4M3 -> bf16 converter the AVX512_BF16 kernels and AMX use.
// v1's order needed two vpermi2b instead of the unpacks: on a Zen 4 core a 512-bit vpermi2b
// and vdpbf16ps issue one per cycle from the same pipes, an unpack ~1.6 per cycle.
#pragma once
#include <kt/formats/packed_layouts.h>

#include "common.h"

namespace KT_TARGET_NAMESPACE {

namespace fp8_layout = kt::layouts::fp8;
constexpr int64_t kFp8Block = fp8_layout::kBlock;
constexpr size_t kFp8ScaleBytes = fp8_layout::kScaleBytes;

#if defined(__AVX512BF16__)
inline constexpr const char* kFp8LayoutId = fp8_layout::kIdQuads;
inline constexpr const char* kMxfp8LayoutId = kt::layouts::mxfp8::kIdQuads;
inline constexpr int64_t kFp8RowGroup = 4;
#else
inline constexpr const char* kFp8LayoutId = fp8_layout::kIdRows;
inline constexpr const char* kMxfp8LayoutId = kt::layouts::mxfp8::kIdRows;
inline constexpr int64_t kFp8RowGroup = 1;
#endif
// FP8 and FP8_PERCHANNEL: a scale vector per 128 k; MXFP8: per 32 k (the same code order).
inline constexpr fp8_layout::Geometry kFp8Geometry{kFp8RowGroup, fp8_layout::kBlock};
inline constexpr fp8_layout::Geometry kMxfp8Geometry{kFp8RowGroup, kt::layouts::mxfp8::kBlock};

inline int64_t fp8_kblocks(int64_t k) { return kFp8Geometry.kblocks(k); }
inline int64_t fp8_code_rows(int64_t k) { return kFp8Geometry.code_rows(k); }
inline size_t fp8_codes_at(int64_t k) { return kFp8Geometry.codes_at(k); }
inline size_t fp8_panel_bytes(int64_t k) { return kFp8Geometry.panel_bytes(k); }
inline size_t fp8_code_offset(int64_t k, int lane) { return kFp8Geometry.code_offset(k, lane); }

#if defined(__AVX512BF16__)
// The converter looks each code's high and low bf16 bytes (kt::layouts::fp8::e4m3_bf16_bits)
// up with vpermi2b (a 128-entry byte table per instruction) and ORs the sign into the high byte.
using fp8_layout::e4m3_bf16_bits;
struct E4M3ByteTables {
    alignas(64) uint8_t high[128], low[128];
};
constexpr E4M3ByteTables e4m3_byte_tables() {
    E4M3ByteTables t{};
    for (int c = 0; c < 128; ++c) {
        t.high[c] = uint8_t(e4m3_bf16_bits(c) >> 8);
        t.low[c] = uint8_t(e4m3_bf16_bits(c) & 0xff);
    }
    return t;
}
inline constexpr E4M3ByteTables kE4M3Bytes = e4m3_byte_tables();

// One v2 row group (64 code bytes: rows k..k+3, 16 channels) -> two vectors of bf16 pairs per
// channel lane: pairs[0] lane i = (w[k][i], w[k+1][i]), pairs[1] the same for k+2, k+3.
// Five vector operations per 64 weights: two table lookups, the sign, two byte interleaves.
struct E4M3Converter {
    __m512i high_lo, high_hi, low_lo, low_hi, sign;
    E4M3Converter()
        : high_lo(_mm512_load_si512(kE4M3Bytes.high)), high_hi(_mm512_load_si512(kE4M3Bytes.high + 64)),
          low_lo(_mm512_load_si512(kE4M3Bytes.low)), low_hi(_mm512_load_si512(kE4M3Bytes.low + 64)),
          sign(_mm512_set1_epi8(char(0x80))) {}
    void convert(__m512i codes, __m512i* pairs) const {
        const __m512i low = _mm512_permutex2var_epi8(low_lo, codes, low_hi);   // index bit 7 (the sign) is ignored
        const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high_lo, codes, high_hi), codes, sign,
                                                       0xF8);   // A | (B & C): the sign bit
        pairs[0] = _mm512_unpacklo_epi8(low, high);
        pairs[1] = _mm512_unpackhi_epi8(low, high);
    }
};

// A v2 panel's codes -> [ceil(K/2)][16] 32-bit lanes of bf16 pairs (AMX B-tile rows, and the
// widened copy AVX's prefill tiles reuse across row blocks).
inline void widen_fp8_panel(const E4M3Converter& cv, const uint8_t* panel, int64_t k, uint32_t* dst,
                            const fp8_layout::Geometry& geo = kFp8Geometry) {
    const uint8_t* codes = panel + geo.codes_at(k);
    const int64_t kc = (k + 1) / 2;
    for (int64_t q = 0; 2 * q < kc; ++q) {
        __m512i pairs[2];
        cv.convert(_mm512_loadu_si512(codes + size_t(4 * q) * kPanel), pairs);
        _mm512_storeu_si512(dst + 2 * q * kPanel, pairs[0]);
        if (2 * q + 1 < kc) _mm512_storeu_si512(dst + (2 * q + 1) * kPanel, pairs[1]);
    }
}
#endif

}  // namespace KT_TARGET_NAMESPACE
