// This target's backend table: the GEMM tile kernels of every method over the avx layout this
// target reads (the same ids kt-backend-avx's target of this name packs). Built on first request,
// never at module load: nothing compiled with this target's flags runs before kt-core has
// checked that the host can execute it.
#include <kt/formats/packed_layouts.h>

#include "gemm_tiles.h"

namespace KT_TARGET_NAMESPACE {
namespace {

namespace L = kt::layouts;
using kt_blis::Method;

kt_status init(const kt_host_api* host) {
    g_host = host;
    return KT_OK;
}

struct Tables {
    kt_method_kernels methods[kt_blis::kMethodCount];
    kt_backend_api api;
};

Tables build() {
    const char* fp8 = KT_FP8_QUADS ? L::fp8::kIdQuads : L::fp8::kIdRows;
    Tables t{};
    t.methods[0] = gemm_method(Method::kBf16, L::bf16::kId, "moe.bf16.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[1] = gemm_method(Method::kInt8, L::int8::kId, "moe.int8.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[2] = gemm_method(Method::kInt4, L::int4::kId, "moe.int4g.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[3] = gemm_method(Method::kRawInt4, L::int4::kRawId, "moe.rawint4.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[4] = gemm_method(Method::kFp8, fp8, "moe.fp8e4m3b128.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[5] = gemm_method(Method::kFp8PerChannel, fp8, "moe.fp8e4m3ch.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[6] = gemm_method(Method::kMxfp4, L::mxfp4::kId, "moe.mxfp4.sgemm.blis." KT_TARGET_VARIANT);
    t.methods[7] = gemm_method(Method::kGptqInt4, L::int4::kId, "moe.gptq_int4.sgemm.blis." KT_TARGET_VARIANT);
    t.api = kt_backend_api{sizeof(kt_backend_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR, "blis", KT_TARGET_VARIANT,
                           KT_TARGET_FEATURES, init, kt_blis::kMethodCount, nullptr};
    return t;
}

}  // namespace

const kt_backend_api* backend_api() {
    static Tables tables = build();
    tables.api.methods = tables.methods;
    return &tables.api;
}

}  // namespace KT_TARGET_NAMESPACE
