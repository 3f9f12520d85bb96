// llama.cpp's MoE layer on given ggml blocks, timed: the peer side of benchmarks/gguf_layer.py
// --llama-cpp. Built by benchmarks/setup_llama_cpp.sh against the ggml of the llama.cpp it builds
// (never committed); reads what gguf_layer.py writes, so both sides compute on the same bytes.
//
//   llama_cpp_moe DATA H I E K THREADS WARMUP TYPE_GATE TYPE_UP TYPE_DOWN T [T ...]
//
// DATA/{gate,up,down}.bin: the blocks, [E, N, row bytes] as the GGUF file stores them.
// DATA/calls_T.bin: R calls of T tokens: hidden f32 [R, T, H], ids i32 [R, T, K], weights f32 [R, T, K].
// Writes DATA/llama_cpp_out_T.bin (f32 [T, H], the first call's output) and prints one JSON line.
//
// The graph is llama.cpp's build_moe_ffn for a SiLU-gated model without a shared expert (llm_graph.cpp):
// gate = mul_mat_id(gate_exps, x, ids), up likewise, swiglu_split, down = mul_mat_id(down_exps, h,
// ids), times the routing weights, summed over the k experts. The expert tensors live where
// llama.cpp's loader puts them on a CPU: the first extra buffer type that serves MUL_MAT_ID for that
// type (its AMX buffer where built, which serves only MUL_MAT; the repack buffer "CPU_REPACK":
// interleaved Q4_0, Q4_K, IQ4_NL, Q8_0 ... layouts), else plain CPU memory.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "llama_cpp_moe: %s\n", msg.c_str());
    std::exit(1);
}

std::vector<char> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) die("cannot open " + path);
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

ggml_type type_named(const std::string& name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char* n = ggml_type_name(ggml_type(t));
        if (n && strcasecmp(n, name.c_str()) == 0) return ggml_type(t);
    }
    die("unknown ggml type " + name);
}

// llama-model-loader's weight_buft_supported for MUL_MAT_ID: does `buft` serve this expert tensor?
bool serves_mul_mat_id(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, ggml_type type, int64_t k, int64_t n,
                       int64_t e, int top_k) {
    ggml_init_params params = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* w = ggml_new_tensor_3d(ctx, type, k, n, e);
    ggml_tensor* b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, top_k, 512);
    ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, top_k, 512);
    ggml_tensor* op = ggml_mul_mat_id(ctx, w, b, ids);
    w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
    const bool ok = ggml_backend_dev_supports_op(dev, op);
    ggml_backend_buffer_free(w->buffer);
    w->buffer = nullptr;
    ggml_free(ctx);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 12) die("usage: llama_cpp_moe DATA H I E K THREADS WARMUP TYPE_GATE TYPE_UP TYPE_DOWN T [T ...]");
    const std::string data = argv[1];
    const int64_t H = std::atoll(argv[2]), I = std::atoll(argv[3]), E = std::atoll(argv[4]);
    const int K = std::atoi(argv[5]), threads = std::atoi(argv[6]), warmup = std::atoi(argv[7]);
    const ggml_type types[3] = {type_named(argv[8]), type_named(argv[9]), type_named(argv[10])};
    std::vector<int64_t> token_counts;
    for (int i = 11; i < argc; ++i) token_counts.push_back(std::atoll(argv[i]));

    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) die("no CPU backend device");
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    auto set_threads = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                                                                                         "ggml_backend_set_n_threads");
    if (set_threads) set_threads(backend, threads);
    // The loader's order: the first extra buffer type (AMX where the build has it, then CPU_REPACK) that
    // serves MUL_MAT_ID for the tensor, else the plain CPU buffer.
    std::vector<ggml_backend_buffer_type_t> extra;
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                                                                                           "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t* b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) extra.push_back(*b);

    // The expert tensors, one context (and buffer) each so each can sit in its own buffer type.
    const char* names[3] = {"gate", "up", "down"};
    const int64_t ks[3] = {H, H, I}, ns[3] = {I, I, H};
    ggml_tensor* experts[3];
    std::string placement;
    std::vector<ggml_backend_buffer_t> weight_buffers;
    std::vector<ggml_context*> weight_contexts;
    for (int p = 0; p < 3; ++p) {
        ggml_init_params params = {ggml_tensor_overhead() * 2, nullptr, true};
        ggml_context* ctx = ggml_init(params);
        weight_contexts.push_back(ctx);
        experts[p] = ggml_new_tensor_3d(ctx, types[p], ks[p], ns[p], E);
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        for (ggml_backend_buffer_type_t b : extra)
            if (serves_mul_mat_id(dev, b, types[p], ks[p], ns[p], E, K)) { buft = b; break; }
        weight_buffers.push_back(ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft));
        const std::vector<char> bytes = read_file(data + "/" + names[p] + ".bin");
        if (bytes.size() != ggml_nbytes(experts[p]))
            die(std::string(names[p]) + ".bin holds " + std::to_string(bytes.size()) + " bytes; " + ggml_type_name(types[p]) +
                " [E, N, K] needs " + std::to_string(ggml_nbytes(experts[p])));
        ggml_backend_tensor_set(experts[p], bytes.data(), 0, bytes.size());   // the repack buffer repacks here
        placement += std::string(placement.empty() ? "" : ", ") + names[p] + ": " + ggml_backend_buft_name(buft);
    }

    std::printf("{\"placement\": \"%s\", \"threads\": %d, \"rows\": [", placement.c_str(), threads);
    for (size_t ti = 0; ti < token_counts.size(); ++ti) {
        const int64_t T = token_counts[ti];
        const std::vector<char> calls = read_file(data + "/calls_" + std::to_string(T) + ".bin");
        const size_t call_bytes = size_t(T) * (size_t(H) * 4 + size_t(K) * 8);
        if (calls.empty() || calls.size() % call_bytes) die("calls_" + std::to_string(T) + ".bin is not whole calls");
        const int64_t R = int64_t(calls.size() / call_bytes);
        const char* hidden = calls.data();
        const char* ids_all = hidden + size_t(R) * T * H * 4;
        const char* weights_all = ids_all + size_t(R) * T * K * 4;

        ggml_init_params params = {ggml_tensor_overhead() * 64 + ggml_graph_overhead(), nullptr, true};
        ggml_context* ctx = ggml_init(params);
        ggml_tensor* x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H, 1, T);
        ggml_tensor* ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, K, T);
        ggml_tensor* w = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, K, T);
        ggml_set_input(x);
        ggml_set_input(ids);
        ggml_set_input(w);
        ggml_tensor* gate = ggml_mul_mat_id(ctx, experts[0], x, ids);   // [I, K, T]
        ggml_tensor* up = ggml_mul_mat_id(ctx, experts[1], x, ids);
        ggml_tensor* h = ggml_swiglu_split(ctx, gate, up);
        ggml_tensor* down = ggml_mul_mat_id(ctx, experts[2], h, ids);   // [H, K, T]
        down = ggml_mul(ctx, down, w);
        ggml_tensor* out = ggml_view_2d(ctx, down, H, T, down->nb[2], 0);
        for (int j = 1; j < K; ++j) out = ggml_add(ctx, out, ggml_view_2d(ctx, down, H, T, down->nb[2], size_t(j) * down->nb[1]));
        ggml_set_output(out);
        ggml_cgraph* graph = ggml_new_graph(ctx);
        ggml_build_forward_expand(graph, out);
        ggml_gallocr_t alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));
        if (!ggml_gallocr_alloc_graph(alloc, graph)) die("cannot allocate the graph");

        std::vector<double> times;
        std::vector<float> first(size_t(T) * H);
        for (int64_t r = 0; r < R; ++r) {
            ggml_backend_tensor_set(x, hidden + size_t(r) * T * H * 4, 0, size_t(T) * H * 4);
            ggml_backend_tensor_set(ids, ids_all + size_t(r) * T * K * 4, 0, size_t(T) * K * 4);
            ggml_backend_tensor_set(w, weights_all + size_t(r) * T * K * 4, 0, size_t(T) * K * 4);
            const auto t0 = std::chrono::steady_clock::now();
            if (ggml_backend_graph_compute(backend, graph) != GGML_STATUS_SUCCESS) die("graph compute failed");
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (r == 0) ggml_backend_tensor_get(out, first.data(), 0, first.size() * 4);
            if (r >= warmup) times.push_back(ms);
        }
        std::ofstream(data + "/llama_cpp_out_" + std::to_string(T) + ".bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(first.data()), std::streamsize(first.size() * 4));
        std::sort(times.begin(), times.end());
        if (times.empty()) die("no timed calls: calls_" + std::to_string(T) + ".bin holds only the warm-up");
        const double median = times.size() % 2 ? times[times.size() / 2] : (times[times.size() / 2 - 1] + times[times.size() / 2]) / 2;
        std::printf("%s{\"tokens\": %lld, \"median_ms\": %.6f, \"min_ms\": %.6f, \"max_ms\": %.6f, \"calls\": %zu}",
                    ti ? ", " : "", (long long)T, median, times.front(), times.back(), times.size());
        ggml_gallocr_free(alloc);
        ggml_free(ctx);
    }
    std::printf("]}\n");
    for (ggml_backend_buffer_t b : weight_buffers) ggml_backend_buffer_free(b);
    for (ggml_context* c : weight_contexts) ggml_free(c);
    ggml_backend_free(backend);
    return 0;
}
