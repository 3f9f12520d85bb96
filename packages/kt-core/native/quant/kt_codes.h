// kt's stored integer codes (docs/formats.md, "converted folders"): what `kt convert`
// writes and the INT8 / INT4 packers read back. Quantized in parallel on the process pool.
#pragma once
#include <kt/plugin.h>

#include <cstdint>

namespace kt {

// src [N, K] f32 or bf16 -> codes int8 [N, K], scales f32 [N].
void quantize_int8_codes(const kt_matrix& src, int8_t* codes, float* scales);

// src [N, K] f32 or bf16 -> packed uint8 [N, K/2] (element 2j in the low nibble of byte j,
// u = q + 8 when symmetric), scales f32 [N, K/group], zeros uint8 [N, K/group] when
// zero_point (else zeros is unused and may be null). group must divide K.
void quantize_int4_codes(const kt_matrix& src, int64_t group, bool zero_point, uint8_t* packed, float* scales,
                         uint8_t* zeros);

}  // namespace kt
