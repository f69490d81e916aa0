/* nvtx.c - probe as the NVTX injection library.
 *
 * NVTX v3 is header-only: there is no nvtxRangePushA symbol to interpose.
 * At the first NVTX call in each module, the NVTX headers dlopen the library
 * named by NVTX_INJECTION64_PATH (the shim's constructor points it at the
 * shim itself) and call InitializeInjectionNvtx2(getExportTable); we fill the
 * CORE / CORE2 callback slots we support (nvtx3/nvtxDetail/nvtxTypes.h,
 * nvtxImpl.h: NvtxExportTableCallbacks::GetModuleFunctionTable).
 *
 * Each thread keeps a stack of open push/pop ranges (bounded depth, names
 * truncated at a UTF-8 boundary); a tap records the stack joined by '/' as
 * its scope. Domain ranges carry their domain: nvtxDomainRangePop(d) closes
 * the innermost range of d, nvtxRangePop the innermost of the default
 * domain, so interleaved domains keep their own order. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include "base/shim.h"
#include "capture/nvtx.h"
#include "capture/scope.h"

#define NVTX_DEPTH_MAX 64
#define NVTX_NAME_MAX 128 /* bytes kept per range name, NUL included */

struct range {
    const void *domain; /* NULL: default domain */
    unsigned scope;     /* token of the component scope it opened (scope.c), 0 none */
    char name[NVTX_NAME_MAX];
};

struct range_stack {
    int depth;       /* entries in use */
    int overflow;    /* pushes beyond NVTX_DEPTH_MAX not stored */
    struct range r[NVTX_DEPTH_MAX];
};

static __thread struct range_stack *tls_stack;
static pthread_key_t stack_key;
static pthread_once_t stack_once = PTHREAD_ONCE_INIT;

static void stack_free(void *p)
{
    free(p);
}

static void make_key(void)
{
    pthread_key_create(&stack_key, stack_free);
}

static struct range_stack *stack_get(void)
{
    struct range_stack *s = tls_stack;
    if (!s) {
        pthread_once(&stack_once, make_key);
        s = calloc(1, sizeof *s);
        if (!s)
            return NULL;
        tls_stack = s;
        pthread_setspecific(stack_key, s);
    }
    return s;
}

/* Copy at most cap-1 bytes of src, cutting before an incomplete UTF-8
 * sequence. */
static void copy_utf8(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) {
        n = cap - 1;
        /* back up over continuation bytes to the start of the cut character */
        size_t k = n;
        while (k > 0 && ((unsigned char)src[k] & 0xC0) == 0x80)
            --k;
        n = k;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* wchar_t (UTF-32 on Linux) to UTF-8, truncated to cap. */
static void wide_to_utf8(char *dst, size_t cap, const wchar_t *w)
{
    size_t o = 0;
    for (; w && *w; ++w) {
        unsigned long c = (unsigned long)*w;
        char buf[4];
        size_t n;
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
            c = 0xFFFD;
        if (c < 0x80) {
            buf[0] = (char)c;
            n = 1;
        } else if (c < 0x800) {
            buf[0] = (char)(0xC0 | (c >> 6));
            buf[1] = (char)(0x80 | (c & 0x3F));
            n = 2;
        } else if (c < 0x10000) {
            buf[0] = (char)(0xE0 | (c >> 12));
            buf[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            buf[2] = (char)(0x80 | (c & 0x3F));
            n = 3;
        } else {
            buf[0] = (char)(0xF0 | (c >> 18));
            buf[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            buf[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            buf[3] = (char)(0x80 | (c & 0x3F));
            n = 4;
        }
        if (o + n >= cap)
            break;
        memcpy(dst + o, buf, n);
        o += n;
    }
    dst[o] = '\0';
}

/* Registered strings and domains are handles that point at these. */
#define REG_MAGIC 0x70726f62u /* "prob" */
struct reg {
    unsigned magic;
    struct reg *next; /* all handles stay listed: never freed, never lost */
    char s[];
};

static _Atomic(struct reg *) regs;

static const char *reg_text(const void *h)
{
    const struct reg *r = h;
    return r && r->magic == REG_MAGIC ? r->s : "";
}

static struct reg *reg_new(const char *s)
{
    size_t n = strlen(s);
    struct reg *r = malloc(sizeof *r + n + 1);
    if (r) {
        r->magic = REG_MAGIC;
        memcpy(r->s, s, n + 1);
        r->next = atomic_load(&regs);
        while (!atomic_compare_exchange_weak(&regs, &r->next, r))
            ;
    }
    return r; /* never freed: handles may be used until exit */
}

static int push(const void *domain, const char *name)
{
    struct range_stack *s = stack_get();
    if (!s)
        return -1;
    if (s->depth >= NVTX_DEPTH_MAX) {
        ++s->overflow;
        return s->depth + s->overflow - 1;
    }
    s->r[s->depth].domain = domain;
    copy_utf8(s->r[s->depth].name, NVTX_NAME_MAX, name ? name : "");
    s->r[s->depth].scope = shim_scope_nvtx_enter(s->r[s->depth].name);
    return s->depth++;
}

static int pop(const void *domain)
{
    struct range_stack *s = tls_stack;
    if (!s)
        return -1;
    if (s->overflow > 0) {
        --s->overflow;
        return s->depth + s->overflow;
    }
    for (int i = s->depth - 1; i >= 0; --i) {
        if (s->r[i].domain == domain) {
            shim_scope_nvtx_exit(s->r[i].scope);
            memmove(&s->r[i], &s->r[i + 1], (size_t)(s->depth - 1 - i) * sizeof s->r[0]);
            --s->depth;
            return s->depth;
        }
    }
    return -1; /* pop without a matching push */
}

static void attr_name(const nvtxEventAttributes_t *a, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!a || a->size < offsetof(nvtxEventAttributes_t, message) + sizeof a->message)
        return;
    switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
        copy_utf8(buf, cap, a->message.ascii ? a->message.ascii : "");
        break;
    case NVTX_MESSAGE_TYPE_UNICODE:
        wide_to_utf8(buf, cap, a->message.unicode);
        break;
    case NVTX_MESSAGE_TYPE_REGISTERED:
        copy_utf8(buf, cap, reg_text(a->message.registered));
        break;
    default:
        break;
    }
}

/* ---- callbacks ------------------------------------------------------------ */

static int NVTX_API cb_RangePushA(const char *message)
{
    return push(NULL, message);
}

static int NVTX_API cb_RangePushW(const wchar_t *message)
{
    char buf[NVTX_NAME_MAX];
    wide_to_utf8(buf, sizeof buf, message);
    return push(NULL, buf);
}

static int NVTX_API cb_RangePushEx(const nvtxEventAttributes_t *a)
{
    char buf[NVTX_NAME_MAX];
    attr_name(a, buf, sizeof buf);
    return push(NULL, buf);
}

static int NVTX_API cb_RangePop(void)
{
    return pop(NULL);
}

static int NVTX_API cb_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    char buf[NVTX_NAME_MAX];
    attr_name(a, buf, sizeof buf);
    return push(d, buf);
}

static int NVTX_API cb_DomainRangePop(nvtxDomainHandle_t d)
{
    return pop(d);
}

static nvtxDomainHandle_t NVTX_API cb_DomainCreateA(const char *name)
{
    return (nvtxDomainHandle_t)reg_new(name ? name : "");
}

static nvtxDomainHandle_t NVTX_API cb_DomainCreateW(const wchar_t *name)
{
    char buf[NVTX_NAME_MAX];
    wide_to_utf8(buf, sizeof buf, name);
    return (nvtxDomainHandle_t)reg_new(buf);
}

static void NVTX_API cb_DomainDestroy(nvtxDomainHandle_t d)
{
    (void)d; /* kept: ranges of the domain may still be open */
}

static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s)
{
    (void)d;
    return (nvtxStringHandle_t)reg_new(s ? s : "");
}

static nvtxStringHandle_t NVTX_API cb_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *s)
{
    char buf[NVTX_NAME_MAX];
    (void)d;
    wide_to_utf8(buf, sizeof buf, s);
    return (nvtxStringHandle_t)reg_new(buf);
}

static void NVTX_API cb_MarkA(const char *m)
{
    (void)m;
}

static void NVTX_API cb_MarkEx(const nvtxEventAttributes_t *a)
{
    (void)a;
}

static void NVTX_API cb_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    (void)d;
    (void)a;
}

/* Start/end ranges are not thread-bound: they do not enter the scope. */
static nvtxRangeId_t NVTX_API cb_RangeStartA(const char *m)
{
    (void)m;
    return 0;
}

static nvtxRangeId_t NVTX_API cb_RangeStartEx(const nvtxEventAttributes_t *a)
{
    (void)a;
    return 0;
}

static void NVTX_API cb_RangeEnd(nvtxRangeId_t id)
{
    (void)id;
}

static void NVTX_API cb_Initialize(const void *reserved)
{
    (void)reserved;
}

struct slot {
    unsigned id;
    NvtxFunctionPointer fn;
};

static void fill(const NvtxExportTableCallbacks *cb, NvtxCallbackModule module,
                 const struct slot *slots, size_t n)
{
    NvtxFunctionTable table = NULL;
    unsigned size = 0;
    if (!cb->GetModuleFunctionTable(module, &table, &size) || !table)
        return;
    for (size_t i = 0; i < n; ++i) {
        if (slots[i].id < size && table[slots[i].id])
            *table[slots[i].id] = slots[i].fn;
    }
}

#define FN(f) ((NvtxFunctionPointer)(void (*)(void))(f))

/* NVTX injection entry point (nvtxInit.h): called once per module that uses
 * NVTX. Returns 1 on success, 0 when the export table is unusable (NVTX
 * then turns every call into a no-op for that module). */
SHIM_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable)
{
    if (!getExportTable)
        return 0;
    const NvtxExportTableCallbacks *cb = getExportTable(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable)
        return 0;
    const NvtxExportTableVersionInfo *vi = getExportTable(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion)
        vi->SetInjectionNvtxVersion(NVTX_VERSION);

    const struct slot core[] = {
        {NVTX_CBID_CORE_MarkEx, FN(cb_MarkEx)},
        {NVTX_CBID_CORE_MarkA, FN(cb_MarkA)},
        {NVTX_CBID_CORE_RangeStartEx, FN(cb_RangeStartEx)},
        {NVTX_CBID_CORE_RangeStartA, FN(cb_RangeStartA)},
        {NVTX_CBID_CORE_RangeEnd, FN(cb_RangeEnd)},
        {NVTX_CBID_CORE_RangePushEx, FN(cb_RangePushEx)},
        {NVTX_CBID_CORE_RangePushA, FN(cb_RangePushA)},
        {NVTX_CBID_CORE_RangePushW, FN(cb_RangePushW)},
        {NVTX_CBID_CORE_RangePop, FN(cb_RangePop)},
    };
    const struct slot core2[] = {
        {NVTX_CBID_CORE2_DomainMarkEx, FN(cb_DomainMarkEx)},
        {NVTX_CBID_CORE2_DomainRangePushEx, FN(cb_DomainRangePushEx)},
        {NVTX_CBID_CORE2_DomainRangePop, FN(cb_DomainRangePop)},
        {NVTX_CBID_CORE2_DomainRegisterStringA, FN(cb_DomainRegisterStringA)},
        {NVTX_CBID_CORE2_DomainRegisterStringW, FN(cb_DomainRegisterStringW)},
        {NVTX_CBID_CORE2_DomainCreateA, FN(cb_DomainCreateA)},
        {NVTX_CBID_CORE2_DomainCreateW, FN(cb_DomainCreateW)},
        {NVTX_CBID_CORE2_DomainDestroy, FN(cb_DomainDestroy)},
        {NVTX_CBID_CORE2_Initialize, FN(cb_Initialize)},
    };
    fill(cb, NVTX_CB_MODULE_CORE, core, sizeof core / sizeof core[0]);
    fill(cb, NVTX_CB_MODULE_CORE2, core2, sizeof core2 / sizeof core2[0]);
    atomic_fetch_add(&shim_counts.nvtx_modules, 1);
    return 1;
}

void shim_nvtx_scope(char *buf, size_t cap)
{
    struct range_stack *s = tls_stack;
    size_t o = 0;
    buf[0] = '\0';
    if (!s)
        return;
    for (int i = 0; i < s->depth; ++i) {
        const char *name = s->r[i].name;
        size_t need = strlen(name) + (i ? 1 : 0);
        if (o + need >= cap) {
            /* keep what fits, cut at a character boundary */
            if (i && o + 1 < cap)
                buf[o++] = '/';
            copy_utf8(buf + o, cap - o, name);
            return;
        }
        if (i)
            buf[o++] = '/';
        memcpy(buf + o, name, strlen(name) + 1);
        o += strlen(name);
    }
}
