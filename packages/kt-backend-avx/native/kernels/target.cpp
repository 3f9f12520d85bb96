// This target's backend table. Built on first request, never at module load: this file is
// compiled with the target's ISA flags, and nothing of it may run before kt-core has
// checked that the host can execute them.
#include "methods.h"

// FP8's inner product: byte-table E4M3 -> bf16 and vdpbf16ps where AVX512_BF16 exists, else F16C + FMA.
#if defined(__AVX512BF16__)
#define KT_FP8_KERNEL "bf16lut."
#else
#define KT_FP8_KERNEL "f16c."
#endif

#define KT_STR2(x) #x
#define KT_STR(x) KT_STR2(x)

namespace KT_TARGET_NAMESPACE {

const kt_host_api* g_host = nullptr;

namespace {

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

struct Tables {
    kt_method_kernels methods[11];
    kt_backend_api api;
};

Tables build() {
    Tables t{};
    t.methods[0] = bf16_kernels("moe.bf16.p16k2." KT_TARGET_VARIANT);
    t.methods[1] = int8_kernels("moe.int8.p16k4." KT_TARGET_VARIANT);
    t.methods[2] = int4_kernels("moe.int4g.p16k8." KT_TARGET_VARIANT);
    t.methods[3] = rawint4_kernels("moe.rawint4.p16k8." KT_TARGET_VARIANT);
    t.methods[4] = fp8_kernels("moe.fp8e4m3b128.p16." KT_FP8_KERNEL KT_TARGET_VARIANT);
    t.methods[5] = fp8_perchannel_kernels("moe.fp8e4m3ch.p16." KT_FP8_KERNEL KT_TARGET_VARIANT);
    t.methods[6] = llamafile_kernels("moe.ggml.rows-panels.i8x2." KT_TARGET_VARIANT);
    t.methods[7] = mxfp4_kernels("moe.mxfp4.p16k8.lut." KT_TARGET_VARIANT);
    t.methods[8] = gptq_int4_kernels("moe.gptq_int4.int4g.p16k8." KT_TARGET_VARIANT);
    t.methods[9] = nvfp4_kernels("moe.nvfp4.p16k8.lut." KT_TARGET_VARIANT);
    t.methods[10] = mxfp8_kernels("moe.mxfp8e4m3.p16." KT_FP8_KERNEL KT_TARGET_VARIANT);
    for (kt_method_kernels& m : t.methods) add_transposed_tiles(m);
    t.api = kt_backend_api{sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR, "avx", KT_TARGET_VARIANT,
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
