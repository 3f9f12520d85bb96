// The stream-ordered bridge between a CUDA stream and kt-core's CPU experts (kt/forward.h).
//
// submit() enqueues on the stream: device-to-host copies of a layer's hidden states, expert ids
// and routing weights into pinned staging, then a host function that queues the CPU forward on
// kt-core's pool and returns. sync() enqueues a host function that waits for that forward, then
// the host-to-device copy of its output. The calling thread never blocks; GPU work enqueued on
// other streams overlaps the CPU experts; and since every step is a stream operation whose
// arguments are fixed per (layer, token count), the sequence can be captured in a CUDA graph
// and replayed.
//
// Staging is per token count and shared by the layers (they run one after another on the
// stream): the capture sizes are allocated up front and kept; any other size has one staging
// slot, replaced (after the stream drains) when the size changes.
#pragma once
#include <kt/forward.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kt_cuda {

class StreamBridge;

// Pinned host buffers for one token count.
struct Staging {
    int64_t tokens = 0;
    void* hidden = nullptr;     // [tokens, hidden] in the bridge's dtype
    int64_t* ids = nullptr;     // [tokens, top_k]
    float* weights = nullptr;   // [tokens, top_k]
    void* out = nullptr;        // [tokens, hidden] in the bridge's dtype
};

// What one host function needs: fixed per (layer, token count), so a captured graph's nodes
// keep pointing at valid, unchanging arguments.
struct HostCall {
    StreamBridge* bridge;
    void* layer;
    Staging* staging;
};

class StreamBridge {
public:
    // api: kt-core's kt_forward_api; hidden/top_k: the layers' shape; dtype: float32 or bfloat16
    // (hidden states and output); capture_sizes: token counts to stage up front; numa_node: where
    // kt-core's allocator places the staging (the GPU's node; -1: first touch).
    StreamBridge(const kt_forward_api* api, int64_t hidden, int64_t top_k, kt_dtype dtype,
                 std::vector<int64_t> capture_sizes, int64_t max_tokens, int numa_node = -1);
    ~StreamBridge();
    StreamBridge(const StreamBridge&) = delete;
    StreamBridge& operator=(const StreamBridge&) = delete;

    // Device pointers: hidden [tokens, hidden] (dtype), ids [tokens, top_k] int64, weights
    // [tokens, top_k] float32, out [tokens, hidden] (dtype); layer: kt_core.MoE.native_handle.
    void submit(cudaStream_t stream, void* layer, const void* hidden, const int64_t* ids, const float* weights,
                int64_t tokens);
    void sync(cudaStream_t stream, void* layer, void* out, int64_t tokens);

    // The first error a host function met since the last call ("" if none): host functions
    // cannot raise, so Python asks at its next call.
    std::string take_error();
    size_t pinned_bytes() const;

private:
    Staging& staging_for(cudaStream_t stream, int64_t tokens);
    HostCall* call_for(void* layer, Staging& staging);
    void* pinned(size_t bytes, const char* what);   // kt-core's allocator + cudaHostRegister
    void unpin(void* p);
    void allocate(Staging& s, int64_t tokens);
    void release(Staging& s);
    void record(const std::string& message);
    static void CUDART_CB start_forward(void* call);
    static void CUDART_CB finish_forward(void* call);

    const kt_forward_api* api_;
    int64_t hidden_, top_k_, max_tokens_;
    kt_dtype dtype_;
    int numa_node_;
    size_t elem_;
    std::map<int64_t, Staging> captured_;
    Staging other_;
    std::map<std::pair<void*, Staging*>, std::unique_ptr<HostCall>> calls_;
    mutable std::mutex error_mutex_;
    std::string error_;
};

// cudaGetDeviceCount, with the runtime's reason when it fails (no driver, no device).
std::pair<int, std::string> device_count();

}  // namespace kt_cuda
