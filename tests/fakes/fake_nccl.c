/* fake_nccl.c - a CPU stand-in for NCCL 2.28 (libnccl.so.2), so the shim's
 * NCCL hooks (intercept/hooks/nccl.c) run and are checked without a GPU. Built by
 * tests/e2e/test_nccl_fake.py with the soname libnccl.so.2 and loaded by
 * tests/programs/shim_nccl.c (RTLD_GLOBAL, or RTLD_LOCAL the way torch
 * loads NCCL, where only dlopen(RTLD_NOLOAD) finds it).
 *
 * Like the real library it defines the profiling entry points pnccl* and
 * the ncclX names as weak aliases of them. One process simulates rank
 * FAKE_NCCL_RANK of FAKE_NCCL_NRANKS ranks that all hold the same input as
 * this one ("device memory" is host memory; the copies go through
 * tests/fakes/mock_cudart.c):
 *   all_reduce      sum: out = nranks * in (float32; other types: in);
 *                   prod/max/min/avg: out = in
 *   all_gather      out[i*count + j] = in[j] for every rank i
 *   reduce_scatter  sum: out[j] = nranks * in[rank*count + j] (float32)
 *   broadcast       out = in on the root; elsewhere out[j] = root*1000 + j (float32)
 *   send            nothing; recv: out[j] = peer*100 + j (float32)
 *   all_to_all      out[i*count + j] = in[i*count + j]
 * As in NCCL, nothing inside ncclGroupStart/End runs until the outermost
 * ncclGroupEnd: the calls are queued and executed there, so a capture taken
 * before that would see the recv buffers' old bytes.
 * Results are written in stream order (see exec_op).
 * Every call appends one line to FAKE_NCCL_LOG (when set) with the
 * arguments it received, so the test can check that the shim forwarded them
 * untouched. A datatype of 99 returns ncclInvalidArgument (4);
 * fake_nccl_group_end_result(r) makes the next outermost ncclGroupEnd return
 * r (e.g. ncclInProgress, 7) after executing the group. Values: nccl.h. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
#define EXPORT __attribute__((visibility("default")))
#define ALIAS(name) __attribute__((weak, alias(#name)))

struct fcomm {
    int magic, rank, nranks, device;
};

enum { AR, AG, RS, BC, SEND, RECV, A2A };
struct qop {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    int dt, op, root, peer;
    struct fcomm *c;
    void *stream;
};

static __thread int depth;
static __thread struct qop queue[256];
static __thread int nq;
static int next_group_end = 0;

static size_t esize(int dt)
{
    static const size_t s[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return dt >= 0 && dt < 12 ? s[dt] : 0;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void logf_(const char *fmt, ...)
{
    const char *p = getenv("FAKE_NCCL_LOG");
    if (!p || !*p)
        return;
    FILE *f = fopen(p, "a");
    if (!f)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

EXPORT struct fcomm *fake_nccl_comm(int rank, int nranks, int device)
{
    struct fcomm *c = calloc(1, sizeof *c);
    c->magic = 0x6e63636c;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    return c;
}

EXPORT void fake_nccl_group_end_result(int r)
{
    next_group_end = r;
}

static struct fcomm *cm(void *c)
{
    return c && ((struct fcomm *)c)->magic == 0x6e63636c ? c : NULL;
}

/* The collective's result for this rank, computed now into a buffer and
 * written to recvbuff in stream order: through the mock runtime's
 * mock_cuda_spin (a "kernel" on the call's stream, after everything already
 * enqueued, e.g. probe's copy of an in-place input), or at once when no mock
 * runtime is loaded. */
static void exec_op(const struct qop *o, const struct fcomm *c)
{
    size_t es = esize(o->dt), n = o->count;
    int R = c->nranks;
    size_t out_n = o->kind == AG || o->kind == A2A ? (size_t)R * n : n;
    if (o->kind == SEND || out_n == 0)
        return;
    float *tmp = malloc(out_n * es);
    float *t = tmp;
    switch (o->kind) {
    case AR:
        memcpy(tmp, o->send, n * es);
        if (o->dt == 7 && o->op == 0)
            for (size_t j = 0; j < n; ++j)
                t[j] *= (float)R;
        break;
    case AG:
        for (int i = 0; i < R; ++i)
            memcpy((char *)tmp + (size_t)i * n * es, o->send, n * es);
        break;
    case RS:
        memcpy(tmp, (const char *)o->send + (size_t)c->rank * n * es, n * es);
        if (o->dt == 7 && o->op == 0)
            for (size_t j = 0; j < n; ++j)
                t[j] *= (float)R;
        break;
    case BC:
        if (c->rank == o->root)
            memcpy(tmp, o->send, n * es);
        else if (o->dt == 7)
            for (size_t j = 0; j < n; ++j)
                t[j] = (float)(o->root * 1000 + (int)j);
        else
            memcpy(tmp, o->recv, n * es);
        break;
    case RECV:
        if (o->dt == 7)
            for (size_t j = 0; j < n; ++j)
                t[j] = (float)(o->peer * 100 + (int)j);
        else
            memcpy(tmp, o->recv, n * es);
        break;
    case A2A: memcpy(tmp, o->send, (size_t)R * n * es); break;
    }
    void (*spin)(void *, int, void *, const void *, size_t);
    *(void **)&spin = dlsym(RTLD_DEFAULT, "mock_cuda_spin");
    if (spin)
        spin(o->stream, 0, o->recv, tmp, out_n * es);
    else
        memcpy(o->recv, tmp, out_n * es);
    free(tmp);
}

static ncclResult_t submit(struct qop o, void *comm, void *stream)
{
    o.stream = stream;
    struct fcomm *c = cm(comm);
    if (!c)
        return 4;
    if (o.dt == 99 || !esize(o.dt))
        return 4; /* ncclInvalidArgument */
    o.c = c;
    if (depth > 0) {
        if (nq == 256)
            return 3;
        queue[nq++] = o;
        return 0;
    }
    exec_op(&o, c);
    return 0;
}

#define LOG_CALL(name, ...) logf_(name " " __VA_ARGS__)

EXPORT ncclResult_t pncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *comm,
                                   void *st)
{
    LOG_CALL("AllReduce", "%p %p %zu %d %d %p %p depth=%d", s, r, n, dt, op, comm, st, depth);
    return submit((struct qop){AR, s, r, n, dt, op, -1, -1}, comm, st);
}
EXPORT ncclResult_t pncclAllGather(const void *s, void *r, size_t n, int dt, void *comm, void *st)
{
    LOG_CALL("AllGather", "%p %p %zu %d %p %p depth=%d", s, r, n, dt, comm, st, depth);
    return submit((struct qop){AG, s, r, n, dt, -1, -1, -1}, comm, st);
}
EXPORT ncclResult_t pncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, void *comm,
                                       void *st)
{
    LOG_CALL("ReduceScatter", "%p %p %zu %d %d %p %p depth=%d", s, r, n, dt, op, comm, st, depth);
    return submit((struct qop){RS, s, r, n, dt, op, -1, -1}, comm, st);
}
EXPORT ncclResult_t pncclBroadcast(const void *s, void *r, size_t n, int dt, int root, void *comm,
                                   void *st)
{
    LOG_CALL("Broadcast", "%p %p %zu %d %d %p %p depth=%d", s, r, n, dt, root, comm, st, depth);
    return submit((struct qop){BC, s, r, n, dt, -1, root, -1}, comm, st);
}
EXPORT ncclResult_t ncclBroadcast(const void *, void *, size_t, int, int, void *, void *);

/* As NCCL's own ncclBcast does (src/collectives.cc): it calls the exported
 * ncclBroadcast, so a preloaded library that defines ncclBroadcast sees this
 * nested call too. */
EXPORT ncclResult_t pncclBcast(void *b, size_t n, int dt, int root, void *comm, void *st)
{
    LOG_CALL("Bcast", "%p %zu %d %d %p %p depth=%d", b, n, dt, root, comm, st, depth);
    return ncclBroadcast(b, b, n, dt, root, comm, st);
}
EXPORT ncclResult_t pncclSend(const void *s, size_t n, int dt, int peer, void *comm, void *st)
{
    LOG_CALL("Send", "%p %zu %d %d %p %p depth=%d", s, n, dt, peer, comm, st, depth);
    return submit((struct qop){SEND, s, NULL, n, dt, -1, -1, peer}, comm, st);
}
EXPORT ncclResult_t pncclRecv(void *r, size_t n, int dt, int peer, void *comm, void *st)
{
    LOG_CALL("Recv", "%p %zu %d %d %p %p depth=%d", r, n, dt, peer, comm, st, depth);
    return submit((struct qop){RECV, NULL, r, n, dt, -1, -1, peer}, comm, st);
}
EXPORT ncclResult_t pncclAlltoAll(const void *s, void *r, size_t n, int dt, void *comm, void *st)
{
    LOG_CALL("AlltoAll", "%p %p %zu %d %p %p depth=%d", s, r, n, dt, comm, st, depth);
    return submit((struct qop){A2A, s, r, n, dt, -1, -1, -1}, comm, st);
}
EXPORT ncclResult_t pncclGroupStart(void)
{
    ++depth;
    LOG_CALL("GroupStart", "depth=%d", depth);
    return 0;
}
EXPORT ncclResult_t pncclGroupEnd(void)
{
    if (depth == 0)
        return 5; /* ncclInvalidUsage */
    --depth;
    LOG_CALL("GroupEnd", "depth=%d", depth);
    if (depth > 0)
        return 0;
    for (int i = 0; i < nq; ++i)
        exec_op(&queue[i], queue[i].c);
    LOG_CALL("GroupExec", "%d", nq);
    nq = 0;
    int r = next_group_end;
    next_group_end = 0;
    return r;
}
EXPORT ncclResult_t pncclCommUserRank(const void *comm, int *rank)
{
    struct fcomm *c = cm((void *)comm);
    if (!c)
        return 4;
    *rank = c->rank;
    return 0;
}
EXPORT ncclResult_t pncclCommCount(const void *comm, int *count)
{
    struct fcomm *c = cm((void *)comm);
    if (!c)
        return 4;
    *count = c->nranks;
    return 0;
}
EXPORT ncclResult_t pncclCommCuDevice(const void *comm, int *dev)
{
    struct fcomm *c = cm((void *)comm);
    if (!c)
        return 4;
    *dev = c->device;
    return 0;
}

EXPORT ncclResult_t ncclAllReduce(const void *, void *, size_t, int, int, void *, void *) ALIAS(pncclAllReduce);
EXPORT ncclResult_t ncclAllGather(const void *, void *, size_t, int, void *, void *) ALIAS(pncclAllGather);
EXPORT ncclResult_t ncclReduceScatter(const void *, void *, size_t, int, int, void *, void *) ALIAS(pncclReduceScatter);
EXPORT ncclResult_t ncclBroadcast(const void *, void *, size_t, int, int, void *, void *) ALIAS(pncclBroadcast);

EXPORT ncclResult_t ncclBcast(void *, size_t, int, int, void *, void *) ALIAS(pncclBcast);
EXPORT ncclResult_t ncclSend(const void *, size_t, int, int, void *, void *) ALIAS(pncclSend);
EXPORT ncclResult_t ncclRecv(void *, size_t, int, int, void *, void *) ALIAS(pncclRecv);
EXPORT ncclResult_t ncclAlltoAll(const void *, void *, size_t, int, void *, void *) ALIAS(pncclAlltoAll);
EXPORT ncclResult_t ncclGroupStart(void) ALIAS(pncclGroupStart);
EXPORT ncclResult_t ncclGroupEnd(void) ALIAS(pncclGroupEnd);
EXPORT ncclResult_t ncclCommUserRank(const void *, int *) ALIAS(pncclCommUserRank);
EXPORT ncclResult_t ncclCommCount(const void *, int *) ALIAS(pncclCommCount);
EXPORT ncclResult_t ncclCommCuDevice(const void *, int *) ALIAS(pncclCommCuDevice);
