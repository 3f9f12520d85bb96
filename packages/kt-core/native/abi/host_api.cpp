#include "abi/host_api.h"

#include "memory/numa_allocator.h"
#include "pool/thread_pool.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>

namespace kt {
namespace {

std::mutex g_features_mutex;
std::vector<std::string> g_features;
thread_local std::string t_plugin_error;

int api_num_threads() { return global_pool().num_threads(); }
int api_num_groups() { return global_pool().num_groups(); }
int api_group_numa_node(int g) { return global_pool().group_numa_node(g); }
void api_parallel_for(size_t range, kt_task_1d fn, void* ctx) { global_pool().parallel_for(range, fn, ctx); }
void api_parallel_for_2d(size_t ri, size_t rj, size_t ti, size_t tj, kt_task_2d_tile fn, void* ctx) {
    global_pool().parallel_for_2d(ri, rj, ti, tj, fn, ctx);
}
void api_parallel_for_groups(const size_t* ranges, kt_task_group fn, void* ctx) {
    global_pool().parallel_for_groups(ranges, fn, ctx);
}
// The C boundary cannot carry exceptions: failures become NULL.
void* api_alloc(size_t bytes, size_t align, int node, int huge_pages) {
    try {
        return numa_alloc(bytes, align, node, huge_pages != 0);
    } catch (...) {
        return nullptr;
    }
}
void api_free(void* p) { numa_free(p); }
int api_has_feature(const char* name) { return name && host_has_feature(name) ? 1 : 0; }
void api_log(kt_log_level level, const char* message) {
    static const char* names[] = {"debug", "info", "warning", "error"};
    if (level >= KT_LOG_INFO) std::fprintf(stderr, "kt [%s] %s\n", names[level & 3], message ? message : "");
}
void api_set_error(const char* message) { t_plugin_error = message ? message : ""; }

const kt_host_api kHostApi = {
    sizeof(kt_host_api), KT_PLUGIN_ABI_MAJOR, KT_PLUGIN_ABI_MINOR,
    api_num_threads, api_num_groups, api_group_numa_node,
    api_parallel_for, api_parallel_for_2d, api_parallel_for_groups,
    api_alloc, api_free, api_has_feature, api_log, api_set_error,
};

std::vector<std::string> split_features(const char* list) {
    std::vector<std::string> out;
    std::stringstream ss(list ? list : "");
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

}  // namespace

const kt_host_api* host_api() { return &kHostApi; }

void set_host_features(std::vector<std::string> features) {
    std::lock_guard<std::mutex> lock(g_features_mutex);
    g_features = std::move(features);
}

bool host_has_feature(const std::string& name) {
    std::lock_guard<std::mutex> lock(g_features_mutex);
    return std::find(g_features.begin(), g_features.end(), name) != g_features.end();
}

std::string take_plugin_error() {
    std::string message;
    message.swap(t_plugin_error);
    return message;
}

void throw_plugin_failure(kt_status status, const char* what) {
    std::string message = take_plugin_error();
    if (message.empty()) message = "no message from the backend (status " + std::to_string(int(status)) + ")";
    message = std::string(what) + " failed: " + message;
    if (status == KT_ERROR_INVALID_ARGUMENT) throw std::invalid_argument(message);
    if (status == KT_ERROR_OUT_OF_MEMORY) throw OutOfMemory(message);
    throw std::runtime_error(message);
}

void validate_and_init_backend(const kt_backend_api* api, const std::string& expected_name,
                               const std::string& expected_variant) {
    const std::string who = "backend '" + expected_name + "' variant '" + expected_variant + "'";
    if (!api) throw std::runtime_error(who + " returned a NULL backend table");
    if (api->abi_major != KT_PLUGIN_ABI_MAJOR)
        throw std::runtime_error(who + " was built for kt plugin ABI " + std::to_string(api->abi_major) + "." +
                                 std::to_string(api->abi_minor) + ", this kt-core speaks " +
                                 std::to_string(KT_PLUGIN_ABI_MAJOR) + "." + std::to_string(KT_PLUGIN_ABI_MINOR) +
                                 ": install a build of the backend made for kt-core " +
                                 std::to_string(KT_PLUGIN_ABI_MAJOR) + ".x");
    if (api->abi_minor > KT_PLUGIN_ABI_MINOR)
        throw std::runtime_error(who + " needs kt plugin ABI " + std::to_string(api->abi_major) + "." +
                                 std::to_string(api->abi_minor) + " but this kt-core speaks only up to " +
                                 std::to_string(KT_PLUGIN_ABI_MAJOR) + "." + std::to_string(KT_PLUGIN_ABI_MINOR) +
                                 ": upgrade kt-core");
    if (api->struct_size < offsetof(kt_backend_api, methods) + sizeof(api->methods))
        throw std::runtime_error(who + ": backend table is " + std::to_string(api->struct_size) +
                                 " bytes, smaller than ABI 1.0's; the plugin is corrupt");
    if (!api->name || expected_name != api->name || !api->variant || expected_variant != api->variant)
        throw std::runtime_error(who + ": the native table calls itself '" + std::string(api->name ? api->name : "?") +
                                 "' variant '" + (api->variant ? api->variant : "?") +
                                 "'; the descriptor and the native module disagree");
    std::vector<std::string> missing;
    for (const auto& f : split_features(api->required_features))
        if (!host_has_feature(f)) missing.push_back(f);
    if (!missing.empty()) {
        std::string list;
        for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
        throw std::runtime_error(who + " executes instructions this host cannot run (missing: " + list +
                                 "); its descriptor under-states what it needs, so it was not used");
    }
    if (api->num_methods && !api->methods)
        throw std::runtime_error(who + ": backend table lists " + std::to_string(api->num_methods) +
                                 " methods and no method tables");
    for (size_t i = 0; i < api->num_methods; ++i) {
        // Element 0's struct_size is the stride (method_table): check it before any other element is read.
        if (api->methods[0].struct_size < offsetof(kt_method_kernels, down_tile) + sizeof(kt_method_kernels::down_tile))
            throw std::runtime_error(who + ": method table #0 is " + std::to_string(api->methods[0].struct_size) +
                                     " bytes, smaller than ABI 1.0's; the plugin is corrupt");
        const kt_method_kernels& m = method_table(api, i);
        if (m.struct_size != api->methods[0].struct_size)
            throw std::runtime_error(who + ": method table #" + std::to_string(i) + " is " + std::to_string(m.struct_size) +
                                     " bytes and #0 is " + std::to_string(api->methods[0].struct_size) +
                                     "; the tables of one array must have one size");
        const bool whole_op = KT_HAS_FIELD(&m, kt_method_kernels, moe_forward) && m.moe_forward;
        const bool tiles = m.quantize_activations && m.activation_row_bytes && m.gate_up_tile && m.down_tile &&
                           m.gate_up_block > 0 && m.down_block > 0;
        // ABI 1.3: tile kernels may borrow the packer of another backend that packs their layout.
        const bool packs = m.packed_expert_bytes && m.pack_expert;
        const bool borrows = api->abi_minor >= 3 && !m.packed_expert_bytes && !m.pack_expert && tiles && !whole_op;
        if (m.struct_size < offsetof(kt_method_kernels, down_tile) + sizeof(m.down_tile) || !m.method ||
            !m.layout_id || !m.kernel_id || !(packs || borrows) || !(tiles || whole_op))
            throw std::runtime_error(who + ": method table #" + std::to_string(i) +
                                     " lacks mandatory entries (names, packer — or, from ABI 1.3, tile kernels that "
                                     "borrow one — and either tile kernels or moe_forward)");
    }
    if (!api->init) throw std::runtime_error(who + ": backend table has no init()");
    check_plugin(api->init(&kHostApi), (who + " init()").c_str());
}

}  // namespace kt
