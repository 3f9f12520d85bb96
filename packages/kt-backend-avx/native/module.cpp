// kt_backend_avx._native: compiled for the baseline ISA. It only hands out the table of the
// variant kt-core asks for — and kt-core asks only for variants whose features the host
// (CPU and OS) has, so no AVX2/AVX-512 instruction runs on a machine without it.
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "targets.h"   // generated from targets.json

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "kt AVX backend: the x86 expert kernels of every target in targets.json";
    m.def("backend_api", [](const std::string& variant) {
        std::string known;
        for (const KtTarget& t : kTargets) {
            if (variant == t.variant) return nb::capsule(static_cast<const void*>(t.backend_api()), KT_BACKEND_CAPSULE_NAME);
            known += (known.empty() ? "" : ", ") + std::string(t.variant);
        }
        throw nb::value_error(("kt-backend-avx has variants " + known + "; asked for '" + variant + "'").c_str());
    });
}
