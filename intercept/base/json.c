/* json.c - JSON text: a growing buffer, string literals escaped as RFC 8259
 * section 7 says, and validation of one complete value (RFC 8259 grammar). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* ---- builder -------------------------------------------------------------- */

void shim_json_init(struct shim_json *b)
{
    memset(b, 0, sizeof *b);
}

void shim_json_free(struct shim_json *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int reserve(struct shim_json *b, size_t more)
{
    if (b->oom)
        return 0;
    if (b->len + more + 1 <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static void put(struct shim_json *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void shim_json_raw(struct shim_json *b, const char *s)
{
    put(b, s, strlen(s));
}

void shim_json_printf(struct shim_json *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid
 * (overlong forms, surrogates and code points above U+10FFFF rejected,
 * per RFC 3629 section 4). */
static size_t utf8_len(const unsigned char *s)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80)
            return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        return 4;
    }
    return 0;
}

void shim_json_string(struct shim_json *b, const char *s)
{
    if (!s) {
        shim_json_raw(b, "null");
        return;
    }
    put(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(b, e, 2);
            ++p;
        } else if (c < 0x20) {
            const char *e = NULL;
            switch (c) {
            case '\b': e = "\\b"; break;
            case '\f': e = "\\f"; break;
            case '\n': e = "\\n"; break;
            case '\r': e = "\\r"; break;
            case '\t': e = "\\t"; break;
            default: break;
            }
            if (e) {
                put(b, e, 2);
            } else {
                char u[8];
                snprintf(u, sizeof u, "\\u%04x", c);
                put(b, u, 6);
            }
            ++p;
        } else if (c < 0x80) {
            put(b, (const char *)p, 1);
            ++p;
        } else {
            size_t n = utf8_len(p);
            if (n) {
                put(b, (const char *)p, n);
                p += n;
            } else {
                put(b, "\xEF\xBF\xBD", 3); /* U+FFFD REPLACEMENT CHARACTER */
                ++p;
            }
        }
    }
    put(b, "\"", 1);
}

/* ---- validation (RFC 8259 grammar) ------------------------------------- */

struct parser {
    const char *s;
    int depth;
};

static void ws(struct parser *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        ++p->s;
}

static int hexd(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int pstring(struct parser *p)
{
    if (*p->s != '"')
        return 0;
    ++p->s;
    for (;;) {
        unsigned char c = (unsigned char)*p->s;
        if (c == '"') {
            ++p->s;
            return 1;
        }
        if (c < 0x20)
            return 0; /* includes the terminating NUL */
        if (c == '\\') {
            char e = p->s[1];
            if (e == 'u') {
                if (!hexd(p->s[2]) || !hexd(p->s[3]) || !hexd(p->s[4]) || !hexd(p->s[5]))
                    return 0;
                p->s += 6;
            } else if (e && strchr("\"\\/bfnrt", e)) {
                p->s += 2;
            } else {
                return 0;
            }
        } else if (c >= 0x80) {
            size_t n = utf8_len((const unsigned char *)p->s);
            if (!n)
                return 0;
            p->s += n;
        } else {
            ++p->s;
        }
    }
}

static int digits(struct parser *p)
{
    const char *start = p->s;
    while (*p->s >= '0' && *p->s <= '9')
        ++p->s;
    return p->s > start;
}

static int pnumber(struct parser *p)
{
    if (*p->s == '-')
        ++p->s;
    if (*p->s == '0')
        ++p->s;
    else if (!digits(p))
        return 0;
    if (*p->s == '.') {
        ++p->s;
        if (!digits(p))
            return 0;
    }
    if (*p->s == 'e' || *p->s == 'E') {
        ++p->s;
        if (*p->s == '+' || *p->s == '-')
            ++p->s;
        if (!digits(p))
            return 0;
    }
    return 1;
}

static int pvalue(struct parser *p);

static int pcontainer(struct parser *p, char open, char close)
{
    if (++p->depth > 64)
        return 0;
    ++p->s; /* open */
    ws(p);
    if (*p->s == close) {
        ++p->s;
        --p->depth;
        return 1;
    }
    for (;;) {
        if (open == '{') {
            if (!pstring(p))
                return 0;
            ws(p);
            if (*p->s != ':')
                return 0;
            ++p->s;
            ws(p);
        }
        if (!pvalue(p))
            return 0;
        ws(p);
        if (*p->s == ',') {
            ++p->s;
            ws(p);
            continue;
        }
        if (*p->s == close) {
            ++p->s;
            --p->depth;
            return 1;
        }
        return 0;
    }
}

static int pvalue(struct parser *p)
{
    switch (*p->s) {
    case '{': return pcontainer(p, '{', '}');
    case '[': return pcontainer(p, '[', ']');
    case '"': return pstring(p);
    case 't': return strncmp(p->s, "true", 4) == 0 ? (p->s += 4, 1) : 0;
    case 'f': return strncmp(p->s, "false", 5) == 0 ? (p->s += 5, 1) : 0;
    case 'n': return strncmp(p->s, "null", 4) == 0 ? (p->s += 4, 1) : 0;
    default: return pnumber(p);
    }
}

int shim_json_valid(const char *s)
{
    if (!s)
        return 0;
    struct parser p = {s, 0};
    ws(&p);
    if (!pvalue(&p))
        return 0;
    ws(&p);
    return *p.s == '\0';
}

