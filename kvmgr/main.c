/* main.c - rkv-kvmgr: owns the KV pools, plans each session's tactic, leases block tables;
 * the process shell (configuration, signals, the request loop) around kvmgr/server.c. */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/err.h"
#include "common/gpu.h"
#include "common/log.h"
#include "common/util.h"
#include "kvmgr/server.h"
#include "proto/msg.h"

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const modes[] = {"auto", "resident", "window", "cpu_tail", NULL};
static const char *const rotations[] = {"off", "auto", "always", NULL}; /* enum plan_rotation */

#define K(n, t, f) n, t, offsetof(struct kvmgr_conf, f)
static const struct cfg_key keys[] = {
    {K("runtime_dir", CFG_STR, runtime_dir), 512, .def = "/run/rkv", .help = "sockets"},
    {K("listen", CFG_STR, listen), 600, .help = "default ipc://RUNTIME_DIR/kvmgr.sock"},
    {K("pub", CFG_STR, pub), 600, .help = "events; default ipc://RUNTIME_DIR/kvmgr-events.sock"},
    {K("backend", CFG_ENUM, backend), .names = backends, .def = "auto", .help = "pool kind"},
    {K("vram_target", CFG_SIZE, vram_target), .min = PROTO_MIN_BUDGET, .max = 1ll << 50,
     .def = "1GiB", .help = "per-GPU cap for weights + KV + compute reserve"},
    {K("host_budget", CFG_SIZE, host_budget), .min = 0, .max = 1ll << 50, .def = "1GiB",
     .help = "host RAM for KV"},
    {K("compute_reserve", CFG_SIZE, compute_reserve), .min = 0, .max = 1ll << 50, .def = "0",
     .help = "VRAM kept for activations (0 = the worker's measurement)"},
    {K("block_size", CFG_INT, block_size), .min = 1, .max = 65536, .def = "256",
     .help = "positions per block"},
    {K("mode", CFG_ENUM, mode), .names = modes, .def = "auto", .help = "tactic mode"},
    {K("workers", CFG_INT, workers), .min = 1, .max = KVMGR_MAX_GPUS, .def = "1",
     .help = "workers (one device pool each)"},
    {K("margin_pct", CFG_INT, margin_pct), .min = 0, .max = 50, .def = "5",
     .help = "promotion hysteresis, percent of the device pool"},
    {K("park_after_ms", CFG_INT, park_after_ms), .min = 0, .max = 3600000, .def = "500",
     .help = "an idle session keeps its blocks on the GPU this long before it may be parked "
             "for room (0 = at once)"},
    {K("rotation", CFG_ENUM, rotation), .names = rotations, .def = "auto",
     .help = "sessions that each fit take turns on the GPU instead of all streaming their tails: "
             "off, auto (where the rate model says it is faster) or always"},
    {K("max_stall_ms", CFG_INT, max_stall_ms), .min = 10, .max = 10000, .def = "1000",
     .help = "longest a rotated session waits for its turn (sets the rotation quantum)"},
    {K("log_level", CFG_ENUM, log_level), .names = rkv_log_level_names, .def = "info",
     .help = "log level"},
};
#undef K

static volatile sig_atomic_t g_stop;
static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

int main(int argc, char **argv)
{
    static struct kvmgr_conf c;
    char err[1024];
    rkv_log_init("rkv-kvmgr", RKV_LOG_INFO);
    static const struct cfg_spec spec = {"rkv-kvmgr", "[options]", keys,
                                         sizeof keys / sizeof keys[0], NULL};
    int rc = cfg_load_args(&spec, &c, argc, argv);
    if (rc)
        return rc == 1 ? 0 : 2;
    rkv_log_set_level(rkv_log_level_at(c.log_level));
    if (c.backend == 2) {
        if (rkv_gpu_count() < 0) {
            fprintf(stderr, "rkv-kvmgr: --backend cuda, but %s; or run with --backend cpu\n",
                    rkv_gpu_why());
            return 2;
        }
        /* the cuda context now, not inside the first worker's HELLO (~0.5 s) */
        size_t fr, tot;
        rkv_gpu_mem_info(0, &fr, &tot);
    }
    if (!c.listen[0])
        snprintf(c.listen, sizeof c.listen, "ipc://%s/kvmgr.sock", c.runtime_dir);
    if (!c.pub[0])
        snprintf(c.pub, sizeof c.pub, "ipc://%s/kvmgr-events.sock", c.runtime_dir);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct kvmgr *k;
    if ((rc = kvmgr_create(&c, &k, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    log_info("listening on %s, events on %s; waiting for workers", c.listen, c.pub);
    uint64_t last_tick = 0;
    while (!g_stop) {
        rc = kvmgr_serve(k, 50, err, sizeof err);
        if (rc && rc != RKV_ETIMEOUT && rc != -EAGAIN)
            log_ratelimited(RKV_LOG_WARN, 5000, 5, "bad request: %s", err);
        uint64_t now = rkv_now_ms();
        if (now - last_tick >= 100) {
            last_tick = now;
            kvmgr_tick(k, now);
        }
    }
    log_info("stopping");
    kvmgr_destroy(k);
    return 0;
}
