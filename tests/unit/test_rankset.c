/* test_rankset.c - the block layout of a concatenation (probe/rankset.h):
 * probe_concat_locate against hand-derived offsets for joins along axis 0,
 * axis 1 and the last axis with unequal pieces, an empty piece, every logical
 * element against an explicit numpy-style concatenation, and bad input; and
 * probe_rankset_is_collective on the shared dataset-path convention.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "probe/rankset.h"

/* Brute force: build the joined tensor of "element ids" (part << 32 | offset in
 * part) by walking the logical index space, and compare locate with it. */
static void check_all(int nparts, int rank, int axis, int64_t shapes[][PROBE_MAX_RANK])
{
    const int64_t *sp[16];
    for (int p = 0; p < nparts; p++)
        sp[p] = shapes[p];
    probe_concat c;
    cr_assert_eq(probe_concat_init(&c, nparts, rank, axis, sp), PROBE_OK, "%s", probe_last_error());
    int64_t joined[PROBE_MAX_RANK];
    memcpy(joined, shapes[0], sizeof joined);
    joined[axis] = 0;
    for (int p = 0; p < nparts; p++)
        joined[axis] += shapes[p][axis];
    uint64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= (uint64_t)joined[d];
    cr_assert_eq(c.n, n);
    for (uint64_t off = 0; off < n; off++) {
        /* row-major index of off in the joined shape */
        int64_t idx[PROBE_MAX_RANK];
        uint64_t o = off;
        for (int d = rank - 1; d >= 0; d--) {
            idx[d] = (int64_t)(o % (uint64_t)joined[d]);
            o /= (uint64_t)joined[d];
        }
        int p = 0;
        int64_t a = idx[axis];
        while (a >= shapes[p][axis]) {
            a -= shapes[p][axis];
            p++;
        }
        idx[axis] = a;
        uint64_t po = 0;
        for (int d = 0; d < rank; d++)
            po = po * (uint64_t)shapes[p][d] + (uint64_t)idx[d];
        uint64_t got_po, run;
        int got = probe_concat_locate(&c, off, &got_po, &run);
        cr_assert_eq(got, p, "offset %llu: part %d, want %d", (unsigned long long)off, got, p);
        cr_assert_eq(got_po, po, "offset %llu: part offset %llu, want %llu",
                     (unsigned long long)off, (unsigned long long)got_po, (unsigned long long)po);
        /* run: up to the end of this part's block of extent*inner elements */
        uint64_t inner = 1;
        for (int d = axis + 1; d < rank; d++)
            inner *= (uint64_t)joined[d];
        uint64_t block = (uint64_t)shapes[p][axis] * inner;
        cr_assert_eq(run, block - po % block);
    }
    uint64_t po, run;
    cr_assert_eq(probe_concat_locate(&c, n, &po, &run), -1);
    probe_concat_free(&c);
}

Test(concat, axis0_hand)
{
    /* [2,3] + [1,3] along 0: rows 0,1 from part 0, row 2 from part 1. */
    int64_t s[2][PROBE_MAX_RANK] = {{2, 3}, {1, 3}};
    const int64_t *sp[2] = {s[0], s[1]};
    probe_concat c;
    cr_assert_eq(probe_concat_init(&c, 2, 2, 0, sp), PROBE_OK);
    cr_assert_eq(c.outer, 1);
    cr_assert_eq(c.inner, 3);
    cr_assert_eq(c.n, 9);
    uint64_t po, run;
    cr_assert_eq(probe_concat_locate(&c, 0, &po, &run), 0);
    cr_assert(po == 0 && run == 6);
    cr_assert_eq(probe_concat_locate(&c, 5, &po, &run), 0);
    cr_assert(po == 5 && run == 1);
    cr_assert_eq(probe_concat_locate(&c, 6, &po, &run), 1);
    cr_assert(po == 0 && run == 3);
    cr_assert_eq(probe_concat_locate(&c, 8, &po, &run), 1);
    cr_assert(po == 2 && run == 1);
    probe_concat_free(&c);
    check_all(2, 2, 0, s);
}

Test(concat, axis1_hand_unequal)
{
    /* [2,5,6] + [2,3,6] along 1: per outer index, 30 elements of rank 0 then 18
     * of rank 1. Logical [1,7,4] = offset 1*48 + 7*6 + 4 = 94 lies in rank 1 at
     * [1,2,4] = 1*18 + 2*6 + 4 = 34. */
    int64_t s[2][PROBE_MAX_RANK] = {{2, 5, 6}, {2, 3, 6}};
    const int64_t *sp[2] = {s[0], s[1]};
    probe_concat c;
    cr_assert_eq(probe_concat_init(&c, 2, 3, 1, sp), PROBE_OK);
    cr_assert(c.outer == 2 && c.inner == 6 && c.n == 96);
    cr_assert(c.start[0] == 0 && c.start[1] == 30 && c.start[2] == 48);
    uint64_t po, run;
    cr_assert_eq(probe_concat_locate(&c, 94, &po, &run), 1);
    cr_assert_eq(po, 34);
    cr_assert_eq(run, 2);
    cr_assert_eq(probe_concat_locate(&c, 48, &po, &run), 0); /* second outer row, rank 0 */
    cr_assert(po == 30 && run == 30);
    probe_concat_free(&c);
    check_all(2, 3, 1, s);
}

Test(concat, last_axis_three_parts_one_empty)
{
    /* [3,4,3] + [3,4,0] + [3,4,4] along the last axis: runs of 3 and 4. */
    int64_t s[3][PROBE_MAX_RANK] = {{3, 4, 3}, {3, 4, 0}, {3, 4, 4}};
    const int64_t *sp[3] = {s[0], s[1], s[2]};
    probe_concat c;
    cr_assert_eq(probe_concat_init(&c, 3, 3, 2, sp), PROBE_OK);
    cr_assert(c.outer == 12 && c.inner == 1 && c.n == 84);
    uint64_t po, run;
    cr_assert_eq(probe_concat_locate(&c, 3, &po, &run), 2); /* never the empty part */
    cr_assert(po == 0 && run == 4);
    cr_assert_eq(probe_concat_locate(&c, 7 + 2, &po, &run), 0);
    cr_assert(po == 3 + 2 && run == 1);
    probe_concat_free(&c);
    check_all(3, 3, 2, s);
}

Test(concat, rank_ordering_many_parts)
{
    int64_t s[5][PROBE_MAX_RANK] = {{2, 1, 3}, {2, 4, 3}, {2, 2, 3}, {2, 1, 3}, {2, 3, 3}};
    check_all(5, 3, 1, s);
    int64_t t[4][PROBE_MAX_RANK] = {{1}, {2}, {3}, {4}};
    check_all(4, 1, 0, t);
}

Test(concat, bad_input)
{
    int64_t s[2][PROBE_MAX_RANK] = {{2, 5, 6}, {3, 3, 6}};
    const int64_t *sp[2] = {s[0], s[1]};
    probe_concat c;
    cr_assert_eq(probe_concat_init(&c, 2, 3, 1, sp), PROBE_EINVAL);
    cr_assert(strstr(probe_last_error(), "axis 0") && strstr(probe_last_error(), "rank 1"),
              "%s", probe_last_error());
    cr_assert_eq(probe_concat_init(&c, 2, 3, 3, sp), PROBE_EINVAL);
    cr_assert_eq(probe_concat_init(&c, 2, 3, -1, sp), PROBE_EINVAL);
    cr_assert_eq(probe_concat_init(&c, 0, 3, 0, sp), PROBE_EINVAL);
    cr_assert_eq(probe_concat_init(NULL, 2, 3, 0, sp), PROBE_EINVAL);
    s[1][0] = -1;
    cr_assert_eq(probe_concat_init(&c, 2, 3, 0, sp), PROBE_EINVAL);
    uint64_t po, run;
    cr_assert_eq(probe_concat_locate(NULL, 0, &po, &run), -1);
}

Test(rankset, collective_paths)
{
    char op[32], operand[32];
    cr_assert(probe_rankset_is_collective("/nccl/0000/all_gather.out", op, sizeof op, operand,
                                          sizeof operand));
    cr_assert_str_eq(op, "all_gather");
    cr_assert_str_eq(operand, "out");
    cr_assert(probe_rankset_is_collective("/dit.step/0003/nccl.0002.all_reduce.in", op, sizeof op,
                                          operand, sizeof operand));
    cr_assert_str_eq(op, "all_reduce");
    cr_assert_str_eq(operand, "in");
    cr_assert(!probe_rankset_is_collective("/dit.step/0003/out", NULL, 0, NULL, 0));
    cr_assert(!probe_rankset_is_collective("/dit.step/0003/gemm.0001.a", NULL, 0, NULL, 0));
    cr_assert(!probe_rankset_is_collective("/ncclx/0000/out", NULL, 0, NULL, 0));
}

Test(rankset, open_bad)
{
    probe_rankset *rs = NULL;
    cr_assert_eq(probe_rankset_open(NULL, 1, &rs), PROBE_EINVAL);
    const char *p[1] = {"/nonexistent/probe-rankset.h5"};
    cr_assert_neq(probe_rankset_open(p, 1, &rs), PROBE_OK);
    cr_assert_null(rs);
}
