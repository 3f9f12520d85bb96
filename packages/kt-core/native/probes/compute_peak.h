// The host's multiply-add peak for the arithmetic kt's kernels use, measured: the hardware's
// compute roof in kt bench's roofline (kt's own kernels are measured separately).
#pragma once
#include <string>
#include <vector>

namespace kt {

// The kinds this host can measure ("f32_fma", "bf16_dot", "int8_dot"), each only where
// kt's host detection found the instructions (after KT_MAX_ISA).
std::vector<std::string> compute_peak_kinds();

// Multiply-adds per second of `kind` on all of the pool's threads at once, each thread running
// independent instruction streams on registers (no memory traffic, no dependency chains) for
// about `seconds`. std::invalid_argument for a kind this host cannot run.
double compute_peak_macs(const std::string& kind, double seconds);

}  // namespace kt
