// One MoE layer's routed experts on the CPU: packed weights placed per NUMA group, and the
// forward path of DESIGN.md §3 driven through a backend's kernel table.
#pragma once
#include <kt/plugin.h>

#include "memory/numa_allocator.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kt {

class MoeLayer {
public:
    // `kernels` belongs to a validated, initialised backend that outlives the layer.
    // expert_on_cpu[e] == false marks a GPU-resident expert: nothing is packed for it and
    // routing to it is skipped. max_tokens bounds one forward (chunked_prefill_size).
    MoeLayer(const kt_moe_config& shape, const kt_method_kernels* kernels,
             std::vector<bool> expert_on_cpu, int64_t max_tokens);

    // Pack expert `expert` from unpacked matrices into memory on its NUMA group's node.
    void load_expert(int64_t expert, const kt_expert_weights& weights);
    // Pack `count` experts in parallel on the pool; all are installed or, on the first
    // error (std::invalid_argument naming the expert), none.
    void load_experts(const int64_t* experts, const kt_expert_weights* weights, size_t count);
    bool expert_loaded(int64_t expert) const;

    // out[T, hidden] (f32 or bf16) = sum_j weights[t, j] * expert_{ids[t, j]}(hidden[t]).
    // Validates ids before any work (std::invalid_argument naming the first bad one).
    // Thread-safe: forwards of different layers are serialised on the process pool.
    void forward(const void* hidden, kt_dtype hidden_dtype, int64_t tokens, const int64_t* ids,
                 const float* weights, void* out, kt_dtype out_dtype) const;

    const kt_moe_config& shape() const { return shape_; }
    const kt_method_kernels& kernels() const { return *kernels_; }

    // Kernels for the batches the main kernels decline (a matrix engine hands decode-sized
    // batches to SIMD kernels): they must read the same packed bytes, so their layout id and
    // packed size must equal the main kernels' (std::invalid_argument otherwise). They must
    // belong to an initialised backend that outlives the layer. nullptr removes them. Set them
    // before the first forward (kt_core.MoE does, at construction): forwards read them unlocked.
    void set_small_batch_kernels(const kt_method_kernels* kernels);
    const kt_method_kernels* small_batch_kernels() const { return small_batch_; }
    // The kernels a forward of `tokens` tokens runs.
    const kt_method_kernels& kernels_for(int64_t tokens) const;
    int64_t max_tokens() const { return max_tokens_; }
    size_t packed_bytes() const;                 // all loaded experts
    int expert_group(int64_t expert) const;      // pool group holding the expert

private:
    void check_expert_index(int64_t expert) const;
    NumaBuffer pack(int64_t expert, const kt_expert_weights& weights) const;

    kt_moe_config shape_;
    const kt_method_kernels* kernels_;
    const kt_method_kernels* small_batch_ = nullptr;
    std::vector<bool> on_cpu_;
    int64_t max_tokens_;
    size_t expert_bytes_;
    std::vector<NumaBuffer> packed_;            // one per expert, empty when not loaded
    std::vector<int> group_of_expert_;
};

// Frees the process-wide scratch buffers forwards reuse (KTMoEWrapper.clear_buffer_cache).
void clear_forward_scratch();
size_t forward_scratch_bytes();

}  // namespace kt
