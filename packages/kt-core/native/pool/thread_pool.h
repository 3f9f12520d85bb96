// The one process-wide thread pool. Workers are pinned to physical cores and grouped by
// NUMA node; the thread that starts a parallel loop takes part in it (on small machines
// a separate dispatcher thread that only waits would cost a whole core). Idle workers spin
// briefly, then park on a futex, so the pool costs nothing between layers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace kt {

struct PoolConfig {
    int num_threads = 0;     // threads doing work, caller included; 0 = one per physical core
    int virtual_numa = 0;    // >0: pretend there are this many NUMA nodes by splitting the
                             // cores into that many groups (tests multi-node logic on one node)
    bool pin = true;         // pin workers to physical cores
    int spin_us = 100;       // how long an idle worker spins before it parks
};

class ThreadPool {
public:
    using Fn1D = void (*)(void* ctx, size_t i);
    using Fn2DTile = void (*)(void* ctx, size_t i, size_t j, size_t tile_i, size_t tile_j);
    using FnGroup = void (*)(void* ctx, int group, size_t i);

    explicit ThreadPool(const PoolConfig& config);
    ~ThreadPool();                      // joins all workers; waits for a submitted job
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int num_threads() const;            // caller slot + workers
    int num_groups() const;             // NUMA groups (virtual ones count)
    int group_numa_node(int group) const;   // OS NUMA node id backing a group
    int group_size(int group) const;    // threads in a group
    const PoolConfig& config() const;

    // Fork-join loops. May be called from the thread that owns the pool (any non-worker
    // thread) or from inside a submitted job. A loop started from inside a loop body runs
    // inline on the calling thread. Returns when every index has run.
    void parallel_for(size_t range, Fn1D fn, void* ctx);
    // Tiles of [0, range_i) x [0, range_j): fn(ctx, i, j, min(tile_i, range_i - i), ...)
    void parallel_for_2d(size_t range_i, size_t range_j, size_t tile_i, size_t tile_j,
                         Fn2DTile fn, void* ctx);
    // One range per group: group g's threads run ranges[g] first (NUMA locality), then
    // help other groups once theirs is drained. ranges has num_groups() entries.
    void parallel_for_groups(const size_t* ranges, FnGroup fn, void* ctx);

    // Async: run job on a worker (which may itself call the loops above, spreading them to
    // the other workers). Returns at once. At most one job in flight: submitting while
    // one runs throws std::logic_error. sync() waits for it, the caller joining the job's
    // parallel loops meanwhile, and rethrows any exception the job threw.
    // Both may be called from any non-worker thread at once: of racing submits exactly one
    // wins, and of racing syncs one receives the job's outcome, the others return once it
    // is done.
    void submit(std::function<void()> job);
    void sync();
    bool job_pending() const;

    // Wakes parked workers without giving them work: they spin (spin_us) waiting for the next
    // loop. A caller about to do a little serial work before its first loop calls this so the
    // futex wake-up overlaps that work instead of delaying the loop.
    void wake();

    // Statistics for doctor/tests: OS cpu ids each thread is pinned to (-1 = unpinned).
    std::vector<int> pinned_cpus() const;

private:
    struct Impl;
    Impl* impl_;
};

// The process-wide pool, created on first use with the configuration last given to
// configure_global_pool() (or the defaults). configure_global_pool() after the pool
// exists replaces it if no job is pending (workers are joined first).
ThreadPool& global_pool();
void configure_global_pool(const PoolConfig& config);
bool global_pool_exists();

// Mutexes held by code that uses the pool across calls to global_pool() (the MoE forward
// lock): configure_global_pool() and fork() take them, in registration order, before the
// pool's own, so the pool is never replaced under a forward (that freed the pool the forward
// was running on) and a fork() child never inherits one locked by a thread it lacks.
// fork(): only the forking thread exists in the child, so the parent's workers are gone (a
// job handed to one would never run, and joining them would hang). The child abandons the
// parent's pool (its memory is leaked, once per fork) and the next global_pool() starts a
// fresh one with the same configuration.
void register_pool_user_mutex(std::mutex* mutex);

}  // namespace kt
