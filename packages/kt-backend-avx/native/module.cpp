// kt_backend_avx._native: compiled for the baseline ISA. It only hands out the table of the
// variant kt-core asks for — and kt-core asks only for variants whose features the host
// (CPU and OS) has, so no AVX2/AVX-512 instruction runs on a machine without it.
#include <kt/plugin.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "targets.h"

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "kt AVX backend: x86-64-v3, x86-64-v4 and x86-64-v4-vnni-bf16 expert kernels";
    m.def("backend_api", [](const std::string& variant) {
        const kt_backend_api* api = nullptr;
        if (variant == "x86-64-v3") api = kt_avx_x86_64_v3::backend_api();
        else if (variant == "x86-64-v4") api = kt_avx_x86_64_v4::backend_api();
        else if (variant == "x86-64-v4-vnni-bf16") api = kt_avx_x86_64_v4_vnni_bf16::backend_api();
        else
            throw nb::value_error(("kt-backend-avx has variants x86-64-v3, x86-64-v4, x86-64-v4-vnni-bf16; asked for '" +
                                   variant + "'").c_str());
        return nb::capsule(static_cast<const void*>(api), KT_BACKEND_CAPSULE_NAME);
    });
}
