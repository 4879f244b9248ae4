/* main.c - rkvctl: the admin CLI of rkvd (status, budgets, mode, tactics, sessions, workers,
 * events, keys). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cli/rkvctl/rkvctl.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "proto/proto.h"
#include "proto/sock.h"

#define PROG     "rkvctl"
#define MAX_OPTS 16
#define MAX_POS  8

static const char *const g_tactics[] = {"resident", "window", "cpu_tail", "parked"};

/* --- command line ------------------------------------------------------------------- */

struct opt_spec {
    const char *name;
    int value; /* 0 flag, 1 value, 2 optional number */
};

static const struct opt_spec g_specs[] = {
    {"socket", 1},     {"json", 0},        {"timeout", 1},        {"help", 0},
    {"gpu", 1},        {"vram-target", 1}, {"host-budget", 1},    {"compute-reserve", 1},
    {"watch", 2},      {"count", 1},       {"since", 1},          {"session", 1},
    {"limit", 1},      {"follow", 0},      {"scope", 1},          {"off", 0},
    {"rpm", 1},        {"tpm", 1},         {"max-concurrent", 1}, {"max-tokens", 1},
    {"max-prompt", 1},
};

struct cli {
    const char *socket;
    char socket_buf[600];
    int json;
    int timeout_ms;
    const char *pos[MAX_POS];
    int n_pos;
    const char *opt_name[MAX_OPTS];
    const char *opt_val[MAX_OPTS];
    int n_opts;
    const char *topic; /* help topic of the command */
    struct proto_sock *sock;
};

static volatile sig_atomic_t g_stop;
static void on_sigint(int sig)
{
    (void)sig;
    g_stop = 1;
}

__attribute__((format(printf, 1, 2), noreturn)) static void usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(RKVCTL_USAGE);
}

static const char *opt(const struct cli *c, const char *name)
{
    for (int i = 0; i < c->n_opts; i++)
        if (strcmp(c->opt_name[i], name) == 0)
            return c->opt_val[i] ? c->opt_val[i] : "";
    return NULL;
}

static void parse_argv(struct cli *c, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0)
            a = "--help";
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            if (c->n_pos == MAX_POS)
                usage("too many arguments (see rkvctl --help)");
            c->pos[c->n_pos++] = a;
            continue;
        }
        char name[64];
        const char *eq = strchr(a + 2, '='), *val = NULL;
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a - 2) : 60, a + 2);
        const struct opt_spec *sp = NULL;
        for (size_t k = 0; k < sizeof g_specs / sizeof g_specs[0]; k++)
            if (strcmp(g_specs[k].name, name) == 0)
                sp = &g_specs[k];
        if (!sp)
            usage("unknown option --%s (see rkvctl --help)", name);
        if (eq) {
            if (!sp->value)
                usage("--%s takes no value", name);
            val = eq + 1;
        } else if (sp->value == 1) {
            if (i + 1 >= argc)
                usage("--%s needs a value (see rkvctl help)", name);
            val = argv[++i];
        } else if (sp->value == 2 && i + 1 < argc && argv[i + 1][0] >= '0' &&
                   argv[i + 1][0] <= '9') {
            val = argv[++i];
        }
        if (c->n_opts == MAX_OPTS)
            usage("too many options");
        c->opt_name[c->n_opts] = sp->name;
        c->opt_val[c->n_opts++] = val;
    }
}

/* refuses options the command does not take */
static void allow(const struct cli *c, const char *names)
{
    static const char *const globals = " socket json timeout help ";
    for (int i = 0; i < c->n_opts; i++) {
        char pat[80];
        snprintf(pat, sizeof pat, " %s ", c->opt_name[i]);
        char list[200];
        snprintf(list, sizeof list, " %s ", names);
        if (!strstr(globals, pat) && !strstr(list, pat))
            usage("%s does not take --%s (see rkvctl %s --help)", c->topic, c->opt_name[i],
                  c->topic);
    }
}

static void want_pos(const struct cli *c, int n, const char *what)
{
    if (c->n_pos < n)
        usage("%s: missing %s (see rkvctl %s --help)", c->topic, what, c->topic);
    if (c->n_pos > n)
        usage("%s: unexpected argument \"%s\" (see rkvctl %s --help)", c->topic, c->pos[n],
              c->topic);
}

static long num_opt(const struct cli *c, const char *name, long min, long max, long def)
{
    const char *v = opt(c, name);
    if (!v || !*v)
        return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < min || x > max)
        usage("--%s: expected a whole number from %ld to %ld, got \"%s\"", name, min, max, v);
    return x;
}

/* --- talking to rkvd ------------------------------------------------------------------ */

__attribute__((noreturn)) static void unreachable(const struct cli *c, const char *why)
{
    fprintf(stderr,
            PROG ": cannot reach rkvd at %s: %s (is rkvd running? check systemctl status rkvd, "
                 "or pass --socket PATH / set RKV_RUNTIME_DIR)\n",
            c->socket, why);
    exit(RKVCTL_UNREACHABLE);
}

/* a plain connect first: a missing or dead socket fails at once, not after a
 * timeout. the probe completes nng's SP handshake (REQ0 to REP0) and stays
 * connected until rkvctl exits: a peer that leaves mid-handshake stops nng
 * 1.5 from accepting (rkvd then re-listens, dropping every connection). */
static int g_probe_fd = -1;

static void probe(const struct cli *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(c->socket) >= sizeof sa.sun_path)
        usage("--socket: the path is longer than %zu bytes", sizeof sa.sun_path - 1);
    strcpy(sa.sun_path, c->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        unreachable(c, strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT)
            unreachable(c, "no such socket");
        if (e == ECONNREFUSED)
            unreachable(c, "nobody listens there (a stale socket)");
        if (e == EACCES) {
            fprintf(stderr,
                    PROG ": no permission to open %s: run as a member of the socket's group "
                         "(rkvd's admin_group, usually rkv) or as root\n",
                    c->socket);
            exit(RKVCTL_UNREACHABLE);
        }
        unreachable(c, strerror(e));
    }
    /* SP header: 0, 'S', 'P', 0, protocol (be16), 0, 0; req0 = 0x30, rep0 = 0x31 */
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
    unsigned char back[8];
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    ssize_t n = write(fd, hello, sizeof hello);
    while (n == (ssize_t)sizeof hello && got < sizeof back) {
        ssize_t r = read(fd, back + got, sizeof back - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    g_probe_fd = fd; /* closed at exit, long after nng started the pipe */
    if (got < sizeof back || back[1] != 'S' || back[2] != 'P' || back[5] != 0x31)
        unreachable(c, "something listens there, but it is not rkvd's admin socket");
}

static void print_error_json(int rc, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", 0);
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddNumberToObject(e, "code", rc);
    cJSON_AddStringToObject(e, "name", rkv_strerror(rc));
    cJSON_AddStringToObject(e, "message", msg);
    char *s = cJSON_Print(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
}

/* runs cmd; returns the result (the caller frees) or exits 2/3 */
static cJSON *call(struct cli *c, const char *cmd, cJSON *args)
{
    char err[600];
    if (!c->sock) {
        probe(c);
        char url[700];
        snprintf(url, sizeof url, "ipc://%s", c->socket);
        if (proto_sock_open(&c->sock, PROTO_SOCK_REQ, url, err, sizeof err))
            unreachable(c, err);
    }
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "cmd", cmd);
    cJSON_AddItemToObject(req, "args", args ? args : cJSON_CreateObject());
    char *text = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    struct proto_in reply;
    int rc = proto_call(c->sock, PROTO_MSG_ADMIN_REQ, text, strlen(text), &reply, c->timeout_ms,
                        err, sizeof err);
    free(text);
    if (rc == RKV_ETIMEOUT || rc == RKV_ECLOSED) {
        char why[700];
        snprintf(why, sizeof why, "no answer within %d s", c->timeout_ms / 1000);
        unreachable(c, why);
    }
    if (rc) {
        /* the daemon's message names the value and what it expects */
        if (c->json)
            print_error_json(rc, err);
        fprintf(stderr, PROG ": %s\n", err);
        exit(RKVCTL_REFUSED);
    }
    cJSON *body = cJSON_ParseWithLength(reply.payload, reply.len);
    proto_in_fini(&reply);
    cJSON *res = cJSON_DetachItemFromObjectCaseSensitive(body, "result");
    cJSON_Delete(body);
    if (!res) {
        fprintf(stderr,
                PROG ": rkvd sent a malformed answer to %s: rkvctl and rkvd may be "
                     "from different builds\n",
                cmd);
        exit(RKVCTL_REFUSED);
    }
    return res;
}

static void print_json(const cJSON *res, int one_line)
{
    char *s = one_line ? cJSON_PrintUnformatted(res) : cJSON_Print(res);
    printf("%s\n", s);
    free(s);
    fflush(stdout);
}

/* --- formatting ---------------------------------------------------------------------- */

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static int yes(const cJSON *o, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static const cJSON *obj(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* size as text; rotates through a few buffers so one printf can hold several */
static const char *sz(double bytes)
{
    static char buf[8][32];
    static int i;
    i = (i + 1) % 8;
    cfg_format_size((uint64_t)bytes, buf[i], sizeof buf[i]);
    return buf[i];
}

static const char *dur(double ms)
{
    static char buf[4][32];
    static int i;
    i = (i + 1) % 4;
    uint64_t s = (uint64_t)(ms / 1000);
    if (s < 60)
        snprintf(buf[i], sizeof buf[i], "%llus", (unsigned long long)s);
    else if (s < 3600)
        snprintf(buf[i], sizeof buf[i], "%llum %llus", (unsigned long long)s / 60,
                 (unsigned long long)s % 60);
    else if (s < 86400)
        snprintf(buf[i], sizeof buf[i], "%lluh %llum", (unsigned long long)s / 3600,
                 (unsigned long long)s % 3600 / 60);
    else
        snprintf(buf[i], sizeof buf[i], "%llud %lluh", (unsigned long long)s / 86400,
                 (unsigned long long)s % 86400 / 3600);
    return buf[i];
}

static const char *clock_time(double ts_ms)
{
    static char buf[32];
    time_t t = (time_t)(ts_ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

static void print_workers(const cJSON *arr)
{
    printf("  %-6s %-5s %-8s %-9s %-4s %-8s %-15s %s\n", "worker", "gpu", "pid", "state", "up",
           "restarts", "tokens", "step");
    const cJSON *w;
    cJSON_ArrayForEach(w, arr)
    {
        char gpu[16];
        if (num(w, "gpu") < 0)
            snprintf(gpu, sizeof gpu, "cpu");
        else
            snprintf(gpu, sizeof gpu, "%.0f", num(w, "gpu"));
        /* the step's tokens / a prompt's chunk / the prompt tokens of a step beside a
         * decode, once the worker's hello set them */
        char steps[48] = "-";
        if (num(w, "max_batch_tokens") > 0)
            snprintf(steps, sizeof steps, "%.0f/%.0f/%.0f", num(w, "max_batch_tokens"),
                     num(w, "prefill_chunk"), num(w, "prefill_beside_decode"));
        printf("  %-6.0f %-5s %-8.0f %-9s %-4s %-8.0f %-15s %.1f ms%s\n", num(w, "id"), gpu,
               num(w, "pid"), str(w, "state"), yes(w, "up") ? "yes" : "no", num(w, "restarts"),
               steps, num(w, "step_ms"), yes(w, "draining") ? "  (draining)" : "");
    }
}

static void print_status(const cJSON *r)
{
    const cJSON *k = obj(r, "kvmgr"), *b = obj(r, "budgets"), *p = obj(r, "pool"),
                *q = obj(r, "requests"), *t = obj(r, "tokens");
    printf("rkv %s  model %s (%s backend%s)  listening on %s\n", str(r, "version"), str(r, "model"),
           str(r, "backend"), yes(r, "deterministic") ? ", deterministic" : "", str(r, "listen"));
    printf("uptime %s, %s%s%s\n", dur(num(r, "uptime_ms")),
           yes(r, "healthy") ? "healthy" : "UNHEALTHY", yes(r, "healthy") ? "" : ": ",
           str(r, "health_reason"));
    printf("kvmgr: %s, pid %.0f, mode %s, %.0f session(s), %.0f restart(s)\n",
           yes(k, "up") ? "up" : "DOWN", num(k, "pid"), str(k, "mode"), num(k, "sessions"),
           num(k, "restarts"));
    printf("workers:\n");
    print_workers(obj(r, "workers"));
    const cJSON *per = obj(r, "sessions_per_gpu"), *n;
    int g = 0;
    printf("sessions per gpu:");
    cJSON_ArrayForEach(n, per) printf("%s %d: %.0f", g ? "," : "", g, n->valuedouble), g++;
    printf("\n");
    printf("budgets: vram target %s, host %s, compute reserve %s\n", sz(num(b, "vram_target")),
           sz(num(b, "host_budget")), sz(num(b, "compute_reserve")));
    printf("pools: device %s of %s, host %s of %s (block size %.0f, context %.0f)\n",
           sz(num(p, "device_used")), sz(num(p, "device_total")), sz(num(p, "host_used")),
           sz(num(p, "host_total")), num(r, "block_size"), num(r, "ctx_size"));
    printf("kv: %s, %.0f bytes a token\n", str(p, "kv_dtype"), num(p, "kv_bytes_per_token"));
    printf("requests: %.0f running, %.0f waiting, %.0f named session(s)\n", num(q, "running"),
           num(q, "waiting"), num(q, "sessions"));
    printf("tokens: %.1f/s now, %.0f generated, %.0f prompt (%.0f from reused KV)\n",
           num(t, "per_second"), num(t, "generated"), num(t, "prompt"), num(t, "cached"));
    printf("api keys: %.0f\n", num(r, "api_keys"));
}

static void print_bars(const cJSON *res)
{
    const cJSON *g;
    cJSON_ArrayForEach(g, obj(res, "gpus"))
    {
        const cJSON *s = obj(g, "sessions"), *b = obj(g, "bytes");
        double max = 1;
        for (int t = 0; t < 4; t++)
            if (num(s, g_tactics[t]) > max)
                max = num(s, g_tactics[t]);
        printf("GPU %.0f   device %s / %s   host %s / %s\n", num(g, "gpu"),
               sz(num(g, "device_used")), sz(num(g, "device_total")), sz(num(g, "host_used")),
               sz(num(g, "host_total")));
        for (int t = 0; t < 4; t++) {
            double n = num(s, g_tactics[t]);
            int w = (int)(40 * n / max + 0.5);
            /* a block is 3 bytes of UTF-8: pad by hand, printf counts bytes */
            char bar[200];
            size_t len = 0;
            for (int i = 0; i < 40; i++)
                len += (size_t)snprintf(bar + len, sizeof bar - len, "%s", i < w ? "\u2588" : " ");
            printf("  %-9s %s %5.0f session(s) %12s\n", g_tactics[t], bar, n,
                   sz(num(b, g_tactics[t])));
        }
        if (num(g, "rotated") > 0)
            printf("  %.0f of the parked wait for a rotation turn (their requests run)\n",
                   num(g, "rotated"));
    }
}

static void print_session_row(const cJSON *s)
{
    char idle[32] = "-";
    if (num(s, "idle_ms") > 0)
        snprintf(idle, sizeof idle, "%s", dur(num(s, "idle_ms")));
    printf("%-24.24s #%-6.0f %-6.0f %-9s %8.0f %8.0f %10s %-7s %-4s %s\n",
           str(s, "id")[0] ? str(s, "id") : "(private)", num(s, "sid"), num(s, "worker"),
           str(s, "tactic"), num(s, "tokens"), num(s, "tail_tokens"), sz(num(s, "kv_bytes")),
           yes(s, "pinned") ? "pinned" : "", yes(s, "busy") ? "busy" : "", idle);
}

static void print_session_head(void)
{
    printf("%-24s %-7s %-6s %-9s %8s %8s %10s %-7s %-4s %s\n", "session", "#", "worker",
           "tactic", "tokens", "tail", "kv", "", "", "idle");
}

static void print_event(const cJSON *e)
{
    printf("%s  session #%-6.0f gpu %-2.0f %-8s -> %-8s %-10s %s\n", clock_time(num(e, "ts_ms")),
           num(e, "session"), num(e, "gpu"), str(e, "from"), str(e, "to"),
           sz(num(e, "bytes_moved")), str(e, "reason"));
}

/* --- commands ------------------------------------------------------------------------- */

/* sessions per gpu (worker), from rkvd's session list: where each one runs now */
static void add_sessions_per_gpu(struct cli *c, cJSON *r)
{
    cJSON *l = call(c, "sessions_list", NULL), *arr = cJSON_CreateArray();
    int n = cJSON_GetArraySize(obj(r, "workers"));
    for (int g = 0; g < n; g++) {
        int k = 0;
        const cJSON *s;
        cJSON_ArrayForEach(s, obj(l, "sessions")) k += num(s, "worker") == g;
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(k));
    }
    cJSON_AddItemToObject(r, "sessions_per_gpu", arr);
    cJSON_Delete(l);
}

static int cmd_status(struct cli *c)
{
    allow(c, "");
    want_pos(c, 0, "");
    cJSON *r = call(c, "status", NULL);
    add_sessions_per_gpu(c, r);
    c->json ? print_json(r, 0) : print_status(r);
    cJSON_Delete(r);
    return 0;
}

static void size_arg(cJSON *args, const struct cli *c, const char *flag, const char *field)
{
    const char *v = opt(c, flag);
    uint64_t b;
    if (!v)
        return;
    if (cfg_parse_size(v, &b) != 0)
        usage("--%s: expected a size like 512MiB, 24GiB, 64KiB or a number of MiB, got \"%s\"",
              flag, v);
    cJSON_AddNumberToObject(args, field, (double)b);
}

static int cmd_budget(struct cli *c)
{
    const char *sub = c->n_pos ? c->pos[0] : "get";
    c->n_pos = c->n_pos ? c->n_pos - 1 : 0;
    memmove(c->pos, c->pos + 1, sizeof c->pos - sizeof c->pos[0]);
    cJSON *args = cJSON_CreateObject();
    if (opt(c, "gpu"))
        cJSON_AddNumberToObject(args, "gpu", (double)num_opt(c, "gpu", 0, 1023, 0));
    cJSON *r;
    if (!strcmp(sub, "get")) {
        allow(c, "gpu");
        want_pos(c, 0, "");
        r = call(c, "budget_get", args);
        if (!c->json) {
            const cJSON *b = obj(r, "budget");
            printf("vram target      %s\nhost budget      %s\ncompute reserve  %s%s\n",
                   sz(num(b, "vram_target")), sz(num(b, "host_budget")),
                   sz(num(b, "compute_reserve")),
                   yes(r, "set_at_runtime") ? "\n(set at runtime with rkvctl)" : "");
        }
    } else if (!strcmp(sub, "set")) {
        allow(c, "gpu vram-target host-budget compute-reserve");
        want_pos(c, 0, "");
        size_arg(args, c, "vram-target", "vram_target");
        size_arg(args, c, "host-budget", "host_budget");
        size_arg(args, c, "compute-reserve", "compute_reserve");
        if (!opt(c, "vram-target") && !opt(c, "host-budget") && !opt(c, "compute-reserve"))
            usage("budget set: give at least one of --vram-target, --host-budget, "
                  "--compute-reserve (see rkvctl budget --help)");
        r = call(c, "budget_set", args);
        if (!c->json) {
            const cJSON *b = obj(r, "budget"), *line;
            printf("budgets applied and persisted: vram target %s, host %s, compute reserve "
                   "%s\nre-plan:\n",
                   sz(num(b, "vram_target")), sz(num(b, "host_budget")),
                   sz(num(b, "compute_reserve")));
            cJSON_ArrayForEach(line, obj(r, "summary")) printf("  %s\n", line->valuestring);
            if (str(r, "note")[0])
                printf("note: %s\n", str(r, "note"));
        }
    } else {
        cJSON_Delete(args);
        usage("budget: unknown subcommand \"%s\" (get or set)", sub);
    }
    if (c->json)
        print_json(r, 0);
    cJSON_Delete(r);
    return 0;
}

static int cmd_mode(struct cli *c)
{
    allow(c, "");
    const char *sub = c->n_pos ? c->pos[0] : "get";
    cJSON *r;
    if (!strcmp(sub, "get")) {
        if (c->n_pos > 1)
            usage("mode get: unexpected argument \"%s\"", c->pos[1]);
        r = call(c, "mode_get", NULL);
    } else if (!strcmp(sub, "set")) {
        if (c->n_pos != 2)
            usage("mode set: give one mode: auto, resident, window or cpu_tail");
        const char *m = c->pos[1];
        if (strcmp(m, "auto") && strcmp(m, "resident") && strcmp(m, "window") &&
            strcmp(m, "cpu_tail"))
            usage("mode set: expected auto, resident, window or cpu_tail, got \"%s\"", m);
        cJSON *args = cJSON_CreateObject();
        cJSON_AddStringToObject(args, "mode", m);
        r = call(c, "mode_set", args);
    } else {
        usage("mode: unknown subcommand \"%s\" (get or set)", sub);
    }
    c->json ? print_json(r, 0) : (void)printf("%s\n", str(r, "mode"));
    cJSON_Delete(r);
    return 0;
}

static void sleep_interruptible(double sec)
{
    for (double t = 0; t < sec && !g_stop; t += 0.05)
        rkv_sleep_ms(50);
}

static int cmd_tactics(struct cli *c)
{
    allow(c, "gpu watch count");
    want_pos(c, 0, "");
    int watch = opt(c, "watch") != NULL;
    double every = 1;
    const char *w = opt(c, "watch");
    if (w && *w) {
        char *end;
        every = strtod(w, &end);
        if (*end || every < 0.1 || every > 3600)
            usage("--watch: expected seconds from 0.1 to 3600, got \"%s\"", w);
    }
    long count = num_opt(c, "count", 1, 1000000, watch ? 0 : 1);
    int tty = isatty(STDOUT_FILENO);
    for (long n = 0; !g_stop && (count == 0 || n < count); n++) {
        if (n)
            sleep_interruptible(every);
        if (g_stop)
            break;
        cJSON *args = cJSON_CreateObject();
        if (opt(c, "gpu"))
            cJSON_AddNumberToObject(args, "gpu", (double)num_opt(c, "gpu", 0, 1023, 0));
        cJSON *r = call(c, "tactics", args);
        if (c->json) {
            print_json(r, watch);
        } else {
            if (watch && tty)
                printf("\033[H\033[J"); /* home and clear: redraw in place */
            if (watch)
                printf("rkv tactics, every %gs (Ctrl-C to stop)  %s\n\n", every,
                       clock_time((double)rkv_wall_ms()));
            print_bars(r);
            if (watch && !tty)
                printf("\n");
            fflush(stdout);
        }
        cJSON_Delete(r);
    }
    return 0;
}

static cJSON *session_args(struct cli *c)
{
    want_pos(c, 2, "the session ID (see rkvctl sessions list)");
    cJSON *args = cJSON_CreateObject();
    cJSON_AddStringToObject(args, "session", c->pos[1]);
    return args;
}

static int cmd_sessions(struct cli *c)
{
    allow(c, "");
    const char *sub = c->n_pos ? c->pos[0] : "list";
    cJSON *r;
    if (!strcmp(sub, "list")) {
        if (c->n_pos > 1)
            usage("sessions list: unexpected argument \"%s\"", c->pos[1]);
        r = call(c, "sessions_list", NULL);
        if (!c->json) {
            print_session_head();
            const cJSON *s;
            cJSON_ArrayForEach(s, obj(r, "sessions")) print_session_row(s);
        }
    } else if (!strcmp(sub, "show")) {
        r = call(c, "session_show", session_args(c));
        if (!c->json) {
            print_session_head();
            print_session_row(obj(r, "session"));
            const cJSON *e;
            printf("\nrecent transitions:\n");
            cJSON_ArrayForEach(e, obj(r, "events")) print_event(e);
        }
    } else if (!strcmp(sub, "evict") || !strcmp(sub, "pin") || !strcmp(sub, "unpin")) {
        char cmd[32];
        snprintf(cmd, sizeof cmd, "session_%s", sub);
        r = call(c, cmd, session_args(c));
        if (!c->json)
            printf("session %s (#%.0f) %s\n", str(r, "id")[0] ? str(r, "id") : "(private)",
                   num(r, "sid"),
                   !strcmp(sub, "evict") ? "evicted: its KV is freed"
                   : !strcmp(sub, "pin") ? "pinned: kept resident from its next step on"
                                         : "unpinned");
    } else {
        usage("sessions: unknown subcommand \"%s\" (list, show, evict, pin, unpin)", sub);
    }
    if (c->json)
        print_json(r, 0);
    cJSON_Delete(r);
    return 0;
}

static int cmd_workers(struct cli *c)
{
    const char *sub = c->n_pos ? c->pos[0] : "list";
    cJSON *r;
    if (!strcmp(sub, "list")) {
        allow(c, "");
        if (c->n_pos > 1)
            usage("workers list: unexpected argument \"%s\"", c->pos[1]);
        r = call(c, "workers_list", NULL);
        if (!c->json)
            print_workers(obj(r, "workers"));
    } else if (!strcmp(sub, "restart") || !strcmp(sub, "drain")) {
        allow(c, !strcmp(sub, "drain") ? "off" : "");
        want_pos(c, 2, "the worker number N");
        char *end;
        long w = strtol(c->pos[1], &end, 10);
        if (*end || w < 0 || w > 1023)
            usage("workers %s: expected a worker number, got \"%s\"", sub, c->pos[1]);
        cJSON *args = cJSON_CreateObject();
        cJSON_AddNumberToObject(args, "worker", (double)w);
        if (!strcmp(sub, "drain")) {
            cJSON_AddBoolToObject(args, "drain", !opt(c, "off"));
            r = call(c, "worker_drain", args);
            if (!c->json)
                printf("worker %ld %s\n", w,
                       yes(r, "draining") ? "draining: it gets no new sessions"
                                          : "takes new sessions again");
        } else {
            r = call(c, "worker_restart", args);
            if (!c->json)
                printf("worker %ld (pid %.0f) is restarting; its sessions keep their KV\n", w,
                       num(r, "old_pid"));
        }
    } else {
        usage("workers: unknown subcommand \"%s\" (list, restart, drain)", sub);
    }
    if (c->json)
        print_json(r, 0);
    cJSON_Delete(r);
    return 0;
}

static int cmd_events(struct cli *c)
{
    allow(c, "since session limit follow count");
    want_pos(c, 0, "");
    cJSON *since = NULL;
    const char *s = opt(c, "since");
    if (s)
        since = cJSON_CreateString(s);
    long limit = num_opt(c, "limit", 1, 1000, 100);
    long count = num_opt(c, "count", 1, 1000000, 0);
    int follow = opt(c, "follow") != NULL;
    long printed = 0;
    for (int first = 1; !g_stop; first = 0) {
        cJSON *args = cJSON_CreateObject();
        if (since)
            cJSON_AddItemToObject(args, "since", cJSON_Duplicate(since, 1));
        if (opt(c, "session"))
            cJSON_AddStringToObject(args, "session", opt(c, "session"));
        cJSON_AddNumberToObject(args, "limit", (double)limit);
        cJSON *r = call(c, "events", args);
        const cJSON *e;
        if (c->json && !follow) {
            print_json(r, 0);
        } else {
            cJSON_ArrayForEach(e, obj(r, "events"))
            {
                if (count && printed >= count)
                    break;
                c->json ? print_json(e, 1) : print_event(e);
                printed++;
            }
            if (!c->json && first && !printed && !follow)
                printf("no tactic transitions%s\n", s ? " in that time" : " yet");
            fflush(stdout);
        }
        cJSON_Delete(since);
        since = cJSON_CreateNumber(num(r, "next_since"));
        cJSON_Delete(r);
        if (!follow || (count && printed >= count))
            break;
        sleep_interruptible(1);
    }
    cJSON_Delete(since);
    return 0;
}

/* --rpm N ... as admin arguments: a number, or "default" (rkvd's key_* config) */
static void key_limit_args(const struct cli *c, cJSON *args)
{
    static const char *const opts[] = {"rpm", "tpm", "max-concurrent", "max-tokens", "max-prompt"};
    static const char *const names[] = {"rpm", "tpm", "max_concurrent", "max_tokens", "max_prompt"};
    for (int i = 0; i < 5; i++) {
        const char *v = opt(c, opts[i]);
        if (!v)
            continue;
        char *end;
        long n = strtol(v, &end, 10);
        if (!strcmp(v, "default"))
            cJSON_AddStringToObject(args, names[i], "default");
        else if (*v && !*end && n >= 0 && n <= 2147483647)
            cJSON_AddNumberToObject(args, names[i], (double)n);
        else
            usage("--%s: expected a number (0 = unlimited) or \"default\", got \"%s\"", opts[i], v);
    }
}

/* "60" or "-" for unlimited, "default" as is */
static const char *limit_text(const cJSON *lim, const char *name, char *buf, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(lim, name);
    if (cJSON_IsString(v))
        return v->valuestring;
    if (!cJSON_IsNumber(v) || v->valuedouble == 0)
        return "-";
    snprintf(buf, cap, "%.0f", v->valuedouble);
    return buf;
}

static void print_limits(const cJSON *k)
{
    const cJSON *lim = cJSON_GetObjectItemCaseSensitive(k, "limits");
    char b[5][32];
    printf("rpm %s, tpm %s, max concurrent %s, max tokens %s, max prompt %s",
           limit_text(lim, "rpm", b[0], 32), limit_text(lim, "tpm", b[1], 32),
           limit_text(lim, "max_concurrent", b[2], 32), limit_text(lim, "max_tokens", b[3], 32),
           limit_text(lim, "max_prompt", b[4], 32));
}

/* the ID of keys revoke/limits, also put into args */
static long key_id_arg(const struct cli *c, cJSON *args)
{
    want_pos(c, 2, "the key ID (see rkvctl keys list)");
    char *end;
    long id = strtol(c->pos[1], &end, 10);
    if (*end || id < 1)
        usage("keys %s: expected a key id (a number from rkvctl keys list), got \"%s\"", c->pos[0],
              c->pos[1]);
    cJSON_AddNumberToObject(args, "id", (double)id);
    return id;
}

static int cmd_keys(struct cli *c)
{
    const char *sub = c->n_pos ? c->pos[0] : "list";
    cJSON *r, *args = cJSON_CreateObject();
    if (!strcmp(sub, "add")) {
        allow(c, "scope rpm tpm max-concurrent max-tokens max-prompt");
        want_pos(c, 2, "a NAME for the key");
        key_limit_args(c, args);
        const char *scope = opt(c, "scope") ? opt(c, "scope") : "user";
        if (strcmp(scope, "user") && strcmp(scope, "admin"))
            usage("--scope: expected user or admin, got \"%s\"", scope);
        cJSON_AddStringToObject(args, "name", c->pos[1]);
        cJSON_AddStringToObject(args, "scope", scope);
        r = call(c, "keys_add", args);
        if (!c->json) {
            printf("key %.0f (%s, %s scope; ", num(r, "id"), str(r, "name"), str(r, "scope"));
            print_limits(r);
            printf("):\n%s\nkeep it: only its hash is stored, it cannot be shown again\n",
                   str(r, "secret"));
        }
    } else if (!strcmp(sub, "list")) {
        allow(c, "");
        if (c->n_pos > 1)
            usage("keys list: unexpected argument \"%s\"", c->pos[1]);
        r = call(c, "keys_list", args);
        if (!c->json) {
            printf("%-5s %-20s %-6s %-8s %-10s %-20s %-8s %-8s %-8s %-8s %s\n", "id", "name",
                   "scope", "state", "prefix", "created", "rpm", "tpm", "conc", "max_tok",
                   "max_pr");
            const cJSON *k;
            cJSON_ArrayForEach(k, obj(r, "keys"))
            {
                const cJSON *lim = cJSON_GetObjectItemCaseSensitive(k, "limits");
                char b[5][32];
                printf("%-5.0f %-20.20s %-6s %-8s %-10s %-20s %-8s %-8s %-8s %-8s %s\n",
                       num(k, "id"), str(k, "name"), str(k, "scope"),
                       yes(k, "revoked") ? "REVOKED" : "live", str(k, "prefix"),
                       clock_time(num(k, "created_ms")), limit_text(lim, "rpm", b[0], 32),
                       limit_text(lim, "tpm", b[1], 32),
                       limit_text(lim, "max_concurrent", b[2], 32),
                       limit_text(lim, "max_tokens", b[3], 32), limit_text(lim, "max_prompt", b[4], 32));
            }
        }
    } else if (!strcmp(sub, "revoke")) {
        allow(c, "");
        long id = key_id_arg(c, args);
        r = call(c, "keys_revoke", args);
        if (!c->json)
            printf("key %ld revoked\n", id);
    } else if (!strcmp(sub, "limits")) {
        allow(c, "rpm tpm max-concurrent max-tokens max-prompt");
        long id = key_id_arg(c, args);
        key_limit_args(c, args);
        r = call(c, "keys_limits", args);
        if (!c->json) {
            printf("key %ld (%s): ", id, str(r, "name"));
            print_limits(r);
            printf("\n");
        }
    } else {
        cJSON_Delete(args);
        usage("keys: unknown subcommand \"%s\" (add, list, revoke, limits)", sub);
    }
    if (c->json)
        print_json(r, 0);
    cJSON_Delete(r);
    return 0;
}

static const struct command {
    const char *name;
    int (*fn)(struct cli *c);
} g_cmds[] = {
    {"status", cmd_status},   {"budget", cmd_budget},     {"mode", cmd_mode},
    {"tactics", cmd_tactics}, {"sessions", cmd_sessions}, {"workers", cmd_workers},
    {"events", cmd_events},   {"keys", cmd_keys},
};

int main(int argc, char **argv)
{
    static struct cli c;
    rkv_log_init(PROG, RKV_LOG_ERROR);
    parse_argv(&c, argc, argv);
    c.json = opt(&c, "json") != NULL;
    c.timeout_ms = (int)num_opt(&c, "timeout", 1, 3600, 15) * 1000;
    c.socket = opt(&c, "socket");
    if (!c.socket) {
        const char *rt = getenv("RKV_RUNTIME_DIR");
        snprintf(c.socket_buf, sizeof c.socket_buf, "%s/admin.sock", rt && *rt ? rt : "/run/rkv");
        c.socket = c.socket_buf;
    }
    if (c.n_pos == 0) {
        rkvctl_help(NULL, opt(&c, "help") ? stdout : stderr);
        return opt(&c, "help") ? RKVCTL_OK : RKVCTL_USAGE;
    }
    const char *name = c.pos[0];
    c.topic = name;
    memmove(c.pos, c.pos + 1, sizeof c.pos - sizeof c.pos[0]);
    c.n_pos--;
    if (!strcmp(name, "help")) {
        if (c.n_pos > 1)
            usage("help takes one topic");
        if (rkvctl_help(c.n_pos ? c.pos[0] : NULL, stdout))
            usage("no help topic \"%s\" (rkvctl help lists them)", c.pos[0]);
        return RKVCTL_OK;
    }
    for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++) {
        if (strcmp(g_cmds[i].name, name))
            continue;
        if (opt(&c, "help")) {
            rkvctl_help(name, stdout);
            return RKVCTL_OK;
        }
        signal(SIGINT, on_sigint);
        signal(SIGTERM, on_sigint);
        signal(SIGPIPE, SIG_IGN);
        int rc = g_cmds[i].fn(&c);
        proto_sock_close(c.sock);
        return rc;
    }
    usage("unknown command \"%s\" (see rkvctl --help)", name);
}
