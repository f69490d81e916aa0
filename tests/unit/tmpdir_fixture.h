/* tmpdir_fixture.h - a fresh temporary directory per Criterion test (g_dir),
 * made before and removed with its contents after, for the unit tests that
 * write capture files. Define TMPDIR_PREFIX ("probe-capture", ...) first. */
#ifndef PROBE_TMPDIR_FIXTURE_H
#define PROBE_TMPDIR_FIXTURE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[512];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/" TMPDIR_PREFIX "-XXXXXX", t != NULL && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(g_dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
