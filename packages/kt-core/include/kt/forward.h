/* kt-core's forward entry points for device bridges (kt-cuda, and any other package that drives
 * kt's CPU experts from outside Python): submit a layer's forward to kt-core's pool and wait for
 * it, from any thread that is not one of the pool's workers (a CUDA host function's, say), with
 * no Python involved. kt_core._native.forward_api() hands this table out in a capsule named
 * KT_FORWARD_API_CAPSULE; kt_core.MoE.native_handle is the `layer` argument. The table is
 * versioned by its struct_size (fields are only ever appended) and `version`.
 *
 * One forward is in flight per process (kt-core's pool runs one job at a time); forwards of
 * different layers are serialised by the caller (SGLang's layer order). */
#ifndef KT_FORWARD_H
#define KT_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KT_FORWARD_API_VERSION 2
#define KT_FORWARD_API_CAPSULE "kt_forward_api"

typedef struct kt_forward_api {
    uint32_t struct_size; /* sizeof(kt_forward_api) of the kt-core that filled it */
    uint32_t version;     /* KT_FORWARD_API_VERSION */
    /* Checks the arguments (ids in [-1, E), tokens <= the layer's max_tokens, dtypes float32 or
     * bfloat16), queues the forward out[tokens, hidden] = sum_j weights[t, j] *
     * expert_{ids[t, j]}(hidden[t]) on the pool and returns at once. The pointers must stay
     * valid until wait() returns. KT_OK, or an error whose message last_error() gives; an error
     * queues nothing. */
    kt_status (*submit)(void* layer, const void* hidden, kt_dtype hidden_dtype, int64_t tokens, const int64_t* ids,
                        const float* weights, void* out, kt_dtype out_dtype);
    /* Waits for the queued forward (the calling thread joins its work); KT_OK at once if none is
     * queued. The forward's own failure is returned here. */
    kt_status (*wait)(void);
    /* The message of this thread's last error (empty if none); valid until its next call. */
    const char* (*last_error)(void);
    /* Version 2. kt-core's NUMA allocator (kt_host_api.alloc's contract: zero-filled, `align` a
     * power of two >= 64, node >= 0 binds to that node, -1 first touch, -2 interleave; NULL on
     * failure), for a bridge's staging buffers: kt-cuda page-locks them with cudaHostRegister. */
    void* (*alloc)(size_t bytes, size_t align, int node, int huge_pages);
    void (*free)(void* ptr);
} kt_forward_api;

#ifdef __cplusplus
}
#endif

#endif /* KT_FORWARD_H */
