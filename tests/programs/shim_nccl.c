/* shim_nccl.c - NCCL collectives through the shim's hooks (intercept/hooks/nccl.c)
 * against a CPU fake of NCCL (tests/fakes/fake_nccl.c, soname libnccl.so.2)
 * and the mock CUDA runtime (tests/fakes/mock_cudart.c), both built by
 * tests/e2e/test_nccl_fake.py.
 *
 * usage: shim_nccl MOCK_CUDART FAKE_NCCL global|local EXPECT_LOG
 *   global  the fake is loaded RTLD_GLOBAL (the shim finds it by RTLD_NEXT)
 *   local   RTLD_LOCAL, as torch loads NCCL (the shim must use
 *           dlopen("libnccl.so.2", RTLD_NOLOAD))
 * The program simulates rank 1 of 4 on device 0 and makes, in this order
 * (k = the index of the call outside any scope):
 *   k0  AllReduce f32 sum, 64, legacy stream      in[j] = 0 + j/4
 *   k1  AllGather bf16, 32 -> 128, private stream in[j] = 0x3f80 + j (raw)
 *   k2  ReduceScatter f32 sum, 64 -> 16           in[j] = 2 + j/4
 *   k3  Broadcast f32, root 1 (this rank), 8      in[j] = 3 + j/4
 *   k4  AllReduce f32 sum in place, 16            buf[j] = 4 + j/4
 *   k5  GroupStart; Send f32 8 to peer 2 (in[j] = 5 + j/4); k6 Recv f32 8
 *       from peer 0; GroupEnd
 *   k7  GroupStart; GroupStart; AllGather f32 4 -> 16 (in[j] = 7 + j/4);
 *       GroupEnd; k8 AlltoAll int32 2 (in[j] = 3j + 1, 8 elements); GroupEnd
 *   k9  AllReduce with datatype 99: must return ncclInvalidArgument (4)
 *   k10 GroupStart; AllReduce f32 8 (in[j] = 10 + j/4); GroupEnd returning
 *       ncclInProgress (7): recorded as skipped
 *   inside scope dit.step call 3 step 1 branch 1:
 *       nccl.0000 AllReduce f32 8 (in[j] = 20 + j/4);
 *       nccl.0001 Bcast in place, root 0 (not this rank), 8
 *   a forked child makes one AllReduce (result checked, nothing captured)
 *   k11 AllReduce f32 8 (in[j] = 11 + j/4)
 * Receive buffers start as 0xAB bytes, so a copy made before the fake ran
 * the collective (inside a group: at the outermost GroupEnd) is visible.
 * Each call's arguments go to EXPECT_LOG in the fake's log format; every
 * result is checked against the fake's semantics. "FAIL ..." per broken
 * expectation; exit 0 when there is none. Results are checked after a
 * stream sync (event record + synchronize): the fake writes them in stream
 * order. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe/tap.h"

typedef int (*fn_red)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*fn_gather)(const void *, void *, size_t, int, void *, void *);
typedef int (*fn_bcast)(void *, size_t, int, int, void *, void *);
typedef int (*fn_send)(const void *, size_t, int, int, void *, void *);
typedef int (*fn_void)(void);

static void *lib;
static int (*ev_create)(void **, unsigned), (*ev_record)(void *, void *), (*ev_sync)(void *);

/* Wait until everything enqueued on stream s has run (the fake writes its
 * results in stream order through the mock runtime). */
static void sync_s(void *s)
{
    void *e = NULL;
    if (ev_create(&e, 0) != 0 || ev_record(e, s) != 0 || ev_sync(e) != 0)
        printf("FAIL stream sync\n");
}
static FILE *expect;
static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        printf("\n");                                                                              \
        ++failures;                                                                                \
    } while (0)

/* What a call through the global scope reaches: the shim's hook when it is
 * preloaded, else the fake (from its handle when it was loaded RTLD_LOCAL). */
static void *sym(const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (!p)
        p = dlsym(lib, name);
    if (!p) {
        printf("FAIL symbol %s not found\n", name);
        exit(1);
    }
    return p;
}

static float *fbuf(size_t n, float base)
{
    float *p = malloc(n * sizeof *p);
    for (size_t j = 0; j < n; ++j)
        p[j] = base + (float)j * 0.25f;
    return p;
}

static void *poison(size_t bytes)
{
    void *p = malloc(bytes);
    memset(p, 0xAB, bytes);
    return p;
}

static void check_f(const char *what, const float *got, size_t n, float scale, const float *in)
{
    for (size_t j = 0; j < n; ++j)
        if (got[j] != scale * in[j]) {
            FAIL("%s[%zu] = %g, expected %g", what, j, (double)got[j], (double)(scale * in[j]));
            return;
        }
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: shim_nccl MOCK_CUDART FAKE_NCCL global|local EXPECT_LOG\n");
        return 2;
    }
    if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
        printf("FAIL dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    int local = strcmp(argv[3], "local") == 0;
    lib = dlopen(argv[2], RTLD_NOW | (local ? RTLD_LOCAL : RTLD_GLOBAL));
    if (!lib) {
        printf("FAIL dlopen %s: %s\n", argv[2], dlerror());
        return 1;
    }
    expect = fopen(argv[4], "w");
    void *(*mkcomm)(int, int, int) = (void *(*)(int, int, int))dlsym(lib, "fake_nccl_comm");
    void (*ge_result)(int) = (void (*)(int))dlsym(lib, "fake_nccl_group_end_result");
    int (*mkstream)(void **, unsigned) =
        (int (*)(void **, unsigned))dlsym(RTLD_DEFAULT, "cudaStreamCreateWithFlags");
    fn_red allreduce = (fn_red)sym("ncclAllReduce"), reducescatter = (fn_red)sym("ncclReduceScatter"),
           broadcast = (fn_red)sym("ncclBroadcast");
    fn_gather allgather = (fn_gather)sym("ncclAllGather"), alltoall = (fn_gather)sym("ncclAlltoAll");
    fn_bcast bcast = (fn_bcast)sym("ncclBcast"), recv = (fn_bcast)sym("ncclRecv");
    fn_send send = (fn_send)sym("ncclSend");
    fn_void gstart = (fn_void)sym("ncclGroupStart"), gend = (fn_void)sym("ncclGroupEnd");
    int (*scope_enter)(const probe_scope_v1 *) =
        (int (*)(const probe_scope_v1 *))dlsym(RTLD_DEFAULT, "probe_scope_enter_v1");
    int (*scope_exit)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "probe_scope_exit_v1");
    int (*flush)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "probe_tap_flush_v1");
    *(void **)&ev_create = dlsym(RTLD_DEFAULT, "cudaEventCreateWithFlags");
    *(void **)&ev_record = dlsym(RTLD_DEFAULT, "cudaEventRecord");
    *(void **)&ev_sync = dlsym(RTLD_DEFAULT, "cudaEventSynchronize");
    if (!mkcomm || !ge_result || !mkstream || !ev_create || !ev_record || !ev_sync) {
        printf("FAIL fake/mock helpers missing\n");
        return 1;
    }
    void *comm = mkcomm(1, 4, 0);
    void *stream = NULL;
    if (mkstream(&stream, 1) != 0)
        FAIL("cudaStreamCreateWithFlags");
    int r;

    /* k0 */
    float *a0 = fbuf(64, 0), *o0 = poison(64 * 4);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)a0, (void *)o0, 64, 7, 0, comm, NULL);
    if ((r = allreduce(a0, o0, 64, 7, 0, comm, NULL)) != 0)
        FAIL("k0 rc %d", r);
    sync_s(NULL);
    check_f("k0 out", o0, 64, 4, a0);
    /* k1: bf16 raw */
    uint16_t *a1 = malloc(32 * 2), *o1 = poison(128 * 2);
    for (int j = 0; j < 32; ++j)
        a1[j] = (uint16_t)(0x3f80 + j);
    fprintf(expect, "AllGather %p %p %d %d %p %p depth=0\n", (void *)a1, (void *)o1, 32, 9, comm, stream);
    if ((r = allgather(a1, o1, 32, 9, comm, stream)) != 0)
        FAIL("k1 rc %d", r);
    sync_s(stream);
    for (int j = 0; j < 128; ++j)
        if (o1[j] != a1[j % 32]) {
            FAIL("k1 out[%d]", j);
            break;
        }
    /* k2 */
    float *a2 = fbuf(64, 2), *o2 = poison(16 * 4);
    fprintf(expect, "ReduceScatter %p %p %d %d %d %p %p depth=0\n", (void *)a2, (void *)o2, 16, 7, 0, comm, NULL);
    if ((r = reducescatter(a2, o2, 16, 7, 0, comm, NULL)) != 0)
        FAIL("k2 rc %d", r);
    sync_s(NULL);
    check_f("k2 out", o2, 16, 4, a2 + 16);
    /* k3 */
    float *a3 = fbuf(8, 3), *o3 = poison(8 * 4);
    fprintf(expect, "Broadcast %p %p %d %d %d %p %p depth=0\n", (void *)a3, (void *)o3, 8, 7, 1, comm, NULL);
    if ((r = broadcast(a3, o3, 8, 7, 1, comm, NULL)) != 0)
        FAIL("k3 rc %d", r);
    sync_s(NULL);
    check_f("k3 out", o3, 8, 1, a3);
    /* k4: in place */
    float *b4 = fbuf(16, 4), *orig4 = fbuf(16, 4);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)b4, (void *)b4, 16, 7, 0, comm, NULL);
    if ((r = allreduce(b4, b4, 16, 7, 0, comm, NULL)) != 0)
        FAIL("k4 rc %d", r);
    sync_s(NULL);
    check_f("k4 out", b4, 16, 4, orig4);
    /* k5, k6: a group of send/recv */
    float *a5 = fbuf(8, 5), *o6 = poison(8 * 4);
    fprintf(expect, "Send %p %d %d %d %p %p depth=1\n", (void *)a5, 8, 7, 2, comm, NULL);
    fprintf(expect, "Recv %p %d %d %d %p %p depth=1\n", (void *)o6, 8, 7, 0, comm, NULL);
    if ((r = gstart()) != 0 || (r = send(a5, 8, 7, 2, comm, NULL)) != 0 ||
        (r = recv(o6, 8, 7, 0, comm, NULL)) != 0 || (r = gend()) != 0)
        FAIL("k5/k6 rc %d", r);
    sync_s(NULL);
    for (int j = 0; j < 8; ++j)
        if (o6[j] != (float)j)
            FAIL("k6 out[%d] = %g", j, (double)o6[j]);
    /* k7, k8: nested groups */
    float *a7 = fbuf(4, 7), *o7 = poison(16 * 4);
    int32_t *a8 = malloc(8 * 4), *o8 = poison(8 * 4);
    for (int j = 0; j < 8; ++j)
        a8[j] = 3 * j + 1;
    fprintf(expect, "AllGather %p %p %d %d %p %p depth=2\n", (void *)a7, (void *)o7, 4, 7, comm, stream);
    fprintf(expect, "AlltoAll %p %p %d %d %p %p depth=1\n", (void *)a8, (void *)o8, 2, 2, comm, stream);
    if ((r = gstart()) != 0 || (r = gstart()) != 0 || (r = allgather(a7, o7, 4, 7, comm, stream)) != 0 ||
        (r = gend()) != 0)
        FAIL("k7 rc %d", r);
    if (((uint32_t *)o7)[0] != 0xABABABABu)
        FAIL("k7 ran before the outermost GroupEnd");
    if ((r = alltoall(a8, o8, 2, 2, comm, stream)) != 0 || (r = gend()) != 0)
        FAIL("k8 rc %d", r);
    sync_s(stream);
    for (int j = 0; j < 16; ++j)
        if (o7[j] != a7[j % 4])
            FAIL("k7 out[%d]", j);
    if (memcmp(o8, a8, 32) != 0)
        FAIL("k8 out");
    /* k9: an error result passes through */
    float *a9 = fbuf(8, 9), *o9 = poison(32);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)a9, (void *)o9, 8, 99, 0, comm, NULL);
    if ((r = allreduce(a9, o9, 8, 99, 0, comm, NULL)) != 4)
        FAIL("k9 rc %d, expected ncclInvalidArgument (4)", r);
    /* k10: GroupEnd returns ncclInProgress */
    float *a10 = fbuf(8, 10), *o10 = poison(32);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=1\n", (void *)a10, (void *)o10, 8, 7, 0, comm, NULL);
    ge_result(7);
    if ((r = gstart()) != 0 || (r = allreduce(a10, o10, 8, 7, 0, comm, NULL)) != 0)
        FAIL("k10 rc %d", r);
    if ((r = gend()) != 7)
        FAIL("k10 GroupEnd rc %d, expected ncclInProgress (7)", r);
    /* inside a scope */
    float *a20 = fbuf(8, 20), *o20 = poison(32), *b21 = poison(32);
    if (scope_enter) {
        probe_scope_v1 sc = {.struct_size = sizeof sc, .abi_version = PROBE_TAP_ABI_VERSION,
                             .component = "dit.step", .call = 3, .step = 1, .cfg_branch = 1};
        if (scope_enter(&sc) != 0)
            FAIL("probe_scope_enter_v1");
    }
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)a20, (void *)o20, 8, 7, 0, comm, NULL);
    fprintf(expect, "Bcast %p %d %d %d %p %p depth=0\n", (void *)b21, 8, 7, 0, comm, NULL);
    /* the fake's Bcast goes on to the exported ncclBroadcast, as NCCL's does */
    fprintf(expect, "Broadcast %p %p %d %d %d %p %p depth=0\n", (void *)b21, (void *)b21, 8, 7, 0, comm,
            NULL);
    if ((r = allreduce(a20, o20, 8, 7, 0, comm, NULL)) != 0 || (r = bcast(b21, 8, 7, 0, comm, NULL)) != 0)
        FAIL("scope rc %d", r);
    sync_s(NULL);
    check_f("scope all_reduce", o20, 8, 4, a20);
    for (int j = 0; j < 8; ++j)
        if (b21[j] != (float)j)
            FAIL("scope bcast[%d] = %g", j, (double)b21[j]);
    if (scope_exit && scope_exit() != 0)
        FAIL("probe_scope_exit_v1");
    /* a forked child calls NCCL: forwarded, never captured */
    float *a30 = fbuf(8, 30), *o30 = poison(32);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)a30, (void *)o30, 8, 7, 0, comm, NULL);
    fflush(expect);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* the mock runtime's worker thread does not exist here: only the
         * result code is checked */
        _exit(allreduce(a30, o30, 8, 7, 0, comm, NULL) == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAIL("forked child's all_reduce (status %d)", status);
    /* k11 */
    float *a11 = fbuf(8, 11), *o11 = poison(32);
    fprintf(expect, "AllReduce %p %p %d %d %d %p %p depth=0\n", (void *)a11, (void *)o11, 8, 7, 0, comm, NULL);
    if ((r = allreduce(a11, o11, 8, 7, 0, comm, NULL)) != 0)
        FAIL("k11 rc %d", r);
    sync_s(NULL);
    check_f("k11 out", o11, 8, 4, a11);
    fclose(expect);
    if (flush && flush() != 0)
        FAIL("probe_tap_flush_v1");
    printf("%s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
