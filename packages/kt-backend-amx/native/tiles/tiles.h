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
inline void load_config(const Config& c) { _tile_loadconfig(&c); }
inline void release() { _tile_release(); }
template <int T> inline void load(const void* base, size_t stride) { _tile_loadd(T, base, stride); }
template <int T> inline void store(void* base, size_t stride) { _tile_stored(T, base, stride); }
template <int T> inline void zero() { _tile_zero(T); }
template <int C, int A, int B> inline void dpbssd() { _tile_dpbssd(C, A, B); }
template <int C, int A, int B> inline void dpbsud() { _tile_dpbsud(C, A, B); }
template <int C, int A, int B> inline void dpbusd() { _tile_dpbusd(C, A, B); }
template <int C, int A, int B> inline void dpbf16ps() { _tile_dpbf16ps(C, A, B); }
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
