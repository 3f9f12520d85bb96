// Software AMX: the tile register file and the instructions kt's kernels use, following the
// Intel SDM's operation sections. Built only with KT_AMX_EMULATE=1 (tests and development on
// hosts without AMX); a hardware build never contains this file.
//
// Semantics kept exactly:
//  - ldtilecfg: palette 0 releases the state, palette 1 configures 8 tiles of at most 16 rows
//    x 64 bytes; every tile is zeroed. A configuration the hardware would fault on (#GP)
//    aborts with a message, as would executing a tile instruction before configuring.
//  - tileloadd: rows x colsb bytes from base + r * stride; bytes beyond colsb in a row and rows
//    beyond `rows` read as zero. tilestored writes rows x colsb bytes.
//  - tdpb[su][su]d: C.i32[m][n] += sum over k of the 4-byte dot product of A.row[m].dword[k]
//    and B.row[k].dword[n], in two's-complement int32 arithmetic (wraps, never saturates).
//  - tdpbf16ps: per row, two FP32 accumulators per output (even and odd bf16 of each pair)
//    start at zero and take fused multiply-adds over k with round-to-nearest-even, inputs
//    denormal-as-zero and outputs flushed to zero; their sum is then added to C (the SDM's
//    description since its 2023 revisions; MXCSR neither read nor written).
//  - Shape rules: A.colsb == 4 * B.rows, C.colsb == B.colsb, C.rows == A.rows; the rest of C
//    beyond its configured shape is zeroed.
#include "tiles.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace KT_TARGET_NAMESPACE::tiles {
namespace {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct RegisterFile {
    bool configured = false;
    uint8_t rows[kTiles] = {};
    uint16_t colsb[kTiles] = {};
    alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb] = {};
};

thread_local RegisterFile g_tiles;
std::atomic<uint64_t> g_dots{0};

[[noreturn]] void fault(const char* what) {
    std::fprintf(stderr, "kt-backend-amx tile emulation: %s\n", what);
    std::abort();
}

RegisterFile& configured() {
    if (!g_tiles.configured) fault("tile instruction executed before ldtilecfg (the hardware raises #UD)");
    return g_tiles;
}

void check_tile(const RegisterFile& f, int t) {
    if (t < 0 || t >= kTiles) fault("tile register number outside tmm0..tmm7");
    if (f.rows[t] == 0 || f.colsb[t] == 0) fault("tile used while configured with zero rows or columns (#UD)");
}

// The shape rules every dot-product instruction checks before it runs.
void check_dot(const RegisterFile& f, int c, int a, int b) {
    check_tile(f, c);
    check_tile(f, a);
    check_tile(f, b);
    if (f.colsb[a] % 4 || f.colsb[b] % 4 || f.colsb[c] % 4) fault("dot product on tiles whose row bytes are not a multiple of 4");
    if (f.colsb[a] != 4 * f.rows[b]) fault("dot product with A.colsb != 4 * B.rows");
    if (f.colsb[c] != f.colsb[b]) fault("dot product with C.colsb != B.colsb");
    if (f.rows[c] != f.rows[a]) fault("dot product with C.rows != A.rows");
}

// Zeroes what lies beyond the configured shape of tile t (the hardware's write_row_and_zero
// and zero_upper_rows).
void zero_outside(RegisterFile& f, int t) {
    for (int r = 0; r < kMaxRows; ++r)
        for (int col = r < f.rows[t] ? f.colsb[t] : 0; col < kMaxColsb; ++col) f.data[t][r][col] = 0;
}

template <bool kSignedA, bool kSignedB>
void int_dot(int c, int a, int b) {
    RegisterFile& f = configured();
    check_dot(f, c, a, b);
    g_dots.fetch_add(1, std::memory_order_relaxed);
    const int M = f.rows[c], N = f.colsb[c] / 4, K = f.colsb[a] / 4;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            uint32_t acc;
            std::memcpy(&acc, &f.data[c][m][4 * n], 4);
            for (int k = 0; k < K; ++k)
                for (int i = 0; i < 4; ++i) {
                    const uint8_t x = f.data[a][m][4 * k + i], y = f.data[b][k][4 * n + i];
                    const int32_t xv = kSignedA ? int32_t(int8_t(x)) : int32_t(x);
                    const int32_t yv = kSignedB ? int32_t(int8_t(y)) : int32_t(y);
                    acc += uint32_t(xv * yv);   // |product| <= 2^16: exact; the sum wraps mod 2^32
                }
            std::memcpy(&f.data[c][m][4 * n], &acc, 4);
        }
    zero_outside(f, c);
}

bool denormal(float x) { return x != 0.0f && std::fabs(x) < 1.17549435e-38f; }
float flush(float x) { return denormal(x) ? std::copysign(0.0f, x) : x; }

float bf16_at(const uint8_t* p) {
    const uint32_t bits = uint32_t(p[0]) << 16 | uint32_t(p[1]) << 24;
    float x;
    std::memcpy(&x, &bits, 4);
    return flush(x);   // DAZ
}

}  // namespace

void load_config(const Config& c) {
    if (c.palette == 0) {
        release();
        return;
    }
    if (c.palette != 1) fault("ldtilecfg with a palette other than 0 or 1 (#GP)");
    if (c.start_row != 0) fault("ldtilecfg with start_row != 0 (kt never restarts an interrupted tile load)");
    for (int b : c.reserved)
        if (b) fault("ldtilecfg with reserved bytes set (#GP)");
    for (int t = 0; t < 16; ++t) {
        const bool in_palette = t < kTiles;
        if (!in_palette && (c.rows[t] || c.colsb[t])) fault("ldtilecfg configures a tile beyond tmm7 (#GP)");
        if (in_palette && (c.rows[t] > kMaxRows || c.colsb[t] > kMaxColsb)) fault("ldtilecfg exceeds 16 rows x 64 bytes (#GP)");
        if (in_palette && ((c.rows[t] == 0) != (c.colsb[t] == 0))) fault("ldtilecfg gives a tile rows without columns (#GP)");
    }
    RegisterFile& f = g_tiles;
    f = RegisterFile{};
    f.configured = true;
    for (int t = 0; t < kTiles; ++t) {
        f.rows[t] = c.rows[t];
        f.colsb[t] = c.colsb[t];
    }
}

void release() { g_tiles = RegisterFile{}; }

uint64_t dot_instructions() { return g_dots.load(std::memory_order_relaxed); }

void load(int t, const void* base, size_t stride) {
    RegisterFile& f = configured();
    check_tile(f, t);
    const auto* src = static_cast<const uint8_t*>(base);
    for (int r = 0; r < f.rows[t]; ++r) std::memcpy(f.data[t][r], src + size_t(r) * stride, f.colsb[t]);
    zero_outside(f, t);
}

void store(int t, void* base, size_t stride) {
    RegisterFile& f = configured();
    check_tile(f, t);
    auto* dst = static_cast<uint8_t*>(base);
    for (int r = 0; r < f.rows[t]; ++r) std::memcpy(dst + size_t(r) * stride, f.data[t][r], f.colsb[t]);
}

void zero(int t) {
    RegisterFile& f = configured();
    check_tile(f, t);
    std::memset(f.data[t], 0, sizeof f.data[t]);
}

void dpbssd(int c, int a, int b) { int_dot<true, true>(c, a, b); }
void dpbsud(int c, int a, int b) { int_dot<true, false>(c, a, b); }
void dpbusd(int c, int a, int b) { int_dot<false, true>(c, a, b); }
void dpbuud(int c, int a, int b) { int_dot<false, false>(c, a, b); }

void dpbf16ps(int c, int a, int b) {
    RegisterFile& f = configured();
    check_dot(f, c, a, b);
    g_dots.fetch_add(1, std::memory_order_relaxed);
    const int M = f.rows[c], N = f.colsb[c] / 4, K = f.colsb[a] / 4;
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < K; ++k) {
                even = flush(std::fma(bf16_at(&f.data[a][m][4 * k]), bf16_at(&f.data[b][k][4 * n]), even));
                odd = flush(std::fma(bf16_at(&f.data[a][m][4 * k + 2]), bf16_at(&f.data[b][k][4 * n + 2]), odd));
            }
            float acc;
            std::memcpy(&acc, &f.data[c][m][4 * n], 4);
            acc = flush(flush(acc) + flush(even + odd));
            std::memcpy(&f.data[c][m][4 * n], &acc, 4);
        }
    zero_outside(f, c);
}

}  // namespace KT_TARGET_NAMESPACE::tiles
