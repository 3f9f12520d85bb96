// ThreadSanitizer stress of kt-core's concurrency: the thread pool's loops from many threads
// at once, racing submit()/sync(), and MoE forwards of several layers, and of one layer,
// from many threads while another reloads that layer's experts, another reloads a layer from
// packed bytes (read or mapped) and another drives the async path. CPython is not
// TSan-instrumented, so this drives kt-core's native sources directly
// (built by `nox -s tsan`; see docs/reliability.md). Every result is checked: a wrong sum, a
// lost job or a forward that differs from its single-threaded value exits non-zero, and so
// does any TSan report (halt_on_error=1).
//
//     tsan_stress [rounds [phases]]   rounds default 1 (the long run uses 20); phases a subset
//                                     of "loops,async,moe" (default all)
#include "moe/moe_layer.h"
#include "pool/thread_pool.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

int g_failures = 0;
std::mutex g_report;

void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(g_report);
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++g_failures;
}

// --- a tiny FP32 backend: packed expert = gate | up | down as f32, row-major ------------
size_t packed_bytes(const kt_moe_config* s) { return size_t(3 * s->hidden * s->intermediate) * 4; }

kt_status pack(const kt_moe_config* s, const kt_expert_weights* w, void* dst) {
    float* o = static_cast<float*>(dst);
    for (const kt_weight* part : {&w->gate, &w->up, &w->down}) {
        const kt_matrix& m = part->values;
        for (int64_t r = 0; r < m.rows; ++r)
            std::memcpy(o + r * m.cols, static_cast<const float*>(m.data) + r * m.row_stride, size_t(m.cols) * 4);
        o += m.rows * m.cols;
    }
    return KT_OK;
}

size_t row_bytes(int64_t k) { return size_t(k) * 4; }

kt_status quantize(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (dtype != KT_DTYPE_F32) return KT_ERROR_UNSUPPORTED;
    for (int64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<float*>(out) + r * k, static_cast<const float*>(in) + r * stride, size_t(k) * 4);
    return KT_OK;
}

kt_status gate_up(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
                  float* out, int64_t ld) {
    const int64_t H = s->hidden, I = s->intermediate;
    const float* gate = static_cast<const float*>(packed);
    const float* up = gate + I * H;
    const float* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) {
            float g = 0, u = 0;
            for (int64_t k = 0; k < H; ++k) {
                g += x[r * H + k] * gate[n * H + k];
                u += x[r * H + k] * up[n * H + k];
            }
            out[r * ld + n] = g / (1.0f + std::exp(-g)) * u;
        }
    return KT_OK;
}

kt_status down(const kt_moe_config* s, const void* packed, const void* act, int64_t rows, int64_t n0, int64_t n1,
               float* out, int64_t ld) {
    const int64_t H = s->hidden, I = s->intermediate;
    const float* w = static_cast<const float*>(packed) + 2 * I * H;
    const float* x = static_cast<const float*>(act);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) {
            float acc = 0;
            for (int64_t k = 0; k < I; ++k) acc += x[r * I + k] * w[n * I + k];
            out[r * ld + n] = acc;
        }
    return KT_OK;
}

kt_method_kernels fp32_kernels() {
    kt_method_kernels k{};
    k.struct_size = sizeof(k);
    k.method = "FP32";
    k.layout_id = "tsan-f32-v1";
    k.kernel_id = "moe.f32.tsan";
    k.gate_up_block = 8;
    k.down_block = 8;
    k.packed_expert_bytes = packed_bytes;
    k.pack_expert = pack;
    k.activation_row_bytes = row_bytes;
    k.quantize_activations = quantize;
    k.gate_up_tile = gate_up;
    k.down_tile = down;
    return k;
}
const kt_method_kernels kKernels = fp32_kernels();

// --- 1. loops from many threads at once, nested loops, exceptions ----------------------
void stress_loops(int iterations) {
    kt::ThreadPool& pool = kt::global_pool();
    auto worker = [&](int id) {
        std::vector<std::atomic<int>> hits(257);
        for (int it = 0; it < iterations; ++it) {
            const size_t range = 1 + size_t((it * 37 + id * 11) % 257);
            for (auto& h : hits) h.store(0, std::memory_order_relaxed);
            struct Ctx { std::vector<std::atomic<int>>* hits; kt::ThreadPool* pool; } ctx{&hits, &pool};
            pool.parallel_for(range, [](void* c, size_t i) {
                auto* x = static_cast<Ctx*>(c);
                (*x->hits)[i].fetch_add(1, std::memory_order_relaxed);
                if (i % 64 == 0) {   // a loop inside a body runs inline
                    std::atomic<int> inner{0};
                    x->pool->parallel_for(8, [](void* p, size_t) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }, &inner);
                    if (inner.load() != 8) fail("nested loop lost indices");
                }
            }, &ctx);
            for (size_t i = 0; i < range; ++i)
                if (hits[i].load() != 1) fail("parallel_for index " + std::to_string(i) + " ran " + std::to_string(hits[i].load()) + " times");

            std::vector<int> cells(size_t(13 * 17), 0);   // each cell written by exactly one tile
            pool.parallel_for_2d(13, 17, 3, 5, [](void* c, size_t i, size_t j, size_t ti, size_t tj) {
                auto* v = static_cast<std::vector<int>*>(c);
                for (size_t a = i; a < i + ti; ++a)
                    for (size_t b = j; b < j + tj; ++b) (*v)[a * 17 + b] += 1;
            }, &cells);
            for (int v : cells)
                if (v != 1) fail("parallel_for_2d cell ran " + std::to_string(v) + " times");

            std::vector<size_t> ranges(size_t(pool.num_groups()));
            for (size_t g = 0; g < ranges.size(); ++g) ranges[g] = 5 + g * 3 + size_t(it % 4);
            std::vector<std::vector<int>> per(ranges.size());
            for (size_t g = 0; g < ranges.size(); ++g) per[g].assign(ranges[g], 0);
            pool.parallel_for_groups(ranges.data(), [](void* c, int g, size_t i) {
                (*static_cast<std::vector<std::vector<int>>*>(c))[size_t(g)][i] += 1;
            }, &per);
            for (const auto& v : per)
                for (int x : v)
                    if (x != 1) fail("parallel_for_groups index ran " + std::to_string(x) + " times");

            if (it % 7 == 0) {   // an exception in a body reaches this caller, and only it
                try {
                    pool.parallel_for(50, [](void*, size_t i) {
                        if (i == 31) throw std::runtime_error("body 31");
                    }, nullptr);
                    fail("exception in a loop body was lost");
                } catch (const std::runtime_error& e) {
                    if (std::string(e.what()) != "body 31") fail(std::string("wrong exception: ") + e.what());
                }
            }
            if (it % 5 == 0) pool.wake();
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
    for (auto& t : threads) t.join();
}

// --- 2. racing submit() and sync() ------------------------------------------------------
void stress_async(int iterations) {
    kt::ThreadPool& pool = kt::global_pool();
    std::atomic<int> submitted{0}, ran{0};
    auto worker = [&](int id) {
        for (int it = 0; it < iterations; ++it) {
            auto done = std::make_shared<std::atomic<bool>>(false);
            bool mine = false;
            try {
                pool.submit([&pool, &ran, done] {
                    std::atomic<size_t> sum{0};
                    pool.parallel_for(100, [](void* c, size_t i) { static_cast<std::atomic<size_t>*>(c)->fetch_add(i); }, &sum);
                    if (sum.load() != 4950) fail("job loop sum " + std::to_string(sum.load()));
                    ran.fetch_add(1);
                    done->store(true);
                });
                mine = true;
                submitted.fetch_add(1);
            } catch (const std::logic_error&) {
                // another thread's job holds the slot: the documented refusal
            }
            if (mine || (it + id) % 3 == 0) pool.sync();   // some threads sync jobs they did not submit
            if (mine && !done->load()) fail("sync() returned before the submitted job finished");
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
    for (auto& t : threads) t.join();
    pool.sync();
    if (ran.load() != submitted.load())
        fail("jobs accepted " + std::to_string(submitted.load()) + ", ran " + std::to_string(ran.load()));
    if (submitted.load() == 0) fail("no submit succeeded");
}

// --- 3. MoE forwards: different layers, the same layer, async, reloads ------------------
struct Model {
    int64_t E = 6, H, I, K = 2, T;
    std::vector<float> gate, up, downw;
    std::unique_ptr<kt::MoeLayer> layer;
    std::vector<float> x, weights;
    std::vector<int64_t> ids;
    std::vector<float> want;

    kt_expert_weights expert(int64_t e) const {
        return kt_expert_weights{sizeof(kt_expert_weights),
                                 {{gate.data() + e * I * H, KT_DTYPE_F32, I, H, H}, {}, {}},
                                 {{up.data() + e * I * H, KT_DTYPE_F32, I, H, H}, {}, {}},
                                 {{downw.data() + e * H * I, KT_DTYPE_F32, H, I, I}, {}, {}}};
    }
    Model(unsigned seed, int64_t hidden, int64_t intermediate, int64_t tokens) : H(hidden), I(intermediate), T(tokens) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> n(0.0f, 0.3f);
        for (auto* v : {&gate, &up, &downw}) {
            v->resize(size_t(E * H * I));
            for (float& f : *v) f = n(rng);
        }
        x.resize(size_t(T * H));
        for (float& f : x) f = n(rng);
        ids.resize(size_t(T * K));
        weights.resize(size_t(T * K));
        for (size_t i = 0; i < ids.size(); ++i) {
            ids[i] = int64_t(rng() % uint32_t(E + 1)) - 1;   // -1 included
            weights[i] = 0.5f + float(rng() % 100) / 100.0f;
        }
        kt_moe_config shape{sizeof(kt_moe_config), H, I, E, K, 0, 0, {KT_DTYPE_F32, KT_DTYPE_F32, KT_DTYPE_F32}};
        layer = std::make_unique<kt::MoeLayer>(shape, &kKernels, std::vector<bool>(size_t(E), true), 64);
        std::vector<int64_t> all(static_cast<size_t>(E));
        std::vector<kt_expert_weights> w;
        for (int64_t e = 0; e < E; ++e) {
            all[size_t(e)] = e;
            w.push_back(expert(e));
        }
        layer->load_experts(all.data(), w.data(), w.size());
        want = run();
    }
    std::vector<float> run() const {
        std::vector<float> out(size_t(T * H), -1.0f);
        layer->forward(x.data(), KT_DTYPE_F32, T, ids.data(), weights.data(), out.data(), KT_DTYPE_F32);
        return out;
    }
    void check(const std::vector<float>& got, const char* how) const {
        if (std::memcmp(got.data(), want.data(), want.size() * 4) != 0) fail(std::string(how) + ": output differs");
    }
};

void stress_moe(int iterations) {
    // One large enough for the pooled path (>= 2^20 multiply-adds), two small (serial path).
    std::vector<std::unique_ptr<Model>> models;
    models.push_back(std::make_unique<Model>(1, 64, 64, 64));
    models.push_back(std::make_unique<Model>(2, 24, 20, 3));
    models.push_back(std::make_unique<Model>(3, 24, 20, 1));
    kt::ThreadPool& pool = kt::global_pool();
    std::vector<std::thread> threads;
    // Forwards of every layer from three threads (so the same layer from several at once).
    for (int t = 0; t < 3; ++t)
        threads.emplace_back([&, t] {
            for (int it = 0; it < iterations; ++it) {
                const Model& m = *models[size_t((it + t) % 3)];
                m.check(m.run(), "concurrent forward");
            }
        });
    // The async path on layer 0, racing the forwards above.
    threads.emplace_back([&] {
        for (int it = 0; it < iterations; ++it) {
            const Model& m = *models[0];
            std::vector<float> out(m.want.size(), -1.0f);
            try {
                pool.submit([&] { m.layer->forward(m.x.data(), KT_DTYPE_F32, m.T, m.ids.data(), m.weights.data(), out.data(), KT_DTYPE_F32); });
            } catch (const std::logic_error&) {
                fail("submit refused with no other submitter");
                continue;
            }
            pool.sync();
            m.check(out, "submitted forward");
        }
    });
    // Reloads of layer 1's experts (same values) while it is being forwarded.
    threads.emplace_back([&] {
        const Model& m = *models[1];
        for (int it = 0; it < iterations; ++it) {
            const int64_t e = it % m.E;
            const kt_expert_weights w = m.expert(e);
            if (it % 2)
                m.layer->load_expert(e, w);
            else
                m.layer->load_experts(&e, &w, 1);
            if (!m.layer->expert_loaded(e) || m.layer->packed_bytes() != size_t(m.E) * packed_bytes(&m.layer->shape()))
                fail("reload lost an expert");
        }
    });
    // Reloads of layer 2's experts from a file of their packed bytes (what `kt convert
    // --packed` writes), read (load_packed) or mapped (map_packed), while it is being forwarded:
    // the mapped experts' shared mapping must outlive every forward still reading it.
    threads.emplace_back([&] {
        const Model& m = *models[2];
        const size_t bytes = packed_bytes(&m.layer->shape()), stride = (bytes + 4095) / 4096 * 4096;
        char path[] = "/tmp/kt-tsan-packed-XXXXXX";
        const int fd = ::mkstemp(path);
        if (fd < 0) return fail("mkstemp failed");
        ::unlink(path);
        for (int64_t e = 0; e < m.E; ++e) {
            const std::vector<char> b = m.layer->copy_packed(e);
            if (::pwrite(fd, b.data(), b.size(), off_t(size_t(e) * stride)) != ssize_t(b.size())) fail("pwrite failed");
        }
        if (::ftruncate(fd, off_t(size_t(m.E) * stride)) != 0) fail("ftruncate failed");
        std::vector<int64_t> all(size_t(m.E));
        std::vector<uint64_t> offsets(size_t(m.E));
        for (int64_t e = 0; e < m.E; ++e) {
            all[size_t(e)] = e;
            offsets[size_t(e)] = uint64_t(e) * stride;
        }
        for (int it = 0; it < iterations; ++it) {
            if (it % 2)
                m.layer->map_packed(all.data(), offsets.data(), all.size(), fd);
            else
                m.layer->load_packed(all.data(), offsets.data(), all.size(), fd);
            if (m.layer->packed_bytes() != size_t(m.E) * bytes) fail("packed reload lost an expert");
        }
        ::close(fd);
    });
    for (auto& t : threads) t.join();
}

}  // namespace

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 1;
    const std::string phases = argc > 2 ? argv[2] : "loops,async,moe";
    auto wanted = [&](const char* phase) { return phases.find(phase) != std::string::npos; };
    for (int r = 0; r < rounds; ++r) {
        // Oversubscribed (4 threads whatever the core count) and split into two groups, so
        // stealing between groups and preemption inside loops both happen.
        kt::configure_global_pool(kt::PoolConfig{4, 2, false, r % 2 ? 0 : 50});
        if (wanted("loops")) stress_loops(40);
        if (wanted("async")) stress_async(40);
        if (wanted("moe")) stress_moe(12);
        kt::clear_forward_scratch();
        std::printf("round %d/%d: %s\n", r + 1, rounds, g_failures ? "FAILED" : "ok");
        std::fflush(stdout);
    }
    return g_failures ? 1 : 0;
}
