/* admin_kvmgr.c - the admin commands kvmgr answers (budgets, mode) and kvmgr's news
 * (histograms, tactic events, a new kvmgr). */
#include "daemon/admin_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "proto/json.h"
#include "proto/sock.h"

#define HIST_WAIT_MS 3000 /* budget_set waits this long for the re-planned histogram */

cJSON *admin_budget_json(uint64_t vram, uint64_t host, uint64_t reserve)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "vram_target", (double)vram);
    cJSON_AddNumberToObject(o, "host_budget", (double)host);
    cJSON_AddNumberToObject(o, "compute_reserve", (double)reserve);
    return o;
}

cJSON *admin_hist_json(const struct admin *a, int64_t gpu)
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
        /* of the parked, those waiting for a rotation turn (their requests run) */
        size_t it = 0, rotated = 0;
        void *v;
        while (rkv_map_next(&a->tactics, &it, NULL, &v))
            rotated += ((const struct tactic_state *)v)->rotated &&
                       ((const struct tactic_state *)v)->gpu == g;
        cJSON_AddNumberToObject(o, "rotated", (double)rotated);
        cJSON_AddNumberToObject(o, "device_used", (double)h->device_used);
        cJSON_AddNumberToObject(o, "device_total", (double)h->device_total);
        cJSON_AddNumberToObject(o, "host_used", (double)h->host_used);
        cJSON_AddNumberToObject(o, "host_total", (double)h->host_total);
        cJSON_AddNumberToObject(o, "age_ms", a->hist_ms[g] ? (double)(now - a->hist_ms[g]) : -1);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
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
    proto_wbuf_fini(&w);
    if (rc) {
        admin_req_fail(r, rc, "%s: cannot ask kvmgr: %s", r->cmd->name, rkv_strerror(rc));
        return rc;
    }
    r->waiting_kv = 1;
    return 0;
}

void admin_cmd_budget_get(struct admin *a, const cJSON *args, struct admin_req *r)
{
    int64_t gpu = -1;
    if (admin_arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON *b = admin_budget_json(a->vram_target, a->host_budget, a->compute_reserve);
    cJSON_AddNumberToObject(b, "gpu", (double)gpu);
    cJSON_AddItemToObject(o, "budget", b);
    cJSON_AddBoolToObject(o, "set_at_runtime", a->runtime_budget);
    admin_req_finish(r, 0, o, NULL);
}

void admin_cmd_budget_set(struct admin *a, const cJSON *args, struct admin_req *r)
{
    uint64_t vram = a->vram_target, host = a->host_budget, reserve = a->compute_reserve;
    int64_t gpu = -1;
    int n = 0, got;
    if ((got = admin_arg_size(r, args, "vram_target", PROTO_MIN_BUDGET, &vram)) < 0)
        return;
    n += got;
    if ((got = admin_arg_size(r, args, "host_budget", PROTO_MIN_BUDGET, &host)) < 0)
        return;
    n += got;
    if ((got = admin_arg_size(r, args, "compute_reserve", 0, &reserve)) < 0)
        return;
    n += got;
    if (admin_arg_int(r, args, "gpu", -1, (int64_t)a->cfg.n_gpus - 1, &gpu) < 0)
        return;
    if (!n) {
        admin_req_fail(r, RKV_EINVAL,
                       "budget_set: give at least one of vram_target, host_budget, "
                       "compute_reserve");
        return;
    }
    r->state = cJSON_CreateObject();
    cJSON_AddItemToObject(r->state, "budget", admin_budget_json(vram, host, reserve));
    cJSON_AddItemToObject(r->state, "before", admin_hist_json(a, -1));
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
    cJSON *after = admin_hist_json(a, -1);
    cJSON_AddItemToObject(res, "summary", cJSON_CreateArray());
    summarize(cJSON_GetObjectItem(res, "before"), after, cJSON_GetObjectItem(res, "summary"));
    cJSON_AddItemToObject(res, "after", after);
    admin_req_finish(r, 0, res, NULL);
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
        admin_req_maybe_destroy(r);
        return;
    }
    char jerr[256];
    if (rc) {
        admin_req_fail(r, rc, "%s: kvmgr did not take it: %s", r->cmd->name,
                       err && err[0] ? err : rkv_strerror(rc));
        return;
    }
    if (reply->hdr.type == PROTO_MSG_MODE) {
        struct proto_mode_msg m;
        if ((rc = proto_json_decode(PROTO_MSG_MODE, reply->payload, reply->len, &m, jerr,
                                    sizeof jerr))) {
            admin_req_fail(r, RKV_EPROTO, "kvmgr's mode answer: %s", jerr);
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
        admin_req_finish(r, 0, o, NULL);
        return;
    }
    if (reply->hdr.type != PROTO_MSG_BUDGET) {
        admin_req_fail(r, RKV_EPROTO, "kvmgr answered %s with %s", r->cmd->name,
                       proto_msg_name(reply->hdr.type));
        return;
    }
    struct proto_budget b;
    if ((rc = proto_json_decode(PROTO_MSG_BUDGET, reply->payload, reply->len, &b, jerr,
                                sizeof jerr))) {
        admin_req_fail(r, RKV_EPROTO, "kvmgr's budget answer: %s", jerr);
        return;
    }
    a->vram_target = b.vram_target_bytes;
    a->host_budget = b.host_budget_bytes;
    a->compute_reserve = b.compute_reserve_bytes;
    a->runtime_budget = 1;
    if (!r->state) { /* a resend to a new kvmgr */
        admin_req_finish(r, 0, NULL, NULL);
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
        admin_budget_json(b.vram_target_bytes, b.host_budget_bytes, b.compute_reserve_bytes));
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

void admin_cmd_mode_get(struct admin *a, const cJSON *args, struct admin_req *r)
{
    struct proto_empty e = {0};
    kv_call(a, r, PROTO_MSG_MODE_GET, &e);
}

void admin_cmd_mode_set(struct admin *a, const cJSON *args, struct admin_req *r)
{
    const cJSON *m = admin_arg(args, "mode");
    int mode = -1;
    for (int i = 0; cJSON_IsString(m) && proto_mode_names[i]; i++)
        if (strcmp(m->valuestring, proto_mode_names[i]) == 0)
            mode = i;
    if (mode < 0) {
        admin_req_fail(r, RKV_EINVAL, "mode_set: mode must be auto, resident, window or cpu_tail");
        return;
    }
    struct proto_mode_msg mm = {mode};
    kv_call(a, r, PROTO_MSG_MODE_SET, &mm);
}

/* --- news from kvmgr ------------------------------------------------------------------ */

static void prune_cb(void *ud, const struct sched_session_info *si)
{
    struct rkv_map *live = ud;
    rkv_map_put(live, si->sid, (void *)1);
}

/* forget the tactics of sessions that are gone */
void admin_tactics_prune(struct admin *a)
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
    /* on the wire a session waiting for its rotation turn is parked; the reason tells */
    ts->rotated = ev->to == PROTO_TACTIC_PARKED && strncmp(ev->reason, "rotation:", 9) == 0;
    ts->gpu = ev->gpu;
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
    struct admin_req *r = admin_req_create(a, VIA_FN);
    if (!r)
        return;
    r->done = resend_done;
    r->cmd = admin_cmd_find("budget_set");
    struct proto_budget b = {a->vram_target, a->host_budget, a->compute_reserve, -1};
    kv_call(a, r, PROTO_MSG_BUDGET_SET, &b);
}
