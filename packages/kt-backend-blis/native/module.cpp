// kt_backend_blis._native: compiled for the baseline ISA. It hands out the table of the target
// kt-core asks for (kt-core asks only for targets whose features the host has), holds the
// crossover the kernels' `declines` read, and says which BLIS it runs on.
#include <kt/plugin.h>

#include <blis.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "crossover.h"
#include "targets.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kt_blis {
int64_t g_min_rows[kMethodCount] = {kNever, kNever, kNever, kNever, kNever, kNever, kNever, kNever};
}  // namespace kt_blis

namespace {

int method_index(const std::string& method) {
    for (int i = 0; i < kt_blis::kMethodCount; ++i)
        if (method == kt_blis::kMethodNames[i]) return i;
    std::string known;
    for (const char* m : kt_blis::kMethodNames) known += (known.empty() ? "" : ", ") + std::string(m);
    throw nb::value_error(("kt-backend-blis has no method '" + method + "'; it serves " + known).c_str());
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "kt BLIS backend: prefill through BLIS sgemm on kt-backend-avx's packed weights";
    m.def("backend_api", [](const std::string& variant) {
        for (const auto& t : kTargets)
            if (variant == t.variant) return nb::capsule(static_cast<const void*>(t.backend_api()), KT_BACKEND_CAPSULE_NAME);
        throw nb::value_error(("kt-backend-blis has no target '" + variant + "'").c_str());
    });
    m.def("set_min_rows", [](const std::string& method, int64_t rows) {
        if (rows < 0) throw nb::value_error("min rows per expert must be >= 0 (or None: never)");
        kt_blis::g_min_rows[method_index(method)] = rows;
    }, "method"_a, "rows"_a, "From how many rows per expert BLIS serves `method` (the crossover with kt-backend-avx).");
    m.def("set_never", [](const std::string& method) { kt_blis::g_min_rows[method_index(method)] = kt_blis::kNever; },
          "method"_a, "BLIS declines every batch of `method` (kt-backend-avx serves it).");
    m.def("min_rows", [](const std::string& method) -> nb::object {
        const int64_t r = kt_blis::g_min_rows[method_index(method)];
        if (r == kt_blis::kNever) return nb::none();
        return nb::int_(r);
    }, "method"_a);
    m.def("blis_version", [] { return std::string(bli_info_get_version_str()); });
    m.def("blis_arch", [] { return std::string(bli_arch_string(bli_arch_query_id())); },
          "the sub-configuration (kernel set) BLIS chose for this CPU");
}
