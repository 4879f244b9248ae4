/* admin.c - the admin command table and its commands: requests, arguments, sessions, status,
 * workers, events; the module's lifecycle. */
#include "daemon/admin_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "proto/sock.h"

#define MAX_EVENTS 1000 /* one events answer */

/* --- answering ---------------------------------------------------------------------- */

void admin_req_maybe_destroy(struct admin_req *r)
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

/* takes result; rc < 0 sends msg as the error */
void admin_req_finish(struct admin_req *r, int rc, cJSON *result, const char *msg)
{
    if (r->answered) {
        cJSON_Delete(result);
        admin_req_maybe_destroy(r);
        return;
    }
    r->answered = 1;
    if (rc < 0 && (!msg || !msg[0]))
        msg = rkv_strerror(rc);
    if (r->via == VIA_FN) {
        r->done(r->done_ud, rc < 0 ? rc : 0, rc < 0 ? NULL : result, rc < 0 ? msg : "");
        cJSON_Delete(result);
    } else if (r->via == VIA_HTTP) {
        admin_http_answer(r, rc, result, msg);
    } else {
        admin_sock_answer(r, rc, result, msg);
    }
    admin_req_maybe_destroy(r);
}

void admin_req_fail(struct admin_req *r, int rc, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    admin_req_finish(r, rc, NULL, msg);
}

/* --- arguments ----------------------------------------------------------------------- */

/* every argument must be one the command knows */
static int check_fields(struct admin_req *r, const cJSON *args)
{
    if (!args)
        return 0;
    if (!cJSON_IsObject(args)) {
        admin_req_fail(r, RKV_EINVAL, "%s: args must be a JSON object", r->cmd->name);
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
            admin_req_fail(r, RKV_EINVAL, "%s: unknown argument \"%.64s\" (%s%s)", r->cmd->name, k,
                           r->cmd->fields[0] ? "expected one of: " : "it takes none",
                           r->cmd->fields);
            return -1;
        }
    }
    return 0;
}

const cJSON *admin_arg(const cJSON *args, const char *name)
{
    const cJSON *v = args ? cJSON_GetObjectItemCaseSensitive(args, name) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* an integer from a JSON number or a decimal string; 1 when present, 0 absent, -1 refused */
int admin_arg_int(struct admin_req *r, const cJSON *args, const char *name, int64_t min,
                  int64_t max, int64_t *out)
{
    const cJSON *v = admin_arg(args, name);
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
        admin_req_fail(r, RKV_EINVAL, "%s: %s must be an integer from %" PRId64 " to %" PRId64,
                       r->cmd->name, name, min, max);
        return -1;
    }
    *out = x;
    return 1;
}

/* a size: a JSON number (bytes) or a string like "512MiB", "24GiB", "24000" (MiB) */
int admin_arg_size(struct admin_req *r, const cJSON *args, const char *name, uint64_t min,
                   uint64_t *out)
{
    const cJSON *v = admin_arg(args, name);
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
        admin_req_fail(
            r, RKV_EINVAL,
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
    const cJSON *v = admin_arg(args, name);
    if (!v)
        return 0;
    if (cJSON_IsNumber(v) && v->valuedouble >= 0) {
        *out = (int64_t)v->valuedouble;
        return 1;
    }
    if (cJSON_IsString(v) && parse_time(v->valuestring, rkv_wall_ms(), out) == 0)
        return 1;
    admin_req_fail(r, RKV_EINVAL,
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
    const cJSON *v = admin_arg(args, "session");
    memset(f, 0, sizeof *f);
    f->viewer = r->viewer;
    char num[32];
    if (cJSON_IsNumber(v)) {
        snprintf(num, sizeof num, "%.0f", v->valuedouble);
        f->want = num;
    } else if (cJSON_IsString(v) && v->valuestring[0]) {
        f->want = v->valuestring;
    } else {
        admin_req_fail(r, RKV_EINVAL,
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
        admin_req_fail(r, RKV_ENOTFOUND, "%s: no session \"%.100s\" (see rkvctl sessions list)",
                       r->cmd->name, f->want);
        return -1;
    }
    if (f->n_hits > 1) {
        admin_req_fail(
            r, RKV_EINVAL,
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
    cJSON_AddNumberToObject(o, "kv_bytes", (double)si->kv_bytes);
    cJSON_AddBoolToObject(o, "busy", si->busy);
    cJSON_AddBoolToObject(o, "pinned", si->pinned);
    cJSON_AddNumberToObject(
        o, "idle_ms", si->last_use_ms && !si->busy ? (double)(rkv_now_ms() - si->last_use_ms) : 0);
    const char *tactic = ts && ts->rotated ? "rotated"
                         : ts              ? proto_tactic_names[ts->tactic]
                         : si->n_kv        ? "resident"
                                           : "none";
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
static struct admin_info *info_create(struct admin *a)
{
    struct admin_info *in = calloc(1, sizeof *in);
    if (in)
        a->ops.info(a->ops.ctx, in);
    return in;
}

static uint32_t block_size(struct admin *a)
{
    struct admin_info *in = info_create(a);
    uint32_t bs = in && in->block_size ? in->block_size : 256;
    free(in);
    return bs;
}

static void cmd_sessions_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    cJSON *res = cJSON_CreateObject();
    struct list_ctx l = {a, cJSON_AddArrayToObject(res, "sessions"), block_size(a), r->viewer};
    a->ops.sessions_foreach(a->ops.ctx, list_cb, &l);
    admin_req_finish(r, 0, res, NULL);
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
    admin_req_finish(r, 0, res, NULL);
}

static void session_change(struct admin *a, const cJSON *args, struct admin_req *r, int what)
{
    struct find_ctx f;
    if (find_session(a, r, args, &f))
        return;
    int rc = what == 2 ? a->ops.session_evict(a->ops.ctx, f.si.sid)
                       : a->ops.session_pin(a->ops.ctx, f.si.sid, what);
    if (rc == RKV_EBUSY) {
        admin_req_fail(r, rc, "session %.100s is serving a request: evict it when the request ends",
                       f.want);
        return;
    }
    if (rc) {
        admin_req_fail(r, rc, "%s: %s", r->cmd->name, rkv_strerror(rc));
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
    admin_req_finish(r, 0, res, NULL);
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

static void cmd_status(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct admin_info *in = info_create(a);
    if (!in) {
        admin_req_fail(r, RKV_ENOMEM, "out of memory");
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
                          admin_budget_json(a->vram_target, a->host_budget, a->compute_reserve));
    cJSON *p = cJSON_AddObjectToObject(o, "pool");
    cJSON_AddNumberToObject(p, "device_used", (double)in->kv.device_used);
    cJSON_AddNumberToObject(p, "device_total", (double)in->kv.device_total);
    cJSON_AddNumberToObject(p, "host_used", (double)in->kv.host_used);
    cJSON_AddNumberToObject(p, "host_total", (double)in->kv.host_total);
    /* what a position's KV takes (all layers, K and V) in the pools' dtype; 0 until a worker
     * has said hello */
    cJSON_AddStringToObject(p, "kv_dtype", in->kv_dtype ? in->kv_dtype : "");
    cJSON_AddNumberToObject(p, "kv_bytes_per_token",
                            (double)proto_status_token_bytes(&in->kv, in->block_size));
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
    admin_req_finish(r, 0, o, NULL);
}

static void cmd_tactics(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t gpu = -1;
    if (admin_arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON *names = cJSON_AddArrayToObject(o, "tactics");
    for (int t = 0; t < PROTO_N_TACTICS; t++)
        cJSON_AddItemToArray(names, cJSON_CreateString(proto_tactic_names[t]));
    cJSON_AddItemToObject(o, "gpus", admin_hist_json(a, gpu));
    admin_req_finish(r, 0, o, NULL);
}

static void cmd_workers_list(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct admin_info *in = info_create(a);
    if (!in) {
        admin_req_fail(r, RKV_ENOMEM, "out of memory");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "workers", workers_json(in));
    free(in);
    admin_req_finish(r, 0, o, NULL);
}

static int worker_arg(struct admin *a, struct admin_req *r, const cJSON *args, uint32_t *w)
{
    int64_t x;
    int got = admin_arg_int(r, args, "worker", 0, (int64_t)a->cfg.n_gpus - 1, &x);
    if (got == 0)
        admin_req_fail(r, RKV_EINVAL, "%s: worker is required: a worker number from 0 to %u",
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
        admin_req_fail(r, rc, "worker %u is not running (it may be restarting already): %s", w,
                       rkv_strerror(rc));
        return;
    }
    log_info("admin: worker %u (pid %u) restarted", w, pid);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "worker", w);
    cJSON_AddNumberToObject(o, "old_pid", pid);
    cJSON_AddBoolToObject(o, "restarting", 1);
    admin_req_finish(r, 0, o, NULL);
}

static void cmd_worker_drain(struct admin *a, const cJSON *args, struct admin_req *r)
{
    uint32_t w;
    if (worker_arg(a, r, args, &w))
        return;
    const cJSON *d = admin_arg(args, "drain");
    if (d && !cJSON_IsBool(d)) {
        admin_req_fail(r, RKV_EINVAL, "worker_drain: drain must be true or false");
        return;
    }
    int drain = !d || cJSON_IsTrue(d);
    int rc = a->ops.worker_drain(a->ops.ctx, w, drain);
    if (rc) {
        admin_req_fail(r, rc, "worker_drain: %s", rkv_strerror(rc));
        return;
    }
    log_info("admin: worker %u %s", w, drain ? "draining: no new sessions" : "takes sessions");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "worker", w);
    cJSON_AddBoolToObject(o, "draining", drain);
    admin_req_finish(r, 0, o, NULL);
}

/* --- events ------------------------------------------------------------------------- */

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
        admin_arg_int(r, args, "limit", 1, MAX_EVENTS, &limit) < 0)
        return;
    uint64_t sid = 0;
    if (admin_arg(args, "session")) {
        const cJSON *v = admin_arg(args, "session");
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
            admin_req_fail(r, RKV_ENOTFOUND, "events: no session #%llu (see rkvctl sessions list)",
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
        admin_req_fail(r, rc, "events: cannot read the event log: %s", rkv_strerror(rc));
        return;
    }
    /* pass next_since back to see only newer events (events --follow) */
    cJSON_AddNumberToObject(o, "next_since", (double)(last + 1));
    admin_req_finish(r, 0, o, NULL);
}

/* --- the table ------------------------------------------------------------------------ */

static const struct admin_cmd g_cmds[] = {
    {"status", 0, "", cmd_status},
    {"budget_get", 0, "gpu", admin_cmd_budget_get},
    {"budget_set", 1, "vram_target host_budget compute_reserve gpu", admin_cmd_budget_set},
    {"mode_get", 0, "", admin_cmd_mode_get},
    {"mode_set", 1, "mode", admin_cmd_mode_set},
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
    {"keys_add", 1, "name scope rpm tpm max_concurrent max_tokens max_prompt", admin_cmd_keys_add},
    {"keys_list", 0, "", admin_cmd_keys_list, 1},
    {"keys_revoke", 1, "id", admin_cmd_keys_revoke},
    {"keys_limits", 1, "id rpm tpm max_concurrent max_tokens max_prompt", admin_cmd_keys_limits},
};
#define N_CMDS (sizeof g_cmds / sizeof g_cmds[0])

const struct admin_cmd *admin_cmd_find(const char *name)
{
    for (size_t i = 0; name && i < N_CMDS; i++)
        if (strcmp(g_cmds[i].name, name) == 0)
            return &g_cmds[i];
    return NULL;
}

int admin_cmd_changes(const char *cmd)
{
    const struct admin_cmd *c = admin_cmd_find(cmd);
    return c ? c->changes : -1;
}

struct admin_req *admin_req_create(struct admin *a, enum via via)
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
void admin_run(struct admin *a, struct admin_req *r, const char *name, const cJSON *args,
               int changes)
{
    r->cmd = admin_cmd_find(name);
    if (!r->cmd) {
        char list[600];
        size_t n = 0;
        for (size_t i = 0; i < N_CMDS && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", g_cmds[i].name);
        admin_req_fail(r, RKV_ENOTFOUND, "unknown admin command \"%.64s\" (rkvd knows: %s)",
                       name ? name : "", list);
        return;
    }
    if (a->stopping) {
        admin_req_fail(r, RKV_ESTATE, "rkvd is shutting down");
        return;
    }
    if (r->cmd->changes && !changes) {
        admin_req_fail(
            r, RKV_EAUTH,
            "%s changes rkvd: send it with POST and \"Authorization: Bearer <key>\" of an "
            "admin key (rkvctl keys add NAME --scope admin), or use rkvctl on the host",
            r->cmd->name);
        return;
    }
    if (r->cmd->needs_admin && r->viewer) {
        admin_req_fail(r, RKV_EPERM,
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
    struct admin_req *r = admin_req_create(a, VIA_FN);
    if (!r) {
        done(ud, RKV_ENOMEM, NULL, "out of memory");
        return;
    }
    r->done = done;
    r->done_ud = ud;
    admin_run(a, r, cmd, args, changes);
}

void admin_tick(struct admin *a)
{
    if (!a)
        return;
    /* no proto_sock_heal here: its sign of the nng 1.5 handshake bug (the
     * listener's "other" errors) also counts rkvctl's ordinary hang-ups, and
     * re-listening drops every connection, a waiting rkvctl's too. rkvctl
     * always completes the handshake, so the bug needs a foreign client. */
    struct admin_info *in = info_create(a);
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
        admin_tactics_prune(a);
    }
}

/* --- lifecycle ------------------------------------------------------------------------ */

int admin_create(uv_loop_t *loop, const struct admin_config *cfg, const struct admin_ops *ops,
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
    admin_keys_changed(a);
    uv_timer_init(loop, &a->hist_timer);
    a->hist_timer.data = a;
    a->handles_open |= 1;
    if (cfg->socket_path && cfg->socket_path[0]) {
        snprintf(a->socket_path, sizeof a->socket_path, "%s", cfg->socket_path);
        int rc = admin_sock_open(a, errbuf, errlen);
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
            admin_req_fail(r, RKV_ESTATE, "rkvd is shutting down");
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

void admin_destroy(struct admin *a)
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
