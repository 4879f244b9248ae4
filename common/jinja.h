/* jinja.h - a Jinja2 subset interpreter for chat templates, byte-exact with Python's jinja2. */
#ifndef RKV_JINJA_H
#define RKV_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* renders templates as HF transformers does: jinja2's
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
 * loop controls, raise_exception(msg), strftime_now(fmt) and a tojson that
 * keeps non-ASCII text (ensure_ascii=False).
 *
 * supported: {% for %} (loop.*, else, inline if, break/continue), {% if %}
 * / elif / else, {% set %} (names, ns.attr, tuples, block set with
 * filters), {% macro %} and calls, {% call %} with caller(), {% filter %},
 * {% with %}, {% generation %}, {% raw %}; literals, attribute/subscript
 * access, slices, ~ + - * / // % **, comparisons, and/or/not, in / not in,
 * x if c else y; the tests and filters real chat templates use (see
 * jinja.c's tables); str/dict methods. not supported: extends / include /
 * import / block, recursive loops, string % formatting, Python's unbounded
 * integers (64-bit here: overflow is an error), non-ASCII case mapping.
 *
 * memory: a template owns its syntax tree; a context owns the values built
 * into it; a render allocates from its own arena and frees it on return.
 * a render reads its template and context only, so one template (and one
 * context) may serve renders on several threads at once. */

struct jinja_tmpl;
struct jinja_ctx;
struct jinja_val; /* a value inside a jinja_ctx; freed with it */

/* limits of one render: any template stops with RKV_ETOOBIG when one is
 * reached (zero fields take the defaults below) */
struct jinja_limits {
    uint64_t max_steps; /* statements, expressions and element visits */
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of values a render may allocate */
    int max_depth;      /* macro calls and nested evaluation */
};
#define JINJA_DEFAULT_STEPS  (10u * 1000 * 1000)
#define JINJA_DEFAULT_OUTPUT (16u << 20)
#define JINJA_DEFAULT_MEMORY (256u << 20)
#define JINJA_DEFAULT_DEPTH  200
/* parse nesting cap (blocks inside blocks, brackets inside brackets) */
#define JINJA_MAX_NESTING 100

/* parses src (len bytes). name prefixes error messages: "chat template
 * line 3, column 14: unknown filter 'frobnicate'" (NULL: "template").
 * returns 0 or a negative RKV_E* code (RKV_EFORMAT for a syntax error,
 * RKV_EUNSUPPORTED for a construct outside the subset) with the message in
 * errbuf. */
int jinja_parse(const char *src, size_t len, const char *name, struct jinja_tmpl **out,
                char *errbuf, size_t errlen);
void jinja_destroy(struct jinja_tmpl *t);

/* the variables of a render */
int jinja_ctx_create(struct jinja_ctx **out);
void jinja_ctx_destroy(struct jinja_ctx *c);
/* binds name to v (a value of this context); rebinding replaces */
int jinja_ctx_set(struct jinja_ctx *c, const char *name, struct jinja_val *v);
/* every key of a JSON object becomes a variable */
int jinja_ctx_set_json(struct jinja_ctx *c, const char *json, size_t len, char *errbuf,
                       size_t errlen);
/* the clock strftime_now reads (local time, as Python's datetime.now());
 * without it, the time of the render */
void jinja_ctx_set_now(struct jinja_ctx *c, time_t now);

/* values: each returns NULL when memory runs out; the adders then return
 * RKV_ENOMEM, so a chain of calls needs one check at its end. strings are
 * copied, UTF-8. */
struct jinja_val *jinja_none(struct jinja_ctx *c);
struct jinja_val *jinja_bool(struct jinja_ctx *c, int b);
struct jinja_val *jinja_int(struct jinja_ctx *c, int64_t i);
struct jinja_val *jinja_float(struct jinja_ctx *c, double f);
struct jinja_val *jinja_str(struct jinja_ctx *c, const char *s, size_t len);
struct jinja_val *jinja_list(struct jinja_ctx *c);
struct jinja_val *jinja_dict(struct jinja_ctx *c);
int jinja_list_append(struct jinja_ctx *c, struct jinja_val *list, struct jinja_val *v);
/* insertion-ordered; setting a present key replaces its value in place */
int jinja_dict_set(struct jinja_ctx *c, struct jinja_val *dict, const char *key,
                   struct jinja_val *v);
/* JSON text -> value (objects keep their key order). an integral number
 * below 2^53 becomes an int, as JSON from an API client means it (cJSON
 * keeps no literal form, so 1.0 reads as 1). */
int jinja_from_json(struct jinja_ctx *c, const char *json, size_t len, struct jinja_val **out,
                    char *errbuf, size_t errlen);
/* the same from a parsed cJSON tree (a request's "messages" or "tools") */
struct cJSON;
int jinja_from_cjson(struct jinja_ctx *c, const struct cJSON *j, struct jinja_val **out);

/* renders t with c's variables into a malloc'd NUL-terminated string
 * (*out_len bytes, NUL excluded). lim may be NULL (defaults). errors:
 * RKV_EFORMAT for a failed operation (undefined value used, bad types,
 * raise_exception: the message is the template's), RKV_ETOOBIG for a
 * limit, RKV_ENOMEM; the message in errbuf names the line and column. */
int jinja_render(const struct jinja_tmpl *t, const struct jinja_ctx *c,
                 const struct jinja_limits *lim, char **out, size_t *out_len, char *errbuf,
                 size_t errlen);

#endif
