// AMX tile operations, written once for the kernels and compiled either to the hardware
// instructions or — in the emulation build (KT_AMX_EMULATE=1 at build time) — to a software
// model of the tile registers (emulated.cpp), so this machine's tests run the very kernels
// a Sapphire Rapids host runs.
//
// Tile numbers are template arguments because the instructions encode them as immediates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#if !KT_AMX_EMULATE
#include <immintrin.h>
#endif

namespace KT_TARGET_NAMESPACE::tiles {

// The 64-byte operand of ldtilecfg (palette 1): bytes per row and rows of each tile.
struct alignas(64) Config {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
static_assert(sizeof(Config) == 64, "ldtilecfg reads exactly 64 bytes");

// Sets tile t to `rows` rows of `colsb` bytes.
inline void shape(Config& c, int t, int rows, int colsb) {
    c.rows[t] = uint8_t(rows);
    c.colsb[t] = uint16_t(colsb);
}

#if KT_AMX_EMULATE
// Software model (emulated.cpp): one tile register file per thread, like the hardware's.
void load_config(const Config& c);          // ldtilecfg
void release();                             // tilerelease
void load(int t, const void* base, size_t stride);    // tileloadd
void store(int t, void* base, size_t stride);         // tilestored
void zero(int t);                                     // tilezero
void dpbssd(int c, int a, int b);   // int32 += s8 x s8, groups of 4
void dpbsud(int c, int a, int b);   // int32 += s8 (a) x u8 (b)
void dpbusd(int c, int a, int b);   // int32 += u8 (a) x s8 (b)
void dpbuud(int c, int a, int b);   // int32 += u8 x u8
void dpbf16ps(int c, int a, int b); // f32 += bf16 pairs
// Dot-product instructions executed so far, all threads: tests prove the tile path ran.
uint64_t dot_instructions();

template <int T> inline void load(const void* base, size_t stride) { load(T, base, stride); }
template <int T> inline void store(void* base, size_t stride) { store(T, base, stride); }
template <int T> inline void zero() { zero(T); }
template <int C, int A, int B> inline void dpbssd() { dpbssd(C, A, B); }
template <int C, int A, int B> inline void dpbsud() { dpbsud(C, A, B); }
template <int C, int A, int B> inline void dpbusd() { dpbusd(C, A, B); }
template <int C, int A, int B> inline void dpbf16ps() { dpbf16ps(C, A, B); }
#else
// GCC's tile intrinsics paste their tile numbers into the assembly text, so each number must be
// a literal: the templates below pick the literal instance. Kernels use C tiles 0-3, A tiles 4-5
// and B tiles 6-7 (amx_common.h), the only combinations instantiated here.
inline void load_config(const Config& c) { _tile_loadconfig(&c); }
inline void release() { _tile_release(); }

#define KT_TILE_EACH(STMT) \
    if constexpr (T == 0) STMT(0); \
    else if constexpr (T == 1) STMT(1); \
    else if constexpr (T == 2) STMT(2); \
    else if constexpr (T == 3) STMT(3); \
    else if constexpr (T == 4) STMT(4); \
    else if constexpr (T == 5) STMT(5); \
    else if constexpr (T == 6) STMT(6); \
    else STMT(7)
#define KT_TILE_DOT(OP) \
    static_assert(C >= 0 && C < 4 && (A == 4 || A == 5) && (B == 6 || B == 7), "tiles outside kt's C/A/B roles"); \
    if constexpr (C == 0 && A == 4 && B == 6) OP(0, 4, 6); \
    if constexpr (C == 0 && A == 4 && B == 7) OP(0, 4, 7); \
    if constexpr (C == 0 && A == 5 && B == 6) OP(0, 5, 6); \
    if constexpr (C == 0 && A == 5 && B == 7) OP(0, 5, 7); \
    if constexpr (C == 1 && A == 4 && B == 6) OP(1, 4, 6); \
    if constexpr (C == 1 && A == 4 && B == 7) OP(1, 4, 7); \
    if constexpr (C == 1 && A == 5 && B == 6) OP(1, 5, 6); \
    if constexpr (C == 1 && A == 5 && B == 7) OP(1, 5, 7); \
    if constexpr (C == 2 && A == 4 && B == 6) OP(2, 4, 6); \
    if constexpr (C == 2 && A == 4 && B == 7) OP(2, 4, 7); \
    if constexpr (C == 2 && A == 5 && B == 6) OP(2, 5, 6); \
    if constexpr (C == 2 && A == 5 && B == 7) OP(2, 5, 7); \
    if constexpr (C == 3 && A == 4 && B == 6) OP(3, 4, 6); \
    if constexpr (C == 3 && A == 4 && B == 7) OP(3, 4, 7); \
    if constexpr (C == 3 && A == 5 && B == 6) OP(3, 5, 6); \
    if constexpr (C == 3 && A == 5 && B == 7) OP(3, 5, 7);

template <int T> inline void load(const void* base, size_t stride) {
    static_assert(T >= 0 && T < 8);
#define KT_TILE_LOAD(t) _tile_loadd(t, base, stride)
    KT_TILE_EACH(KT_TILE_LOAD);
#undef KT_TILE_LOAD
}
template <int T> inline void store(void* base, size_t stride) {
    static_assert(T >= 0 && T < 8);
#define KT_TILE_STORE(t) _tile_stored(t, base, stride)
    KT_TILE_EACH(KT_TILE_STORE);
#undef KT_TILE_STORE
}
template <int T> inline void zero() {
    static_assert(T >= 0 && T < 8);
    KT_TILE_EACH(_tile_zero);
}
template <int C, int A, int B> inline void dpbssd() { KT_TILE_DOT(_tile_dpbssd); }
template <int C, int A, int B> inline void dpbsud() { KT_TILE_DOT(_tile_dpbsud); }
template <int C, int A, int B> inline void dpbusd() { KT_TILE_DOT(_tile_dpbusd); }
template <int C, int A, int B> inline void dpbf16ps() { KT_TILE_DOT(_tile_dpbf16ps); }
#undef KT_TILE_EACH
#undef KT_TILE_DOT
#endif

// Holds a tile configuration for the duration of one kernel call and releases the tile
// state after it. Configuring per call (not once per thread) is deliberate: the calling
// thread is shared with torch, whose oneDNN kernels configure tiles too.
class Session {
public:
    Session() = default;
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    ~Session() {
        if (active_) release();
    }
    // Loads `c` unless it is the configuration already loaded in this session.
    void use(const Config& c) {
        if (active_ && std::memcmp(&c, &current_, sizeof c) == 0) return;
        current_ = c;
        load_config(current_);
        active_ = true;
    }

private:
    Config current_;
    bool active_ = false;
};

}  // namespace KT_TARGET_NAMESPACE::tiles
