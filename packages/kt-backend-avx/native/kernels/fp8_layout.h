// The FP8 (E4M3) panel layouts that kt-backend-avx packs and kt-backend-amx reads too
// (docs/formats.md), and the E4M3 -> bf16 conversion both use on AVX512_BF16 targets.
//
// Per matrix, panels of 16 channels; a panel is a header of one 64-byte f32[16] scale vector per
// 128-wide k block (a block format repeats its scalar, a per-channel one its 16 channels' scales;
// 2^8 folded in, since the codes decode to value / 256) followed by the code bytes:
// - "kt-fp8-p16-v1" (targets without AVX512_BF16, which widen codes through F16C): K rows of 16
//   codes, row k's code of channel `lane` at 16 k + lane.
// - "kt-fp8-p16-v2" (AVX512_BF16 targets and AMX): K padded with zero codes to a multiple of 4,
//   in groups of four k rows (64 bytes); in a group, row r's code of channel `lane` sits at byte
//   16 (lane / 4) + 8 (r / 2) + 2 (lane % 4) + r % 2. Why: the byte-table lookups return a
//   vector of low and one of high bf16 bytes in code order, and vpunpcklbw / vpunpckhbw of those
//   two are then exactly the (k, k+1) and (k+2, k+3) bf16 pairs per channel that vdpbf16ps
//   takes. v1's order needed two vpermi2b instead of the unpacks: on a Zen 4 core a 512-bit
//   vpermi2b and vdpbf16ps issue one per cycle from the same pipes, an unpack ~1.6 per cycle.
#pragma once
#include "common.h"

namespace KT_TARGET_NAMESPACE {

constexpr int64_t kFp8Block = 128;          // k (and, for FP8, n) per scale block
constexpr size_t kFp8ScaleBytes = 64;       // one f32[16] scale vector per k block

#if defined(__AVX512BF16__)
inline constexpr const char* kFp8LayoutId = "kt-fp8-p16-v2";
inline constexpr int64_t kFp8RowGroup = 4;
#else
inline constexpr const char* kFp8LayoutId = "kt-fp8-p16-v1";
inline constexpr int64_t kFp8RowGroup = 1;
#endif

inline int64_t fp8_kblocks(int64_t k) { return (k + kFp8Block - 1) / kFp8Block; }
inline int64_t fp8_code_rows(int64_t k) { return (k + kFp8RowGroup - 1) / kFp8RowGroup * kFp8RowGroup; }
inline size_t fp8_codes_at(int64_t k) { return size_t(fp8_kblocks(k)) * kFp8ScaleBytes; }
inline size_t fp8_panel_bytes(int64_t k) { return fp8_codes_at(k) + size_t(fp8_code_rows(k)) * kPanel; }

// Byte offset, from the panel's first code, of row k's code for channel `lane`.
inline size_t fp8_code_offset(int64_t k, int lane) {
    if constexpr (kFp8RowGroup == 1) return size_t(k) * kPanel + size_t(lane);
    const int r = int(k % 4);
    return size_t(k - r) * kPanel + size_t(16 * (lane / 4) + 8 * (r / 2) + 2 * (lane % 4) + r % 2);
}

#if defined(__AVX512BF16__)
// E4M3 magnitude code c (0..127) -> the bf16 bits of its value / 256, exact; 0x7f (NaN) is
// refused at load. The converter looks the high and low bytes up with vpermi2b (a 128-entry byte
// table per instruction) and ORs the sign into the high byte.
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
inline void widen_fp8_panel(const E4M3Converter& cv, const uint8_t* panel, int64_t k, uint32_t* dst) {
    const uint8_t* codes = panel + fp8_codes_at(k);
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
