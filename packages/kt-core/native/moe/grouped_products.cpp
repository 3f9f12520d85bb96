// Training's products over a layer's packed experts (MoeLayer::grouped_*): rows that the caller
// has already grouped by expert, times each expert's weights or their transpose. A training step
// (kt_core.training_step) composes them with kt-core's row passes: forward = grouped_gate_up (on
// x[token], quantized straight from x), the activation, grouped_down; backward =
// grouped_down_transposed and grouped_gate_up_transposed for the gradients of the expert inputs.
// Each product can carry a LoRA adapter (grouped_lora.h: ProductLora, ProductLoraGrad), its term
// added to the product's output tile by tile while the tile is in cache.
#include "moe/moe_layer.h"
#include "moe/tiles.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kt {

namespace {

// Below this many multiply-adds a pass runs on the calling thread alone (as forwards do).
constexpr int64_t kSerialMacs = int64_t(1) << 20;

bool has_raw_tile(const kt_method_kernels* k) {
    return k && KT_HAS_FIELD(k, kt_method_kernels, gate_up_raw_tile) && k->gate_up_raw_tile;
}
bool has_transposed(const kt_method_kernels* k) {
    return k && KT_HAS_FIELD(k, kt_method_kernels, down_transposed_tile) && k->gate_up_transposed_tile &&
           k->down_transposed_tile && k->transposed_block > 0;
}

}  // namespace

// One grouped product: validates the grouping, picks the kernels, and runs (expert x column
// block) tiles on the pool under the forward lock.
class GroupedPass {
public:
    GroupedPass(const MoeLayer& layer, int64_t rows, const int64_t* counts, int64_t macs_per_row)
        : layer_(layer), pool_(global_pool()), lock_(g_forward_mutex) {
        const int64_t E = layer.shape_.num_experts;
        offset_.assign(size_t(E) + 1, 0);
        for (int64_t e = 0; e < E; ++e) {
            if (counts[e] < 0)
                throw std::invalid_argument("counts[" + std::to_string(e) + "] = " + std::to_string(counts[e]) +
                                            " is negative");
            offset_[size_t(e) + 1] = offset_[size_t(e)] + counts[e];
            if (!counts[e]) continue;
            if (!layer.on_cpu_[size_t(e)] || !layer.packed_[size_t(e)])
                throw std::invalid_argument("expert " + std::to_string(e) + " has " + std::to_string(counts[e]) +
                                            " rows but no weights on the CPU: load it first");
            active_.push_back(int32_t(e));
        }
        if (offset_[size_t(E)] != rows)
            throw std::invalid_argument("counts sum to " + std::to_string(offset_[size_t(E)]) + " rows; the arrays hold " +
                                        std::to_string(rows));
        serial_ = rows * macs_per_row < kSerialMacs;
        threads_ = serial_ ? 1 : pool_.num_threads();
    }

    bool empty() const { return active_.empty(); }
    int64_t active_experts() const { return int64_t(active_.size()); }
    int64_t first_row(int32_t e) const { return offset_[size_t(e)]; }
    int64_t rows_of(int32_t e) const { return offset_[size_t(e) + 1] - offset_[size_t(e)]; }

    // body(expert, n0, n1) over [0, n) in blocks of at least `block` columns; kernel failures
    // recorded with failure(status, what) are rethrown once every tile has run.
    template <class Body>
    void tiles(int64_t n, int64_t block, Body&& body) {
        const TilePlan plan = plan_tiles(active_, layer_.group_of_expert_, pool_.num_groups(), threads_, n, block);
        auto tile = [&](const Tile& t) { body(active_[size_t(t.active)], t.n0, t.n1); };
        run_tiles(serial_ ? nullptr : &pool_, plan, tile);
        failure_.rethrow();
    }
    // body(expert) for each expert with rows.
    template <class Body>
    void experts(Body&& body) {
        auto each = [&](const Tile& t) { body(active_[size_t(t.active)]); };
        const TilePlan plan = plan_tiles(active_, layer_.group_of_expert_, pool_.num_groups(), 1, 1, 1);
        run_tiles(serial_ ? nullptr : &pool_, plan, each);
        failure_.rethrow();
    }
    void failure(kt_status st, const char* what) {
        if (st != KT_OK) failure_.record(st, what);
    }
    const void* packed(int32_t e) const { return layer_.packed_[size_t(e)].get(); }

    // `rows` rows of `width` floats quantized as the kernels' activations, one expert at a time,
    // into the passes' scratch (pass_scratch: valid while this pass holds the lock). Row i is
    // x + (token ? token[i] : i) * width (rows are independent in the quantized layout: kt/plugin.h).
    // then(e, i0, i1) runs right after rows [i0, i1) of expert e are quantized — kChunkRows at a
    // time, on the same thread, while they are in its L1/L2 (an expert's 128 rows of 2048 floats
    // are its whole L2; read again after them, they came from memory a second time).
    static constexpr int64_t kChunkRows = 16;
    template <class Then>
    const char* quantize(const kt_method_kernels& k, const float* x, const int64_t* token, int64_t rows, int64_t width,
                         Then&& then) {
        const size_t row_bytes = k.activation_row_bytes(width);
        char* base = pass_scratch(size_t(rows) * row_bytes + 64);
        experts([&](int32_t e) {
            const int64_t r1 = first_row(e) + rows_of(e);
            for (int64_t i0 = first_row(e); i0 < r1; i0 += kChunkRows) {
                const int64_t i1 = std::min(r1, i0 + kChunkRows);
                if (!token) {
                    failure(k.quantize_activations(x + i0 * width, KT_DTYPE_F32, i1 - i0, width, width,
                                                   base + size_t(i0) * row_bytes),
                            "quantizing activations");
                } else {
                    for (int64_t i = i0; i < i1; ++i)
                        failure(k.quantize_activations(x + token[i] * width, KT_DTYPE_F32, 1, width, width,
                                                       base + size_t(i) * row_bytes),
                                "quantizing activations");
                }
                then(e, i0, i1);
            }
        });
        return base;
    }

private:
    const MoeLayer& layer_;
    ThreadPool& pool_;
    std::lock_guard<std::mutex> lock_;
    std::vector<int64_t> offset_;
    std::vector<int32_t> active_;
    bool serial_ = true;
    int threads_ = 1;
    FailureSlot failure_;
};

namespace {

// The first of the layer's kernel tables (main, then small-batch) that has `has`; both share
// the packed layout, so either computes on the same bytes.
template <class Has>
const kt_method_kernels* pick(const MoeLayer& layer, Has has) {
    if (has(&layer.kernels())) return &layer.kernels();
    if (has(layer.small_batch_kernels())) return layer.small_batch_kernels();
    return nullptr;
}

const kt_method_kernels& need(const kt_method_kernels* k, const MoeLayer& layer, const char* what) {
    if (k) return *k;
    throw std::invalid_argument(std::string(layer.kernels().kernel_id) + " (method " + layer.kernels().method +
                                ") has no " + what + ", which training through this layer needs; " +
                                "kt-backend-avx and the reference backend have it");
}

// Columns per kernel call under an adapter's epilogue: the call's output (an expert's rows x these
// columns, in each of `parts` halves) stays within 128 KiB of L2 until the epilogue adds to it;
// left for the epilogue to read from L3, a whole expert's tile doubled the adapter's cost (Qwen3-
// 30B-A3B layer, 2048 tokens: down's adapter 10 -> 1-3 ms). A whole multiple of the kernel's block.
int64_t epilogue_columns(int64_t kernel_block, int64_t rows, int64_t active_experts, int parts) {
    const int64_t per_expert = std::max<int64_t>(1, rows / std::max<int64_t>(1, active_experts));
    const int64_t want = (int64_t(1) << 15) / (per_expert * parts);
    return std::max(kernel_block, want / kernel_block * kernel_block);
}

}  // namespace

std::string MoeLayer::training_support() const {
    if (!pick(*this, has_raw_tile)) return std::string(kernels_->kernel_id) + " has no gate_up_raw_tile (plugin ABI 1.4)";
    if (!pick(*this, has_transposed)) return std::string(kernels_->kernel_id) + " has no transposed tiles (plugin ABI 1.5)";
    return "";
}

void MoeLayer::grouped_gate_up(const float* x, const int64_t* token, int64_t rows, const int64_t* counts, float* gate_up,
                               const ProductLora* lora) const {
    const kt_method_kernels& k = need(pick(*this, has_raw_tile), *this, "gate_up_raw_tile (plugin ABI 1.4)");
    const int64_t H = shape_.hidden, I = shape_.intermediate, N = 2 * I;
    if (lora && lora->blocks != 1 && lora->blocks != 2)
        throw std::invalid_argument("the gate/up adapter's blocks must be 1 or 2, got " + std::to_string(lora->blocks));
    GroupedPass pass(*this, rows, counts, 2 * H * I);
    if (pass.empty()) return;
    const LoraShape ls = lora ? LoraShape{shape_.num_experts, lora->rank, H, N, rows, lora->blocks} : LoraShape{};
    const char* act = pass.quantize(k, x, token, rows, H, [&](int32_t e, int64_t i0, int64_t i1) {
        if (lora)
            lora_project(ls, i1 - i0, token ? x : x + i0 * H, token ? token + i0 : nullptr, lora->a + e * lora->rank * H,
                         lora->xa + i0 * lora->rank);
    });
    const size_t row_bytes = k.activation_row_bytes(H);
    const int64_t sub = lora ? epilogue_columns(k.gate_up_block, rows, pass.active_experts(), 2) : I;
    pass.tiles(I, k.gate_up_block, [&](int32_t e, int64_t t0, int64_t t1) {
        const int64_t r0 = pass.first_row(e), n = pass.rows_of(e);
        float* row = gate_up + r0 * N;
        for (int64_t n0 = t0; n0 < t1; n0 += sub) {
            const int64_t n1 = std::min(t1, n0 + sub);
            // The raw tile writes tile-local columns: hand it the tile's first column of each half.
            pass.failure(k.gate_up_raw_tile(&shape_, pass.packed(e), act + size_t(r0) * row_bytes, n, n0, n1, row + n0,
                                            row + I + n0, N),
                         "the gate/up kernel");
            if (!lora) continue;
            // gate (half 0) and up (half 1): with two blocks each half takes its own rank slice.
            const int64_t slice = lora->rank / lora->blocks;
            const float* bt = lora->bt + e * slice * N;
            for (int64_t half = 0; half < 2; ++half)
                lora_expand(n, slice, n1 - n0, lora->scaling,
                            lora->xa + r0 * lora->rank + (lora->blocks == 2 ? half * slice : 0), lora->rank,
                            bt + half * I + n0, N, row + half * I + n0, N);
        }
    });
}

void MoeLayer::grouped_down(const float* h, int64_t rows, const int64_t* counts, float* y, const ProductLora* lora) const {
    const kt_method_kernels& k = need(pick(*this, has_raw_tile), *this, "gate_up_raw_tile (plugin ABI 1.4)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    if (lora && lora->blocks != 1)
        throw std::invalid_argument("the down adapter's blocks must be 1, got " + std::to_string(lora->blocks));
    GroupedPass pass(*this, rows, counts, H * I);
    if (pass.empty()) return;
    const LoraShape ls = lora ? LoraShape{shape_.num_experts, lora->rank, I, H, rows, 1} : LoraShape{};
    const char* act = pass.quantize(k, h, nullptr, rows, I, [&](int32_t e, int64_t i0, int64_t i1) {
        if (lora) lora_project(ls, i1 - i0, h + i0 * I, nullptr, lora->a + e * lora->rank * I, lora->xa + i0 * lora->rank);
    });
    const size_t row_bytes = k.activation_row_bytes(I);
    const int64_t sub = lora ? epilogue_columns(k.down_block, rows, pass.active_experts(), 1) : H;
    pass.tiles(H, k.down_block, [&](int32_t e, int64_t t0, int64_t t1) {
        const int64_t r0 = pass.first_row(e), n = pass.rows_of(e);
        for (int64_t n0 = t0; n0 < t1; n0 += sub) {
            const int64_t n1 = std::min(t1, n0 + sub);
            pass.failure(k.down_tile(&shape_, pass.packed(e), act + size_t(r0) * row_bytes, n, n0, n1, y + r0 * H, H),
                         "the down kernel");
            if (lora)
                lora_expand(n, lora->rank, n1 - n0, lora->scaling, lora->xa + r0 * lora->rank, lora->rank,
                            lora->bt + e * lora->rank * H + n0, H, y + r0 * H + n0, H);
        }
    });
}

void MoeLayer::grouped_gate_up_transposed(const float* dgate_up, int64_t rows, const int64_t* counts, float* dx,
                                          const ProductLoraGrad* lora) const {
    const kt_method_kernels& k = need(pick(*this, has_transposed), *this, "transposed tiles (plugin ABI 1.5)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, 2 * H * I);
    if (pass.empty()) return;
    pass.tiles(H, k.transposed_block, [&](int32_t e, int64_t k0, int64_t k1) {
        const int64_t r0 = pass.first_row(e), n = pass.rows_of(e);
        const float* grad = dgate_up + r0 * 2 * I;
        pass.failure(k.gate_up_transposed_tile(&shape_, pass.packed(e), grad, grad + I, 2 * I, n, k0, k1, dx + r0 * H, H),
                     "the transposed gate/up kernel");
        // Whole tiles here: a transposed kernel call prepares every gradient row first (fast
        // activations: rounds them to bf16 pairs), which column slices would repeat.
        if (lora)
            lora_expand(n, lora->rank, k1 - k0, 1.0f, lora->g + r0 * lora->rank, lora->rank,
                        lora->a + e * lora->rank * H + k0, H, dx + r0 * H + k0, H);
    });
}

void MoeLayer::grouped_down_transposed(const float* dy, int64_t rows, const int64_t* counts, float* dh,
                                       const ProductLoraGrad* lora) const {
    const kt_method_kernels& k = need(pick(*this, has_transposed), *this, "transposed tiles (plugin ABI 1.5)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, H * I);
    if (pass.empty()) return;
    pass.tiles(I, k.transposed_block, [&](int32_t e, int64_t k0, int64_t k1) {
        const int64_t r0 = pass.first_row(e), n = pass.rows_of(e);
        pass.failure(k.down_transposed_tile(&shape_, pass.packed(e), dy + r0 * H, H, n, k0, k1, dh + r0 * I, I),
                     "the transposed down kernel");
        if (lora)
            lora_expand(n, lora->rank, k1 - k0, 1.0f, lora->g + r0 * lora->rank, lora->rank,
                        lora->a + e * lora->rank * I + k0, I, dh + r0 * I + k0, I);
    });
}

}  // namespace kt
