#pragma once
#include "common.h"

namespace KT_TARGET_NAMESPACE {
// The BF16 method's kernel table for this target.
kt_method_kernels bf16_kernels(const char* kernel_id);
}
