#include "pool/thread_pool.h"

#include "host/topology.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kt {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__) || defined(__arm__)
    asm volatile("yield" ::: "memory");
#endif
}

// Raw futex rather than std::atomic::wait: libstdc++'s wait adds its own spin/yield phase
// and a shared waiter table, and the pool already spins on its own terms.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
}

// Set while a thread runs loop bodies: a loop started there runs inline, since every
// other thread may already be busy in the outer loop and waiting on them could deadlock.
thread_local bool tl_in_body = false;
// Which pool this thread is a worker of, and its slot there (0 for every other thread).
thread_local const void* tl_pool = nullptr;
thread_local int tl_slot = 0;
// The pool whose submitted job this thread is running, so the job cannot sync() on itself.
thread_local const void* tl_job = nullptr;

struct BodyScope {
    bool saved = tl_in_body;
    BodyScope() { tl_in_body = true; }
    ~BodyScope() { tl_in_body = saved; }
    BodyScope(const BodyScope&) = delete;
    BodyScope& operator=(const BodyScope&) = delete;
};

// Fine enough that a slow index does not leave threads idle at the end, coarse enough
// that huge ranges do not hammer one shared counter.
constexpr size_t kChunksPerThread = 16;

size_t chunk_for(size_t range, size_t threads) {
    return std::max<size_t>(1, range / (threads * kChunksPerThread));
}

// kJobClaimed: a submit() won the slot and is storing the job; workers wait for kJobSubmitted.
enum : uint32_t { kNoJob, kJobClaimed, kJobSubmitted, kJobRunning, kJobDone };

// loop_state: kOpen while newcomers may join the published loop; low bits count the
// threads currently inside it. A worker only reads the descriptor after joining, and the
// starter only returns (freeing the descriptor) once the loop is closed and the count is
// zero, so a late worker either joins a live loop or sees it closed.
constexpr uint64_t kOpen = uint64_t(1) << 63;

struct Loop {
    void (*run)(const Loop&, int range, size_t begin, size_t end) = nullptr;
    ThreadPool::Fn1D fn1 = nullptr;
    ThreadPool::Fn2DTile fn2 = nullptr;
    ThreadPool::FnGroup fng = nullptr;
    void* ctx = nullptr;
    const size_t* ends = nullptr;   // index count of each range
    int num_ranges = 1;
    size_t range_i = 0, range_j = 0, tile_i = 0, tile_j = 0, tiles_j = 0;
    std::atomic<bool> failed{false};
    std::exception_ptr error;       // first exception; valid once the loop has drained
};

void run_1d(const Loop& l, int, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) l.fn1(l.ctx, i);
}

void run_2d(const Loop& l, int, size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
        const size_t i = t / l.tiles_j * l.tile_i;
        const size_t j = t % l.tiles_j * l.tile_j;
        l.fn2(l.ctx, i, j, std::min(l.tile_i, l.range_i - i), std::min(l.tile_j, l.range_j - j));
    }
}

void run_groups(const Loop& l, int group, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) l.fng(l.ctx, group, i);
}

struct alignas(64) Counter {
    std::atomic<size_t> next{0};
    size_t end = 0;
    size_t chunk = 1;
};

void validate(const PoolConfig& c) {
    if (c.num_threads < 0)
        throw std::invalid_argument("kt thread pool: num_threads must be >= 0 (0 = one per "
                                    "physical core), got " + std::to_string(c.num_threads));
    if (c.virtual_numa < 0)
        throw std::invalid_argument("kt thread pool: virtual_numa must be >= 0 (0 = real "
                                    "NUMA nodes), got " + std::to_string(c.virtual_numa));
    if (c.spin_us < 0)
        throw std::invalid_argument("kt thread pool: spin_us must be >= 0, got " +
                                    std::to_string(c.spin_us));
}

}  // namespace

struct ThreadPool::Impl {
    PoolConfig config;
    int n = 1;
    // More threads than cores: a spinning thread may be holding the CPU that the thread it
    // waits for needs, so spin loops yield instead of pausing.
    bool oversubscribed = false;
    std::vector<int> slot_group;
    std::vector<int> group_node;
    std::vector<int> group_sizes;
    std::vector<int> pinned;
    std::vector<std::thread> workers;
    // One per group, shared by every loop: loops are serialised by start_mutex, and a new
    // loop only starts once the previous one has no participant left.
    std::unique_ptr<Counter[]> counters;
    std::mutex start_mutex;

    // Bumped whenever workers have something new to look at (a loop, a job, stop).
    alignas(64) std::atomic<uint32_t> epoch{0};
    std::atomic<uint32_t> parked{0};
    std::atomic<bool> stop{false};
    std::atomic<int> started{0};

    alignas(64) std::atomic<uint64_t> loop_state{0};
    Loop* loop = nullptr;

    alignas(64) std::atomic<uint32_t> job_state{kNoJob};
    std::function<void()> job;
    std::exception_ptr job_error;
    // One sync() at a time takes the job's outcome and frees the slot (two racing syncs
    // both consumed job_error and could free a slot a third thread had refilled).
    std::mutex sync_mutex;

    explicit Impl(const PoolConfig& c) : config(c) {
        validate(c);
        const Topology& topo = topology();
        const int ncores = static_cast<int>(topo.cores.size());
        n = c.num_threads > 0 ? c.num_threads : std::max(1, ncores);
        oversubscribed = n > std::max(1, ncores);
        // More threads than cores wrap around: oversubscribed, but still spread evenly.
        auto core_of = [&](int slot) -> const PhysicalCore* {
            return ncores > 0 ? &topo.cores[slot % ncores] : nullptr;
        };
        auto node_of = [&](int slot) { return ncores > 0 ? core_of(slot)->numa_node : 0; };

        slot_group.resize(n);
        if (c.virtual_numa > 0) {
            const int groups = std::min(c.virtual_numa, n);
            for (int g = 0; g < groups; ++g) {
                const int first = static_cast<int>(int64_t(g) * n / groups);
                const int last = static_cast<int>(int64_t(g + 1) * n / groups);
                for (int s = first; s < last; ++s) slot_group[s] = g;
                group_node.push_back(node_of(first));
            }
        } else {
            for (int s = 0; s < n; ++s) {
                const int node = node_of(s);
                auto it = std::find(group_node.begin(), group_node.end(), node);
                if (it == group_node.end()) it = group_node.insert(group_node.end(), node);
                slot_group[s] = static_cast<int>(it - group_node.begin());
            }
        }
        group_sizes.assign(group_node.size(), 0);
        for (int g : slot_group) ++group_sizes[g];
        counters.reset(new Counter[group_node.size()]);
        pinned.assign(n, -1);

        try {
            workers.reserve(n - 1);
            for (int s = 1; s < n; ++s)
                workers.emplace_back([this, s, core = c.pin ? core_of(s) : nullptr] {
                    worker_main(s, core);
                });
        } catch (...) {
            shutdown();
            throw;
        }
        // pinned_cpus() must be complete once the constructor returns.
        while (started.load(std::memory_order_acquire) != n - 1) std::this_thread::yield();
    }

    ~Impl() {
        if (job_state.load(std::memory_order_acquire) != kNoJob) {
            try {
                sync();
            } catch (...) {
                // Nobody is left to receive the job's exception.
            }
        }
        shutdown();
    }

    void shutdown() {
        stop.store(true, std::memory_order_release);
        publish();
        for (std::thread& t : workers) t.join();
    }

    void relax() const {
        if (oversubscribed)
            std::this_thread::yield();
        else
            cpu_relax();
    }

    void publish() {
        // seq_cst pairs with the parked increment in wait_for_news: either we see the
        // parked thread, or it sees the new epoch before sleeping.
        epoch.fetch_add(1, std::memory_order_seq_cst);
        if (parked.load(std::memory_order_seq_cst) != 0) futex_wake_all(epoch);
    }

    uint32_t wait_for_news(uint32_t seen) {
        const auto spin_until =
            std::chrono::steady_clock::now() + std::chrono::microseconds(config.spin_us);
        for (unsigned i = 1;; ++i) {
            const uint32_t e = epoch.load(std::memory_order_acquire);
            if (e != seen) return e;
            relax();
            if (i % 64 == 0 && std::chrono::steady_clock::now() >= spin_until) break;
        }
        parked.fetch_add(1, std::memory_order_seq_cst);
        uint32_t e;
        while ((e = epoch.load(std::memory_order_seq_cst)) == seen) futex_wait(epoch, seen);
        parked.fetch_sub(1, std::memory_order_relaxed);
        return e;
    }

    void worker_main(int slot, const PhysicalCore* core) {
        tl_pool = this;
        tl_slot = slot;
        if (core && !core->cpus.empty() && pin_current_thread_to_core(*core))
            pinned[slot] = core->cpus.front();
        started.fetch_add(1, std::memory_order_release);

        uint32_t seen = epoch.load(std::memory_order_acquire);
        for (;;) {
            // One join attempt per epoch: rejoining an exhausted loop that its starter is
            // about to close would only fight the starter for the state cache line.
            try_join(slot_group[slot]);
            if (slot == 1 && job_state.load(std::memory_order_acquire) == kJobSubmitted)
                run_job();
            if (stop.load(std::memory_order_acquire)) return;
            seen = wait_for_news(seen);
        }
    }

    void try_join(int group) {
        uint64_t s = loop_state.load(std::memory_order_relaxed);
        while (s & kOpen) {
            if (loop_state.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                                 std::memory_order_relaxed)) {
                participate(*loop, group);
                loop_state.fetch_sub(1, std::memory_order_release);
                return;
            }
        }
    }

    // Drain the thread's own range first (NUMA locality), then steal from the others.
    void participate(Loop& l, int group) {
        BodyScope scope;
        const int first = l.num_ranges == 1 ? 0 : group;
        for (int k = 0; k < l.num_ranges; ++k) {
            const int r = (first + k) % l.num_ranges;
            Counter& c = counters[r];
            while (!l.failed.load(std::memory_order_relaxed)) {
                const size_t begin = c.next.fetch_add(c.chunk, std::memory_order_relaxed);
                if (begin >= c.end) break;
                try {
                    l.run(l, r, begin, std::min(begin + c.chunk, c.end));
                } catch (...) {
                    if (!l.failed.exchange(true, std::memory_order_relaxed))
                        l.error = std::current_exception();
                }
            }
        }
    }

    void run_loop(Loop& l) {
        size_t total = 0;
        for (int r = 0; r < l.num_ranges; ++r) total += l.ends[r];
        if (total == 0) return;
        if (tl_in_body || n == 1 || total == 1) {
            BodyScope scope;
            for (int r = 0; r < l.num_ranges; ++r) l.run(l, r, 0, l.ends[r]);
            return;
        }
        const int group = slot_group[tl_pool == this ? tl_slot : 0];
        {
            std::lock_guard<std::mutex> lock(start_mutex);
            for (int r = 0; r < l.num_ranges; ++r) {
                const size_t threads = l.num_ranges == 1 ? size_t(n) : size_t(group_sizes[r]);
                counters[r].next.store(0, std::memory_order_relaxed);
                counters[r].end = l.ends[r];
                counters[r].chunk = chunk_for(l.ends[r], threads);
            }
            loop = &l;
            loop_state.store(kOpen, std::memory_order_release);
            publish();
            participate(l, group);
            loop_state.fetch_and(~kOpen, std::memory_order_relaxed);
            for (unsigned i = 1; loop_state.load(std::memory_order_acquire) != 0; ++i) {
                // A participant may have been descheduled mid-body by another process.
                if (i % 1024 == 0)
                    std::this_thread::yield();
                else
                    relax();
            }
        }
        if (l.error) std::rethrow_exception(l.error);
    }

    void run_job() {
        job_state.store(kJobRunning, std::memory_order_relaxed);
        const void* outer_job = std::exchange(tl_job, this);
        {
            // Destroy the job (and what it captured) before sync() can return.
            std::function<void()> fn;
            fn.swap(job);
            try {
                fn();
            } catch (...) {
                job_error = std::current_exception();
            }
        }
        tl_job = outer_job;
        job_state.store(kJobDone, std::memory_order_release);
        publish();
    }

    void submit(std::function<void()> fn) {
        // Claim the slot atomically: with a separate check and store, two threads submitting
        // at once both passed the check and wrote `job` together (found by the TSan stress).
        uint32_t expected = kNoJob;
        if (!job_state.compare_exchange_strong(expected, kJobClaimed, std::memory_order_acq_rel))
            throw std::logic_error("kt thread pool: a job is already submitted; call sync() first");
        job = std::move(fn);
        job_state.store(kJobSubmitted, std::memory_order_release);
        if (n > 1) publish();
    }

    void sync() {
        if (job_state.load(std::memory_order_acquire) == kNoJob) return;
        if (tl_job == this || tl_in_body)
            throw std::logic_error("kt thread pool: sync() called from inside the job or a loop "
                                   "body would wait for itself; call it from the submitting thread");
        std::lock_guard<std::mutex> lock(sync_mutex);
        // Another sync() may have taken the outcome while this one waited for the lock.
        if (job_state.load(std::memory_order_acquire) == kNoJob) return;
        if (n == 1) {
            // A submit() still storing its job: wait until it is runnable.
            while (job_state.load(std::memory_order_acquire) == kJobClaimed) std::this_thread::yield();
            run_job();
        } else {
            // Join the job's loops as the caller's slot until the leader reports done.
            const int group = slot_group[0];
            uint32_t seen = epoch.load(std::memory_order_acquire);
            while (job_state.load(std::memory_order_acquire) != kJobDone) {
                try_join(group);
                seen = wait_for_news(seen);
            }
        }
        std::exception_ptr error = std::exchange(job_error, nullptr);
        job_state.store(kNoJob, std::memory_order_release);
        if (error) std::rethrow_exception(error);
    }
};

ThreadPool::ThreadPool(const PoolConfig& config) : impl_(new Impl(config)) {}
ThreadPool::~ThreadPool() { delete impl_; }

int ThreadPool::num_threads() const { return impl_->n; }
int ThreadPool::num_groups() const { return static_cast<int>(impl_->group_node.size()); }
int ThreadPool::group_numa_node(int group) const { return impl_->group_node.at(group); }
int ThreadPool::group_size(int group) const { return impl_->group_sizes.at(group); }
const PoolConfig& ThreadPool::config() const { return impl_->config; }

void ThreadPool::parallel_for(size_t range, Fn1D fn, void* ctx) {
    Loop l;
    l.run = run_1d;
    l.fn1 = fn;
    l.ctx = ctx;
    l.ends = &range;
    impl_->run_loop(l);
}

void ThreadPool::parallel_for_2d(size_t range_i, size_t range_j, size_t tile_i, size_t tile_j,
                                 Fn2DTile fn, void* ctx) {
    if (tile_i == 0 || tile_j == 0)
        throw std::invalid_argument("kt thread pool: parallel_for_2d tiles must be at least "
                                    "1x1, got " + std::to_string(tile_i) + "x" +
                                    std::to_string(tile_j));
    Loop l;
    l.run = run_2d;
    l.fn2 = fn;
    l.ctx = ctx;
    l.range_i = range_i;
    l.range_j = range_j;
    l.tile_i = tile_i;
    l.tile_j = tile_j;
    l.tiles_j = (range_j + tile_j - 1) / tile_j;
    const size_t tiles = (range_i + tile_i - 1) / tile_i * l.tiles_j;
    l.ends = &tiles;
    impl_->run_loop(l);
}

void ThreadPool::parallel_for_groups(const size_t* ranges, FnGroup fn, void* ctx) {
    Loop l;
    l.run = run_groups;
    l.fng = fn;
    l.ctx = ctx;
    l.ends = ranges;
    l.num_ranges = num_groups();
    impl_->run_loop(l);
}

void ThreadPool::submit(std::function<void()> job) { impl_->submit(std::move(job)); }
void ThreadPool::sync() { impl_->sync(); }
void ThreadPool::wake() { impl_->publish(); }
bool ThreadPool::job_pending() const {
    return impl_->job_state.load(std::memory_order_acquire) != kNoJob;
}

std::vector<int> ThreadPool::pinned_cpus() const { return impl_->pinned; }

namespace {

struct GlobalPool {
    std::mutex mutex;
    std::unique_ptr<ThreadPool> pool;
    PoolConfig config;
    std::vector<std::mutex*> user_mutexes;   // guarded by user_registry_mutex
};

std::mutex user_registry_mutex;
GlobalPool& global();

// pthread_atfork handlers (see register_pool_user_mutex). The registered mutexes and the pool's
// are taken before fork() in a fixed order, so the child inherits them unlocked and the
// pool's state consistent: fork() waits for forwards in flight.
void before_fork() {
    user_registry_mutex.lock();
    GlobalPool& g = global();
    for (std::mutex* m : g.user_mutexes) m->lock();
    g.mutex.lock();
}

void after_fork_parent() {
    GlobalPool& g = global();
    g.mutex.unlock();
    for (auto it = g.user_mutexes.rbegin(); it != g.user_mutexes.rend(); ++it) (*it)->unlock();
    user_registry_mutex.unlock();
}

void after_fork_child() {
    GlobalPool& g = global();
    if (g.pool) {
        // The workers do not exist here: neither join them (pthread_join would wait forever
        // on a thread of the parent) nor hand them work. Abandon the pool; a fresh one starts
        // on next use. Before this, a child's submit()+sync() hung and its exit() hung.
        (void)g.pool.release();
    }
    g.mutex.unlock();
    for (auto it = g.user_mutexes.rbegin(); it != g.user_mutexes.rend(); ++it) (*it)->unlock();
    user_registry_mutex.unlock();
}

GlobalPool& global() {
    static GlobalPool g;
    static const int registered = pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    (void)registered;
    return g;
}

}  // namespace

void register_pool_user_mutex(std::mutex* mutex) {
    std::lock_guard<std::mutex> lock(user_registry_mutex);
    global().user_mutexes.push_back(mutex);
}

ThreadPool& global_pool() {
    GlobalPool& g = global();
    std::lock_guard<std::mutex> lock(g.mutex);
    if (!g.pool) g.pool = std::make_unique<ThreadPool>(g.config);
    return *g.pool;
}

void configure_global_pool(const PoolConfig& config) {
    validate(config);
    GlobalPool& g = global();
    // No forward runs while the pool is replaced: it holds a reference to the pool for its
    // whole run, and replacing it from another thread freed the pool under it.
    std::lock_guard<std::mutex> registry(user_registry_mutex);
    struct Held {
        std::vector<std::mutex*>& m;
        explicit Held(std::vector<std::mutex*>& v) : m(v) { for (std::mutex* x : m) x->lock(); }
        ~Held() { for (auto it = m.rbegin(); it != m.rend(); ++it) (*it)->unlock(); }
    } users(g.user_mutexes);
    std::lock_guard<std::mutex> lock(g.mutex);
    if (g.pool && g.pool->job_pending())
        throw std::logic_error("kt thread pool: cannot reconfigure the global pool while a "
                               "submitted job is pending; call sync() first");
    g.config = config;
    if (g.pool) {
        // Join the old workers before starting new ones so the cores are never doubly booked.
        g.pool.reset();
        g.pool = std::make_unique<ThreadPool>(config);
    }
}

bool global_pool_exists() {
    GlobalPool& g = global();
    std::lock_guard<std::mutex> lock(g.mutex);
    return g.pool != nullptr;
}

}  // namespace kt
