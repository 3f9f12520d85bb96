// Machine topology as the thread pool and allocator need it: physical cores (not SMT
// siblings), the NUMA node each core belongs to, and cache sizes. Detected with hwloc,
// restricted to the CPUs this process is allowed to run on (containers, taskset).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kt {

struct PhysicalCore {
    int index = 0;              // dense index 0..cores.size()-1
    std::vector<int> cpus;      // OS cpu ids (PUs) of this core that the process may use
    int numa_node = 0;          // OS NUMA node id
    int package = 0;            // socket
};

struct NumaNode {
    int id = 0;                         // OS node id (what mbind wants)
    uint64_t memory_bytes = 0;          // local memory, 0 if unknown
    std::vector<int> cores;             // indices into Topology::cores
};

struct Topology {
    std::vector<PhysicalCore> cores;    // usable physical cores, ordered by node then OS id
    std::vector<NumaNode> nodes;        // nodes having at least one usable core
    int num_cpus = 0;                   // usable logical CPUs (PUs)
    int num_packages = 1;
    uint64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;   // per instance, 0 if unknown
    uint64_t total_memory_bytes = 0;
    std::string source;                 // "hwloc <version>" or "sysfs" fallback
};

// Detected once and cached; thread-safe.
const Topology& topology();

// Pin the calling thread to all usable CPUs of one physical core. Returns false (and does
// nothing) if the OS refuses; pinning is an optimisation, never a requirement.
bool pin_current_thread_to_core(const PhysicalCore& core);

}  // namespace kt
