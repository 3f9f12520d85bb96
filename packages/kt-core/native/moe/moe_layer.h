// One MoE layer's routed experts on the CPU: packed weights placed per NUMA group, and the
// forward path of DESIGN.md §3 driven through a backend's kernel table.
#pragma once
#include <kt/plugin.h>
#include <kt/formats/gated_activation.h>

#include "memory/numa_allocator.h"
#include "moe/grouped_lora.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kt {

class MoeLayer {
public:
    // `kernels` belongs to a validated, initialised backend that outlives the layer.
    // expert_on_cpu[e] == false marks a GPU-resident expert: nothing is packed for it and
    // routing to it is skipped. max_tokens bounds one forward (chunked_prefill_size).
    // `packer` packs the experts when `kernels` packs nothing itself (ABI 1.3: kernels that
    // compute on another backend's layout); it must write kernels' layout and outlive the layer.
    MoeLayer(const kt_moe_config& shape, const kt_method_kernels* kernels,
             std::vector<bool> expert_on_cpu, int64_t max_tokens, const kt_method_kernels* packer = nullptr);

    // Pack expert `expert` from unpacked matrices into memory on its NUMA group's node.
    void load_expert(int64_t expert, const kt_expert_weights& weights);
    // Pack `count` experts in parallel on the pool; all are installed or, on the first
    // error (std::invalid_argument naming the expert), none.
    void load_experts(const int64_t* experts, const kt_expert_weights* weights, size_t count);
    // Install `count` experts' packed bytes (this layer's layout, expert_bytes each) read from
    // file descriptor fd at offsets[i], in parallel, each read by a thread of its NUMA group
    // into memory on its node; all-or-nothing as load_experts. A short file throws
    // std::invalid_argument naming the byte it ends at. The caller vouches that the bytes
    // were written by copy_packed for this layout id (kt_core checks the manifest).
    void load_packed(const int64_t* experts, const uint64_t* offsets, size_t count, int fd);
    // Serve `count` experts straight from the page cache: fd is mapped read-only (populated
    // at once) and expert i's packed bytes are those at offsets[i], which must be 64-byte
    // aligned and lie inside the file (std::invalid_argument otherwise). No copy and no new
    // memory: the pages are the file's cached pages, shared with other processes mapping it.
    // The experts keep the mapping alive; the file must not shrink while they use it (kt
    // replaces its files by rename, which never does).
    void map_packed(const int64_t* experts, const uint64_t* offsets, size_t count, int fd);
    // A copy of a loaded expert's packed bytes (what load_packed reads back).
    std::vector<char> copy_packed(int64_t expert) const;
    bool expert_loaded(int64_t expert) const;

    // Which experts forwards compute from now on (SGLang moves experts between GPU and CPU at
    // run time: kt-kernel's gpu_experts_mask.copy_). routed[e] may be true only for an expert
    // the layer holds on the CPU (expert_on_cpu at construction), std::invalid_argument
    // otherwise; a routed expert without weights fails the next forward, naming it. Takes the
    // forward lock, so it lands between forwards, never inside one.
    void set_routed(std::vector<bool> routed);

    // The pool groups (NUMA nodes, or virtual groups) this layer's experts live and run on:
    // experts are sharded over them in contiguous runs (default: every group). Before any
    // expert is loaded, std::invalid_argument otherwise or for a group outside the pool.
    void set_groups(const std::vector<int>& groups);
    std::vector<bool> routed() const;

    // out[T, hidden] (f32 or bf16) = sum_j weights[t, j] * expert_{ids[t, j]}(hidden[t]).
    // Validates ids before any work (std::invalid_argument naming the first bad one).
    // Thread-safe: forwards of different layers are serialised on the process pool.
    void forward(const void* hidden, kt_dtype hidden_dtype, int64_t tokens, const int64_t* ids,
                 const float* weights, void* out, kt_dtype out_dtype) const;

    // The checks forward() starts with (token count, output dtype, every id in [-1, E)), for a
    // caller that queues the forward and must refuse bad input before it runs (submit).
    // Argument checking lives here and in the bindings' shape checks, not in Python.
    void check_forward_arguments(int64_t tokens, const int64_t* ids, kt_dtype out_dtype) const;

    const kt_moe_config& shape() const { return shape_; }
    const kt_method_kernels& kernels() const { return *kernels_; }
    const kt_method_kernels& packer() const { return *packer_; }   // kernels_ unless they borrow one

    // Kernels for the batches the main kernels decline (a matrix engine hands decode-sized
    // batches to SIMD kernels): they must read the same packed bytes, so their layout id and
    // packed size must equal the main kernels' (std::invalid_argument otherwise). They must
    // belong to an initialised backend that outlives the layer. nullptr removes them. Set them
    // before the first forward (kt_core.MoE does, at construction): forwards read them unlocked.
    void set_small_batch_kernels(const kt_method_kernels* kernels);

    // Experts with gate, up and down biases (GPT-OSS): the layer runs the kernels'
    // gate_up_raw_tile (ABI 1.4) and adds the biases and the gated activation itself, and adds
    // each routed expert's down bias, weighted, into the sum. Before the first forward;
    // std::invalid_argument when the kernels (or the small-batch ones) have no raw tile.
    void enable_expert_bias();
    bool expert_bias() const { return expert_bias_; }
    // A gated activation no kernel computes (gated_activation.h): the limit after SiLU,
    // min(SiLU(g), limit) * clamp(u, -limit, limit), or GELU-tanh(g) * u (limit unused). The layer
    // runs gate_up_raw_tile and applies it itself, as for biases. Before the first forward; the
    // kernels then see no swiglu setting.
    void enable_layer_activation(activation::GatedForm form, float limit);
    // Expert `expert`'s biases: gate and up [intermediate], down [hidden] (copied). Every
    // expert a forward routes to must have them (the forward names one that does not).
    void set_expert_bias(int64_t expert, const float* gate, const float* up, const float* down);
    const kt_method_kernels* small_batch_kernels() const { return small_batch_; }

    // Training's products (kt_core.MoE.grouped_*; grouped_products.cpp): `rows` rows already
    // grouped by expert — counts[e] rows of expert e, experts in index order, counts summing to
    // rows — times the layer's packed weights, on the pool. f32 row-major throughout; every
    // expert with rows must be loaded (std::invalid_argument naming the first that is not).
    // x [rows, H] -> gate_up [rows, 2I]: the raw products x·gateᵀ in columns [0, I) and x·upᵀ in
    // [I, 2I) (transformers' fused gate_up order; ABI 1.4's raw tile; x is quantized as the method's
    // forward quantizes activations). With `token`, x is [tokens, H] and row i is x[token[i]]: the
    // rows are quantized straight from x, never gathered into a [rows, H] copy.
    // Each product takes an optional adapter riding on it (grouped_lora.h): its term is added to
    // the output tile by tile (the gate/up adapter's blocks are 1 or 2: gate and up their own rank
    // slices; down's 1).
    void grouped_gate_up(const float* x, const int64_t* token, int64_t rows, const int64_t* counts, float* gate_up,
                         const ProductLora* lora = nullptr) const;
    // h [rows, I] -> y [rows, H] = h·downᵀ.
    void grouped_down(const float* h, int64_t rows, const int64_t* counts, float* y, const ProductLora* lora = nullptr) const;
    // ABI 1.5's transposed tiles, gradients used as given: dgate_up [rows, 2I] (dgate | dup) ->
    // dx [rows, H] = dgate·gate + dup·up, and dy [rows, H] -> dh [rows, I] = dy·down.
    void grouped_gate_up_transposed(const float* dgate_up, int64_t rows, const int64_t* counts, float* dx,
                                    const ProductLoraGrad* lora = nullptr) const;
    void grouped_down_transposed(const float* dy, int64_t rows, const int64_t* counts, float* dh,
                                 const ProductLoraGrad* lora = nullptr) const;
    // Whether this layer's kernels (or its small-batch ones) can run the four above, and if not why.
    std::string training_support() const;
    // The kernels a forward of `tokens` tokens runs.
    const kt_method_kernels& kernels_for(int64_t tokens) const;
    int64_t max_tokens() const { return max_tokens_; }
    size_t packed_bytes() const;                 // all loaded experts
    int expert_group(int64_t expert) const;      // pool group holding the expert

private:
    friend class ForwardPass;   // forward's phases (moe_layer.cpp) read the placement and packed weights
    friend class GroupedPass;   // training's products (grouped_products.cpp) too
    void forward_whole_op(const kt_method_kernels& kernels, const void* hidden, kt_dtype hidden_dtype, int64_t tokens,
                          const int64_t* ids, const float* weights, void* out, kt_dtype out_dtype) const;
    void check_expert_index(int64_t expert) const;
    NumaBuffer pack(int64_t expert, const kt_expert_weights& weights) const;
    NumaBuffer expert_buffer(int64_t expert) const;   // expert_bytes_ on the node of its group
    // Validates the expert list, runs make(ctx, i, buffer) for each on a thread of the
    // expert's NUMA group, and installs all buffers or, on the first error, none.
    void install_in_parallel(const int64_t* experts, size_t count, void (*make)(void*, size_t, NumaBuffer&), void* ctx);
    void check_expert_list(const int64_t* experts, size_t count) const;   // in range, on the CPU, no repeats
    void place_on(const std::vector<int>& groups);   // experts over these groups in contiguous runs
    static void require_raw_tile(const kt_method_kernels& k);   // what a layer with expert biases needs

    kt_moe_config shape_;
    const kt_method_kernels* kernels_;
    const kt_method_kernels* packer_;
    const kt_method_kernels* small_batch_ = nullptr;
    std::vector<bool> on_cpu_;    // experts this layer may hold (placement at construction)
    std::vector<bool> routed_;    // experts forwards compute now: a subset of on_cpu_ (set_routed)
    int64_t max_tokens_;
    size_t expert_bytes_;
    // One per expert, empty when not loaded: node memory of its own, or a view into a file
    // mapping that the layer's experts share (shared_ptr's aliasing constructor).
    std::vector<std::shared_ptr<void>> packed_;
    std::vector<int> group_of_expert_;
    bool expert_bias_ = false;
    // Not silu: the gated activation this layer applies itself (with limit_after_ for the limit after SiLU).
    activation::GatedForm form_ = activation::GatedForm::silu;
    float limit_after_ = 0.0f;
    // The fused gate/up tile cannot compute the layer's activation: raw products, activation here.
    bool raw_gate_up() const { return expert_bias_ || form_ != activation::GatedForm::silu; }
    // Per expert, empty until set: gate bias [I], up bias [I], down bias [H], one after another.
    std::vector<std::vector<float>> bias_;
};

// Frees the process-wide scratch buffers forwards reuse (KTMoEWrapper.clear_buffer_cache).
void clear_forward_scratch();
size_t forward_scratch_bytes();

}  // namespace kt
