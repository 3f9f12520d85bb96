#include "moe/moe_layer.h"
#include "moe/tiles.h"
#include "moe/gated_activation.h"

#include "abi/host_api.h"
#include "pool/thread_pool.h"

#include <kt/formats/gated_activation.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>

#include <sys/mman.h>
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22   // Linux 5.14; older C libraries lack the name
#endif
#include <sys/stat.h>
#include <unistd.h>

namespace kt {
namespace {

// Forwards share one set of scratch buffers and the whole pool, so they run one at a time;
// a second layer's forward simply waits (layers of one model are sequential anyway).
NumaBuffer g_scratch;
size_t g_scratch_bytes = 0;

constexpr size_t kAlign = 64;
size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Carves aligned sub-buffers out of the shared scratch allocation.
class ScratchPlan {
public:
    size_t add(size_t bytes) {
        const size_t at = total_;
        total_ += round_up(bytes, kAlign);
        return at;
    }
    char* materialise() { return pass_scratch(total_); }

private:
    size_t total_ = 0;
};

inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

size_t dtype_size(kt_dtype d) {
    switch (d) {
        case KT_DTYPE_F32: return 4;
        case KT_DTYPE_BF16:
        case KT_DTYPE_F16: return 2;
        case KT_DTYPE_F64: return 8;
    }
    return 0;
}

// KT_TRACE=1 prints each forward's phase times to stderr: where a slow layer spends its time.
// The line is written when the forward ends, so no phase pays for the write of another.
class PhaseTimer {
public:
    PhaseTimer() : enabled_(trace_enabled()), last_(std::chrono::steady_clock::now()) {}
    void mark(const char* phase) {
        if (!enabled_ || count_ == kMaxPhases) return;
        const auto now = std::chrono::steady_clock::now();
        phases_[count_++] = {phase, std::chrono::duration<double, std::milli>(now - last_).count()};
        last_ = now;
    }
    ~PhaseTimer() {
        if (!enabled_) return;
        // One write: stderr is unbuffered, so a write per phase was up to nine system calls per forward.
        char line[512];
        int at = 0;
        for (int i = 0; i < count_ && at < int(sizeof line); ++i)
            at += std::snprintf(line + at, sizeof line - size_t(at), "%s %.3f ms  ", phases_[i].name, phases_[i].ms);
        at = std::min(at, int(sizeof line) - 1);
        line[at++] = '\n';
        std::fwrite(line, 1, size_t(at), stderr);
    }

private:
    // Read once, like every KT_* setting: no getenv on each forward.
    static bool trace_enabled() {
        static const bool enabled = std::getenv("KT_TRACE") != nullptr;
        return enabled;
    }
    static constexpr int kMaxPhases = 8;
    struct Phase {
        const char* name;
        double ms;
    };
    Phase phases_[kMaxPhases];
    int count_ = 0;
    bool enabled_;
    std::chrono::steady_clock::time_point last_;
};

// Below this many multiply-adds a forward runs on the calling thread alone: waking workers
// for five fork-joins costs more than it saves (2 threads were 2x slower than 1 on a
// 4-expert, 32x16 layer; benchmarks/overhead.py).
constexpr int64_t kSerialMacs = int64_t(1) << 20;
// Quantize/gather/reduce phases of at most this many elements run on the calling thread even
// when the tiles use the pool: 16 tokens of hidden 2048 take microseconds, a fork-join more.
constexpr int64_t kSmallPhaseElements = int64_t(1) << 15;

}  // namespace

std::mutex g_forward_mutex;

char* pass_scratch(size_t bytes) {
    if (bytes > g_scratch_bytes) {
        g_scratch.reset();
        g_scratch_bytes = 0;
        g_scratch = make_numa_buffer(bytes, kAlign, kNodeLocal, false);
        g_scratch_bytes = bytes;
    }
    return static_cast<char*>(g_scratch.get());
}

void clear_forward_scratch() {
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    g_scratch.reset();
    g_scratch_bytes = 0;
}

size_t forward_scratch_bytes() {
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    return g_scratch_bytes;
}

MoeLayer::MoeLayer(const kt_moe_config& shape, const kt_method_kernels* kernels, std::vector<bool> expert_on_cpu,
                   int64_t max_tokens, const kt_method_kernels* packer)
    : shape_(shape), kernels_(kernels), packer_(kernels->pack_expert ? kernels : packer), on_cpu_(std::move(expert_on_cpu)),
      max_tokens_(max_tokens) {
    if (!packer_)
        throw std::invalid_argument(std::string(kernels_->kernel_id) + " computes on layout " + kernels_->layout_id +
                                    " and packs nothing itself; no installed backend packs that layout for method " +
                                    kernels_->method);
    if (std::string(packer_->layout_id) != kernels_->layout_id)
        throw std::invalid_argument(std::string("packer ") + packer_->kernel_id + " writes layout " + packer_->layout_id +
                                    "; " + kernels_->kernel_id + " reads " + kernels_->layout_id);
    if (shape_.hidden <= 0 || shape_.intermediate <= 0 || shape_.num_experts <= 0 || shape_.top_k <= 0)
        throw std::invalid_argument("MoE shape must be positive: hidden=" + std::to_string(shape_.hidden) +
                                    " intermediate=" + std::to_string(shape_.intermediate) +
                                    " num_experts=" + std::to_string(shape_.num_experts) +
                                    " top_k=" + std::to_string(shape_.top_k));
    if (int64_t(on_cpu_.size()) != shape_.num_experts)
        throw std::invalid_argument("expert placement mask has " + std::to_string(on_cpu_.size()) +
                                    " entries, expected num_experts=" + std::to_string(shape_.num_experts));
    if (max_tokens_ <= 0) throw std::invalid_argument("max_tokens (chunked_prefill_size) must be positive");
    routed_ = on_cpu_;
    expert_bytes_ = packer_->packed_expert_bytes(&shape_);
    packed_.resize(size_t(shape_.num_experts));
    // Experts are sharded over NUMA groups in contiguous runs: each group streams only
    // its own node's memory, and a converted file never depends on the group count.
    const int groups = global_pool().num_groups();
    // A forward holds the lock while it uses the pool: pool reconfiguration and fork() take
    // it first (the pool is not replaced under a forward; a fork() child never inherits it
    // locked by a thread that does not exist there).
    static const bool registered = (register_pool_user_mutex(&g_forward_mutex), true);
    (void)registered;
    std::vector<int> all(static_cast<size_t>(groups));
    for (int g = 0; g < groups; ++g) all[size_t(g)] = g;
    place_on(all);
}

void MoeLayer::place_on(const std::vector<int>& groups) {
    group_of_expert_.resize(size_t(shape_.num_experts));
    const int64_t n = int64_t(groups.size());
    for (int64_t e = 0; e < shape_.num_experts; ++e) group_of_expert_[size_t(e)] = groups[size_t(e * n / shape_.num_experts)];
}

void MoeLayer::set_groups(const std::vector<int>& groups) {
    const int pool_groups = global_pool().num_groups();
    if (groups.empty()) throw std::invalid_argument("a layer needs at least one pool group");
    std::vector<bool> seen(static_cast<size_t>(pool_groups), false);
    for (int g : groups) {
        if (g < 0 || g >= pool_groups)
            throw std::invalid_argument("pool group " + std::to_string(g) + " does not exist; the pool has " +
                                        std::to_string(pool_groups) + " group(s)");
        if (seen[size_t(g)]) throw std::invalid_argument("pool group " + std::to_string(g) + " is listed twice");
        seen[size_t(g)] = true;
    }
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    for (const auto& p : packed_)
        if (p) throw std::invalid_argument("set the layer's pool groups before loading any expert");
    place_on(groups);
}

void MoeLayer::set_small_batch_kernels(const kt_method_kernels* kernels) {
    if (kernels) {
        if (std::string(kernels->layout_id) != kernels_->layout_id)
            throw std::invalid_argument(std::string("small-batch kernels ") + kernels->kernel_id + " read layout " +
                                        kernels->layout_id + "; this layer's weights are packed as " + kernels_->layout_id);
        // A table that borrows its layout (ABI 1.3: packs nothing itself, as blis) has no byte count
        // of its own: the layout id it matched above is the whole contract.
        const size_t bytes = kernels->packed_expert_bytes ? kernels->packed_expert_bytes(&shape_) : expert_bytes_;
        if (bytes != expert_bytes_)
            throw std::invalid_argument(std::string("small-batch kernels ") + kernels->kernel_id + " expect " +
                                        std::to_string(bytes) + " packed bytes per expert for layout " +
                                        kernels->layout_id + "; the layer's packer wrote " + std::to_string(expert_bytes_));
        if (raw_gate_up()) require_raw_tile(*kernels);
    }
    small_batch_ = kernels;
}

namespace {
bool has_raw_tile(const kt_method_kernels& k) {
    return KT_HAS_FIELD(&k, kt_method_kernels, gate_up_raw_tile) && k.gate_up_raw_tile;
}
}  // namespace

void MoeLayer::require_raw_tile(const kt_method_kernels& k) {
    if (!has_raw_tile(k))
        throw std::invalid_argument(std::string(k.kernel_id) + " has no gate_up_raw_tile (plugin ABI 1.4), which " +
                                    "experts with biases, a limit after SiLU or GELU-tanh need: the layer applies their gated "
                                    "activation itself");
    if (KT_HAS_FIELD(&k, kt_method_kernels, moe_forward) && k.moe_forward)
        throw std::invalid_argument(std::string(k.kernel_id) + " runs whole forwards (moe_forward), which add no " +
                                    "expert biases and apply no limit after SiLU or GELU-tanh");
}

void MoeLayer::enable_layer_activation(activation::GatedForm form, float limit) {
    using activation::GatedForm;
    if (form == GatedForm::silu_limit_after && (!(limit > 0.0f) || !std::isfinite(limit)))
        throw std::invalid_argument("the limit after SiLU must be finite and > 0, got " + std::to_string(limit));
    if (form != GatedForm::silu_limit_after && form != GatedForm::gelu_tanh)
        throw std::invalid_argument("the layer applies the limit after SiLU or GELU-tanh itself, got form " +
                                    std::to_string(int(form)));
    if (shape_.swiglu_limit != 0.0f || shape_.swiglu_alpha != 0.0f)
        throw std::invalid_argument(std::string(form == GatedForm::gelu_tanh ? "GELU-tanh" : "a limit after SiLU") +
                                    " replaces swiglu_limit / swiglu_alpha: make the layer without them");
    require_raw_tile(*kernels_);
    if (small_batch_) require_raw_tile(*small_batch_);
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    form_ = form;
    limit_after_ = form == GatedForm::silu_limit_after ? limit : 0.0f;
}

void MoeLayer::enable_expert_bias() {
    require_raw_tile(*kernels_);
    if (small_batch_) require_raw_tile(*small_batch_);
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    expert_bias_ = true;
    bias_.assign(size_t(shape_.num_experts), {});
}

void MoeLayer::set_expert_bias(int64_t expert, const float* gate, const float* up, const float* down) {
    check_expert_index(expert);
    if (!expert_bias_)
        throw std::invalid_argument("this layer was made without expert biases (expert_bias=False)");
    const size_t I = size_t(shape_.intermediate), H = size_t(shape_.hidden);
    std::vector<float> b(2 * I + H);
    std::memcpy(b.data(), gate, I * 4);
    std::memcpy(b.data() + I, up, I * 4);
    std::memcpy(b.data() + 2 * I, down, H * 4);
    for (float v : b)
        if (!std::isfinite(v)) throw std::invalid_argument("expert " + std::to_string(expert) + "'s biases hold a non-finite value");
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // a forward reads bias_ under it
    bias_[size_t(expert)] = std::move(b);
}

const kt_method_kernels& MoeLayer::kernels_for(int64_t tokens) const {
    if (small_batch_ && kernels_->declines && kernels_->declines(&shape_, tokens)) return *small_batch_;
    return *kernels_;
}

int MoeLayer::expert_group(int64_t expert) const { return group_of_expert_.at(size_t(expert)); }

bool MoeLayer::expert_loaded(int64_t expert) const {
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // packed_ may be written by a load
    return bool(packed_.at(size_t(expert)));
}

size_t MoeLayer::packed_bytes() const {
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    size_t n = 0;
    for (const auto& p : packed_) n += p ? expert_bytes_ : 0;
    return n;
}

namespace {

// Position of the first NaN/Inf in a floating matrix, judged on the exponent bits so no
// conversion is needed; {-1, -1} when all values are finite or the matrix is not floating.
// Rows are scanned with a branch-free, vectorisable test (an all-ones exponent is NaN or Inf)
// and only a row that fails is searched for the column: this runs over every weight byte
// at load, so it must go at memory speed. Integer codes cannot be non-finite.
template <class Bits>
int64_t first_bad_in_row(const Bits* row, int64_t n, Bits exponent) {
    Bits any = 0;
    for (int64_t c = 0; c < n; ++c) any |= Bits((row[c] & exponent) == exponent);
    if (!any) return -1;
    for (int64_t c = 0; c < n; ++c)
        if ((row[c] & exponent) == exponent) return c;
    return -1;
}

std::pair<int64_t, int64_t> first_non_finite(const kt_matrix& m) {
    if (!m.data) return {-1, -1};
    for (int64_t r = 0; r < m.rows; ++r) {
        int64_t c = -1;
        switch (m.dtype) {
            case KT_DTYPE_F32:
                c = first_bad_in_row(static_cast<const uint32_t*>(m.data) + r * m.row_stride, m.cols, 0x7f800000u);
                break;
            case KT_DTYPE_F64:
                c = first_bad_in_row(static_cast<const uint64_t*>(m.data) + r * m.row_stride, m.cols,
                                     uint64_t(0x7ff0000000000000ull));
                break;
            case KT_DTYPE_BF16:
                c = first_bad_in_row(static_cast<const uint16_t*>(m.data) + r * m.row_stride, m.cols, uint16_t(0x7f80u));
                break;
            case KT_DTYPE_F16:
                c = first_bad_in_row(static_cast<const uint16_t*>(m.data) + r * m.row_stride, m.cols, uint16_t(0x7c00u));
                break;
            default: return {-1, -1};
        }
        if (c >= 0) return {r, c};
    }
    return {-1, -1};
}

}  // namespace

void MoeLayer::check_expert_index(int64_t expert) const {
    if (expert < 0 || expert >= shape_.num_experts)
        throw std::invalid_argument("expert index " + std::to_string(expert) + " outside [0, " +
                                    std::to_string(shape_.num_experts) + ")");
    if (!on_cpu_[size_t(expert)])
        throw std::invalid_argument("expert " + std::to_string(expert) +
                                    " is marked GPU-resident in the placement mask; it is not loaded on the CPU");
}

void MoeLayer::set_routed(std::vector<bool> routed) {
    if (int64_t(routed.size()) != shape_.num_experts)
        throw std::invalid_argument("expert routing mask has " + std::to_string(routed.size()) +
                                    " entries, expected num_experts=" + std::to_string(shape_.num_experts));
    for (size_t e = 0; e < routed.size(); ++e)
        if (routed[e] && !on_cpu_[e])
            throw std::invalid_argument("expert " + std::to_string(e) + " cannot move to the CPU: the layer was made "
                                        "with it GPU-resident, so it holds no CPU copy of it");
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    routed_ = std::move(routed);
}

std::vector<bool> MoeLayer::routed() const {
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    return routed_;
}

NumaBuffer MoeLayer::pack(int64_t expert, const kt_expert_weights& weights) const {
    const std::pair<const char*, const kt_weight*> parts[] = {{"gate", &weights.gate}, {"up", &weights.up}, {"down", &weights.down}};
    for (const auto& [name, w] : parts)
        for (const auto& [what, m] : {std::pair{"", &w->values}, std::pair{" scales", &w->scales}}) {
            const auto [r, c] = first_non_finite(*m);
            if (r >= 0)
                throw std::invalid_argument("expert " + std::to_string(expert) + " " + name + what +
                                            " hold NaN or Inf at [" + std::to_string(r) + ", " + std::to_string(c) +
                                            "]; kt refuses non-finite weights at load");
        }
    NumaBuffer buffer = expert_buffer(expert);
    check_plugin(packer_->pack_expert(&shape_, &weights, buffer.get()), "packing expert weights");
    return buffer;
}

NumaBuffer MoeLayer::expert_buffer(int64_t expert) const {
    ThreadPool& pool = global_pool();
    const int group = group_of_expert_[size_t(expert)] % pool.num_groups();
    return make_numa_buffer(expert_bytes_, kAlign, pool.group_numa_node(group), true);
}

void MoeLayer::load_expert(int64_t expert, const kt_expert_weights& weights) {
    check_expert_index(expert);
    NumaBuffer packed = pack(expert, weights);
    // Installed (and the replaced weights freed) under the forward lock: a forward of this
    // layer on another thread reads packed_; unlocked, a reload freed weights it was reading.
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    packed_[size_t(expert)] = std::move(packed);
}

void MoeLayer::check_expert_list(const int64_t* experts, size_t count) const {
    std::vector<int64_t> seen;
    for (size_t i = 0; i < count; ++i) {
        check_expert_index(experts[i]);
        seen.push_back(experts[i]);
    }
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
        throw std::invalid_argument("loading got expert " + std::to_string(*std::adjacent_find(seen.begin(), seen.end())) +
                                    " twice in one call");
}

void MoeLayer::install_in_parallel(const int64_t* experts, size_t count, void (*make)(void*, size_t, NumaBuffer&),
                                   void* ctx) {
    check_expert_list(experts, count);
    // Each expert is made by a thread of the NUMA group that will serve it, so its bytes
    // are first touched on that node; the batch lands all-or-nothing.
    ThreadPool& pool = global_pool();
    const int groups = pool.num_groups();
    std::vector<std::vector<size_t>> per_group(static_cast<size_t>(groups));
    for (size_t i = 0; i < count; ++i) per_group[size_t(group_of_expert_[size_t(experts[i])] % groups)].push_back(i);
    std::vector<size_t> ranges(static_cast<size_t>(groups));
    for (int g = 0; g < groups; ++g) ranges[size_t(g)] = per_group[size_t(g)].size();
    std::vector<NumaBuffer> buffers(count);
    std::vector<std::exception_ptr> errors(count);
    struct Ctx {
        void (*make)(void*, size_t, NumaBuffer&);
        void* ctx;
        std::vector<std::vector<size_t>>* per_group;
        std::vector<NumaBuffer>* buffers;
        std::vector<std::exception_ptr>* errors;
    } c{make, ctx, &per_group, &buffers, &errors};
    pool.parallel_for_groups(
        ranges.data(),
        [](void* p, int g, size_t j) {
            auto* x = static_cast<Ctx*>(p);
            const size_t i = (*x->per_group)[size_t(g)][j];
            try {
                x->make(x->ctx, i, (*x->buffers)[i]);
            } catch (...) {
                (*x->errors)[i] = std::current_exception();
            }
        },
        &c);
    for (size_t i = 0; i < count; ++i)
        if (errors[i]) std::rethrow_exception(errors[i]);
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // as in load_expert
    for (size_t i = 0; i < count; ++i) packed_[size_t(experts[i])] = std::move(buffers[i]);
}

void MoeLayer::load_experts(const int64_t* experts, const kt_expert_weights* weights, size_t count) {
    struct Ctx {
        const MoeLayer* layer;
        const int64_t* experts;
        const kt_expert_weights* weights;
    } ctx{this, experts, weights};
    install_in_parallel(
        experts, count,
        [](void* p, size_t i, NumaBuffer& out) {
            auto* x = static_cast<Ctx*>(p);
            out = x->layer->pack(x->experts[i], x->weights[i]);
        },
        &ctx);
}

void MoeLayer::load_packed(const int64_t* experts, const uint64_t* offsets, size_t count, int fd) {
    struct Ctx {
        const MoeLayer* layer;
        const int64_t* experts;
        const uint64_t* offsets;
        int fd;
    } ctx{this, experts, offsets, fd};
    install_in_parallel(
        experts, count,
        [](void* p, size_t i, NumaBuffer& out) {
            auto* x = static_cast<Ctx*>(p);
            const MoeLayer& l = *x->layer;
            out = l.expert_buffer(x->experts[i]);
            // pread straight into the node's memory: no file mapping to fault in, no
            // intermediate copy; the page cache (or the disk) is read once.
            char* dst = static_cast<char*>(out.get());
            size_t done = 0;
            while (done < l.expert_bytes_) {
                const ssize_t n = ::pread(x->fd, dst + done, l.expert_bytes_ - done, off_t(x->offsets[i] + done));
                if (n < 0 && errno == EINTR) continue;
                if (n < 0)
                    throw std::runtime_error("reading expert " + std::to_string(x->experts[i]) + "'s packed weights at byte " +
                                             std::to_string(x->offsets[i] + done) + ": " + std::strerror(errno));
                if (n == 0)
                    throw std::invalid_argument("the packed file ends at byte " + std::to_string(x->offsets[i] + done) +
                                                "; expert " + std::to_string(x->experts[i]) + " needs bytes up to " +
                                                std::to_string(x->offsets[i] + l.expert_bytes_));
                done += size_t(n);
            }
        },
        &ctx);
}

void MoeLayer::map_packed(const int64_t* experts, const uint64_t* offsets, size_t count, int fd) {
    check_expert_list(experts, count);
    struct stat st;
    if (::fstat(fd, &st) != 0) throw std::runtime_error(std::string("fstat of the packed file: ") + std::strerror(errno));
    const uint64_t size = uint64_t(st.st_size);
    for (size_t i = 0; i < count; ++i) {
        if (offsets[i] % kAlign)
            throw std::invalid_argument("expert " + std::to_string(experts[i]) + "'s packed bytes start at byte " +
                                        std::to_string(offsets[i]) + ", not on a 64-byte boundary");
        if (offsets[i] > size || size - offsets[i] < expert_bytes_)
            throw std::invalid_argument("the packed file ends at byte " + std::to_string(size) + "; expert " +
                                        std::to_string(experts[i]) + " needs bytes up to " +
                                        std::to_string(offsets[i] + expert_bytes_));
    }
    if (count == 0) return;
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) throw std::runtime_error(std::string("mapping the packed file: ") + std::strerror(errno));
    std::shared_ptr<void> mapping(base, [size](void* p) { ::munmap(p, size); });
    // Huge-page advice before anything is read: pages this mapping reads from disk then land
    // in 2 MiB page-cache folios mapped by one PMD entry each (measured here: a cold 324 MiB
    // layer mapped whole by PMDs, against ~25 % when populated without it), so decode's
    // scattered expert reads miss the TLB no more than copied, THP-backed weights do. Advice
    // only: a kernel without file THP ignores it.
    ::madvise(base, size, MADV_HUGEPAGE);
    // Map every page now so a forward never faults; a cold file is read here, sequentially.
    if (::madvise(base, size, MADV_POPULATE_READ) != 0) {
        if (errno != EINVAL)   // EINVAL: a kernel older than 5.14; touch each page instead
            throw std::runtime_error(std::string("reading the packed file into memory: ") + std::strerror(errno));
        volatile const char* p = static_cast<const char*>(base);
        for (uint64_t at = 0; at < size; at += 4096) (void)p[at];
    }
    std::lock_guard<std::mutex> lock(g_forward_mutex);   // as in load_expert
    for (size_t i = 0; i < count; ++i)
        packed_[size_t(experts[i])] = std::shared_ptr<void>(mapping, static_cast<char*>(base) + offsets[i]);
}

std::vector<char> MoeLayer::copy_packed(int64_t expert) const {
    check_expert_index(expert);
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    const std::shared_ptr<void>& b = packed_[size_t(expert)];
    if (!b) throw std::invalid_argument("expert " + std::to_string(expert) + " is not loaded");
    const char* p = static_cast<const char*>(b.get());
    return std::vector<char>(p, p + expert_bytes_);
}

// One forward's state and its phases, in the order the data flows (DESIGN.md §3):
// bucket -> quantize (and gather) -> gate/up -> quantize intermediate -> down -> reduce.
class ForwardPass {
public:
    ForwardPass(const MoeLayer& layer, const kt_method_kernels& kernels, int64_t tokens)
        : layer_(layer), k_(kernels), shape_(layer.shape_), T(tokens), K(shape_.top_k), H(shape_.hidden),
          I(shape_.intermediate), E(shape_.num_experts), pool_(global_pool()) {}

    // Rows per expert: each (token, slot) routed to a CPU expert gets a row; ids of -1 and
    // GPU-resident experts get none. False when no slot has a CPU expert.
    bool bucket(const int64_t* ids) {
        // A forward that will use the pool wakes it now, so workers parked between layers are
        // spinning by the time the first tile loop starts (bucketing and small phases run here).
        if (T * K * H * I * 3 >= kSerialMacs) pool_.wake();
        ids_ = ids;
        count_.assign(size_t(E), 0);
        for (int64_t i = 0; i < T * K; ++i)
            if (routed(ids[i])) ++count_[size_t(ids[i])];
        offset_.assign(size_t(E) + 1, 0);
        for (int64_t e = 0; e < E; ++e) {
            offset_[size_t(e) + 1] = offset_[size_t(e)] + count_[size_t(e)];
            if (count_[size_t(e)]) active_.push_back(int32_t(e));
        }
        S = offset_[size_t(E)];
        if (active_.empty()) return false;
        row_of_slot_.assign(size_t(T * K), -1);
        token_of_row_.resize(size_t(S));
        std::vector<int64_t> fill(offset_.begin(), offset_.end() - 1);
        for (int64_t i = 0; i < T * K; ++i)
            if (routed(ids[i])) {
                const int64_t r = fill[size_t(ids[i])]++;
                row_of_slot_[size_t(i)] = r;
                token_of_row_[size_t(r)] = i / K;
            }
        allocate();
        return true;
    }

    // Every token quantized once, in chunks of rows; then each expert's rows gathered.
    void quantize_tokens(const void* hidden, kt_dtype hidden_dtype) {
        const size_t in_elem = dtype_size(hidden_dtype);
        const int64_t chunk = std::max<int64_t>(1, (T + 4 * threads_ - 1) / (4 * threads_));
        auto quantize = [&](size_t c) {
            const int64_t t0 = int64_t(c) * chunk, rows = std::min(chunk, T - t0);
            const kt_status st = k_.quantize_activations(static_cast<const char*>(hidden) + size_t(t0 * H) * in_elem,
                                                         hidden_dtype, rows, H, H, act_tokens_ + size_t(t0) * row_h_);
            if (st != KT_OK) failure_.record(st, "quantizing activations");
        };
        parallel(row_workers_, size_t((T + chunk - 1) / chunk), quantize);
        failure_.rethrow();
        auto gather = [&](size_t r) {
            std::memcpy(act_rows_ + r * row_h_, act_tokens_ + size_t(token_of_row_[r]) * row_h_, row_h_);
        };
        parallel(row_workers_, size_t(S), gather);
    }

    // Fused gate/up + SiLU(gate)*up per (expert, intermediate block). When every tile is a
    // whole expert (one block spans I: decode's 8 experts on a few threads, or many experts),
    // the tile quantizes its expert's rows itself, in parallel and while they are in its cache,
    // rather than one thread doing every expert after the barrier (docs/performance.md).
    void gate_up() {
        const TilePlan plan = plan_tiles(I, k_.gate_up_block);
        quantized_in_tiles_ = plan.block >= I;
        auto tile = [&](const Tile& t) {
            const int32_t e = active_[size_t(t.active)];
            const int64_t r0 = offset_[size_t(e)];
            const kt_status st = layer_.raw_gate_up() ? raw_gate_up(e, t)
                                                     : k_.gate_up_tile(&shape_, packed(e), act_rows_ + size_t(r0) * row_h_,
                                                                       count_[size_t(e)], t.n0, t.n1, inter_ + r0 * I, I);
            if (st != KT_OK) failure_.record(st, "the gate/up kernel");
            else if (quantized_in_tiles_) quantize_expert_intermediate(size_t(t.active));
        };
        run_tiles(plan, tile);
        failure_.rethrow();
    }

    // A tile of an expert with biases, a limit after SiLU or GELU-tanh: the kernels' raw gate and up
    // products, then the biases and the layer's gated activation here, on the host's widest vectors
    // (moe/gated_activation.h; kt/formats/gated_activation.h's formulas).
    kt_status raw_gate_up(int32_t e, const Tile& t) {
        const int64_t r0 = offset_[size_t(e)], rows = count_[size_t(e)], w = t.n1 - t.n0;
        thread_local std::vector<float> g, u;
        g.resize(size_t(rows * w));
        u.resize(size_t(rows * w));
        const kt_status st = k_.gate_up_raw_tile(&shape_, packed(e), act_rows_ + size_t(r0) * row_h_, rows, t.n0, t.n1,
                                                 g.data(), u.data(), w);
        if (st != KT_OK) return st;
        const float* bg = layer_.expert_bias_ ? layer_.bias_[size_t(e)].data() : nullptr;
        const float* bu = bg ? bg + I : nullptr;
        const activation::GatedForm form = layer_.form_;
        const float limit = form == activation::GatedForm::silu_limit_after ? layer_.limit_after_ : shape_.swiglu_limit;
        for (int64_t r = 0; r < rows; ++r) {
            float* gr = g.data() + r * w;
            float* ur = u.data() + r * w;
            if (bg)
                for (int64_t j = 0; j < w; ++j) gr[j] += bg[t.n0 + j], ur[j] += bu[t.n0 + j];
            gated_activation(gr, ur, w, limit, shape_.swiglu_alpha, form, inter_ + (r0 + r) * I + t.n0);
        }
        return KT_OK;
    }

    // The intermediate rows quantized for the down projection, per expert (unless gate_up did).
    void quantize_intermediate() {
        if (quantized_in_tiles_) return;
        auto each = [&](size_t a) { quantize_expert_intermediate(a); };
        parallel(S * I <= kSmallPhaseElements ? nullptr : workers_, active_.size(), each);
        failure_.rethrow();
    }

    // Down projection per (expert, hidden block).
    void down() {
        const TilePlan plan = plan_tiles(H, k_.down_block);
        auto tile = [&](const Tile& t) {
            const int32_t e = active_[size_t(t.active)];
            const int64_t r0 = offset_[size_t(e)];
            const kt_status st = k_.down_tile(&shape_, packed(e), act2_ + size_t(r0) * row_i_, count_[size_t(e)], t.n0,
                                              t.n1, down_out_ + r0 * H, H);
            if (st != KT_OK) failure_.record(st, "the down kernel");
        };
        run_tiles(plan, tile);
        failure_.rethrow();
    }

    // Weighted sum per token in slot order (deterministic; FP32 accumulation).
    void reduce(const float* weights, void* out, kt_dtype out_dtype) {
        auto token = [&](size_t t) {
            thread_local std::vector<float> acc;
            acc.assign(size_t(H), 0.0f);
            for (int64_t j = 0; j < K; ++j) {
                const int64_t r = row_of_slot_[t * size_t(K) + size_t(j)];
                if (r < 0) continue;
                const float w = weights[t * size_t(K) + size_t(j)];
                const float* src = down_out_ + r * H;
                if (layer_.expert_bias_) {   // the routed expert's down bias, weighted like its output
                    const float* bd = layer_.bias_[size_t(ids_[t * size_t(K) + size_t(j)])].data() + 2 * I;
                    for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * (src[h] + bd[h]);
                    continue;
                }
                for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * src[h];
            }
            if (out_dtype == KT_DTYPE_F32) {
                std::memcpy(static_cast<float*>(out) + t * size_t(H), acc.data(), size_t(H) * 4);
            } else {
                uint16_t* dst = static_cast<uint16_t*>(out) + t * size_t(H);
                for (int64_t h = 0; h < H; ++h) dst[h] = f32_to_bf16(acc[size_t(h)]);
            }
        };
        parallel(row_workers_, size_t(T), token);
    }

private:
    bool routed(int64_t id) const { return id >= 0 && layer_.routed_[size_t(id)]; }
    const void* packed(int32_t e) const { return layer_.packed_[size_t(e)].get(); }

    // Scratch for every phase, and who runs the phases: below kSerialMacs the calling thread
    // alone; decode-sized row phases (a few rows) on the calling thread even when tiles use the pool.
    void allocate() {
        row_h_ = k_.activation_row_bytes(H);
        row_i_ = k_.activation_row_bytes(I);
        ScratchPlan plan;
        const size_t at_act_tokens = plan.add(size_t(T) * row_h_), at_act_rows = plan.add(size_t(S) * row_h_),
                     at_inter = plan.add(size_t(S * I) * 4), at_act2 = plan.add(size_t(S) * row_i_),
                     at_down = plan.add(size_t(S * H) * 4);
        char* base = plan.materialise();
        act_tokens_ = base + at_act_tokens;
        act_rows_ = base + at_act_rows;
        inter_ = reinterpret_cast<float*>(base + at_inter);
        act2_ = base + at_act2;
        down_out_ = reinterpret_cast<float*>(base + at_down);
        serial_ = S * H * I * 3 < kSerialMacs;
        workers_ = serial_ ? nullptr : &pool_;
        threads_ = serial_ ? 1 : pool_.num_threads();
        row_workers_ = T * H <= kSmallPhaseElements ? nullptr : workers_;
    }

    void quantize_expert_intermediate(size_t a) {
        const int32_t e = active_[a];
        const int64_t r0 = offset_[size_t(e)];
        const kt_status st = k_.quantize_activations(inter_ + r0 * I, KT_DTYPE_F32, count_[size_t(e)], I, I,
                                                     act2_ + size_t(r0) * row_i_);
        if (st != KT_OK) failure_.record(st, "quantizing intermediate activations");
    }

    TilePlan plan_tiles(int64_t n, int64_t kernel_block) const {
        return kt::plan_tiles(active_, layer_.group_of_expert_, pool_.num_groups(), threads_, n, kernel_block);
    }
    template <class Body>
    void run_tiles(const TilePlan& tp, Body& body) {
        kt::run_tiles(serial_ ? nullptr : &pool_, tp, body);
    }

    const MoeLayer& layer_;
    const kt_method_kernels& k_;
    const kt_moe_config& shape_;
    const int64_t T, K, H, I, E;
    int64_t S = 0;                       // rows: routed (token, slot) pairs
    const int64_t* ids_ = nullptr;       // the forward's topk_ids [T, K]
    ThreadPool& pool_;
    std::vector<int64_t> count_, offset_;   // rows per expert, first row of each
    std::vector<int32_t> active_;           // experts with rows, in expert order
    std::vector<int64_t> row_of_slot_, token_of_row_;
    size_t row_h_ = 0, row_i_ = 0;          // bytes of one quantized hidden / intermediate row
    char* act_tokens_ = nullptr;
    char* act_rows_ = nullptr;
    float* inter_ = nullptr;
    char* act2_ = nullptr;
    float* down_out_ = nullptr;
    bool serial_ = true, quantized_in_tiles_ = false;
    ThreadPool* workers_ = nullptr;
    ThreadPool* row_workers_ = nullptr;
    int threads_ = 1;
    FailureSlot failure_;
};

void MoeLayer::check_forward_arguments(int64_t tokens, const int64_t* ids, kt_dtype out_dtype) const {
    const int64_t K = shape_.top_k, E = shape_.num_experts;
    if (tokens < 0 || tokens > max_tokens_)
        throw std::invalid_argument("forward got " + std::to_string(tokens) + " tokens; this layer takes at most " +
                                    std::to_string(max_tokens_) +
                                    " (chunked_prefill_size): split the batch or raise chunked_prefill_size");
    if (out_dtype != KT_DTYPE_F32 && out_dtype != KT_DTYPE_BF16)
        throw std::invalid_argument("output must be float32 or bfloat16");
    for (int64_t i = 0; i < tokens * K; ++i)
        if (ids[i] < -1 || ids[i] >= E)
            throw std::invalid_argument("topk_ids[" + std::to_string(i / K) + ", " + std::to_string(i % K) +
                                        "] = " + std::to_string(ids[i]) + " is outside [-1, " + std::to_string(E) +
                                        "); use -1 for 'no expert'");
}

void MoeLayer::forward_whole_op(const kt_method_kernels& kernels, const void* hidden, kt_dtype hidden_dtype,
                                int64_t tokens, const int64_t* ids, const float* weights, void* out,
                                kt_dtype out_dtype) const {
    const int64_t H = shape_.hidden;
    std::vector<const void*> experts(packed_.size(), nullptr);
    for (size_t e = 0; e < packed_.size(); ++e) experts[e] = routed_[e] ? packed_[e].get() : nullptr;
    ScratchPlan plan;
    const size_t at_out = plan.add(size_t(tokens * H) * 4);
    char* base = plan.materialise();
    float* out32 = out_dtype == KT_DTYPE_F32 ? static_cast<float*>(out) : reinterpret_cast<float*>(base + at_out);
    check_plugin(kernels.moe_forward(&shape_, experts.data(), hidden, hidden_dtype, tokens, ids, weights, out32),
                 "the backend's moe_forward");
    if (out_dtype == KT_DTYPE_BF16)
        for (int64_t i = 0; i < tokens * H; ++i) static_cast<uint16_t*>(out)[i] = f32_to_bf16(out32[i]);
}

void MoeLayer::forward(const void* hidden, kt_dtype hidden_dtype, int64_t tokens, const int64_t* ids,
                       const float* weights, void* out, kt_dtype out_dtype) const {
    PhaseTimer timer;   // from entry: KT_TRACE's phases then add up to the whole call
    check_forward_arguments(tokens, ids, out_dtype);
    // packed_ is read under the lock: load_expert(s) on another thread installs entries under it.
    std::lock_guard<std::mutex> lock(g_forward_mutex);
    for (int64_t e = 0; e < shape_.num_experts; ++e) {
        if (routed_[size_t(e)] && !packed_[size_t(e)])
            throw std::runtime_error("expert " + std::to_string(e) +
                                     " has no weights: call load_weights / load_weights_from_tensors first");
        if (expert_bias_ && routed_[size_t(e)] && bias_[size_t(e)].empty())
            throw std::runtime_error("expert " + std::to_string(e) + " has no biases; this layer's experts carry "
                                     "them (expert_bias=True): load them with its weights (biases=...)");
    }
    if (tokens == 0) return;
    timer.mark("check");
    const kt_method_kernels& kernels = kernels_for(tokens);
    if (KT_HAS_FIELD(&kernels, kt_method_kernels, moe_forward) && kernels.moe_forward)
        return forward_whole_op(kernels, hidden, hidden_dtype, tokens, ids, weights, out, out_dtype);

    ForwardPass pass(*this, kernels, tokens);
    if (!pass.bucket(ids)) {   // every slot is -1 or GPU-resident: the CPU part of this layer is zero
        std::memset(out, 0, size_t(tokens * shape_.hidden) * (out_dtype == KT_DTYPE_F32 ? 4 : 2));
        return;
    }
    timer.mark("route");
    pass.quantize_tokens(hidden, hidden_dtype);
    timer.mark("quantize+gather");
    pass.gate_up();
    timer.mark("gate_up");
    pass.quantize_intermediate();
    timer.mark("quantize_inter");
    pass.down();
    timer.mark("down");
    pass.reduce(weights, out, out_dtype);
    timer.mark("reduce");
}

}  // namespace kt
