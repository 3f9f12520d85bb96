// kt_backend_kml._native: compiled for the aarch64 baseline. It hands out the table of the target
// kt-core asks for; kt-core asks only for targets whose features the host (HWCAP) reports.
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "targets.h"

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "kt aarch64 backend: NEON, dot-product, I8MM, BF16 and SVE expert kernels";
    m.def("backend_api", [](const std::string& variant) {
        std::string known;
        for (const auto& t : kTargets) {
            if (variant == t.variant) return nb::capsule(static_cast<const void*>(t.backend_api()), KT_BACKEND_CAPSULE_NAME);
            known += (known.empty() ? "" : ", ") + std::string(t.variant);
        }
        throw nb::value_error(("kt-backend-kml has variants " + known + "; asked for '" + variant + "'").c_str());
    });
}
