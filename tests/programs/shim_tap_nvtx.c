/* shim_tap_nvtx.c - NVTX ranges (header-only nvtx3 API, as torch uses it)
 * around taps: default-domain push/pop (ASCII, wide, Ex), a named domain
 * with ASCII and registered-string messages, interleaved domain pops, names
 * longer than probe keeps, a cut inside a UTF-8 character, a stack deeper
 * than probe keeps, a scope longer than 511 bytes, a pop without a push,
 * marks, and a second thread with its own stack.
 *
 * Tap i is /nvtx/<i:04>/out (float32 [2] = {i, -i}); the scope each must
 * carry is listed in tests/e2e/test_shim_nvtx.py. Exit 0 when every tap
 * returned 0.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <wchar.h>

#include <nvtx3/nvToolsExt.h>

#include "probe/dtype.h"
#include "probe/tap.h"
#include "tap_client.h"

typedef int (*tap_fn)(const probe_tap_tensor_v1 *);
static tap_fn tap;
static int failures;

static void tap_i(int i)
{
    float v[2] = {(float)i, (float)-i};
    int64_t shape[1] = {2};
    probe_tap_tensor_v1 t = tap_desc("nvtx", i, -1);
    t.dtype = PROBE_DTYPE_FLOAT32;
    t.rank = 1;
    t.shape = shape;
    t.data = v;
    if (tap(&t) != 0)
        ++failures;
}

static nvtxEventAttributes_t ascii_attr(const char *msg)
{
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = msg;
    return a;
}

static void *worker(void *arg)
{
    (void)arg;
    nvtxRangePushA("worker");
    tap_i(15);
    nvtxRangePop();
    return NULL;
}

int main(void)
{
    tap = (tap_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_tap_v1");
    if (!tap) {
        fprintf(stderr, "probe_tap_v1 not found: is libprobe_intercept.so preloaded?\n");
        return 2;
    }
    tap_i(0);
    nvtxRangePushA("outer");
    tap_i(1);
    nvtxDomainHandle_t dom = nvtxDomainCreateA("probe-test");
    nvtxStringHandle_t reg = nvtxDomainRegisterStringA(dom, "registered step");
    nvtxEventAttributes_t a = ascii_attr("denoise_step 3");
    nvtxDomainRangePushEx(dom, &a);
    tap_i(2);
    nvtxEventAttributes_t b = ascii_attr(NULL);
    b.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    b.message.registered = reg;
    nvtxDomainRangePushEx(dom, &b);
    tap_i(3);
    nvtxRangePushW(L"wide \u00e9\U0001F600");
    tap_i(4);
    nvtxDomainRangePop(dom); /* closes "registered step", the innermost of dom */
    tap_i(5);
    nvtxRangePop(); /* closes the wide one, the innermost of the default domain */
    tap_i(6);
    nvtxDomainRangePop(dom);
    nvtxMarkA("a mark changes nothing");
    nvtxEventAttributes_t e = ascii_attr("ex range");
    nvtxRangePushEx(&e);
    tap_i(7);
    nvtxRangePop();
    nvtxRangePop();
    tap_i(8);

    char longname[301];
    memset(longname, 'x', 300);
    longname[300] = '\0';
    nvtxRangePushA(longname); /* kept: the first 127 bytes */
    tap_i(9);
    nvtxRangePop();

    char utf[130];
    memset(utf, 'a', 126);
    memcpy(utf + 126, "\xc3\xa9", 3); /* 126 + 2 bytes: the cut at 127 falls inside e-acute */
    nvtxRangePushA(utf);
    tap_i(10);
    nvtxRangePop();

    for (int i = 0; i < 70; ++i) { /* probe keeps 64 levels */
        char n[16];
        snprintf(n, sizeof n, "d%d", i);
        nvtxRangePushA(n);
    }
    tap_i(11);
    for (int i = 0; i < 70; ++i)
        nvtxRangePop();
    tap_i(12);
    nvtxRangePop(); /* pop without push: ignored */
    tap_i(13);

    for (int i = 0; i < 10; ++i) { /* 10 x 100 bytes: the scope is cut at 511 bytes */
        char n[101];
        memset(n, 'A' + i, 100);
        n[100] = '\0';
        nvtxRangePushA(n);
    }
    tap_i(14);
    for (int i = 0; i < 10; ++i)
        nvtxRangePop();

    nvtxRangePushA("main only");
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_join(th, NULL);
    tap_i(16);
    nvtxRangePop();
    tap_i(17);
    /* two more mapped ranges: PROBE_NVTX_SCOPES' default maps "denoise_step *" */
    nvtxRangePushA("denoise_step 7");
    nvtxRangePop();
    nvtxRangePushA("denoise_step 8");
    nvtxRangePop();

    /* the scope ABI: bad descriptors are refused, a stray exit is an error */
    typedef int (*enter_fn)(const probe_scope_v1 *);
    typedef int (*exit_fn)(void);
    enter_fn enter = (enter_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_scope_enter_v1");
    exit_fn leave = (exit_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "probe_scope_exit_v1");
    if (!enter || !leave) {
        fprintf(stderr, "probe_scope_enter_v1/exit_v1 not exported\n");
        return 2;
    }
    probe_scope_v1 sc = {.struct_size = sizeof sc, .abi_version = PROBE_TAP_ABI_VERSION,
                         .component = "dit.step", .call = 3, .step = 1, .cfg_branch = 0};
    int rc_ok = enter(&sc), rc_exit = leave(), rc_stray = leave(), rc_null = enter(NULL);
    sc.component = "a/b";
    int rc_slash = enter(&sc);
    sc.component = "dit.step";
    sc.call = -1;
    int rc_call = enter(&sc);
    sc.call = 0;
    sc.struct_size = 8;
    int rc_size = enter(&sc);
    printf("scope rc ok=%d exit=%d stray=%d null=%d slash=%d call=%d size=%d\n", rc_ok, rc_exit,
           rc_stray, rc_null, rc_slash, rc_call, rc_size);
    printf("nvtx taps done, failures=%d\n", failures);
    return failures ? 1 : 0;
}
