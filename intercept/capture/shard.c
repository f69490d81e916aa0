/* shard.c - PROBE_SHARD: how the tensors of a sharded run (sequence or CFG
 * parallelism over NCCL, one capture file per rank) are split across ranks,
 * for the manifest key "shard" (docs/nccl.md "PROBE_SHARD").
 *
 *   spec := item (',' item)*       blank items and spaces around items ignored
 *   item := GLOB '=' AXIS          the last '=' separates; GLOB non-empty
 *   AXIS := decimal 0..15          the tensor axis along which the ranks' pieces
 *                                  are concatenated (0 = outermost)
 *
 * GLOB is matched as PROBE_CAPTURE's globs are (fnmatch(3) without flags on
 * the dataset path; a glob without a leading '/' also matches the path
 * without it); the shim only records it: the compare side applies it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/shim.h"
#include "capture/shard.h"



static struct shim_shard_item *items;
static size_t nitems;
static char *shard_error; /* PROBE_SHARD rejected: why */

probe_status shim_shard_parse(const char *spec, struct shim_shard_item **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    if (!spec)
        return PROBE_OK;
    size_t n = 1;
    for (const char *c = spec; *c; ++c)
        n += *c == ',';
    struct shim_shard_item *v = calloc(n, sizeof *v);
    char *copy = strdup(spec);
    if (!v || !copy) {
        free(v);
        free(copy);
        return probe_set_error(PROBE_ENOMEM, "PROBE_SHARD: out of memory");
    }
    size_t k = 0;
    probe_status st = PROBE_OK;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!*(tok = shim_trim_spaces(tok)))
            continue;
        char *eq = strrchr(tok, '=');
        if (!eq) {
            st = probe_set_error(PROBE_EINVAL, "item '%s' is not GLOB=AXIS", tok);
            break;
        }
        if (eq == tok) {
            st = probe_set_error(PROBE_EINVAL, "item '%s' has no glob before '='", tok);
            break;
        }
        if ((size_t)(eq - tok) >= SHIM_PATH_MAX) {
            st = probe_set_error(PROBE_EINVAL, "item '%.40s...' has a glob of %zu bytes (at most %d)",
                                 tok, (size_t)(eq - tok), SHIM_PATH_MAX - 1);
            break;
        }
        const char *a = eq + 1;
        int axis = 0, digits = 0;
        for (; *a >= '0' && *a <= '9' && digits < 3; ++a, ++digits)
            axis = axis * 10 + (*a - '0');
        if (digits == 0 || *a || axis >= PROBE_MAX_RANK) {
            st = probe_set_error(PROBE_EINVAL, "item '%s': axis '%s' is not a number 0..%d", tok,
                                 eq + 1, PROBE_MAX_RANK - 1);
            break;
        }
        *eq = '\0';
        v[k].glob = strdup(tok);
        if (!v[k].glob) {
            st = probe_set_error(PROBE_ENOMEM, "PROBE_SHARD: out of memory");
            break;
        }
        v[k++].axis = axis;
    }
    free(copy);
    if (st != PROBE_OK) {
        for (size_t i = 0; i < k; ++i)
            free(v[i].glob);
        free(v);
        return st;
    }
    *out = v;
    *nout = k;
    return PROBE_OK;
}

void shim_shard_config(void)
{
    const char *spec = shim_env_raw("PROBE_SHARD");
    if (!spec || !*spec)
        return;
    if (shim_shard_parse(spec, &items, &nitems) != PROBE_OK) {
        shard_error = strdup(probe_last_error());
        shim_warn("PROBE_SHARD='%s': %s; the manifest gets no \"shard\" key", spec,
                  shard_error ? shard_error : "bad spec");
    }
}

void shim_shard_json(struct shim_json *b)
{
    if (shard_error) {
        shim_json_raw(b, ",\"shard_error\":");
        shim_json_string(b, shard_error);
        return;
    }
    if (nitems == 0)
        return;
    shim_json_raw(b, ",\"shard\":[");
    for (size_t i = 0; i < nitems; ++i) {
        shim_json_raw(b, i ? ",{\"glob\":" : "{\"glob\":");
        shim_json_string(b, items[i].glob);
        shim_json_printf(b, ",\"axis\":%d}", items[i].axis);
    }
    shim_json_raw(b, "]");
}
