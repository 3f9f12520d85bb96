// BF16 on AMX-BF16, in AVX's BF16 format (kt-backend-avx bf16.cpp): layout
// "kt-bf16-p16k2-v1" (kt/formats/packed_layouts.h), whose 64-byte chunks (16 channels x a (k, k+1) bf16 pair) are exactly
// the rows of an AMX B tile, and split-bf16 activations x = hi + lo (f32-like accuracy; a
// row block whose rows were bf16 already has no lo plane and costs one pass, and so does every
// block of a layer with KT_QUANT_FAST_ACTIVATIONS: bf16 activations, as in kt-backend-avx).
//
// Per 16-row block and panel pair: C0/C1 accumulate panel a/b in f32 over both planes,
// A4/A5 = the hi/lo rows, B6/B7 = the panels; 32 k per step.
#include "amx_common.h"

namespace KT_TARGET_NAMESPACE {
namespace {

AmxMethod g_bf16;
// The table this file wraps, for amx_gate_up / amx_gate_up_raw.
const AmxMethod& wrapped() { return g_bf16; }

ExpertPanels layout(const kt_moe_config* c) { return kt::layouts::bf16::expert(c->hidden, c->intermediate); }

template <PairWrite kWrite>
void panel_pair(tiles::Session& session, const uint8_t* act, int64_t rows, int64_t k, const uint8_t* pa,
                const uint8_t* pb, const PairOut& out, bool one_pass) {
    const size_t row_bytes = split_bf16_row_bytes(k), lo_offset = size_t(round_up(k, 2)) * 2;
    alignas(64) float c[2][16][16];
    for (int64_t m0 = 0; m0 < rows; m0 += 16) {
        const int mr = int(std::min<int64_t>(16, rows - m0));
        session.use(tile_config(mr, 64));
        const uint8_t* x = act + size_t(m0) * row_bytes;
        bool any_lo = false;
        for (int m = 0; m < mr && !one_pass; ++m) any_lo |= reinterpret_cast<const SplitBf16Header*>(x + size_t(m) * row_bytes)->has_lo != 0;
        const uint8_t* hi = x + sizeof(SplitBf16Header);
        tiles::zero<0>();
        tiles::zero<1>();
        for (int64_t k0 = 0; k0 < k; k0 += 32) {
            tiles::load<4>(hi + size_t(k0) * 2, row_bytes);
            tiles::load<6>(pa + size_t(k0) * 32, 64);
            tiles::dpbf16ps<0, 4, 6>();
            if (pb) {
                tiles::load<7>(pb + size_t(k0) * 32, 64);
                tiles::dpbf16ps<1, 4, 7>();
            }
            if (any_lo) {
                tiles::load<5>(hi + lo_offset + size_t(k0) * 2, row_bytes);
                tiles::dpbf16ps<0, 5, 6>();
                if (pb) tiles::dpbf16ps<1, 5, 7>();
            }
        }
        tiles::store<0>(c[0], 64);
        if (pb) tiles::store<1>(c[1], 64);
        for (int m = 0; m < mr; ++m)
            out.row<kWrite>(m0 + m, vload(c[0][m]), pb ? vload(c[1][m]) : vzero());
    }
}

// Gate/up on the tiles, fused (out_up == nullptr) or raw (PairOut).
template <PairWrite kWrite>
kt_status gate_up_pairs(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                        float* out, float* out_up, int64_t ldo) {
    if (const kt_status st = check_tile("BF16", "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    tiles::Session session;
    for_gate_up_pairs(l, base, n0, n1, out, out_up, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        panel_pair<kWrite>(session, static_cast<const uint8_t*>(act), rows, c->hidden, pa, pb, o, one_activation_pass(c));
    });
    return KT_OK;
}

kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    if (!amx_takes(g_bf16, rows, c->intermediate)) return g_bf16.avx.down_tile(c, packed, act, rows, n0, n1, out, ldo);
    if (const kt_status st = check_tile("BF16", "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    tiles::Session session;
    for_down_pairs(l, base, n0, n1, out, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        panel_pair<PairWrite::kSideBySide>(session, static_cast<const uint8_t*>(act), rows, c->intermediate, pa, pb, o,
                                           one_activation_pass(c));
    });
    return KT_OK;
}

int declines(const kt_moe_config* c, int64_t tokens) { return amx_declines(g_bf16, c, tokens); }

}  // namespace

kt_method_kernels amx_bf16_kernels(const kt_method_kernels& avx, const char* kernel_id) {
    g_bf16 = {avx, 32, 2};
    return amx_table(avx, kernel_id, declines, amx_gate_up<wrapped, gate_up_pairs<PairWrite::kGated>>, down,
                     amx_gate_up_raw<wrapped, gate_up_pairs<PairWrite::kRaw>>);
}

}  // namespace KT_TARGET_NAMESPACE
