// What the AMX kernels share. They wrap kt-backend-avx's method tables, compiled into this
// module from the same sources (CMakeLists.txt): the packers, layouts and activation
// quantizers are AVX's — so the packed bytes are identical by construction and a layer
// packed here can hand its decode batches to kt-backend-avx — and AVX-512's tile kernels
// keep the experts that get too few rows to fill a 16-row tile.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common.h"
#include "int_dot.h"
#include "tiles.h"

namespace KT_TARGET_NAMESPACE {

// Rows an expert needs before its tiles run on AMX: below it the AVX-512 kernels are faster,
// since a tile instruction costs the same for 1 row as for 16 and each panel's set-up (INT4's
// unpacking, FP8's widening) is paid whatever the rows. Each method's default is the crossover
// measured on a Sapphire Rapids-class host (2 cores, Qwen3-30B-A3B layer, amx vs avx on the same
// packed bytes: docs/performance.md, "AMX on silicon"). KT_AMX_MIN_ROWS (read at init)
// overrides every method; 0 sends every batch, however small, to the tiles (the tests use it
// to run the tile path on every shape). g_amx_min_rows < 0: no override.
extern int64_t g_amx_min_rows;

// The AMX wrapper of one AVX method table: same packer/quantizer, tile kernels replaced.
// `k_multiple`: the K (hidden and intermediate) the AMX kernels need a multiple of;
// `min_rows`: the method's measured crossover (above).
struct AmxMethod {
    kt_method_kernels avx;      // the wrapped table (small batches, packing, quantizing)
    int64_t k_multiple;
    int64_t min_rows;
};

inline int64_t min_rows(const AmxMethod& m) { return g_amx_min_rows >= 0 ? g_amx_min_rows : m.min_rows; }

// The layer-level decline: batches whose experts average fewer than min_rows rows go
// to the next variant with the same layout (kt-backend-avx) as a whole. Shapes whose K the
// tiles cannot step through are not declined: their experts take the AVX-512 kernels here.
inline bool amx_declines(const AmxMethod& m, const kt_moe_config* c, int64_t tokens) {
    return tokens * c->top_k < min_rows(m) * c->num_experts;
}

// Whether one expert's `rows` rows with this K run on tiles (else on the AVX-512 kernels).
inline bool amx_takes(const AmxMethod& m, int64_t rows, int64_t k) {
    return rows >= min_rows(m) && k % m.k_multiple == 0;
}

// A configuration of 16-row C and A tiles cut to `rows`, A rows of `a_colsb` bytes and
// B tiles of a_colsb / 4 rows x 64 bytes: tiles 0-3 accumulate (C), 4-5 hold activations
// (A), 6-7 weights (B) in every kernel here.
inline tiles::Config tile_config(int rows, int a_colsb) {
    tiles::Config c;
    for (int t = 0; t < 4; ++t) tiles::shape(c, t, rows, 64);
    for (int t = 4; t < 6; ++t) tiles::shape(c, t, rows, a_colsb);
    for (int t = 6; t < 8; ++t) tiles::shape(c, t, a_colsb / 4, 64);
    return c;
}

// How one panel pair's output rows are written: the gated activation of a and b (fused
// gate/up), a and b side by side (two neighbouring down panels), or a to one output and b to
// another (plugin ABI 1.4's raw gate/up tile: x·gateᵀ and x·upᵀ, which training and expert biases
// take before any activation).
enum class PairWrite { kGated, kSideBySide, kRaw };

// Where the rows of one panel pair go: row m at a + m * ldo (and at b + m * ldo for kRaw);
// cols_b = 0 when a down tile ends after panel a.
struct PairOut {
    float* a;
    float* b;
    int64_t ldo;
    int cols_a, cols_b;

    template <PairWrite kWrite>
    void row(int64_t m, VF va, VF vb) const {
        float* o = a + m * ldo;
        if constexpr (kWrite == PairWrite::kGated) {
            vstore_partial(o, gate_mul(va, vb), cols_a);
        } else if constexpr (kWrite == PairWrite::kRaw) {
            vstore_partial(o, va, cols_a);
            vstore_partial(b + m * ldo, vb, cols_a);
        } else {
            vstore_partial(o, va, cols_a);
            if (cols_b > 0) vstore_partial(o + kPanel, vb, cols_b);
        }
    }
};

// The panel pairs of one tile [n0, n1), as every kernel here walks them: fn(pa, pb, out).
// gate/up: pa = gate panel, pb = up panel of the same 16 channels. Fused (out_up == nullptr):
// column n at out[n]; raw: tile-local, x·gateᵀ at out[n - n0] and x·upᵀ at out_up[n - n0].
template <class Fn>
void for_gate_up_pairs(const ExpertPanels& l, const uint8_t* base, int64_t n0, int64_t n1, float* out, float* out_up,
                       int64_t ldo, Fn&& fn) {
    for (int64_t n = n0; n < n1; n += kPanel) {
        const int cols = int(std::min<int64_t>(kPanel, n1 - n));
        const PairOut o = out_up ? PairOut{out + (n - n0), out_up + (n - n0), ldo, cols, cols} : PairOut{out + n, nullptr, ldo, cols, 0};
        fn(base + l.gate(n / kPanel), base + l.up(n / kPanel), o);
    }
}
// down: two neighbouring panels; pb = nullptr when the tile ends after pa.
template <class Fn>
void for_down_pairs(const ExpertPanels& l, const uint8_t* base, int64_t n0, int64_t n1, float* out, int64_t ldo, Fn&& fn) {
    for (int64_t n = n0; n < n1; n += 2 * kPanel) {
        const int cols_a = int(std::min<int64_t>(kPanel, n1 - n));
        const int cols_b = int(std::clamp<int64_t>(n1 - n - kPanel, 0, kPanel));
        fn(base + l.down(n / kPanel), cols_b ? base + l.down(n / kPanel + 1) : nullptr, PairOut{out + n, nullptr, ldo, cols_a, cols_b});
    }
}

// The lo plane of split bf16 (v = hi + lo to 16 significant bits): lo = bf16(v - hi).
inline __m256bh bf16_lo(__m512 v, __m256bh hi) {
    return _mm512_cvtneps_pbh(_mm512_sub_ps(v, bf16_even(_mm512_cvtepu16_epi32((__m256i)hi))));
}

// Scratch the tiles load from (unpacked or widened panels, split activation rows): 64-byte
// aligned, since a tile row that straddles two cache lines makes tileloadd ~6x slower (measured
// on a Xeon with AMX: 15 ns against 2.3 ns per 1 KiB tile, benchmarks/amx_tile_probe.cpp), and
// std::vector promises 16 bytes
// (large blocks come from mmap at 16 mod 64).
template <class T>
class TileScratch {
public:
    // n elements, 64-byte aligned; the contents are unspecified.
    T* get(size_t n) {
        if (raw_.size() < n * sizeof(T) + 64) raw_.resize(n * sizeof(T) + 64);
        return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw_.data()) + 63) & ~uintptr_t(63));
    }

private:
    std::vector<uint8_t> raw_;
};

using DeclinesFn = int (*)(const kt_moe_config*, int64_t);

// A method's gate/up on the tiles, fused (out_up == nullptr) or raw: gate_up_pairs<PairWrite>.
using GateUpPairsFn = kt_status (*)(const kt_moe_config*, const void* packed, const void* act, int64_t rows, int64_t n0,
                                   int64_t n1, float* out, float* out_up, int64_t ldo);

// The fused (gate_up_tile) and raw (gate_up_raw_tile) entries of a method whose AmxMethod
// kMethod() returns: experts below the crossover take avx's kernels, the rest kTiles.
template <const AmxMethod& (*kMethod)(), GateUpPairsFn kTiles>
kt_status amx_gate_up(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                      float* out, int64_t ldo) {
    const GateScope activation(c);   // the layer's gated activation, for PairOut::row
    const AmxMethod& m = kMethod();
    if (!amx_takes(m, rows, c->hidden)) return m.avx.gate_up_tile(c, packed, act, rows, n0, n1, out, ldo);
    return kTiles(c, packed, act, rows, n0, n1, out, nullptr, ldo);
}
template <const AmxMethod& (*kMethod)(), GateUpPairsFn kTiles>
kt_status amx_gate_up_raw(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                          float* out_gate, float* out_up, int64_t ldo) {
    const AmxMethod& m = kMethod();
    if (!amx_takes(m, rows, c->hidden)) return m.avx.gate_up_raw_tile(c, packed, act, rows, n0, n1, out_gate, out_up, ldo);
    return kTiles(c, packed, act, rows, n0, n1, out_gate, out_up, ldo);
}

// `avx`'s table with its tile kernels replaced: packer, quantizer and layout stay. Down tiles
// take panel pairs, so the core hands them 32 columns at a time. The raw gate/up tile replaces
// avx's where avx has one (its small batches still go there).
inline kt_method_kernels amx_table(const kt_method_kernels& avx, const char* kernel_id, DeclinesFn declines,
                                   TileFn gate_up, TileFn down, RawTileFn gate_up_raw) {
    kt_method_kernels m = avx;
    m.kernel_id = kernel_id;
    m.declines = declines;
    m.gate_up_tile = gate_up;
    m.down_tile = down;
    m.gate_up_raw_tile = avx.gate_up_raw_tile ? gate_up_raw : nullptr;
    m.down_block = 2 * kPanel;
    return m;
}

kt_method_kernels amx_int8_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_int4_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_rawint4_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_gptq_int4_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_mxfp4_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_bf16_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_fp8_kernels(const kt_method_kernels& avx, const char* kernel_id);
kt_method_kernels amx_fp8_perchannel_kernels(const kt_method_kernels& avx, const char* kernel_id);
// Plugin ABI 1.5's transposed tiles on AMX-BF16 where avx has them (BF16, INT8, INT4, RAWINT4,
// GPTQ_INT4), avx's kernels behind them for small experts (amx_transposed.cpp).
void add_amx_transposed_tiles(kt_method_kernels& m);

}  // namespace KT_TARGET_NAMESPACE
