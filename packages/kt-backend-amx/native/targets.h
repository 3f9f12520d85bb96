// The one AMX target this build holds: the hardware kernels (namespace kt_amx_sapphire_rapids)
// or, in the emulation build, the same kernels on the software tiles (kt_amx_emulated).
// Declared here with no ISA flags; defined in kernels/target.cpp compiled with them.
#pragma once
#include <kt/plugin.h>

#include <cstdint>

namespace KT_AMX_NAMESPACE {
const kt_backend_api* backend_api();
}  // namespace KT_AMX_NAMESPACE

#if KT_AMX_EMULATE
#include "tiles.h"
#endif
