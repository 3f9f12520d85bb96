// kt_cuda._native: the stream bridge (stream_bridge.h) and the CUDA runtime's view of this host.
// Importing it needs no GPU and no driver (the runtime is linked statically): on a host
// without one, device_count() says why and kt_cuda reports itself unused.
#include <kt/forward.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "stream_bridge.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

const kt_forward_api* api_from(nb::capsule capsule) {
    if (std::string(capsule.name()) != KT_FORWARD_API_CAPSULE)
        throw nb::value_error("expected kt_core._native.forward_api()'s capsule");
    return static_cast<const kt_forward_api*>(capsule.data());
}

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

void raise_pending(kt_cuda::StreamBridge& b) {
    const std::string error = b.take_error();
    if (!error.empty()) throw std::runtime_error(error);
}

}  // namespace

NB_MODULE(_native, m) {
    m.doc() = "kt-cuda: CUDA streams driving kt-core's CPU experts";
    m.def("device_count", &kt_cuda::device_count, "(CUDA devices, the runtime's reason when there are none)");
    m.def("runtime_version", [] {
        int v = 0;
        cudaRuntimeGetVersion(&v);
        return v;
    });
    nb::class_<kt_cuda::StreamBridge>(m, "StreamBridge")
        .def("__init__",
             [](kt_cuda::StreamBridge* self, nb::capsule api, int64_t hidden, int64_t top_k, int dtype,
                std::vector<int64_t> capture_sizes, int64_t max_tokens, int numa_node) {
                 new (self) kt_cuda::StreamBridge(api_from(api), hidden, top_k, kt_dtype(dtype), std::move(capture_sizes),
                                                  max_tokens, numa_node);
             },
             "forward_api"_a, "hidden"_a, "top_k"_a, "dtype"_a, "capture_sizes"_a, "max_tokens"_a, "numa_node"_a = -1)
        // Errors a host function met since the last call are raised here (they cannot raise).
        .def("submit",
             [](kt_cuda::StreamBridge& b, uintptr_t stream, uintptr_t layer, uintptr_t hidden, uintptr_t ids,
                uintptr_t weights, int64_t tokens) {
                 raise_pending(b);
                 b.submit(as_stream(stream), reinterpret_cast<void*>(layer), reinterpret_cast<const void*>(hidden),
                          reinterpret_cast<const int64_t*>(ids), reinterpret_cast<const float*>(weights), tokens);
             },
             "stream"_a, "layer"_a, "hidden"_a, "ids"_a, "weights"_a, "tokens"_a)
        .def("sync",
             [](kt_cuda::StreamBridge& b, uintptr_t stream, uintptr_t layer, uintptr_t out, int64_t tokens) {
                 raise_pending(b);
                 b.sync(as_stream(stream), reinterpret_cast<void*>(layer), reinterpret_cast<void*>(out), tokens);
             },
             "stream"_a, "layer"_a, "out"_a, "tokens"_a)
        .def("take_error", &kt_cuda::StreamBridge::take_error)
        .def_prop_ro("pinned_bytes", &kt_cuda::StreamBridge::pinned_bytes);
}
