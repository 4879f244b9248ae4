/* main.c - rkvd: OpenAI-compatible HTTP serving, scheduling, and supervision of kvmgr + workers. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <systemd/sd-daemon.h>
#include <uv.h>

#include "common/config.h"
#include "common/err.h"
#include "common/gguf.h"
#include "common/log.h"
#include "common/tok.h"
#include "common/util.h"
#include "daemon/admin.h"
#include "daemon/api.h"
#include "daemon/driver.h"
#include "daemon/http/server.h"
#include "daemon/metrics.h"
#include "daemon/sched.h"
#include "daemon/store.h"
#include "daemon/supervisor.h"

#define RKVD_MAX_WORKERS 64
/* rotation swaps the event log keeps a second (drv_tactic_event) */
#define RKVD_ROT_EVENTS_PER_S 20

struct rkvd_conf {
    char model[1024];
    char chat_template[1024];
    char listen[300];
    int backend;
    char state_dir[512];
    char runtime_dir[512];
    uint64_t vram_target;
    uint64_t host_budget;
    uint64_t compute_reserve;
    int64_t block_size;
    int64_t ctx_size;
    int64_t max_sessions;
    int64_t max_running;
    int64_t max_waiting;
    int64_t max_batch_tokens;
    int64_t prefill_chunk;
    int64_t prefill_beside_decode;
    int64_t prefill_beside_decode_ms;
    int64_t workers;
    int64_t threads;
    int64_t sample_threads;
    int kv_dtype;
    int swa_kv;
    int mode;
    char served_model_name[256];
    char cors_origin[256];
    int64_t max_body;
    int64_t shutdown_timeout;
    int64_t step_timeout;
    int prep_ahead;
    int test_scripted_output;
    int64_t park_after_ms;
    int64_t sse_keepalive_ms;
    int rotation;
    int64_t max_stall_ms;
    int deterministic;
    int64_t host_split;
    int64_t decode_steps, decode_steps_ms;
    int64_t http_header_timeout;
    int log_level;
    char admin_socket[512];
    char admin_group[64];
    int64_t key_rpm;
    int64_t key_tpm;
    int64_t key_max_concurrent;
    int64_t key_max_tokens;
    int64_t key_max_prompt;
    int64_t rate_limit_window;
    int64_t kvmgr_timeout;
    int prefix_cache_scope;
    char cuda_tune[512];
};

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
/* worker/kv.h's enum kv_dtype order (KV_DTYPE_NAMES) */
static const char *const kv_dtypes[] = {"f32", "f16", "q8", "fp8", NULL};
static const char *const swa_kvs[] = {"window", "full", NULL};
static const char *const prefix_scopes[] = {"key", "global", NULL};
static const char *const modes[] = {"auto", "resident", "window", "cpu_tail", NULL};
static const char *const rotations[] = {"off", "auto", "always", NULL};
/* the workers' --host-attn for each mode: cpu_tail has the cpu attend host blocks, window the
 * gpu stream them; auto: kvmgr and the workers apply one rule to the measured rates */
static const char *const host_attn_of_mode[] = {"auto", "gpu", "gpu", "cpu"};

#define K(n, t, f) n, t, offsetof(struct rkvd_conf, f)
#define S(f)       sizeof(((struct rkvd_conf *)0)->f)
static const struct cfg_key keys[] = {
    {K("model", CFG_STR, model), S(model), .help = "GGUF model file"},
    {K("chat_template", CFG_STR, chat_template), S(chat_template),
     .help = "Jinja chat template file used instead of the model's tokenizer.chat_template "
             "(default: the model's, else a built-in family)"},
    {K("listen", CFG_STR, listen), S(listen), .def = "127.0.0.1:8080",
     .help = "HOST:PORT for HTTP"},
    {K("backend", CFG_ENUM, backend), .names = backends, .def = "auto",
     .help = "compute backend of the workers"},
    {K("state_dir", CFG_STR, state_dir), S(state_dir), .def = "/var/lib/rkv",
     .help = "sqlite state (budgets, keys, sessions, events)"},
    {K("runtime_dir", CFG_STR, runtime_dir), S(runtime_dir), .def = "/run/rkv",
     .help = "sockets between the processes and the admin socket"},
    {K("vram_target", CFG_SIZE, vram_target), .min = 0, .max = 1ll << 50, .def = "0",
     .help = "per-GPU cap for weights + KV + compute reserve (CPU mode: the device pool's "
             "budget); 0 = 1GiB in CPU mode"},
    {K("host_budget", CFG_SIZE, host_budget), .min = 0, .max = 1ll << 50, .def = "1GiB",
     .help = "pinned host RAM for KV"},
    {K("compute_reserve", CFG_SIZE, compute_reserve), .min = 0, .max = 1ll << 50, .def = "0",
     .help = "VRAM kept for activations (0 = what the worker measures)"},
    {K("block_size", CFG_INT, block_size), .min = 1, .max = 65536, .def = "256",
     .help = "positions per KV block"},
    {K("ctx_size", CFG_INT, ctx_size), .min = 0, .max = 1 << 24, .def = "0",
     .help = "positions per sequence (0 = the model's context_length)"},
    {K("max_sessions", CFG_INT, max_sessions), .min = 1, .max = 1 << 20, .def = "1024",
     .help = "named sessions whose KV is kept between requests"},
    {K("max_running", CFG_INT, max_running), .min = 1, .max = 4096, .def = "64",
     .help = "sequences in one worker's batch"},
    {K("max_waiting", CFG_INT, max_waiting), .min = 1, .max = 1 << 20, .def = "1024",
     .help = "queued requests before 429"},
    {K("max_batch_tokens", CFG_INT, max_batch_tokens), .min = 0, .max = 65536, .def = "0",
     .help = "tokens in one step, decodes + prefill chunks (0 = 2048 on a GPU, 512 on the CPU)"},
    {K("prefill_chunk", CFG_INT, prefill_chunk), .min = 0, .max = 65536, .def = "0",
     .help = "prompt tokens of one sequence per step (0 = the step size on a GPU, 256 on the "
             "CPU)"},
    {K("prefill_beside_decode", CFG_INT, prefill_beside_decode), .min = 0, .max = 65536, .def = "0",
     .help = "prompt tokens in all of a step that also decodes: a decoding stream's wait beside "
             "a long prompt (0 = 512 on a GPU, prefill_chunk on the CPU)"},
    {K("prefill_beside_decode_ms", CFG_INT, prefill_beside_decode_ms), .min = 0, .max = 10000,
     .def = "0",
     .help = "learn the prompt tokens of a step that also decodes so that it takes about this "
             "long, from prefill_beside_decode, within 64..prefill_chunk (0 = the fixed size)"},
    {K("workers", CFG_INT, workers), .min = 0, .max = RKVD_MAX_WORKERS, .def = "0",
     .help = "worker processes (0 = one per GPU, or 1 on CPU)"},
    {K("threads", CFG_INT, threads), .min = 0, .max = 1024, .def = "0",
     .help = "CPU threads per CPU worker (0 = all cores)"},
    {K("sample_threads", CFG_INT, sample_threads), .min = 0, .max = 16, .def = "0",
     .help = "threads per worker sampling a step's rows (0 = auto, 1 = none)"},
    {K("kv_dtype", CFG_ENUM, kv_dtype), .names = kv_dtypes, .def = "f16",
     .help = "KV cache element type: f16, f32, or 8-bit q8 / fp8 (about half f16's bytes)"},
    {K("swa_kv", CFG_ENUM, swa_kv), .names = swa_kvs, .def = "window",
     .help = "sliding-window models (Gemma 3): local layers keep only their window of KV "
             "(window) or every position (full); cuda workers always keep every position"},
    {K("mode", CFG_ENUM, mode), .names = modes, .def = "auto", .help = "tactic mode"},
    {K("cuda_tune", CFG_STR, cuda_tune), S(cuda_tune),
     .help = "the gpu workers' cuda tuning knobs, name=value,... (docs/operations.md, CUDA "
             "backend tuning); empty: their defaults"},
    {K("prefix_cache_scope", CFG_ENUM, prefix_cache_scope), .names = prefix_scopes, .def = "key",
     .help = "which requests share cached prompt prefixes once API keys exist: key (those of one "
             "key; no key sees another's text through cached_tokens or timing) or global (all: "
             "a single-tenant server)"},
    {K("served_model_name", CFG_STR, served_model_name), S(served_model_name),
     .help = "model name in the API (default: the file name without .gguf)"},
    {K("cors_origin", CFG_STR, cors_origin), S(cors_origin),
     .help = "browsers: the origin the API answers (Access-Control-Allow-Origin), * for any; "
             "empty (the default): no CORS headers, so browsers on other origins are refused"},
    {K("max_body", CFG_SIZE, max_body), .min = 1024, .max = 1ll << 30, .def = "4MiB",
     .help = "largest request body"},
    {K("shutdown_timeout", CFG_INT, shutdown_timeout), .min = 0, .max = 3600, .def = "30",
     .help = "seconds streams may run on after SIGTERM"},
    {K("step_timeout", CFG_INT, step_timeout), .min = 1, .max = 3600, .def = "120",
     .help = "seconds one step may take before the worker counts as hung"},
    {K("deterministic", CFG_BOOL, deterministic), .def = "false",
     .help = "batch-invariant kernels in the workers: the same request gives the same tokens "
             "whatever else runs and wherever its KV lives (slower on cuda)"},
    {K("host_split", CFG_INT, host_split), .min = -1, .max = 100, .def = "-1",
     .help = "gpu workers: percent of a decode row's host KV blocks attended by cpu threads "
             "while the gpu reads the rest (the rates add up); 0 off, -1 by the measured rates"},
    {K("prep_ahead", CFG_BOOL, prep_ahead), .def = "true",
     .help = "ask kvmgr for the next decode step's block tables while a step runs"},
    {K("test_scripted_output", CFG_BOOL, test_scripted_output), .def = "false",
     .help = "TESTS ONLY: every chat answer's text is the environment variable "
             "RKV_TEST_OUTPUT instead of the model's (read only with this key on)"},
    {K("sse_keepalive_ms", CFG_INT, sse_keepalive_ms), .min = 0, .max = 600000, .def = "10000",
     .help = "a streamed answer with nothing to send this long (its turn, the queue, a long "
             "prefill) gets an SSE comment line, so proxies and clients keep it (0 = never)"},
    {K("park_after_ms", CFG_INT, park_after_ms), .min = 0, .max = 3600000, .def = "500",
     .help = "a session between requests keeps its KV on the GPU this long before kvmgr may "
             "park it to host for room (0 = at once)"},
    {K("rotation", CFG_ENUM, rotation), .names = rotations, .def = "auto",
     .help = "when more sessions run than the GPU holds, those that each fit take turns on it "
             "instead of all streaming their tails: off (--no-rotation), auto (where the rate "
             "model says it is faster) or always"},
    {K("max_stall_ms", CFG_INT, max_stall_ms), .min = 10, .max = 10000, .def = "1000",
     .help = "longest a stream waits for its rotation turn (sets the quantum)"},
    {K("decode_steps", CFG_INT, decode_steps), .min = 1, .max = PROTO_MAX_DECODE_STEPS, .def = "8",
     .help = "decode steps a worker runs per request when nothing waits (1 = one)"},
    {K("decode_steps_ms", CFG_INT, decode_steps_ms), .min = 1, .max = 10000, .def = "50",
     .help = "longest such run in ms, at the last step's pace (bounds a newcomer's wait)"},
    {K("http_header_timeout", CFG_INT, http_header_timeout), .min = 1, .max = 3600, .def = "10",
     .help = "seconds a client may take to send its request headers (then 408)"},
    {K("log_level", CFG_ENUM, log_level), .names = rkv_log_level_names, .def = "info",
     .help = "log level"},
    {K("admin_socket", CFG_STR, admin_socket), S(admin_socket),
     .help = "admin socket for rkvctl, mode 0660; empty: RUNTIME_DIR/admin.sock, \"none\": no "
             "socket"},
    {K("admin_group", CFG_STR, admin_group), S(admin_group),
     .help = "group that may use the admin socket; empty: rkvd's own group"},
    {K("key_rpm", CFG_INT, key_rpm), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "requests per window of an API key without its own limit (0 = unlimited)"},
    {K("key_tpm", CFG_INT, key_tpm), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "prompt + completion tokens per window of such a key (0 = unlimited)"},
    {K("key_max_concurrent", CFG_INT, key_max_concurrent), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "requests in flight of such a key (0 = unlimited)"},
    {K("key_max_tokens", CFG_INT, key_max_tokens), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "largest max_tokens of one request of such a key (0 = the context)"},
    {K("key_max_prompt", CFG_INT, key_max_prompt), .min = 0, .max = INT32_MAX, .def = "0",
     .help = "largest prompt in tokens of one request of such a key (0 = the context)"},
    {K("rate_limit_window", CFG_INT, rate_limit_window), .min = 1, .max = 86400, .def = "60",
     .help = "seconds of the key_rpm/key_tpm window (the \"minute\")"},
    {K("kvmgr_timeout", CFG_INT, kvmgr_timeout), .min = 1, .max = 3600, .def = "15",
     .help = "seconds kvmgr may leave rkvd's status calls unanswered before it counts as hung "
             "and is restarted"},
};
#undef K
#undef S

struct rkvd {
    struct rkvd_conf c;
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t cron;
    uv_timer_t drain; /* SIGTERM's deadline for what is still running */
    struct gguf_ctx *g;
    struct tok *tok;
    struct store *store;
    struct metrics *metrics;
    struct sup *sup;
    struct sup_child *kvmgr;
    struct sup_child *workers[RKVD_MAX_WORKERS];
    uint32_t n_workers;
    int worker_up[RKVD_MAX_WORKERS];
    /* what each worker's last hello said: 1 on a gpu, -1 on the cpu, 0 not heard yet */
    int worker_on_gpu[RKVD_MAX_WORKERS];
    /* a failed step took the worker down: when, and its pid then (a hung one keeps it) */
    uint64_t worker_down_ms[RKVD_MAX_WORKERS];
    pid_t worker_down_pid[RKVD_MAX_WORKERS];
    struct driver *drv;
    struct sched *sched;
    struct api *api;
    struct admin *admin;
    struct http_server *http;
    char model_name[256];
    char url[320]; /* http://host:port as bound (listen may ask for port 0) */
    char *worker_urls[RKVD_MAX_WORKERS];
    int kvmgr_up;
    uint64_t kvmgr_silent_ms; /* when kvmgr stopped answering, 0 = it answers */
    uint32_t kvmgr_pid;
    int ready_sent;
    int stopping;
    int signalled; /* a signal began the shutdown: the next one means "exit now" */
    int exit_code;
    uint64_t started_ms;
    struct proto_status kv_status;
    struct proto_histogram hist;
    struct metric *m_kv_token, *m_cache_info;
    struct metric *m_kv_bytes, *m_tactic_sessions, *m_tactic_bytes, *m_transitions, *m_moved,
        *m_health, *m_worker_restarts, *m_rot_swaps, *m_rot_bytes;
    uint64_t rot_events_ms; /* the second whose rotation events the log keeps */
    uint32_t rot_events;
};

/* --- health and routes ------------------------------------------------------------ */

static int healthy(const struct rkvd *d, char *why, size_t len)
{
    int any = 0;
    for (uint32_t w = 0; w < d->n_workers; w++)
        any |= d->worker_up[w];
    if (!d->kvmgr_up)
        snprintf(why, len, "kvmgr is not running");
    else if (!any && d->kv_status.pools_error[0])
        snprintf(why, len, "kvmgr has no kv pools: %s", d->kv_status.pools_error);
    else if (!any)
        snprintf(why, len, "no worker has the model loaded yet");
    else if (d->stopping)
        snprintf(why, len, "shutting down");
    else
        return 1;
    return 0;
}

static void on_request(struct http_req *req, void *arg)
{
    struct rkvd *d = arg;
    const char *path = http_req_path(req), *method = http_req_method(req);
    if (api_handle(d->api, req))
        return;
    if (admin_http(d->admin, req))
        return;
    if (strcmp(path, "/health") == 0) {
        char why[384];
        if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
            http_resp_header(req, "Allow", "GET, HEAD");
            http_respond(req, 405, "application/json",
                         "{\"error\":{\"message\":\"use GET /health\",\"type\":"
                         "\"invalid_request_error\",\"param\":null,\"code\":null}}",
                         strlen("{\"error\":{\"message\":\"use GET /health\",\"type\":"
                                "\"invalid_request_error\",\"param\":null,\"code\":null}}"));
            return;
        }
        int ok = healthy(d, why, sizeof why);
        /* the reason may carry kvmgr's text: cJSON escapes it */
        cJSON *o = cJSON_CreateObject();
        char *body = NULL;
        if (o && cJSON_AddStringToObject(o, "status", ok ? "ok" : "unavailable") &&
            (ok || cJSON_AddStringToObject(o, "reason", why)))
            body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!body) {
            http_respond(req, 500, "text/plain", "out of memory\n", 14);
            return;
        }
        http_respond(req, ok ? 200 : 503, "application/json", body, strlen(body));
        cJSON_free(body);
        return;
    }
    if (strcmp(path, "/metrics") == 0) {
        char *text;
        size_t len;
        /* as of this scrape, not of the last second's tick (a scrape right after the start
         * found no sample) */
        metric_set(d->m_health, NULL, healthy(d, (char[128]){0}, 128));
        if (metrics_render(d->metrics, &text, &len) != 0) {
            http_respond(req, 500, "text/plain", "out of memory\n", 14);
            return;
        }
        http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
        free(text);
        return;
    }
    struct api_error e;
    api_error_set(&e, 404, "",
                  "no route for %s %s: rkv serves /v1/completions, "
                  "/v1/chat/completions, /v1/models, /health, /metrics, / (status) "
                  "and /admin/v1/",
                  method, path);
    e.type = "not_found_error";
    char *body = api_error_json(&e);
    http_respond(req, 404, "application/json", body ? body : "", body ? strlen(body) : 0);
    free(body);
}

/* --- children ----------------------------------------------------------------------- */

static void begin_shutdown(struct rkvd *d);

static void maybe_ready(struct rkvd *d)
{
    char why[128];
    if (!d->ready_sent && healthy(d, why, sizeof why)) {
        d->ready_sent = 1;
        sd_notify(0, "READY=1\nSTATUS=serving");
        log_info("ready: serving %s on %s", d->model_name, d->url);
    }
}

static void sup_event(void *ud, struct sup_child *c, enum sup_event ev, int status)
{
    struct rkvd *d = ud;
    if (ev == SUP_GAVE_UP) {
        log_error("%s keeps dying: rkvd exits so that systemd can restart the service",
                  sup_child_name(c));
        d->exit_code = 1;
        sd_notifyf(0, "STATUS=failed: %s keeps dying", sup_child_name(c));
        begin_shutdown(d);
        return;
    }
    if (ev == SUP_EXITED) {
        if (c == d->kvmgr) {
            d->kvmgr_up = 0;
        } else {
            for (uint32_t w = 0; w < d->n_workers; w++) {
                if (d->workers[w] == c) {
                    d->worker_up[w] = 0;
                    sched_worker_down(d->sched, w);
                    driver_worker_lost(d->drv, w);
                    metric_inc(d->m_worker_restarts, NULL, 1);
                }
            }
        }
    }
}

static void drv_job_done(void *ud, struct step_job *job)
{
    struct rkvd *d = ud;
    sched_job_done(d->sched, job);
}

/* a worker's step sizes: the config's where set, else by its backend (sched_step_sizes) */
static void step_sizes(const struct rkvd *d, uint32_t worker_mbt, int on_gpu,
                       struct sched_steps *out)
{
    const struct sched_steps cfg = {(uint32_t)d->c.max_batch_tokens, (uint32_t)d->c.prefill_chunk,
                                    (uint32_t)d->c.prefill_beside_decode};
    sched_step_sizes(&cfg, worker_mbt, on_gpu, out);
}

static void drv_worker_up(void *ud, uint32_t w, uint32_t worker_mbt, int on_gpu)
{
    struct rkvd *d = ud;
    struct sched_steps st;
    step_sizes(d, worker_mbt, on_gpu, &st);
    log_info("worker %u is up (%s): steps of up to %u tokens, prompt chunks of %u, %u prompt "
             "tokens a step beside a decode",
             w, on_gpu ? "gpu" : "cpu", st.max_batch_tokens, st.prefill_chunk,
             st.prefill_beside_decode);
    d->worker_up[w] = 1;
    d->worker_down_ms[w] = 0;
    d->worker_on_gpu[w] = on_gpu ? 1 : -1;
    sched_worker_up(d->sched, w, &st);
    maybe_ready(d);
}

static void drv_worker_down(void *ud, uint32_t w, const char *why)
{
    struct rkvd *d = ud;
    log_warn("worker %u is down: %s", w, why);
    d->worker_up[w] = 0;
    d->worker_down_ms[w] = rkv_now_ms();
    d->worker_down_pid[w] = d->workers[w] ? sup_child_pid(d->workers[w]) : 0;
    sched_worker_down(d->sched, w);
}

static void drv_kvmgr_changed(void *ud, uint32_t old_pid, uint32_t new_pid)
{
    struct rkvd *d = ud;
    (void)old_pid;
    d->kvmgr_up = 1;
    d->kvmgr_silent_ms = 0;
    d->kvmgr_pid = new_pid;
    sched_kvmgr_seen(d->sched, new_pid);
    admin_on_kvmgr_changed(d->admin, old_pid);
    maybe_ready(d);
}

static void drv_kvmgr_down(void *ud, const char *why)
{
    struct rkvd *d = ud;
    log_warn("kvmgr is not answering: %s", why);
    d->kvmgr_up = 0;
    if (!d->kvmgr_silent_ms)
        d->kvmgr_silent_ms = rkv_now_ms();
}

static void drv_kvmgr_status(void *ud, const struct proto_status *st)
{
    struct rkvd *d = ud;
    d->kv_status = *st;
    d->kvmgr_up = 1;
    d->kvmgr_silent_ms = 0;
    static const char *dev[] = {"device"}, *host[] = {"host"};
    metric_set(d->m_kv_bytes, dev, (double)st->device_used);
    metric_set(d->m_kv_bytes, host, (double)st->host_used);
    if (st->block_bytes)
        metric_set(d->m_kv_token, NULL,
                   (double)proto_status_token_bytes(st, (uint32_t)d->c.block_size));
    maybe_ready(d);
}

static void drv_tactic_event(void *ud, const struct proto_tactic_event *ev)
{
    struct rkvd *d = ud;
    const char *lv[2] = {proto_tactic_names[ev->from], proto_tactic_names[ev->to]};
    metric_inc(d->m_transitions, lv, 1);
    metric_inc(d->m_moved, NULL, (double)ev->bytes_moved);
    /* kvmgr's rotation turns: "rotation: its turn ..." brings a session in, the others send
     * one out to wait */
    admin_on_tactic_event(d->admin, ev);
    if (strncmp(ev->reason, "rotation:", 9) == 0) {
        const char *dir[1] = {ev->to == PROTO_TACTIC_PARKED ? "out" : "in"};
        metric_inc(d->m_rot_swaps, dir, 1);
        metric_inc(d->m_rot_bytes, NULL, (double)ev->bytes_moved);
        /* a rotating gpu swaps sessions many times a second, for as long as the overflow
         * lasts: the event log keeps RKVD_ROT_EVENTS_PER_S of them a second (the metrics count
         * every one, and rkvctl sessions follows every one) */
        uint64_t now = rkv_now_ms();
        if (now - d->rot_events_ms >= 1000) {
            d->rot_events_ms = now;
            d->rot_events = 0;
        }
        if (d->rot_events++ >= RKVD_ROT_EVENTS_PER_S)
            return;
    }
    struct store_event se = {.ts_ms = (int64_t)ev->ts_ms,
                             .session_id = ev->session_id,
                             .gpu = ev->gpu,
                             .bytes_moved = ev->bytes_moved,
                             .elapsed_us = ev->elapsed_us};
    snprintf(se.from, sizeof se.from, "%s", proto_tactic_names[ev->from]);
    snprintf(se.to, sizeof se.to, "%s", proto_tactic_names[ev->to]);
    snprintf(se.reason, sizeof se.reason, "%s", ev->reason);
    store_event_add(d->store, &se);
}

static void drv_histogram(void *ud, const struct proto_histogram *h)
{
    struct rkvd *d = ud;
    d->hist = *h;
    admin_on_histogram(d->admin, h);
    char gpu[16];
    snprintf(gpu, sizeof gpu, "%lld", (long long)h->gpu);
    for (int t = 0; t < PROTO_N_TACTICS; t++) {
        const char *lv[2] = {gpu, proto_tactic_names[t]};
        metric_set(d->m_tactic_sessions, lv, (double)h->sessions[t]);
        metric_set(d->m_tactic_bytes, lv, (double)h->bytes[t]);
    }
}

static int sched_submit(void *ctx, struct step_job *job)
{
    return driver_submit(ctx, job);
}

/* --- shutdown ---------------------------------------------------------------------- */

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void children_stopped(void *ud)
{
    struct rkvd *d = ud;
    log_info("children stopped");
    uv_stop(d->loop);
}

/* the driver's threads, then the scheduler, then the children (children_stopped ends the
 * loop once they have exited) */
static void stop_all(struct rkvd *d)
{
    driver_stop(d->drv);
    d->drv = NULL;
    sched_destroy(d->sched);
    d->sched = NULL;
    sup_stop_all(d->sup, 5000, children_stopped, d);
}

/* a start-up step after the children were spawned failed: stop what runs, then exit 1 */
static int exit_early(struct rkvd *d)
{
    stop_all(d);
    uv_run(d->loop, UV_RUN_DEFAULT);
    return 1;
}

static void http_down(void *arg)
{
    struct rkvd *d = arg;
    d->http = NULL;
    stop_all(d); /* the streams are done */
}

/* the drain time is over: what still runs gets its 503 (or SSE error event) now, while the
 * connections are open; the http server closes them a moment later */
static void drain_deadline(uv_timer_t *t)
{
    struct rkvd *d = t->data;
    sched_fail_all(d->sched, "rkvd is shutting down (shutdown_timeout passed): retry, another "
                             "instance or this one after its restart will answer");
}

static void begin_shutdown(struct rkvd *d)
{
    if (d->stopping)
        return;
    d->stopping = 1;
    sd_notify(0, "STOPPING=1\nSTATUS=draining");
    admin_shutdown(d->admin);
    if (d->sched)
        sched_drain(d->sched);
    uv_timer_stop(&d->cron);
    uint64_t drain_ms = (uint64_t)d->c.shutdown_timeout * 1000;
    if (d->sched && uv_timer_init(d->loop, &d->drain) == 0) {
        d->drain.data = d;
        uv_timer_start(&d->drain, drain_deadline, drain_ms, 0);
    }
    if (d->http)
        http_server_shutdown(d->http, drain_ms + 2000, http_down, d);
    else
        http_down(d);
}

static void on_signal(uv_signal_t *s, int sig)
{
    struct rkvd *d = s->data;
    if (d->signalled) {
        /* the children go too: nothing would stop them after rkvd is gone */
        log_warn("second signal: exiting now (SIGKILL to kvmgr and the workers)");
        sup_kill_all(d->sup, SIGKILL);
        exit(d->exit_code ? d->exit_code : 1);
    }
    d->signalled = 1;
    if (d->stopping) {
        log_info("signal %d: already draining", sig);
        return;
    }
    log_info("signal %d: draining (in-flight streams get up to %lld s)", sig,
             (long long)d->c.shutdown_timeout);
    begin_shutdown(d);
}

/* a kvmgr that is alive but does not answer (found by the fault campaign: its listener stopped
 * accepting after a worker restart) holds every request; killed, the supervisor restarts it and
 * the sessions are rebuilt from their token history */
static void kvmgr_watchdog(struct rkvd *d)
{
    pid_t pid = d->kvmgr ? sup_child_pid(d->kvmgr) : 0;
    if (!d->kvmgr_silent_ms || !pid ||
        rkv_now_ms() - d->kvmgr_silent_ms < (uint64_t)d->c.kvmgr_timeout * 1000)
        return;
    log_error("kvmgr (pid %d) has not answered for %lld s: killing it, the supervisor starts it "
              "again and sessions are rebuilt from their token history (kvmgr_timeout)",
              (int)pid, (long long)d->c.kvmgr_timeout);
    sup_child_kill(d->kvmgr, SIGKILL);
    d->kvmgr_silent_ms = rkv_now_ms(); /* the new one gets its own time */
}

/* a worker whose step failed but whose process lives on under the same pid 2 s later (a crash
 * is reaped in milliseconds) is hung (found by the fault campaign with a SIGSTOPped worker: it
 * was marked down and never restarted, so its requests waited forever); killed, the supervisor
 * starts it again and its sessions continue from the KV kvmgr holds */
static void worker_watchdog(struct rkvd *d)
{
    for (uint32_t w = 0; w < d->n_workers; w++) {
        pid_t pid = d->workers[w] ? sup_child_pid(d->workers[w]) : 0;
        if (d->worker_up[w] || !d->worker_down_ms[w] || rkv_now_ms() - d->worker_down_ms[w] < 2000)
            continue;
        d->worker_down_ms[w] = 0;
        if (!pid || pid != d->worker_down_pid[w])
            continue;
        log_error("worker %u (pid %d) is alive but did not answer its step within step_timeout "
                  "(%lld s): killing it, the supervisor starts it again",
                  w, (int)pid, (long long)d->c.step_timeout);
        sup_child_kill(d->workers[w], SIGKILL);
    }
}

static void cron_cb(uv_timer_t *t)
{
    struct rkvd *d = t->data;
    kvmgr_watchdog(d);
    worker_watchdog(d);
    uint64_t wd;
    if (sd_watchdog_enabled(0, &wd) > 0)
        sd_notify(0, "WATCHDOG=1");
    struct sched_stats st;
    sched_get_stats(d->sched, &st);
    sd_notifyf(0, "STATUS=%s: %u running, %u waiting, %u sessions",
               d->ready_sent ? "serving" : "starting", st.running, st.waiting, st.sessions);
    admin_tick(d->admin);
    if (d->sched)
        sched_tick(d->sched);
}

/* --- admin (rkvctl, the status page) ------------------------------------------------ */

static void adm_info(void *ctx, struct admin_info *o)
{
    struct rkvd *d = ctx;
    static const char *const states[] = {"running", "backoff", "failed", "stopped"};
    o->model = d->model_name;
    o->model_path = d->c.model;
    o->backend = backends[d->c.backend];
    o->listen = d->c.listen;
    o->deterministic = d->c.deterministic;
    o->uptime_ms = rkv_now_ms() - d->started_ms;
    o->healthy = healthy(d, o->health_reason, sizeof o->health_reason);
    o->kvmgr_up = d->kvmgr_up;
    o->kvmgr_restarts = d->kvmgr ? sup_child_restarts(d->kvmgr) : 0;
    o->kv = d->kv_status;
    o->n_workers = d->n_workers;
    for (uint32_t w = 0; w < d->n_workers && w < ADMIN_MAX_WORKERS; w++) {
        struct admin_worker_info *wi = &o->workers[w];
        wi->id = w;
        /* the gpu it was given, or the cpu where its hello said so (backend auto) */
        wi->gpu = d->c.backend == 1 || d->worker_on_gpu[w] < 0 ? -1 : (int64_t)w;
        memset(&wi->steps, 0, sizeof wi->steps); /* until its first hello */
        wi->beside_now = 0;
        if (d->sched && d->worker_on_gpu[w]) {
            sched_worker_steps(d->sched, w, &wi->steps);
            wi->beside_now = sched_worker_beside(d->sched, w);
        }
        wi->pid = d->workers[w] ? (uint32_t)sup_child_pid(d->workers[w]) : 0;
        wi->up = d->worker_up[w];
        wi->draining = d->sched ? sched_worker_draining(d->sched, w) : 0;
        wi->restarts = d->workers[w] ? sup_child_restarts(d->workers[w]) : 0;
        wi->state = d->workers[w] ? states[sup_child_state(d->workers[w]) & 3] : "stopped";
    }
    if (d->sched)
        sched_get_stats(d->sched, &o->st);
    o->block_size = (uint32_t)d->c.block_size;
    o->ctx_size = (uint32_t)d->c.ctx_size;
    o->kv_dtype = kv_dtypes[d->c.kv_dtype];
}

static int adm_kvmgr_call(void *ctx, int type, const void *p, size_t len, driver_call_cb cb,
                          void *ud)
{
    struct rkvd *d = ctx;
    return d->drv ? driver_kvmgr_call(d->drv, type, p, len, cb, ud) : RKV_ESTATE;
}

static void adm_sessions(void *ctx, sched_session_fn fn, void *ud)
{
    struct rkvd *d = ctx;
    if (d->sched)
        sched_sessions_foreach(d->sched, fn, ud);
}

static int adm_evict(void *ctx, uint64_t sid)
{
    struct rkvd *d = ctx;
    return d->sched ? sched_session_evict(d->sched, sid) : RKV_ESTATE;
}

static int adm_pin(void *ctx, uint64_t sid, int pinned)
{
    struct rkvd *d = ctx;
    return d->sched ? sched_session_pin(d->sched, sid, pinned) : RKV_ESTATE;
}

static int adm_restart(void *ctx, uint32_t w, uint32_t *old_pid)
{
    struct rkvd *d = ctx;
    if (w >= d->n_workers || !d->workers[w])
        return RKV_EINVAL;
    *old_pid = (uint32_t)sup_child_pid(d->workers[w]);
    if (!*old_pid)
        return RKV_ESTATE;
    /* the supervisor starts it again; its sessions' KV stays in kvmgr */
    return sup_child_kill(d->workers[w], SIGTERM);
}

static int adm_drain(void *ctx, uint32_t w, int drain)
{
    struct rkvd *d = ctx;
    return d->sched ? sched_worker_drain(d->sched, w, drain) : RKV_ESTATE;
}

static void adm_budget(void *ctx, uint64_t vram, uint64_t host, uint64_t reserve)
{
    struct rkvd *d = ctx;
    d->c.vram_target = vram;
    d->c.host_budget = host;
    d->c.compute_reserve = reserve;
}

static int adm_authorize(void *ud, const char *bearer)
{
    struct rkvd *d = ud;
    return admin_authorize(d->admin, bearer);
}

static int adm_key_lookup(void *ud, const char *bearer, int64_t *key, struct rl_limits *lim)
{
    struct rkvd *d = ud;
    struct store_key_limits l;
    int rc = admin_key_lookup(d->admin, bearer, key, &l);
    *lim = (struct rl_limits){l.rpm, l.tpm, l.max_concurrent, l.max_tokens, l.max_prompt};
    return rc;
}

static int start_admin(struct rkvd *d, char *err, size_t errlen)
{
    char path[600] = "";
    if (strcmp(d->c.admin_socket, "none") == 0)
        path[0] = 0;
    else if (d->c.admin_socket[0])
        snprintf(path, sizeof path, "%s", d->c.admin_socket);
    else
        snprintf(path, sizeof path, "%s/admin.sock", d->c.runtime_dir);
    struct admin_ops ops = {adm_info,    adm_kvmgr_call, adm_sessions, adm_evict, adm_pin,
                            adm_restart, adm_drain,      adm_budget,   d};
    struct admin_config ac = {
        path,        d->c.admin_group, d->c.vram_target, d->c.host_budget, d->c.compute_reserve,
        d->n_workers};
    return admin_create(d->loop, &ac, &ops, d->store, &d->admin, err, errlen);
}

/* --- start-up ------------------------------------------------------------------------ */

static int spawn_children(struct rkvd *d, char *err, size_t errlen)
{
    char exe_dir[4096], kv_path[4200], wk_path[4200];
    int rc = rkv_exe_dir(exe_dir, sizeof exe_dir);
    if (rc) {
        snprintf(err, errlen, "cannot find rkvd's own directory: %s", rkv_strerror(rc));
        return rc;
    }
    snprintf(kv_path, sizeof kv_path, "%s/rkv-kvmgr", exe_dir);
    snprintf(wk_path, sizeof wk_path, "%s/rkv-worker", exe_dir);
    if (access(kv_path, X_OK) || access(wk_path, X_OK)) {
        snprintf(err, errlen, "rkv-kvmgr and rkv-worker must sit beside rkvd in %s", exe_dir);
        return RKV_ENOTFOUND;
    }
    char vram[32], host[32], reserve[32], bs[32], rt[600], mode[32], nw[16], park[24], stall[24];
    snprintf(vram, sizeof vram, "%lluB", (unsigned long long)d->c.vram_target);
    snprintf(host, sizeof host, "%lluB", (unsigned long long)d->c.host_budget);
    snprintf(reserve, sizeof reserve, "%lluB", (unsigned long long)d->c.compute_reserve);
    snprintf(bs, sizeof bs, "%lld", (long long)d->c.block_size);
    snprintf(rt, sizeof rt, "%s", d->c.runtime_dir);
    snprintf(mode, sizeof mode, "%s", modes[d->c.mode]);
    snprintf(nw, sizeof nw, "%u", d->n_workers);
    snprintf(park, sizeof park, "%lld", (long long)d->c.park_after_ms);
    snprintf(stall, sizeof stall, "%lld", (long long)d->c.max_stall_ms);
    char *kargv[] = {kv_path,
                     "--runtime-dir",
                     rt,
                     "--backend",
                     (char *)backends[d->c.backend],
                     "--vram-target",
                     vram,
                     "--host-budget",
                     host,
                     "--compute-reserve",
                     reserve,
                     "--block-size",
                     bs,
                     "--mode",
                     mode,
                     "--workers",
                     nw,
                     "--park-after-ms",
                     park,
                     "--rotation",
                     (char *)rotations[d->c.rotation],
                     "--max-stall-ms",
                     stall,
                     "--log-level",
                     (char *)rkv_log_level_names[d->c.log_level],
                     NULL};
    struct sup_child_spec ks = {"kvmgr", kargv, 5, 60000, 100, 5000};
    if ((rc = sup_add(d->sup, &ks, &d->kvmgr))) {
        snprintf(err, errlen, "cannot start %s: %s", kv_path, rkv_strerror(rc));
        return rc;
    }
    for (uint32_t w = 0; w < d->n_workers; w++) {
        char id[16], gpu[16], th[16], sth[16], mbt[16], name[32];
        snprintf(id, sizeof id, "%u", w);
        snprintf(gpu, sizeof gpu, "%d", d->c.backend == 1 ? -1 : (int)w);
        snprintf(th, sizeof th, "%lld", (long long)d->c.threads);
        snprintf(sth, sizeof sth, "%lld", (long long)d->c.sample_threads);
        snprintf(mbt, sizeof mbt, "%lld", (long long)d->c.max_batch_tokens);
        snprintf(name, sizeof name, "worker%u", w);
        char ms[16], hs[16];
        snprintf(ms, sizeof ms, "%lld", (long long)d->c.max_running);
        snprintf(hs, sizeof hs, "%lld", (long long)d->c.host_split);
        char *wargv[] = {
            wk_path, "--model", d->c.model, "--backend", (char *)backends[d->c.backend],
            "--worker-id", id, "--gpu", gpu, "--threads", th, "--sample-threads", sth,
            "--runtime-dir", rt, "--max-batch-tokens", mbt, "--max-seqs", ms, "--kv-dtype",
            (char *)kv_dtypes[d->c.kv_dtype], "--swa-kv",
            /* the cuda kernels address one block of every layer */
            (char *)swa_kvs[d->c.backend == 2 ? 1 : d->c.swa_kv], "--block-size", bs,
            "--deterministic", d->c.deterministic ? "true" : "false", "--host-attn",
            (char *)host_attn_of_mode[d->c.mode], "--host-split", hs, "--cuda-tune", d->c.cuda_tune,
            "--log-level", (char *)rkv_log_level_names[d->c.log_level], NULL};
        struct sup_child_spec ws = {name, wargv, 5, 60000, 100, 5000};
        if ((rc = sup_add(d->sup, &ws, &d->workers[w]))) {
            snprintf(err, errlen, "cannot start %s: %s", wk_path, rkv_strerror(rc));
            return rc;
        }
    }
    return 0;
}

static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0750);
            *p = '/';
        }
    }
    if (mkdir(tmp, 0750) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return -errno;
    }
    return 0;
}

static int parse_listen(const char *listen, char *host, size_t hlen, int *port)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen)
        return RKV_EINVAL;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535)
        return RKV_EINVAL;
    size_t n = (size_t)(colon - listen);
    if (listen[0] == '[' && n >= 2 && listen[n - 1] == ']') {
        listen++;
        n -= 2;
    }
    if (n >= hlen)
        return RKV_EINVAL;
    memcpy(host, listen, n);
    host[n] = 0;
    *port = (int)p;
    return 0;
}

/* --chat-template FILE: a file that does not parse stops the start, naming
 * the line and column */
static int load_chat_template(struct rkvd *d, const char *path, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t n = 0;
    int rc = rkv_read_file(path, 64u << 20, &buf, &n);
    if (rc)
        snprintf(err, errlen, "chat_template: cannot read %s: %s", path, rkv_strerror(rc));
    if (rc == 0 && (rc = tok_chat_set_template(d->tok, buf, n, path, err, errlen)) == 0)
        log_info("chat template: %s", path);
    free(buf);
    return rc;
}

static int load_model_meta(struct rkvd *d, char *err, size_t errlen)
{
    int rc = gguf_open(d->c.model, &d->g, err, errlen);
    if (rc)
        return rc;
    if ((rc = tok_load_gguf(d->g, &d->tok, err, errlen)))
        return rc;
    if (d->c.chat_template[0] && (rc = load_chat_template(d, d->c.chat_template, err, errlen)))
        return rc;
    struct gguf_str arch;
    uint32_t ctx = 0;
    char key[128];
    if (gguf_get_str(d->g, "general.architecture", &arch) == 0) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)(arch.len > 64 ? 64 : arch.len),
                 arch.ptr);
        gguf_get_u32(d->g, key, &ctx);
    }
    if (d->c.ctx_size == 0)
        d->c.ctx_size = ctx ? ctx : 4096;
    if (d->c.served_model_name[0]) {
        snprintf(d->model_name, sizeof d->model_name, "%s", d->c.served_model_name);
    } else {
        const char *base = strrchr(d->c.model, '/');
        snprintf(d->model_name, sizeof d->model_name, "%s", base ? base + 1 : d->c.model);
        size_t n = strlen(d->model_name);
        if (n > 5 && strcmp(d->model_name + n - 5, ".gguf") == 0)
            d->model_name[n - 5] = 0;
    }
    return 0;
}

static int apply_persisted(struct rkvd *d)
{
    /* budgets and mode set at runtime (rkvctl) win over the config */
    char v[64];
    uint64_t b;
    if (store_setting_get(d->store, "vram_target", v, sizeof v) == 0 && cfg_parse_size(v, &b) == 0)
        d->c.vram_target = b;
    if (store_setting_get(d->store, "host_budget", v, sizeof v) == 0 && cfg_parse_size(v, &b) == 0)
        d->c.host_budget = b;
    if (store_setting_get(d->store, "compute_reserve", v, sizeof v) == 0 &&
        cfg_parse_size(v, &b) == 0)
        d->c.compute_reserve = b;
    if (store_setting_get(d->store, "mode", v, sizeof v) == 0) {
        for (int i = 0; modes[i]; i++)
            if (strcmp(v, modes[i]) == 0)
                d->c.mode = i;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static struct rkvd d;
    char err[1024];
    rkv_log_init("rkvd", RKV_LOG_INFO);
    static const struct cfg_spec spec = {"rkvd", "--model FILE [options]", keys,
                                         sizeof keys / sizeof keys[0], "/etc/rkv/rkvd.conf"};
    int rc = cfg_load_args(&spec, &d.c, argc, argv);
    if (rc)
        return rc == 1 ? 0 : 2;
    rkv_log_set_level(rkv_log_level_at(d.c.log_level));
    if (!d.c.model[0]) {
        fprintf(stderr, "rkvd: no model: give --model FILE (a GGUF file) or set model in "
                        "/etc/rkv/rkvd.conf\n");
        return 2;
    }
    char host[256];
    int port;
    if (parse_listen(d.c.listen, host, sizeof host, &port)) {
        fprintf(stderr, "rkvd: listen: expected HOST:PORT like 127.0.0.1:8080, got \"%s\"\n",
                d.c.listen);
        return 2;
    }
    if (d.c.vram_target && d.c.vram_target < PROTO_MIN_BUDGET) {
        /* rkv-kvmgr takes 4 KiB at least: said here, not by a kvmgr that keeps exiting */
        fprintf(stderr,
                "rkvd: --vram-target: %lluB is below 4.00 KiB, the least rkv-kvmgr takes; give 0 "
                "(1GiB in CPU mode) or a size like 512MiB\n",
                (unsigned long long)d.c.vram_target);
        return 2;
    }
    if (d.c.max_batch_tokens && d.c.max_batch_tokens < d.c.max_running) {
        /* a step has a token of every running sequence: said here, not by a worker that
         * cannot set up its forward pass */
        fprintf(stderr,
                "rkvd: --max-batch-tokens %lld is below --max-running %lld: a step carries a "
                "token of every running sequence; raise max_batch_tokens, lower max_running, "
                "or give max_batch_tokens 0 (2048 on a GPU, 512 on the CPU)\n",
                (long long)d.c.max_batch_tokens, (long long)d.c.max_running);
        return 2;
    }
    for (const char *c = d.c.cors_origin; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f || *c == ',') {
            /* one header value: an origin or *, not a list (the header would be dropped) */
            fprintf(stderr,
                    "rkvd: cors_origin: \"%s\" is not one origin; give * or one origin like "
                    "https://app.example.com\n",
                    d.c.cors_origin);
            return 2;
        }
    if (d.c.prefill_chunk && d.c.max_batch_tokens && d.c.prefill_chunk > d.c.max_batch_tokens)
        d.c.prefill_chunk = d.c.max_batch_tokens;
    signal(SIGPIPE, SIG_IGN);
    d.started_ms = rkv_now_ms();

    if ((rc = load_model_meta(&d, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    if (mkdir_p(d.c.state_dir, err, sizeof err) || mkdir_p(d.c.runtime_dir, err, sizeof err)) {
        log_error("%s", err);
        return 1;
    }
    if ((rc = store_open(d.c.state_dir, &d.store, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    apply_persisted(&d);
    if (d.c.backend == 1 || d.c.backend == 0) {
        /* cpu (and auto until the cuda backend reports gpus): one worker */
        d.n_workers = d.c.workers ? (uint32_t)d.c.workers : 1;
    } else {
        d.n_workers = d.c.workers ? (uint32_t)d.c.workers : 1;
    }
    if (d.c.vram_target == 0)
        d.c.vram_target = 1ull << 30;

    d.loop = uv_default_loop();
    metrics_create(&d.metrics);
    static const char *const tier[] = {"tier", NULL}, *const gt[] = {"gpu", "tactic", NULL},
                             *const ft[] = {"from", "to", NULL};
    d.m_kv_bytes = metrics_add(d.metrics, METRIC_GAUGE, "rkv:kv_cache_bytes",
                               "KV bytes in use per tier.", tier, NULL, 0);
    d.m_tactic_sessions = metrics_add(d.metrics, METRIC_GAUGE, "rkv:tactic_sessions",
                                      "Sessions per tactic per GPU.", gt, NULL, 0);
    d.m_tactic_bytes = metrics_add(d.metrics, METRIC_GAUGE, "rkv:tactic_kv_bytes",
                                   "KV bytes of the sessions per tactic per GPU.", gt, NULL, 0);
    d.m_transitions = metrics_add(d.metrics, METRIC_COUNTER, "rkv:tactic_transitions_total",
                                  "Tactic transitions.", ft, NULL, 0);
    d.m_moved = metrics_add(d.metrics, METRIC_COUNTER, "rkv:kv_bytes_migrated_total",
                            "KV bytes moved between device and host.", NULL, NULL, 0);
    static const char *const dl[] = {"direction", NULL};
    d.m_rot_swaps = metrics_add(d.metrics, METRIC_COUNTER, "rkv:rotation_swaps_total",
                                "Sessions kvmgr swapped onto the GPU for a rotation turn (in) "
                                "or off it to wait for the next (out).",
                                dl, NULL, 0);
    d.m_rot_bytes = metrics_add(d.metrics, METRIC_COUNTER, "rkv:rotation_bytes_total",
                                "KV bytes the rotation swaps planned to move.", NULL, NULL, 0);
    d.m_kv_token = metrics_add(d.metrics, METRIC_GAUGE, "rkv:kv_bytes_per_token",
                               "KV bytes one token position takes (all layers, K and V) in the "
                               "cache's dtype.",
                               NULL, NULL, 0);
    static const char *const ci[] = {"cache_dtype", "block_size", NULL};
    d.m_cache_info = metrics_add(d.metrics, METRIC_GAUGE, "rkv:cache_config_info",
                                 "The KV cache's configuration in labels (value 1).", ci, NULL, 0);
    char bs_label[24];
    snprintf(bs_label, sizeof bs_label, "%lld", (long long)d.c.block_size);
    metric_set(d.m_cache_info, (const char *const[]){kv_dtypes[d.c.kv_dtype], bs_label}, 1);
    d.m_health = metrics_add(d.metrics, METRIC_GAUGE, "rkv:healthy",
                             "1 when kvmgr and a worker are up.", NULL, NULL, 0);
    d.m_worker_restarts =
        metrics_add(d.metrics, METRIC_COUNTER, "rkv:worker_restarts_total",
                    "Worker processes that died and were restarted.", NULL, NULL, 0);

    /* the admin socket first: a bad admin_group stops rkvd before it has children */
    if ((rc = start_admin(&d, err, sizeof err))) {
        log_error("%s", err);
        return 1;
    }
    /* processes, then the driver that talks to them, then the scheduler, then HTTP */
    if ((rc = sup_create(d.loop, sup_event, &d, &d.sup))) {
        log_error("cannot set up the supervisor: %s", rkv_strerror(rc));
        return 1;
    }
    if ((rc = spawn_children(&d, err, sizeof err))) {
        log_error("%s", err);
        return exit_early(&d); /* those it started before it failed */
    }
    char kv_url[600], pub_url[600];
    snprintf(kv_url, sizeof kv_url, "ipc://%s/kvmgr.sock", d.c.runtime_dir);
    snprintf(pub_url, sizeof pub_url, "ipc://%s/kvmgr-events.sock", d.c.runtime_dir);
    for (uint32_t w = 0; w < d.n_workers; w++) {
        d.worker_urls[w] = malloc(600);
        snprintf(d.worker_urls[w], 600, "ipc://%s/worker%u.sock", d.c.runtime_dir, w);
    }
    struct driver_config dc = {d.n_workers,
                               kv_url,
                               pub_url,
                               (const char *const *)d.worker_urls,
                               (int)d.c.step_timeout * 1000,
                               d.c.prep_ahead};
    struct driver_cbs cbs = {drv_job_done,      drv_worker_up,  drv_worker_down,
                             drv_kvmgr_changed, drv_kvmgr_down, drv_kvmgr_status,
                             drv_tactic_event,  drv_histogram,  &d};
    if ((rc = driver_start(d.loop, &dc, &cbs, &d.drv, err, sizeof err))) {
        log_error("%s", err);
        return exit_early(&d);
    }
    struct sched_steps steps0; /* until each worker's hello says what it runs on */
    step_sizes(&d, 0, 0, &steps0);
    struct sched_config sc = {d.n_workers,
                              (uint32_t)d.c.ctx_size,
                              (uint32_t)d.c.max_running,
                              (uint32_t)d.c.max_waiting,
                              steps0,
                              (uint32_t)d.c.max_sessions,
                              5,
                              d.model_name,
                              (uint32_t)d.c.decode_steps,
                              (uint32_t)d.c.decode_steps_ms,
                              (uint32_t)d.c.prefill_beside_decode_ms,
                              d.c.prefix_cache_scope == 1};
    sc.keepalive_ms = (uint32_t)d.c.sse_keepalive_ms;
    sc.has_fim = fim_find(d.g, &sc.fim);
    if (sc.has_fim)
        log_info("fill in the middle: tokens %d %d %d (pre, suf, mid)", sc.fim.pre, sc.fim.suf,
                 sc.fim.mid);
    struct sched_driver sd = {sched_submit, d.drv};
    if ((rc = sched_create(d.loop, &sc, d.tok, &sd, d.metrics, d.store, &d.sched, err,
                           sizeof err))) {
        log_error("%s", err);
        return exit_early(&d);
    }
    struct api_sched as;
    sched_api(d.sched, &as);
    sched_set_authorize(d.sched, adm_authorize, &d);
    const char *names[] = {d.model_name};
    struct api_config ac = {names, 1, (int)d.c.ctx_size, {0}};
    api_limits_default(&ac.limits);
    ac.limits.vocab_size = tok_n_vocab(d.tok);
    if (ac.limits.max_tokens > (int)d.c.ctx_size)
        ac.limits.max_tokens = (int)d.c.ctx_size;
    /* a token-id prompt may fill the context (the default, 32768, refused a 33k prompt on a
     * 36k context); the scheduler still checks prompt + max_tokens against ctx_size */
    ac.limits.max_prompt_tokens = (size_t)d.c.ctx_size;
    ac.key_defaults = (struct rl_limits){d.c.key_rpm, d.c.key_tpm, d.c.key_max_concurrent,
                                         d.c.key_max_tokens, d.c.key_max_prompt};
    ac.rate_window_ms = (uint64_t)d.c.rate_limit_window * 1000;
    ac.cors_origin = d.c.cors_origin[0] ? d.c.cors_origin : NULL;
    if (d.c.test_scripted_output) {
        ac.test_output = getenv("RKV_TEST_OUTPUT");
        if (!ac.test_output) {
            log_error("test_scripted_output needs RKV_TEST_OUTPUT (the text every chat answer "
                      "gives); it is for rkv's tests only");
            return exit_early(&d);
        }
        log_warn("test_scripted_output is on: chat answers are RKV_TEST_OUTPUT, not the "
                 "model's text (for rkv's tests only)");
    }
    if ((rc = api_create(&ac, &as, &d.api))) {
        log_error("cannot set up the API: %s", rkv_strerror(rc));
        return exit_early(&d);
    }
    api_set_key_lookup(d.api, adm_key_lookup, &d);
    struct http_server_config hc = {host, port, {0}, on_request, &d};
    http_limits_default(&hc.limits);
    hc.limits.max_body_bytes = (size_t)d.c.max_body;
    hc.limits.header_timeout_ms = (uint64_t)d.c.http_header_timeout * 1000;
    if ((rc = http_server_start(d.loop, &hc, &d.http))) {
        log_error("cannot listen on %s: %s (is another server on that port? set listen)",
                  d.c.listen, uv_strerror(rc));
        d.exit_code = 1;
        d.http = NULL;
    }
    snprintf(d.url, sizeof d.url, "http://%s:%d", host, d.http ? http_server_port(d.http) : port);
    uv_signal_init(d.loop, &d.sigterm);
    uv_signal_init(d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    uv_timer_init(d.loop, &d.cron);
    d.cron.data = &d;
    uv_timer_start(&d.cron, cron_cb, 1000, 1000);
    /* after the timer exists: shutdown stops it (its callback needs the scheduler) */
    if (!d.http)
        begin_shutdown(&d);
    if (d.http)
        log_info("rkvd: model %s (%s), %u worker(s), ctx %lld, listening on %s:%d", d.model_name,
                 backends[d.c.backend], d.n_workers, (long long)d.c.ctx_size, host,
                 http_server_port(d.http));

    uv_run(d.loop, UV_RUN_DEFAULT);

    /* tidy up: every handle closed, the loop empty */
    api_destroy(d.api);
    sup_destroy(d.sup);
    uv_walk(d.loop, close_walk, NULL);
    uv_run(d.loop, UV_RUN_DEFAULT);
    uv_loop_close(d.loop);
    admin_destroy(d.admin);
    for (uint32_t w = 0; w < d.n_workers; w++)
        free(d.worker_urls[w]);
    metrics_destroy(d.metrics);
    store_close(d.store);
    tok_destroy(d.tok);
    gguf_close(d.g);
    log_info("stopped");
    return d.exit_code;
}
