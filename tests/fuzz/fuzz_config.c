/* fuzz_config.c - config files of arbitrary bytes are parsed or refused, never crash. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/config.h"

struct conf {
    char name[32];
    int64_t n;
    uint64_t size;
    double x;
    int flag;
    int mode;
};
static const char *const modes[] = {"auto", "resident", "window", "cpu_tail", NULL};
static const struct cfg_key keys[] = {
    {"name", CFG_STR, offsetof(struct conf, name), 32},
    {"n", CFG_INT, offsetof(struct conf, n), .min = -5, .max = 1000},
    {"size", CFG_SIZE, offsetof(struct conf, size), .min = 0, .max = 1ll << 40},
    {"x", CFG_DOUBLE, offsetof(struct conf, x), .dmin = -1, .dmax = 1},
    {"flag", CFG_BOOL, offsetof(struct conf, flag)},
    {"mode", CFG_ENUM, offsetof(struct conf, mode), .names = modes},
};
static const struct cfg_spec spec = {"fuzz", NULL, keys, 6, NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/rkv-fuzz-config-%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    struct conf c = {0};
    char err[512];
    int pos;
    char *argv[] = {"fuzz", "--config", path, NULL};
    cfg_load(&spec, &c, 3, argv, &pos, err, sizeof err);
    /* values through the flag path too: the input split at NULs */
    size_t a = 0;
    for (size_t i = 0; i < size && i < 256; i++) {
        if (data[i] == 0) {
            char val[260];
            size_t n = i - a < 256 ? i - a : 255;
            for (size_t j = 0; j < n; j++)
                val[j] = (char)data[a + j];
            val[n] = 0;
            for (size_t k = 0; k < 6; k++)
                cfg_set(&keys[k], &c, val, err, sizeof err);
            a = i + 1;
        }
    }
    return 0;
}
