/* shim_kernels.c - kernel launches by every route the shim logs
 * (intercept/hooks/kernels.c), against the mock runtime (tests/fakes/mock_cudart.c,
 * libcudart.so.13) and the fake driver (tests/fakes/fake_libcuda.c,
 * libcuda.so.1), both built by tests/e2e/test_kernels.py.
 *
 * usage: shim_kernels CUDART CUDA MODE
 *   main      loads libstdc++ (as torch does: names are demangled), then
 *             launches (counts in the comments; the test checks the manifest):
 *               runtime: cudaLaunchKernel k_a x3, cudaLaunchKernel_ptsz k_a x1,
 *                 __cudaLaunchKernel k_b x2, cudaLaunchKernelExC k_c x1, an
 *                 unnamed k_u x1 (the failed name query must not leave an error
 *                 behind), k_p x2 with an error pending at the first (name
 *                 deferred: 1 unnamed + 1 named, the error still the user's);
 *                 each of these also reaches the fake driver through cudart's
 *                 cuGetProcAddress table (must be counted once);
 *               driver via dlsym(libcuda, "cuLaunchKernel"): d_x x6 (one with an
 *                 empty grid: the error result must pass through);
 *               driver via cuGetProcAddress_v2(flags PTSZ): d_y x2;
 *               driver via cuGetProcAddress (4-argument form) "cuLaunchKernelEx": d_z x1;
 *               driver via dlsym "cuLaunchCooperativeKernel": d_w x1;
 *               "cuGetProcAddress" fetched through cuGetProcAddress_v2, then
 *                 "cuLaunchKernel" through it: d_x x1 (same wrapper as dlsym's);
 *               cudaGetDriverEntryPointByVersion("cuLaunchKernel"): d_v x1;
 *               an unnamed driver function d_u x3 (its name asked once);
 *               4 threads x 1000 cudaLaunchKernel k_a;
 *               when the shim has probe_scope_enter_v1: inside scope
 *                 dit.step call 0: k_a x2 and d_x x1; call 1: d_y x1;
 *               a forked child launches k_f (runtime) and d_f (driver), never
 *                 named: the child must make no name query.
 *             prints "scopes: yes|no".
 *   mangled   no libstdc++: k_a x1 (the name stays mangled).
 * Prints "FAIL ..." for each broken expectation; exit 0 when there is none.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct dim3 {
    unsigned x, y, z;
};
typedef int (*rt_launch_fn)(const void *, struct dim3, struct dim3, void **, size_t, void *);
typedef int (*rt_launch_ex_fn)(const void *, const void *, void **);
typedef int (*drv_launch_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, void *, void **, void **);
typedef int (*drv_launch_ex_fn)(const void *, const void *, void **, void **);
typedef int (*drv_coop_fn)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, unsigned, void *, void **);
typedef int (*gpa_fn)(const char *, void **, int, unsigned long long);
typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);

static int failures;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static char k_a, k_b, k_c, k_u, k_p, k_f, d_x, d_y, d_z, d_w, d_v, d_u, d_f, d_k, k_k;
static rt_launch_fn rt_launch;
static const struct dim3 G = {1, 1, 1}, B = {32, 1, 1};

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        printf("FAIL: no %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

static void *thread_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        rt_launch(&k_a, G, B, NULL, 0, NULL);
    return NULL;
}

typedef struct {
    uint32_t struct_size, abi_version;
    const char *component;
    int64_t call, step;
    int32_t cfg_branch;
} scope_v1;

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: shim_kernels CUDART CUDA main|mangled|local\n");
        return 2;
    }
    const char *mode = argv[3];
    if (!strcmp(mode, "main") && !dlopen("libstdc++.so.6", RTLD_NOW | RTLD_GLOBAL))
        printf("FAIL: libstdc++: %s\n", dlerror());
    /* "local": libstdc++ only as a local library (python's dlopen of torch's extension) */
    if (!strcmp(mode, "local") && !dlopen("libstdc++.so.6", RTLD_NOW | RTLD_LOCAL))
        printf("FAIL: libstdc++: %s\n", dlerror());
    void *drv = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL); /* the driver: never global */
    void *rt = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!drv || !rt) {
        printf("FAIL: dlopen: %s\n", dlerror());
        return 1;
    }
    void (*set_rt_name)(const void *, const char *) = sym(rt, "mock_cuda_set_kernel_name");
    void (*set_drv_name)(const void *, const char *) = sym(drv, "fake_cuda_set_name");
    long long (*drv_launches)(int) = sym(drv, "fake_cuda_launches");
    long long (*rt_launches)(void) = sym(rt, "mock_cuda_kernel_launches");
    void (*set_error)(int) = sym(rt, "mock_cuda_set_last_error");
    int (*get_error)(void) = sym(rt, "cudaGetLastError");
    long long (*drv_queries)(void) = sym(drv, "fake_cuda_name_queries");
    long long (*rt_queries)(void) = sym(rt, "mock_cuda_name_queries");
    /* the hooks: through the global scope, as nvcc's host code binds them */
    rt_launch = (rt_launch_fn)sym(RTLD_DEFAULT, "cudaLaunchKernel");
    rt_launch_fn rt_launch_ptsz = (rt_launch_fn)sym(RTLD_DEFAULT, "cudaLaunchKernel_ptsz");
    rt_launch_fn rt_launch_stub = (rt_launch_fn)sym(RTLD_DEFAULT, "__cudaLaunchKernel");
    rt_launch_ex_fn rt_launch_ex = (rt_launch_ex_fn)sym(RTLD_DEFAULT, "cudaLaunchKernelExC");

    set_rt_name(&k_a, "_Z8kernel_aPfi");
    if (!strcmp(mode, "mangled") || !strcmp(mode, "local")) {
        EXPECT(rt_launch(&k_a, G, B, NULL, 0, NULL) == 0, "launch k_a");
        return failures ? 1 : 0;
    }
    set_rt_name(&k_b, "plain_kernel_b");
    set_rt_name(&k_c, "kernel_c");
    set_rt_name(&k_p, "pending_kernel");
    set_drv_name(&d_x, "triton_poi_fused_add_0");
    set_drv_name(&d_y, "_ZN7cutlass6KernelI4GemmEEvNT_6ParamsE");
    set_drv_name(&d_z, "sm90_xmma_gemm_bf16");
    set_drv_name(&d_w, "coop_kernel");
    set_drv_name(&d_v, "entry_point_kernel");
    set_drv_name(&d_f, "fork_kernel_driver");
    set_rt_name(&k_f, "fork_kernel_runtime");

    /* runtime */
    for (int i = 0; i < 3; i++)
        EXPECT(rt_launch(&k_a, G, B, NULL, 0, NULL) == 0, "cudaLaunchKernel k_a");
    EXPECT(rt_launch_ptsz(&k_a, G, B, NULL, 0, NULL) == 0, "cudaLaunchKernel_ptsz k_a");
    for (int i = 0; i < 2; i++)
        EXPECT(rt_launch_stub(&k_b, G, B, NULL, 0, NULL) == 0, "__cudaLaunchKernel k_b");
    int cfg = 0;
    EXPECT(rt_launch_ex(&cfg, &k_c, NULL) == 0, "cudaLaunchKernelExC k_c");
    EXPECT(rt_launch(&k_u, G, B, NULL, 0, NULL) == 0, "cudaLaunchKernel k_u");
    EXPECT(get_error() == 0, "an unnamed kernel's failed name query left no error behind");
    set_error(700);
    EXPECT(rt_launch(&k_p, G, B, NULL, 0, NULL) == 0, "k_p with an error pending");
    int e = get_error();
    EXPECT(e == 700, "the pending error is still the program's (got %d)", e);
    EXPECT(rt_launch(&k_p, G, B, NULL, 0, NULL) == 0, "k_p");
    EXPECT(get_error() == 0, "no error after k_p");
    EXPECT(rt_launches() == 10, "runtime launches reached the runtime: %lld", rt_launches());
    EXPECT(drv_launches(0) == 9 && drv_launches(2) == 1,
           "runtime launches reached the driver: %lld legacy, %lld ex", drv_launches(0),
           drv_launches(2));

    /* driver */
    drv_launch_fn dl = (drv_launch_fn)sym(drv, "cuLaunchKernel");
    EXPECT(dl != (drv_launch_fn)dlsym(RTLD_NEXT, "fake_cuda_set_name"), "sanity");
    for (int i = 0; i < 5; i++)
        EXPECT(dl(&d_x, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "cuLaunchKernel d_x");
    EXPECT(dl(&d_x, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 1,
           "cuLaunchKernel's error result passes through");
    gpa2_fn gpa2 = (gpa2_fn)sym(drv, "cuGetProcAddress_v2");
    drv_launch_fn dlp = NULL;
    int st = -1;
    EXPECT(gpa2("cuLaunchKernel", (void **)&dlp, 13000, 2, &st) == 0 && dlp && st == 0,
           "cuGetProcAddress_v2 cuLaunchKernel ptsz");
    EXPECT(dlp != dl, "the ptsz entry point is another function");
    long long before = drv_launches(1);
    for (int i = 0; i < 2; i++)
        EXPECT(dlp(&d_y, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "ptsz d_y");
    EXPECT(drv_launches(1) == before + 2, "the ptsz launches reached the ptsz entry point");
    gpa_fn gpa = (gpa_fn)sym(drv, "cuGetProcAddress");
    drv_launch_ex_fn dlx = NULL;
    EXPECT(gpa("cuLaunchKernelEx", (void **)&dlx, 11000, 0) == 0 && dlx, "cuGetProcAddress Ex");
    EXPECT(dlx(&cfg, &d_z, NULL, NULL) == 0, "cuLaunchKernelEx d_z");
    EXPECT(dlx(NULL, &d_z, NULL, NULL) == 1, "cuLaunchKernelEx error passes through");
    drv_coop_fn dc = (drv_coop_fn)sym(drv, "cuLaunchCooperativeKernel");
    EXPECT(dc(&d_w, 1, 1, 1, 32, 1, 1, 0, NULL, NULL) == 0, "cooperative d_w");
    gpa2_fn gpa2b = NULL;
    EXPECT(gpa2("cuGetProcAddress", (void **)&gpa2b, 13000, 0, NULL) == 0 && gpa2b,
           "cuGetProcAddress through cuGetProcAddress");
    drv_launch_fn dl2 = NULL;
    EXPECT(gpa2b && gpa2b("cuLaunchKernel", (void **)&dl2, 13000, 0, NULL) == 0 && dl2 == dl,
           "cuLaunchKernel through it is the same (wrapped) function as dlsym's");
    EXPECT(dl2 && dl2(&d_x, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "d_x again");
    typedef int (*entry_fn)(const char *, void **, unsigned, unsigned long long, void *);
    entry_fn entry = (entry_fn)sym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion");
    drv_launch_fn dle = NULL;
    EXPECT(entry("cuLaunchKernel", (void **)&dle, 13000, 0, NULL) == 0 && dle,
           "cudaGetDriverEntryPointByVersion");
    EXPECT(dle && dle(&d_v, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "d_v");
    long long q = drv_queries();
    for (int i = 0; i < 3; i++)
        EXPECT(dl(&d_u, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "d_u");
    const char *po = getenv("PROBE_OUT"), *pk = getenv("PROBE_KERNELS");
    int logging = po && *po && !(pk && !strcmp(pk, "0"));
    EXPECT(drv_queries() == q + logging,
           "an unnamed function's name is asked once, and only when logging (%lld queries)",
           drv_queries() - q);
    EXPECT(drv_launches(0) == 9 + 6 + 1 + 1 + 3, "driver legacy launches %lld",
           drv_launches(0));
    EXPECT(drv_launches(3) == 1, "cooperative launches %lld", drv_launches(3));

    /* CUkernel handles: cuFuncGetName and cudaFuncGetName refuse them,
     * cuKernelGetName names them */
    void (*set_drv_kernel_name)(const void *, const char *) = sym(drv, "fake_cuda_set_kernel_name");
    set_drv_kernel_name(&d_k, "library_kernel_d");
    set_drv_kernel_name(&k_k, "library_kernel_k");
    for (int i = 0; i < 2; i++)
        EXPECT(dl(&d_k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0, "cuLaunchKernel CUkernel d_k");
    EXPECT(rt_launch_stub(&k_k, G, B, NULL, 0, NULL) == 0, "__cudaLaunchKernel cudaKernel_t k_k");
    EXPECT(get_error() == 0, "k_k's refused runtime name query left no error behind");

    /* threads */
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, thread_main, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);

    /* scopes (when the shim has them) */
    int (*enter)(const scope_v1 *) = (int (*)(const scope_v1 *))dlsym(RTLD_DEFAULT,
                                                                        "probe_scope_enter_v1");
    int (*leave)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "probe_scope_exit_v1");
    printf("scopes: %s\n", enter && leave ? "yes" : "no");
    if (enter && leave) {
        scope_v1 s = {sizeof s, 1, "dit.step", 0, 0, 0};
        EXPECT(enter(&s) == 0, "scope enter");
        rt_launch(&k_a, G, B, NULL, 0, NULL);
        rt_launch(&k_a, G, B, NULL, 0, NULL);
        dl(&d_x, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        EXPECT(leave() == 0, "scope exit");
        s.call = 1;
        s.step = 1;
        EXPECT(enter(&s) == 0, "scope enter");
        dlp(&d_y, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        EXPECT(leave() == 0, "scope exit");
    }

    /* fork: the child launches and must not query a name */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        long long q0 = drv_queries(), q1 = rt_queries();
        int bad = 0;
        bad |= rt_launch(&k_f, G, B, NULL, 0, NULL) != 0;
        bad |= dl(&d_f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != 0;
        if (drv_queries() != q0 || rt_queries() != q1) {
            printf("FAIL: the forked child queried kernel names\n");
            fflush(stdout);
            bad = 1;
        }
        _exit(bad);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    EXPECT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "forked child's launches forwarded");
    return failures ? 1 : 0;
}
