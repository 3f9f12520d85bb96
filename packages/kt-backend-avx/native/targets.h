// The backend tables of the targets compiled into this module, one namespace each.
// Declared here with no ISA flags; defined in kernels/target.cpp compiled per target.
#pragma once
#include <kt/plugin.h>

namespace kt_avx_x86_64_v3 { const kt_backend_api* backend_api(); }
namespace kt_avx_x86_64_v4 { const kt_backend_api* backend_api(); }
namespace kt_avx_x86_64_v4_vnni_bf16 { const kt_backend_api* backend_api(); }
