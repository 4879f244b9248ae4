/* admin.c - the admin command table, its socket and HTTP front ends, key checks, histogram state.
 */
#include "daemon/admin.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/util.h"
#include "daemon/http/server.h"
#include "daemon/store.h"
#include "proto/json.h"
#include "proto/sock.h"

#define MAX_EVENTS   1000 /* one events answer */
#define KEY_CACHE    16   /* verified secrets (pbkdf2 is slow on purpose) */
#define KEY_CACHE_MS 60000
#define HIST_WAIT_MS 3000 /* budget_set waits this long for the re-planned histogram */
#define RATE_SAMPLES 8

enum via { VIA_SOCK, VIA_HTTP, VIA_FN };

struct admin_req;
typedef void (*cmd_fn)(struct admin *a, const cJSON *args, struct admin_req *r);

struct admin_cmd {
    const char *name;
    int changes;
    const char *fields; /* accepted argument names, space separated */
    cmd_fn fn;
    int needs_admin; /* a read that shows other keys' data: never to a user-scope key */
};

/* one command in flight; freed when answered and no callback still points at it */
struct admin_req {
    struct admin *a;
    const struct admin_cmd *cmd;
    enum via via;
    uint64_t req_id;       /* socket */
    struct http_req *http; /* http */
    admin_done_fn done;    /* fn */
    void *done_ud;
    int answered;
    /* whose data it may see: 0 everything (the socket, an admin key, or no keys exist),
     * else the id of the user-scope key asking, which sees only its own sessions */
    int64_t viewer;
    int waiting_kv;   /* a kvmgr call holds a pointer to it */
    int waiting_hist; /* budget_set: the histograms after the re-plan */
    uint64_t hist_after_ms; /* ... arrived after this (wall ms) */
    uint64_t hist_seq;      /* ... and describe this plan or a later one (0: not known) */
    cJSON *state; /* what a multi-step command carries (budget before, new budget) */
    struct admin_req *next;
};

struct tactic_state {
    uint8_t tactic;
    uint64_t tail_blocks;
    uint64_t ts_ms;
};

struct key_cache_ent {
    unsigned char hash[SHA256_DIGEST_LENGTH];
    int64_t id;
    char scope[16];
    struct store_key_limits lim;
    uint64_t at_ms;
    int used;
};

struct admin {
    uv_loop_t *loop;
    struct admin_config cfg;
    char socket_path[512];
    struct admin_ops ops;
    struct store *store;
    struct proto_sock *sock;
    uv_poll_t poll;
    int polling, sock_busy, stopping;
    uv_timer_t hist_timer;
    int handles_open;
    struct admin_req *reqs; /* every live request */
    /* the last histogram per gpu */
    struct proto_histogram hist[ADMIN_MAX_WORKERS];
    uint64_t hist_ms[ADMIN_MAX_WORKERS]; /* wall clock it arrived, 0 = never */
    struct rkv_map tactics;              /* sid -> struct tactic_state */
    uint64_t last_prune_ms;
    int runtime_budget; /* budget_set happened: resend to a new kvmgr */
    uint64_t vram_target, host_budget, compute_reserve;
    int n_keys; /* live api keys */
    struct key_cache_ent keys[KEY_CACHE];
    uint64_t rate_ms[RATE_SAMPLES], rate_tok[RATE_SAMPLES];
    uint32_t rate_n, rate_pos;
};

/* --- answering ---------------------------------------------------------------------- */

static void req_maybe_free(struct admin_req *r)
{
    if (!r->answered || r->waiting_kv || r->waiting_hist)
        return;
    struct admin *a = r->a;
    for (struct admin_req **pp = &a->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    cJSON_Delete(r->state);
    free(r);
}

static void sock_pump(struct admin *a);

static int http_status_of(int rc)
{
    switch (rc) {
    case RKV_EINVAL:
    case RKV_ERANGE:
    case RKV_EFORMAT: return 400;
    case RKV_EAUTH: return 401;
    case RKV_EPERM: return 403;
    case RKV_ENOTFOUND: return 404;
    case RKV_EBUSY:
    case RKV_ESTATE: return 409;
    case RKV_ETIMEOUT:
    case RKV_ECLOSED:
    case RKV_ENODEV: return 503;
    default: return 500;
    }
}

static void http_send_json(struct http_req *req, int status, cJSON *body)
{
    char *text = cJSON_PrintUnformatted(body);
    http_resp_header(req, "Cache-Control", "no-store");
    if (text)
        http_respond(req, status, "application/json", text, strlen(text));
    else
        http_respond(req, 500, "text/plain", "out of memory\n", 14);
    free(text);
}

static void http_send_error(struct http_req *req, int rc, const char *msg)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddBoolToObject(b, "ok", 0);
    cJSON *e = cJSON_AddObjectToObject(b, "error");
    cJSON_AddNumberToObject(e, "code", rc);
    cJSON_AddStringToObject(e, "name", rkv_strerror(rc));
    cJSON_AddStringToObject(e, "message", msg);
    http_send_json(req, http_status_of(rc), b);
    cJSON_Delete(b);
}

/* takes result; rc < 0 sends msg as the error */
static void req_finish(struct admin_req *r, int rc, cJSON *result, const char *msg)
{
    struct admin *a = r->a;
    if (r->answered) {
        cJSON_Delete(result);
        req_maybe_free(r);
        return;
    }
    r->answered = 1;
    if (rc < 0 && (!msg || !msg[0]))
        msg = rkv_strerror(rc);
    if (r->via == VIA_FN) {
        r->done(r->done_ud, rc < 0 ? rc : 0, rc < 0 ? NULL : result, rc < 0 ? msg : "");
    } else if (r->via == VIA_HTTP) {
        if (rc < 0) {
            http_send_error(r->http, rc, msg);
        } else {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddBoolToObject(b, "ok", 1);
            cJSON_AddItemToObject(b, "result", result);
            result = NULL;
            http_send_json(r->http, 200, b);
            cJSON_Delete(b);
        }
        r->http = NULL;
    } else {
        int src;
        if (rc < 0) {
            src = proto_sock_send_error(a->sock, r->req_id, rc, msg);
        } else {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddBoolToObject(b, "ok", 1);
            cJSON_AddItemToObject(b, "result", result);
            result = NULL;
            char *text = cJSON_PrintUnformatted(b);
            cJSON_Delete(b);
            src =
                text ? proto_sock_send(a->sock, PROTO_MSG_ADMIN_RESP, r->req_id, text, strlen(text))
                     : RKV_ENOMEM;
            free(text);
        }
        if (src < 0)
            log_warn("admin socket: cannot answer %s: %s (rkvctl gave up waiting?)",
                     r->cmd ? r->cmd->name : "a request", rkv_strerror(src));
        a->sock_busy = 0;
        sock_pump(a);
    }
    cJSON_Delete(result);
    req_maybe_free(r);
}

__attribute__((format(printf, 3, 4))) static void req_fail(struct admin_req *r, int rc,
                                                           const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    req_finish(r, rc, NULL, msg);
}

/* --- arguments ----------------------------------------------------------------------- */

/* every argument must be one the command knows */
static int check_fields(struct admin_req *r, const cJSON *args)
{
    if (!args)
        return 0;
    if (!cJSON_IsObject(args)) {
        req_fail(r, RKV_EINVAL, "%s: args must be a JSON object", r->cmd->name);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, args)
    {
        const char *f = r->cmd->fields, *k = it->string;
        size_t kl = strlen(k);
        int ok = 0;
        while (*f && !ok) {
            size_t n = strcspn(f, " ");
            ok = n == kl && strncmp(f, k, n) == 0;
            f += n;
            f += *f == ' ';
        }
        if (!ok) {
            req_fail(r, RKV_EINVAL, "%s: unknown argument \"%.64s\" (%s%s)", r->cmd->name, k,
                     r->cmd->fields[0] ? "expected one of: " : "it takes none", r->cmd->fields);
            return -1;
        }
    }
    return 0;
}

static const cJSON *arg(const cJSON *args, const char *name)
{
    const cJSON *v = args ? cJSON_GetObjectItemCaseSensitive(args, name) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* an integer from a JSON number or a decimal string; 1 when present, 0 absent, -1 refused */
static int arg_int(struct admin_req *r, const cJSON *args, const char *name, int64_t min,
                   int64_t max, int64_t *out)
{
    const cJSON *v = arg(args, name);
    if (!v)
        return 0;
    int64_t x = 0;
    int ok = 0;
    if (cJSON_IsNumber(v)) {
        x = (int64_t)v->valuedouble;
        ok = (double)x == v->valuedouble;
    } else if (cJSON_IsString(v) && v->valuestring[0]) {
        char *end;
        errno = 0;
        long long ll = strtoll(v->valuestring, &end, 10);
        ok = !*end && !errno;
        x = ll;
    }
    if (!ok || x < min || x > max) {
        req_fail(r, RKV_EINVAL, "%s: %s must be an integer from %" PRId64 " to %" PRId64,
                 r->cmd->name, name, min, max);
        return -1;
    }
    *out = x;
    return 1;
}

/* a size: a JSON number (bytes) or a string like "512MiB", "24GiB", "24000" (MiB) */
static int arg_size(struct admin_req *r, const cJSON *args, const char *name, uint64_t min,
                    uint64_t *out)
{
    const cJSON *v = arg(args, name);
    if (!v)
        return 0;
    uint64_t b = 0;
    int ok = 0;
    if (cJSON_IsNumber(v)) {
        ok = v->valuedouble >= 0 && v->valuedouble < 1.2e18;
        b = (uint64_t)v->valuedouble;
    } else if (cJSON_IsString(v)) {
        ok = cfg_parse_size(v->valuestring, &b) == 0;
    }
    if (!ok || b < min || b > (1ull << 50)) {
        char lo[32];
        cfg_format_size(min, lo, sizeof lo);
        req_fail(r, RKV_EINVAL,
                 "%s: %s must be a size like 512MiB, 24GiB or 24000 (MiB), at least %s and at "
                 "most 1 PiB",
                 r->cmd->name, name, lo);
        return -1;
    }
    *out = b;
    return 1;
}

/* "10m" ago, "2h", "1d", "30s"; an ISO time "2026-11-29T12:00:00Z" (UTC); or unix ms */
static int parse_time(const char *s, uint64_t now_ms, int64_t *out)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end != s && !errno) {
        double mul = 0;
        if (!*end)
            mul = -1; /* unix ms */
        else if (!strcmp(end, "ms"))
            mul = 1;
        else if (!strcmp(end, "s"))
            mul = 1000;
        else if (!strcmp(end, "m"))
            mul = 60000;
        else if (!strcmp(end, "h"))
            mul = 3600000;
        else if (!strcmp(end, "d"))
            mul = 86400000;
        if (mul < 0 && x >= 0) {
            *out = (int64_t)x;
            return 0;
        }
        if (mul > 0 && x >= 0) {
            *out = (int64_t)now_ms - (int64_t)(x * mul);
            return 0;
        }
    }
    struct tm tm = {0};
    const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p)
        p = strptime(s, "%Y-%m-%d %H:%M:%S", &tm);
    if (p && (!*p || !strcmp(p, "Z"))) {
        *out = (int64_t)timegm(&tm) * 1000;
        return 0;
    }
    return RKV_EINVAL;
}

static int arg_time(struct admin_req *r, const cJSON *args, const char *name, int64_t *out)
{
    const cJSON *v = arg(args, name);
    if (!v)
        return 0;
    if (cJSON_IsNumber(v) && v->valuedouble >= 0) {
        *out = (int64_t)v->valuedouble;
        return 1;
    }
    if (cJSON_IsString(v) && parse_time(v->valuestring, rkv_wall_ms(), out) == 0)
        return 1;
    req_fail(r, RKV_EINVAL,
             "%s: %s must be a time: an age like 30s, 10m, 2h, 1d, a UTC time like "
             "2026-11-29T12:00:00Z, or unix milliseconds",
             r->cmd->name, name);
    return -1;
}

/* --- sessions ------------------------------------------------------------------------ */

struct find_ctx {
    const char *want;
    uint64_t want_sid;
    int64_t viewer; /* nonzero: only that key's sessions */
    int found;
    int n_hits; /* by name: sessions of several keys may share it */
    struct sched_session_info si;
    char ext[API_MAX_SESSION_ID + 1];
};

static void find_cb(void *ud, const struct sched_session_info *si)
{
    struct find_ctx *f = ud;
    int hit = f->want_sid ? si->sid == f->want_sid : strcmp(si->ext_id, f->want) == 0;
    if (f->viewer && si->owner != f->viewer)
        return;
    if (hit)
        f->n_hits++;
    if (hit && !f->found) {
        f->found = 1;
        f->si = *si;
        snprintf(f->ext, sizeof f->ext, "%s", si->ext_id);
        f->si.ext_id = f->ext;
    }
}

/* "name" (a session_id of the API) or "#12" / "12" (rkv's numeric id) */
static int find_session(struct admin *a, struct admin_req *r, const cJSON *args, struct find_ctx *f)
{
    const cJSON *v = arg(args, "session");
    memset(f, 0, sizeof *f);
    f->viewer = r->viewer;
    char num[32];
    if (cJSON_IsNumber(v)) {
        snprintf(num, sizeof num, "%.0f", v->valuedouble);
        f->want = num;
    } else if (cJSON_IsString(v) && v->valuestring[0]) {
        f->want = v->valuestring;
    } else {
        req_fail(r, RKV_EINVAL,
                 "%s: session is required: a session_id as the API client sent it, or #N "
                 "for rkv's numeric id (see rkvctl sessions list)",
                 r->cmd->name);
        return -1;
    }
    a->ops.sessions_foreach(a->ops.ctx, find_cb, f);
    const char *d = f->want[0] == '#' ? f->want + 1 : f->want;
    if (!f->found && *d && strspn(d, "0123456789") == strlen(d)) {
        f->want_sid = strtoull(d, NULL, 10);
        if (f->want_sid)
            a->ops.sessions_foreach(a->ops.ctx, find_cb, f);
    }
    if (!f->found) {
        req_fail(r, RKV_ENOTFOUND, "%s: no session \"%.100s\" (see rkvctl sessions list)",
                 r->cmd->name, f->want);
        return -1;
    }
    if (f->n_hits > 1) {
        req_fail(r, RKV_EINVAL,
                 "%s: %d sessions of different API keys are named \"%.100s\": name one by its "
                 "numeric id, #N (see rkvctl sessions list)",
                 r->cmd->name, f->n_hits, f->want);
        return -1;
    }
    return 0;
}

static cJSON *session_json(struct admin *a, const struct sched_session_info *si, uint32_t bs)
{
    cJSON *o = cJSON_CreateObject();
    const struct tactic_state *ts = rkv_map_get(&a->tactics, si->sid);
    cJSON_AddNumberToObject(o, "sid", (double)si->sid);
    cJSON_AddStringToObject(o, "id", si->ext_id);
    cJSON_AddNumberToObject(o, "key", (double)si->owner);
    cJSON_AddNumberToObject(o, "worker", si->worker);
    cJSON_AddNumberToObject(o, "tokens", si->n_tokens);
    cJSON_AddNumberToObject(o, "kv_tokens", si->n_kv);
    cJSON_AddBoolToObject(o, "busy", si->busy);
    cJSON_AddBoolToObject(o, "pinned", si->pinned);
    cJSON_AddNumberToObject(
        o, "idle_ms", si->last_use_ms && !si->busy ? (double)(rkv_now_ms() - si->last_use_ms) : 0);
    const char *tactic = ts ? proto_tactic_names[ts->tactic] : si->n_kv ? "resident" : "none";
    cJSON_AddStringToObject(o, "tactic", tactic);
    uint64_t tail = ts ? ts->tail_blocks : 0;
    cJSON_AddNumberToObject(o, "tail_blocks", (double)tail);
    uint64_t tail_tok = tail * bs;
    cJSON_AddNumberToObject(o, "tail_tokens", (double)(tail_tok > si->n_kv ? si->n_kv : tail_tok));
    return o;
}

struct list_ctx {
    struct admin *a;
    cJSON *arr;
    uint32_t bs;
    int64_t viewer;
};

static void list_cb(void *ud, const struct sched_session_info *si)
{
    struct list_ctx *l = ud;
    if (!l->viewer || si->owner == l->viewer)
        cJSON_AddItemToArray(l->arr, session_json(l->a, si, l->bs));
}

/* what rkvd knows now (malloc'd: it is large); NULL when out of memory */
static struct admin_info *info_new(struct admin *a)
{
    struct admin_info *in = calloc(1, sizeof *in);
    if (in)
        a->ops.info(a->ops.ctx, in);
    return in;
}

static uint32_t block_size(struct admin *a)
{
    struct admin_info *in = info_new(a);
    uint32_t bs = in && in->block_size ? in->block_size : 256;
    free(in);
    return bs;
}

static void cmd_sessions_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    cJSON *res = cJSON_CreateObject();
    struct list_ctx l = {a, cJSON_AddArrayToObject(res, "sessions"), block_size(a), r->viewer};
    a->ops.sessions_foreach(a->ops.ctx, list_cb, &l);
    req_finish(r, 0, res, NULL);
}

static cJSON *event_json(const struct store_event *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ts_ms", (double)e->ts_ms);
    cJSON_AddNumberToObject(o, "session", (double)e->session_id);
    cJSON_AddNumberToObject(o, "gpu", (double)e->gpu);
    cJSON_AddStringToObject(o, "from", e->from);
    cJSON_AddStringToObject(o, "to", e->to);
    cJSON_AddStringToObject(o, "reason", e->reason);
    cJSON_AddNumberToObject(o, "bytes_moved", (double)e->bytes_moved);
    cJSON_AddNumberToObject(o, "elapsed_us", (double)e->elapsed_us);
    return o;
}

/* events oldest first; with more than cap, the newest cap of them; only (when not NULL)
 * keeps those of the sessions it holds */
static int add_events(struct admin *a, cJSON *arr, int64_t since, uint64_t sid, size_t cap,
                      const struct rkv_map *only, int64_t *last_ts)
{
    struct store_event *ev = calloc(MAX_EVENTS, sizeof *ev);
    if (!ev)
        return RKV_ENOMEM;
    size_t n = 0;
    int rc;
    /* the store answers oldest first: page forward to the newest */
    for (;;) {
        size_t got = 0;
        rc = store_event_list(a->store, since, sid, ev, MAX_EVENTS, &got);
        if (rc || got < MAX_EVENTS) {
            n = got;
            break;
        }
        if (ev[got - 1].ts_ms == since) {
            n = got;
            break;
        }
        since = ev[got - 1].ts_ms;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (!only || rkv_map_get(only, ev[i].session_id))
            ev[kept++] = ev[i];
    size_t from = kept > cap ? kept - cap : 0;
    for (size_t i = from; !rc && i < kept; i++) {
        cJSON_AddItemToArray(arr, event_json(&ev[i]));
        *last_ts = ev[i].ts_ms;
    }
    free(ev);
    return rc;
}

static void cmd_session_show(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct find_ctx f;
    if (find_session(a, r, args, &f))
        return;
    cJSON *res = cJSON_CreateObject();
    cJSON_AddItemToObject(res, "session", session_json(a, &f.si, block_size(a)));
    int64_t last = 0;
    add_events(a, cJSON_AddArrayToObject(res, "events"), 0, f.si.sid, 20, NULL, &last);
    req_finish(r, 0, res, NULL);
}

static void session_change(struct admin *a, const cJSON *args, struct admin_req *r, int what)
{
    struct find_ctx f;
    if (find_session(a, r, args, &f))
        return;
    int rc = what == 2 ? a->ops.session_evict(a->ops.ctx, f.si.sid)
                       : a->ops.session_pin(a->ops.ctx, f.si.sid, what);
    if (rc == RKV_EBUSY) {
        req_fail(r, rc, "session %.100s is serving a request: evict it when the request ends",
                 f.want);
        return;
    }
    if (rc) {
        req_fail(r, rc, "%s: %s", r->cmd->name, rkv_strerror(rc));
        return;
    }
    cJSON *res = cJSON_CreateObject();
    cJSON_AddNumberToObject(res, "sid", (double)f.si.sid);
    cJSON_AddStringToObject(res, "id", f.si.ext_id);
    if (what == 2) {
        cJSON_AddBoolToObject(res, "evicted", 1);
        rkv_map_del(&a->tactics, f.si.sid);
    } else {
        cJSON_AddBoolToObject(res, "pinned", what);
    }
    log_info("admin: session %s (#%llu) %s", f.si.ext_id, (unsigned long long)f.si.sid,
             what == 2 ? "evicted"
             : what    ? "pinned"
                       : "unpinned");
    req_finish(r, 0, res, NULL);
}

static void cmd_session_evict(struct admin *a, const cJSON *args, struct admin_req *r)
{
    session_change(a, args, r, 2);
}
static void cmd_session_pin(struct admin *a, const cJSON *args, struct admin_req *r)
{
    session_change(a, args, r, 1);
}
static void cmd_session_unpin(struct admin *a, const cJSON *args, struct admin_req *r)
{
    session_change(a, args, r, 0);
}

/* --- status, tactics, workers ------------------------------------------------------- */

static double tokens_per_s(const struct admin *a)
{
    if (a->rate_n < 2)
        return 0;
    uint32_t newest = (a->rate_pos + RATE_SAMPLES - 1) % RATE_SAMPLES;
    uint32_t oldest = a->rate_n < RATE_SAMPLES ? 0 : a->rate_pos;
    uint64_t dt = a->rate_ms[newest] - a->rate_ms[oldest];
    return dt ? (double)(a->rate_tok[newest] - a->rate_tok[oldest]) * 1000.0 / (double)dt : 0;
}

static cJSON *workers_json(const struct admin_info *in)
{
    cJSON *arr = cJSON_CreateArray();
    for (uint32_t w = 0; w < in->n_workers; w++) {
        const struct admin_worker_info *wi = &in->workers[w];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", wi->id);
        cJSON_AddNumberToObject(o, "gpu", (double)wi->gpu);
        cJSON_AddNumberToObject(o, "pid", wi->pid);
        cJSON_AddBoolToObject(o, "up", wi->up);
        cJSON_AddBoolToObject(o, "draining", wi->draining);
        cJSON_AddNumberToObject(o, "restarts", wi->restarts);
        cJSON_AddStringToObject(o, "state", wi->state ? wi->state : "unknown");
        cJSON_AddNumberToObject(o, "max_batch_tokens", wi->steps.max_batch_tokens);
        cJSON_AddNumberToObject(o, "prefill_chunk", wi->steps.prefill_chunk);
        cJSON_AddNumberToObject(o, "prefill_beside_decode", wi->steps.prefill_beside_decode);
        cJSON_AddNumberToObject(o, "prefill_beside_decode_now", wi->beside_now);
        cJSON_AddNumberToObject(o, "step_ms",
                                w < in->kv.n_worker_step_ms ? in->kv.worker_step_ms[w] : 0);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static cJSON *budget_json(uint64_t vram, uint64_t host, uint64_t reserve)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "vram_target", (double)vram);
    cJSON_AddNumberToObject(o, "host_budget", (double)host);
    cJSON_AddNumberToObject(o, "compute_reserve", (double)reserve);
    return o;
}

static void cmd_status(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct admin_info *in = info_new(a);
    if (!in) {
        req_fail(r, RKV_ENOMEM, "out of memory");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", ADMIN_VERSION);
    cJSON_AddStringToObject(o, "model", in->model ? in->model : "");
    cJSON_AddStringToObject(o, "model_path", in->model_path ? in->model_path : "");
    cJSON_AddStringToObject(o, "backend", in->backend ? in->backend : "");
    cJSON_AddStringToObject(o, "listen", in->listen ? in->listen : "");
    cJSON_AddBoolToObject(o, "deterministic", in->deterministic);
    cJSON_AddNumberToObject(o, "uptime_ms", (double)in->uptime_ms);
    cJSON_AddBoolToObject(o, "healthy", in->healthy);
    cJSON_AddStringToObject(o, "health_reason", in->health_reason);
    cJSON *k = cJSON_AddObjectToObject(o, "kvmgr");
    cJSON_AddBoolToObject(k, "up", in->kvmgr_up);
    cJSON_AddNumberToObject(k, "pid", in->kv.kvmgr_pid);
    cJSON_AddNumberToObject(k, "restarts", in->kvmgr_restarts);
    cJSON_AddStringToObject(k, "mode", proto_mode_names[in->kv.mode & 3]);
    cJSON_AddNumberToObject(k, "sessions", (double)in->kv.n_sessions);
    cJSON_AddNumberToObject(k, "uptime_ms", (double)in->kv.uptime_ms);
    cJSON_AddItemToObject(o, "workers", workers_json(in));
    cJSON_AddItemToObject(o, "budgets",
                          budget_json(a->vram_target, a->host_budget, a->compute_reserve));
    cJSON *p = cJSON_AddObjectToObject(o, "pool");
    cJSON_AddNumberToObject(p, "device_used", (double)in->kv.device_used);
    cJSON_AddNumberToObject(p, "device_total", (double)in->kv.device_total);
    cJSON_AddNumberToObject(p, "host_used", (double)in->kv.host_used);
    cJSON_AddNumberToObject(p, "host_total", (double)in->kv.host_total);
    cJSON *q = cJSON_AddObjectToObject(o, "requests");
    cJSON_AddNumberToObject(q, "running", in->st.running);
    cJSON_AddNumberToObject(q, "waiting", in->st.waiting);
    cJSON_AddNumberToObject(q, "sessions", in->st.sessions);
    cJSON *t = cJSON_AddObjectToObject(o, "tokens");
    cJSON_AddNumberToObject(t, "prompt", (double)in->st.prompt_tokens);
    cJSON_AddNumberToObject(t, "cached", (double)in->st.cached_tokens);
    cJSON_AddNumberToObject(t, "generated", (double)in->st.gen_tokens);
    cJSON_AddNumberToObject(t, "per_second", tokens_per_s(a));
    cJSON_AddNumberToObject(o, "block_size", in->block_size);
    cJSON_AddNumberToObject(o, "ctx_size", in->ctx_size);
    cJSON_AddNumberToObject(o, "api_keys", a->n_keys);
    free(in);
    req_finish(r, 0, o, NULL);
}

static cJSON *hist_json(const struct admin *a, int64_t gpu)
{
    cJSON *arr = cJSON_CreateArray();
    uint64_t now = rkv_wall_ms();
    for (uint32_t g = 0; g < a->cfg.n_gpus && g < ADMIN_MAX_WORKERS; g++) {
        if (gpu >= 0 && (uint32_t)gpu != g)
            continue;
        const struct proto_histogram *h = &a->hist[g];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "gpu", g);
        cJSON *s = cJSON_AddObjectToObject(o, "sessions");
        cJSON *b = cJSON_AddObjectToObject(o, "bytes");
        for (int t = 0; t < PROTO_N_TACTICS; t++) {
            cJSON_AddNumberToObject(s, proto_tactic_names[t], (double)h->sessions[t]);
            cJSON_AddNumberToObject(b, proto_tactic_names[t], (double)h->bytes[t]);
        }
        cJSON_AddNumberToObject(o, "device_used", (double)h->device_used);
        cJSON_AddNumberToObject(o, "device_total", (double)h->device_total);
        cJSON_AddNumberToObject(o, "host_used", (double)h->host_used);
        cJSON_AddNumberToObject(o, "host_total", (double)h->host_total);
        cJSON_AddNumberToObject(o, "age_ms", a->hist_ms[g] ? (double)(now - a->hist_ms[g]) : -1);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

static void cmd_tactics(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t gpu = -1;
    if (arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON *names = cJSON_AddArrayToObject(o, "tactics");
    for (int t = 0; t < PROTO_N_TACTICS; t++)
        cJSON_AddItemToArray(names, cJSON_CreateString(proto_tactic_names[t]));
    cJSON_AddItemToObject(o, "gpus", hist_json(a, gpu));
    req_finish(r, 0, o, NULL);
}

static void cmd_workers_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct admin_info *in = info_new(a);
    if (!in) {
        req_fail(r, RKV_ENOMEM, "out of memory");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "workers", workers_json(in));
    free(in);
    req_finish(r, 0, o, NULL);
}

static int worker_arg(struct admin *a, struct admin_req *r, const cJSON *args, uint32_t *w)
{
    int64_t x;
    int got = arg_int(r, args, "worker", 0, (int64_t)a->cfg.n_gpus - 1, &x);
    if (got == 0)
        req_fail(r, RKV_EINVAL, "%s: worker is required: a worker number from 0 to %u",
                 r->cmd->name, a->cfg.n_gpus - 1);
    if (got <= 0)
        return -1;
    *w = (uint32_t)x;
    return 0;
}

static void cmd_worker_restart(struct admin *a, const cJSON *args, struct admin_req *r)
{
    uint32_t w, pid = 0;
    if (worker_arg(a, r, args, &w))
        return;
    int rc = a->ops.worker_restart(a->ops.ctx, w, &pid);
    if (rc) {
        req_fail(r, rc, "worker %u is not running (it may be restarting already): %s", w,
                 rkv_strerror(rc));
        return;
    }
    log_info("admin: worker %u (pid %u) restarted", w, pid);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "worker", w);
    cJSON_AddNumberToObject(o, "old_pid", pid);
    cJSON_AddBoolToObject(o, "restarting", 1);
    req_finish(r, 0, o, NULL);
}

static void cmd_worker_drain(struct admin *a, const cJSON *args, struct admin_req *r)
{
    uint32_t w;
    if (worker_arg(a, r, args, &w))
        return;
    const cJSON *d = arg(args, "drain");
    if (d && !cJSON_IsBool(d)) {
        req_fail(r, RKV_EINVAL, "worker_drain: drain must be true or false");
        return;
    }
    int drain = !d || cJSON_IsTrue(d);
    int rc = a->ops.worker_drain(a->ops.ctx, w, drain);
    if (rc) {
        req_fail(r, rc, "worker_drain: %s", rkv_strerror(rc));
        return;
    }
    log_info("admin: worker %u %s", w, drain ? "draining: no new sessions" : "takes sessions");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "worker", w);
    cJSON_AddBoolToObject(o, "draining", drain);
    req_finish(r, 0, o, NULL);
}

/* --- events and keys ---------------------------------------------------------------- */

struct owned_ctx {
    int64_t owner;
    struct rkv_map sids; /* sid -> (void *)1 */
};

static void owned_cb(void *ud, const struct sched_session_info *si)
{
    struct owned_ctx *o = ud;
    if (si->owner == o->owner)
        rkv_map_put(&o->sids, si->sid, (void *)1);
}

static void cmd_events(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t since = 0, limit = 100;
    if (arg_time(r, args, "since", &since) < 0 ||
        arg_int(r, args, "limit", 1, MAX_EVENTS, &limit) < 0)
        return;
    uint64_t sid = 0;
    if (arg(args, "session")) {
        const cJSON *v = arg(args, "session");
        const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
        if (s && s[0] == '#')
            s++;
        if (cJSON_IsNumber(v) && v->valuedouble >= 1)
            sid = (uint64_t)v->valuedouble;
        else if (s && *s && strspn(s, "0123456789") == strlen(s))
            sid = strtoull(s, NULL, 10);
        if (!sid) {
            /* a named session: its numeric id */
            struct find_ctx f;
            if (find_session(a, r, args, &f))
                return;
            sid = f.si.sid;
        }
    }
    /* a user key sees the events of its own sessions */
    struct owned_ctx own = {r->viewer};
    rkv_map_init(&own.sids);
    if (r->viewer) {
        a->ops.sessions_foreach(a->ops.ctx, owned_cb, &own);
        if (sid && !rkv_map_get(&own.sids, sid)) {
            rkv_map_fini(&own.sids);
            req_fail(r, RKV_ENOTFOUND, "events: no session #%llu (see rkvctl sessions list)",
                     (unsigned long long)sid);
            return;
        }
    }
    cJSON *o = cJSON_CreateObject();
    int64_t last = since > 0 ? since - 1 : 0;
    int rc = add_events(a, cJSON_AddArrayToObject(o, "events"), since, sid, (size_t)limit,
                        r->viewer ? &own.sids : NULL, &last);
    rkv_map_fini(&own.sids);
    if (rc) {
        cJSON_Delete(o);
        req_fail(r, rc, "events: cannot read the event log: %s", rkv_strerror(rc));
        return;
    }
    /* pass next_since back to see only newer events (events --follow) */
    cJSON_AddNumberToObject(o, "next_since", (double)(last + 1));
    req_finish(r, 0, o, NULL);
}

static void keys_changed(struct admin *a)
{
    memset(a->keys, 0, sizeof a->keys);
    int n = 0;
    if (store_key_count(a->store, &n) == 0)
        a->n_keys = n;
}

/* the required "id" of a key command; -1 when it failed the request */
static int arg_key_id(struct admin_req *r, const cJSON *args, int64_t *id)
{
    int got = arg_int(r, args, "id", 1, INT64_MAX, id);
    if (got == 0)
        req_fail(r, RKV_EINVAL, "%s: id is required (see rkvctl keys list)", r->cmd->name);
    return got <= 0 ? -1 : 0;
}

/* a limit argument: absent -> KEEP, "default" or null -> DEFAULT, else 0..max */
static int arg_limit(struct admin_req *r, const cJSON *args, const char *name, int64_t *out)
{
    const cJSON *v = arg(args, name);
    *out = STORE_LIMIT_KEEP;
    if (!v)
        return 0;
    if (cJSON_IsNull(v) || (cJSON_IsString(v) && !strcmp(v->valuestring, "default"))) {
        *out = STORE_LIMIT_DEFAULT;
        return 1;
    }
    if (arg_int(r, args, name, 0, INT32_MAX, out) < 0) {
        return -1;
    }
    return 1;
}

static const char *const limit_names[] = {"rpm", "tpm", "max_concurrent", "max_tokens",
                                          "max_prompt"};

/* the four limit arguments; *any: one was given */
static int arg_limits(struct admin_req *r, const cJSON *args, struct store_key_limits *l, int *any)
{
    int64_t *f[] = {&l->rpm, &l->tpm, &l->max_concurrent, &l->max_tokens, &l->max_prompt};
    *any = 0;
    for (int i = 0; i < 5; i++) {
        int got = arg_limit(r, args, limit_names[i], f[i]);
        if (got < 0)
            return -1;
        *any |= got;
    }
    return 0;
}

/* {"rpm": 60 | "default", ...}: a number is the key's own, "default" follows rkvd's config */
static void add_limits(cJSON *o, const struct store_key_limits *l)
{
    const int64_t f[] = {l->rpm, l->tpm, l->max_concurrent, l->max_tokens, l->max_prompt};
    cJSON *lim = cJSON_AddObjectToObject(o, "limits");
    for (int i = 0; i < 5; i++) {
        if (f[i] < 0)
            cJSON_AddStringToObject(lim, limit_names[i], "default");
        else
            cJSON_AddNumberToObject(lim, limit_names[i], (double)f[i]);
    }
}

static void cmd_keys_limits(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t id;
    if (arg_key_id(r, args, &id))
        return;
    struct store_key_limits l;
    int any;
    if (arg_limits(r, args, &l, &any))
        return;
    struct store_key k;
    int rc = store_key_set_limits(a->store, id, &l, &k);
    if (rc) {
        req_fail(r, rc, "keys_limits: no live key %lld (see rkvctl keys list): %s", (long long)id,
                 rkv_strerror(rc));
        return;
    }
    if (any) {
        keys_changed(a);
        log_info("admin: limits of API key %lld changed", (long long)id);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "name", k.name);
    add_limits(o, &k.lim);
    req_finish(r, 0, o, NULL);
}

static void cmd_keys_add(struct admin *a, const cJSON *args, struct admin_req *r)
{
    const cJSON *name = arg(args, "name"), *scope = arg(args, "scope");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 63) {
        req_fail(r, RKV_EINVAL,
                 "keys_add: name is required: 1 to 63 characters that say "
                 "whose key it is");
        return;
    }
    const char *sc = cJSON_IsString(scope) ? scope->valuestring : scope ? "" : "user";
    if (strcmp(sc, "user") && strcmp(sc, "admin")) {
        req_fail(r, RKV_EINVAL,
                 "keys_add: scope must be \"user\" (the /v1 API) or \"admin\" "
                 "(also the admin API)");
        return;
    }
    struct store_key_limits l;
    int any;
    if (arg_limits(r, args, &l, &any))
        return;
    char secret[128];
    int64_t id = 0;
    struct store_key k = {.lim = {STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                  STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT}};
    int rc = store_key_add(a->store, name->valuestring, sc, secret, sizeof secret, &id);
    if (!rc && any)
        rc = store_key_set_limits(a->store, id, &l, &k);
    if (rc) {
        OPENSSL_cleanse(secret, sizeof secret);
        req_fail(r, rc, "keys_add: cannot store the key: %s", rkv_strerror(rc));
        return;
    }
    keys_changed(a);
    log_info("admin: API key %lld (%s, %s) added", (long long)id, name->valuestring, sc);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "name", name->valuestring);
    cJSON_AddStringToObject(o, "scope", sc);
    cJSON_AddStringToObject(o, "secret", secret);
    OPENSSL_cleanse(secret, sizeof secret);
    add_limits(o, &k.lim);
    req_finish(r, 0, o, NULL);
}

static void cmd_keys_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct store_key *k = calloc(1000, sizeof *k);
    size_t n = 0;
    int rc = k ? store_key_list(a->store, k, 1000, &n) : RKV_ENOMEM;
    if (rc) {
        free(k);
        req_fail(r, rc, "keys_list: %s", rkv_strerror(rc));
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "keys");
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", (double)k[i].id);
        cJSON_AddStringToObject(e, "name", k[i].name);
        cJSON_AddStringToObject(e, "scope", k[i].scope);
        cJSON_AddStringToObject(e, "prefix", k[i].prefix);
        cJSON_AddNumberToObject(e, "created_ms", (double)k[i].created_ms);
        cJSON_AddBoolToObject(e, "revoked", k[i].revoked);
        add_limits(e, &k[i].lim);
        cJSON_AddItemToArray(arr, e);
    }
    free(k);
    req_finish(r, 0, o, NULL);
}

static void cmd_keys_revoke(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t id;
    if (arg_key_id(r, args, &id))
        return;
    int rc = store_key_revoke(a->store, id);
    if (rc) {
        req_fail(r, rc, "keys_revoke: no live key %lld (see rkvctl keys list): %s", (long long)id,
                 rkv_strerror(rc));
        return;
    }
    keys_changed(a);
    log_info("admin: API key %lld revoked", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddBoolToObject(o, "revoked", 1);
    req_finish(r, 0, o, NULL);
}

/* --- kvmgr calls: budgets and mode --------------------------------------------------- */

static void kv_done(void *ud, int rc, const struct proto_in *reply, const char *err);

static int kv_call(struct admin *a, struct admin_req *r, int type, const void *msg)
{
    struct proto_wbuf w;
    char err[256];
    proto_wbuf_init(&w);
    int rc = proto_put_json(&w, type, msg, err, sizeof err);
    if (!rc)
        rc = a->ops.kvmgr_call(a->ops.ctx, type, w.data, w.len, kv_done, r);
    proto_wbuf_free(&w);
    if (rc) {
        req_fail(r, rc, "%s: cannot ask kvmgr: %s", r->cmd->name, rkv_strerror(rc));
        return rc;
    }
    r->waiting_kv = 1;
    return 0;
}

static void cmd_budget_get(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t gpu = -1;
    if (arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON *b = budget_json(a->vram_target, a->host_budget, a->compute_reserve);
    cJSON_AddNumberToObject(b, "gpu", (double)gpu);
    cJSON_AddItemToObject(o, "budget", b);
    cJSON_AddBoolToObject(o, "set_at_runtime", a->runtime_budget);
    req_finish(r, 0, o, NULL);
}

static void cmd_budget_set(struct admin *a, const cJSON *args, struct admin_req *r)
{
    uint64_t vram = a->vram_target, host = a->host_budget, reserve = a->compute_reserve;
    int64_t gpu = -1;
    int n = 0, got;
    if ((got = arg_size(r, args, "vram_target", PROTO_MIN_BUDGET, &vram)) < 0)
        return;
    n += got;
    if ((got = arg_size(r, args, "host_budget", PROTO_MIN_BUDGET, &host)) < 0)
        return;
    n += got;
    if ((got = arg_size(r, args, "compute_reserve", 0, &reserve)) < 0)
        return;
    n += got;
    if (arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    if (!n) {
        req_fail(r, RKV_EINVAL,
                 "budget_set: give at least one of vram_target, host_budget, "
                 "compute_reserve");
        return;
    }
    r->state = cJSON_CreateObject();
    cJSON_AddItemToObject(r->state, "budget", budget_json(vram, host, reserve));
    cJSON_AddItemToObject(r->state, "before", hist_json(a, -1));
    if (gpu >= 0 && a->cfg.n_gpus > 1)
        cJSON_AddStringToObject(r->state, "note", "kvmgr applies one VRAM target to every GPU");
    struct proto_budget b = {vram, host, reserve, gpu};
    /* a histogram of kvmgr's plan for it comes after this; it may come before the answer */
    r->hist_after_ms = rkv_wall_ms();
    kv_call(a, r, PROTO_MSG_BUDGET_SET, &b);
}

static void setting_size(struct admin *a, const char *key, uint64_t v)
{
    char s[32];
    snprintf(s, sizeof s, "%lluB", (unsigned long long)v);
    int rc = store_setting_set(a->store, key, s);
    if (rc)
        log_error("admin: cannot persist %s: %s (the value applies until rkvd restarts)", key,
                  rkv_strerror(rc));
}

static void summarize(cJSON *before, cJSON *after, cJSON *out)
{
    char line[512];
    const cJSON *bg, *ag;
    size_t k = 0;
    cJSON_ArrayForEach(ag, after)
    {
        bg = cJSON_GetArrayItem(before, (int)k++);
        int gpu = cJSON_GetObjectItem(ag, "gpu")->valueint;
        int n = snprintf(line, sizeof line, "gpu %d:", gpu);
        int changed = 0;
        for (int t = 0; t < PROTO_N_TACTICS; t++) {
            const char *nm = proto_tactic_names[t];
            int x = bg ? cJSON_GetObjectItem(cJSON_GetObjectItem(bg, "sessions"), nm)->valueint : 0;
            int y = cJSON_GetObjectItem(cJSON_GetObjectItem(ag, "sessions"), nm)->valueint;
            if (x != y || y) {
                n += snprintf(line + n, sizeof line - (size_t)n, " %s %d->%d", nm, x, y);
                changed |= x != y;
            }
            if ((size_t)n >= sizeof line)
                break;
        }
        if (!changed && (size_t)n < sizeof line)
            snprintf(line + n, sizeof line - (size_t)n, " no session changed tactic");
        cJSON_AddItemToArray(out, cJSON_CreateString(line));
    }
}

/* every gpu's histogram shows kvmgr's plan for r's budget: one from the plan the answer named
 * (or a later one) that arrived after r was sent (a kvmgr started since counts plans anew), or,
 * from a kvmgr that names no plans, one that arrived after the answer */
static int hists_after(const struct admin *a, const struct admin_req *r)
{
    for (uint32_t g = 0; g < a->cfg.n_gpus && g < ADMIN_MAX_WORKERS; g++) {
        int seen = r->hist_seq
                       ? a->hist_ms[g] >= r->hist_after_ms && a->hist[g].plan_seq >= r->hist_seq
                       : a->hist_ms[g] > r->hist_after_ms;
        if (!seen)
            return 0;
    }
    return 1;
}

static void budget_finish(struct admin *a, struct admin_req *r)
{
    cJSON *res = r->state;
    r->state = NULL;
    cJSON *after = hist_json(a, -1);
    cJSON_AddItemToObject(res, "summary", cJSON_CreateArray());
    summarize(cJSON_GetObjectItem(res, "before"), after, cJSON_GetObjectItem(res, "summary"));
    cJSON_AddItemToObject(res, "after", after);
    req_finish(r, 0, res, NULL);
}

static void hist_timer_cb(uv_timer_t *t)
{
    struct admin *a = t->data;
    uint64_t now = rkv_wall_ms();
    for (struct admin_req *r = a->reqs, *n; r; r = n) {
        n = r->next;
        if (r->waiting_hist && now >= r->hist_after_ms + HIST_WAIT_MS) {
            /* no fresh histogram: answer with what there is */
            r->waiting_hist = 0;
            budget_finish(a, r);
        }
    }
}

static void kv_done(void *ud, int rc, const struct proto_in *reply, const char *err)
{
    struct admin_req *r = ud;
    struct admin *a = r->a;
    r->waiting_kv = 0;
    if (r->answered) {
        req_maybe_free(r);
        return;
    }
    char jerr[256];
    if (rc) {
        req_fail(r, rc, "%s: kvmgr did not take it: %s", r->cmd->name,
                 err && err[0] ? err : rkv_strerror(rc));
        return;
    }
    if (reply->hdr.type == PROTO_MSG_MODE) {
        struct proto_mode_msg m;
        if ((rc = proto_json_decode(PROTO_MSG_MODE, reply->payload, reply->len, &m, jerr,
                                    sizeof jerr))) {
            req_fail(r, RKV_EPROTO, "kvmgr's mode answer: %s", jerr);
            return;
        }
        if (r->cmd->changes) {
            int src = store_setting_set(a->store, "mode", proto_mode_names[m.mode]);
            if (src)
                log_error("admin: cannot persist mode: %s", rkv_strerror(src));
            log_info("admin: mode set to %s", proto_mode_names[m.mode]);
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "mode", proto_mode_names[m.mode]);
        req_finish(r, 0, o, NULL);
        return;
    }
    if (reply->hdr.type != PROTO_MSG_BUDGET) {
        req_fail(r, RKV_EPROTO, "kvmgr answered %s with %s", r->cmd->name,
                 proto_msg_name(reply->hdr.type));
        return;
    }
    struct proto_budget b;
    if ((rc = proto_json_decode(PROTO_MSG_BUDGET, reply->payload, reply->len, &b, jerr,
                                sizeof jerr))) {
        req_fail(r, RKV_EPROTO, "kvmgr's budget answer: %s", jerr);
        return;
    }
    a->vram_target = b.vram_target_bytes;
    a->host_budget = b.host_budget_bytes;
    a->compute_reserve = b.compute_reserve_bytes;
    a->runtime_budget = 1;
    if (!r->state) { /* a resend to a new kvmgr */
        req_finish(r, 0, NULL, NULL);
        return;
    }
    setting_size(a, "vram_target", b.vram_target_bytes);
    setting_size(a, "host_budget", b.host_budget_bytes);
    setting_size(a, "compute_reserve", b.compute_reserve_bytes);
    if (a->ops.budget_applied)
        a->ops.budget_applied(a->ops.ctx, b.vram_target_bytes, b.host_budget_bytes,
                              b.compute_reserve_bytes);
    char v[32], h[32], c[32];
    cfg_format_size(b.vram_target_bytes, v, sizeof v);
    cfg_format_size(b.host_budget_bytes, h, sizeof h);
    cfg_format_size(b.compute_reserve_bytes, c, sizeof c);
    log_info("admin: budgets set: vram target %s, host %s, compute reserve %s (persisted)", v, h,
             c);
    cJSON_ReplaceItemInObject(
        r->state, "budget",
        budget_json(b.vram_target_bytes, b.host_budget_bytes, b.compute_reserve_bytes));
    /* kvmgr re-planned before it answered and sent the plan's histogram, which may be here
     * already; a kvmgr that names no plans shows it in its next one */
    r->waiting_hist = 1;
    r->hist_seq = b.plan_seq;
    if (!b.plan_seq)
        r->hist_after_ms = rkv_wall_ms();
    if (hists_after(a, r)) {
        r->waiting_hist = 0;
        budget_finish(a, r);
        return;
    }
    uv_timer_start(&a->hist_timer, hist_timer_cb, HIST_WAIT_MS + 10, 0);
}

static void cmd_mode_get(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct proto_empty e = {0};
    kv_call(a, r, PROTO_MSG_MODE_GET, &e);
}

static void cmd_mode_set(struct admin *a, const cJSON *args, struct admin_req *r)
{
    const cJSON *m = arg(args, "mode");
    int mode = -1;
    for (int i = 0; cJSON_IsString(m) && proto_mode_names[i]; i++)
        if (strcmp(m->valuestring, proto_mode_names[i]) == 0)
            mode = i;
    if (mode < 0) {
        req_fail(r, RKV_EINVAL, "mode_set: mode must be auto, resident, window or cpu_tail");
        return;
    }
    struct proto_mode_msg mm = {mode};
    kv_call(a, r, PROTO_MSG_MODE_SET, &mm);
}

/* --- the table ------------------------------------------------------------------------ */

static const struct admin_cmd g_cmds[] = {
    {"status", 0, "", cmd_status},
    {"budget_get", 0, "gpu", cmd_budget_get},
    {"budget_set", 1, "vram_target host_budget compute_reserve gpu", cmd_budget_set},
    {"mode_get", 0, "", cmd_mode_get},
    {"mode_set", 1, "mode", cmd_mode_set},
    {"tactics", 0, "gpu", cmd_tactics},
    {"sessions_list", 0, "", cmd_sessions_list},
    {"session_show", 0, "session", cmd_session_show},
    {"session_evict", 1, "session", cmd_session_evict},
    {"session_pin", 1, "session", cmd_session_pin},
    {"session_unpin", 1, "session", cmd_session_unpin},
    {"workers_list", 0, "", cmd_workers_list},
    {"worker_restart", 1, "worker", cmd_worker_restart},
    {"worker_drain", 1, "worker drain", cmd_worker_drain},
    {"events", 0, "since session limit", cmd_events},
    {"keys_add", 1, "name scope rpm tpm max_concurrent max_tokens max_prompt", cmd_keys_add},
    {"keys_list", 0, "", cmd_keys_list, 1},
    {"keys_revoke", 1, "id", cmd_keys_revoke},
    {"keys_limits", 1, "id rpm tpm max_concurrent max_tokens max_prompt", cmd_keys_limits},
};
#define N_CMDS (sizeof g_cmds / sizeof g_cmds[0])

static const struct admin_cmd *cmd_find(const char *name)
{
    for (size_t i = 0; name && i < N_CMDS; i++)
        if (strcmp(g_cmds[i].name, name) == 0)
            return &g_cmds[i];
    return NULL;
}

int admin_cmd_changes(const char *cmd)
{
    const struct admin_cmd *c = cmd_find(cmd);
    return c ? c->changes : -1;
}

static struct admin_req *req_new(struct admin *a, enum via via)
{
    struct admin_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->a = a;
    r->via = via;
    r->next = a->reqs;
    a->reqs = r;
    return r;
}

/* runs r's command (or refuses it) */
static void run(struct admin *a, struct admin_req *r, const char *name, const cJSON *args,
                int changes)
{
    r->cmd = cmd_find(name);
    if (!r->cmd) {
        char list[600];
        size_t n = 0;
        for (size_t i = 0; i < N_CMDS && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", g_cmds[i].name);
        req_fail(r, RKV_ENOTFOUND, "unknown admin command \"%.64s\" (rkvd knows: %s)",
                 name ? name : "", list);
        return;
    }
    if (a->stopping) {
        req_fail(r, RKV_ESTATE, "rkvd is shutting down");
        return;
    }
    if (r->cmd->changes && !changes) {
        req_fail(r, RKV_EAUTH,
                 "%s changes rkvd: send it with POST and \"Authorization: Bearer <key>\" of an "
                 "admin key (rkvctl keys add NAME --scope admin), or use rkvctl on the host",
                 r->cmd->name);
        return;
    }
    if (r->cmd->needs_admin && r->viewer) {
        req_fail(r, RKV_EPERM,
                 "%s shows every key's data: this key has user scope; use a key with admin "
                 "scope or rkvctl on the host",
                 r->cmd->name);
        return;
    }
    if (check_fields(r, args))
        return;
    r->cmd->fn(a, args, r);
}

void admin_exec(struct admin *a, const char *cmd, const cJSON *args, int changes,
                admin_done_fn done, void *ud)
{
    struct admin_req *r = req_new(a, VIA_FN);
    if (!r) {
        done(ud, RKV_ENOMEM, NULL, "out of memory");
        return;
    }
    r->done = done;
    r->done_ud = ud;
    run(a, r, cmd, args, changes);
}

/* --- the socket ------------------------------------------------------------------------ */

static void poll_cb(uv_poll_t *p, int status, int events);

static void sock_pump(struct admin *a)
{
    /* nng's rep socket holds one request at a time: take the next only when
     * the last one is answered */
    while (a->sock && !a->sock_busy && !a->stopping) {
        struct proto_in in;
        char err[256];
        int rc = proto_sock_recv(a->sock, &in, PROTO_NONBLOCK, err, sizeof err);
        if (rc == -EAGAIN)
            break;
        if (rc < 0) {
            if (!in.nmsg_)
                break; /* nothing received */
            /* a bad envelope: say so, so the peer does not wait */
            proto_sock_send_error(a->sock, in.hdr.req_id, rc, err);
            log_ratelimited(RKV_LOG_WARN, 5000, 5, "admin socket: bad request: %s", err);
            proto_in_free(&in);
            continue;
        }
        a->sock_busy = 1;
        struct admin_req *r = req_new(a, VIA_SOCK);
        if (!r) {
            proto_sock_send_error(a->sock, in.hdr.req_id, RKV_ENOMEM, "out of memory");
            a->sock_busy = 0;
            proto_in_free(&in);
            continue;
        }
        r->req_id = in.hdr.req_id;
        if (in.hdr.type != PROTO_MSG_ADMIN_REQ) {
            proto_in_free(&in);
            req_fail(r, RKV_EPROTO, "the admin socket serves admin_req messages, not %s",
                     proto_msg_name(in.hdr.type));
            continue;
        }
        cJSON *body = cJSON_ParseWithLength(in.payload, in.len);
        proto_in_free(&in);
        const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(body, "cmd");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(body, "args");
        char dup[160];
        if (!cJSON_IsObject(body) || !cJSON_IsString(cmd))
            req_fail(r, RKV_EFORMAT, "an admin request is {\"cmd\": NAME, \"args\": {...}}");
        else if (proto_json_dup_key(body, dup, sizeof dup))
            req_fail(r, RKV_EFORMAT, "the key \"%s\" appears twice: send each key once", dup);
        else
            run(a, r, cmd->valuestring, args, 1);
        cJSON_Delete(body);
    }
    if (!a->sock || a->stopping)
        return;
    if (a->sock_busy && a->polling) {
        uv_poll_stop(&a->poll);
        a->polling = 0;
    } else if (!a->sock_busy && !a->polling) {
        uv_poll_start(&a->poll, UV_READABLE, poll_cb);
        a->polling = 1;
    }
}

static void poll_cb(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    sock_pump(p->data);
}

static int open_socket(struct admin *a, char *err, size_t errlen)
{
    char url[600];
    snprintf(url, sizeof url, "ipc://%s", a->socket_path);
    /* a socket file left by an rkvd that died: nng would fail to listen */
    struct stat st;
    if (lstat(a->socket_path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(a->socket_path);
    int rc = proto_sock_open(&a->sock, PROTO_SOCK_REP, url, err, errlen);
    if (rc)
        return rc;
    gid_t gid = (gid_t)-1;
    if (a->cfg.socket_group && a->cfg.socket_group[0]) {
        struct group *g = getgrnam(a->cfg.socket_group);
        if (!g) {
            snprintf(err, errlen,
                     "admin_group: no group \"%s\" on this host: create it (groupadd %s) or "
                     "set admin_group to an existing group",
                     a->cfg.socket_group, a->cfg.socket_group);
            return RKV_ENOTFOUND;
        }
        gid = g->gr_gid;
    }
    if ((gid != (gid_t)-1 && chown(a->socket_path, (uid_t)-1, gid) != 0) ||
        chmod(a->socket_path, 0660) != 0) {
        rc = -errno;
        snprintf(err, errlen, "admin socket %s: cannot set group and mode 0660: %s", a->socket_path,
                 strerror(errno));
        return rc;
    }
    int fd;
    if ((rc = proto_sock_recv_fd(a->sock, &fd))) {
        snprintf(err, errlen, "admin socket %s: no pollable fd: %s", a->socket_path,
                 rkv_strerror(rc));
        return rc;
    }
    uv_poll_init(a->loop, &a->poll, fd);
    a->poll.data = a;
    a->handles_open |= 2;
    uv_poll_start(&a->poll, UV_READABLE, poll_cb);
    a->polling = 1;
    return 0;
}

/* --- HTTP --------------------------------------------------------------------------- */

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
}

/* "a=1&b=x%20y" -> {"a":"1","b":"x y"} */
static cJSON *query_args(const char *q)
{
    cJSON *o = cJSON_CreateObject();
    while (q && *q) {
        size_t n = strcspn(q, "&");
        char *kv = strndup(q, n), *out = kv;
        if (!kv)
            break;
        for (char *p = kv; *p; p++) {
            int h, l;
            if (*p == '+')
                *out++ = ' ';
            else if (*p == '%' && (h = hexval(p[1])) >= 0 && (l = hexval(p[2])) >= 0) {
                *out++ = (char)(h * 16 + l);
                p += 2;
            } else
                *out++ = *p;
        }
        *out = 0;
        char *eq = strchr(kv, '=');
        if (eq)
            *eq = 0;
        if (kv[0]) /* a name given twice stays twice: admin_http refuses it */
            cJSON_AddStringToObject(o, kv, eq ? eq + 1 : "");
        free(kv);
        q += n;
        q += *q == '&';
    }
    return o;
}

/* 0 and *key when secret is a live key; the slow hash runs once a minute per key */
static int verify_key(struct admin *a, const char *secret, struct store_key *key)
{
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)secret, strlen(secret), h);
    uint64_t now = rkv_now_ms();
    int free_slot = 0; /* an unused entry, else the oldest */
    for (int i = 0; i < KEY_CACHE; i++) {
        struct key_cache_ent *e = &a->keys[i];
        if (e->used && now - e->at_ms < KEY_CACHE_MS && !memcmp(e->hash, h, sizeof h)) {
            key->id = e->id;
            snprintf(key->scope, sizeof key->scope, "%s", e->scope);
            key->lim = e->lim;
            return 0;
        }
        const struct key_cache_ent *f = &a->keys[free_slot];
        if (f->used && (!e->used || e->at_ms < f->at_ms))
            free_slot = i;
    }
    int rc = store_key_verify(a->store, secret, key);
    if (rc)
        return rc;
    struct key_cache_ent *e = &a->keys[free_slot];
    memcpy(e->hash, h, sizeof h);
    e->id = key->id;
    snprintf(e->scope, sizeof e->scope, "%s", key->scope);
    e->lim = key->lim;
    e->at_ms = now;
    e->used = 1;
    return 0;
}

int admin_authorize(struct admin *a, const char *secret)
{
    return admin_key_lookup(a, secret, NULL, NULL);
}

int admin_key_lookup(struct admin *a, const char *secret, int64_t *id, struct store_key_limits *lim)
{
    static const struct store_key_limits open = {STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                                 STORE_LIMIT_DEFAULT, STORE_LIMIT_DEFAULT,
                                                 STORE_LIMIT_DEFAULT};
    if (id)
        *id = 0;
    if (lim)
        *lim = open;
    if (!a || a->n_keys == 0)
        return 0;
    struct store_key k;
    if (!secret || verify_key(a, secret, &k) != 0)
        return RKV_EAUTH;
    if (id)
        *id = k.id;
    if (lim)
        *lim = k.lim;
    return 0;
}

static int loopback(const char *peer)
{
    return peer && (!strncmp(peer, "127.", 4) || !strncmp(peer, "[::1]", 5) ||
                    !strncmp(peer, "::1", 3) || !strncmp(peer, "::ffff:127.", 11));
}

int admin_http(struct admin *a, struct http_req *req)
{
    const char *path = http_req_path(req), *method = http_req_method(req);
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!strcmp(path, "/") || !strcmp(path, "/status")) {
        if (!get) {
            http_resp_header(req, "Allow", "GET, HEAD");
            http_respond(req, 405, "text/plain", "use GET /\n", 10);
            return 1;
        }
        http_resp_header(req, "Cache-Control", "no-store");
        http_respond(req, 200, "text/html; charset=utf-8", admin_status_page,
                     strlen(admin_status_page));
        return 1;
    }
    if (strncmp(path, "/admin/v1/", 10) != 0)
        return 0;
    const char *name = path + 10;
    int changes = admin_cmd_changes(name);
    if (!get && strcmp(method, "POST")) {
        http_resp_header(req, "Allow", "GET, POST");
        http_send_error(req, RKV_EINVAL, "use GET (read-only commands) or POST");
        return 1;
    }
    if (changes == 1 && get) {
        http_resp_header(req, "Allow", "POST");
        http_send_error(req, RKV_EAUTH, "this command changes rkvd: use POST with an admin key");
        return 1;
    }
    /* who is asking */
    struct store_key key = {0};
    const char *b = http_req_bearer(req);
    int has_key = b && verify_key(a, b, &key) == 0;
    if (b && !has_key) {
        http_send_error(req, RKV_EAUTH, "the API key is not valid (revoked or mistyped)");
        return 1;
    }
    int is_admin = has_key && !strcmp(key.scope, "admin");
    /* once keys exist every read needs one: behind a reverse proxy every peer is loopback */
    if (changes != 1 && !has_key && (a->n_keys > 0 || !loopback(http_req_peer(req)))) {
        http_send_error(req, RKV_EAUTH,
                        a->n_keys > 0
                            ? "API keys exist, so the admin API needs one: send Authorization: "
                              "Bearer <key> (a user key sees its own sessions, an admin key all)"
                            : "the admin API answers other hosts only with an API key: send "
                              "Authorization: Bearer <key> (rkvctl keys add NAME)");
        return 1;
    }
    if (changes == 1 && !is_admin) {
        http_send_error(req, has_key ? RKV_EPERM : RKV_EAUTH,
                        has_key ? "this key has user scope: changes need a key with admin scope"
                                : "changes need Authorization: Bearer <key> of an admin key "
                                  "(rkvctl keys add NAME --scope admin)");
        return 1;
    }
    cJSON *args = NULL;
    if (get) {
        args = query_args(http_req_query(req));
    } else {
        size_t len;
        const char *body = http_req_body(req, &len);
        args = len ? cJSON_ParseWithLength(body, len) : cJSON_CreateObject();
        if (!cJSON_IsObject(args)) {
            cJSON_Delete(args);
            http_send_error(req, RKV_EFORMAT, "the body must be a JSON object of arguments");
            return 1;
        }
    }
    char dup[160], msg[220];
    if (proto_json_dup_key(args, dup, sizeof dup)) {
        cJSON_Delete(args);
        snprintf(msg, sizeof msg, "the argument \"%s\" appears twice: send each once", dup);
        http_send_error(req, RKV_EFORMAT, msg);
        return 1;
    }
    struct admin_req *r = req_new(a, VIA_HTTP);
    if (!r) {
        cJSON_Delete(args);
        http_send_error(req, RKV_ENOMEM, "out of memory");
        return 1;
    }
    r->http = req;
    r->viewer = has_key && !is_admin ? key.id : 0;
    run(a, r, name, args, is_admin);
    cJSON_Delete(args);
    return 1;
}

/* --- news from kvmgr ------------------------------------------------------------------ */

static void prune_cb(void *ud, const struct sched_session_info *si)
{
    struct rkv_map *live = ud;
    rkv_map_put(live, si->sid, (void *)1);
}

/* forget the tactics of sessions that are gone */
static void prune_tactics(struct admin *a)
{
    struct rkv_map live;
    struct rkv_vec dead;
    rkv_map_init(&live);
    rkv_vec_init(&dead, sizeof(uint64_t));
    a->ops.sessions_foreach(a->ops.ctx, prune_cb, &live);
    size_t it = 0;
    uint64_t k;
    void *v;
    while (rkv_map_next(&a->tactics, &it, &k, &v))
        if (!rkv_map_get(&live, k))
            rkv_vec_push(&dead, &k);
    for (size_t i = 0; i < dead.len; i++)
        free(rkv_map_del(&a->tactics, ((uint64_t *)dead.data)[i]));
    rkv_vec_fini(&dead);
    rkv_map_fini(&live);
}

void admin_on_histogram(struct admin *a, const struct proto_histogram *h)
{
    if (!a || h->gpu < 0 || h->gpu >= ADMIN_MAX_WORKERS)
        return;
    uint64_t now = rkv_wall_ms();
    a->hist[h->gpu] = *h;
    a->hist_ms[h->gpu] = now;
    /* budget_set answers once every gpu has a histogram from after the re-plan */
    for (struct admin_req *r = a->reqs, *n; r; r = n) {
        n = r->next;
        if (r->waiting_hist && hists_after(a, r)) {
            r->waiting_hist = 0;
            budget_finish(a, r);
        }
    }
}

void admin_on_tactic_event(struct admin *a, const struct proto_tactic_event *ev)
{
    if (!a || ev->to < 0 || ev->to >= PROTO_N_TACTICS)
        return;
    struct tactic_state *ts = rkv_map_get(&a->tactics, ev->session_id);
    if (!ts) {
        ts = calloc(1, sizeof *ts);
        if (!ts || rkv_map_put(&a->tactics, ev->session_id, ts)) {
            free(ts);
            return;
        }
    }
    ts->tactic = (uint8_t)ev->to;
    ts->tail_blocks = ev->to == PROTO_TACTIC_RESIDENT ? 0 : ev->tail_blocks;
    ts->ts_ms = ev->ts_ms;
}

static void resend_done(void *ud, int rc, const cJSON *result, const char *err)
{
    (void)ud;
    (void)result;
    if (rc)
        log_warn("admin: could not give the new kvmgr the runtime budgets: %s", err);
}

void admin_on_kvmgr_changed(struct admin *a, uint32_t old_pid)
{
    if (!a || !old_pid || !a->runtime_budget)
        return;
    struct admin_req *r = req_new(a, VIA_FN);
    if (!r)
        return;
    r->done = resend_done;
    r->cmd = cmd_find("budget_set");
    struct proto_budget b = {a->vram_target, a->host_budget, a->compute_reserve, -1};
    kv_call(a, r, PROTO_MSG_BUDGET_SET, &b);
}

void admin_tick(struct admin *a)
{
    if (!a)
        return;
    /* no proto_sock_heal here: its sign of the nng 1.5 handshake bug (the
     * listener's "other" errors) also counts rkvctl's ordinary hang-ups, and
     * re-listening drops every connection, a waiting rkvctl's too. rkvctl
     * always completes the handshake, so the bug needs a foreign client. */
    struct admin_info *in = info_new(a);
    if (!in)
        return;
    a->rate_ms[a->rate_pos] = rkv_now_ms();
    a->rate_tok[a->rate_pos] = in->st.gen_tokens;
    a->rate_pos = (a->rate_pos + 1) % RATE_SAMPLES;
    if (a->rate_n < RATE_SAMPLES)
        a->rate_n++;
    free(in);
    uint64_t now = rkv_now_ms();
    if (now - a->last_prune_ms > 10000) {
        a->last_prune_ms = now;
        prune_tactics(a);
    }
}

/* --- lifecycle ------------------------------------------------------------------------ */

int admin_new(uv_loop_t *loop, const struct admin_config *cfg, const struct admin_ops *ops,
              struct store *store, struct admin **out, char *errbuf, size_t errlen)
{
    struct admin *a = calloc(1, sizeof *a);
    if (!a)
        return RKV_ENOMEM;
    a->loop = loop;
    a->cfg = *cfg;
    a->ops = *ops;
    a->store = store;
    if (!a->cfg.n_gpus)
        a->cfg.n_gpus = 1;
    a->vram_target = cfg->vram_target;
    a->host_budget = cfg->host_budget;
    a->compute_reserve = cfg->compute_reserve;
    rkv_map_init(&a->tactics);
    keys_changed(a);
    uv_timer_init(loop, &a->hist_timer);
    a->hist_timer.data = a;
    a->handles_open |= 1;
    if (cfg->socket_path && cfg->socket_path[0]) {
        snprintf(a->socket_path, sizeof a->socket_path, "%s", cfg->socket_path);
        int rc = open_socket(a, errbuf, errlen);
        if (rc) {
            admin_shutdown(a);
            *out = a; /* the caller frees after the loop closed the handles */
            return rc;
        }
        log_info("admin socket on %s (mode 0660%s%s)", a->socket_path,
                 cfg->socket_group && cfg->socket_group[0] ? ", group " : "",
                 cfg->socket_group ? cfg->socket_group : "");
    }
    *out = a;
    return 0;
}

void admin_shutdown(struct admin *a)
{
    if (!a || a->stopping)
        return;
    a->stopping = 1;
    if (a->polling)
        uv_poll_stop(&a->poll);
    a->polling = 0;
    for (struct admin_req *r = a->reqs, *n; r; r = n) {
        n = r->next;
        r->waiting_hist = 0;
        if (!r->answered)
            req_fail(r, RKV_ESTATE, "rkvd is shutting down");
    }
    if (a->handles_open & 2)
        uv_close((uv_handle_t *)&a->poll, NULL);
    if (a->handles_open & 1)
        uv_close((uv_handle_t *)&a->hist_timer, NULL);
    a->handles_open = 0;
    proto_sock_close(a->sock);
    a->sock = NULL;
    if (a->socket_path[0])
        unlink(a->socket_path);
}

void admin_free(struct admin *a)
{
    if (!a)
        return;
    for (struct admin_req *r = a->reqs, *n; r; r = n) {
        n = r->next;
        cJSON_Delete(r->state);
        free(r);
    }
    size_t it = 0;
    void *v;
    while (rkv_map_next(&a->tactics, &it, NULL, &v))
        free(v);
    rkv_map_fini(&a->tactics);
    free(a);
}
