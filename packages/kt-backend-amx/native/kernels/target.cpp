// This target's backend table: kt-backend-avx's method tables (compiled into this module from
// the same sources, in this namespace) with the AMX tile kernels put in front of them. Built
// on first request, never at module load: nothing compiled with AMX or AVX-512 flags may run
// before kt-core has checked that the host (CPU, OS and the AMX permission) can execute it.
#include <cstdlib>

#include "amx_common.h"
#include "methods.h"

namespace KT_TARGET_NAMESPACE {

const kt_host_api* g_host = nullptr;
int64_t g_amx_min_rows = -1;   // no KT_AMX_MIN_ROWS: each method's measured crossover

namespace {

kt_status init(const kt_host_api* host) {
    g_host = host;
    g_amx_min_rows = -1;
    if (const char* v = std::getenv("KT_AMX_MIN_ROWS")) {
        char* end = nullptr;
        const long rows = std::strtol(v, &end, 10);
        if (end == v || *end || rows < 0 || rows > 1 << 20)
            return fail(KT_ERROR_INVALID_ARGUMENT,
                        "KT_AMX_MIN_ROWS must be an integer >= 0 (rows per expert; 0 = tiles for every batch), got '%s'", v);
        g_amx_min_rows = rows;
    }
    return KT_OK;
}

struct Tables {
    kt_method_kernels methods[8];
    kt_backend_api api;
};

Tables build() {
    Tables t{};
    t.methods[0] = amx_bf16_kernels(bf16_kernels("moe.bf16.p16k2.avx512bf16"), "moe.bf16.p16k2.tdpbf16ps." KT_TARGET_VARIANT);
    t.methods[1] = amx_int8_kernels(int8_kernels("moe.int8.p16k4.avx512vnni"), "moe.int8.p16k4.tdpbusd." KT_TARGET_VARIANT);
    t.methods[2] = amx_int4_kernels(int4_kernels("moe.int4g.p16k8.avx512vnni"), "moe.int4g.p16k8.tdpbssd." KT_TARGET_VARIANT);
    t.methods[3] = amx_rawint4_kernels(rawint4_kernels("moe.rawint4.p16k8.avx512vnni"),
                                       "moe.rawint4.p16k8.tdpbssd." KT_TARGET_VARIANT);
    t.methods[4] = amx_fp8_kernels(fp8_kernels("moe.fp8e4m3b128.p16.avx512bf16"), "moe.fp8e4m3b128.p16.tdpbf16ps." KT_TARGET_VARIANT);
    t.methods[5] = amx_fp8_perchannel_kernels(fp8_perchannel_kernels("moe.fp8e4m3ch.p16.avx512bf16"),
                                              "moe.fp8e4m3ch.p16.tdpbf16ps." KT_TARGET_VARIANT);
    t.methods[6] = amx_gptq_int4_kernels(gptq_int4_kernels("moe.gptq_int4.int4g.p16k8.avx512vnni"),
                                         "moe.gptq_int4.int4g.p16k8.tdpbssd." KT_TARGET_VARIANT);
    t.methods[7] = amx_mxfp4_kernels(mxfp4_kernels("moe.mxfp4.p16k8.lut.avx512vnni"), "moe.mxfp4.p16k8.tdpbssd." KT_TARGET_VARIANT);
    // Training's transposed tiles (ABI 1.5): on the tiles for the formats that have them (amx_transposed.cpp).
    for (kt_method_kernels& m : t.methods) add_amx_transposed_tiles(m);
    t.api = kt_backend_api{sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR, "amx", KT_TARGET_VARIANT,
                           KT_TARGET_FEATURES, init, sizeof(t.methods) / sizeof(t.methods[0]), nullptr};
    return t;
}

}  // namespace

const kt_backend_api* backend_api() {
    static Tables tables = build();
    tables.api.methods = tables.methods;
    return &tables.api;
}

}  // namespace KT_TARGET_NAMESPACE
