/* taps.c - the tap ABI (probe/tap.h): dataset paths, the PROBE_CAPTURE filter, and dispatch
 * of host and device tensors to the writer queue. */
#include <fnmatch.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/desc.h"
#include "base/gather.h"
#include "base/pathset.h"
#include "base/shim.h"
#include "capture/cuda.h"
#include "capture/exits.h"
#include "capture/file.h"
#include "capture/job.h"
#include "capture/nvtx.h"
#include "capture/procs.h"
#include "capture/queue.h"
#include "capture/scope.h"
#include "capture/select.h"
#include "capture/stats.h"
#include "capture/taps.h"
#include "capture/weights.h"
#include "capture/write.h"

static atomic_ullong next_seq;
static atomic_int warned_foreign;
static atomic_int cuda_info_taken;

/* 1: go on capturing; 0: this process does not capture (the tap returns 0). */
static int this_process_captures(void)
{
    if (shim_cfg.mode == SHIM_INACTIVE)
        return 0;
    shim_file_claim();
    if (shim_is_foreign_process()) {
        const char *why = shim_file_claim_lost_reason();
        if (*why && atomic_exchange(&warned_foreign, 1) == 0)
            shim_warn("pid %ld does not capture: %s", (long)getpid(), why);
        return 0;
    }
    return 1;
}

int shim_tap_process_captures(void)
{
    return this_process_captures();
}

/* A tensor job written by capture/write.c. */
static struct shim_job *new_job(void)
{
    struct shim_job *j = calloc(1, sizeof *j);
    if (j) {
        j->work.run = shim_write_run;
        j->work.done = shim_write_done;
    }
    return j;
}

static void fill_record(struct shim_job *j, const probe_tap_tensor_v1 *t, const char *path)
{
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->component, sizeof j->component, "%s", t->component);
    snprintf(j->slot, sizeof j->slot, "%s", t->slot);
    shim_nvtx_scope(j->scope, sizeof j->scope);
    if (t->device < 0)
        snprintf(j->device_name, sizeof j->device_name, "cpu");
    else
        snprintf(j->device_name, sizeof j->device_name, "cuda:%d", t->device);
    j->call = t->call;
    j->step = t->step;
    j->cfg_branch = t->cfg_branch;
    j->timestep = t->timestep;
    const char *parent = shim_desc_parent(t), *cls = shim_desc_class(t);
    snprintf(j->parent, sizeof j->parent, "%s", parent ? parent : "");
    j->block = shim_desc_block(t);
    snprintf(j->class_name, sizeof j->class_name, "%s", cls ? cls : "");
    const char *mod = shim_desc_module(t);
    snprintf(j->module, sizeof j->module, "%s", mod ? mod : "");
    j->dtype = (probe_dtype)t->dtype;
    j->rank = t->rank;
    for (int k = 0; k < t->rank; ++k)
        j->shape[k] = t->shape[k];
    j->seq = shim_exits_exec_seq(atomic_fetch_add(&next_seq, 1));
}

/* Capture one tensor (probe/tap.h). Returns PROBE_OK (0) when the tensor was
 * queued, recorded as skipped, filtered out by PROBE_CAPTURE, or when this
 * process does not capture (PROBE_OUT unset; not the owner: one `probe:`
 * line the first time). Errors: PROBE_EINVAL bad descriptor or a path
 * already captured (message says which field); PROBE_EIO capture disabled
 * after a write error; PROBE_ESTATE after the file was closed at exit;
 * PROBE_ENOMEM. Host data is gathered into a contiguous copy before
 * returning; device data is copied asynchronously (cuda.c). */
SHIM_EXPORT int probe_tap_v1(const probe_tap_tensor_v1 *t)
{
    shim_procs_abi_used();
    return shim_tap_capture(t, NULL, 1);
}

void shim_tap_operand(probe_tap_tensor_v1 *t, const char *component, const char *slot,
                      int64_t call, int64_t step, int32_t cfg_branch, int device, int32_t dtype,
                      int32_t rank, const int64_t *shape, const int64_t *strides, const void *data,
                      void *stream)
{
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->abi_version = PROBE_TAP_ABI_VERSION;
    t->component = component;
    t->slot = slot;
    t->call = call;
    t->step = step;
    t->cfg_branch = cfg_branch;
    t->device = device;
    t->dtype = dtype;
    t->rank = rank;
    t->shape = shape;
    t->strides = strides;
    t->data = data;
    t->stream = stream;
    t->timestep = NAN;
    t->parent = NULL;
    t->block = -1;
    t->class_name = NULL;
    t->module = NULL;
}

void shim_tap_operand_nesting(probe_tap_tensor_v1 *t, const struct shim_scope *sc)
{
    if (sc && sc->parent[0] && sc->block >= 0) {
        t->parent = sc->parent;
        t->block = sc->block;
    }
}

probe_status shim_tap_hash_device(const probe_tap_tensor_v1 *t, size_t slot)
{
    if (!this_process_captures())
        return PROBE_ESTATE;
    struct shim_extent ext;
    probe_status st = shim_desc_validate(t, &ext);
    if (st != PROBE_OK)
        return st;
    if (t->device < 0 || ext.n == 0)
        return probe_set_error(PROBE_EINVAL, "tap: hash-only capture needs a non-empty device tensor");
    if (shim_closed() || shim_disabled())
        return probe_set_error(PROBE_ESTATE, "tap: capture is closed or disabled");
    if ((st = shim_file_open()) != PROBE_OK)
        return st;
    probe_tap_tensor_v1 renumbered;
    char parent[SHIM_PARENT_MAX];
    t = shim_exits_exec_call(t, &renumbered, parent, sizeof parent); /* exits.c */
    struct shim_job *j = new_job();
    if (!j)
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    j->work.run = shim_weights_run_hash;
    char path[SHIM_PATH_MAX];
    snprintf(path, sizeof path, "/%s/%04lld/%s", t->component, (long long)t->call, t->slot);
    fill_record(j, t, path);
    j->nbytes = ext.nbytes;
    j->hash_only = 1;
    j->hash_slot = slot;
    j->dev.has_strides = t->strides && !ext.contiguous;
    for (int k = 0; j->dev.has_strides && k < t->rank; ++k)
        j->dev.strides[k] = t->strides[k];
    if (atomic_exchange(&cuda_info_taken, 1) == 0) {
        shim_cuda_info_refresh();
        shim_exit_after_cuda();
    }
    int queued = 0;
    st = shim_cuda_capture(j, t->data, ext.span_bytes, t->device, t->stream, &queued);
    if (queued)
        return PROBE_OK;
    free(j->dev.pieces);
    free(j);
    return st != PROBE_OK ? st : probe_set_error(PROBE_ESTATE, "tap: hash-only capture skipped");
}

probe_status shim_tap_capture(const probe_tap_tensor_v1 *t, const char *op_json, int select)
{
    if (!this_process_captures())
        return PROBE_OK;
    struct shim_extent ext;
    probe_status st = shim_desc_validate(t, &ext);
    if (st != PROBE_OK)
        return st;
    if (shim_closed())
        return probe_set_error(PROBE_ESTATE, "tap: the capture file is already closed");
    int was_disabled = shim_disabled();
    if (!was_disabled && (st = shim_file_open()) != PROBE_OK)
        return st;
    probe_tap_tensor_v1 renumbered;
    char parent[SHIM_PARENT_MAX];
    t = shim_exits_exec_call(t, &renumbered, parent, sizeof parent); /* exits.c: exec continuation */

    char path[SHIM_PATH_MAX];
    snprintf(path, sizeof path, "/%s/%04lld/%s", t->component, (long long)t->call, t->slot);
    if (select && !shim_select_tap(path, t->step, t->cfg_branch, shim_desc_block(t))) {
        atomic_fetch_add(&shim_counts.filtered, 1);
        return PROBE_OK;
    }
    if (was_disabled) {
        shim_write_lost_note(path, 1); /* queue.c: in the manifest's "lost" */
        return probe_set_error(PROBE_EIO, "tap: capture disabled after a write error");
    }
    int ins = shim_pathset_insert(path);
    if (ins < 0)
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    if (ins == 0)
        return probe_set_error(PROBE_EINVAL, "tap: %s was already captured in this run", path);

    struct shim_job *j = new_job();
    if (!j) {
        shim_pathset_remove(path);
        return probe_set_error(PROBE_ENOMEM, "tap: out of memory");
    }
    fill_record(j, t, path);
    shim_exits_note_tapped(path); /* exits.c: a kill now names it as lost */
    j->nbytes = ext.nbytes;
    if (op_json && !(j->op = strdup(op_json))) {
        st = probe_set_error(PROBE_ENOMEM, "tap: out of memory");
        goto fail;
    }

    if (ext.n == 0 || t->device < 0) {
        j->kind = SHIM_JOB_HOST;
        if (ext.nbytes > 0) {
            if ((st = shim_queue_reserve(ext.nbytes)) != PROBE_OK)
                goto fail;
            j->work.reserved = ext.nbytes;
            j->data = malloc(ext.nbytes);
            if (!j->data) {
                st = probe_set_error(PROBE_ENOMEM, "tap: cannot allocate %zu bytes for %s",
                                     ext.nbytes, path);
                goto fail;
            }
            shim_gather(j->data, t->data, t->rank, t->shape, t->strides,
                        probe_dtype_size(j->dtype));
        }
    } else {
        int queued = 0;
        j->dev.has_strides = t->strides && !ext.contiguous;
        for (int k = 0; j->dev.has_strides && k < t->rank; ++k)
            j->dev.strides[k] = t->strides[k];
        if (atomic_exchange(&cuda_info_taken, 1) == 0) {
            shim_cuda_info_refresh();
            shim_exit_after_cuda();
        }
        /* A contiguous stats-only tensor is summarized on the GPU; other
         * tensors (and that one when it cannot be) take the staging copy.
         * Each queues the job itself (after that, j belongs to the writer
         * thread). */
        int handled = 0;
        if (!j->dev.has_strides && shim_stats_on_device() &&
            shim_stats_selected(path, j->step, j->cfg_branch, j->parent[0] ? j->block : -1))
            st = shim_cuda_summarize(j, t->data, ext.n, t->device, t->stream, &handled, &queued);
        if (!handled)
            st = shim_cuda_capture(j, t->data, ext.span_bytes, t->device, t->stream, &queued);
        if (queued) {
            atomic_fetch_add(&shim_counts.accepted, 1);
            return PROBE_OK;
        }
        free(j->dev.pieces);
        j->dev.pieces = NULL;
        if (st != PROBE_OK)
            goto fail;
        j->nbytes = 0; /* j->kind is SHIM_JOB_SKIP, j->reason says why */
    }
    enum shim_job_kind kind = j->kind;
    if ((st = shim_queue_push(&j->work)) != PROBE_OK)
        goto fail;
    if (kind == SHIM_JOB_SKIP)
        atomic_fetch_add(&shim_counts.skipped, 1);
    else
        atomic_fetch_add(&shim_counts.accepted, 1);
    return PROBE_OK;

fail:
    if (j->work.reserved)
        shim_queue_unreserve(j->work.reserved);
    free(j->data);
    free(j->op);
    free(j);
    shim_pathset_remove(path);
    return st;
}

void shim_tap_skip_path(const char *path, const char *reason)
{
    if (!shim_capturing() || shim_is_foreign_process() || shim_closed() || !shim_writer())
        return;
    struct shim_job *j = new_job();
    if (!j)
        return;
    j->kind = SHIM_JOB_SKIP;
    snprintf(j->path, sizeof j->path, "%s", path);
    /* "/<component>/<call>/<slot>": the record's fields, for the writer */
    const char *c = path[0] == '/' ? path + 1 : path, *e = strchr(c, '/');
    snprintf(j->component, sizeof j->component, "%.*s", e ? (int)(e - c) : (int)strlen(c), c);
    const char *slot = strrchr(path, '/');
    snprintf(j->slot, sizeof j->slot, "%s", slot ? slot + 1 : path);
    snprintf(j->device_name, sizeof j->device_name, "cuda");
    j->call = e ? strtoll(e + 1, NULL, 10) : -1;
    j->step = -1;
    j->cfg_branch = -1;
    j->timestep = NAN;
    j->block = -1;
    j->seq = shim_exits_exec_seq(atomic_fetch_add(&next_seq, 1));
    snprintf(j->reason, sizeof j->reason, "%s", reason);
    if (shim_queue_push(&j->work) != PROBE_OK) {
        free(j);
        return;
    }
    atomic_fetch_add(&shim_counts.skipped, 1);
}

/* 1 if this process is capturing (probe/tap.h), else 0. */
SHIM_EXPORT int probe_tap_enabled_v1(void)
{
    shim_procs_abi_used();
    return shim_capturing() && !shim_is_foreign_process();
}

/* Wait until every accepted capture is in the file and flush it
 * (probe/tap.h). Also records CUDA versions/devices for the manifest while
 * the runtime is alive. PROBE_OK when this process does not capture;
 * PROBE_EIO when capture was disabled by a write error; PROBE_ESTATE after
 * the file was closed. */
SHIM_EXPORT int probe_tap_flush_v1(void)
{
    /* A process that never tapped has nothing to flush and must not claim
     * the file (its at-exit flush would take it from the process that taps). */
    if (shim_cfg.mode != SHIM_OWNER || shim_is_foreign_process() || !shim_writer())
        return shim_disabled() && !shim_is_foreign_process()
                   ? probe_set_error(PROBE_EIO, "probe_tap_flush_v1: capture disabled after a write error")
                   : PROBE_OK;
    if (shim_closed())
        return probe_set_error(PROBE_ESTATE, "probe_tap_flush_v1: the capture file is already closed");
    if (shim_disabled())
        return probe_set_error(PROBE_EIO, "probe_tap_flush_v1: capture disabled after a write error");
    probe_status st = shim_file_open();
    if (st != PROBE_OK)
        return st;
    shim_cuda_info_refresh();
    st = shim_queue_barrier(shim_write_flush);
    if (st == PROBE_OK)
        return PROBE_OK;
    return probe_set_error(st, "probe_tap_flush_v1: %s",
                           st == PROBE_EIO      ? "capture disabled after a write error"
                           : st == PROBE_ENOMEM ? "out of memory"
                                                : "the capture file is closed");
}
