/* config.c - typed keys from defaults, a config file, RKV_* env and flags. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

static int fail(char *errbuf, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *errbuf, size_t errlen, int code, const char *fmt, ...)
{
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

int cfg_parse_size(const char *s, uint64_t *bytes)
{
    static const struct { const char *suffix; uint64_t mult; } units[] = {
        {"B", 1},           {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
        {"TiB", 1ull << 40}, {"K", 1ull << 10},   {"M", 1ull << 20},   {"G", 1ull << 30},
        {"T", 1ull << 40},   {"KB", 1000},        {"MB", 1000000},     {"GB", 1000000000},
        {"TB", 1000000000000ull},
    };
    if (!s || !*s)
        return RKV_EINVAL;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0 || isspace((unsigned char)*s))
        return RKV_EINVAL;
    uint64_t mult = 1ull << 20; /* a bare number is MiB */
    if (*end) {
        size_t i;
        for (i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcasecmp(end, units[i].suffix) == 0)
                break;
        if (i == sizeof units / sizeof units[0])
            return RKV_EINVAL;
        mult = units[i].mult;
    } else if (strchr(s, '.') || strchr(s, 'e') || strchr(s, 'E')) {
        /* fractions only with a unit, so "1.5" is not silently 1.5 MiB */
        return RKV_EINVAL;
    }
    double b = v * (double)mult;
    if (b >= 18446744073709551615.0)
        return RKV_ERANGE;
    *bytes = (uint64_t)llround(b);
    return 0;
}

void cfg_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, len, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, u[i]);
}

static int parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0)
            return *out = 1, 0;
        if (strcasecmp(s, no[i]) == 0)
            return *out = 0, 0;
    }
    return RKV_EINVAL;
}

static void enum_list(const struct cfg_key *k, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; k->names && k->names[i] && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? "|" : "", k->names[i]);
}

int cfg_set(const struct cfg_key *k, void *conf, const char *value, char *errbuf, size_t errlen)
{
    char *field = (char *)conf + k->offset;
    char *end;
    switch (k->type) {
    case CFG_STR: {
        size_t n = strlen(value);
        if (n >= k->size)
            return fail(errbuf, errlen, RKV_ETOOBIG, "%s: value is %zu bytes, at most %zu allowed",
                        k->name, n, k->size - 1);
        memcpy(field, value, n + 1);
        return 0;
    }
    case CFG_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (end == value || *end || errno)
            return fail(errbuf, errlen, RKV_EINVAL, "%s: expected an integer, got \"%s\"",
                        k->name, value);
        if (v < k->min || v > k->max)
            return fail(errbuf, errlen, RKV_ERANGE,
                        "%s: %lld is out of range, expected %" PRId64 "..%" PRId64, k->name, v,
                        k->min, k->max);
        *(int64_t *)field = v;
        return 0;
    }
    case CFG_SIZE: {
        uint64_t b;
        int rc = cfg_parse_size(value, &b);
        if (rc)
            return fail(errbuf, errlen, rc,
                        "%s: expected a size like 512MiB, 24GiB or 24000 (MiB), got \"%s\"",
                        k->name, value);
        if (b < (uint64_t)k->min || (k->max > 0 && b > (uint64_t)k->max)) {
            char lo[32], hi[32];
            cfg_format_size((uint64_t)k->min, lo, sizeof lo);
            cfg_format_size((uint64_t)k->max, hi, sizeof hi);
            return fail(errbuf, errlen, RKV_ERANGE, "%s: %s is out of range, expected %s..%s",
                        k->name, value, lo, hi);
        }
        *(uint64_t *)field = b;
        return 0;
    }
    case CFG_DOUBLE: {
        errno = 0;
        double v = strtod(value, &end);
        if (end == value || *end || errno || !isfinite(v))
            return fail(errbuf, errlen, RKV_EINVAL, "%s: expected a number, got \"%s\"",
                        k->name, value);
        if (v < k->dmin || v > k->dmax)
            return fail(errbuf, errlen, RKV_ERANGE, "%s: %g is out of range, expected %g..%g",
                        k->name, v, k->dmin, k->dmax);
        *(double *)field = v;
        return 0;
    }
    case CFG_BOOL:
        if (parse_bool(value, (int *)field))
            return fail(errbuf, errlen, RKV_EINVAL, "%s: expected true or false, got \"%s\"",
                        k->name, value);
        return 0;
    case CFG_ENUM:
        for (int i = 0; k->names && k->names[i]; i++) {
            if (strcmp(value, k->names[i]) == 0) {
                *(int *)field = i;
                return 0;
            }
        }
        {
            char list[256];
            enum_list(k, list, sizeof list);
            return fail(errbuf, errlen, RKV_EINVAL, "%s: expected one of %s, got \"%s\"",
                        k->name, list, value);
        }
    }
    return fail(errbuf, errlen, RKV_EINTERNAL, "%s: bad key type", k->name);
}

/* flag/file/env spellings of a key all normalize to the key name */
static void normalize(const char *in, size_t n, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < outlen; i++)
        out[o++] = in[i] == '-' ? '_' : (char)tolower((unsigned char)in[i]);
    out[o] = '\0';
}

/* the value --no-KEY sets for key k, or NULL when k is no switch */
static const char *switch_off(const struct cfg_key *k)
{
    if (k && k->type == CFG_BOOL)
        return "false";
    for (size_t i = 0; k && k->type == CFG_ENUM && k->names[i]; i++)
        if (strcmp(k->names[i], "off") == 0)
            return "off";
    return NULL;
}

const struct cfg_key *cfg_find(const struct cfg_spec *spec, const char *name)
{
    char norm[128];
    normalize(name, strlen(name), norm, sizeof norm);
    for (size_t i = 0; i < spec->n_keys; i++)
        if (strcmp(spec->keys[i].name, norm) == 0)
            return &spec->keys[i];
    return NULL;
}

/* the closest key by edit distance, for "did you mean" */
static const char *suggest(const struct cfg_spec *spec, const char *name)
{
    const char *best = NULL;
    size_t best_d = 3, n = strlen(name);
    if (n > 63)
        return NULL;
    for (size_t k = 0; k < spec->n_keys; k++) {
        const char *c = spec->keys[k].name;
        size_t m = strlen(c);
        if (m > 63)
            continue;
        size_t d[64][64];
        for (size_t i = 0; i <= n; i++)
            d[i][0] = i;
        for (size_t j = 0; j <= m; j++)
            d[0][j] = j;
        for (size_t i = 1; i <= n; i++)
            for (size_t j = 1; j <= m; j++) {
                size_t sub = d[i - 1][j - 1] + (name[i - 1] != c[j - 1]);
                size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
                d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            }
        if (d[n][m] < best_d) {
            best_d = d[n][m];
            best = c;
        }
    }
    return best;
}

static int unknown_key(const struct cfg_spec *spec, const char *where, const char *name,
                       char *errbuf, size_t errlen)
{
    char norm[128];
    const char *bare = name;
    while (*bare == '-')
        bare++;
    normalize(bare, strlen(bare), norm, sizeof norm);
    const char *s = suggest(spec, norm);
    if (s && bare != name) {
        /* a flag: suggest the flag */
        char flag[128];
        size_t o = 0;
        for (; s[o] && o + 1 < sizeof flag; o++)
            flag[o] = s[o] == '_' ? '-' : s[o];
        flag[o] = 0;
        return fail(errbuf, errlen, RKV_ENOTFOUND, "%s: unknown option \"%s\" (did you mean --%s?)",
                    where, name, flag);
    }
    if (s)
        return fail(errbuf, errlen, RKV_ENOTFOUND, "%s: unknown key \"%s\" (did you mean %s?)",
                    where, name, s);
    return fail(errbuf, errlen, RKV_ENOTFOUND, "%s: unknown %s \"%s\" (see %s --help)", where,
                bare != name ? "option" : "key", name, spec->prog);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int load_file(const struct cfg_spec *spec, void *conf, const char *path, char *errbuf,
                     size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fail(errbuf, errlen, -errno, "%s: cannot open config file: %s", path,
                    strerror(errno));
    char line[4096], where[512];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (!strchr(line, '\n') && !feof(f)) {
            rc = fail(errbuf, errlen, RKV_ETOOBIG, "%s: line longer than %zu bytes", where,
                      sizeof line - 1);
            break;
        }
        char *s = trim(line);
        if (*s == '\0' || *s == '#' || *s == ';')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = fail(errbuf, errlen, RKV_EFORMAT, "%s: expected \"key = value\", got \"%s\"",
                      where, s);
            break;
        }
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = '\0';
            val++;
        }
        const struct cfg_key *k = cfg_find(spec, key);
        if (!k || strcmp(key, k->name) != 0) {
            rc = unknown_key(spec, where, key, errbuf, errlen);
            break;
        }
        char sub[512];
        rc = cfg_set(k, conf, val, sub, sizeof sub);
        if (rc) {
            fail(errbuf, errlen, rc, "%s: %s", where, sub);
            break;
        }
    }
    fclose(f);
    return rc;
}

void cfg_print_help(const struct cfg_spec *spec, FILE *f)
{
    fprintf(f, "usage: %s %s\n\noptions (also config-file keys and RKV_* env vars):\n",
            spec->prog, spec->usage ? spec->usage : "[options]");
    fprintf(f, "  --config FILE%*s config file (default %s)\n", 21, "",
            spec->default_file ? spec->default_file : "none");
    for (size_t i = 0; i < spec->n_keys; i++) {
        const struct cfg_key *k = &spec->keys[i];
        char flag[64], list[256];
        size_t o = (size_t)snprintf(flag, sizeof flag, "--");
        for (const char *p = k->name; *p && o + 1 < sizeof flag; p++)
            flag[o++] = *p == '_' ? '-' : *p;
        flag[o] = '\0';
        const char *arg = k->type == CFG_SIZE     ? "SIZE"
                          : k->type == CFG_INT    ? "N"
                          : k->type == CFG_DOUBLE ? "X"
                          : k->type == CFG_BOOL   ? "BOOL"
                          : k->type == CFG_ENUM   ? (enum_list(k, list, sizeof list), list)
                                                  : "TEXT";
        char left[400];
        snprintf(left, sizeof left, "%s %s", flag, arg);
        fprintf(f, "  %-34s %s", left, k->help ? k->help : "");
        if (k->def && *k->def)
            fprintf(f, " (default %s)", k->def);
        fputc('\n', f);
    }
}

int cfg_load(const struct cfg_spec *spec, void *conf, int argc, char **argv, int *first_pos,
             char *errbuf, size_t errlen)
{
    char sub[512];
    int rc;
    if (first_pos)
        *first_pos = argc;

    /* defaults */
    for (size_t i = 0; i < spec->n_keys; i++) {
        const struct cfg_key *k = &spec->keys[i];
        if (!k->def)
            continue;
        if ((rc = cfg_set(k, conf, k->def, sub, sizeof sub)))
            return fail(errbuf, errlen, rc, "default: %s", sub);
    }

    /* find --config and --help first: the file is below env and flags */
    const char *file = NULL;
    int explicit_file = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            cfg_print_help(spec, stdout);
            return 1;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return fail(errbuf, errlen, RKV_EINVAL, "--config needs a file name");
            file = argv[++i];
            explicit_file = 1;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
            explicit_file = 1;
        }
    }
    if (!file) {
        const char *env = getenv("RKV_CONFIG");
        if (env && *env) {
            file = env;
            explicit_file = 1;
        }
    }
    if (!file && spec->default_file && access(spec->default_file, R_OK) == 0)
        file = spec->default_file;
    if (file && (explicit_file || access(file, R_OK) == 0))
        if ((rc = load_file(spec, conf, file, errbuf, errlen)))
            return rc;

    /* environment: only the keys we know are read */
    for (size_t i = 0; i < spec->n_keys; i++) {
        const struct cfg_key *k = &spec->keys[i];
        char env[128] = "RKV_";
        size_t o = 4;
        for (const char *p = k->name; *p && o + 1 < sizeof env; p++)
            env[o++] = (char)toupper((unsigned char)*p);
        env[o] = '\0';
        const char *v = getenv(env);
        if (!v)
            continue;
        if ((rc = cfg_set(k, conf, v, sub, sizeof sub)))
            return fail(errbuf, errlen, rc, "environment %s: %s", env, sub);
    }

    /* flags: --key value or --key=value; bools may omit the value */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            if (first_pos)
                *first_pos = i + 1 < argc ? i + 1 : argc;
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (first_pos)
                *first_pos = i;
            break;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        char key[128];
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        if (nl >= sizeof key)
            return fail(errbuf, errlen, RKV_EINVAL, "unknown option %.64s...", a);
        memcpy(key, name, nl);
        key[nl] = '\0';
        if (strcmp(key, "config") == 0) {
            if (!eq)
                i++;
            continue;
        }
        const struct cfg_key *k = cfg_find(spec, key);
        /* --no-KEY turns a switch off: a bool to false, an enum that has "off" to off */
        const char *off = !k && !eq && strncmp(key, "no-", 3) == 0 && !strchr(key, '_')
                              ? switch_off(cfg_find(spec, key + 3))
                              : NULL;
        if (off) {
            if ((rc = cfg_set(cfg_find(spec, key + 3), conf, off, sub, sizeof sub)))
                return fail(errbuf, errlen, rc, "--%s: %s", key, sub);
            continue;
        }
        if (!k || strchr(key, '_')) {
            char where[160];
            snprintf(where, sizeof where, "command line");
            return unknown_key(spec, where, a, errbuf, errlen);
        }
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (k->type == CFG_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0 ||
                                           parse_bool(argv[i + 1], &(int){0}) != 0)) {
            val = "true";
        } else {
            if (i + 1 >= argc)
                return fail(errbuf, errlen, RKV_EINVAL, "--%s needs a value", key);
            val = argv[++i];
        }
        if ((rc = cfg_set(k, conf, val, sub, sizeof sub))) {
            /* name the flag as it was typed, not the key */
            const char *colon = strchr(sub, ':');
            return fail(errbuf, errlen, rc, "--%s%s", key, colon ? colon : sub);
        }
    }
    return 0;
}

int cfg_load_args(const struct cfg_spec *spec, void *conf, int argc, char **argv)
{
    char err[1024];
    int pos, rc = cfg_load(spec, conf, argc, argv, &pos, err, sizeof err);
    if (rc == 1)
        return 1;
    if (rc) {
        log_error("%s: %s", spec->prog, err);
        return 2;
    }
    if (pos < argc) {
        /* "--flag word" where the flag is a switch and word is not true/false */
        const char *prev = pos > 0 ? argv[pos - 1] : "";
        const struct cfg_key *k = strncmp(prev, "--", 2) == 0 && !strchr(prev, '=')
                                      ? cfg_find(spec, prev + 2)
                                      : NULL;
        if (k && k->type == CFG_BOOL)
            log_error("%s: unexpected argument \"%s\": %s takes true or false (e.g. %s=false)",
                      spec->prog, argv[pos], prev, prev);
        else
            log_error("%s: unexpected argument \"%s\" (see %s --help)", spec->prog, argv[pos],
                      spec->prog);
        return 2;
    }
    return 0;
}
