// What the layer's passes over its experts share (moe_layer.cpp's forward, grouped_products.cpp's
// training products): the lock that gives a pass the pool and the scratch, failure collection
// from pool threads, and the (expert x output block) tiling.
#pragma once
#include "abi/host_api.h"
#include "pool/thread_pool.h"

#include <kt/plugin.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace kt {

// Passes share the whole pool and one scratch buffer (pass_scratch), so they run one at a
// time; a second layer's pass simply waits (layers of one model are sequential anyway).
extern std::mutex g_forward_mutex;

// The passes' one scratch buffer, at least `bytes` (64-byte aligned), kept between passes and
// grown when a pass needs more: a fresh allocation per pass cost page faults and zero-filling
// (at 2048 tokens of Qwen3-30B-A3B a training step's two grouped products quantize ~190 MB of
// activation rows; kept, its gate/up went 279-282 -> 246-247 ms on Zen 4).
// Only under g_forward_mutex; the buffer is the caller's until it releases the lock.
char* pass_scratch(size_t bytes);

// Kernel calls happen on pool threads; the first failure is kept and rethrown on the
// calling thread once the loop has finished.
class FailureSlot {
public:
    void record(kt_status status, const char* what) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (status_ == KT_OK) {
            status_ = status;
            what_ = what;
            message_ = take_plugin_error();
        }
    }
    void rethrow() {
        if (status_ == KT_OK) return;
        host_api()->set_error(message_.c_str());
        throw_plugin_failure(status_, what_);
    }

private:
    std::mutex mutex_;
    kt_status status_ = KT_OK;
    const char* what_ = "";
    std::string message_;
};

template <class F>
void parallel(ThreadPool* pool, size_t range, F& body) {
    if (!pool) {
        for (size_t i = 0; i < range; ++i) body(i);
        return;
    }
    pool->parallel_for(range, [](void* ctx, size_t i) { (*static_cast<F*>(ctx))(i); }, &body);
}

// Where each expert's rows start in rows grouped by expert (counts[e] of expert e, in index order),
// and where the last ends: experts + 1 offsets.
inline std::vector<int64_t> row_offsets(const int64_t* counts, int64_t experts) {
    std::vector<int64_t> first(size_t(experts) + 1, 0);
    for (int64_t e = 0; e < experts; ++e) first[size_t(e) + 1] = first[size_t(e)] + counts[e];
    return first;
}

struct Tile {
    int32_t active;   // index into the active-expert list
    int64_t n0, n1;
};

// (expert x output block) tasks grouped by the NUMA group holding each expert. Blocks
// are sized so the pool has ~4 tasks per thread when it can, never below the kernel's block.
struct TilePlan {
    std::vector<std::vector<Tile>> per_group;
    std::vector<size_t> ranges;
    int64_t block;   // columns per tile (the last of an expert may have fewer)
};

// (expert x output block) tiles over n output columns for the experts `active` lists, grouped by
// the pool group holding each; ~4 tiles per thread where the experts allow, never below the
// kernel's block.
inline TilePlan plan_tiles(const std::vector<int32_t>& active, const std::vector<int>& group_of_expert, int groups,
                           int threads, int64_t n, int64_t kernel_block) {
    TilePlan tp;
    tp.per_group.resize(size_t(groups));
    tp.ranges.assign(size_t(groups), 0);
    const int64_t wanted = std::max<int64_t>(1, (4 * threads + int64_t(active.size()) - 1) / int64_t(active.size()));
    const int64_t per = (n + wanted - 1) / wanted;
    tp.block = std::max(kernel_block, (per + kernel_block - 1) / kernel_block * kernel_block);
    for (size_t a = 0; a < active.size(); ++a) {
        const int g = group_of_expert[size_t(active[a])] % groups;
        for (int64_t n0 = 0; n0 < n; n0 += tp.block) tp.per_group[size_t(g)].push_back({int32_t(a), n0, std::min(n, n0 + tp.block)});
    }
    for (int g = 0; g < groups; ++g) tp.ranges[size_t(g)] = tp.per_group[size_t(g)].size();
    return tp;
}

// Every tile of the plan through body(tile): on the calling thread when pool is null, else on
// the pool, each group's tiles on its own threads first.
template <class Body>
void run_tiles(ThreadPool* pool, const TilePlan& tp, Body& body) {
    if (!pool) {
        for (const auto& tiles : tp.per_group)
            for (const Tile& t : tiles) body(t);
        return;
    }
    struct Ctx { const TilePlan* tp; Body* body; } ctx{&tp, &body};
    pool->parallel_for_groups(
        tp.ranges.data(),
        [](void* c, int g, size_t i) {
            auto* x = static_cast<Ctx*>(c);
            (*x->body)(x->tp->per_group[size_t(g)][i]);
        },
        &ctx);
}

}  // namespace kt
