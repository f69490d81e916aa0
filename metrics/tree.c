/* tree.c - a tensor's summary and tree hash in the canonical tree order
 * (docs/file-format.md "Tree order"; probe_summary_tree, probe/metrics.h).
 *
 * Pieces of 256 bytes are the leaves: XXH64 (seed 0) of the piece, and its
 * finite elements' sums s = s + x, q = q + x * x in element order, each
 * operation rounded to double (this file is compiled with
 * -ffp-contract=off: no FMA). A node of level k + 1 combines up to 32
 * children: XXH64 (seed k + 1) of their hashes as little-endian uint64, the
 * sums by the butterfly v[i] = v[i] + v[i + off], off = 16, 8, 4, 2, 1
 * (missing children +0.0), counts added, min/max/abs_max combined (-0
 * before +0). The root is the first level with one node; the tree hash is
 * XXH64 (seed 0) of the root's hash and the byte count, 16 bytes
 * little-endian. libprobe_cuda's probe_cuda_summary_tree computes the same
 * tree on the device (a lane per piece, a warp per node). */
#include "tree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "probe/dtype.h"

static int before_min(double x, double m)
{
    return x < m || (x == m && signbit(x) && !signbit(m));
}

static int after_max(double x, double m)
{
    return x > m || (x == m && !signbit(x) && signbit(m));
}

static void node_empty(probe_tree_node *a)
{
    memset(a, 0, sizeof *a);
    a->mn = INFINITY;
    a->mx = -INFINITY;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int b = 0; b < 8; b++)
        p[b] = (unsigned char)(v >> (8 * b));
}

static uint64_t xxh64(const void *p, size_t n, uint64_t seed)
{
    static const unsigned char none = 0;
    return (uint64_t)XXH64(n ? p : &none, n, seed);
}

/* The leaves of up to 32 consecutive pieces (nbytes at p, the last piece
 * possibly short) into a[0 .. count - 1]. The pieces' sums run side by
 * side (element j of every piece, then element j + 1), so that the
 * additions of different pieces overlap; each piece's own additions stay in
 * element order. A non-finite element adds +0.0 in place of itself, which
 * leaves a sum unchanged: a sum that starts at +0.0 is never -0.0. */
static void leaves(probe_tree_state *t, const unsigned char *p, size_t nbytes,
                   probe_tree_node *a, unsigned count)
{
    const size_t esz = probe_dtype_size(t->dtype), per = PROBE_TREE_PIECE_BYTES / esz;
    double *v = t->scratch;
    for (unsigned k = 0; k < count; k++)
        node_empty(&a[k]);
    if (!t->hash_only) {
        size_t m = nbytes / esz;
        (void)probe_dtype_to_f64(t->dtype, p, v, m); /* dtype checked in begin */
        for (size_t j = m; j < (size_t)count * per; j++)
            v[j] = 0.0;
        double s[PROBE_TREE_FANOUT] = {0}, q[PROBE_TREE_FANOUT] = {0};
        for (size_t j = 0; j < per; j++)
            for (unsigned k = 0; k < count; k++) {
                double e = v[k * per + j];
                e = e - e == 0.0 ? e : 0.0;
                s[k] = s[k] + e;
                q[k] = q[k] + e * e;
            }
        /* counts, min, max, max |x|: branch-free; the -0/+0 order of min
         * and max is settled at the end from whether a -0 (+0) was seen */
        for (unsigned k = 0; k < count; k++) {
            probe_tree_node *n = &a[k];
            n->s = s[k];
            n->q = q[k];
            size_t end = (k + 1) * per < m ? (k + 1) * per : m;
            uint64_t nf = 0, nan = 0;
            double mn = INFINITY, mx = -INFINITY, am = 0.0;
            int neg0 = 0, pos0 = 0;
            for (size_t j = k * per; j < end; j++) {
                double e = v[j];
                int fin = e - e == 0.0;
                nf += (uint64_t)fin;
                nan += (uint64_t)(e != e);
                double lo = fin ? e : INFINITY, hi = fin ? e : -INFINITY, ab = fin ? fabs(e) : 0.0;
                mn = lo < mn ? lo : mn;
                mx = hi > mx ? hi : mx;
                am = ab > am ? ab : am;
                neg0 |= e == 0.0 && signbit(e);
                pos0 |= e == 0.0 && !signbit(e);
            }
            if (mn == 0.0)
                mn = neg0 ? -0.0 : 0.0;
            if (mx == 0.0)
                mx = pos0 ? 0.0 : -0.0;
            n->nf = nf;
            n->nan = nan;
            n->inf = (uint64_t)(end > k * per ? end - k * per : 0) - nf - nan;
            n->mn = mn;
            n->mx = mx;
            n->am = am;
        }
    }
    if (!t->with_hash)
        return;
    for (unsigned k = 0; k < count; k++) {
        size_t at = (size_t)k * PROBE_TREE_PIECE_BYTES;
        size_t len = nbytes - at < PROBE_TREE_PIECE_BYTES ? nbytes - at : PROBE_TREE_PIECE_BYTES;
        if (t->dtype == PROBE_DTYPE_BOOL) {
            unsigned char b[PROBE_TREE_PIECE_BYTES];
            for (size_t j = 0; j < len; j++)
                b[j] = p[at + j] != 0;
            a[k].hash = xxh64(b, len, 0);
        } else {
            a[k].hash = xxh64(p + at, len, 0);
        }
    }
}

/* count (1..32) children into one node of the next level (seed) */
static void combine(const probe_tree_node *kid, unsigned count, uint64_t seed,
                    probe_tree_node *out)
{
    double vs[PROBE_TREE_FANOUT], vq[PROBE_TREE_FANOUT];
    unsigned char hb[8 * PROBE_TREE_FANOUT];
    probe_tree_node a;
    node_empty(&a);
    for (unsigned i = 0; i < PROBE_TREE_FANOUT; i++) {
        vs[i] = i < count ? kid[i].s : 0.0;
        vq[i] = i < count ? kid[i].q : 0.0;
    }
    for (unsigned off = PROBE_TREE_FANOUT / 2; off > 0; off >>= 1)
        for (unsigned i = 0; i < off; i++) {
            vs[i] = vs[i] + vs[i + off];
            vq[i] = vq[i] + vq[i + off];
        }
    for (unsigned i = 0; i < count; i++) {
        const probe_tree_node *k = &kid[i];
        a.nf += k->nf;
        a.nan += k->nan;
        a.inf += k->inf;
        if (before_min(k->mn, a.mn))
            a.mn = k->mn;
        if (after_max(k->mx, a.mx))
            a.mx = k->mx;
        if (k->am > a.am)
            a.am = k->am;
        put_le64(hb + 8 * i, k->hash);
    }
    a.s = vs[0];
    a.q = vq[0];
    a.hash = xxh64(hb, 8 * (size_t)count, seed);
    *out = a;
}

/* a node made at level k: pending there; a full level goes up */
static void push(probe_tree_state *t, unsigned k, probe_tree_node a)
{
    for (;;) {
        t->node[k][t->pending[k]++] = a;
        t->total[k]++;
        if (t->pending[k] < PROBE_TREE_FANOUT)
            return;
        combine(t->node[k], PROBE_TREE_FANOUT, k + 1, &a);
        t->pending[k] = 0;
        k++; /* at most 12 levels for 2^64 bytes */
    }
}

probe_status probe_tree_begin_(probe_tree_state *t, probe_dtype dtype, int with_hash)
{
    if (t == NULL)
        return probe_set_error(PROBE_EINVAL, "probe_tree_begin_: state is NULL");
    memset(t, 0, sizeof *t);
    if (probe_dtype_size(dtype) == 0)
        return probe_set_error(PROBE_EINVAL, "probe_summary_tree: unknown element type %d",
                               (int)dtype);
    t->dtype = dtype;
    t->with_hash = with_hash;
    return PROBE_OK;
}

probe_status probe_tree_feed_(probe_tree_state *t, const void *data, size_t nbytes)
{
    if (t->nbytes % PROBE_TREE_PIECE_BYTES)
        return probe_set_error(PROBE_EINVAL, "probe_tree_feed_: a chunk after one that was not a "
                                             "multiple of %d bytes",
                               PROBE_TREE_PIECE_BYTES);
    const unsigned char *p = data;
    const size_t group = (size_t)PROBE_TREE_FANOUT * PROBE_TREE_PIECE_BYTES;
    for (size_t at = 0; at < nbytes; at += group) {
        size_t len = nbytes - at < group ? nbytes - at : group;
        unsigned count = (unsigned)((len + PROBE_TREE_PIECE_BYTES - 1) / PROBE_TREE_PIECE_BYTES);
        probe_tree_node a[PROBE_TREE_FANOUT];
        leaves(t, p + at, len, a, count);
        for (unsigned k = 0; k < count; k++)
            push(t, 0, a[k]);
    }
    t->nbytes += nbytes;
    return PROBE_OK;
}

void probe_tree_finish_(probe_tree_state *t, probe_summary *out, uint64_t *tree_hash)
{
    probe_tree_node root;
    node_empty(&root);
    root.hash = xxh64(NULL, 0, 0);
    for (unsigned k = 0; k < PROBE_TREE_LEVELS && t->total[k] > 0; k++) {
        if (t->total[k] == 1) { /* the first level with one node */
            root = t->node[k][0];
            break;
        }
        if (t->pending[k] > 0) {
            probe_tree_node up;
            combine(t->node[k], t->pending[k], k + 1, &up);
            t->pending[k] = 0;
            t->node[k + 1][t->pending[k + 1]++] = up;
            t->total[k + 1]++;
        }
    }
    memset(out, 0, sizeof *out);
    out->n = t->nbytes / probe_dtype_size(t->dtype);
    out->n_finite = root.nf;
    out->nan = root.nan;
    out->inf = root.inf;
    out->sum = root.s;
    out->sum_sq = root.q;
    out->min = out->max = out->abs_max = NAN;
    if (root.nf > 0) {
        out->min = root.mn;
        out->max = root.mx;
        out->abs_max = root.am;
    }
    if (tree_hash) {
        unsigned char b[16];
        put_le64(b, root.hash);
        put_le64(b + 8, t->nbytes);
        *tree_hash = xxh64(b, 16, 0);
    }
}

static probe_status summary_tree(const char *fn, probe_dtype dtype, const void *x, size_t n,
                                 probe_summary *out, uint64_t *tree_hash, int with_hash)
{
    if (out == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: out is NULL", fn);
    memset(out, 0, sizeof *out);
    size_t esz = probe_dtype_size(dtype);
    if (esz == 0)
        return probe_set_error(PROBE_EINVAL, "%s: unknown element type %d", fn, (int)dtype);
    if (n > 0 && x == NULL)
        return probe_set_error(PROBE_EINVAL, "%s: x is NULL with n = %zu", fn, n);
    if (n > SIZE_MAX / esz)
        return probe_set_error(PROBE_EINVAL, "%s: n = %zu elements overflow a byte count", fn, n);
    probe_tree_state *t = malloc(sizeof *t);
    if (t == NULL)
        return probe_set_error(PROBE_ENOMEM, "%s: out of memory", fn);
    probe_status s = probe_tree_begin_(t, dtype, with_hash);
    if (s == PROBE_OK)
        s = probe_tree_feed_(t, x, n * esz);
    if (s == PROBE_OK)
        probe_tree_finish_(t, out, tree_hash);
    free(t);
    return s;
}

probe_status probe_summary_tree(probe_dtype dtype, const void *x, size_t n, probe_summary *out,
                                uint64_t *tree_hash)
{
    if (tree_hash)
        *tree_hash = 0;
    return summary_tree("probe_summary_tree", dtype, x, n, out, tree_hash, tree_hash != NULL);
}

probe_status probe_summary_compute(probe_dtype dtype, const void *x, size_t n, probe_summary *out)
{
    return summary_tree("probe_summary_compute", dtype, x, n, out, NULL, 0);
}

uint64_t probe_tree_hash(const void *data, size_t nbytes)
{
    probe_tree_state *t = malloc(sizeof *t);
    uint64_t h = 0;
    probe_summary s;
    if (t != NULL && probe_tree_begin_(t, PROBE_DTYPE_UINT8, 1) == PROBE_OK) {
        t->hash_only = 1;
        if (probe_tree_feed_(t, data, nbytes) == PROBE_OK)
            probe_tree_finish_(t, &s, &h);
    }
    free(t);
    return h;
}
