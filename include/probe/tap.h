/* probe/tap.h - the tap ABI, exported by the preloaded library
 * (libprobe_intercept.so) and called by framework adapters (the Python
 * adapter through ctypes) or by any C/C++ code that wants a tensor captured.
 *
 * Stability (NVTX v3 style): a struct starts with its own size and the ABI
 * version; new fields are only appended; a caller that knows fewer fields
 * passes a smaller struct_size and the library treats the missing fields as
 * unknown. The function names carry the major version (_v1) and never change
 * meaning.
 *
 * Threading: every function may be called from any thread at any time.
 * probe_tap_v1 never synchronizes the producer's stream: a device tensor is
 * copied on probe's private stream after an event recorded on `stream`; a
 * stream that is capturing a CUDA graph is never touched (the tensor is
 * recorded as skipped instead).
 */
#ifndef PROBE_TAP_H
#define PROBE_TAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PROBE_TAP_ABI_VERSION 1

typedef struct probe_tap_tensor_v1 {
    uint32_t struct_size;    /* sizeof(probe_tap_tensor_v1) as the caller compiled it */
    uint32_t abi_version;    /* PROBE_TAP_ABI_VERSION */
    const char *component;   /* component name, e.g. "dit.step" (1..127 bytes, no '/', no control
                                characters, not "." or ".."); required */
    const char *slot;        /* "out", "in.<arg>", "out.<field>", "out.<i>"; required */
    int64_t call;            /* call index of the component (path /<component>/<call:04>/<slot>); required, >= 0 */
    int64_t step;            /* denoising step, -1 unknown */
    int32_t cfg_branch;      /* CFG branch (0 first call of the step, 1 second, ...), -1 unknown */
    int32_t device;          /* -1: host memory; >= 0: CUDA device ordinal */
    int32_t dtype;           /* probe_dtype (probe/dtype.h) */
    int32_t rank;            /* 0..16 */
    const int64_t *shape;    /* rank entries, each >= 0 */
    const int64_t *strides;  /* rank entries, in elements, each >= 0; NULL = contiguous row-major */
    const void *data;        /* address of element [0, ..., 0] */
    void *stream;            /* producer cudaStream_t for device tensors; NULL = legacy default stream */
    double timestep;         /* scheduler timestep, NaN unknown */
    /* Nesting and class. A caller whose struct_size ends before a field (down
     * to PROBE_TAP_TENSOR_V1_BASE_SIZE, where timestep ends) leaves it unknown. */
    const char *parent;      /* the enclosing component call, "/<component>/<call:04>", when this
                                call runs inside another component's call (a DiT block inside
                                dit.step: "/dit.step/0003"); NULL or "": not nested. 1..255 bytes,
                                starting with '/', no control characters */
    int64_t block;           /* with parent: the index of this call among the calls of the same
                                component inside that parent call (0 .. N-1), >= 0; ignored
                                without parent */
    const char *class_name;  /* qualified name "module.Qualname" of the class whose method was
                                wrapped (e.g. "diffusers.models.transformers.transformer_wan.
                                WanTransformerBlock"); NULL or "": unknown. At most 255 bytes,
                                no control characters */
    const char *module;      /* the module path of the object whose method was wrapped: its
                                attribute name in the pipeline ("text_encoder_2",
                                "transformer") or, inside another component's call, its name
                                in the parent's module tree ("transformer.blocks.3"); NULL or
                                "": unknown. At most 255 bytes, no control characters */
} probe_tap_tensor_v1;

/* struct_size of a descriptor that ends at timestep (the first fields of
 * version 1); the smallest one probe_tap_v1 and probe_inject_v1 accept. */
#define PROBE_TAP_TENSOR_V1_BASE_SIZE (offsetof(probe_tap_tensor_v1, timestep) + sizeof(double))

/* Capture one tensor. Returns 0 (PROBE_OK) when the tensor was accepted,
 * written or recorded as skipped; a probe_status otherwise (bad descriptor:
 * PROBE_EINVAL; capture disabled because the file could not be written:
 * PROBE_EIO). Host data is copied before the call returns, so the caller may
 * reuse the memory at once; device data is copied asynchronously. */
int probe_tap_v1(const probe_tap_tensor_v1 *t);

/* 1 if this process is capturing (an output file is configured, this process
 * owns it, and capture has not been disabled by an error), else 0. */
int probe_tap_enabled_v1(void);

/* Add or replace a key of the run manifest; json_value must be JSON text
 * (e.g. "\"2.11.0\"" or "{\"a\":1}"). Returns PROBE_EINVAL for a bad key. */
int probe_tap_manifest_v1(const char *key, const char *json_value);

/* probe's private copy stream on CUDA device `device` (a cudaStream_t), or
 * NULL when none exists (no device tensor tapped on that device yet, or CUDA
 * is not loaded). Framework adapters whose allocator may reuse a tapped
 * tensor's memory as soon as the producer frees it must mark the tensor as
 * used on this stream after probe_tap_v1 returns (torch:
 * t.record_stream(torch.cuda.ExternalStream(handle))), so the memory is not
 * reused before probe's copy has read it. The producer is never blocked. */
void *probe_tap_stream_v1(int32_t device);

/* Wait until every accepted capture is in the file (device copies complete,
 * writer queue drained) and flush it. Never called by probe on the producer
 * stream; adapters call it at interpreter exit. */
int probe_tap_flush_v1(void);

/* ---- processes (appended in 0.x; ABI version 1) --------------------------
 *
 * Write this process's captures to its own per-process file,
 * <stem>.<name><ext> next to the run's capture file (PROBE_OUT run.h5,
 * name "proc1": run.proc1.h5), instead of claiming the run's file: for a
 * worker process (a DataLoader worker running the text encoder) that must
 * not take the run's file from the process running the pipeline. name:
 * "proc" followed by [A-Za-z0-9_-], at most 64 characters. Call it before
 * the process's first tap. PROBE_OK (also when this process does not
 * capture, and again with the same name); PROBE_EINVAL for a bad name;
 * PROBE_ESTATE after the process claimed a file, with another name, or in
 * the run's first process (which writes the run's file). The file's
 * manifest has "process": {"name", "main", "ppid"}; the run's file lists the
 * per-process files next to it ("processes"). */
int probe_tap_sidecar_v1(const char *name);

/* As probe_tap_sidecar_v1, but only if the run's capture file is already
 * taken (held by another process, or holding a capture) when this process
 * first taps: a pool of processes that each run the pipeline; the first to
 * tap writes the run's file. Returns as probe_tap_sidecar_v1. */
int probe_tap_sidecar_if_taken_v1(const char *name);

/* Drain and close this process's capture file now, as at exit (for a
 * process that will leave with _exit, which runs no atexit handler); later
 * taps return PROBE_ESTATE. PROBE_OK (also when this process does not
 * capture or already closed), PROBE_EIO when capture was disabled by a
 * write error. */
int probe_tap_close_v1(void);

/* ---- injection (appended in 0.x; same descriptor, ABI version 1) ------
 *
 * Injection replaces a tensor of the running (candidate) process with the
 * value recorded at the same dataset path in a reference capture file, so
 * two runs see identical root inputs (initial latents, timesteps, prompt
 * embeddings) or a component sees the reference's recorded inputs (replay).
 * It is configured by the environment that probe-run sets
 * (docs/inject.md): PROBE_INJECT=REF.h5 and PROBE_INJECT_GLOBS=glob[,glob...]
 * (fnmatch(3) globs on dataset paths, as PROBE_CAPTURE).
 *
 * Return values of probe_inject_v1. */
#define PROBE_INJECT_NONE 0     /* nothing to inject: injection not configured, this process
                                   does not capture, or the path matches no inject glob */
#define PROBE_INJECT_DONE 1     /* the tensor now holds the reference's bytes (host: on return;
                                   device: in stream order on t->stream) */
#define PROBE_INJECT_ERROR (-1) /* not injected, and injection is stopped for the rest of the
                                   run: bad descriptor, reference file unreadable, path absent
                                   from the reference (count mismatch), shape or dtype mismatch,
                                   or an earlier error. One `probe:` line names the path; the
                                   capture file's manifest records the failure ("inject":
                                   {"status": "failed", "error": ...}) and probe-compare
                                   refuses the file. */

/* Inject into the tensor described by t (its path /<component>/<call:04>/<slot>
 * is built as probe_tap_v1 builds it; step, cfg_branch and timestep are
 * ignored). The reference tensor at that path must have the same logical
 * dtype and shape (strides may differ: the bytes are scattered into t's
 * layout). Host memory (device -1) is written before the call returns.
 * Device memory: the reference bytes are put in a pinned host buffer and
 * copied with cudaMemcpyAsync host-to-device on t->stream (the producer's
 * stream), so everything later on that stream sees the new values; the
 * buffer is kept until the copy's completion event is reached (polled, never
 * waited for). Device tensors must be contiguous (adapters copy a strided
 * tensor into a contiguous one first). A stream capturing a CUDA graph is an
 * error (nothing is enqueued on it). Each injected path is recorded in the
 * manifest (key "inject": reference file, globs, per path the reference's
 * probe.hash). Call it before probe_tap_v1 for the same path, so the capture
 * records the injected value. */
int probe_inject_v1(const probe_tap_tensor_v1 *t);

/* ---- component scopes (appended in 0.x; ABI version 1) -----------------
 *
 * The preloaded library also sees calls the pipeline makes into the GPU
 * libraries (GEMMs, collectives, kernel launches: docs/gemm.md, nccl.md,
 * kernels.md). It attributes each one to the innermost component scope of
 * the calling thread. An adapter announces each component call it wraps
 * with the same component, call index, step, CFG branch, parent call and
 * block index its taps carry (operands then carry them too),
 * so a GEMM inside the DiT's 4th call is /dit.step/0003/gemm.<k>.<operand>.
 * NVTX ranges mapped by PROBE_NVTX_SCOPES open scopes too (docs/intercept.md
 * "Scopes"). */
typedef struct probe_scope_v1 {
    uint32_t struct_size;    /* sizeof(probe_scope_v1) as the caller compiled it */
    uint32_t abi_version;    /* PROBE_TAP_ABI_VERSION */
    const char *component;   /* as probe_tap_tensor_v1.component; required */
    int64_t call;            /* call index of the component, >= 0 */
    int64_t step;            /* denoising step, -1 unknown */
    int32_t cfg_branch;      /* CFG branch, -1 unknown */
    /* A caller whose struct_size ends before a field leaves it unknown. */
    const char *parent;      /* as probe_tap_tensor_v1.parent: the enclosing component call */
    int64_t block;           /* as probe_tap_tensor_v1.block */
} probe_scope_v1;

/* Open a scope on the calling thread (scopes nest; at most 32 are kept per
 * thread, deeper ones are counted and closed in order). PROBE_OK (also when
 * this process does not capture: nothing is recorded), PROBE_EINVAL for a
 * bad descriptor (nothing opened). */
int probe_scope_enter_v1(const probe_scope_v1 *s);

/* Close the calling thread's innermost scope opened by probe_scope_enter_v1.
 * PROBE_OK, or PROBE_ESTATE when none is open. */
int probe_scope_exit_v1(void);

#ifdef __cplusplus
}
#endif
#endif
