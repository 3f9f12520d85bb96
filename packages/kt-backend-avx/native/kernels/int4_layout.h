// INT4, RAWINT4, MXFP4 and NVFP4 on this target: kt-core's group layouts (kt/formats/packed_layouts.h:
// "kt-int4-p16-v2", "kt-rawint4-p16-v1", "kt-mxfp4-p16-v2", "kt-nvfp4-p16-v1"; amx reads the first three), with the vector
// reads of a group header and the arithmetic every INT4 kernel applies per group.
#pragma once
#include <kt/formats/packed_layouts.h>

#include "common.h"
#include "int_dot.h"

namespace KT_TARGET_NAMESPACE {

struct Int4Layout : kt::layouts::int4::Geometry {
    ExpertPanels expert(const kt_moe_config* c) const { return Geometry::expert(c->hidden, c->intermediate); }
    // The group header's scales s (and s*z) for lanes v * kLanes.., as f32.
    VF scale(const uint8_t* header, int v) const {
        if (e4m3_scales) return vload_e4m3_over_256(header + v * kLanes);
        if (e8m0_scales) return vload_e8m0_half(header + v * kLanes);
        return bf16_scales ? vload_bf16(reinterpret_cast<const uint16_t*>(header) + v * kLanes)
                           : vload(reinterpret_cast<const float*>(header) + v * kLanes);
    }
    // NVFP4's per-panel vector (prefix_bytes != 0), which multiplies the panel's outputs.
    static VF panel_scale(const uint8_t* panel, int v) { return vload(reinterpret_cast<const float*>(panel) + v * kLanes); }
    VF scale_times_zero(const uint8_t* header, int v) const {
        return vload(reinterpret_cast<const float*>(header + 64) + v * kLanes);
    }
    // acc + (the group's share of w . x): s * dot - s*z * asum, with dot the integer dot of codes
    // and activations and asum the activations' group sum, both in raw units (int4_raw_dot /
    // int4_raw_sum; the row's scale applies once, at the end). Symmetric groups: s * (dot -
    // 8 asum), where 8 asum is exact, so a compiler fusing the subtraction cannot change the
    // result (AMX's kernels must equal AVX's bit for bit: both apply these).
    // MXFP4 (kOffset 12) is a symmetric group whose codes decode to u = 2 value + 12.
    template <bool kZeroPoint, int kOffset = 8>
    static VF apply(VF s, VF sz, VF acc, VF dot, VF asum) {
        if constexpr (kZeroPoint) return vfma(s, dot, vsub(acc, vmul(sz, asum)));
        return vfma(s, vsub(dot, vmul(vset1(float(kOffset)), asum)), acc);
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

// MXFP4: the symmetric geometry at G = 32 with E8M0 byte headers; NVFP4: E4M3 headers at G = 16
// after a per-panel scale vector (kt/formats/packed_layouts.h, mxfp4 and nvfp4).
inline Int4Layout mxfp4_layout() { return {kt::layouts::mxfp4::geometry()}; }
inline Int4Layout nvfp4_layout() { return {kt::layouts::nvfp4::geometry()}; }

inline const char* int4_layout_id(bool raw) { return raw ? kt::layouts::int4::kRawId : kt::layouts::int4::kId; }

// RAWINT4 is always G = 32, symmetric; INT4 takes the layer's group size (0: 128) and zero-point flag.
inline Int4Layout int4_layout(const kt_moe_config* c, bool raw) {
    return {kt::layouts::int4::geometry(raw, c->group_size == 0 ? 128 : c->group_size,
                                        (c->quant_flags & KT_QUANT_ZERO_POINT) != 0)};
}

}  // namespace KT_TARGET_NAMESPACE
