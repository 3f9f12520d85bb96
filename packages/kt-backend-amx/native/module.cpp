// kt_backend_amx._native: compiled for the baseline ISA. It hands out the table of its one
// variant when kt-core asks — and kt-core asks only when the host has the variant's features
// (for the hardware build: AMX in CPUID, tile state in XCR0 and the Linux permission granted).
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "targets.h"

namespace nb = nanobind;
using namespace nb::literals;

#if KT_AMX_EMULATE
namespace {
namespace tiles = KT_AMX_NAMESPACE::tiles;

// One tile instruction on the emulated tiles, for the tests of the emulation itself:
// C (m x c_colsb bytes) op= A (m x a_colsb) . B (a_colsb / 4 x c_colsb); returns C's bytes.
// The emulator is compiled for the baseline ISA, so this runs on any x86-64 host.
nb::bytes tile_dot(const std::string& op, nb::bytes a, nb::bytes b, nb::bytes c, int m, int a_colsb, int c_colsb) {
    if (m < 1 || m > 16 || a_colsb < 4 || a_colsb > 64 || a_colsb % 4 || c_colsb < 4 || c_colsb > 64 || c_colsb % 4)
        throw nb::value_error("tile_dot: m must be 1..16 and row bytes multiples of 4 in 4..64");
    const size_t b_rows = size_t(a_colsb / 4);
    if (a.size() != size_t(m * a_colsb) || b.size() != b_rows * size_t(c_colsb) || c.size() != size_t(m * c_colsb))
        throw nb::value_error("tile_dot: A must have m * a_colsb bytes, B a_colsb / 4 * c_colsb, C m * c_colsb");
    using Fn = void (*)(int, int, int);
    Fn fn = op == "tdpbssd"     ? static_cast<Fn>(tiles::dpbssd)
            : op == "tdpbsud"   ? static_cast<Fn>(tiles::dpbsud)
            : op == "tdpbusd"   ? static_cast<Fn>(tiles::dpbusd)
            : op == "tdpbuud"   ? static_cast<Fn>(tiles::dpbuud)
            : op == "tdpbf16ps" ? static_cast<Fn>(tiles::dpbf16ps)
                                : nullptr;
    if (!fn) throw nb::value_error(("tile_dot: unknown instruction '" + op + "'").c_str());
    tiles::Config cfg;
    tiles::shape(cfg, 0, m, c_colsb);
    tiles::shape(cfg, 1, m, a_colsb);
    tiles::shape(cfg, 2, int(b_rows), c_colsb);
    std::string out(size_t(m * c_colsb), '\0');
    tiles::load_config(cfg);
    tiles::load(0, c.c_str(), size_t(c_colsb));
    tiles::load(1, a.c_str(), size_t(a_colsb));
    tiles::load(2, b.c_str(), size_t(c_colsb));
    fn(0, 1, 2);
    tiles::store(0, out.data(), size_t(c_colsb));
    tiles::release();
    return nb::bytes(out.data(), out.size());
}
}  // namespace
#endif

NB_MODULE(_native, m) {
    m.doc() = "kt AMX backend: tile kernels for BF16, INT8, INT4, RAWINT4, FP8 and FP8_PERCHANNEL prefill";
    m.attr("EMULATED") = bool(KT_AMX_EMULATE);
    m.attr("VARIANT") = KT_AMX_VARIANT;
    m.def("backend_api", [](const std::string& variant) {
        if (variant != KT_AMX_VARIANT)
            throw nb::value_error(("this kt-backend-amx build has variant " KT_AMX_VARIANT "; asked for '" + variant + "'").c_str());
        return nb::capsule(static_cast<const void*>(KT_AMX_NAMESPACE::backend_api()), KT_BACKEND_CAPSULE_NAME);
    });
#if KT_AMX_EMULATE
    m.def("emulated_dot_instructions", &tiles::dot_instructions,
          "tile dot-product instructions the emulation has executed in this process (all threads)");
    m.def("tile_dot", &tile_dot, "op"_a, "a"_a, "b"_a, "c"_a, "m"_a, "a_colsb"_a, "c_colsb"_a);
#endif
}
