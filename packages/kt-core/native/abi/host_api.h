// The host table kt-core hands every backend (kt/plugin.h), and the validation of the
// backend tables they hand back.
#pragma once
#include <kt/plugin.h>

#include "memory/numa_allocator.h"

#include <string>
#include <vector>

namespace kt {

// The single host table of this process. Its has_feature() answers from the feature set
// installed by set_host_features() (the detected set after KT_MAX_ISA capping).
const kt_host_api* host_api();
void set_host_features(std::vector<std::string> features);
bool host_has_feature(const std::string& name);

// Method table i of a validated backend. The array is walked with its elements' own size
// (methods[0].struct_size, the same for every element: validation checks it), never with this
// header's sizeof: a plugin built against another minor has tables of another length.
inline const kt_method_kernels& method_table(const kt_backend_api* api, size_t i) {
    const char* base = reinterpret_cast<const char*>(api->methods);
    return *reinterpret_cast<const kt_method_kernels*>(base + i * api->methods[0].struct_size);
}

// The message a plugin recorded with set_error() on this thread, then cleared.
std::string take_plugin_error();

// Throws std::runtime_error naming what is wrong when a plugin's table cannot be used:
// another ABI major, a table smaller than ABI 1.0's, features this host lacks, a method
// table missing mandatory kernels. Calls init() once it is safe to.
void validate_and_init_backend(const kt_backend_api* api, const std::string& expected_name,
                               const std::string& expected_variant);

// KT_ERROR_OUT_OF_MEMORY from a plugin raises OutOfMemory (memory/numa_allocator.h) with the
// plugin's message: a MemoryError naming what failed (fuzzing: it reached Python as
// "std::bad_alloc").
// Raise the plugin's recorded error (or a generic one) for a failed call.
[[noreturn]] void throw_plugin_failure(kt_status status, const char* what);
inline void check_plugin(kt_status status, const char* what) {
    if (status != KT_OK) throw_plugin_failure(status, what);
}

}  // namespace kt
