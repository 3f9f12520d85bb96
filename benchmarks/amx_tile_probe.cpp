// What the AMX tile unit of this host sustains, as bounds for kt-backend-amx's kernels: the
// tdpbusd rate with operands already in tiles, the cost of a 1 KiB tileloadd from 64-byte-aligned
// and from misaligned rows, and the 2x2 step every kt tile kernel runs (two A tiles, two B tiles,
// four C tiles: 4 loads per 4 dot products) with its operands in L1, L2 and beyond.
//
//   g++ -O2 -mamx-tile -mamx-int8 benchmarks/amx_tile_probe.cpp -o /tmp/amx_tile_probe && /tmp/amx_tile_probe
//
// Exits 0 with a message where the CPU or the kernel gives no AMX. Single-threaded; run it on a
// quiet core (docs/performance.md, "AMX on silicon against kt-kernel's AMX", has one host's output).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr double kMacsPerDot = 16.0 * 16 * 64;   // one tdpbusd on full 16 x 64-byte tiles

// ns per tdpbusd of the 2x2 step over `span` bytes starting at `base` (A and B tiles contiguous).
double two_by_two(const uint8_t* base, size_t span, long steps) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    size_t off = 0;
    const double t0 = seconds();
    for (long i = 0; i < steps; ++i) {
        const uint8_t* p = base + off;
        _tile_loadd(4, p, 64);
        _tile_loadd(6, p + 1024, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_loadd(7, p + 2048, 64);
        _tile_dpbusd(1, 4, 7);
        _tile_loadd(5, p + 3072, 64);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
        off = off + 8192 > span ? 0 : off + 4096;
    }
    return (seconds() - t0) / (4.0 * double(steps)) * 1e9;
}

}  // namespace

int main() {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) {
        std::puts("no AMX here: the CPU lacks amx-tile / amx-int8");
        return 0;
    }
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
        std::puts("no AMX here: the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)");
        return 0;
    }
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const size_t bytes = size_t(64) << 20;
    auto* buf = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
    std::memset(buf, 1, bytes);

    const long n = 2000000;
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    double t0 = seconds();
    for (long i = 0; i < n; ++i) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    double ns = (seconds() - t0) / (4.0 * n) * 1e9;
    std::printf("tdpbusd, operands in tiles:        %6.2f ns each, %5.0f GMAC/s\n", ns, kMacsPerDot / ns);

    for (int skew : {0, 16}) {
        const uint8_t* p = buf + skew;
        t0 = seconds();
        for (long i = 0; i < n / 4; ++i) {
            _tile_loadd(4, p, 64);
            _tile_loadd(5, p + 1024, 64);
            _tile_loadd(6, p + 2048, 64);
            _tile_loadd(7, p + 3072, 64);
        }
        ns = (seconds() - t0) / double(n) * 1e9;
        std::printf("tileloadd 1 KiB from L1, rows %s: %6.2f ns each\n", skew ? "16 mod 64" : "64-aligned", ns);
    }
    for (size_t span : {size_t(16) << 10, size_t(256) << 10, size_t(1536) << 10, size_t(32) << 20}) {
        ns = two_by_two(buf, span, n / 4);
        std::printf("2x2 step (4 loads, 4 dots), operands over %6zu KiB: %6.2f ns per dot, %5.0f GMAC/s\n", span >> 10, ns,
                    kMacsPerDot / ns);
    }
    ns = two_by_two(buf + 16, size_t(16) << 10, n / 4);
    std::printf("2x2 step over 16 KiB, rows 16 mod 64:      %6.2f ns per dot, %5.0f GMAC/s\n", ns, kMacsPerDot / ns);
    _tile_release();
    std::free(buf);
    return 0;
}
