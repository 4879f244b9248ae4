/* admin_http.c - the admin API over HTTP: GET / (the status page) and /admin/v1/<cmd>. */
#include "daemon/admin_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "daemon/http/server.h"
#include "proto/json.h"

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

/* status 0: the one of rc */
static void http_send_error_as(struct http_req *req, int status, int rc, const char *msg)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddBoolToObject(b, "ok", 0);
    cJSON *e = cJSON_AddObjectToObject(b, "error");
    cJSON_AddNumberToObject(e, "code", rc);
    cJSON_AddStringToObject(e, "name", rkv_strerror(rc));
    cJSON_AddStringToObject(e, "message", msg);
    http_send_json(req, status ? status : http_status_of(rc), b);
    cJSON_Delete(b);
}

static void http_send_error(struct http_req *req, int rc, const char *msg)
{
    http_send_error_as(req, 0, rc, msg);
}

void admin_http_answer(struct admin_req *r, int rc, cJSON *result, const char *msg)
{
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
    cJSON_Delete(result);
}

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

/* peer is "ADDRESS:PORT" (http_req_peer): the whole address is looked at, not a prefix of
 * it ("::1:0:0:1" is not loopback) */
static int loopback(const char *peer)
{
    const char *colon = peer ? strrchr(peer, ':') : NULL;
    if (!colon)
        return 0;
    char host[64];
    size_t n = (size_t)(colon - peer);
    if (n >= sizeof host)
        return 0;
    memcpy(host, peer, n);
    host[n] = '\0';
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "[::1]") ||
           !strncmp(host, "::ffff:127.", 11);
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
        http_send_error_as(req, 405, RKV_EINVAL, "use GET (read-only commands) or POST");
        return 1;
    }
    if (changes == 1 && get) {
        http_resp_header(req, "Allow", "POST");
        http_send_error_as(req, 405, RKV_EINVAL,
                           "this command changes rkvd: use POST with an admin key");
        return 1;
    }
    /* who is asking */
    struct store_key key = {0};
    const char *b = http_req_bearer(req);
    int has_key = b && admin_key_verify(a, b, &key) == 0;
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
    struct admin_req *r = admin_req_create(a, VIA_HTTP);
    if (!r) {
        cJSON_Delete(args);
        http_send_error(req, RKV_ENOMEM, "out of memory");
        return 1;
    }
    r->http = req;
    r->viewer = has_key && !is_admin ? key.id : 0;
    admin_run(a, r, name, args, is_admin);
    cJSON_Delete(args);
    return 1;
}
