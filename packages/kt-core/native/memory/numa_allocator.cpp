#include "memory/numa_allocator.h"

#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace kt {
namespace {

const char* const kNodeDir = "/sys/devices/system/node/";

// "0-3,5" -> {0,1,2,3,5}
std::vector<int> parse_list(const std::string& text) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.find_first_not_of(" \n") == std::string::npos) continue;
        const size_t dash = item.find('-');
        const int lo = std::stoi(item.substr(0, dash));
        const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
        for (int v = lo; v <= hi; ++v) out.push_back(v);
    }
    return out;
}

std::vector<int> read_node_list(const char* name) {
    std::ifstream in(std::string(kNodeDir) + name);
    std::string text;
    if (!in || !std::getline(in, text)) return {};
    try {
        return parse_list(text);
    } catch (const std::exception&) {
        return {};
    }
}

struct Machine {
    std::vector<int> nodes;          // online nodes, valid targets for numa_alloc
    std::vector<int> memory_nodes;   // the ones with memory: the interleave set
    size_t page = 4096;
    size_t huge_page = size_t(2) << 20;
};

const Machine& machine() {
    static const Machine detected = [] {
        Machine found;
        found.nodes = read_node_list("online");
        // Kernels without NUMA support have no node directory: everything is node 0.
        if (found.nodes.empty()) found.nodes = {0};
        found.memory_nodes = read_node_list("has_memory");
        if (found.memory_nodes.empty()) found.memory_nodes = found.nodes;
        const long page = sysconf(_SC_PAGESIZE);
        if (page > 0) found.page = static_cast<size_t>(page);
        std::ifstream thp("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
        size_t huge = 0;
        if (thp >> huge && huge > 0) found.huge_page = huge;
        return found;
    }();
    return detected;
}

// -1: not known yet; 0: the kernel refuses NUMA policy calls; 1: it accepted one.
std::atomic<int> g_binding{-1};

struct Allocation {
    size_t length;   // whole mapping, starting at the returned pointer
    size_t bytes;    // what the caller asked for, for accounting
    int node;
};

struct Registry {
    std::mutex mutex;
    std::unordered_map<void*, Allocation> live;
    std::map<int, NodeUsage> usage;
};

Registry& registry() {
    static Registry r;
    return r;
}

bool is_node(int node) {
    for (int n : machine().nodes)
        if (n == node) return true;
    return false;
}

std::string node_list_text() {
    std::string s;
    for (int n : machine().nodes) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
}

void bind(void* p, size_t length, int node) {
    if (g_binding.load(std::memory_order_relaxed) == 0) return;
    const std::vector<int> targets =
        node == kNodeInterleave ? machine().memory_nodes : std::vector<int>{node};
    int max_node = 0;
    for (int n : targets) max_node = std::max(max_node, n);
    const size_t bits_per_word = 8 * sizeof(unsigned long);
    std::vector<unsigned long> mask(max_node / bits_per_word + 1, 0);
    for (int n : targets) mask[n / bits_per_word] |= 1UL << (n % bits_per_word);
    // PREFERRED, not BIND: a full node spills to another instead of waking the OOM killer —
    // slower memory beats a killed process.
    const int mode = node == kNodeInterleave ? MPOL_INTERLEAVE : MPOL_PREFERRED;
    // The kernel reads maxnode - 1 bits (libnuma passes size + 1 for the same reason).
    const unsigned long maxnode = mask.size() * bits_per_word + 1;
    if (syscall(SYS_mbind, p, length, mode, mask.data(), maxnode, 0) == 0) {
        g_binding.store(1, std::memory_order_relaxed);
    } else if (errno == EPERM || errno == ENOSYS) {
        // Containers (seccomp without CAP_SYS_NICE) and non-NUMA kernels: stop asking.
        g_binding.store(0, std::memory_order_relaxed);
    }
    // Other errors (e.g. EINVAL for a node outside this cpuset) leave just this
    // allocation to first touch.
}

}  // namespace

void* numa_alloc(size_t bytes, size_t align, int node, bool huge_pages) {
    if (align < 64 || (align & (align - 1)) != 0)
        throw std::invalid_argument("numa_alloc: align must be a power of two >= 64, got " +
                                    std::to_string(align));
    if (node != kNodeLocal && node != kNodeInterleave && !is_node(node))
        throw std::invalid_argument(
            "numa_alloc: node must be kNodeLocal (-1), kNodeInterleave (-2) or an online NUMA "
            "node of this machine (" + node_list_text() + "), got " + std::to_string(node));
    if (bytes == 0) return nullptr;

    const Machine& m = machine();
    // THP can only back 2 MiB-aligned stretches, so align big huge-page buffers to that.
    const size_t want = huge_pages && bytes >= m.huge_page ? std::max(align, m.huge_page) : align;
    if (bytes > SIZE_MAX / 2 || want > SIZE_MAX / 2)
        throw OutOfMemory("kt cannot allocate " + std::to_string(bytes) + " bytes: more than the address space");
    const size_t length = (bytes + m.page - 1) / m.page * m.page;
    const size_t slack = want > m.page ? want - m.page : 0;
    void* raw = mmap(nullptr, length + slack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        const int err = errno;
        throw OutOfMemory("kt could not allocate " + std::to_string(bytes) + " bytes (" +
                          std::to_string(bytes >> 20) + " MiB) for NUMA node " + std::to_string(node) + ": " +
                          std::strerror(err));
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + want - 1) & ~(uintptr_t(want) - 1);
    // Trimming the slack back keeps the registry to one exact mapping per allocation.
    if (aligned > base) munmap(raw, aligned - base);
    if (base + length + slack > aligned + length)
        munmap(reinterpret_cast<void*>(aligned + length), base + length + slack - aligned - length);
    void* p = reinterpret_cast<void*>(aligned);

    if (huge_pages) madvise(p, length, MADV_HUGEPAGE);   // advice only; THP may be off
    if (node != kNodeLocal) bind(p, length, node);

    Registry& r = registry();
    try {
        std::lock_guard<std::mutex> lock(r.mutex);
        r.live.emplace(p, Allocation{length, bytes, node});
        NodeUsage& u = r.usage[node];
        u.node = node;
        u.bytes_live += bytes;
        u.bytes_peak = std::max(u.bytes_peak, u.bytes_live);
        ++u.allocations_live;
    } catch (...) {
        munmap(p, length);
        throw;
    }
    return p;
}

void numa_free(void* ptr) noexcept {
    if (!ptr) return;
    Registry& r = registry();
    Allocation a;
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        auto it = r.live.find(ptr);
        // Not ours (or already freed): unmapping a guessed length could hit other memory.
        if (it == r.live.end()) return;
        a = it->second;
        r.live.erase(it);
        NodeUsage& u = r.usage[a.node];
        u.bytes_live -= a.bytes;
        --u.allocations_live;
    }
    munmap(ptr, a.length);
}

std::vector<NodeUsage> numa_usage() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::vector<NodeUsage> out;
    out.reserve(r.usage.size());
    for (const auto& entry : r.usage) out.push_back(entry.second);
    return out;
}

bool numa_binding_available() {
    int state = g_binding.load(std::memory_order_relaxed);
    if (state < 0) {
        // No mbind attempted yet: the policy syscalls share one permission check, so
        // whether get_mempolicy works tells whether mbind would.
        int mode = 0;
        state = syscall(SYS_get_mempolicy, &mode, nullptr, 0UL, nullptr, 0UL) == 0 ? 1 : 0;
        int expected = -1;
        if (!g_binding.compare_exchange_strong(expected, state, std::memory_order_relaxed))
            state = expected;
    }
    return state == 1;
}

}  // namespace kt
