// Where BLIS takes over from kt-backend-avx: per method, the rows per expert (tokens * top_k /
// num_experts) from which a layer's forward runs through BLIS; below it the method's kernels
// decline and kt-core runs the batch on the avx variant that packed the weights. Plain data,
// shared by the baseline module (which sets it from the host's calibration, kt_backend_blis/
// crossover.py) and every target's kernels (which read it in `declines`).
#pragma once
#include <cstdint>

namespace kt_blis {

enum Method : int { kBf16, kInt8, kInt4, kRawInt4, kFp8, kFp8PerChannel, kMxfp4, kGptqInt4, kMethodCount };
inline constexpr const char* kMethodNames[kMethodCount] = {"BF16", "INT8",           "INT4",  "RAWINT4",
                                                           "FP8",  "FP8_PERCHANNEL", "MXFP4", "GPTQ_INT4"};
inline constexpr int64_t kNever = INT64_MAX;   // not calibrated, or BLIS never won: always decline

// Rows per expert from which BLIS serves each method. Set before kt-core loads a table.
extern int64_t g_min_rows[kMethodCount];

}  // namespace kt_blis
