/* nccl.c - interposed NCCL collectives (docs/nccl.md).
 *
 * Exported hooks: ncclAllReduce, ncclAllGather, ncclReduceScatter,
 * ncclBroadcast, ncclBcast, ncclSend, ncclRecv, ncclAlltoAll (NCCL 2.28's
 * spelling), ncclGroupStart, ncclGroupEnd. Each forwards every argument
 * untouched to NCCL's profiling entry point pncclX (the ncclX names in
 * libnccl are weak aliases of them) and returns its result. The real entry
 * points are resolved at the first call: dlsym(RTLD_NEXT), then
 * dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_LAZY) + dlsym (torch loads NCCL
 * RTLD_LOCAL, where RTLD_NEXT does not see it; docs/nccl.md "Hooks").
 *
 * What is recorded, in the process that owns the capture file:
 * - every call is counted per scope component and collective (count and
 *   bytes) for the manifest key "nccl", with the rank and size of the first
 *   communicator seen (pncclCommUserRank / pncclCommCount, cached per
 *   communicator);
 * - operands selected by PROBE_CAPTURE through an item whose glob contains
 *   "nccl" (shared convention #3) are captured as device tensors on the
 *   call's stream (NULL = the legacy default stream, used as that handle):
 *   /<component>/<call:04>/nccl.<k:04>.<op>.<in|out> inside a scope,
 *   /nccl/<k:04>/<op>.<in|out> outside (k from shim_scope_next).
 * Group semantics: inside ncclGroupStart/End NCCL enqueues nothing until the
 * outermost ncclGroupEnd, so the calls are queued per thread and their
 * outputs are captured after that GroupEnd returns ncclSuccess; with
 * ncclInProgress (non-blocking communicator) the selected paths are
 * recorded as skipped with the reason. Outside a group, outputs are
 * captured right after the call returns. An input is captured after the
 * call too, except for an in-place collective (sendbuff == recvbuff), whose
 * input is captured before the call is forwarded (stream order puts the
 * copy before the collective).
 *
 * Rules (docs/intercept.md): a thread-local guard around hook bodies; no
 * CUDA work in a forked child or a process that does not capture; a
 * capture that fails disables NCCL captures with one `probe:` line, never
 * the call. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/resolve.h"
#include "base/shim.h"
#include "capture/file.h"
#include "capture/scope.h"
#include "capture/select.h"
#include "capture/taps.h"
#include "hooks/nccl.h"

/* nccl.h (NCCL 2.28) values, declared locally: the shim never includes NCCL. */
typedef int nccl_result;
enum { NCCL_OK = 0, NCCL_INTERNAL_ERROR = 3, NCCL_IN_PROGRESS = 7 };
enum { NCCL_NUM_TYPES = 12, NCCL_NUM_OPS = 5 };

enum coll { C_ALL_REDUCE, C_ALL_GATHER, C_REDUCE_SCATTER, C_BROADCAST, C_SEND, C_RECV,
            C_ALL_TO_ALL, C_COUNT };
static const char *const coll_name[C_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                               "broadcast", "send", "recv", "all_to_all"};

/* ncclDataType_t -> probe_dtype (nccl.h: ncclInt8 0 .. ncclFloat8e5m2 11). */
static const probe_dtype dtype_map[NCCL_NUM_TYPES] = {
    PROBE_DTYPE_INT8,    PROBE_DTYPE_UINT8,   PROBE_DTYPE_INT32,   PROBE_DTYPE_UINT32,
    PROBE_DTYPE_INT64,   PROBE_DTYPE_UINT64,  PROBE_DTYPE_FLOAT16, PROBE_DTYPE_FLOAT32,
    PROBE_DTYPE_FLOAT64, PROBE_DTYPE_BFLOAT16, PROBE_DTYPE_FLOAT8_E4M3FN, PROBE_DTYPE_FLOAT8_E5M2};
static const char *const redop_name[NCCL_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

static probe_dtype map_dtype(int dt)
{
    return dt >= 0 && dt < NCCL_NUM_TYPES ? dtype_map[dt] : PROBE_DTYPE_INVALID;
}

/* ---- the real entry points ------------------------------------------------ */

enum fn { F_ALL_REDUCE, F_ALL_GATHER, F_REDUCE_SCATTER, F_BROADCAST, F_BCAST, F_SEND, F_RECV,
          F_ALL_TO_ALL, F_GROUP_START, F_GROUP_END, F_USER_RANK, F_COUNT_RANKS, F_CU_DEVICE, F_N };
static const char *const fn_name[F_N] = {
    "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Bcast", "Send", "Recv", "AlltoAll",
    "GroupStart", "GroupEnd", "CommUserRank", "CommCount", "CommCuDevice"};
static void *_Atomic real_fn[F_N];
static atomic_int warned_missing;

/* pnccl<name> (else nccl<name>) from the NCCL the process loaded, never the
 * shim's own hook. NULL when NCCL is not loaded. */
static void *real(enum fn f)
{
    void *p = atomic_load(&real_fn[f]);
    if (p)
        return p;
    char pname[48], name[48];
    snprintf(pname, sizeof pname, "pnccl%s", fn_name[f]);
    snprintf(name, sizeof name, "nccl%s", fn_name[f]);
    p = shim_resolve(pname, shim_resolve_nccl);
    if (!p) /* the library's own definition, searched from its handle */
        p = shim_resolve_in(name, shim_resolve_nccl, NULL);
    if (!p)
        p = shim_resolve_next(name);
    if (p)
        atomic_store(&real_fn[f], p);
    else if (atomic_exchange(&warned_missing, 1) == 0)
        shim_warn("nccl%s called but no NCCL library (libnccl.so.2) is loaded; returning "
                  "ncclInternalError", fn_name[f]);
    return p;
}

/* ---- communicators --------------------------------------------------------- */

struct comm_info {
    const void *comm;
    int rank, nranks, device, order;
};
#define MAX_COMMS 64
static struct comm_info comms[MAX_COMMS];
static int ncomms;
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

/* Rank, size, CUDA device and first-seen order of comm (queried once;
 * -1 where NCCL does not answer). */
static struct comm_info comm_of(const void *comm)
{
    pthread_mutex_lock(&comm_lock);
    for (int i = 0; i < ncomms; ++i) {
        if (comms[i].comm == comm) {
            struct comm_info c = comms[i];
            pthread_mutex_unlock(&comm_lock);
            return c;
        }
    }
    pthread_mutex_unlock(&comm_lock);
    struct comm_info c = {comm, -1, -1, -1, -1};
    nccl_result (*q)(const void *, int *);
    if ((*(void **)&q = real(F_USER_RANK)) && q(comm, &c.rank) != NCCL_OK)
        c.rank = -1;
    if ((*(void **)&q = real(F_COUNT_RANKS)) && q(comm, &c.nranks) != NCCL_OK)
        c.nranks = -1;
    if ((*(void **)&q = real(F_CU_DEVICE)) && q(comm, &c.device) != NCCL_OK)
        c.device = -1;
    pthread_mutex_lock(&comm_lock);
    c.order = ncomms;
    if (ncomms < MAX_COMMS)
        comms[ncomms++] = c;
    pthread_mutex_unlock(&comm_lock);
    return c;
}

/* ---- counts for the manifest -------------------------------------------- */

#define MAX_COMPONENTS 64
struct comp_counts {
    char component[SHIM_NAME_MAX];
    unsigned long long count[C_COUNT], bytes[C_COUNT];
};
static struct comp_counts counts[MAX_COMPONENTS];
static int ncounts;
static unsigned long long groups_done, inprogress_skips, failed_calls;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int first_rank = -1, first_nranks = -1;

static void count_call(const char *component, enum coll c, unsigned long long bytes)
{
    pthread_mutex_lock(&count_lock);
    int i = 0;
    while (i < ncounts && strcmp(counts[i].component, component) != 0)
        ++i;
    if (i == ncounts && ncounts < MAX_COMPONENTS)
        snprintf(counts[ncounts++].component, SHIM_NAME_MAX, "%s", component);
    if (i < ncounts) {
        counts[i].count[c] += 1;
        counts[i].bytes[c] += bytes;
    }
    pthread_mutex_unlock(&count_lock);
}

/* ---- one call ---------------------------------------------------------- */

struct call {
    enum coll coll;
    const char *api;        /* "ncclAllReduce", ... */
    const void *send;
    void *recv;
    size_t count;           /* count / sendcount / recvcount as the API names it */
    int dt, op, root, peer; /* -1 when the API has none */
    void *comm, *stream;
    struct comm_info ci;
    struct shim_scope sc;
    int in_scope;
    int64_t k;
    int active;             /* this process records the call */
    int sel_in, sel_out;    /* operand selected by PROBE_CAPTURE */
    int in_done;            /* in captured before the call (in-place) */
    char path_in[SHIM_PATH_MAX], path_out[SHIM_PATH_MAX];
};

static _Thread_local int in_hook;
/* > 0 while this thread is inside a forwarded NCCL call: NCCL's own
 * ncclBcast calls the exported ncclBroadcast, which reaches the hook again;
 * such a nested call is NCCL's, not the program's, and is not recorded. */
static _Thread_local int in_nccl;
static _Thread_local int group_depth;
static _Thread_local struct call *group_q;
static _Thread_local size_t group_n, group_cap;
static atomic_int captures_off;

/* Elements of the input (send) and output (recv) buffers on this rank
 * (nccl.h: AllGather recv = nranks * sendcount, ReduceScatter send =
 * nranks * recvcount, AlltoAll both nranks * count). 0 = no such buffer. */
static size_t in_elems(const struct call *c)
{
    size_t n = c->ci.nranks > 0 ? (size_t)c->ci.nranks : 0;
    switch (c->coll) {
    case C_REDUCE_SCATTER:
    case C_ALL_TO_ALL: return n * c->count;
    case C_RECV: return 0;
    case C_BROADCAST: return c->ci.rank == c->root ? c->count : 0; /* sendbuff is read on the root only */
    default: return c->count;
    }
}

static size_t out_elems(const struct call *c)
{
    size_t n = c->ci.nranks > 0 ? (size_t)c->ci.nranks : 0;
    switch (c->coll) {
    case C_ALL_GATHER:
    case C_ALL_TO_ALL: return n * c->count;
    case C_SEND: return 0;
    default: return c->count;
    }
}

/* Selection of an interposed tensor: an item of PROBE_CAPTURE whose glob
 * contains `nccl` and matches path, with its step/branch/block selectors
 * (capture/taps.c). */
static int nccl_selected(const struct call *c, const char *path, int64_t step, int64_t branch)
{
    return shim_select_interposed(path, step, branch, c->in_scope ? c->sc.block : -1, "nccl",
                                        shim_scope_may_be_last(&c->sc, SHIM_COUNT_NCCL, c->k));
}

static void make_path(const struct call *c, const char *operand, char *buf, size_t cap)
{
    if (c->in_scope)
        snprintf(buf, cap, "/%s/%04lld/nccl.%04lld.%s.%s", c->sc.component, (long long)c->sc.call,
                 (long long)c->k, coll_name[c->coll], operand);
    else
        snprintf(buf, cap, "/nccl/%04lld/%s.%s", (long long)c->k, coll_name[c->coll], operand);
}

/* probe.op JSON of the call (shared convention #4, NCCL flavour). */
static char *op_json(const struct call *c)
{
    struct shim_json b;
    shim_json_init(&b);
    shim_json_printf(&b, "{\"op\":\"nccl\",\"coll\":\"%s\",\"api\":\"%s\",\"count\":%zu,",
                     coll_name[c->coll], c->api, c->count);
    shim_json_raw(&b, "\"datatype\":");
    shim_json_string(&b, probe_dtype_name(map_dtype(c->dt)));
    if (c->op >= 0) {
        if (c->op < NCCL_NUM_OPS)
            shim_json_printf(&b, ",\"redop\":\"%s\"", redop_name[c->op]);
        else
            shim_json_printf(&b, ",\"redop\":\"custom:%d\"", c->op);
    }
    if (c->root >= 0)
        shim_json_printf(&b, ",\"root\":%d", c->root);
    if (c->peer >= 0)
        shim_json_printf(&b, ",\"peer\":%d", c->peer);
    shim_json_printf(&b, ",\"rank\":%d,\"nranks\":%d,\"comm\":\"c%d\",\"in_place\":%s",
                     c->ci.rank, c->ci.nranks, c->ci.order,
                     c->send == c->recv && c->send ? "true" : "false");
    shim_json_raw(&b, ",\"operands\":{");
    int first = 1;
    const char *names[2] = {"in", "out"};
    const char *paths[2] = {c->sel_in ? c->path_in : NULL, c->sel_out ? c->path_out : NULL};
    for (int i = 0; i < 2; ++i) {
        if (!paths[i])
            continue;
        shim_json_printf(&b, "%s\"%s\":", first ? "" : ",", names[i]);
        shim_json_string(&b, strrchr(paths[i], '/') + 1);
        first = 0;
    }
    shim_json_raw(&b, "}}");
    if (b.oom) {
        shim_json_free(&b);
        return NULL;
    }
    return b.p;
}

/* Hand one operand to the tap path as a 1-D device tensor on the call's
 * stream. A failure turns NCCL captures off with one line. */
static void capture_operand(const struct call *c, const char *operand, const void *data,
                            size_t elems)
{
    if (atomic_load(&captures_off))
        return;
    const char *path = operand[0] == 'i' ? c->path_in : c->path_out;
    probe_dtype dt = map_dtype(c->dt);
    if (dt == PROBE_DTYPE_INVALID || c->ci.device < 0 || c->ci.nranks <= 0) {
        char why[SHIM_REASON_MAX];
        snprintf(why, sizeof why, "%s: %s", c->api,
                 dt == PROBE_DTYPE_INVALID ? "datatype is not one probe knows"
                                           : "NCCL did not report the communicator's device or size");
        if (shim_file_open() == PROBE_OK)
            shim_tap_skip_path(path, why);
        return;
    }
    char comp[SHIM_NAME_MAX], slot[SHIM_NAME_MAX];
    const char *last = strrchr(path, '/');
    snprintf(slot, sizeof slot, "%s", last + 1);
    snprintf(comp, sizeof comp, "%s", c->in_scope ? c->sc.component : "nccl");
    int64_t shape[1] = {(int64_t)elems};
    probe_tap_tensor_v1 t;
    shim_tap_operand(&t, comp, slot, c->in_scope ? c->sc.call : c->k, c->in_scope ? c->sc.step : -1,
                     c->in_scope ? c->sc.cfg_branch : -1, c->ci.device, (int32_t)dt, 1, shape, NULL,
                     data, c->stream);
    if (c->in_scope)
        shim_tap_operand_nesting(&t, &c->sc);
    char *json = op_json(c);
    /* selected by nccl_selected; json becomes the dataset's probe.op attribute */
    int st = shim_tap_capture(&t, json, 0);
    free(json);
    if (st != PROBE_OK && atomic_exchange(&captures_off, 1) == 0)
        shim_warn("capture of %s failed: %s; NCCL operands are no longer captured, the run continues",
                  path, probe_last_error());
}

/* Before forwarding: decide whether the call is recorded, take its index,
 * count it, select its operands, and capture an in-place input. */
static void before(struct call *c)
{
    c->active = 0;
    if (in_hook || in_nccl || shim_cfg.mode != SHIM_OWNER || shim_is_foreign_process() || shim_closed())
        return;
    in_hook = 1;
    c->active = 1;
    c->ci = comm_of(c->comm);
    int expect = -1;
    atomic_compare_exchange_strong(&first_rank, &expect, c->ci.rank);
    expect = -1;
    atomic_compare_exchange_strong(&first_nranks, &expect, c->ci.nranks);
    c->in_scope = shim_scope_current(&c->sc);
    c->k = shim_scope_next(SHIM_COUNT_NCCL);
    size_t es = probe_dtype_size(map_dtype(c->dt));
    size_t bytes_elems = c->coll == C_RECV ? out_elems(c) : in_elems(c);
    if (c->coll == C_BROADCAST)
        bytes_elems = c->count;
    count_call(c->in_scope ? c->sc.component : "nccl", c->coll, (unsigned long long)(bytes_elems * es));
    int64_t step = c->in_scope ? c->sc.step : -1, br = c->in_scope ? c->sc.cfg_branch : -1;
    make_path(c, "in", c->path_in, sizeof c->path_in);
    make_path(c, "out", c->path_out, sizeof c->path_out);
    c->sel_in = in_elems(c) > 0 && nccl_selected(c, c->path_in, step, br);
    c->sel_out = out_elems(c) > 0 && nccl_selected(c, c->path_out, step, br);
    if ((c->sel_in || c->sel_out) && !shim_tap_process_captures())
        c->sel_in = c->sel_out = 0;
    c->in_done = 0;
    if (c->sel_in && c->send && c->send == c->recv) {
        capture_operand(c, "in", c->send, in_elems(c));
        c->in_done = 1;
    }
    in_hook = 0;
}

static void skip_selected(const struct call *c, const char *why)
{
    char reason[SHIM_REASON_MAX];
    snprintf(reason, sizeof reason, "%s: %s", c->api, why);
    if (shim_file_open() != PROBE_OK)
        return;
    if (c->sel_in && !c->in_done)
        shim_tap_skip_path(c->path_in, reason);
    if (c->sel_out)
        shim_tap_skip_path(c->path_out, reason);
}

/* The call's operations are enqueued (result ncclSuccess): capture what
 * was selected. */
static void complete(const struct call *c, nccl_result r, const char *when)
{
    if (!(c->sel_in || c->sel_out))
        return;
    if (r == NCCL_IN_PROGRESS) {
        char why[160];
        snprintf(why, sizeof why, "%s returned ncclInProgress (non-blocking communicator): not captured",
                 when);
        skip_selected(c, why);
        pthread_mutex_lock(&count_lock);
        ++inprogress_skips;
        pthread_mutex_unlock(&count_lock);
        return;
    }
    if (r != NCCL_OK)
        return; /* nothing was enqueued: nothing to capture */
    if (c->sel_in && !c->in_done)
        capture_operand(c, "in", c->send, in_elems(c));
    if (c->sel_out)
        capture_operand(c, "out", c->recv, out_elems(c));
}

/* After forwarding. Inside a group: queue the call (its copies wait for
 * the outermost ncclGroupEnd); else capture now. */
static void after(struct call *c, nccl_result r)
{
    if (!c->active)
        return;
    in_hook = 1;
    if (r != NCCL_OK && r != NCCL_IN_PROGRESS) {
        pthread_mutex_lock(&count_lock);
        ++failed_calls;
        pthread_mutex_unlock(&count_lock);
    }
    if (group_depth > 0) {
        if ((r == NCCL_OK || r == NCCL_IN_PROGRESS) && (c->sel_in || c->sel_out)) {
            if (group_n == group_cap) {
                size_t cap = group_cap ? group_cap * 2 : 16;
                struct call *q = realloc(group_q, cap * sizeof *q);
                if (!q) {
                    skip_selected(c, "out of memory while queueing the call inside a group");
                    in_hook = 0;
                    return;
                }
                group_q = q;
                group_cap = cap;
            }
            group_q[group_n++] = *c;
        }
    } else {
        complete(c, r, c->api);
    }
    in_hook = 0;
}

/* ---- hooks ------------------------------------------------------------- */

typedef nccl_result (*fn_red)(const void *, void *, size_t, int, int, void *, void *);
typedef nccl_result (*fn_gather)(const void *, void *, size_t, int, void *, void *);
typedef nccl_result (*fn_bcast)(void *, size_t, int, int, void *, void *);
typedef nccl_result (*fn_send)(const void *, size_t, int, int, void *, void *);

#define FORWARD(F, TYPE, ...)                                                                       \
    do {                                                                                           \
        TYPE f;                                                                                    \
        *(void **)&f = real(F);                                                                    \
        if (!f)                                                                                    \
            return NCCL_INTERNAL_ERROR;                                                           \
        before(&c);                                                                                \
        ++in_nccl;                                                                                 \
        nccl_result r = f(__VA_ARGS__);                                                            \
        --in_nccl;                                                                                 \
        after(&c, r);                                                                              \
        return r;                                                                                  \
    } while (0)

#define CALL_INIT(COLL, API, SEND, RECV, COUNT, DT, OP, ROOT, PEER, COMM, STREAM)                   \
    struct call c;                                                                                 \
    memset(&c, 0, sizeof c);                                                                       \
    c.coll = COLL, c.api = API, c.send = SEND, c.recv = RECV, c.count = COUNT, c.dt = DT,          \
    c.op = OP, c.root = ROOT, c.peer = PEER, c.comm = COMM, c.stream = STREAM

SHIM_EXPORT nccl_result ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                                      int op, void *comm, void *stream)
{
    CALL_INIT(C_ALL_REDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, -1, -1, comm,
              stream);
    FORWARD(F_ALL_REDUCE, fn_red,
            sendbuff, recvbuff, count, datatype, op, comm, stream);
}

SHIM_EXPORT nccl_result ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      int datatype, void *comm, void *stream)
{
    CALL_INIT(C_ALL_GATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, -1, -1, -1,
              comm, stream);
    FORWARD(F_ALL_GATHER, fn_gather, sendbuff,
            recvbuff, sendcount, datatype, comm, stream);
}

SHIM_EXPORT nccl_result ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          int datatype, int op, void *comm, void *stream)
{
    CALL_INIT(C_REDUCE_SCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, -1,
              -1, comm, stream);
    FORWARD(F_REDUCE_SCATTER, fn_red,
            sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

SHIM_EXPORT nccl_result ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                                      int root, void *comm, void *stream)
{
    CALL_INIT(C_BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, -1, root, -1, comm,
              stream);
    FORWARD(F_BROADCAST, fn_red,
            sendbuff, recvbuff, count, datatype, root, comm, stream);
}

/* Legacy in-place broadcast: buff is both input (on the root) and output. */
SHIM_EXPORT nccl_result ncclBcast(void *buff, size_t count, int datatype, int root, void *comm,
                                  void *stream)
{
    CALL_INIT(C_BROADCAST, "ncclBcast", buff, buff, count, datatype, -1, root, -1, comm, stream);
    FORWARD(F_BCAST, fn_bcast, buff, count, datatype,
            root, comm, stream);
}

SHIM_EXPORT nccl_result ncclSend(const void *sendbuff, size_t count, int datatype, int peer, void *comm,
                                 void *stream)
{
    CALL_INIT(C_SEND, "ncclSend", sendbuff, NULL, count, datatype, -1, -1, peer, comm, stream);
    FORWARD(F_SEND, fn_send, sendbuff, count,
            datatype, peer, comm, stream);
}

SHIM_EXPORT nccl_result ncclRecv(void *recvbuff, size_t count, int datatype, int peer, void *comm,
                                 void *stream)
{
    CALL_INIT(C_RECV, "ncclRecv", NULL, recvbuff, count, datatype, -1, -1, peer, comm, stream);
    FORWARD(F_RECV, fn_bcast, recvbuff, count,
            datatype, peer, comm, stream);
}

SHIM_EXPORT nccl_result ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                                     void *comm, void *stream)
{
    CALL_INIT(C_ALL_TO_ALL, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, -1, -1, -1, comm,
              stream);
    FORWARD(F_ALL_TO_ALL, fn_gather, sendbuff,
            recvbuff, count, datatype, comm, stream);
}

SHIM_EXPORT nccl_result ncclGroupStart(void)
{
    nccl_result (*f)(void);
    *(void **)&f = real(F_GROUP_START);
    if (!f)
        return NCCL_INTERNAL_ERROR;
    nccl_result r = f();
    if (r == NCCL_OK && !in_hook && !in_nccl)
        ++group_depth;
    return r;
}

/* NCCL leaves the group whatever GroupEnd returns; after the outermost one
 * the queued calls' copies are enqueued (ncclSuccess), recorded as skipped
 * (ncclInProgress) or dropped (an error: nothing was enqueued). */
SHIM_EXPORT nccl_result ncclGroupEnd(void)
{
    nccl_result (*f)(void);
    *(void **)&f = real(F_GROUP_END);
    if (!f)
        return NCCL_INTERNAL_ERROR;
    nccl_result r = f();
    if (in_hook || in_nccl)
        return r;
    if (group_depth > 0 && --group_depth == 0) {
        in_hook = 1;
        if (group_n > 0 && !shim_is_foreign_process()) {
            pthread_mutex_lock(&count_lock);
            ++groups_done;
            pthread_mutex_unlock(&count_lock);
        }
        for (size_t i = 0; i < group_n; ++i)
            if (!shim_is_foreign_process() && !shim_closed())
                complete(&group_q[i], r, "ncclGroupEnd");
        free(group_q);
        group_q = NULL;
        group_n = group_cap = 0;
        in_hook = 0;
    }
    return r;
}

/* ---- manifest ------------------------------------------------------------ */

/* ,"nccl":{"rank":r,"nranks":n,"communicators":N,"groups":G,
 *  "in_progress_skips":S,"failed_calls":F,
 *  "calls":{"<component>":{"<op>":{"count":c,"bytes":b},...},...}}
 * when NCCL was called. bytes: this rank's input buffer (recv: its output). */
void shim_nccl_json(struct shim_json *b)
{
    pthread_mutex_lock(&count_lock);
    if (ncounts > 0) {
        pthread_mutex_lock(&comm_lock);
        int nc = ncomms;
        pthread_mutex_unlock(&comm_lock);
        shim_json_printf(b,
                         ",\"nccl\":{\"rank\":%d,\"nranks\":%d,\"communicators\":%d,\"groups\":%llu,"
                         "\"in_progress_skips\":%llu,\"failed_calls\":%llu,\"calls\":{",
                         atomic_load(&first_rank), atomic_load(&first_nranks), nc, groups_done,
                         inprogress_skips, failed_calls);
        for (int i = 0; i < ncounts; ++i) {
            shim_json_raw(b, i ? "," : "");
            shim_json_string(b, counts[i].component);
            shim_json_raw(b, ":{");
            int first = 1;
            for (int k = 0; k < C_COUNT; ++k) {
                if (!counts[i].count[k])
                    continue;
                shim_json_printf(b, "%s\"%s\":{\"count\":%llu,\"bytes\":%llu}", first ? "" : ",",
                                 coll_name[k], counts[i].count[k], counts[i].bytes[k]);
                first = 0;
            }
            shim_json_raw(b, "}");
        }
        shim_json_raw(b, "}}");
    }
    pthread_mutex_unlock(&count_lock);
}
