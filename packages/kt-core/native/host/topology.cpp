#include "host/topology.h"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <utility>

namespace kt {
namespace {

using NodeMemory = std::map<int, uint64_t>;  // OS node id -> local memory bytes

// Heap-allocated cpu_set_t so machines with more than CPU_SETSIZE (1024) CPUs work.
class CpuSet {
public:
    explicit CpuSet(int ncpus) : set_(CPU_ALLOC(ncpus)), size_(CPU_ALLOC_SIZE(ncpus)) {
        if (set_) CPU_ZERO_S(size_, set_);
    }
    ~CpuSet() { CPU_FREE(set_); }
    CpuSet(const CpuSet&) = delete;
    CpuSet& operator=(const CpuSet&) = delete;

    cpu_set_t* get() const { return set_; }
    size_t size() const { return size_; }

private:
    cpu_set_t* set_;
    size_t size_;
};

// Taken from the main thread (tid == pid) rather than the caller, because the first
// caller may be a worker that is already pinned to a single core.
std::vector<int> allowed_cpus() {
    std::vector<int> cpus;
    for (int n = CPU_SETSIZE; n <= (1 << 20); n *= 2) {
        CpuSet set(n);
        if (!set.get()) break;
        if (sched_getaffinity(getpid(), set.size(), set.get()) == 0) {
            for (int cpu = 0; cpu < n; ++cpu)
                if (CPU_ISSET_S(cpu, set.size(), set.get())) cpus.push_back(cpu);
            return cpus;
        }
        // EINVAL means the kernel's mask is wider than ours; anything else is final.
        if (errno != EINVAL) break;
    }
    // Without an affinity mask, assume every online CPU is ours and numbered densely.
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long cpu = 0; cpu < std::max(1L, online); ++cpu) cpus.push_back(static_cast<int>(cpu));
    return cpus;
}

bool detect_hwloc(const std::vector<int>& allowed, Topology& t, NodeMemory& memory) {
    hwloc_topology_t raw = nullptr;
    if (hwloc_topology_init(&raw) != 0) return false;
    std::unique_ptr<hwloc_topology, decltype(&hwloc_topology_destroy)> topo(raw, hwloc_topology_destroy);
    if (hwloc_topology_load(topo.get()) != 0) return false;

    std::unique_ptr<hwloc_bitmap_s, decltype(&hwloc_bitmap_free)> allowed_set(hwloc_bitmap_alloc(),
                                                                               hwloc_bitmap_free);
    if (!allowed_set) return false;
    for (int cpu : allowed) hwloc_bitmap_set(allowed_set.get(), static_cast<unsigned>(cpu));

    // In hwloc 2 NUMA nodes hang off the tree as memory children, not as ancestors of
    // cores, so locality is found by cpuset intersection.
    std::vector<hwloc_obj_t> numa_objs;
    for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(topo.get(), HWLOC_OBJ_NUMANODE, n));) {
        numa_objs.push_back(n);
        memory[static_cast<int>(n->os_index)] = n->attr->numanode.local_memory;
    }
    auto numa_of = [&](hwloc_obj_t core) {
        for (hwloc_obj_t n : numa_objs)
            if (hwloc_bitmap_intersects(n->cpuset, core->cpuset)) return static_cast<int>(n->os_index);
        return 0;
    };
    auto package_of = [&](hwloc_obj_t pu) {
        const hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(topo.get(), HWLOC_OBJ_PACKAGE, pu);
        if (!pkg) return 0;
        return static_cast<int>(pkg->os_index != HWLOC_UNKNOWN_INDEX ? pkg->os_index : pkg->logical_index);
    };

    hwloc_obj_t first_pu = nullptr;
    std::map<hwloc_obj_t, size_t> core_slot;
    for (hwloc_obj_t pu = nullptr; (pu = hwloc_get_next_obj_by_type(topo.get(), HWLOC_OBJ_PU, pu));) {
        if (!hwloc_bitmap_isset(allowed_set.get(), pu->os_index)) continue;
        if (!first_pu) first_pu = pu;
        // Some platforms expose no Core level; each PU then stands for its own core.
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topo.get(), HWLOC_OBJ_CORE, pu);
        if (!core) core = pu;
        const auto [slot, inserted] = core_slot.emplace(core, t.cores.size());
        if (inserted) {
            PhysicalCore c;
            c.numa_node = numa_of(core);
            c.package = package_of(pu);
            t.cores.push_back(std::move(c));
        }
        t.cores[slot->second].cpus.push_back(static_cast<int>(pu->os_index));
    }
    if (t.cores.empty()) return false;

    // Hybrid CPUs have different caches per core type; report those of the first usable
    // core, which is the one kernels see first.
    auto cache_size = [&](hwloc_obj_type_t type) -> uint64_t {
        const hwloc_obj_t c = hwloc_get_ancestor_obj_by_type(topo.get(), type, first_pu);
        return c ? c->attr->cache.size : 0;
    };
    t.l1d_bytes = cache_size(HWLOC_OBJ_L1CACHE);
    t.l2_bytes = cache_size(HWLOC_OBJ_L2CACHE);
    t.l3_bytes = cache_size(HWLOC_OBJ_L3CACHE);

    const hwloc_obj_t root = hwloc_get_root_obj(topo.get());
    // hwloc_get_api_version() lags the release (2.9.0 reports API 2.8.0), so prefer the
    // release string hwloc records on the root object.
    if (const char* version = hwloc_obj_get_info_by_name(root, "hwlocVersion")) {
        t.source = std::string("hwloc ") + version;
    } else {
        const unsigned api = hwloc_get_api_version();
        char buf[48];
        std::snprintf(buf, sizeof buf, "hwloc API %u.%u.%u", api >> 16, (api >> 8) & 0xff, api & 0xff);
        t.source = buf;
    }
    return true;
}

bool read_int(const std::string& path, int& out) {
    std::ifstream in(path);
    return static_cast<bool>(in >> out);
}

// Kernel cpulist format: "0-3,8,10-11".
std::vector<int> parse_cpulist(const std::string& text) {
    std::vector<int> cpus;
    std::istringstream in(text);
    std::string range;
    while (std::getline(in, range, ',')) {
        int lo = 0, hi = 0;
        const int n = std::sscanf(range.c_str(), "%d-%d", &lo, &hi);
        if (n < 1) continue;
        if (n == 1) hi = lo;
        for (int cpu = lo; cpu <= hi; ++cpu) cpus.push_back(cpu);
    }
    return cpus;
}

// Kernel cache sizes read like "48K"; accept an M suffix as well.
uint64_t parse_cache_size(const std::string& text) {
    unsigned long long value = 0;
    char unit = 0;
    if (std::sscanf(text.c_str(), "%llu%c", &value, &unit) < 1) return 0;
    if (unit == 'K') value <<= 10;
    if (unit == 'M') value <<= 20;
    return value;
}

void detect_sysfs(const std::vector<int>& allowed, Topology& t, NodeMemory& memory) {
    namespace fs = std::filesystem;
    std::map<int, int> node_of_cpu;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", ec)) {
        const std::string name = entry.path().filename().string();
        int node = 0;
        if (std::sscanf(name.c_str(), "node%d", &node) != 1) continue;
        std::ifstream cpulist(entry.path() / "cpulist");
        std::string text;
        std::getline(cpulist, text);
        for (int cpu : parse_cpulist(text)) node_of_cpu[cpu] = node;

        std::ifstream meminfo(entry.path() / "meminfo");
        for (std::string line; std::getline(meminfo, line);) {
            unsigned long long kb = 0;
            int id = 0;
            if (std::sscanf(line.c_str(), "Node %d MemTotal: %llu kB", &id, &kb) == 2) {
                memory[node] = uint64_t(kb) << 10;
                break;
            }
        }
    }

    std::map<std::pair<int, int>, size_t> core_slot;  // (package, core_id) -> slot
    for (int cpu : allowed) {
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        int package = 0, core_id = 0;
        read_int(dir + "physical_package_id", package);
        // Without a core_id, a negative key unique to this cpu keeps it a core of its own.
        if (!read_int(dir + "core_id", core_id)) core_id = -1 - cpu;
        // Some firmware reports package -1 for "unknown"; the only socket is then 0.
        package = std::max(package, 0);
        const auto [slot, inserted] = core_slot.emplace(std::make_pair(package, core_id), t.cores.size());
        if (inserted) {
            PhysicalCore c;
            const auto node = node_of_cpu.find(cpu);
            c.numa_node = node != node_of_cpu.end() ? node->second : 0;
            c.package = package;
            t.cores.push_back(std::move(c));
        }
        t.cores[slot->second].cpus.push_back(cpu);
    }

    if (!allowed.empty()) {
        const fs::path cache_dir =
            "/sys/devices/system/cpu/cpu" + std::to_string(allowed.front()) + "/cache";
        for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
            int level = 0;
            std::string type, size;
            std::ifstream(entry.path() / "type") >> type;
            std::ifstream(entry.path() / "size") >> size;
            if (!read_int((entry.path() / "level").string(), level) || type == "Instruction") continue;
            const uint64_t bytes = parse_cache_size(size);
            if (level == 1) t.l1d_bytes = bytes;
            if (level == 2) t.l2_bytes = bytes;
            if (level == 3) t.l3_bytes = bytes;
        }
    }

    t.source = "sysfs";
}

void finalize(Topology& t, const NodeMemory& memory) {
    for (auto& c : t.cores) std::sort(c.cpus.begin(), c.cpus.end());
    std::sort(t.cores.begin(), t.cores.end(), [](const PhysicalCore& a, const PhysicalCore& b) {
        return std::make_pair(a.numa_node, a.cpus.front()) < std::make_pair(b.numa_node, b.cpus.front());
    });
    std::set<int> packages;
    t.num_cpus = 0;
    for (size_t i = 0; i < t.cores.size(); ++i) {
        PhysicalCore& c = t.cores[i];
        c.index = static_cast<int>(i);
        t.num_cpus += static_cast<int>(c.cpus.size());
        packages.insert(c.package);
        if (t.nodes.empty() || t.nodes.back().id != c.numa_node) {
            NumaNode node;
            node.id = c.numa_node;
            const auto mem = memory.find(c.numa_node);
            node.memory_bytes = mem != memory.end() ? mem->second : 0;
            t.nodes.push_back(std::move(node));
        }
        t.nodes.back().cores.push_back(c.index);
    }
    if (!packages.empty()) t.num_packages = static_cast<int>(packages.size());

    // MemTotal, not hwloc's sum over NUMA nodes: on some VMs (hot-plugged memory) the
    // per-node counts cover only part of what the kernel can hand out.
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) t.total_memory_bytes = uint64_t(pages) * uint64_t(page_size);
}

Topology detect() {
    const std::vector<int> allowed = allowed_cpus();
    Topology t;
    NodeMemory memory;
    if (!detect_hwloc(allowed, t, memory)) {
        t = Topology{};
        memory.clear();
        detect_sysfs(allowed, t, memory);
    }
    finalize(t, memory);
    return t;
}

}  // namespace

const Topology& topology() {
    static const Topology t = detect();
    return t;
}

bool pin_current_thread_to_core(const PhysicalCore& core) {
    if (core.cpus.empty()) return false;
    const auto [lo, hi] = std::minmax_element(core.cpus.begin(), core.cpus.end());
    if (*lo < 0) return false;
    CpuSet set(*hi + 1);
    if (!set.get()) return false;
    for (int cpu : core.cpus) CPU_SET_S(cpu, set.size(), set.get());
    return pthread_setaffinity_np(pthread_self(), set.size(), set.get()) == 0;
}

}  // namespace kt
