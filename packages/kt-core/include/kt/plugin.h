/*
 * kt plugin C ABI — the only thing kt-core and a backend share.
 *
 * A backend is a Python extension module that hands kt-core a `kt_backend_api` table in a
 * PyCapsule named KT_BACKEND_CAPSULE_NAME; kt-core answers with a `kt_host_api` table (thread
 * pool, allocator, CPU features, logging). Only C types cross: no C++ exception, no nanobind
 * class, no pointer into Python objects that outlives the call that passed it.
 *
 * Versioning: every table starts with `struct_size` and the ABI version it was built with.
 *  - A different MAJOR is refused, with both versions in the message.
 *  - A newer core serves an older plugin of the same major: the core never reads a field
 *    past the plugin's `struct_size` (use KT_HAS_FIELD) and treats missing ones as absent.
 *  - New fields are only ever appended, and bump MINOR.
 *  - An array of tables (kt_backend_api.methods) is walked with the stride of its first
 *    element's `struct_size`, which every element must share: a table that grows in a later
 *    minor moves no other table, for plugins built against either header.
 *
 * Threading: kernels are called concurrently from the core's pool threads on disjoint
 * outputs; they must be reentrant and must not create threads. A whole-op entry
 * (`moe_forward`) may use the host's parallel loops.
 *
 * docs/plugin-abi.md explains the contract for third-party authors with a worked example.
 */
#ifndef KT_PLUGIN_H
#define KT_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KT_PLUGIN_ABI_MAJOR 1
#define KT_PLUGIN_ABI_MINOR 8
#define KT_BACKEND_CAPSULE_NAME "kt.backend_api"

/* True when a table of size `struct_size` contains `field` (for reading older plugins). */
#define KT_HAS_FIELD(table_ptr, type, field) \
    ((table_ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Return codes of every fallible ABI function. On failure the callee reports a message
 * through kt_host_api.set_error first; the core turns it into a Python exception. */
typedef enum kt_status {
    KT_OK = 0,
    KT_ERROR_INVALID_ARGUMENT = 1,
    KT_ERROR_UNSUPPORTED = 2,
    KT_ERROR_OUT_OF_MEMORY = 3,
    KT_ERROR_INTERNAL = 4
} kt_status;

/* Element types of tensors handed to packers and quantizers. Integer types carry
 * pre-quantized checkpoint data (RAWINT4 int32 words, FP8 E4M3 bytes as U8, zero points).
 * ABI 1.1 adds the ggml block types of GGUF files (method LLAMAFILE): KT_DTYPE_GGML_BASE plus
 * ggml's own `ggml_type` number, so any ggml type has a value even before it is listed here.
 * ABI 1.6 names IQ2_XXS and IQ3_XXS among them (values BASE + 16 and + 18 before: no field changed),
 * ABI 1.7 Q4_1, Q5_0, Q5_1, IQ4_NL, IQ1_S, IQ1_M and IQ2_XS (BASE + 3, 6, 7, 20, 19, 29, 17: likewise),
 * ABI 1.8 IQ2_S and IQ3_S (BASE + 22, 21: likewise).
 * They name a matrix's format in kt_moe_config.weight_dtype; the matrix itself reaches the
 * packer as U8 bytes [rows, bytes per row], the blocks exactly as the file stores them. */
typedef enum kt_dtype {
    KT_DTYPE_F32 = 0,
    KT_DTYPE_BF16 = 1,
    KT_DTYPE_F16 = 2,
    KT_DTYPE_F64 = 3,
    KT_DTYPE_I8 = 4,
    KT_DTYPE_U8 = 5,
    KT_DTYPE_I32 = 6,
    KT_DTYPE_GGML_BASE = 0x100,
    KT_DTYPE_GGML_Q4_0 = 0x100 + 2,     /* 32 elements in 18 bytes */
    KT_DTYPE_GGML_Q4_1 = 0x100 + 3,     /* 32 elements in 20 bytes */
    KT_DTYPE_GGML_Q5_0 = 0x100 + 6,     /* 32 elements in 22 bytes */
    KT_DTYPE_GGML_Q5_1 = 0x100 + 7,     /* 32 elements in 24 bytes */
    KT_DTYPE_GGML_Q8_0 = 0x100 + 8,     /* 32 elements in 34 bytes */
    KT_DTYPE_GGML_Q2_K = 0x100 + 10,    /* 256 elements in 84 bytes */
    KT_DTYPE_GGML_Q3_K = 0x100 + 11,    /* 256 elements in 110 bytes */
    KT_DTYPE_GGML_Q4_K = 0x100 + 12,    /* 256 elements in 144 bytes */
    KT_DTYPE_GGML_Q5_K = 0x100 + 13,    /* 256 elements in 176 bytes */
    KT_DTYPE_GGML_Q6_K = 0x100 + 14,    /* 256 elements in 210 bytes */
    KT_DTYPE_GGML_IQ2_XXS = 0x100 + 16, /* 256 elements in 66 bytes */
    KT_DTYPE_GGML_IQ2_XS = 0x100 + 17,  /* 256 elements in 74 bytes */
    KT_DTYPE_GGML_IQ2_S = 0x100 + 22,   /* 256 elements in 82 bytes */
    KT_DTYPE_GGML_IQ1_S = 0x100 + 19,   /* 256 elements in 50 bytes */
    KT_DTYPE_GGML_IQ1_M = 0x100 + 29,   /* 256 elements in 56 bytes */
    KT_DTYPE_GGML_IQ3_XXS = 0x100 + 18, /* 256 elements in 98 bytes */
    KT_DTYPE_GGML_IQ3_S = 0x100 + 21,   /* 256 elements in 110 bytes */
    KT_DTYPE_GGML_IQ4_NL = 0x100 + 20,  /* 32 elements in 18 bytes */
    KT_DTYPE_GGML_IQ4_XS = 0x100 + 23   /* 256 elements in 136 bytes */
} kt_dtype;

/* kt_moe_config.quant_flags */
#define KT_QUANT_ZERO_POINT 1u   /* asymmetric: per-group zero points (AWQ/GPTQ style) */
#define KT_QUANT_FAST_ACTIVATIONS 2u  /* kernels may carry activations more coarsely (integer
                                       * kernels: one int8 pass instead of two; split-bf16
                                       * kernels: bf16 only, no low half): faster compute-bound
                                       * prefill, larger error; kernels without a faster mode
                                       * ignore it */

typedef enum kt_log_level { KT_LOG_DEBUG = 0, KT_LOG_INFO = 1, KT_LOG_WARNING = 2, KT_LOG_ERROR = 3 } kt_log_level;

/* ------------------------------------------------------------------------------------ */
/* Host table: what kt-core gives a plugin.                                              */
/* ------------------------------------------------------------------------------------ */

typedef void (*kt_task_1d)(void* ctx, size_t i);
typedef void (*kt_task_2d_tile)(void* ctx, size_t i, size_t j, size_t tile_i, size_t tile_j);
typedef void (*kt_task_group)(void* ctx, int group, size_t i);

typedef struct kt_host_api {
    uint32_t struct_size;
    uint16_t abi_major, abi_minor;

    /* Thread pool (pthreadpool-shaped). The caller takes part; a loop inside a loop body
     * runs inline. Groups are NUMA nodes (or virtual ones). */
    int (*num_threads)(void);
    int (*num_groups)(void);
    int (*group_numa_node)(int group);
    void (*parallel_for)(size_t range, kt_task_1d fn, void* ctx);
    void (*parallel_for_2d)(size_t range_i, size_t range_j, size_t tile_i, size_t tile_j,
                            kt_task_2d_tile fn, void* ctx);
    /* ranges has num_groups() entries; group g's threads run ranges[g] first. */
    void (*parallel_for_groups)(const size_t* ranges, kt_task_group fn, void* ctx);

    /* Allocator: zero-filled, `align` a power of two >= 64; node >= 0 binds to that OS
     * NUMA node, -1 = first touch, -2 = interleave. NULL on failure. Counted per node. */
    void* (*alloc)(size_t bytes, size_t align, int node, int huge_pages);
    void (*free)(void* ptr);

    /* CPU features usable by this process (CPU and OS), after KT_MAX_ISA capping. */
    int (*has_feature)(const char* name);

    void (*log)(kt_log_level level, const char* message);
    /* Record the message of the error about to be returned (thread-local, copied). */
    void (*set_error)(const char* message);
} kt_host_api;

/* ------------------------------------------------------------------------------------ */
/* Backend table: what a plugin gives kt-core.                                           */
/* ------------------------------------------------------------------------------------ */

/* One MoE layer's geometry and the quantization settings of its method.
 * Matrices: gate, up [intermediate, hidden]; down [hidden, intermediate]. */
typedef struct kt_moe_config {
    uint32_t struct_size;
    int64_t hidden;
    int64_t intermediate;
    int64_t num_experts;
    int64_t top_k;
    int64_t group_size;      /* group-wise formats (INT4): elements per group along K; 0 = method default */
    uint32_t quant_flags;    /* KT_QUANT_* */
    /* ABI 1.1. Storage type of gate, up and down for methods whose packed size depends on it
     * (LLAMAFILE: KT_DTYPE_GGML_*; a GGUF file may store down in another type than gate/up);
     * KT_DTYPE_F32 for every other method. Read it only when KT_HAS_FIELD says it is there. */
    kt_dtype weight_dtype[3];
    /* ABI 1.2. The gated activation gate_up_tile applies (docs/formats.md, "Activations"):
     * both 0: SiLU(gate) * up. swiglu_limit > 0: gate = min(gate, limit) and up clamped to
     * [-limit, limit] first. swiglu_alpha > 0: gate * sigmoid(alpha * gate) * (up + 1) instead
     * of SiLU(gate) * up (GPT-OSS: alpha 1.702, limit 7). kt-core sends a layer that sets them
     * only to methods whose kernel table declares KT_ACTIVATION_SWIGLU in `activations`. */
    float swiglu_limit;
    float swiglu_alpha;
} kt_moe_config;

/* A 2-D row-major source matrix for the packer; `row_stride` in elements. */
typedef struct kt_matrix {
    const void* data;
    kt_dtype dtype;
    int64_t rows, cols, row_stride;
} kt_matrix;

/* One weight matrix as the user has it: plain floating values (the packer quantizes them
 * itself), or a checkpoint's pre-quantized codes with their scales and zero points
 * (RAWINT4: I32 words + BF16 scales; FP8: U8 E4M3 bytes + F32 scale_inv). Absent parts
 * have data == NULL. The core has already rejected NaN/Inf in floating values. */
typedef struct kt_weight {
    kt_matrix values;
    kt_matrix scales;
    kt_matrix zeros;
} kt_weight;

/* One expert's weights. */
typedef struct kt_expert_weights {
    uint32_t struct_size;
    kt_weight gate, up, down;
} kt_expert_weights;

/* The kernels of one method (weight format) in one backend variant. Activations flow:
 *   hidden rows --quantize_activations(K=hidden)--> act
 *   act --gate_up_tile--> f32 SiLU(gate)*up [rows, intermediate]
 *   that --quantize_activations(K=intermediate)--> act2
 *   act2 --down_tile--> f32 [rows, hidden] --(core: weighted sum over top-k)--> out
 * Tiles cover output columns [n0, n1) and write only those columns, so the core can run
 * (expert x output block) tasks in parallel. */
typedef struct kt_method_kernels {
    uint32_t struct_size;
    const char* method;        /* "BF16", "FP32", "INT8", ... */
    const char* layout_id;     /* packed weight layout, versioned: "kt-bf16-rowmajor-v1" */
    const char* kernel_id;     /* "moe.bf16.f32.reference" — says dtype, tile, ISA */

    /* Output columns per tile; the core splits [0, N) into multiples of these. */
    int64_t gate_up_block;     /* over intermediate */
    int64_t down_block;        /* over hidden */

    /* Optional: nonzero when this kernel declines the shape/token count (the core then
     * uses the next candidate sharing layout_id, else the next backend). NULL = accepts. */
    int (*declines)(const kt_moe_config* shape, int64_t tokens);

    /* Packed size of one expert (gate, up and down together) and the packer. dst has
     * packed_expert_bytes() bytes, 64-byte aligned, zero-filled.
     * ABI 1.3: a tile-kernel method may leave both NULL: it computes on `layout_id` as
     * another backend packs it (a GEMM library on kt-backend-avx's layouts, through
     * kt/formats/packed_layouts.h). The core then packs with the best runnable variant whose
     * method of the same name packs `layout_id`, and gives that variant the batches this one
     * declines: one copy of the weights serves both. */
    size_t (*packed_expert_bytes)(const kt_moe_config* shape);
    kt_status (*pack_expert)(const kt_moe_config* shape, const kt_expert_weights* src, void* dst);

    /* Bytes one activation row of length k takes after quantization (rows are
     * independent: `rows` rows take rows * this). */
    size_t (*activation_row_bytes)(int64_t k);
    /* in: `rows` rows of `k` elements (`in_dtype`, row stride `in_row_stride` elements). */
    kt_status (*quantize_activations)(const void* in, kt_dtype in_dtype, int64_t rows, int64_t k,
                                      int64_t in_row_stride, void* out);

    /* act: `rows` quantized rows of the hidden size. out: f32 [rows, intermediate] with
     * row stride `out_stride`; writes columns [n0, n1) = SiLU(x·gateᵀ) * (x·upᵀ). */
    kt_status (*gate_up_tile)(const kt_moe_config* shape, const void* packed_expert, const void* act,
                              int64_t rows, int64_t n0, int64_t n1, float* out, int64_t out_stride);
    /* act: `rows` quantized rows of the intermediate size. out: f32 [rows, hidden] with row
     * stride `out_stride`; writes columns [n0, n1) = act·downᵀ. */
    kt_status (*down_tile)(const kt_moe_config* shape, const void* packed_expert, const void* act,
                           int64_t rows, int64_t n0, int64_t n1, float* out, int64_t out_stride);

    /* Optional whole-op entry for backends whose orchestration differs (a GEMM library, a
     * GPU). When set, the core calls it instead of running the tile path. packed_experts
     * has shape->num_experts entries, NULL for experts not on this device (GPU-resident);
     * ids < 0 and ids of NULL experts are skipped. hidden: [tokens, hidden] of
     * hidden_dtype, out: f32 [tokens, hidden], overwritten with the weighted sum. May use
     * the host's parallel loops. */
    kt_status (*moe_forward)(const kt_moe_config* shape, const void* const* packed_experts,
                             const void* hidden, kt_dtype hidden_dtype, int64_t tokens,
                             const int64_t* topk_ids, const float* topk_weights, float* out);

    /* ABI 1.2. KT_ACTIVATION_* bits: the activations beyond SiLU(gate) * up that this method's
     * kernels apply (an explicit claim: recompiling against this header claims nothing). */
    uint32_t activations;

    /* ABI 1.4. Optional: gate_up_tile without its epilogue. Writes x·gateᵀ and x·upᵀ of
     * columns [n0, n1) to out_gate / out_up, tile-local: column n of row r at
     * [r * out_stride + (n - n0)], f32, nothing else.
     * The core calls it instead of gate_up_tile for layers whose gated activation it applies
     * itself: experts with gate/up biases (GPT-OSS), and later expert LoRA. A method without
     * it serves no such layer (the core refuses one, naming backend and method). */
    kt_status (*gate_up_raw_tile)(const kt_moe_config* shape, const void* packed_expert, const void* act,
                                  int64_t rows, int64_t n0, int64_t n1, float* out_gate, float* out_up,
                                  int64_t out_stride);

    /* ABI 1.5. Optional: products with the transposed weights, what training's backward pass
     * needs (kt_core.MoE.grouped_*: the gradient of an expert's input from the gradient of its
     * output). Gradients come in f32 and are used as they are (no activation quantization);
     * weights are the packed values. Output columns k are absolute, [k0, k1) of the matrix's
     * input size, in multiples of `transposed_block` (the last tile may end at K):
     *   gate_up_transposed_tile: grad_gate, grad_up f32 [rows, intermediate] (row stride
     *     grad_stride); out[r * out_stride + k] = sum_n grad_gate[r, n] gate[n, k]
     *     + grad_up[r, n] up[n, k], k in [k0, k1) of hidden.
     *   down_transposed_tile: grad f32 [rows, hidden]; out[r * out_stride + k]
     *     = sum_n grad[r, n] down[n, k], k in [k0, k1) of intermediate.
     * A method without them cannot be trained through (the core refuses, naming backend and
     * method). */
    int64_t transposed_block;
    kt_status (*gate_up_transposed_tile)(const kt_moe_config* shape, const void* packed_expert, const float* grad_gate,
                                         const float* grad_up, int64_t grad_stride, int64_t rows, int64_t k0, int64_t k1,
                                         float* out, int64_t out_stride);
    kt_status (*down_transposed_tile)(const kt_moe_config* shape, const void* packed_expert, const float* grad,
                                      int64_t grad_stride, int64_t rows, int64_t k0, int64_t k1, float* out,
                                      int64_t out_stride);
} kt_method_kernels;

/* kt_method_kernels.activations */
#define KT_ACTIVATION_SWIGLU 1u   /* kt_moe_config.swiglu_limit / swiglu_alpha */

typedef struct kt_backend_api {
    uint32_t struct_size;
    uint16_t abi_major, abi_minor;
    const char* name;          /* matches the descriptor's name */
    const char* variant;       /* matches the descriptor variant that loaded this table */
    /* Features this variant's code executes, comma-separated ("avx2,fma,f16c"); the core
     * checks them against the host before calling anything else, so a descriptor that
     * under-states its needs cannot crash the process. */
    const char* required_features;

    /* Called once before any kernel; the host table outlives the backend. */
    kt_status (*init)(const kt_host_api* host);

    size_t num_methods;
    const kt_method_kernels* methods;
} kt_backend_api;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* KT_PLUGIN_H */
