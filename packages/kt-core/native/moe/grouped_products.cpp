// Training's products over a layer's packed experts (MoeLayer::grouped_*): rows that the caller
// has already grouped by expert, times each expert's weights or their transpose. kt's autograd
// node (kt.training) composes them with torch: forward = grouped_gate_up, the activation and
// LoRA in torch, grouped_down; backward = grouped_down_transposed and grouped_gate_up_transposed
// for the gradients of the expert inputs, everything else by torch's autograd.
#include "moe/moe_layer.h"
#include "moe/tiles.h"

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
    // into the passes' scratch (pass_scratch: valid while this pass holds the lock).
    const char* quantize(const kt_method_kernels& k, const float* x, int64_t rows, int64_t width) {
        const size_t row_bytes = k.activation_row_bytes(width);
        char* base = pass_scratch(size_t(rows) * row_bytes + 64);
        experts([&](int32_t e) {
            failure(k.quantize_activations(x + first_row(e) * width, KT_DTYPE_F32, rows_of(e), width, width,
                                           base + size_t(first_row(e)) * row_bytes),
                    "quantizing activations");
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

}  // namespace

std::string MoeLayer::training_support() const {
    if (!pick(*this, has_raw_tile)) return std::string(kernels_->kernel_id) + " has no gate_up_raw_tile (plugin ABI 1.4)";
    if (!pick(*this, has_transposed)) return std::string(kernels_->kernel_id) + " has no transposed tiles (plugin ABI 1.5)";
    return "";
}

void MoeLayer::grouped_gate_up(const float* x, int64_t rows, const int64_t* counts, float* gate_up) const {
    const kt_method_kernels& k = need(pick(*this, has_raw_tile), *this, "gate_up_raw_tile (plugin ABI 1.4)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, 2 * H * I);
    if (pass.empty()) return;
    const char* act = pass.quantize(k, x, rows, H);
    const size_t row_bytes = k.activation_row_bytes(H);
    pass.tiles(I, k.gate_up_block, [&](int32_t e, int64_t n0, int64_t n1) {
        const int64_t r0 = pass.first_row(e);
        // The raw tile writes tile-local columns: hand it the tile's first column of each half.
        float* row = gate_up + r0 * 2 * I;
        pass.failure(k.gate_up_raw_tile(&shape_, pass.packed(e), act + size_t(r0) * row_bytes,
                                        pass.rows_of(e), n0, n1, row + n0, row + I + n0, 2 * I),
                     "the gate/up kernel");
    });
}

void MoeLayer::grouped_down(const float* h, int64_t rows, const int64_t* counts, float* y) const {
    const kt_method_kernels& k = need(pick(*this, has_raw_tile), *this, "gate_up_raw_tile (plugin ABI 1.4)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, H * I);
    if (pass.empty()) return;
    const char* act = pass.quantize(k, h, rows, I);
    const size_t row_bytes = k.activation_row_bytes(I);
    pass.tiles(H, k.down_block, [&](int32_t e, int64_t n0, int64_t n1) {
        const int64_t r0 = pass.first_row(e);
        pass.failure(k.down_tile(&shape_, pass.packed(e), act + size_t(r0) * row_bytes, pass.rows_of(e), n0, n1,
                                 y + r0 * H, H),
                     "the down kernel");
    });
}

void MoeLayer::grouped_gate_up_transposed(const float* dgate_up, int64_t rows, const int64_t* counts, float* dx) const {
    const kt_method_kernels& k = need(pick(*this, has_transposed), *this, "transposed tiles (plugin ABI 1.5)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, 2 * H * I);
    if (pass.empty()) return;
    pass.tiles(H, k.transposed_block, [&](int32_t e, int64_t k0, int64_t k1) {
        const int64_t r0 = pass.first_row(e);
        const float* grad = dgate_up + r0 * 2 * I;
        pass.failure(k.gate_up_transposed_tile(&shape_, pass.packed(e), grad, grad + I, 2 * I, pass.rows_of(e), k0, k1,
                                               dx + r0 * H, H),
                     "the transposed gate/up kernel");
    });
}

void MoeLayer::grouped_down_transposed(const float* dy, int64_t rows, const int64_t* counts, float* dh) const {
    const kt_method_kernels& k = need(pick(*this, has_transposed), *this, "transposed tiles (plugin ABI 1.5)");
    const int64_t H = shape_.hidden, I = shape_.intermediate;
    GroupedPass pass(*this, rows, counts, H * I);
    if (pass.empty()) return;
    pass.tiles(I, k.transposed_block, [&](int32_t e, int64_t k0, int64_t k1) {
        const int64_t r0 = pass.first_row(e);
        pass.failure(k.down_transposed_tile(&shape_, pass.packed(e), dy + r0 * H, H, pass.rows_of(e), k0, k1,
                                            dh + r0 * I, I),
                     "the transposed down kernel");
    });
}

}  // namespace kt
