// The integer quantization rules of docs/formats.md (INT8, INT4 symmetric and with zero points),
// in the f32 arithmetic they fix: kt-core's public definition of the formats, used by kt convert's
// quantizer (native/quant/kt_codes), the reference backend and every backend's packers, so a
// converted folder holds exactly the codes online quantization would produce on any backend.
//
// The functions have internal linkage (an unnamed namespace) on purpose: backends compile them
// into translation units built with different ISA flags, and one shared inline definition would
// let the linker keep, say, the AVX-512 copy for the baseline code's calls.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kt::quant {
namespace {

// Nearest, ties away from zero, of the f32 quotient (std::lround's rounding). Clamping
// first keeps the conversion defined when a subnormal scale makes the quotient huge, and
// changes nothing else: the bounds are integers. x + copysign(0.5, x) is exact in double for
// every clamped f32, and the int conversion truncates toward zero, so this is lround without
// the library call: the loops vectorise (kt convert quantizes every weight through here).
inline int round_clamped(float x, int lo, int hi) {
    const double d = double(std::clamp(x, float(lo), float(hi)));
    return int(d + std::copysign(0.5, d));
}

// s = max|w| / max_code; q = clamp(round(w / s), lo, hi); s = 0 gives q = 0.
inline float quantize_symmetric(const float* w, int64_t count, float max_code, int lo, int hi, int8_t* codes) {
    float amax = 0.0f;
    for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(w[i]));
    const float s = amax / max_code;
    for (int64_t i = 0; i < count; ++i) codes[i] = int8_t(s == 0.0f ? 0 : round_clamped(w[i] / s, lo, hi));
    return s;
}

// lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 15; z = clamp(round(-lo / s), 0, 15);
// q = clamp(round(w / s) + z, 0, 15); s = 0 gives q = z = 0. Rounding w / s within
// [-15, 15] before adding z cannot change the clamped sum, as 0 <= z <= 15.
inline float quantize_asymmetric(const float* w, int64_t count, uint8_t* codes, int* zero) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < count; ++i) {
        lo = std::min(lo, w[i]);
        hi = std::max(hi, w[i]);
    }
    const float s = (hi - lo) / 15.0f;
    const int z = s == 0.0f ? 0 : round_clamped(-lo / s, 0, 15);
    for (int64_t i = 0; i < count; ++i)
        codes[i] = uint8_t(s == 0.0f ? 0 : std::clamp(round_clamped(w[i] / s, -15, 15) + z, 0, 15));
    *zero = z;
    return s;
}

}  // namespace
}  // namespace kt::quant
