// Allocations placed on a chosen NUMA node (mmap + mbind), interleaved across nodes, or
// left to first touch; weights get transparent-huge-page advice. Every allocation is
// counted per node so doctor and tests can see where memory went.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace kt {

// An allocation that failed, with what was asked for: still a std::bad_alloc (callers that
// catch allocation failures still do), raised in Python as a MemoryError with the message
// (a bare bad_alloc reached Python as "std::bad_alloc"). Plugins' KT_ERROR_OUT_OF_MEMORY
// uses it too, carrying the plugin's message.
class OutOfMemory : public std::bad_alloc {
public:
    explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
    const char* what() const noexcept override { return message_.c_str(); }

private:
    std::string message_;
};

constexpr int kNodeLocal = -1;       // no binding: first touch decides
constexpr int kNodeInterleave = -2;  // interleave over all nodes

struct NodeUsage {
    int node = 0;                 // OS NUMA node id, or kNodeLocal / kNodeInterleave
    uint64_t bytes_live = 0;
    uint64_t bytes_peak = 0;
    uint64_t allocations_live = 0;
};

// Returns memory aligned to `align` (power of two, >= 64), zero-filled, bound to `node`.
// huge_pages: advise THP (weights; large read-mostly buffers). Throws std::bad_alloc on
// failure and std::invalid_argument on a bad alignment or node. bytes == 0 returns nullptr.
// Binding failures (no NUMA support in kernel/container) fall back to unbound memory:
// binding is an optimisation, never a reason to fail.
void* numa_alloc(size_t bytes, size_t align, int node, bool huge_pages);
void numa_free(void* ptr) noexcept;   // nullptr is fine

std::vector<NodeUsage> numa_usage();  // one row per node that ever had an allocation
bool numa_binding_available();        // kernel accepted mbind at least once / get_mempolicy works

struct NumaDeleter { void operator()(void* p) const noexcept { numa_free(p); } };
using NumaBuffer = std::unique_ptr<void, NumaDeleter>;
inline NumaBuffer make_numa_buffer(size_t bytes, size_t align, int node, bool huge_pages) {
    return NumaBuffer(numa_alloc(bytes, align, node, huge_pages));
}

}  // namespace kt
