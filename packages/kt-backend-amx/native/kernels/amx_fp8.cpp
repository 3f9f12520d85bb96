// FP8 (E4M3, 128x128 block scales) and FP8_PERCHANNEL on AMX-BF16, in AVX's FP8 layout
// (kt-backend-avx fp8_layout.h, "kt-fp8-p16-v2"): per panel of 16 channels, one f32[16] scale
// vector per 128-k block (2^8 folded in) and the codes in groups of four k rows; f32 activation
// rows.
//
// Per call, the rows are split once into bf16 hi + lo planes (f32-like accuracy) and each
// panel is converted once into bf16 B-tile rows by AVX's byte-table converter: E4M3 has 4
// significant bits, so the conversion is exact (value / 256). Per 16-row block and 128-k block,
// tdpbf16ps sums into C0/C1 (panel a/b); the block's scales apply on the stored sums.
#include <vector>

#include "amx_common.h"
#include "fp8_layout.h"

namespace KT_TARGET_NAMESPACE {
namespace {

AmxMethod g_methods[2];   // FP8, FP8_PERCHANNEL
// The table this file wraps, for amx_gate_up / amx_gate_up_raw.
template <int kSlot>
const AmxMethod& wrapped() { return g_methods[kSlot]; }

// A panel's codes as B-tile rows [K / 2][16] of bf16 (k, k + 1) pairs.
void decode_panel(const uint8_t* panel, int64_t k, uint32_t* dst) {
    static const E4M3Converter cv;
    widen_fp8_panel(cv, panel, k, dst);
}

// f32 rows -> bf16 hi and lo planes [rows][K]; has_lo[r] says whether row r needs the lo pass.
// one_pass (KT_QUANT_FAST_ACTIVATIONS): only the hi plane, every has_lo 0.
void split_rows(const uint8_t* act, int64_t rows, int64_t k, uint16_t* hi, uint16_t* lo, uint8_t* has_lo, bool one_pass) {
    const size_t row_bytes = f32_row_bytes(k);
    for (int64_t r = 0; r < rows; ++r) {
        const auto* x = reinterpret_cast<const float*>(act + size_t(r) * row_bytes);
        __m512i any = _mm512_setzero_si512();
        for (int64_t c = 0; c < k; c += 16) {   // k is a multiple of 32 on this path
            const __m512 v = _mm512_loadu_ps(x + c);
            const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * k + c), h);
            if (one_pass) continue;
            const __m256i l = (__m256i)bf16_lo(v, (__m256bh)h);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * k + c), l);
            any = _mm512_or_si512(any, _mm512_cvtepu16_epi32(_mm256_and_si256(l, _mm256_set1_epi16(0x7fff))));
        }
        has_lo[r] = _mm512_test_epi32_mask(any, any) != 0;
    }
}

template <PairWrite kWrite>
void panel_pair(tiles::Session& session, const uint16_t* hi, const uint16_t* lo, const uint8_t* has_lo, int64_t rows,
                int64_t k, const uint8_t* pa, const uint8_t* pb, const uint32_t* wa, const uint32_t* wb,
                const PairOut& out) {
    const size_t row_bytes = size_t(k) * 2;
    alignas(64) float c[2][16][16];
    alignas(64) float acc[2][16][16];
    const uint8_t* panel[2] = {pa, pb ? pb : pa};
    for (int64_t m0 = 0; m0 < rows; m0 += 16) {
        const int mr = int(std::min<int64_t>(16, rows - m0));
        session.use(tile_config(mr, 64));
        bool any_lo = false;
        for (int m = 0; m < mr; ++m) any_lo |= has_lo[m0 + m] != 0;
        std::memset(acc, 0, sizeof acc);
        for (int64_t kb = 0; kb < fp8_kblocks(k); ++kb) {
            tiles::zero<0>();
            tiles::zero<1>();
            for (int64_t k0 = kb * kFp8Block; k0 < std::min(k, (kb + 1) * kFp8Block); k0 += 32) {
                tiles::load<4>(hi + m0 * k + k0, row_bytes);
                tiles::load<6>(wa + k0 / 2 * kPanel, 64);
                tiles::dpbf16ps<0, 4, 6>();
                if (wb) {
                    tiles::load<7>(wb + k0 / 2 * kPanel, 64);
                    tiles::dpbf16ps<1, 4, 7>();
                }
                if (any_lo) {
                    tiles::load<5>(lo + m0 * k + k0, row_bytes);
                    tiles::dpbf16ps<0, 5, 6>();
                    if (wb) tiles::dpbf16ps<1, 5, 7>();
                }
            }
            tiles::store<0>(c[0], 64);
            if (wb) tiles::store<1>(c[1], 64);
            for (int f = 0; f < (wb ? 2 : 1); ++f) {
                const VF s = vload(reinterpret_cast<const float*>(panel[f] + size_t(kb) * kFp8ScaleBytes));
                for (int m = 0; m < mr; ++m) vstore(acc[f][m], vfma(vload(c[f][m]), s, vload(acc[f][m])));
            }
        }
        for (int m = 0; m < mr; ++m)
            out.row<kWrite>(m0 + m, vload(acc[0][m]), vload(acc[1][m]));
    }
}

// The per-call work both projections share: split the rows, then each panel pair.
struct Scratch {
    TileScratch<uint16_t> planes;
    std::vector<uint8_t> has_lo;
    TileScratch<uint32_t> weights;
};

// Gate/up on the tiles, fused (out_up == nullptr) or raw (PairOut).
template <PairWrite kWrite, int kSlot>
kt_status gate_up_pairs(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                        float* out, float* out_up, int64_t ldo) {
    const int64_t H = c->hidden;
    if (const kt_status st = check_tile(g_methods[kSlot].avx.method, "gate/up", n0, n1, c->intermediate)) return st;
    const ExpertPanels l = kFp8Geometry.expert(H, c->intermediate);
    const auto* base = static_cast<const uint8_t*>(packed);
    thread_local Scratch s;
    uint16_t* planes = s.planes.get(size_t(2 * rows * H));
    s.has_lo.resize(size_t(rows));
    split_rows(static_cast<const uint8_t*>(act), rows, H, planes, planes + rows * H, s.has_lo.data(), one_activation_pass(c));
    uint32_t* wa = s.weights.get(size_t(H) * kPanel);   // two panels of H / 2 pair rows x 16
    uint32_t* wb = wa + H / 2 * kPanel;
    tiles::Session session;
    for_gate_up_pairs(l, base, n0, n1, out, out_up, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        decode_panel(pa, H, wa);
        decode_panel(pb, H, wb);
        panel_pair<kWrite>(session, planes, planes + rows * H, s.has_lo.data(), rows, H, pa, pb, wa, wb, o);
    });
    return KT_OK;
}

template <int kSlot>
kt_status down(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ldo) {
    const AmxMethod& method = g_methods[kSlot];
    const int64_t I = c->intermediate;
    if (!amx_takes(method, rows, I)) return method.avx.down_tile(c, packed, act, rows, n0, n1, out, ldo);
    if (const kt_status st = check_tile(method.avx.method, "down", n0, n1, c->hidden)) return st;
    const ExpertPanels l = kFp8Geometry.expert(c->hidden, I);
    const auto* base = static_cast<const uint8_t*>(packed);
    thread_local Scratch s;
    uint16_t* planes = s.planes.get(size_t(2 * rows * I));
    s.has_lo.resize(size_t(rows));
    split_rows(static_cast<const uint8_t*>(act), rows, I, planes, planes + rows * I, s.has_lo.data(), one_activation_pass(c));
    uint32_t* wa = s.weights.get(size_t(I) * kPanel);   // two panels of I / 2 pair rows x 16
    uint32_t* wb = wa + I / 2 * kPanel;
    tiles::Session session;
    for_down_pairs(l, base, n0, n1, out, ldo, [&](const uint8_t* pa, const uint8_t* pb, const PairOut& o) {
        decode_panel(pa, I, wa);
        if (pb) decode_panel(pb, I, wb);
        panel_pair<PairWrite::kSideBySide>(session, planes, planes + rows * I, s.has_lo.data(), rows, I, pa, pb, wa,
                                           pb ? wb : nullptr, o);
    });
    return KT_OK;
}

template <int kSlot>
int declines(const kt_moe_config* c, int64_t tokens) { return amx_declines(g_methods[kSlot], c, tokens); }

template <int kSlot>
kt_method_kernels wrap(const kt_method_kernels& avx, const char* kernel_id) {
    g_methods[kSlot] = {avx, 32, 3};
    return amx_table(avx, kernel_id, declines<kSlot>, amx_gate_up<wrapped<kSlot>, gate_up_pairs<PairWrite::kGated, kSlot>>,
                     down<kSlot>, amx_gate_up_raw<wrapped<kSlot>, gate_up_pairs<PairWrite::kRaw, kSlot>>);
}

}  // namespace

kt_method_kernels amx_fp8_kernels(const kt_method_kernels& avx, const char* kernel_id) { return wrap<0>(avx, kernel_id); }
kt_method_kernels amx_fp8_perchannel_kernels(const kt_method_kernels& avx, const char* kernel_id) {
    return wrap<1>(avx, kernel_id);
}

}  // namespace KT_TARGET_NAMESPACE
