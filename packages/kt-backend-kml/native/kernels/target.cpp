// This target's backend table. Built on first request, never at module load: this file is
// compiled with the target's -march flags, and nothing of it may run before kt-core has checked
// that the host (HWCAP) can execute them.
#include "common.h"

namespace KT_TARGET_NAMESPACE {

const kt_host_api* g_host = nullptr;

namespace {

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

struct Tables {
    kt_method_kernels methods[8];
    kt_backend_api api;
};

#if defined(__ARM_FEATURE_DOTPROD)
#define KT_INT8_DOT "sdot."
#else
#define KT_INT8_DOT "smull."
#endif

// INT8, INT4 and LLAMAFILE take two rows at a time through `smmla` where the target has I8MM (prefill), the
// kernel above for a single row.
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define KT_INT_PAIRS "smmla+"
#else
#define KT_INT_PAIRS ""
#endif

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define KT_BF16_DOT "bfmmla+bfdot."
#else
#define KT_BF16_DOT "neon-fma."
#endif

Tables build() {
    Tables t{};
    t.methods[0] = bf16_kernels("moe.bf16.p16k2." KT_BF16_DOT KT_TARGET_VARIANT);
    t.methods[1] = int8_kernels("moe.int8.p16k4." KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT);
    t.methods[2] = int4_kernels("moe.int4g.p16k8." KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT);
    t.methods[3] = rawint4_kernels("moe.rawint4.p16k8." KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT);
    t.methods[4] = fp8_kernels("moe.fp8.p16.fcvtl-fma." KT_TARGET_VARIANT);
    t.methods[5] = fp8_perchannel_kernels("moe.fp8pc.p16.fcvtl-fma." KT_TARGET_VARIANT);
    t.methods[6] = mxfp8_kernels("moe.mxfp8.p16.fcvtl-fma." KT_TARGET_VARIANT);
    t.methods[7] = llamafile_kernels("moe.ggml.p16." KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT);
    t.api = kt_backend_api{sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR, "kml", KT_TARGET_VARIANT,
                           KT_TARGET_FEATURES, init, 8, nullptr};
    return t;
}

}  // namespace

const kt_backend_api* backend_api() {
    static Tables tables = build();
    tables.api.methods = tables.methods;
    return &tables.api;
}

}  // namespace KT_TARGET_NAMESPACE
