/* Component table names (probe/components.h): the repository's own table,
 * $PROBE_COMPONENTS, and tables that cannot be used. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "probe/components.h"

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/probe-components-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(components, repository_table_has_the_eleven_components_three_of_them_roots)
{
    const char *src = getenv("PROBE_SOURCE_DIR");
    cr_assert_not_null(src, "PROBE_SOURCE_DIR is set by ctest");
    char path[4096];
    snprintf(path, sizeof path, "%s/components/components.json", src);
    char **names = NULL;
    cr_assert_eq(probe_component_names_load(path, &names), PROBE_OK, "%s", probe_last_error());
    const char *want[] = {"text_encoder", "image_encoder", "controlnet", "dit.step", "dit.block",
                          "scheduler.step", "vae.encode", "vae.decode", "latents.init", "timesteps",
                          "prompt_embeds"};
    size_t n = 0;
    while (names[n])
        n++;
    cr_assert_eq(n, 11);
    for (size_t i = 0; i < 11; i++) {
        int found = 0;
        for (size_t k = 0; k < n; k++)
            found |= strcmp(names[k], want[i]) == 0;
        cr_assert(found, "%s missing", want[i]);
    }
    probe_component_names_free(names);
    char **roots = NULL;
    cr_assert_eq(probe_component_roots_load(path, &roots), PROBE_OK, "%s", probe_last_error());
    cr_assert_str_eq(roots[0], "latents.init");
    cr_assert_str_eq(roots[1], "timesteps");
    cr_assert_str_eq(roots[2], "prompt_embeds");
    cr_assert_null(roots[3]);
    probe_component_names_free(roots);
}

Test(components, class_layouts_give_per_class_channel_axes_in_table_order)
{
    char *p = write_tmp(
        "{\"components\": ["
        "{\"name\": \"a\", \"class_layouts\": ["
        "  {\"classes\": [\"m.Cog*\", \"m.Con*\"], \"layout\": \"[B, F, C, H, W]\", \"channel_axis\": 2},"
        "  {\"classes\": [\"m.Flux*\"], \"layout\": \"[B, L, C]\", \"channel_axis\": -1},"
        "  {\"classes\": [\"x\"], \"channel_axis\": 1},"
        "  {\"classes\": [7], \"layout\": \"[B]\", \"channel_axis\": 0},"
        "  {\"classes\": [\"y\"], \"layout\": \"[B, C]\", \"channel_axis\": 16}]},"
        "{\"name\": \"b\"},"
        "{\"name\": \"c\", \"class_layouts\": [{\"classes\": [\"*\"], \"layout\": \"[B, C, H, W]\", "
        "  \"channel_axis\": 1}]}]}");
    probe_class_axis *a = NULL;
    size_t n = 99;
    cr_assert_eq(probe_component_class_axes_load(p, &a, &n), PROBE_OK, "%s", probe_last_error());
    /* kept: 2 globs of the first entry, the second entry, c's; skipped: no layout, a glob that is
     * not a string, an axis outside [-16, 15] */
    cr_assert_eq(n, 4);
    cr_assert_str_eq(a[0].component, "a");
    cr_assert_str_eq(a[0].class_glob, "m.Cog*");
    cr_assert_eq(a[0].axis, 2);
    cr_assert_eq(a[0].rank, 5);
    cr_assert_str_eq(a[1].class_glob, "m.Con*");
    cr_assert_eq(a[1].rank, 5);
    cr_assert_str_eq(a[2].class_glob, "m.Flux*");
    cr_assert_eq(a[2].axis, -1);
    cr_assert_eq(a[2].rank, 3);
    cr_assert_str_eq(a[3].component, "c");
    cr_assert_eq(a[3].rank, 4);
    probe_component_class_axes_free(a, n);
    unlink(p);
    p = write_tmp("{\"components\": [{\"name\": \"a\"}]}");
    cr_assert_eq(probe_component_class_axes_load(p, &a, &n), PROBE_OK, "%s", probe_last_error());
    cr_assert_null(a);
    cr_assert_eq(n, 0);
    cr_assert_eq(probe_component_class_axes_load(p, NULL, &n), PROBE_EINVAL);
    probe_component_class_axes_free(NULL, 0);
    unlink(p);
}

Test(components, roots_are_rows_with_root_true)
{
    char *p = write_tmp("{\"components\": [{\"name\": \"a\", \"root\": true}, {\"name\": \"b\"}, "
                        "{\"name\": \"c\", \"root\": false}, {\"name\": \"d\", \"root\": 1}, "
                        "{\"name\": \"e\", \"root\": true}]}");
    char **roots = NULL;
    cr_assert_eq(probe_component_roots_load(p, &roots), PROBE_OK, "%s", probe_last_error());
    cr_assert_str_eq(roots[0], "a");
    cr_assert_str_eq(roots[1], "e");
    cr_assert_null(roots[2]);
    probe_component_names_free(roots);
    unlink(p);
}

Test(components, env_names_the_table)
{
    char *p = write_tmp("{\"components\": [{\"name\": \"a.b\"}, {\"x\": 1}, {\"name\": \"c\"}]}");
    setenv("PROBE_COMPONENTS", p, 1);
    char **names = NULL;
    cr_assert_eq(probe_component_names_load(NULL, &names), PROBE_OK, "%s", probe_last_error());
    cr_assert_str_eq(names[0], "a.b");
    cr_assert_str_eq(names[1], "c");
    cr_assert_null(names[2]);
    probe_component_names_free(names);
    unsetenv("PROBE_COMPONENTS");
    unlink(p);
}

Test(components, unusable_tables_are_errors_naming_the_file)
{
    char **names = (char **)1;
    char *p = write_tmp("{not json");
    cr_assert_eq(probe_component_names_load(p, &names), PROBE_EFORMAT);
    cr_assert_null(names);
    cr_assert(strstr(probe_last_error(), p) != NULL, "%s", probe_last_error());
    unlink(p);
    p = write_tmp("{\"rows\": []}");
    cr_assert_eq(probe_component_names_load(p, &names), PROBE_EFORMAT);
    cr_assert(strstr(probe_last_error(), "no \"components\" list") != NULL, "%s", probe_last_error());
    unlink(p);
    setenv("PROBE_COMPONENTS", "/nonexistent/components.json", 1);
    cr_assert_eq(probe_component_names_load(NULL, &names), PROBE_EFORMAT);
    cr_assert(strstr(probe_last_error(), "/nonexistent/components.json") != NULL);
    unsetenv("PROBE_COMPONENTS");
    cr_assert_eq(probe_component_names_load(p, NULL), PROBE_EINVAL);
    probe_component_names_free(NULL);
}
