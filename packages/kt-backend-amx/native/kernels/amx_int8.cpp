// INT8 on AMX-INT8, in AVX's INT8 format (kt-backend-avx int8.cpp): layout
// "kt-int8-p16k4-v1" (kt/formats/packed_layouts.h), whose 64-byte chunks (16 channels x 4 consecutive k) are exactly the
// rows of an AMX B tile, and two-pass int8 activations stored + 128 — VNNI's unsigned
// operand, which tdpbusd takes as it is; the panel header's comp = 128 * sum(w) takes the
// offset back out, as on AVX-512.
//
// Per 16-row block of one expert and one panel pair: C0/C1 = hi plane x panel a/b, C2/C3 =
// lo plane x panel a/b, A4/A5 = the hi/lo rows, B6/B7 = the panels; 64 k per step. A panel
// pair is (gate, up) for the fused kernel, two neighbouring down panels otherwise. Panels are
// the outer loop, so a panel pair stays in L2 while every row block of the expert uses it.
#include <vector>

#include "amx_common.h"

namespace KT_TARGET_NAMESPACE {
namespace {

constexpr size_t kHeaderBytes = kt::layouts::int8::kHeaderBytes;
AmxMethod g_int8;
// The table this file wraps, for amx_gate_up / amx_gate_up_raw.
const AmxMethod& wrapped() { return g_int8; }

ExpertPanels layout(const kt_moe_config* c) { return kt::layouts::int8::expert(c->hidden, c->intermediate); }

template <PairWrite kWrite>
void panel_pair(tiles::Session& session, const uint8_t* act, int64_t rows, int64_t k, const uint8_t* pa,
                const uint8_t* pb, bool two_pass, const PairOut& out) {
    const size_t row_bytes = int8_row_bytes(k);
    alignas(64) int32_t c[4][16][16];
    const uint8_t* wa = pa + kHeaderBytes;
    const uint8_t* wb = pb ? pb + kHeaderBytes : nullptr;
    const int panels = wb ? 2 : 1;
    for (int64_t m0 = 0; m0 < rows; m0 += 16) {
        const int mr = int(std::min<int64_t>(16, rows - m0));
        session.use(tile_config(mr, 64));
        tiles::zero<0>();
        tiles::zero<1>();
        tiles::zero<2>();
        tiles::zero<3>();
        const uint8_t* x = act + size_t(m0) * row_bytes;
        const uint8_t* hi = int8_hi(x);
        const uint8_t* lo = int8_lo(x, k);
        for (int64_t k0 = 0; k0 < k; k0 += 64) {
            tiles::load<4>(hi + k0, row_bytes);
            tiles::load<6>(wa + size_t(k0) * 16, 64);
            tiles::dpbusd<0, 4, 6>();
            if (wb) {
                tiles::load<7>(wb + size_t(k0) * 16, 64);
                tiles::dpbusd<1, 4, 7>();
            }
            if (two_pass) {
                tiles::load<5>(lo + k0, row_bytes);
                tiles::dpbusd<2, 5, 6>();
                if (wb) tiles::dpbusd<3, 5, 7>();
            }
        }
        // Only the tiles this block filled are stored and read (a 4 KiB memset of all four per
        // row block was ~10 % of the kernel's samples).
        tiles::store<0>(c[0], 64);
        if (wb) tiles::store<1>(c[1], 64);
        if (two_pass) {
            tiles::store<2>(c[2], 64);
            if (wb) tiles::store<3>(c[3], 64);
        }
        const uint8_t* headers[2] = {pa, pb};
        for (int m = 0; m < mr; ++m) {
            const float sa = reinterpret_cast<const Int8Header*>(x + size_t(m) * row_bytes)->scale;
            VF r[2] = {vzero(), vzero()};
            for (int f = 0; f < panels; ++f) {
                const VI comp = vloadi(headers[f] + 64);
                const VF h = vcvt(vsubi(vloadi(c[f][m]), comp));
                const VF dot = two_pass ? vfma(vcvt(vsubi(vloadi(c[2 + f][m]), comp)), vset1(1.0f / 128.0f), h) : h;
                r[f] = vmul(dot, vmul(vload(reinterpret_cast<const float*>(headers[f])), vset1(sa)));
            }
            out.row<kWrite>(m0 + m, r[0], r[1]);
        }
    }
}

// Gate/up on the tiles, fused (out_up == nullptr) or raw (PairOut).
template <PairWrite kWrite>
kt_status gate_up_pairs(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                        float* out, float* out_up, int64_t ldo) {
    if (const kt_status st = check_tile("INT8", "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    const bool two_pass = !one_activation_pass(c);
    tiles::Session session;
    for_gate_up_pairs(l, base, n0, n1, out, out_up, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        panel_pair<kWrite>(session, static_cast<const uint8_t*>(act), rows, c->hidden, pa, pb, two_pass, o);
    });
    return KT_OK;
}

kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    if (!amx_takes(g_int8, rows, c->intermediate)) return g_int8.avx.down_tile(c, packed, act, rows, n0, n1, out, ldo);
    if (const kt_status st = check_tile("INT8", "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = layout(c);
    const auto* base = static_cast<const uint8_t*>(packed);
    const bool two_pass = !one_activation_pass(c);
    tiles::Session session;
    for_down_pairs(l, base, n0, n1, out, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        panel_pair<PairWrite::kSideBySide>(session, static_cast<const uint8_t*>(act), rows, c->intermediate, pa, pb, two_pass, o);
    });
    return KT_OK;
}

int declines(const kt_moe_config* c, int64_t tokens) { return amx_declines(g_int8, c, tokens); }

}  // namespace

kt_method_kernels amx_int8_kernels(const kt_method_kernels& avx, const char* kernel_id) {
    g_int8 = {avx, 64, 3};
    return amx_table(avx, kernel_id, declines, amx_gate_up<wrapped, gate_up_pairs<PairWrite::kGated>>, down,
                     amx_gate_up_raw<wrapped, gate_up_pairs<PairWrite::kRaw>>);
}

}  // namespace KT_TARGET_NAMESPACE
