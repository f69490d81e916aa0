/* intercept/base/json.h - JSON text: a growing buffer, string escaping (RFC 8259 section 7) and validation. */
#ifndef PROBE_INTERCEPT_BASE_JSON_H
#define PROBE_INTERCEPT_BASE_JSON_H

#include <stddef.h>

struct shim_json {
    char *p;
    size_t len, cap;
    int oom;
};

void shim_json_init(struct shim_json *b);
void shim_json_free(struct shim_json *b);
void shim_json_raw(struct shim_json *b, const char *s);
void shim_json_printf(struct shim_json *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string literal: quotes, backslash and control
 * characters escaped (RFC 8259 section 7); bytes that are not valid UTF-8
 * become U+FFFD. NULL appends null. */
void shim_json_string(struct shim_json *b, const char *s);
/* 1 if s is one complete JSON value (RFC 8259), nesting at most 64 deep. */
int shim_json_valid(const char *s);

#endif
