#include "stream_bridge.h"

#include <stdexcept>

namespace kt_cuda {
namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace

std::pair<int, std::string> device_count() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return {0, cudaGetErrorString(e)};
    return {n, ""};
}

StreamBridge::StreamBridge(const kt_forward_api* api, int64_t hidden, int64_t top_k, kt_dtype dtype,
                           std::vector<int64_t> capture_sizes, int64_t max_tokens, int numa_node)
    : api_(api), hidden_(hidden), top_k_(top_k), max_tokens_(max_tokens), dtype_(dtype), numa_node_(numa_node) {
    if (!api_ || api_->struct_size < sizeof(kt_forward_api) || api_->version != KT_FORWARD_API_VERSION)
        throw std::invalid_argument("kt-core's kt_forward_api is missing or of another version; reinstall kt-core and "
                                    "kt-cuda together");
    if (dtype != KT_DTYPE_F32 && dtype != KT_DTYPE_BF16)
        throw std::invalid_argument("the bridge stages float32 or bfloat16 hidden states");
    if (hidden <= 0 || top_k <= 0 || max_tokens <= 0) throw std::invalid_argument("hidden, top_k and max_tokens must be positive");
    elem_ = dtype == KT_DTYPE_F32 ? 4 : 2;
    for (int64_t t : capture_sizes) {
        if (t <= 0 || t > max_tokens_)
            throw std::invalid_argument("capture size " + std::to_string(t) + " is outside [1, " +
                                        std::to_string(max_tokens_) + "] (chunked_prefill_size)");
        allocate(captured_[t], t);
    }
}

StreamBridge::~StreamBridge() {
    for (auto& [t, s] : captured_) release(s);
    release(other_);
}

// Staging lives in kt-core's NUMA allocator on the bridge's node (the GPU's, where known), page-
// locked for DMA with cudaHostRegister: the copies run at pinned speed and the CPU experts read
// node-local memory.
void* StreamBridge::pinned(size_t bytes, const char* what) {
    void* p = api_->alloc(bytes, 4096, numa_node_, 0);
    if (!p)
        throw std::runtime_error(std::string("pinned staging (") + what + "): kt-core's allocator could not provide " +
                                 std::to_string(bytes) + " bytes on NUMA node " + std::to_string(numa_node_));
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        api_->free(p);
        throw std::runtime_error(std::string("pinned staging (") + what + "): " + cudaGetErrorString(e));
    }
    return p;
}

void StreamBridge::unpin(void* p) {
    if (!p) return;
    cudaHostUnregister(p);
    api_->free(p);
}

void StreamBridge::allocate(Staging& s, int64_t tokens) {
    s.tokens = tokens;
    const size_t rows = size_t(tokens);
    s.hidden = pinned(rows * size_t(hidden_) * elem_, "hidden");
    s.ids = static_cast<int64_t*>(pinned(rows * size_t(top_k_) * 8, "ids"));
    s.weights = static_cast<float*>(pinned(rows * size_t(top_k_) * 4, "weights"));
    s.out = pinned(rows * size_t(hidden_) * elem_, "output");
}

void StreamBridge::release(Staging& s) {
    for (void* p : {s.hidden, static_cast<void*>(s.ids), static_cast<void*>(s.weights), s.out}) unpin(p);
    s = Staging{};
}

size_t StreamBridge::pinned_bytes() const {
    size_t n = 0;
    auto add = [&](const Staging& s) { n += size_t(s.tokens) * (2 * size_t(hidden_) * elem_ + size_t(top_k_) * 12); };
    for (const auto& [t, s] : captured_) add(s);
    add(other_);
    return n;
}

Staging& StreamBridge::staging_for(cudaStream_t stream, int64_t tokens) {
    if (tokens <= 0 || tokens > max_tokens_)
        throw std::invalid_argument("the bridge stages 1.." + std::to_string(max_tokens_) + " tokens, got " +
                                    std::to_string(tokens));
    if (auto it = captured_.find(tokens); it != captured_.end()) return it->second;
    if (other_.tokens != tokens) {
        // Work still queued may read the old slot: let the stream drain first. Only a size
        // outside the capture sizes changing pays this (prefill chunks of a new length).
        check(cudaStreamSynchronize(stream), "draining the stream before restaging");
        for (auto it = calls_.begin(); it != calls_.end();) it = it->first.second == &other_ ? calls_.erase(it) : std::next(it);
        release(other_);
        allocate(other_, tokens);
    }
    return other_;
}

HostCall* StreamBridge::call_for(void* layer, Staging& staging) {
    auto& slot = calls_[{layer, &staging}];
    if (!slot) slot = std::make_unique<HostCall>(HostCall{this, layer, &staging});
    return slot.get();
}

void StreamBridge::record(const std::string& message) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_.empty()) error_ = message;
}

std::string StreamBridge::take_error() {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return std::exchange(error_, std::string());
}

void CUDART_CB StreamBridge::start_forward(void* p) {
    const auto* c = static_cast<const HostCall*>(p);
    const Staging& s = *c->staging;
    const kt_status st = c->bridge->api_->submit(c->layer, s.hidden, c->bridge->dtype_, s.tokens, s.ids, s.weights, s.out,
                                                 c->bridge->dtype_);
    if (st != KT_OK) c->bridge->record(std::string("kt CPU forward refused: ") + c->bridge->api_->last_error());
}

void CUDART_CB StreamBridge::finish_forward(void* p) {
    const auto* c = static_cast<const HostCall*>(p);
    if (c->bridge->api_->wait() != KT_OK) c->bridge->record(std::string("kt CPU forward failed: ") + c->bridge->api_->last_error());
}

void StreamBridge::submit(cudaStream_t stream, void* layer, const void* hidden, const int64_t* ids, const float* weights,
                          int64_t tokens) {
    Staging& s = staging_for(stream, tokens);
    const size_t rows = size_t(tokens);
    check(cudaMemcpyAsync(s.hidden, hidden, rows * size_t(hidden_) * elem_, cudaMemcpyDeviceToHost, stream), "copying hidden states");
    check(cudaMemcpyAsync(s.ids, ids, rows * size_t(top_k_) * 8, cudaMemcpyDeviceToHost, stream), "copying expert ids");
    check(cudaMemcpyAsync(s.weights, weights, rows * size_t(top_k_) * 4, cudaMemcpyDeviceToHost, stream), "copying weights");
    check(cudaLaunchHostFunc(stream, &StreamBridge::start_forward, call_for(layer, s)), "enqueueing the CPU forward");
}

void StreamBridge::sync(cudaStream_t stream, void* layer, void* out, int64_t tokens) {
    Staging& s = staging_for(stream, tokens);
    check(cudaLaunchHostFunc(stream, &StreamBridge::finish_forward, call_for(layer, s)), "enqueueing the wait");
    check(cudaMemcpyAsync(out, s.out, size_t(tokens) * size_t(hidden_) * elem_, cudaMemcpyHostToDevice, stream),
          "copying the output back");
}

}  // namespace kt_cuda
