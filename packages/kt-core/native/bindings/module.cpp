// kt_core._native: the Python face of the core. Tensors arrive through DLPack
// (nb::ndarray) so no torch is linked; every check that can fail says what it expected.
#include <kt/plugin.h>

#include "abi/forward_api.h"
#include "abi/host_api.h"
#include "probes/compute_peak.h"
#include "host/cpu_features.h"
#include "host/topology.h"
#include "memory/numa_allocator.h"
#include "moe/grouped_lora.h"
#include "moe/training_rows.h"
#include "moe/moe_layer.h"
#include "pool/thread_pool.h"
#include "quant/kt_codes.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<nb::ro>;

// Set by at_exit() (interpreter exit has begun), with the thread that runs the exit.
std::atomic<bool> g_exiting{false};
std::thread::id g_exit_thread;
// Threads between ReleaseGil's exit check and holding the GIL again.
std::atomic<int> g_regaining{0};

// nb::gil_scoped_release, except that a thread other than the exiting one that comes back
// from kt work after exit began parks for good instead of taking the GIL again. Such a thread
// is a daemon thread (the others were joined before atexit), and CPython < 3.14 ends it with
// pthread_exit() inside PyEval_RestoreThread: that forced unwind through a noexcept
// destructor called std::terminate, so exiting with a daemon thread mid-forward aborted.
class ReleaseGil {
public:
    ReleaseGil() : state_(PyEval_SaveThread()) {}
    ~ReleaseGil() {
        // seq_cst, paired with at_exit(): either this thread sees the exit and parks, or
        // at_exit() sees it regaining and lets it take the GIL before finalization starts
        // (a thread that passed the check could otherwise wait in take_gil until then).
        g_regaining.fetch_add(1);
        if (g_exiting.load() && std::this_thread::get_id() != g_exit_thread) {
            g_regaining.fetch_sub(1);
            for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
        }
        PyEval_RestoreThread(state_);
        g_regaining.fetch_sub(1);
    }
    ReleaseGil(const ReleaseGil&) = delete;
    ReleaseGil& operator=(const ReleaseGil&) = delete;

private:
    PyThreadState* state_;
};

// nb::dict has no keyword constructor: kv("key", value, "key2", value2, ...).
inline void fill(nb::dict&) {}
template <class V, class... Rest>
void fill(nb::dict& d, const char* key, V&& value, Rest&&... rest) {
    d[key] = nb::cast(std::forward<V>(value));
    fill(d, std::forward<Rest>(rest)...);
}
template <class... Args>
nb::dict kv(Args&&... args) {
    nb::dict d;
    fill(d, std::forward<Args>(args)...);
    return d;
}

std::string dtype_name(const nb::dlpack::dtype& d) {
    switch (nb::dlpack::dtype_code(d.code)) {
        case nb::dlpack::dtype_code::Int: return "int" + std::to_string(d.bits);
        case nb::dlpack::dtype_code::UInt: return "uint" + std::to_string(d.bits);
        case nb::dlpack::dtype_code::Float: return "float" + std::to_string(d.bits);
        case nb::dlpack::dtype_code::Bfloat: return "bfloat" + std::to_string(d.bits);
        default: return "dtype(code=" + std::to_string(d.code) + ", bits=" + std::to_string(d.bits) + ")";
    }
}

std::optional<kt_dtype> floating(const nb::dlpack::dtype& d) {
    if (d.lanes == 1 && d.code == uint8_t(nb::dlpack::dtype_code::Float)) {
        if (d.bits == 32) return KT_DTYPE_F32;
        if (d.bits == 16) return KT_DTYPE_F16;
        if (d.bits == 64) return KT_DTYPE_F64;
    }
    if (d.lanes == 1 && d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && d.bits == 16) return KT_DTYPE_BF16;
    return std::nullopt;
}

// Maps a floating DLPack dtype onto the ABI's; throws naming the offending tensor.
kt_dtype float_dtype(const Array& a, const char* name) {
    if (auto d = floating(a.dtype())) return *d;
    throw nb::type_error((std::string(name) + " must be float32, bfloat16, float16 or float64; got " + dtype_name(a.dtype())).c_str());
}

void check_cpu(const Array& a, const char* name) {
    if (a.device_type() != nb::device::cpu::value)
        throw nb::value_error((std::string(name) + " must be a CPU tensor; got device type " +
                               std::to_string(a.device_type()) + " (move it with .cpu(), or let KTMoEWrapper do it)")
                                  .c_str());
}

void check_shape(const Array& a, const char* name, std::initializer_list<int64_t> shape) {
    std::string want = "[", got = "[";
    bool ok = a.ndim() == shape.size();
    size_t i = 0;
    for (int64_t s : shape) {
        want += (i ? ", " : "") + std::to_string(s);
        if (ok && int64_t(a.shape(i)) != s) ok = false;
        ++i;
    }
    for (size_t j = 0; j < a.ndim(); ++j) got += (j ? ", " : "") + std::to_string(a.shape(j));
    if (!ok) throw nb::value_error((std::string(name) + " must have shape " + want + "], got " + got + "]").c_str());
}

void check_contiguous(const Array& a, const char* name) {
    int64_t expected = 1;
    for (size_t j = a.ndim(); j-- > 0;) {
        if (a.shape(j) != 1 && a.stride(j) != expected)
            throw nb::value_error((std::string(name) + " must be C-contiguous (call .contiguous())").c_str());
        expected *= int64_t(a.shape(j));
    }
}

void check_exact(const Array& a, const char* name, nb::dlpack::dtype_code code, int bits) {
    const auto d = a.dtype();
    if (d.code != uint8_t(code) || d.bits != bits || d.lanes != 1) {
        nb::dlpack::dtype want{uint8_t(code), uint8_t(bits), 1};
        throw nb::type_error((std::string(name) + " must be " + dtype_name(want) + ", got " + dtype_name(d)).c_str());
    }
}

// Maps any DLPack dtype a weight may come in (floats, or a checkpoint's integer codes).
kt_dtype weight_dtype(const Array& a, const char* name) {
    const auto d = a.dtype();
    if (d.lanes == 1 && d.code == uint8_t(nb::dlpack::dtype_code::Int) && d.bits == 8) return KT_DTYPE_I8;
    if (d.lanes == 1 && d.code == uint8_t(nb::dlpack::dtype_code::UInt) && d.bits == 8) return KT_DTYPE_U8;
    if (d.lanes == 1 && d.code == uint8_t(nb::dlpack::dtype_code::Int) && d.bits == 32) return KT_DTYPE_I32;
    if (auto f = floating(d)) return *f;
    throw nb::type_error((std::string(name) + " must be float32, bfloat16, float16 or float64 (or int8, uint8, int32 "
                          "codes of a pre-quantized checkpoint); got " + dtype_name(d)).c_str());
}

bool is_float(kt_dtype d) { return d == KT_DTYPE_F32 || d == KT_DTYPE_BF16 || d == KT_DTYPE_F16 || d == KT_DTYPE_F64; }

// A 2-D CPU matrix with unit stride along its rows. Floating weights must have the layer's
// shape; pre-quantized codes and scales are checked by the method's packer.
kt_matrix matrix_of(const Array& a, const char* name, int64_t rows, int64_t cols) {
    check_cpu(a, name);
    if (a.ndim() != 2)
        throw nb::value_error((std::string(name) + " must be 2-D, got " + std::to_string(a.ndim()) + "-D").c_str());
    const kt_dtype dtype = weight_dtype(a, name);
    if (is_float(dtype) && rows > 0) check_shape(a, name, {rows, cols});
    const int64_t r = int64_t(a.shape(0)), c = int64_t(a.shape(1));
    if (a.stride(1) != 1 && c > 1)
        throw nb::value_error((std::string(name) + " must have unit stride along its last dimension").c_str());
    return kt_matrix{a.data(), dtype, r, c, r > 1 ? int64_t(a.stride(0)) : c};
}

kt_matrix optional_matrix(const std::optional<Array>& a, const char* name) {
    if (!a) return kt_matrix{nullptr, KT_DTYPE_F32, 0, 0, 0};
    return matrix_of(*a, name, 0, 0);
}

// A backend table that passed validation; the capsule keeps the plugin module alive.
struct Backend {
    nb::object capsule;
    const kt_backend_api* api;

    const kt_method_kernels* method(const std::string& name) const {
        for (size_t i = 0; i < api->num_methods; ++i)
            if (name == kt::method_table(api, i).method) return &kt::method_table(api, i);
        std::string have;
        for (size_t i = 0; i < api->num_methods; ++i) have += (i ? ", " : "") + std::string(kt::method_table(api, i).method);
        throw nb::value_error(("backend '" + std::string(api->name) + "' has no method '" + name +
                               "'; it provides: " + have).c_str());
    }
};

Backend load_backend(nb::object capsule, const std::string& name, const std::string& variant) {
    PyObject* cap = capsule.ptr();
    if (!PyCapsule_CheckExact(cap) || !PyCapsule_IsValid(cap, KT_BACKEND_CAPSULE_NAME))
        throw nb::type_error(("backend '" + name + "' did not return a PyCapsule named '" KT_BACKEND_CAPSULE_NAME "'").c_str());
    auto* api = static_cast<const kt_backend_api*>(PyCapsule_GetPointer(cap, KT_BACKEND_CAPSULE_NAME));
    kt::validate_and_init_backend(api, name, variant);
    return Backend{std::move(capsule), api};
}

// Pins the Python objects a submitted forward reads and writes until sync().
struct PendingForward {
    nb::object keep_alive;
    ~PendingForward() {
        // After the interpreter is gone a reference can only be dropped, not released.
        if (!Py_IsInitialized()) keep_alive.release();
    }
};
std::unique_ptr<PendingForward> g_pending;

// float32 / int64 C-contiguous CPU arrays of a given shape (training's products, LoRA and row passes).
float* f32_array(const nb::ndarray<>& a, const char* name, std::initializer_list<int64_t> shape) {
    const Array v(a);
    check_cpu(v, name);
    check_exact(v, name, nb::dlpack::dtype_code::Float, 32);
    check_shape(v, name, shape);
    check_contiguous(v, name);
    return static_cast<float*>(const_cast<void*>(v.data()));
}

const int64_t* i64_array(const nb::ndarray<>& a, const char* name, std::initializer_list<int64_t> shape) {
    const Array v(a);
    check_cpu(v, name);
    check_exact(v, name, nb::dlpack::dtype_code::Int, 64);
    check_shape(v, name, shape);
    check_contiguous(v, name);
    return static_cast<const int64_t*>(v.data());
}

// counts int64 [experts], none negative, summing to the `rows` that `holder` has.
const int64_t* grouped_counts(const nb::ndarray<>& counts, int64_t experts, int64_t rows, const char* holder) {
    const int64_t* cp = i64_array(counts, "counts", {experts});
    int64_t total = 0;
    for (int64_t e = 0; e < experts; ++e) {
        if (cp[e] < 0) throw nb::value_error(("counts[" + std::to_string(e) + "] is negative").c_str());
        total += cp[e];
    }
    if (total != rows)
        throw nb::value_error(("counts sum to " + std::to_string(total) + " rows; " + holder + " holds " + std::to_string(rows))
                                  .c_str());
    return cp;
}

// token int64 [rows], each a row of x's `tokens`.
const int64_t* token_rows(const nb::ndarray<>& token, int64_t rows, int64_t tokens) {
    const int64_t* tp = i64_array(token, "token", {rows});
    for (int64_t i = 0; i < rows; ++i)
        if (tp[i] < 0 || tp[i] >= tokens)
            throw nb::value_error(("token[" + std::to_string(i) + "] = " + std::to_string(tp[i]) + " is out of range for x's " +
                                   std::to_string(tokens) + " rows").c_str());
    return tp;
}

void check_lora_rank(int64_t rank) {
    if (rank < 1 || rank > kt::kMaxLoraRank)
        throw nb::value_error(("LoRA rank " + std::to_string(rank) + ": kt's grouped LoRA takes ranks 1 .. " +
                               std::to_string(kt::kMaxLoraRank)).c_str());
}

struct Layer {
    Backend backend;
    std::optional<Backend> small_batch_backend;   // keeps the small-batch kernels' table alive
    std::optional<Backend> packer_backend;        // keeps a borrowed packer's table alive (ABI 1.3)
    std::unique_ptr<kt::MoeLayer> layer;

    Layer(const Backend& b, const std::string& method, int64_t hidden, int64_t intermediate, int64_t experts,
          int64_t top_k, std::vector<bool> on_cpu, int64_t max_tokens, int64_t group_size, bool zero_point,
          bool fast_activations, std::vector<int> weight_dtype, float swiglu_limit, float swiglu_alpha,
          std::optional<Backend> packer, bool expert_bias, bool swiglu_limit_after_act, const std::string& gate_activation)
        : backend(b), packer_backend(std::move(packer)) {
        if (!(swiglu_limit >= 0.0f && swiglu_alpha >= 0.0f) || !std::isfinite(swiglu_limit) || !std::isfinite(swiglu_alpha))
            throw nb::value_error(("swiglu_limit and swiglu_alpha must be finite and >= 0 (0 = off), got " +
                                   std::to_string(swiglu_limit) + ", " + std::to_string(swiglu_alpha)).c_str());
        if (swiglu_limit_after_act && !(swiglu_limit > 0.0f && swiglu_alpha == 0.0f))
            throw nb::value_error(("swiglu_limit_after_act needs swiglu_limit > 0 and swiglu_alpha 0, got " +
                                   std::to_string(swiglu_limit) + ", " + std::to_string(swiglu_alpha)).c_str());
        if (gate_activation != "silu" && gate_activation != "gelu_tanh")
            throw nb::value_error(("gate_activation is 'silu' or 'gelu_tanh', got '" + gate_activation + "'").c_str());
        const bool gelu = gate_activation == "gelu_tanh";
        if (gelu && (swiglu_limit != 0.0f || swiglu_alpha != 0.0f || swiglu_limit_after_act))
            throw nb::value_error("gate_activation 'gelu_tanh' takes no swiglu_limit / swiglu_alpha / swiglu_limit_after_act");
        // The limit after SiLU and GELU-tanh are applied by the layer itself
        // (MoeLayer::enable_layer_activation): the kernels see no swiglu setting.
        const float after = swiglu_limit_after_act ? swiglu_limit : 0.0f;
        if (swiglu_limit_after_act) swiglu_limit = 0.0f;
        kt_moe_config shape{sizeof(kt_moe_config), hidden, intermediate, experts, top_k, group_size,
                            (zero_point ? KT_QUANT_ZERO_POINT : 0u) | (fast_activations ? KT_QUANT_FAST_ACTIVATIONS : 0u),
                            {KT_DTYPE_F32, KT_DTYPE_F32, KT_DTYPE_F32}, swiglu_limit, swiglu_alpha};
        // Storage types of gate, up, down (LLAMAFILE's ggml types); the packer judges them.
        if (!weight_dtype.empty() && weight_dtype.size() != 3)
            throw nb::value_error(("weight_dtype lists gate, up and down: 3 entries, got " +
                                   std::to_string(weight_dtype.size())).c_str());
        for (size_t i = 0; i < weight_dtype.size(); ++i) shape.weight_dtype[i] = static_cast<kt_dtype>(weight_dtype[i]);
        const kt_method_kernels* kernels = backend.method(method);
        if (swiglu_limit > 0.0f || swiglu_alpha > 0.0f) require_swiglu(*kernels, backend.api->name);
        if (kernels->declines && kernels->declines(&shape, max_tokens))
            throw nb::value_error(("backend '" + std::string(backend.api->name) + "' declines method " + method +
                                   " for this shape").c_str());
        layer = std::make_unique<kt::MoeLayer>(shape, kernels, std::move(on_cpu), max_tokens,
                                               packer_backend ? packer_backend->method(method) : nullptr);
        if (expert_bias) layer->enable_expert_bias();
        if (after > 0.0f) layer->enable_layer_activation(kt::activation::GatedForm::silu_limit_after, after);
        if (gelu) layer->enable_layer_activation(kt::activation::GatedForm::gelu_tanh, 0.0f);
    }

    // Expert e's biases: float32 gate [intermediate], up [intermediate], down [hidden].
    void set_expert_bias(int64_t e, const Array& gate, const Array& up, const Array& down) {
        const auto& s = layer->shape();
        const Array* parts[3] = {&gate, &up, &down};
        const char* names[3] = {"gate bias", "up bias", "down bias"};
        const int64_t sizes[3] = {s.intermediate, s.intermediate, s.hidden};
        for (int i = 0; i < 3; ++i) {
            check_cpu(*parts[i], names[i]);
            if (parts[i]->ndim() != 1 || int64_t(parts[i]->shape(0)) != sizes[i] || weight_dtype(*parts[i], names[i]) != KT_DTYPE_F32 ||
                (sizes[i] > 1 && parts[i]->stride(0) != 1))
                throw nb::value_error((std::string(names[i]) + " of expert " + std::to_string(e) +
                                       " must be a contiguous float32 [" + std::to_string(sizes[i]) + "]").c_str());
        }
        layer->set_expert_bias(e, static_cast<const float*>(gate.data()), static_cast<const float*>(up.data()),
                               static_cast<const float*>(down.data()));
    }

    // Training's grouped products (MoeLayer::grouped_*): float32 C-contiguous [rows, width]
    // arrays on the CPU, the outputs written in place; counts int64 [num_experts].
    const float* rows_of(const Array& a, const char* name, int64_t rows, int64_t width) const {
        check_cpu(a, name);
        check_exact(a, name, nb::dlpack::dtype_code::Float, 32);
        check_shape(a, name, {rows, width});
        check_contiguous(a, name);
        return static_cast<const float*>(a.data());
    }
    float* out_rows(const nb::ndarray<>& a, const char* name, int64_t rows, int64_t width) const {
        return const_cast<float*>(rows_of(Array(a), name, rows, width));
    }
    std::pair<const int64_t*, int64_t> counts_of(const Array& counts, const Array& first, const char* first_name) const {
        check_cpu(counts, "counts");
        check_exact(counts, "counts", nb::dlpack::dtype_code::Int, 64);
        check_shape(counts, "counts", {layer->shape().num_experts});
        check_contiguous(counts, "counts");
        if (first.ndim() != 2)
            throw nb::value_error((std::string(first_name) + " must be 2-D [rows, width], got " + std::to_string(first.ndim()) +
                                   "-D").c_str());
        return {static_cast<const int64_t*>(counts.data()), int64_t(first.shape(0))};
    }
    // An adapter riding on a product (kt::ProductLora): a [E, r, K], bt [E, r / blocks, N] (B_eᵀ),
    // xa [rows, r] written; all three or none.
    std::optional<kt::ProductLora> product_lora(const std::optional<nb::ndarray<>>& a, const std::optional<nb::ndarray<>>& bt,
                                                float scaling, int64_t blocks, const std::optional<nb::ndarray<>>& xa,
                                                int64_t rows, int64_t K, int64_t N) const {
        if (!a && !bt && !xa) return std::nullopt;
        if (!a || !bt || !xa) throw nb::value_error("an adapter on a grouped product needs lora_a, lora_bt and lora_xa together");
        if (a->ndim() != 3) throw nb::value_error("lora_a must be 3-D [experts, rank, K]");
        const int64_t E = layer->shape().num_experts, r = int64_t(a->shape(1));
        if (r < 1 || r > kt::kMaxLoraRank || blocks < 1 || r % blocks)
            throw nb::value_error(("LoRA rank " + std::to_string(r) + " with blocks=" + std::to_string(blocks) +
                                   ": the rank must be 1 .. " + std::to_string(kt::kMaxLoraRank) + " and divisible by blocks")
                                      .c_str());
        return kt::ProductLora{f32_array(*a, "lora_a", {E, r, K}), f32_array(*bt, "lora_bt", {E, r / blocks, N}), r, blocks,
                               scaling, f32_array(*xa, "lora_xa", {rows, r})};
    }
    // The gradient's share (kt::ProductLoraGrad): g [rows, r], a [E, r, K]; both or neither.
    std::optional<kt::ProductLoraGrad> product_lora_grad(const std::optional<nb::ndarray<>>& g,
                                                         const std::optional<nb::ndarray<>>& a, int64_t rows, int64_t K) const {
        if (!g && !a) return std::nullopt;
        if (!g || !a) throw nb::value_error("an adapter's gradient on a grouped product needs lora_g and lora_a together");
        if (a->ndim() != 3) throw nb::value_error("lora_a must be 3-D [experts, rank, K]");
        const int64_t r = int64_t(a->shape(1));
        check_lora_rank(r);
        return kt::ProductLoraGrad{f32_array(*g, "lora_g", {rows, r}), f32_array(*a, "lora_a", {layer->shape().num_experts, r, K}),
                                   r};
    }
    static const kt::ProductLora* ptr(const std::optional<kt::ProductLora>& l) { return l ? &*l : nullptr; }
    static const kt::ProductLoraGrad* ptr(const std::optional<kt::ProductLoraGrad>& l) { return l ? &*l : nullptr; }

    // x [rows, H], or x [tokens, H] with token int64 [rows] (row i = x[token[i]]).
    void grouped_gate_up(const Array& x, const Array& counts, nb::ndarray<> gate_up, std::optional<nb::ndarray<>> token,
                         std::optional<nb::ndarray<>> lora_a, std::optional<nb::ndarray<>> lora_bt, float lora_scaling,
                         int64_t lora_blocks, std::optional<nb::ndarray<>> lora_xa) {
        const int64_t H = layer->shape().hidden, I = layer->shape().intermediate;
        int64_t rows = 0;
        const int64_t* c = nullptr;
        const int64_t* tp = nullptr;
        if (token) {
            if (token->ndim() != 1) throw nb::value_error("token must be 1-D [rows]");
            rows = int64_t(token->shape(0));
            c = counts_of(counts, x, "x").first;
        } else {
            std::tie(c, rows) = counts_of(counts, x, "x");
        }
        const int64_t T = token ? int64_t(x.shape(0)) : rows;
        const float* xp = rows_of(x, "x", T, H);
        if (token) tp = token_rows(*token, rows, T);
        float* gu = out_rows(gate_up, "gate_up", rows, 2 * I);
        const auto lora = product_lora(lora_a, lora_bt, lora_scaling, lora_blocks, lora_xa, rows, H, 2 * I);
        ReleaseGil release;
        layer->grouped_gate_up(xp, tp, rows, c, gu, ptr(lora));
    }
    void grouped_down(const Array& h, const Array& counts, nb::ndarray<> y, std::optional<nb::ndarray<>> lora_a,
                      std::optional<nb::ndarray<>> lora_bt, float lora_scaling, std::optional<nb::ndarray<>> lora_xa) {
        const auto [c, rows] = counts_of(counts, h, "h");
        const int64_t H = layer->shape().hidden, I = layer->shape().intermediate;
        const float* hp = rows_of(h, "h", rows, I);
        float* yp = out_rows(y, "y", rows, H);
        const auto lora = product_lora(lora_a, lora_bt, lora_scaling, 1, lora_xa, rows, I, H);
        ReleaseGil release;
        layer->grouped_down(hp, rows, c, yp, ptr(lora));
    }
    void grouped_gate_up_transposed(const Array& dgate_up, const Array& counts, nb::ndarray<> dx,
                                    std::optional<nb::ndarray<>> lora_g, std::optional<nb::ndarray<>> lora_a) {
        const auto [c, rows] = counts_of(counts, dgate_up, "dgate_up");
        const int64_t H = layer->shape().hidden, I = layer->shape().intermediate;
        const float* g = rows_of(dgate_up, "dgate_up", rows, 2 * I);
        float* out = out_rows(dx, "dx", rows, H);
        const auto lora = product_lora_grad(lora_g, lora_a, rows, H);
        ReleaseGil release;
        layer->grouped_gate_up_transposed(g, rows, c, out, ptr(lora));
    }
    void grouped_down_transposed(const Array& dy, const Array& counts, nb::ndarray<> dh, std::optional<nb::ndarray<>> lora_g,
                                 std::optional<nb::ndarray<>> lora_a) {
        const auto [c, rows] = counts_of(counts, dy, "dy");
        const int64_t H = layer->shape().hidden, I = layer->shape().intermediate;
        const float* d = rows_of(dy, "dy", rows, H);
        float* out = out_rows(dh, "dh", rows, I);
        const auto lora = product_lora_grad(lora_g, lora_a, rows, I);
        ReleaseGil release;
        layer->grouped_down_transposed(d, rows, c, out, ptr(lora));
    }

    // A layer with the clamped SwiGLU runs only on kernels that claim it (kt/plugin.h, ABI 1.2).
    static void require_swiglu(const kt_method_kernels& k, const char* backend_name) {
        if (!(KT_HAS_FIELD(&k, kt_method_kernels, activations) && (k.activations & KT_ACTIVATION_SWIGLU)))
            throw nb::value_error((std::string("backend '") + backend_name + "' method " + k.method + " (" + k.kernel_id +
                                   ") does not apply swiglu_limit / swiglu_alpha (its kernel table does not claim "
                                   "KT_ACTIVATION_SWIGLU); choose a backend that does, e.g. backend='reference'").c_str());
    }

    // Batches the layer's kernels decline run on `b`'s kernels of the same method, which must
    // read the same packed layout (checked by the layer).
    void set_small_batch_backend(const Backend& b, const std::string& method) {
        const kt_moe_config& c = layer->shape();
        if (c.swiglu_limit > 0.0f || c.swiglu_alpha > 0.0f) require_swiglu(*b.method(method), b.api->name);
        layer->set_small_batch_kernels(b.method(method));
        small_batch_backend = b;
    }

    using Optional = std::optional<Array>;
    void load_expert(int64_t e, const Array& gate, const Array& up, const Array& down, const Optional& gate_scale,
                     const Optional& up_scale, const Optional& down_scale, const Optional& gate_zero,
                     const Optional& up_zero, const Optional& down_zero) {
        const auto& s = layer->shape();
        kt_expert_weights w{sizeof(kt_expert_weights),
                            {matrix_of(gate, "gate", s.intermediate, s.hidden), optional_matrix(gate_scale, "gate_scale"),
                             optional_matrix(gate_zero, "gate_zero")},
                            {matrix_of(up, "up", s.intermediate, s.hidden), optional_matrix(up_scale, "up_scale"),
                             optional_matrix(up_zero, "up_zero")},
                            {matrix_of(down, "down", s.hidden, s.intermediate), optional_matrix(down_scale, "down_scale"),
                             optional_matrix(down_zero, "down_zero")}};
        ReleaseGil release;
        layer->load_expert(e, w);
    }

    // experts[i] gets parts[i] = (gate, up, down, gate_scale, up_scale, down_scale,
    // gate_zero, up_zero, down_zero), None for absent parts; packed in parallel on the pool.
    void load_experts(const std::vector<int64_t>& experts, nb::list parts) {
        if (nb::len(parts) != experts.size())
            throw nb::value_error(("load_experts: " + std::to_string(experts.size()) + " experts but " +
                                   std::to_string(nb::len(parts)) + " weight tuples").c_str());
        const auto& s = layer->shape();
        static const char* names[9] = {"gate", "up", "down", "gate_scale", "up_scale", "down_scale",
                                       "gate_zero", "up_zero", "down_zero"};
        std::vector<kt_expert_weights> weights;
        std::vector<Array> keep;   // the DLPack views must outlive the parallel pack
        keep.reserve(experts.size() * 9);
        for (size_t i = 0; i < experts.size(); ++i) {
            nb::tuple t = nb::cast<nb::tuple>(parts[i]);
            if (nb::len(t) != 9) throw nb::value_error("load_experts: each weight tuple has 9 entries");
            kt_matrix m[9];
            for (int j = 0; j < 9; ++j) {
                if (t[j].is_none()) {
                    if (j < 3) throw nb::value_error((std::string(names[j]) + " weights are required").c_str());
                    m[j] = kt_matrix{nullptr, KT_DTYPE_F32, 0, 0, 0};
                    continue;
                }
                keep.push_back(nb::cast<Array>(t[j]));
                const int64_t rows = j == 2 ? s.hidden : j < 2 ? s.intermediate : 0;
                const int64_t cols = j == 2 ? s.intermediate : j < 2 ? s.hidden : 0;
                m[j] = matrix_of(keep.back(), names[j], rows, cols);
            }
            weights.push_back(kt_expert_weights{sizeof(kt_expert_weights), {m[0], m[3], m[6]}, {m[1], m[4], m[7]},
                                                {m[2], m[5], m[8]}});
        }
        ReleaseGil release;
        layer->load_experts(experts.data(), weights.data(), weights.size());
    }

    // load_packed / map_packed: experts[i]'s packed bytes at offsets[i] of the open file fd.
    using FromFile = void (kt::MoeLayer::*)(const int64_t*, const uint64_t*, size_t, int);
    template <FromFile kInstall>
    void from_file(const std::vector<int64_t>& experts, const std::vector<uint64_t>& offsets, int fd) {
        if (offsets.size() != experts.size())
            throw nb::value_error((std::to_string(experts.size()) + " experts but " + std::to_string(offsets.size()) +
                                   " offsets").c_str());
        ReleaseGil release;
        (layer.get()->*kInstall)(experts.data(), offsets.data(), experts.size(), fd);
    }

    nb::bytes copy_packed(int64_t expert) const {
        const std::vector<char> b = layer->copy_packed(expert);
        return nb::bytes(b.data(), b.size());
    }

    struct Call {
        const void* hidden;
        kt_dtype hidden_dtype, out_dtype;
        int64_t tokens;
        const int64_t* ids;
        const float* weights;
        void* out;
    };

    Call prepare(const Array& hidden, const Array& ids, const Array& weights, const nb::ndarray<>& out) {
        const auto& s = layer->shape();
        check_cpu(hidden, "hidden_states");
        if (hidden.ndim() != 2)
            throw nb::value_error(("hidden_states must be 2-D [tokens, " + std::to_string(s.hidden) + "], got " +
                                   std::to_string(hidden.ndim()) + "-D").c_str());
        const int64_t T = int64_t(hidden.shape(0));
        check_shape(hidden, "hidden_states", {T, s.hidden});
        check_contiguous(hidden, "hidden_states");
        const kt_dtype hd = float_dtype(hidden, "hidden_states");
        check_cpu(ids, "topk_ids");
        check_shape(ids, "topk_ids", {T, s.top_k});
        check_exact(ids, "topk_ids", nb::dlpack::dtype_code::Int, 64);
        check_contiguous(ids, "topk_ids");
        check_cpu(weights, "topk_weights");
        check_shape(weights, "topk_weights", {T, s.top_k});
        check_exact(weights, "topk_weights", nb::dlpack::dtype_code::Float, 32);
        check_contiguous(weights, "topk_weights");
        Array out_ro(out);
        check_cpu(out_ro, "out");
        check_shape(out_ro, "out", {T, s.hidden});
        check_contiguous(out_ro, "out");
        const kt_dtype od = float_dtype(out_ro, "out");
        return Call{hidden.data(), hd, od, T, static_cast<const int64_t*>(ids.data()),
                    static_cast<const float*>(weights.data()), out.data()};
    }

    // kt_core.MoE's torch fast path: C-contiguous CPU tensors of the layer's shapes, already in
    // the kernels' dtypes (checked in Python), passed as their data addresses. Exporting four
    // tensors through DLPack is ~10 us a call warm and several times that with the caches
    // cold after a forward. Wrong addresses are the caller's bug: this is not a public API.
    static Call at(uintptr_t hidden, int hidden_dtype, int64_t tokens, uintptr_t ids, uintptr_t weights, uintptr_t out,
                   int out_dtype) {
        for (int d : {hidden_dtype, out_dtype})
            if (d != KT_DTYPE_F32 && d != KT_DTYPE_BF16)
                throw nb::value_error(("forward_at takes float32 or bfloat16 tensors, got dtype code " + std::to_string(d)).c_str());
        if (tokens < 0) throw nb::value_error(("forward_at got " + std::to_string(tokens) + " tokens").c_str());
        if (tokens > 0 && (!hidden || !ids || !weights || !out)) throw nb::value_error("forward_at got a null address");
        return Call{reinterpret_cast<const void*>(hidden), kt_dtype(hidden_dtype), kt_dtype(out_dtype), tokens,
                    reinterpret_cast<const int64_t*>(ids), reinterpret_cast<const float*>(weights),
                    reinterpret_cast<void*>(out)};
    }

    void run(const Call& c) {
        ReleaseGil release;
        layer->forward(c.hidden, c.hidden_dtype, c.tokens, c.ids, c.weights, c.out, c.out_dtype);
    }

    void forward(const Array& hidden, const Array& ids, const Array& weights, nb::ndarray<> out) {
        run(prepare(hidden, ids, weights, out));
    }

    void forward_at(uintptr_t hidden, int hidden_dtype, int64_t tokens, uintptr_t ids, uintptr_t weights, uintptr_t out,
                    int out_dtype) {
        run(at(hidden, hidden_dtype, tokens, ids, weights, out, out_dtype));
    }

    void submit_forward(const Array& hidden, const Array& ids, const Array& weights, nb::ndarray<> out,
                        nb::object keep_alive) {
        submit(prepare(hidden, ids, weights, out), std::move(keep_alive));
    }

    void submit_forward_at(uintptr_t hidden, int hidden_dtype, int64_t tokens, uintptr_t ids, uintptr_t weights,
                           uintptr_t out, int out_dtype, nb::object keep_alive) {
        submit(at(hidden, hidden_dtype, tokens, ids, weights, out, out_dtype), std::move(keep_alive));
    }

    void submit(const Call& c, nb::object keep_alive) {
        if (kt::global_pool().job_pending())
            throw std::runtime_error("a forward is already submitted; call sync_forward() before submitting another");
        // Validate on this thread so bad input raises here, not at sync().
        kt::MoeLayer* l = layer.get();
        l->check_forward_arguments(c.tokens, c.ids, c.out_dtype);
        {
            ReleaseGil release;
            kt::global_pool().submit([l, c] { l->forward(c.hidden, c.hidden_dtype, c.tokens, c.ids, c.weights, c.out, c.out_dtype); });
        }
        g_pending = std::make_unique<PendingForward>(PendingForward{std::move(keep_alive)});
    }
};

// --- per-expert LoRA over grouped rows (kt.training): float32 C-contiguous CPU arrays ---------

// (shape, counts) of a LoRA call: x [rows, K], a [E, r, K], b [E, N, r / blocks], counts int64 [E] summing to rows.
// The rows are x's, or token's when given (x then [tokens, K], rows x[token]); x itself is checked here.
std::pair<kt::LoraShape, const int64_t*> lora_shape(const nb::ndarray<>& x, const nb::ndarray<>& counts,
                                                    const nb::ndarray<>& a, const nb::ndarray<>& b, int64_t blocks,
                                                    const std::optional<nb::ndarray<>>& token = std::nullopt,
                                                    bool check_x = true) {
    if (x.ndim() != 2 || a.ndim() != 3 || b.ndim() != 3)
        throw nb::value_error("LoRA: x must be 2-D [rows, K], a 3-D [E, r, K] and b 3-D [E, N, r / blocks]");
    if (token && token->ndim() != 1) throw nb::value_error("token must be 1-D [rows]");
    const int64_t rows = token ? int64_t(token->shape(0)) : int64_t(x.shape(0));
    kt::LoraShape s{int64_t(a.shape(0)), int64_t(a.shape(1)), int64_t(a.shape(2)), int64_t(b.shape(1)), rows, blocks};
    check_lora_rank(s.rank);
    if (blocks < 1 || s.rank % blocks || s.n % blocks)
        throw nb::value_error(("LoRA blocks=" + std::to_string(blocks) + " must divide the rank (" +
                               std::to_string(s.rank) + ") and N (" + std::to_string(s.n) + ")").c_str());
    if (check_x) f32_array(x, "x", {token ? int64_t(x.shape(0)) : s.rows, s.k});
    f32_array(a, "a", {s.experts, s.rank, s.k});
    f32_array(b, "b", {s.experts, s.n, s.rank / blocks});
    return {s, grouped_counts(counts, s.experts, s.rows, token || check_x ? "x" : "dy")};
}

void lora_forward(nb::ndarray<> x, nb::ndarray<> counts, nb::ndarray<> a, nb::ndarray<> b, float scaling,
                  nb::ndarray<> xa, nb::ndarray<> out, int64_t blocks) {
    const auto [s, c] = lora_shape(x, counts, a, b, blocks);
    float* xap = f32_array(xa, "xa", {s.rows, s.rank});
    float* op = f32_array(out, "out", {s.rows, s.n});
    const float* xp = static_cast<const float*>(x.data());
    const float* ap = static_cast<const float*>(a.data());
    const float* bp = static_cast<const float*>(b.data());
    ReleaseGil release;
    kt::grouped_lora_forward(s, c, xp, ap, bp, scaling, xap, op);
}

void lora_backward(nb::ndarray<> dy, std::optional<nb::ndarray<>> x_or_none, nb::ndarray<> xa, nb::ndarray<> counts,
                   nb::ndarray<> a, nb::ndarray<> b, float scaling, std::optional<nb::ndarray<>> dx,
                   std::optional<nb::ndarray<>> da, nb::ndarray<> db, int64_t blocks, bool accumulate_dx,
                   std::optional<nb::ndarray<>> g, std::optional<nb::ndarray<>> token) {
    if (!dx == !g) throw nb::value_error("grouped_lora_backward takes dx or g (the base product adds g A_e), one of them");
    if (!x_or_none != !da) throw nb::value_error("grouped_lora_backward: x and da go together (both None: dA left to the caller)");
    if (!x_or_none && (dx || token)) throw nb::value_error("grouped_lora_backward: dx and token need x");
    // Without x the rows are counted on dy.
    const nb::ndarray<> x = x_or_none ? *x_or_none : dy;
    const auto [s, c] = lora_shape(x, counts, a, b, blocks, token, bool(x_or_none));
    const int64_t tokens = int64_t(x.shape(0));
    const float* dyp = f32_array(dy, "dy", {s.rows, s.n});
    const float* xap = f32_array(xa, "xa", {s.rows, s.rank});
    float* dxp = dx ? f32_array(*dx, "dx", {s.rows, s.k}) : nullptr;
    float* gp = g ? f32_array(*g, "g", {s.rows, s.rank}) : nullptr;
    float* dap = da ? f32_array(*da, "da", {s.experts, s.rank, s.k}) : nullptr;
    float* dbp = f32_array(db, "db", {s.experts, s.n, s.rank / blocks});
    const float* xp = x_or_none ? static_cast<const float*>(x.data()) : nullptr;
    const int64_t* tp = token ? token_rows(*token, s.rows, tokens) : nullptr;
    const float* ap = static_cast<const float*>(a.data());
    const float* bp = static_cast<const float*>(b.data());
    ReleaseGil release;
    kt::grouped_lora_backward(s, c, dyp, xp, xap, ap, bp, scaling, dxp, dap, dbp, accumulate_dx, gp, tp);
}

// --- training's row passes (kt.training): float32 / int64 C-contiguous CPU arrays ------------

void gather_rows(nb::ndarray<> x, nb::ndarray<> token, nb::ndarray<> rows) {
    if (x.ndim() != 2 || token.ndim() != 1) throw nb::value_error("gather_rows: x must be [tokens, width], token [rows]");
    const int64_t T = int64_t(x.shape(0)), W = int64_t(x.shape(1)), S = int64_t(token.shape(0));
    const float* xp = f32_array(x, "x", {T, W});
    const int64_t* tp = i64_array(token, "token", {S});
    float* rp = f32_array(rows, "rows", {S, W});
    for (int64_t i = 0; i < S; ++i)
        if (tp[i] < 0 || tp[i] >= T)
            throw nb::value_error(("token[" + std::to_string(i) + "] = " + std::to_string(tp[i]) + " is outside [0, " +
                                   std::to_string(T) + ")").c_str());
    ReleaseGil release;
    kt::gather_rows(xp, W, tp, S, rp);
}

void sum_rows(nb::ndarray<> rows, nb::ndarray<> row_of_slot, nb::ndarray<> out) {
    if (rows.ndim() != 2 || row_of_slot.ndim() != 2) throw nb::value_error("sum_rows: rows must be [rows, width], row_of_slot [tokens, picks]");
    const int64_t S = int64_t(rows.shape(0)), W = int64_t(rows.shape(1));
    const int64_t T = int64_t(row_of_slot.shape(0)), K = int64_t(row_of_slot.shape(1));
    const float* rp = f32_array(rows, "rows", {S, W});
    const int64_t* sp = i64_array(row_of_slot, "row_of_slot", {T, K});
    float* op = f32_array(out, "out", {T, W});
    for (int64_t i = 0; i < T * K; ++i)
        if (sp[i] < -1 || sp[i] >= S)
            throw nb::value_error(("row_of_slot holds " + std::to_string(sp[i]) + ", outside [-1, " + std::to_string(S) +
                                   ")").c_str());
    ReleaseGil release;
    kt::sum_rows(rp, W, sp, T, K, op);
}

// The rows' gated form from the binding's terms (kt_core.rows._gate), checked.
kt::activation::GatedForm check_gate(float limit, float alpha, bool after, bool gelu) {
    if (!(limit >= 0.0f) || !std::isfinite(limit) || !std::isfinite(alpha))
        throw nb::value_error(("the clamped SwiGLU needs a finite swiglu_limit >= 0 (0: SiLU) and a finite swiglu_alpha, got " +
                               std::to_string(limit) + " and " + std::to_string(alpha)).c_str());
    if (after && !(limit > 0.0f && alpha == 0.0f))
        throw nb::value_error(("a limit after SiLU needs swiglu_limit > 0 and swiglu_alpha 0, got " +
                               std::to_string(limit) + " and " + std::to_string(alpha)).c_str());
    if (gelu && (after || limit != 0.0f || alpha != 0.0f))
        throw nb::value_error("GELU-tanh takes no limit, alpha or limit after SiLU");
    using kt::activation::GatedForm;
    return gelu ? GatedForm::gelu_tanh : after ? GatedForm::silu_limit_after : GatedForm::silu;
}

void gated_rows_forward(nb::ndarray<> gate_up, nb::ndarray<> w, nb::ndarray<> h, float limit, float alpha, bool after,
                        bool gelu) {
    const auto form = check_gate(limit, alpha, after, gelu);
    if (gate_up.ndim() != 2 || gate_up.shape(1) % 2) throw nb::value_error("gate_up must be [rows, 2 * intermediate]");
    const int64_t S = int64_t(gate_up.shape(0)), I = int64_t(gate_up.shape(1)) / 2;
    const float* gp = f32_array(gate_up, "gate_up", {S, 2 * I});
    const float* wp = f32_array(w, "w", {S});
    float* hp = f32_array(h, "h", {S, I});
    ReleaseGil release;
    kt::gated_rows_forward(gp, wp, S, I, limit, alpha, form, hp);
}

// With counts, g and da (all three): the down adapter's dA too (kt::gated_rows_backward_lora).
void gated_rows_backward(nb::ndarray<> dh, nb::ndarray<> gate_up, nb::ndarray<> w, nb::ndarray<> dgate_up,
                         nb::ndarray<> dw, float limit, float alpha, bool after, bool gelu,
                         std::optional<nb::ndarray<>> counts, std::optional<nb::ndarray<>> g,
                         std::optional<nb::ndarray<>> da) {
    const auto form = check_gate(limit, alpha, after, gelu);
    if (gate_up.ndim() != 2 || gate_up.shape(1) % 2) throw nb::value_error("gate_up must be [rows, 2 * intermediate]");
    const int64_t S = int64_t(gate_up.shape(0)), I = int64_t(gate_up.shape(1)) / 2;
    const float* dp = f32_array(dh, "dh", {S, I});
    const float* gp = f32_array(gate_up, "gate_up", {S, 2 * I});
    const float* wp = f32_array(w, "w", {S});
    float* dgp = f32_array(dgate_up, "dgate_up", {S, 2 * I});
    float* dwp = f32_array(dw, "dw", {S});
    if (!counts && !g && !da) {
        ReleaseGil release;
        kt::gated_rows_backward(dp, gp, wp, S, I, limit, alpha, form, dgp, dwp);
        return;
    }
    if (!counts || !g || !da) throw nb::value_error("gated_rows_backward: the adapter's dA needs counts, g and da together");
    if (da->ndim() != 3 || counts->ndim() != 1) throw nb::value_error("da must be [experts, rank, intermediate], counts [experts]");
    const int64_t E = int64_t(da->shape(0)), r = int64_t(da->shape(1));
    const int64_t* cp = grouped_counts(*counts, E, S, "gate_up");
    const float* gp2 = f32_array(*g, "g", {S, r});
    float* dap = f32_array(*da, "da", {E, r, I});
    ReleaseGil release;
    kt::gated_rows_backward_lora(dp, gp, wp, S, I, limit, alpha, form, dgp, dwp, cp, E, gp2, r, dap);
}

void pool_sync() {
    {
        ReleaseGil release;
        try {
            kt::global_pool().sync();
        } catch (...) {
            nb::gil_scoped_acquire acquire;
            g_pending.reset();
            throw;
        }
    }
    g_pending.reset();
}

// Registered with atexit, which runs before the interpreter is torn down. A process that
// exits with a forward submitted and not synced used to abort ("Fatal Python error:
// PyThreadState_Get") when g_pending's static destructor released its Python objects after
// finalization; now the forward is waited for (nothing writes into arrays being torn down)
// and the objects are released while Python still runs. Its error, if any, has no receiver.
void at_exit() {
    g_exit_thread = std::this_thread::get_id();
    g_exiting.store(true);
    // Daemon threads still alive keep their frames' objects (kt layers among them) forever:
    // CPython never frees them, so nanobind's leak report would only be noise then.
    if (nb::len(nb::module_::import_("threading").attr("enumerate")()) > 1) nb::set_leak_warnings(false);
    {
        ReleaseGil release;   // the GIL is free for threads already on their way back (above)
        if (kt::global_pool_exists()) {
            try {
                kt::global_pool().sync();
            } catch (...) {
            }
        }
        while (g_regaining.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    g_pending.reset();
}

nb::dict cpu_features_dict() {
    const auto& f = kt::cpu_features();
    nb::dict d;
    d["arch"] = f.arch;
    d["vendor"] = f.vendor;
    d["brand"] = f.brand;
    d["features"] = f.features;
    d["notes"] = f.notes;
    d["os_saves_ymm"] = f.os_saves_ymm;
    d["os_saves_zmm"] = f.os_saves_zmm;
    d["os_saves_amx"] = f.os_saves_amx;
    d["amx_permission"] = f.amx_permission;
    d["sve_vector_bits"] = f.sve_vector_bits;
    return d;
}

nb::dict topology_dict() {
    const auto& t = kt::topology();
    nb::list cores, nodes;
    for (const auto& c : t.cores) cores.append(kv("index", c.index, "cpus", c.cpus, "numa_node", c.numa_node, "package", c.package));
    for (const auto& n : t.nodes) nodes.append(kv("id", n.id, "memory_bytes", n.memory_bytes, "cores", n.cores));
    return kv("cores", cores, "nodes", nodes, "num_cpus", t.num_cpus, "num_packages", t.num_packages,
                    "l1d_bytes", t.l1d_bytes, "l2_bytes", t.l2_bytes, "l3_bytes", t.l3_bytes,
                    "total_memory_bytes", t.total_memory_bytes, "source", t.source);
}

nb::dict pool_info() {
    auto& p = kt::global_pool();
    nb::list groups;
    for (int g = 0; g < p.num_groups(); ++g)
        groups.append(kv("numa_node", p.group_numa_node(g), "threads", p.group_size(g)));
    const auto& c = p.config();
    return kv("num_threads", p.num_threads(), "groups", groups, "pinned_cpus", p.pinned_cpus(),
                    "virtual_numa", c.virtual_numa, "pin", c.pin, "spin_us", c.spin_us);
}

nb::list numa_usage() {
    nb::list out;
    for (const auto& u : kt::numa_usage())
        out.append(kv("node", u.node, "bytes_live", u.bytes_live, "bytes_peak", u.bytes_peak,
                            "allocations_live", u.allocations_live));
    return out;
}

// Fork-join cost of the pool: `iterations` loops of `range` empty tasks, µs per loop.
double bench_fork_join(int64_t iterations, int64_t range) {
    ReleaseGil release;
    auto& pool = kt::global_pool();
    auto noop = [](void*, size_t) {};
    for (int i = 0; i < 100; ++i) pool.parallel_for(size_t(range), noop, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iterations; ++i) pool.parallel_for(size_t(range), noop, nullptr);
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / double(iterations);
}

// Sustained read bandwidth with the pool's threads: each thread sums its own slice of a buffer
// far larger than the caches (huge pages, like the weights). Returns GB/s of every repeat.
uint64_t sum_words(const uint64_t* data, size_t begin, size_t end) {
    uint64_t a = 0, b = 0, d = 0, e = 0;   // four chains so the adds keep up with memory
    size_t k = begin;
    for (; k + 4 <= end; k += 4) {
        a += data[k];
        b += data[k + 1];
        d += data[k + 2];
        e += data[k + 3];
    }
    for (; k < end; ++k) a += data[k];
    return a + b + d + e;
}

std::vector<double> bench_read_bandwidth(size_t bytes, int repeats) {
    ReleaseGil release;
    auto& pool = kt::global_pool();
    const size_t words = bytes / sizeof(uint64_t);
    kt::NumaBuffer buffer = kt::make_numa_buffer(words * sizeof(uint64_t), 64, kt::kNodeInterleave, true);
    auto* data = static_cast<uint64_t*>(buffer.get());
    for (size_t i = 0; i < words; ++i) data[i] = i;   // touch every page before timing
    const size_t parts = size_t(pool.num_threads());
    struct Ctx {
        const uint64_t* data;
        size_t words, parts;
        std::vector<uint64_t> sums;
    } ctx{data, words, parts, std::vector<uint64_t>(parts * 8)};
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for(parts, [](void* c, size_t i) {
            auto* x = static_cast<Ctx*>(c);
            x->sums[i * 8] = sum_words(x->data, x->words * i / x->parts, x->words * (i + 1) / x->parts);  // a line each
        }, &ctx);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(words * sizeof(uint64_t)) / s / 1e9);
    }
    return rates;
}

// Per NUMA group, all groups at once (as the MoE path runs): each group's threads read a
// buffer bound to that group's node, one slice per thread; a group's rate is its bytes over
// the time its last slice finished. Returns [repeat][group] GB/s. A thread that runs out of
// work may help another group (the pool steals), which then reads remote memory: with equal
// slices per thread that only happens at the very end, and it is what the MoE path does too.
std::vector<std::vector<double>> bench_read_bandwidth_per_group(size_t bytes_per_group, int repeats) {
    ReleaseGil release;
    auto& pool = kt::global_pool();
    const int groups = pool.num_groups();
    const size_t words = bytes_per_group / sizeof(uint64_t);
    std::vector<kt::NumaBuffer> buffers;
    for (int g = 0; g < groups; ++g) {
        buffers.push_back(kt::make_numa_buffer(words * sizeof(uint64_t), 64, pool.group_numa_node(g), true));
        auto* data = static_cast<uint64_t*>(buffers.back().get());
        for (size_t i = 0; i < words; ++i) data[i] = i;
    }
    std::vector<size_t> ranges(static_cast<size_t>(groups));
    for (int g = 0; g < groups; ++g) ranges[size_t(g)] = size_t(pool.group_size(g));
    const size_t widest = *std::max_element(ranges.begin(), ranges.end());
    using Clock = std::chrono::steady_clock;
    struct Ctx {
        std::vector<const uint64_t*> data;
        const size_t* ranges;
        size_t words, widest;
        std::vector<uint64_t> sums;               // one cache line per (group, slice)
        std::vector<std::atomic<int64_t>> done;   // per group: latest finish, ns after t0
        Clock::time_point t0;
    } ctx{{}, ranges.data(), words, widest, std::vector<uint64_t>(size_t(groups) * widest * 8),
          std::vector<std::atomic<int64_t>>(size_t(groups)), Clock::now()};
    for (auto& b : buffers) ctx.data.push_back(static_cast<const uint64_t*>(b.get()));
    std::vector<std::vector<double>> rates;
    for (int r = 0; r < repeats; ++r) {
        for (auto& d : ctx.done) d.store(0);
        ctx.t0 = Clock::now();
        pool.parallel_for_groups(ranges.data(), [](void* c, int g, size_t i) {
            auto* x = static_cast<Ctx*>(c);
            const size_t parts = x->ranges[g];
            x->sums[(size_t(g) * x->widest + i) * 8] =
                sum_words(x->data[size_t(g)], x->words * i / parts, x->words * (i + 1) / parts);
            const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - x->t0).count();
            int64_t seen = x->done[size_t(g)].load();
            while (seen < ns && !x->done[size_t(g)].compare_exchange_weak(seen, ns)) {
            }
        }, &ctx);
        std::vector<double> per;
        for (int g = 0; g < groups; ++g)
            per.push_back(double(words * sizeof(uint64_t)) / (double(ctx.done[size_t(g)].load()) * 1e-9) / 1e9);
        rates.push_back(per);
    }
    return rates;
}

}  // namespace

// kt convert's quantizers: the caller allocates the outputs (shapes checked here).
kt_matrix float_source(const Array& src) {
    check_cpu(src, "source");
    check_contiguous(src, "source");
    if (src.ndim() != 2) throw nb::value_error("source must be 2-D [N, K]");
    const kt_dtype d = weight_dtype(src, "source");
    if (d != KT_DTYPE_F32 && d != KT_DTYPE_BF16) throw nb::type_error("source must be float32 or bfloat16");
    return kt_matrix{src.data(), d, int64_t(src.shape(0)), int64_t(src.shape(1)), int64_t(src.shape(1))};
}

template <class T>
T* output(nb::ndarray<>& a, const char* name, nb::dlpack::dtype_code code, int bits, std::initializer_list<int64_t> shape) {
    Array ro(a);
    check_cpu(ro, name);
    check_contiguous(ro, name);
    check_exact(ro, name, code, bits);
    check_shape(ro, name, shape);
    return static_cast<T*>(a.data());
}

void quantize_int8_codes(const Array& src, nb::ndarray<> codes, nb::ndarray<> scales) {
    const kt_matrix m = float_source(src);
    auto* c = output<int8_t>(codes, "codes", nb::dlpack::dtype_code::Int, 8, {m.rows, m.cols});
    auto* s = output<float>(scales, "scales", nb::dlpack::dtype_code::Float, 32, {m.rows, 1});
    ReleaseGil release;
    kt::quantize_int8_codes(m, c, s);
}

void quantize_int4_codes(const Array& src, int64_t group, bool zero_point, nb::ndarray<> packed, nb::ndarray<> scales,
                         std::optional<nb::ndarray<>> zeros) {
    const kt_matrix m = float_source(src);
    if (group <= 0 || m.cols % group || group % 2)
        throw nb::value_error(("group size " + std::to_string(group) + " must be even and divide K = " + std::to_string(m.cols)).c_str());
    auto* p = output<uint8_t>(packed, "packed", nb::dlpack::dtype_code::UInt, 8, {m.rows, m.cols / 2});
    auto* s = output<float>(scales, "scales", nb::dlpack::dtype_code::Float, 32, {m.rows, m.cols / group});
    uint8_t* z = nullptr;
    if (zero_point) {
        if (!zeros) throw nb::value_error("zero_point=True needs a zeros output");
        z = output<uint8_t>(*zeros, "zeros", nb::dlpack::dtype_code::UInt, 8, {m.rows, m.cols / group});
    }
    ReleaseGil release;
    kt::quantize_int4_codes(m, group, zero_point, p, s, z);
}

NB_MODULE(_native, m) {
    m.doc() = "kt-core native module: host detection, thread pool, NUMA allocator, plugin ABI, MoE path";
    // nanobind reports objects still alive when the interpreter shuts down as leaks. A script that
    // ends holding an autograd graph through kt's experts (kt.training) keeps the backends alive
    // that way — torch's graph nodes are invisible to Python's collector — and would print a
    // screenful at every exit. KT_DEBUG_LEAKS=1 turns the report back on for binding work.
    if (!std::getenv("KT_DEBUG_LEAKS")) nb::set_leak_warnings(false);
    // A failed allocation or a plugin's KT_ERROR_OUT_OF_MEMORY: MemoryError with the message
    // (nanobind's own bad_alloc translation drops it).
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const kt::OutOfMemory& e) {
            PyErr_SetString(PyExc_MemoryError, e.what());
        }
    });
    m.attr("ABI_MAJOR") = KT_PLUGIN_ABI_MAJOR;
    m.attr("ABI_MINOR") = KT_PLUGIN_ABI_MINOR;
    m.attr("BACKEND_CAPSULE_NAME") = KT_BACKEND_CAPSULE_NAME;

    m.def("cpu_features", &cpu_features_dict, "CPU features usable by this process (CPU and OS), uncapped");
    m.def("topology", &topology_dict, "physical cores, NUMA nodes and caches (hwloc)");
    m.def("set_host_features", &kt::set_host_features, "features the host table reports to plugins (after KT_MAX_ISA)");

    m.def(
        "configure_pool",
        [](int num_threads, int virtual_numa, bool pin, int spin_us) {
            ReleaseGil release;
            kt::configure_global_pool(kt::PoolConfig{num_threads, virtual_numa, pin, spin_us});
        },
        "num_threads"_a = 0, "virtual_numa"_a = 0, "pin"_a = true, "spin_us"_a = 100);
    m.def("pool_exists", &kt::global_pool_exists);
    m.def("pool_info", &pool_info);
    m.def("forward_api", [] {
        return nb::capsule(static_cast<const void*>(kt::forward_api()), KT_FORWARD_API_CAPSULE);
    }, "kt/forward.h's table, for device bridges (kt-cuda)");
    m.def("pool_sync", &pool_sync, "wait for the submitted forward; the caller joins its work");
    m.def("gather_rows", &gather_rows, "x"_a, "token"_a, "rows"_a, "rows[i] = x[token[i]]");
    m.def("sum_rows", &sum_rows, "rows"_a, "row_of_slot"_a, "out"_a,
          "out[t] = sum of rows[row_of_slot[t, j]] over j (-1 skipped)");
    m.def("gated_rows_forward", &gated_rows_forward, "gate_up"_a, "w"_a, "h"_a, "limit"_a = 0.0f, "alpha"_a = 0.0f,
          "after"_a = false, "gelu"_a = false,
          "h = SiLU(gate) * up * w per row (limit > 0: clamped first, or with after the SiLU clamped; "
          "alpha > 0: GPT-OSS's clamped SwiGLU; gelu: GELU-tanh(gate) * up * w)");
    m.def("gated_rows_backward", &gated_rows_backward, "dh"_a, "gate_up"_a, "w"_a, "dgate_up"_a, "dw"_a,
          "limit"_a = 0.0f, "alpha"_a = 0.0f, "after"_a = false, "gelu"_a = false, "counts"_a = nb::none(), "g"_a = nb::none(),
          "da"_a = nb::none(),
          "the gradients of gated_rows_forward's gate_up and w from that of h (with counts, g, da: also "
          "da_e = sum over expert e's rows of g[i]^T h[i], rows grouped by expert)");
    m.def("grouped_lora_forward", &lora_forward, "x"_a, "counts"_a, "a"_a, "b"_a, "scaling"_a, "xa"_a, "out"_a,
          "blocks"_a = 1,
          "out += scaling * (x A_eᵀ) B_eᵀ per expert's rows (grouped by counts; B block-diagonal in `blocks` parts); "
          "xa = x A_eᵀ");
    m.def("grouped_lora_backward", &lora_backward, "dy"_a, "x"_a, "xa"_a, "counts"_a, "a"_a, "b"_a, "scaling"_a, "dx"_a,
          "da"_a, "db"_a, "blocks"_a = 1, "accumulate_dx"_a = false, "g"_a = nb::none(), "token"_a = nb::none(),
          "the gradients of grouped_lora_forward's x, a and b from that of out (overwritten; dx added to with "
          "accumulate_dx; with dx None, g = scaling dy B_e written for a product's lora_g; with token, x is "
          "[tokens, K] and the rows x[token])");
    m.def("pool_job_pending", [] { return kt::global_pool().job_pending(); });
    m.def("_at_exit", &at_exit);
    nb::module_::import_("atexit").attr("register")(m.attr("_at_exit"));
    m.def("bench_fork_join", &bench_fork_join, "iterations"_a, "range"_a);
    m.def("bench_read_bandwidth", &bench_read_bandwidth, "bytes"_a, "repeats"_a);
    m.def("bench_read_bandwidth_per_group", &bench_read_bandwidth_per_group, "bytes_per_group"_a, "repeats"_a);
    m.def("compute_peak_kinds", &kt::compute_peak_kinds);
    m.def(
        "compute_peak_macs",
        [](const std::string& kind, double seconds) {
            ReleaseGil release;
            return kt::compute_peak_macs(kind, seconds);
        },
        "kind"_a, "seconds"_a);
    m.def("quantize_int8_codes", &quantize_int8_codes, "source"_a, "codes"_a, "scales"_a);
    m.def("quantize_int4_codes", &quantize_int4_codes, "source"_a, "group"_a, "zero_point"_a, "packed"_a, "scales"_a,
          "zeros"_a = nb::none());

    m.def("numa_usage", &numa_usage);
    m.def("numa_binding_available", &kt::numa_binding_available);
    m.def("clear_forward_scratch", &kt::clear_forward_scratch);
    m.def("forward_scratch_bytes", &kt::forward_scratch_bytes);

    nb::class_<Backend>(m, "Backend")
        .def_prop_ro("name", [](const Backend& b) { return std::string(b.api->name); })
        .def_prop_ro("variant", [](const Backend& b) { return std::string(b.api->variant); })
        .def_prop_ro("abi_version", [](const Backend& b) { return std::make_tuple(int(b.api->abi_major), int(b.api->abi_minor)); })
        .def_prop_ro("required_features", [](const Backend& b) { return std::string(b.api->required_features ? b.api->required_features : ""); })
        .def_prop_ro("methods", [](const Backend& b) {
            nb::list out;
            for (size_t i = 0; i < b.api->num_methods; ++i) {
                const auto& k = kt::method_table(b.api, i);
                out.append(kv("method", std::string(k.method), "layout_id", std::string(k.layout_id),
                                    "kernel_id", std::string(k.kernel_id),
                                    "whole_op", bool(KT_HAS_FIELD(&k, kt_method_kernels, moe_forward) && k.moe_forward),
                                    "packs", bool(k.pack_expert),
                                    "raw_gate_up", bool(KT_HAS_FIELD(&k, kt_method_kernels, gate_up_raw_tile) &&
                                                        k.gate_up_raw_tile),
                                    "transposed", bool(KT_HAS_FIELD(&k, kt_method_kernels, down_transposed_tile) &&
                                                       k.gate_up_transposed_tile && k.down_transposed_tile)));
            }
            return out;
        })
        .def("declines", [](const Backend& b, const std::string& method, int64_t hidden, int64_t intermediate,
                            int64_t experts, int64_t top_k, int64_t tokens) {
            const kt_method_kernels* k = b.method(method);
            kt_moe_config shape{sizeof(kt_moe_config), hidden, intermediate, experts, top_k, 0, 0};
            return bool(k->declines && k->declines(&shape, tokens));
        });
    m.def("load_backend", &load_backend, "capsule"_a, "name"_a, "variant"_a,
          "validate a backend table (ABI version, features, completeness) and initialise it");

    nb::class_<Layer>(m, "MoeLayer")
        .def(nb::init<const Backend&, const std::string&, int64_t, int64_t, int64_t, int64_t, std::vector<bool>, int64_t,
                      int64_t, bool, bool, std::vector<int>, float, float,
                      std::optional<Backend>, bool, bool, const std::string&>(),
             "backend"_a, "method"_a, "hidden"_a, "intermediate"_a, "num_experts"_a, "top_k"_a, "expert_on_cpu"_a,
             "max_tokens"_a, "group_size"_a = 0, "zero_point"_a = false, "fast_activations"_a = false,
             "weight_dtype"_a = std::vector<int>{}, "swiglu_limit"_a = 0.0f, "swiglu_alpha"_a = 0.0f,
             "packer"_a = nb::none(), "expert_bias"_a = false, "swiglu_limit_after_act"_a = false,
             "gate_activation"_a = "silu")
        .def("set_expert_bias", &Layer::set_expert_bias, "expert"_a, "gate"_a, "up"_a, "down"_a)
        .def("grouped_gate_up", &Layer::grouped_gate_up, "x"_a, "counts"_a, "gate_up"_a, "token"_a = nb::none(),
             "lora_a"_a = nb::none(), "lora_bt"_a = nb::none(), "lora_scaling"_a = 1.0f, "lora_blocks"_a = 1,
             "lora_xa"_a = nb::none())
        .def("grouped_down", &Layer::grouped_down, "h"_a, "counts"_a, "y"_a, "lora_a"_a = nb::none(), "lora_bt"_a = nb::none(),
             "lora_scaling"_a = 1.0f, "lora_xa"_a = nb::none())
        .def("grouped_gate_up_transposed", &Layer::grouped_gate_up_transposed, "dgate_up"_a, "counts"_a, "dx"_a,
             "lora_g"_a = nb::none(), "lora_a"_a = nb::none())
        .def("grouped_down_transposed", &Layer::grouped_down_transposed, "dy"_a, "counts"_a, "dh"_a, "lora_g"_a = nb::none(),
             "lora_a"_a = nb::none())
        .def_prop_ro("training_support", [](const Layer& l) { return l.layer->training_support(); })
        .def_prop_ro("expert_bias", [](const Layer& l) { return l.layer->expert_bias(); })
        .def("load_expert", &Layer::load_expert, "expert"_a, "gate"_a, "up"_a, "down"_a, "gate_scale"_a = nb::none(),
             "up_scale"_a = nb::none(), "down_scale"_a = nb::none(), "gate_zero"_a = nb::none(), "up_zero"_a = nb::none(),
             "down_zero"_a = nb::none())
        .def("load_experts", &Layer::load_experts, "experts"_a, "parts"_a)
        .def("load_packed", &Layer::from_file<&kt::MoeLayer::load_packed>, "experts"_a, "offsets"_a, "fd"_a)
        .def("map_packed", &Layer::from_file<&kt::MoeLayer::map_packed>, "experts"_a, "offsets"_a, "fd"_a)
        .def("copy_packed", &Layer::copy_packed, "expert"_a)
        .def("expert_loaded", [](const Layer& l, int64_t e) { return l.layer->expert_loaded(e); })
        .def("expert_group", [](const Layer& l, int64_t e) { return l.layer->expert_group(e); })
        // The `layer` argument of kt/forward.h (kt_core.MoE.native_handle): valid while this
        // object lives.
        .def_prop_ro("handle", [](const Layer& l) { return reinterpret_cast<uintptr_t>(l.layer.get()); })
        .def("set_routed", [](Layer& l, std::vector<bool> routed) { l.layer->set_routed(std::move(routed)); },
             "routed"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("routed", [](const Layer& l) { return l.layer->routed(); })
        .def("set_groups", [](Layer& l, std::vector<int> groups) { l.layer->set_groups(groups); }, "groups"_a)
        .def("forward", &Layer::forward, "hidden"_a, "topk_ids"_a, "topk_weights"_a, "out"_a)
        .def("submit_forward", &Layer::submit_forward, "hidden"_a, "topk_ids"_a, "topk_weights"_a, "out"_a, "keep_alive"_a)
        .def("forward_at", &Layer::forward_at, "hidden"_a, "hidden_dtype"_a, "tokens"_a, "topk_ids"_a, "topk_weights"_a,
             "out"_a, "out_dtype"_a)
        .def("submit_forward_at", &Layer::submit_forward_at, "hidden"_a, "hidden_dtype"_a, "tokens"_a, "topk_ids"_a,
             "topk_weights"_a, "out"_a, "out_dtype"_a, "keep_alive"_a)
        .def_prop_ro("packed_bytes", [](const Layer& l) { return l.layer->packed_bytes(); })
        .def_prop_ro("expert_bytes", [](const Layer& l) { return l.layer->packer().packed_expert_bytes(&l.layer->shape()); })
        .def_prop_ro("packer_kernel_id", [](const Layer& l) { return std::string(l.layer->packer().kernel_id); })
        .def_prop_ro("layout_id", [](const Layer& l) { return std::string(l.layer->kernels().layout_id); })
        .def("set_small_batch_backend", &Layer::set_small_batch_backend, "backend"_a, "method"_a)
        .def("kernel_id_for", [](const Layer& l, int64_t tokens) { return std::string(l.layer->kernels_for(tokens).kernel_id); },
             "tokens"_a)
        .def_prop_ro("kernel_id", [](const Layer& l) { return std::string(l.layer->kernels().kernel_id); });
}
