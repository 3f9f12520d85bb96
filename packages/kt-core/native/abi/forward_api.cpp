#include "abi/forward_api.h"

#include "memory/numa_allocator.h"
#include "moe/moe_layer.h"
#include "pool/thread_pool.h"

#include <new>
#include <stdexcept>
#include <string>

namespace kt {
namespace {

thread_local std::string t_error;

// Runs f; a C++ exception becomes a status and this thread's message (nothing may unwind
// through a C caller, least of all a CUDA host function).
template <class F>
kt_status guarded(F&& f) {
    t_error.clear();
    try {
        f();
        return KT_OK;
    } catch (const std::invalid_argument& e) {
        t_error = e.what();
        return KT_ERROR_INVALID_ARGUMENT;
    } catch (const std::bad_alloc& e) {
        t_error = e.what();
        return KT_ERROR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        t_error = e.what();
        return KT_ERROR_INTERNAL;
    } catch (...) {
        t_error = "unknown C++ exception";
        return KT_ERROR_INTERNAL;
    }
}

kt_status submit(void* layer, const void* hidden, kt_dtype hidden_dtype, int64_t tokens, const int64_t* ids,
                 const float* weights, void* out, kt_dtype out_dtype) {
    return guarded([&] {
        if (!layer) throw std::invalid_argument("kt_forward_api.submit: null layer");
        if (hidden_dtype != KT_DTYPE_F32 && hidden_dtype != KT_DTYPE_BF16)
            throw std::invalid_argument("kt_forward_api.submit: hidden must be float32 or bfloat16");
        if (tokens > 0 && (!hidden || !ids || !weights || !out))
            throw std::invalid_argument("kt_forward_api.submit: null tensor address");
        const auto* l = static_cast<const MoeLayer*>(layer);
        l->check_forward_arguments(tokens, ids, out_dtype);
        ThreadPool& pool = global_pool();
        if (pool.job_pending())
            throw std::invalid_argument("kt_forward_api.submit: a forward is already queued; wait() for it first");
        pool.submit([=] { l->forward(hidden, hidden_dtype, tokens, ids, weights, out, out_dtype); });
    });
}

kt_status wait() {
    return guarded([] {
        if (global_pool_exists() && global_pool().job_pending()) global_pool().sync();
    });
}

const char* last_error() { return t_error.c_str(); }

// The C boundary cannot carry exceptions: a failed allocation is NULL.
void* host_alloc(size_t bytes, size_t align, int node, int huge_pages) {
    try {
        return numa_alloc(bytes, align, node, huge_pages != 0);
    } catch (...) {
        return nullptr;
    }
}
void host_free(void* p) { numa_free(p); }

const kt_forward_api kTable{sizeof(kt_forward_api), KT_FORWARD_API_VERSION, &submit, &wait, &last_error,
                            &host_alloc, &host_free};

}  // namespace

const kt_forward_api* forward_api() { return &kTable; }

}  // namespace kt
