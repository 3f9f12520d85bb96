// kt_backend_blis._native: compiled for the baseline ISA. It hands out the table of the target
// kt-core asks for (kt-core asks only for targets whose features the host has), holds the
// crossover the kernels' `declines` read, and says which BLIS it runs on.
#include <kt/plugin.h>

#include <blis.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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
    m.def("sgemm_seconds", [](int64_t m_, int64_t n, int64_t k, int repeats) {
        // BLIS alone, for benchmarks: the best of `repeats` single-threaded C = A . B at this size.
        if (m_ <= 0 || n <= 0 || k <= 0 || repeats <= 0) throw nb::value_error("m, n, k and repeats must be positive");
        std::vector<float> a(size_t(m_ * k), 0.01f), b(size_t(k * n), 0.02f), c(size_t(m_ * n));
        rntm_t rntm = BLIS_RNTM_INITIALIZER;
        bli_rntm_set_num_threads(1, &rntm);
        float one = 1.0f, zero = 0.0f;
        double best = 1e30;
        nb::gil_scoped_release release;
        for (int r = 0; r <= repeats; ++r) {   // the first call warms up
            const auto t0 = std::chrono::steady_clock::now();
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m_, n, k, &one, a.data(), k, 1, b.data(), n, 1, &zero,
                         c.data(), n, 1, nullptr, &rntm);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r) best = std::min(best, s);
        }
        return best;
    }, "m"_a, "n"_a, "k"_a, "repeats"_a = 3);
    m.def("blis_arch", [] { return std::string(bli_arch_string(bli_arch_query_id())); },
          "the sub-configuration (kernel set) BLIS chose for this CPU");
}
