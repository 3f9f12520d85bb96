// The kernel tables of every method this backend implements, for one target.
#pragma once
#include "common.h"

namespace KT_TARGET_NAMESPACE {
kt_method_kernels bf16_kernels(const char* kernel_id);
kt_method_kernels int8_kernels(const char* kernel_id);
kt_method_kernels int4_kernels(const char* kernel_id);
kt_method_kernels rawint4_kernels(const char* kernel_id);
kt_method_kernels mxfp4_kernels(const char* kernel_id);
kt_method_kernels nvfp4_kernels(const char* kernel_id);
kt_method_kernels gptq_int4_kernels(const char* kernel_id);
kt_method_kernels fp8_kernels(const char* kernel_id);
kt_method_kernels fp8_perchannel_kernels(const char* kernel_id);
kt_method_kernels mxfp8_kernels(const char* kernel_id);
kt_method_kernels llamafile_kernels(const char* kernel_id);
// Plugin ABI 1.5's transposed tiles (transposed.cpp) for the methods that have them (BF16, INT8, INT4, RAWINT4, GPTQ_INT4).
void add_transposed_tiles(kt_method_kernels& m);
}  // namespace KT_TARGET_NAMESPACE
