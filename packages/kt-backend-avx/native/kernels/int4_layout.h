// The INT4 group layouts that kt-backend-avx packs and kt-backend-amx reads too
// (docs/formats.md). Per matrix, panels of 16 channels; per panel, per group of G consecutive k,
// a header and then G/8 chunks of 64 bytes (byte lane*4 + b of chunk c holds u[lane][8c + b] in
// its low nibble, u[lane][8c + 4 + b] in its high one).
// - "kt-int4-p16-v2" (INT4): the header is {f32 s[16]} for symmetric groups (z = 8) and
//   {f32 s[16]; f32 s*z[16]} with zero points. v1 stored s*z for symmetric groups as well.
// - "kt-rawint4-p16-v1" (RAWINT4: G = 32, symmetric, bf16 scales as the checkpoint ships them):
//   the header is {bf16 s[16]}, 32 bytes. Decode streams every byte, and with 256 bytes of codes
//   per group an f32 header was a fifth of them: 288 bytes per group instead of 320 (a Qwen3
//   expert 2.65 MB instead of 2.95). Chunks then start 32 bytes into a cache line every other
//   group: each 256-bit half of a load stays inside one line.
#pragma once
#include "common.h"
#include "int_dot.h"

namespace KT_TARGET_NAMESPACE {

struct Int4Layout {
    int64_t g;           // group size: 32, 64 or 128
    bool zero_point;     // asymmetric groups: the header holds s*z too
    bool bf16_scales;    // RAWINT4: s as bf16, no s*z

    size_t header_bytes() const { return zero_point ? 128 : bf16_scales ? 32 : 64; }
    size_t group_bytes() const { return header_bytes() + size_t(g) * 8; }
    size_t panel_bytes(int64_t k) const { return size_t(k / g) * group_bytes(); }
    ExpertPanels expert(const kt_moe_config* c) const {
        return {c->hidden, c->intermediate, panel_bytes(c->hidden), panel_bytes(c->intermediate)};
    }
    // The group header's scales s (and s*z) for lanes v * kLanes.., as f32.
    VF scale(const uint8_t* header, int v) const {
        return bf16_scales ? vload_bf16(reinterpret_cast<const uint16_t*>(header) + v * kLanes)
                           : vload(reinterpret_cast<const float*>(header) + v * kLanes);
    }
    VF scale_times_zero(const uint8_t* header, int v) const {
        return vload(reinterpret_cast<const float*>(header + 64) + v * kLanes);
    }
    // acc + (the group's share of w . x): s * dot - s*z * asum, with dot the integer dot of codes
    // and activations and asum the activations' group sum, both in raw units (int4_raw_dot /
    // int4_raw_sum; the row's scale applies once, at the end). Symmetric groups: s * (dot -
    // 8 asum), where 8 asum is exact, so a compiler fusing the subtraction cannot change the
    // result (AMX's kernels must equal AVX's bit for bit: both apply these).
    template <bool kZeroPoint>
    static VF apply(VF s, VF sz, VF acc, VF dot, VF asum) {
        if constexpr (kZeroPoint) return vfma(s, dot, vsub(acc, vmul(sz, asum)));
        return vfma(s, vsub(dot, vmul(vset1(8.0f), asum)), acc);
    }
    VF update(const uint8_t* header, int v, VF acc, VF dot, VF asum) const {
        if (zero_point) return apply<true>(scale(header, v), scale_times_zero(header, v), acc, dot, asum);
        return apply<false>(scale(header, v), vzero(), acc, dot, asum);
    }
};

// The group's activation terms in raw units: with two int8 planes, 128 * hi + lo (exact in int32:
// |hi| <= 15 * 127 * 128 per group), so one conversion replaces two and the 1/128 and the row's
// scale s_a move out of the group loop into int4_row_scale.
inline VF int4_raw_dot(VI hi, VI lo, bool two_pass) { return vcvt(two_pass ? vaddi(vslli32<7>(hi), lo) : hi); }
inline float int4_raw_sum(int32_t sum_hi, int32_t sum_lo, bool two_pass) {
    return two_pass ? float(128 * sum_hi + sum_lo) : float(sum_hi);
}
inline float int4_row_scale(float sa, bool two_pass) { return two_pass ? sa * (1.0f / 128.0f) : sa; }

inline const char* int4_layout_id(bool raw) { return raw ? "kt-rawint4-p16-v1" : "kt-int4-p16-v2"; }

// RAWINT4 is always G = 32, symmetric; INT4 takes the layer's group size (0: 128) and zero-point flag.
inline Int4Layout int4_layout(const kt_moe_config* c, bool raw) {
    if (raw) return {32, false, true};
    return {c->group_size == 0 ? 128 : c->group_size, (c->quant_flags & KT_QUANT_ZERO_POINT) != 0, false};
}

}  // namespace KT_TARGET_NAMESPACE
