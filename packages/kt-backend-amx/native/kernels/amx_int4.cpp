// Group-wise INT4 (and RAWINT4, the same layout with G = 32; GPTQ_INT4, INT4's layout packed from
// GPTQ checkpoints; MXFP4, INT4's symmetric G = 32 layout holding E2M1 codes) on AMX-INT8, in AVX's INT4 format
// (kt-backend-avx int4_layout.h): per group of G k, a header ({s[16]}, with zero points {s[16],
// s*z[16]}) and G/8 chunks whose low nibbles are one 4-k quad of 16 channels and whose high
// nibbles the next — and two-pass signed int8 activations with per-32 block sums.
//
// Each panel is unpacked once per call into int8 B-tile rows (chunk c -> rows 2c = low
// nibbles, 2c + 1 = high nibbles), in L1/L2 for every row block that follows. Per row block and
// group, the tiles sum the group exactly in C0-C3 (hi/lo plane x panel a/b) and the group's
// scales apply on the stored accumulators; the row's activation scale s_a applies at the end
// (int4_layout.h).
// - Symmetric groups (INT4 without zero points, RAWINT4, GPTQ_INT4, MXFP4) unpack to signed
//   codes q - 8 (MXFP4: one byte shuffle to 2 value, in [-12, 12]), so tdpbssd sums
//   sum(a (q - 8)) itself and the group's update is acc += s * dot: no per-row activation sums
//   in the epilogue, which costs as much as the tiles here. The same integer AVX reaches as
//   dot - 8 asum in f32 (exact while both stay below 2^24, as they do for int8 activations and
//   G <= 128 unless nearly every product is at its extreme).
// - Zero-point groups keep codes 0..15 (tdpbsud) and subtract s*z * sum(activations).
#include <vector>

#include "amx_common.h"
#include "int4_layout.h"

namespace KT_TARGET_NAMESPACE {
namespace {

constexpr size_t kChunkBytes = 64;
enum Slot : int { kInt4, kRaw, kGptq, kMx, kSlots };
AmxMethod g_methods[kSlots];
// The table this file wraps, for amx_gate_up / amx_gate_up_raw.
template <int kSlot>
const AmxMethod& wrapped() { return g_methods[kSlot]; }

// The group's integer dot: signed activations x signed (q - 8) or unsigned (q) codes.
template <bool kSigned, int C, int A, int B>
inline void dot() {
    if constexpr (kSigned) tiles::dpbssd<C, A, B>();
    else tiles::dpbsud<C, A, B>();
}

Int4Layout layout_of(int slot, const kt_moe_config* c) {
    return slot == kMx ? mxfp4_layout() : int4_layout(c, slot == kRaw);
}

// Codes of a whole panel as int8 B-tile rows: [K / 4][64]. kSigned: q - 8 (MXFP4: 2 value),
// else q in 0..15 (zero-point groups; MXFP4's are always symmetric).
template <bool kMx, bool kSigned>
void unpack_panel(const uint8_t* panel, int64_t k, const Int4Layout& lay, uint8_t* dst) {
    static_assert(kSigned || !kMx, "MXFP4 groups are symmetric: signed codes only");
    const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
    const __m512i doubled = _mm512_sub_epi8(   // 2 value, from the layout's 2 value + 12 table
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kt::layouts::mxfp4::kDoubledPlusOffset))),
        _mm512_set1_epi8(char(kt::layouts::mxfp4::kOffset)));
    const auto codes = [&](__m512i v) {
        if constexpr (kMx) return _mm512_shuffle_epi8(doubled, v);
        else if constexpr (kSigned) return _mm512_sub_epi8(v, eight);
        else return v;
    };
    const int64_t g = lay.g;
    for (int64_t grp = 0; grp < k / g; ++grp) {
        const uint8_t* chunks = panel + lay.group_at(grp) + lay.header_bytes();
        uint8_t* rows = dst + size_t(grp * g / 4) * 64;
        for (int64_t c = 0; c < g / 8; ++c) {
            const __m512i w = _mm512_loadu_si512(chunks + size_t(c) * kChunkBytes);
            _mm512_storeu_si512(rows + size_t(2 * c) * 64, codes(_mm512_and_si512(w, low4)));
            _mm512_storeu_si512(rows + size_t(2 * c + 1) * 64, codes(_mm512_and_si512(_mm512_srli_epi16(w, 4), low4)));
        }
    }
}

template <PairWrite kWrite, bool kSigned>
void panel_pair(tiles::Session& session, const uint8_t* act, int64_t rows, int64_t k, const Int4Layout& lay, const uint8_t* pa,
                const uint8_t* pb, const uint8_t* ua, const uint8_t* ub, bool two_pass, const PairOut& out) {
    const size_t row_bytes = int8_row_bytes(k);
    const int64_t g = lay.g;
    const int64_t step = std::min<int64_t>(g, 64), blocks_per_group = g / 32;
    alignas(64) int32_t c[4][16][16];
    alignas(64) float acc[2][16][16];
    const uint8_t* panel[2] = {pa, pb ? pb : pa};
    for (int64_t m0 = 0; m0 < rows; m0 += 16) {
        const int mr = int(std::min<int64_t>(16, rows - m0));
        session.use(tile_config(mr, int(step)));
        std::memset(acc, 0, sizeof acc);
        const uint8_t* x = act + size_t(m0) * row_bytes;
        const uint8_t* hi = int8_hi(x);
        const uint8_t* lo = int8_lo(x, k);
        for (int64_t grp = 0; grp < k / g; ++grp) {
            tiles::zero<0>();
            tiles::zero<1>();
            tiles::zero<2>();
            tiles::zero<3>();
            for (int64_t k0 = grp * g; k0 < (grp + 1) * g; k0 += step) {
                tiles::load<4>(hi + k0, row_bytes);
                tiles::load<6>(ua + size_t(k0) * 16, 64);
                dot<kSigned, 0, 4, 6>();
                if (ub) {
                    tiles::load<7>(ub + size_t(k0) * 16, 64);
                    dot<kSigned, 1, 4, 7>();
                }
                if (two_pass) {
                    tiles::load<5>(lo + k0, row_bytes);
                    dot<kSigned, 2, 5, 6>();
                    if (ub) dot<kSigned, 3, 5, 7>();
                }
            }
            tiles::store<0>(c[0], 64);
            tiles::store<2>(c[2], 64);
            if (ub) {
                tiles::store<1>(c[1], 64);
                tiles::store<3>(c[3], 64);
            }
            const size_t block = lay.group_at(grp);
            if constexpr (kSigned) {   // the tiles summed a (q - 8): the group's update is s * dot
                for (int f = 0; f < (ub ? 2 : 1); ++f) {
                    const VF s = lay.scale(panel[f] + block, 0);
                    for (int m = 0; m < mr; ++m)
                        vstore(acc[f][m], vfma(s, int4_raw_dot(vloadi(c[f][m]), two_pass ? vloadi(c[2 + f][m]) : vzeroi(), two_pass),
                                               vload(acc[f][m])));
                }
            } else {   // zero points: s * dot - s*z * (the row's activation sum over the group)
                for (int m = 0; m < mr; ++m) {
                    const uint8_t* row = x + size_t(m) * row_bytes;
                    int32_t sum_hi = 0, sum_lo = 0;
                    for (int64_t b = 0; b < blocks_per_group; ++b) {
                        sum_hi += int8_sums_hi(row, k)[grp * blocks_per_group + b];
                        sum_lo += int8_sums_lo(row, k)[grp * blocks_per_group + b];
                    }
                    const VF asum = vset1(int4_raw_sum(sum_hi, sum_lo, two_pass));
                    for (int f = 0; f < (ub ? 2 : 1); ++f) {
                        const VF dot = int4_raw_dot(vloadi(c[f][m]), two_pass ? vloadi(c[2 + f][m]) : vzeroi(), two_pass);
                        vstore(acc[f][m], lay.update(panel[f] + block, 0, vload(acc[f][m]), dot, asum));
                    }
                }
            }
        }
        for (int m = 0; m < mr; ++m) {
            const VF sa = vset1(int4_row_scale(reinterpret_cast<const Int8Header*>(x + size_t(m) * row_bytes)->scale, two_pass));
            out.row<kWrite>(m0 + m, vmul(vload(acc[0][m]), sa), vmul(vload(acc[1][m]), sa));
        }
    }
}

// One panel pair: unpacked (codes signed for symmetric groups), then every row block of it.
template <PairWrite kWrite, int kSlot, bool kSigned>
void run_pair(tiles::Session& session, const uint8_t* act, int64_t rows, int64_t k, const Int4Layout& lay,
              const uint8_t* pa, const uint8_t* pb, bool two_pass, const PairOut& out) {
    thread_local TileScratch<uint8_t> unpacked;
    uint8_t* ua = unpacked.get(size_t(2 * k) * 16);
    uint8_t* ub = pb ? ua + size_t(k) * 16 : nullptr;
    unpack_panel<kSlot == kMx, kSigned>(pa, k, lay, ua);
    if (pb) unpack_panel<kSlot == kMx, kSigned>(pb, k, lay, ub);
    panel_pair<kWrite, kSigned>(session, act, rows, k, lay, pa, pb, ua, ub, two_pass, out);
}

template <PairWrite kWrite, int kSlot, class Pairs>
void run_pairs(const kt_moe_config* c, const void* act, int64_t rows, int64_t k, Pairs&& for_pairs) {
    const Int4Layout lay = layout_of(kSlot, c);
    const bool two_pass = !one_activation_pass(c);
    tiles::Session session;
    for_pairs(lay.expert(c), [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        const auto* x = static_cast<const uint8_t*>(act);
        if constexpr (kSlot == kInt4 || kSlot == kGptq) {   // the formats that may carry zero points
            if (lay.zero_point) {
                run_pair<kWrite, kSlot, false>(session, x, rows, k, lay, pa, pb, two_pass, o);
                return;
            }
        }
        run_pair<kWrite, kSlot, true>(session, x, rows, k, lay, pa, pb, two_pass, o);
    });
}

// Gate/up on the tiles, fused (out_up == nullptr) or raw (PairOut).
template <PairWrite kWrite, int kSlot>
kt_status gate_up_pairs(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                        float* out, float* out_up, int64_t ldo) {
    if (const kt_status st = check_tile(g_methods[kSlot].avx.method, "gate/up", n0, n1, c->intermediate)) return st;
    const auto* base = static_cast<const uint8_t*>(packed);
    run_pairs<kWrite, kSlot>(c, act, rows, c->hidden, [&](const ExpertPanels& l, auto&& fn) {
        for_gate_up_pairs(l, base, n0, n1, out, out_up, ldo, fn);
    });
    return KT_OK;
}

template <int kSlot>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    const AmxMethod& method = g_methods[kSlot];
    if (!amx_takes(method, rows, c->intermediate)) return method.avx.down_tile(c, packed, act, rows, n0, n1, out, ldo);
    if (const kt_status st = check_tile(method.avx.method, "down", n0, n1, c->hidden)) return st;
    const auto* base = static_cast<const uint8_t*>(packed);
    run_pairs<PairWrite::kSideBySide, kSlot>(c, act, rows, c->intermediate, [&](const ExpertPanels& l, auto&& fn) {
        for_down_pairs(l, base, n0, n1, out, ldo, fn);
    });
    return KT_OK;
}

template <int kSlot>
int declines(const kt_moe_config* c, int64_t tokens) { return amx_declines(g_methods[kSlot], c, tokens); }

template <int kSlot>
kt_method_kernels wrap(const kt_method_kernels& avx, const char* kernel_id) {
    // Every supported group (32, 64, 128) divides K already (the packer insists); tiles step
    // min(G, 64) k at a time. Groups of 32 (RAWINT4, MXFP4) pay the group epilogue twice as often
    // and on half-depth tiles: their crossover is higher.
    g_methods[kSlot] = {avx, 32, kSlot == kRaw || kSlot == kMx ? 8 : 6};
    return amx_table(avx, kernel_id, declines<kSlot>, amx_gate_up<wrapped<kSlot>, gate_up_pairs<PairWrite::kGated, kSlot>>,
                     down<kSlot>, amx_gate_up_raw<wrapped<kSlot>, gate_up_pairs<PairWrite::kRaw, kSlot>>);
}

}  // namespace

kt_method_kernels amx_int4_kernels(const kt_method_kernels& avx, const char* kernel_id) { return wrap<kInt4>(avx, kernel_id); }
kt_method_kernels amx_rawint4_kernels(const kt_method_kernels& avx, const char* kernel_id) { return wrap<kRaw>(avx, kernel_id); }
kt_method_kernels amx_gptq_int4_kernels(const kt_method_kernels& avx, const char* kernel_id) { return wrap<kGptq>(avx, kernel_id); }
kt_method_kernels amx_mxfp4_kernels(const kt_method_kernels& avx, const char* kernel_id) { return wrap<kMx>(avx, kernel_id); }

}  // namespace KT_TARGET_NAMESPACE
