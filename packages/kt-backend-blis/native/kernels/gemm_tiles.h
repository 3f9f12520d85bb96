// kt-backend-blis's tile kernels: each (expert, output block) task widens the block's panels of
// kt-backend-avx's packed layout (read through kt/formats/packed_layouts.h) to an f32 matrix in
// cache and multiplies the expert's exact f32 activation rows by it with one single-threaded
// BLIS sgemm; kt-core's pool runs the tasks in parallel, so one thread pool drives the cores.
#pragma once
#include <kt/plugin.h>

#include "crossover.h"

namespace KT_TARGET_NAMESPACE {

// Output columns per tile task (64 and 128 measured within 2 % of each other: Qwen3-30B-A3B layer,
// 4096 tokens, BF16, 2 threads).
inline constexpr int64_t kBlock = 128;

extern const kt_host_api* g_host;
kt_status fail(kt_status status, const char* fmt, ...);

// The kernel table of one method over its avx layout; packer-less (plugin ABI 1.3).
kt_method_kernels gemm_method(kt_blis::Method method, const char* layout_id, const char* kernel_id);

}  // namespace KT_TARGET_NAMESPACE
