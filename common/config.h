/* config.h - typed configuration from defaults, a file, RKV_* env and --flags. */
#ifndef RKV_CONFIG_H
#define RKV_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* every key: a config-file key `name`, a flag `--name` with '_' -> '-', and
 * an environment variable RKV_NAME (upper case). later sources win:
 * defaults < file < environment < flags. */
enum cfg_type {
    CFG_STR,    /* char[size] */
    CFG_INT,    /* int64_t, [min, max] */
    CFG_SIZE,   /* uint64_t bytes; "512MiB", "24GiB", "4096KiB", "24000" (= MiB) */
    CFG_DOUBLE, /* double, [dmin, dmax] */
    CFG_BOOL,   /* int: true/false/yes/no/on/off/1/0 */
    CFG_ENUM,   /* int index into names (NULL-terminated) */
};

struct cfg_key {
    const char *name;
    enum cfg_type type;
    size_t offset;            /* offsetof(struct your_conf, field) */
    size_t size;              /* CFG_STR: buffer size */
    int64_t min, max;         /* CFG_INT, CFG_SIZE (bytes) */
    double dmin, dmax;        /* CFG_DOUBLE */
    const char *const *names; /* CFG_ENUM */
    const char *def;          /* default, as text (NULL = zero / empty) */
    const char *help;         /* one line for --help */
};

struct cfg_spec {
    const char *prog;          /* "rkvd" */
    const char *usage;         /* text after "usage: prog " */
    const struct cfg_key *keys;
    size_t n_keys;
    const char *default_file;  /* read when present and --config is not given */
};

/* parses everything into conf. --config FILE names the file (an explicit
 * file must exist). --help prints help to stdout and returns 1. --no-KEY
 * turns a switch off: a bool key to false, an enum key with an "off" value
 * to off. argv
 * elements that are not flags are positional: their indexes go to
 * *first_pos (argc if none; positionals after the first stay in argv).
 * on error returns <0 with a message naming the source, key and expected
 * value in errbuf. */
int cfg_load(const struct cfg_spec *spec, void *conf, int argc, char **argv, int *first_pos,
             char *errbuf, size_t errlen);

/* cfg_load for a program's main(): no positional arguments allowed, errors
 * logged (log_error: journald sees them as errors) as "PROG: message".
 * 0: go on; 1: --help was printed (exit 0); 2: a usage error (exit 2). */
int cfg_load_args(const struct cfg_spec *spec, void *conf, int argc, char **argv);

/* one value into one key (runtime changes: budgets from rkvctl) */
int cfg_set(const struct cfg_key *key, void *conf, const char *value, char *errbuf,
            size_t errlen);
const struct cfg_key *cfg_find(const struct cfg_spec *spec, const char *name);
void cfg_print_help(const struct cfg_spec *spec, FILE *f);

/* "512MiB", "24GiB", "1.5GiB", "4096KiB", "100B", "24000" (bare = MiB) */
int cfg_parse_size(const char *s, uint64_t *bytes);
/* 1536 MiB -> "1.50 GiB" */
void cfg_format_size(uint64_t bytes, char *buf, size_t len);

#endif
