/* admin_sock.c - the admin API on its unix socket (nng rep): rkvctl's requests and answers. */
#include "daemon/admin_int.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "proto/json.h"
#include "proto/sock.h"

static void poll_cb(uv_poll_t *p, int status, int events);

void admin_sock_answer(struct admin_req *r, int rc, cJSON *result, const char *msg)
{
    struct admin *a = r->a;
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
        src = text ? proto_sock_send(a->sock, PROTO_MSG_ADMIN_RESP, r->req_id, text, strlen(text))
                   : RKV_ENOMEM;
        free(text);
    }
    if (src < 0)
        log_warn("admin socket: cannot answer %s: %s (rkvctl gave up waiting?)",
                 r->cmd ? r->cmd->name : "a request", rkv_strerror(src));
    a->sock_busy = 0;
    admin_sock_pump(a);
    cJSON_Delete(result);
}

void admin_sock_pump(struct admin *a)
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
            proto_in_fini(&in);
            continue;
        }
        a->sock_busy = 1;
        struct admin_req *r = admin_req_create(a, VIA_SOCK);
        if (!r) {
            proto_sock_send_error(a->sock, in.hdr.req_id, RKV_ENOMEM, "out of memory");
            a->sock_busy = 0;
            proto_in_fini(&in);
            continue;
        }
        r->req_id = in.hdr.req_id;
        if (in.hdr.type != PROTO_MSG_ADMIN_REQ) {
            proto_in_fini(&in);
            admin_req_fail(r, RKV_EPROTO, "the admin socket serves admin_req messages, not %s",
                           proto_msg_name(in.hdr.type));
            continue;
        }
        cJSON *body = cJSON_ParseWithLength(in.payload, in.len);
        proto_in_fini(&in);
        const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(body, "cmd");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(body, "args");
        char dup[160];
        if (!cJSON_IsObject(body) || !cJSON_IsString(cmd))
            admin_req_fail(r, RKV_EFORMAT, "an admin request is {\"cmd\": NAME, \"args\": {...}}");
        else if (proto_json_dup_key(body, dup, sizeof dup))
            admin_req_fail(r, RKV_EFORMAT, "the key \"%s\" appears twice: send each key once", dup);
        else
            admin_run(a, r, cmd->valuestring, args, 1);
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
    admin_sock_pump(p->data);
}

int admin_sock_open(struct admin *a, char *err, size_t errlen)
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
