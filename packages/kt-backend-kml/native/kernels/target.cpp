// This target's backend table. Built on first request, never at module load: this file is
// compiled with the target's -march flags, and nothing of it may run before kt-core has checked
// that the host (HWCAP) can execute them.
#include "common.h"

#include <string>

namespace KT_TARGET_NAMESPACE {

const kt_host_api* g_host = nullptr;

namespace {

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

struct Tables {
    std::string ids[8];
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

// The SVE targets run every method through vector-length agnostic kernels where vectors are 256
// bits or wider (sve.h), through the NEON ones at 128 bits. The kernel ids say which, read on this CPU.
std::string vector_tag() {
#if defined(__ARM_FEATURE_SVE)
    switch (sve::parts()) {
    case 1: return "sve512.";
    case 2: return "sve256.";
    default: return "";
    }
#else
    return "";
#endif
}

void build(Tables& t) {
    const std::string v = vector_tag();
    const std::string bf16 = kBf16Dot ? "bfmmla+bfdot." : v.empty() ? "neon-fma." : "fma.";
    const std::string fp8 = v.empty() ? "fcvtl-fma." : "fcvt-fma.";
    t.ids[0] = "moe.bf16.p16k2." + v + bf16 + KT_TARGET_VARIANT;
    t.ids[1] = "moe.int8.p16k4." + v + KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT;
    t.ids[2] = "moe.int4g.p16k8." + v + KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT;
    t.ids[3] = "moe.rawint4.p16k8." + v + KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT;
    t.ids[4] = "moe.fp8.p16." + v + fp8 + KT_TARGET_VARIANT;
    t.ids[5] = "moe.fp8pc.p16." + v + fp8 + KT_TARGET_VARIANT;
    t.ids[6] = "moe.mxfp8.p16." + v + fp8 + KT_TARGET_VARIANT;
    t.ids[7] = "moe.ggml.p16." + v + KT_INT_PAIRS KT_INT8_DOT KT_TARGET_VARIANT;
    t.methods[0] = bf16_kernels(t.ids[0].c_str());
    t.methods[1] = int8_kernels(t.ids[1].c_str());
    t.methods[2] = int4_kernels(t.ids[2].c_str());
    t.methods[3] = rawint4_kernels(t.ids[3].c_str());
    t.methods[4] = fp8_kernels(t.ids[4].c_str());
    t.methods[5] = fp8_perchannel_kernels(t.ids[5].c_str());
    t.methods[6] = mxfp8_kernels(t.ids[6].c_str());
    t.methods[7] = llamafile_kernels(t.ids[7].c_str());
    t.api = kt_backend_api{sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR, "kml", KT_TARGET_VARIANT,
                           KT_TARGET_FEATURES, init, 8, t.methods};
}

}  // namespace

const kt_backend_api* backend_api() {
    static Tables tables;   // built in place: the method tables point into its id strings
    static const bool built = (build(tables), true);
    (void)built;
    return &tables.api;
}

}  // namespace KT_TARGET_NAMESPACE
