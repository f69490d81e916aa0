/* junit.c - a compare result as JUnit XML for CI: one test case per tensor. */
#include "probe/compare.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* Write s XML-escaped (attribute-safe). Bytes XML 1.0 cannot carry (control
 * characters other than tab/newline/CR) become '?'; other bytes pass through
 * (paths and messages are UTF-8 or ASCII). */
static void xml_text(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        case '\n': fputs("&#10;", f); break;
        case '\r': fputs("&#13;", f); break;
        case '\t': fputs("&#9;", f); break;
        default: fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, f); break;
        }
    }
}

/* The component of a dataset path /<component>/...: its first element. */
static void path_component(char *buf, size_t cap, const char *path)
{
    const char *p = path[0] == '/' ? path + 1 : path, *slash = strchr(p, '/');
    snprintf(buf, cap, "%.*s", slash ? (int)(slash - p) : (int)strlen(p), p);
}

static void num(FILE *f, const char *key, double x)
{
    if (isfinite(x))
        fprintf(f, "%s=%.9g ", key, x);
    else
        fprintf(f, "%s=null ", key);
}

static void metrics_text(FILE *f, const probe_tensor_result *t)
{
    const probe_metrics *m = &t->m;
    if (!t->compared) {
        fputs("metrics: not compared", f);
        return;
    }
    int any = m->n_finite > 0;
    fputs("metrics: ", f);
    num(f, "rel_l2", m->rel_l2);
    num(f, "cosine", m->cosine);
    num(f, "max_abs", any ? m->max_abs : NAN);
    num(f, "p99_abs", any ? m->p99_abs : NAN);
    num(f, "mean_abs", any ? m->mean_abs : NAN);
    num(f, "mismatch_fraction", m->mismatch_fraction);
    fprintf(f, "nan_ref=%llu nan_cand=%llu inf_ref=%llu inf_cand=%llu",
            (unsigned long long)m->nan_ref, (unsigned long long)m->nan_cand,
            (unsigned long long)m->inf_ref, (unsigned long long)m->inf_cand);
}

static void testcase_open(FILE *f, const char *classname, const char *name)
{
    fputs("  <testcase classname=\"", f);
    xml_text(f, classname);
    fputs("\" name=\"", f);
    xml_text(f, name);
    fputs("\"", f);
}

probe_status probe_compare_write_junit(const probe_compare_result *r, FILE *f)
{
    if (!r || !f)
        return probe_set_error(PROBE_EINVAL, "probe_compare_write_junit: NULL argument");
    errno = 0;
    size_t nfail = 0;
    for (size_t i = 0; i < r->ntensors; i++)
        nfail += !r->tensors[i].verdict.pass;
    nfail += r->nmissing_cand + r->nmissing_ref + (r->nreasons > 0);
    size_t ntests = r->ntensors + r->nmissing_cand + r->nmissing_ref + r->nskipped +
                    (r->nreasons > 0);
    char comp[512];

    fputs("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", f);
    fprintf(f, "<testsuites tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"%zu\">\n", ntests,
            nfail, r->nskipped);
    fprintf(f, "<testsuite name=\"probe-compare\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" "
               "skipped=\"%zu\">\n", ntests, nfail, r->nskipped);
    fputs(" <properties>\n  <property name=\"reference\" value=\"", f);
    xml_text(f, r->reference);
    fputs("\"/>\n  <property name=\"candidate\" value=\"", f);
    xml_text(f, r->candidate);
    fputs("\"/>\n  <property name=\"gate\" value=\"", f);
    xml_text(f, r->gate.name);
    fprintf(f, "\"/>\n  <property name=\"verdict\" value=\"%s\"/>\n </properties>\n",
            r->pass ? "pass" : "fail");

    for (size_t i = 0; i < r->ntensors; i++) {
        const probe_tensor_result *t = &r->tensors[i];
        char name[600]; /* rank-by-rank comparison: one test case per rank (docs/nccl.md) */
        if (t->rank_tag < 0 ||
            snprintf(name, sizeof name, "%s (rank %d)", t->ref.path, t->rank_tag) < 0)
            snprintf(name, sizeof name, "%s", t->ref.path);
        testcase_open(f, t->ref.component, name);
        if (t->verdict.pass) {
            fputs("/>\n", f);
            continue;
        }
        fputs(">\n   <failure message=\"", f);
        xml_text(f, t->verdict.nreasons ? t->verdict.reasons[0] : "failed");
        fputs("\" type=\"gate\">", f);
        for (int k = 0; k < t->verdict.nreasons; k++) {
            xml_text(f, t->verdict.reasons[k]);
            fputc('\n', f);
        }
        metrics_text(f, t);
        fputs("</failure>\n  </testcase>\n", f);
    }
    for (int side = 0; side < 2; side++) {
        size_t n = side ? r->nmissing_ref : r->nmissing_cand;
        const char *what = side ? "missing in reference" : "missing in candidate";
        for (size_t i = 0; i < n; i++) {
            const char *path = side ? r->missing_in_reference[i] : r->missing_in_candidate[i];
            path_component(comp, sizeof comp, path);
            testcase_open(f, comp, path);
            fprintf(f, ">\n   <failure message=\"%s\" type=\"missing\">%s</failure>\n"
                       "  </testcase>\n", what, what);
        }
    }
    for (size_t i = 0; i < r->nskipped; i++) {
        path_component(comp, sizeof comp, r->skipped[i].path);
        testcase_open(f, comp, r->skipped[i].path);
        fputs(">\n   <skipped message=\"skipped in ", f);
        xml_text(f, r->skipped[i].side);
        fputs(": ", f);
        xml_text(f, r->skipped[i].reason);
        fputs("\"/>\n  </testcase>\n", f);
    }
    if (r->nreasons > 0) {
        testcase_open(f, "probe-compare", "verdict");
        fputs(">\n   <failure message=\"", f);
        xml_text(f, r->reasons[0]);
        fputs("\" type=\"verdict\">", f);
        for (int k = 0; k < r->nreasons; k++) {
            xml_text(f, r->reasons[k]);
            fputc('\n', f);
        }
        fputs("</failure>\n  </testcase>\n", f);
    }
    fputs("</testsuite>\n</testsuites>\n", f);
    if (fflush(f) != 0 || ferror(f))
        return probe_set_error(PROBE_EIO, "%s", strerror(errno ? errno : EIO));
    return PROBE_OK;
}
