// Packing 16 channels' rows into the panel layout every method shares at its core: chunk c of
// a panel is 64 bytes, the 32-bit word c of each of the 16 channels in lane order. That is a
// transpose of 16 rows x `words` 32-bit words; loading a model runs every packed byte through
// it, so on AVX-512 targets it is done 16x16 words at a time in registers (64 shuffles per KiB
// instead of 256 scalar loads and stores), with scalar code for the tail and other targets.
#pragma once
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace KT_TARGET_NAMESPACE {

// An identity word transform, for methods that copy words unchanged.
struct SameWord {
    static uint32_t scalar(uint32_t w) { return w; }
#if defined(__AVX512F__)
    static __m512i vector(__m512i w) { return w; }
#endif
};

#if defined(__AVX512F__)
// r[i] holds 16 words of row i; afterwards r[j] holds word j of rows 0..15.
inline void transpose16x16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // u[4m + q], 128-bit lane L: word 4L + q of rows 4m .. 4m + 3.
    for (int m = 0; m < 4; ++m) {
        u[4 * m + 0] = _mm512_unpacklo_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 1] = _mm512_unpackhi_epi64(t[4 * m], t[4 * m + 2]);
        u[4 * m + 2] = _mm512_unpacklo_epi64(t[4 * m + 1], t[4 * m + 3]);
        u[4 * m + 3] = _mm512_unpackhi_epi64(t[4 * m + 1], t[4 * m + 3]);
    }
    // Word 4L + q of all rows: lane L of u[q], u[4 + q], u[8 + q], u[12 + q].
    for (int q = 0; q < 4; ++q) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), v1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88),
                      w1 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
        r[0 + q] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[8 + q] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        r[4 + q] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + q] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}
#endif

// dst + 64 * c (c < words) receives word c of rows[0..15], each passed through Word. rows[i]
// may be null: that lane is left as it is (the destination comes zero-filled).
template <class Word = SameWord>
void pack_lanes(const uint8_t* const rows[kPanel], int64_t words, uint8_t* dst) {
    int64_t c = 0;
#if defined(__AVX512F__)
    static_assert(kPanel == 16, "the 16x16 transpose assumes 16-channel panels");
    bool full = true;
    for (int i = 0; i < kPanel; ++i) full &= rows[i] != nullptr;
    if (full) {
        for (; c + 16 <= words; c += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; ++i) r[i] = Word::vector(_mm512_loadu_si512(rows[i] + 4 * c));
            transpose16x16(r);
            for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + 64 * (c + j), r[j]);
        }
    }
#endif
    for (int i = 0; i < kPanel; ++i) {
        if (!rows[i]) continue;
        for (int64_t cc = c; cc < words; ++cc) {
            uint32_t w;
            std::memcpy(&w, rows[i] + 4 * cc, 4);
            w = Word::scalar(w);
            std::memcpy(dst + 64 * cc + 4 * i, &w, 4);
        }
    }
}

}  // namespace KT_TARGET_NAMESPACE
