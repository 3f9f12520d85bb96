/* A minimal FP32 backend in plain C, compiled by the ABI tests against a chosen kt/plugin.h:
 * tests/abi/kt-1.0/kt/plugin.h (a plugin built for ABI 1.0, before kt_moe_config.weight_dtype)
 * or the current header. -DKT_TEST_CLAIM_MAJOR / -DKT_TEST_CLAIM_MINOR make the table claim
 * another version than the header's. kt_test_fail(entry, status) makes an entry fail
 * (entry 1: pack_expert, 2: gate_up_tile, 3: down_tile) with a message through set_error. */
#include <kt/plugin.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#ifndef KT_TEST_CLAIM_MAJOR
#define KT_TEST_CLAIM_MAJOR KT_PLUGIN_ABI_MAJOR
#endif
#ifndef KT_TEST_CLAIM_MINOR
#define KT_TEST_CLAIM_MINOR KT_PLUGIN_ABI_MINOR
#endif
#ifndef KT_TEST_NAME
#define KT_TEST_NAME "abi"
#endif

static const kt_host_api* g_host;
static volatile int g_fail_entry, g_fail_status;
static volatile unsigned g_seen_config_size;

void kt_test_fail(int entry, int status) { g_fail_entry = entry; g_fail_status = status; }
unsigned kt_test_seen_config_size(void) { return g_seen_config_size; }
unsigned kt_test_own_config_size(void) { return (unsigned)sizeof(kt_moe_config); }

static kt_status failing(int entry, const char* name) {
    if (g_fail_entry != entry || g_fail_status == KT_OK) return KT_OK;
    char message[128];
    snprintf(message, sizeof message, "C plugin: %s failed on purpose", name);
    g_host->set_error(message);
    return (kt_status)g_fail_status;
}

static kt_status init(const kt_host_api* host) {
    if (host->abi_major != KT_PLUGIN_ABI_MAJOR) return KT_ERROR_UNSUPPORTED;
    g_host = host;
    return KT_OK;
}

static size_t packed_expert_bytes(const kt_moe_config* c) {
    g_seen_config_size = c->struct_size;
    return (size_t)(3 * c->hidden * c->intermediate) * sizeof(float);
}

static kt_status copy_matrix(const kt_matrix* m, float* dst) {
    if (m->dtype != KT_DTYPE_F32) {
        g_host->set_error("C plugin packs f32 weights only");
        return KT_ERROR_UNSUPPORTED;
    }
    for (int64_t r = 0; r < m->rows; ++r)
        memcpy(dst + r * m->cols, (const float*)m->data + r * m->row_stride, (size_t)m->cols * sizeof(float));
    return KT_OK;
}

static kt_status pack_expert(const kt_moe_config* c, const kt_expert_weights* w, void* dst) {
    kt_status s = failing(1, "pack_expert");
    float* out = (float*)dst;
    const int64_t n = c->hidden * c->intermediate;
    if (s == KT_OK) s = copy_matrix(&w->gate.values, out);
    if (s == KT_OK) s = copy_matrix(&w->up.values, out + n);
    if (s == KT_OK) s = copy_matrix(&w->down.values, out + 2 * n);
    return s;
}

static size_t activation_row_bytes(int64_t k) { return (size_t)k * sizeof(float); }

static kt_status quantize_activations(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride,
                                      void* out) {
    if (dtype != KT_DTYPE_F32) {
        g_host->set_error("C plugin takes f32 activations only");
        return KT_ERROR_UNSUPPORTED;
    }
    for (int64_t r = 0; r < rows; ++r)
        memcpy((float*)out + r * k, (const float*)in + r * stride, (size_t)k * sizeof(float));
    return KT_OK;
}

static float dot(const float* a, const float* b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += (double)a[i] * b[i];
    return (float)s;
}

static kt_status gate_up_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                              int64_t n1, float* out, int64_t stride) {
    const kt_status s = failing(2, "gate_up_tile");
    if (s != KT_OK) return s;
    const int64_t H = c->hidden, I = c->intermediate;
    const float *gate = (const float*)packed, *up = gate + H * I, *x = (const float*)act;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) {
            const float g = dot(x + r * H, gate + n * H, H), u = dot(x + r * H, up + n * H, H);
            out[r * stride + n] = g / (1.0f + expf(-g)) * u;
        }
    return KT_OK;
}

static kt_status down_tile(const kt_moe_config* c, const void* packed, const void* act, int64_t rows, int64_t n0,
                           int64_t n1, float* out, int64_t stride) {
    const kt_status s = failing(3, "down_tile");
    if (s != KT_OK) return s;
    const int64_t H = c->hidden, I = c->intermediate;
    const float *down = (const float*)packed + 2 * H * I, *a = (const float*)act;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = n0; n < n1; ++n) out[r * stride + n] = dot(a + r * I, down + n * I, I);
    return KT_OK;
}

static const kt_method_kernels kMethods[] = {{
    sizeof(kt_method_kernels), "FP32", "abi-test-f32-v1", "moe.f32.abi-test",
    8, 8, NULL, packed_expert_bytes, pack_expert, activation_row_bytes, quantize_activations,
    gate_up_tile, down_tile, NULL,
}};

#ifndef KT_TEST_METHOD_PAD
static const kt_backend_api kApi = {
    sizeof(kt_backend_api), KT_TEST_CLAIM_MAJOR, KT_TEST_CLAIM_MINOR, KT_TEST_NAME, "v1", "",
    init, 1, kMethods,
};

const kt_backend_api* kt_test_backend(void) { return &kApi; }
#else
/* -DKT_TEST_METHOD_PAD=N: two method tables ("FP32", then the same kernels as "BF16") laid out
 * as a plugin built against a later minor lays them out, each element N bytes longer than this
 * header's kt_method_kernels (fields appended) and its struct_size saying so. A host that walked
 * the array with its own sizeof would read the second table from the middle of the first. */
typedef struct padded_method {
    kt_method_kernels k;
    char appended[KT_TEST_METHOD_PAD];
} padded_method;
static padded_method kPadded[2];
static kt_backend_api kApi;

const kt_backend_api* kt_test_backend(void) {
    for (int i = 0; i < 2; ++i) {
        kPadded[i].k = kMethods[0];
        kPadded[i].k.struct_size = sizeof(padded_method);
        memset(kPadded[i].appended, 0x5a, sizeof kPadded[i].appended);
    }
    kPadded[1].k.method = "BF16";
    kApi = (kt_backend_api){sizeof(kt_backend_api), KT_TEST_CLAIM_MAJOR, KT_TEST_CLAIM_MINOR, KT_TEST_NAME, "v1", "",
                            init, 2, &kPadded[0].k};
    return &kApi;
}
#endif
