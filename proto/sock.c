/* sock.c - nng req/rep/pub/sub sockets carrying rkv envelopes, always with timeouts. */
#include "proto/sock.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "common/err.h"
#include "common/log.h"
#include "proto/json.h"
#include "proto/msg.h"

struct proto_sock {
    nng_socket sock;
    enum proto_sock_kind kind;
    atomic_uint_fast64_t next_id;
    int recv_ms;
    int listening, dialing;
    nng_listener lst;
    nng_dialer dlr;
    pthread_mutex_t heal_mu; /* heal runs from any caller's thread */
    atomic_int shut;         /* proto_sock_shutdown ran: calls end, new ones fail */
    uint64_t heal_ms;        /* when it last looked */
    char url[256];
};

int proto_nng_err(int rv)
{
    switch (rv) {
    case 0: return 0;
    case NNG_ETIMEDOUT: return RKV_ETIMEOUT;
    case NNG_ECLOSED:
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
    case NNG_ECONNABORTED:
    case NNG_ECANCELED:
    case NNG_EUNREACHABLE: return RKV_ECLOSED;
    case NNG_ENOMEM: return RKV_ENOMEM;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
    case NNG_EBADTYPE:
    case NNG_ENOARG: return RKV_EINVAL;
    case NNG_EAGAIN: return -EAGAIN;
    case NNG_EINTR: return -EINTR;
    case NNG_EMSGSIZE: return RKV_ETOOBIG;
    case NNG_EADDRINUSE: return -EADDRINUSE;
    case NNG_ENOENT: return RKV_ENOTFOUND;
    case NNG_EPROTO: return RKV_EPROTO;
    case NNG_EBUSY: return RKV_EBUSY;
    case NNG_ESTATE: return RKV_ESTATE;
    case NNG_ENOTSUP: return RKV_EUNSUPPORTED;
    case NNG_EPERM:
    case NNG_EPEERAUTH: return -EACCES;
    case NNG_ENOSPC: return -ENOSPC;
    case NNG_ENOFILES: return -EMFILE;
    case NNG_EEXIST: return -EEXIST;
    default: break;
    }
    if (rv & NNG_ESYSERR)
        return -(rv & ~NNG_ESYSERR);
    return RKV_EIO;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *kind_name(enum proto_sock_kind k)
{
    static const char *const n[] = {"req", "rep", "pub", "sub"};
    return (unsigned)k < 4 ? n[k] : "?";
}

int proto_sock_open(struct proto_sock **out, enum proto_sock_kind kind, const char *url, char *err,
                    size_t errlen)
{
    *out = NULL;
    if ((unsigned)kind > PROTO_SOCK_SUB || !url)
        return proto_seterr(err, errlen, RKV_EINVAL, "proto_sock_open: bad socket kind or url");
    struct proto_sock *s = calloc(1, sizeof *s);
    if (!s)
        return RKV_ENOMEM;
    s->kind = kind;
    s->recv_ms = PROTO_DEFAULT_TIMEOUT_MS;
    atomic_init(&s->next_id, 1);
    pthread_mutex_init(&s->heal_mu, NULL);
    snprintf(s->url, sizeof s->url, "%s", url);
    int rv;
    switch (kind) {
    case PROTO_SOCK_REQ: rv = nng_req0_open(&s->sock); break;
    case PROTO_SOCK_REP: rv = nng_rep0_open(&s->sock); break;
    case PROTO_SOCK_PUB: rv = nng_pub0_open(&s->sock); break;
    default: rv = nng_sub0_open(&s->sock); break;
    }
    if (rv) {
        pthread_mutex_destroy(&s->heal_mu);
        free(s);
        int rc = proto_nng_err(rv);
        return proto_seterr(err, errlen, rc, "%s: cannot open a %s socket: %s", url,
                            kind_name(kind), nng_strerror(rv));
    }
    /* nng refuses messages over 1 MiB by default; ours go up to the payload limit */
    rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD);
    if (!rv)
        rv = nng_socket_set_ms(s->sock, NNG_OPT_SENDTIMEO, PROTO_DEFAULT_TIMEOUT_MS);
    if (!rv && kind != PROTO_SOCK_PUB)
        rv = nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, PROTO_DEFAULT_TIMEOUT_MS);
    /* a resent request could apply a change twice; callers time out instead */
    if (!rv && kind == PROTO_SOCK_REQ)
        rv = nng_socket_set_ms(s->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    const char *verb = "configure";
    if (!rv && (kind == PROTO_SOCK_REP || kind == PROTO_SOCK_PUB)) {
        verb = "listen on";
        rv = nng_listen(s->sock, url, &s->lst, 0);
        s->listening = !rv;
    } else if (!rv) {
        /* in the background, retrying: the listener may come up later */
        verb = "dial";
        rv = nng_dial(s->sock, url, &s->dlr, NNG_FLAG_NONBLOCK);
        s->dialing = !rv;
    }
    if (rv) {
        int rc = proto_nng_err(rv);
        proto_seterr(err, errlen, rc, "%s: cannot %s it (%s socket): %s%s", url, verb,
                     kind_name(kind), nng_strerror(rv),
                     rv == NNG_EADDRINUSE ? "; is another rkv process running?" : "");
        nng_close(s->sock);
        pthread_mutex_destroy(&s->heal_mu);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* only a mark: each call waiting on s cancels its own aio when it next wakes (within 100 ms).
 * nng_close from another thread than the callers' can hang in nng_close for good while a
 * receive is pending on a req socket (nng issues 1543, 1813: seen here as rkvd that did not
 * exit after SIGTERM) */
void proto_sock_shutdown(struct proto_sock *s)
{
    if (s)
        atomic_store(&s->shut, 1);
}

void proto_sock_close(struct proto_sock *s)
{
    if (!s)
        return;
    nng_close(s->sock);
    pthread_mutex_destroy(&s->heal_mu);
    free(s);
}

int proto_sock_set_timeouts(struct proto_sock *s, int send_ms, int recv_ms)
{
    if (send_ms <= 0 || recv_ms <= 0)
        return RKV_EINVAL;
    int rv = nng_socket_set_ms(s->sock, NNG_OPT_SENDTIMEO, send_ms);
    if (!rv && s->kind != PROTO_SOCK_PUB)
        rv = nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, recv_ms);
    if (!rv)
        s->recv_ms = recv_ms;
    return proto_nng_err(rv);
}

/* nng 1.5 gives up for good when a peer hangs up in the middle of the
 * connection handshake (nng issue #1518, fixed in 1.6): the listener stops
 * accepting, the dialer stops redialing, because the core takes the peer's
 * ECLOSED for its own close. Both count that error as "other" in their
 * statistics; a listener with any, or a dialer with any and no connection,
 * is replaced. */
static uint64_t stat_of(nng_stat *ep, const char *name)
{
    nng_stat *st = ep ? nng_stat_find(ep, name) : NULL;
    return st ? nng_stat_value(st) : 0;
}

static int heal_locked(struct proto_sock *s)
{
    nng_stat *root;
    if ((!s->listening && !s->dialing) || nng_stats_get(&root) != 0)
        return 0;
    int stalled;
    if (s->listening) {
        stalled = stat_of(nng_stat_find_listener(root, s->lst), "other") > 0;
    } else {
        nng_stat *d = nng_stat_find_dialer(root, s->dlr);
        stalled = stat_of(d, "other") > 0 && stat_of(d, "pipes") == 0;
    }
    nng_stats_free(root);
    if (!stalled)
        return 0;
    int rv;
    if (s->listening) {
        /* closing the old listener unlinks an ipc path, so it goes first */
        nng_listener_close(s->lst);
        rv = nng_listen(s->sock, s->url, &s->lst, 0);
        s->listening = !rv;
    } else {
        nng_dialer_close(s->dlr);
        rv = nng_dial(s->sock, s->url, &s->dlr, NNG_FLAG_NONBLOCK);
        s->dialing = !rv;
    }
    int listener = s->kind == PROTO_SOCK_REP || s->kind == PROTO_SOCK_PUB;
    if (rv) {
        log_error("%s: cannot %s again: %s", s->url, listener ? "listen" : "dial",
                  nng_strerror(rv));
        return proto_nng_err(rv);
    }
    if (listener)
        log_warn("%s: a peer hung up during the connection handshake, which stops nng 1.5 "
                 "from accepting; listening again",
                 s->url);
    return 1;
}

int proto_sock_heal(struct proto_sock *s)
{
    pthread_mutex_lock(&s->heal_mu);
    uint64_t now = now_ms();
    int rc = 0;
    /* a stats snapshot is not free: look at most every 50 ms */
    if (now - s->heal_ms >= 50) {
        s->heal_ms = now;
        rc = heal_locked(s);
    }
    pthread_mutex_unlock(&s->heal_mu);
    return rc;
}

int proto_sock_recv_fd(struct proto_sock *s, int *fd)
{
    return proto_nng_err(nng_socket_get_int(s->sock, NNG_OPT_RECVFD, fd));
}

int proto_sock_subscribe(struct proto_sock *s, int type)
{
    if (s->kind != PROTO_SOCK_SUB || (type && !proto_msg_known(type)))
        return RKV_EINVAL;
    /* a topic is a prefix of the message: magic, version, type */
    uint8_t topic[8];
    memcpy(topic, PROTO_MAGIC, 4);
    proto_put_u16(topic + 4, PROTO_VERSION);
    proto_put_u16(topic + 6, (uint16_t)type);
    return proto_nng_err(nng_socket_set(s->sock, NNG_OPT_SUB_SUBSCRIBE, topic, type ? 8 : 0));
}

void proto_in_fini(struct proto_in *in)
{
    if (in->nmsg_)
        nng_msg_free(in->nmsg_);
    memset(in, 0, sizeof *in);
}

static int build_msg(int type, uint64_t req_id, const void *payload, size_t len, nng_msg **out)
{
    if (!proto_msg_known(type) || (len && !payload))
        return RKV_EINVAL;
    if (len > PROTO_MAX_PAYLOAD)
        return RKV_ETOOBIG;
    struct proto_hdr h;
    proto_hdr_init(&h, type, req_id, (uint32_t)len);
    uint8_t hdr[PROTO_HDR_SIZE];
    proto_hdr_pack(&h, hdr);
    nng_msg *m;
    int rv = nng_msg_alloc(&m, 0);
    if (!rv)
        rv = nng_msg_append(m, hdr, sizeof hdr);
    if (!rv && len)
        rv = nng_msg_append(m, payload, len);
    if (rv) {
        if (m)
            nng_msg_free(m);
        return proto_nng_err(rv);
    }
    *out = m;
    return 0;
}

int proto_sock_send(struct proto_sock *s, int type, uint64_t req_id, const void *payload,
                    size_t len)
{
    nng_msg *m = NULL;
    int rc = build_msg(type, req_id, payload, len, &m);
    if (rc < 0)
        return rc;
    int rv = nng_sendmsg(s->sock, m, 0);
    if (rv)
        nng_msg_free(m);
    return proto_nng_err(rv);
}

int proto_sock_send_error(struct proto_sock *s, uint64_t req_id, int code, const char *message)
{
    struct proto_error e = {.code = code};
    snprintf(e.message, sizeof e.message, "%s", message ? message : rkv_strerror(code));
    char *json;
    size_t len;
    int rc = proto_json_encode(PROTO_MSG_ERROR, &e, &json, &len, NULL, 0);
    if (rc < 0)
        return rc;
    rc = proto_sock_send(s, PROTO_MSG_ERROR, req_id, json, len);
    free(json);
    return rc;
}

/* *got is set when a message arrived, even one that failed to decode */
static int recv_env(struct proto_sock *s, struct proto_in *in, int flags, int *got, char *err,
                    size_t errlen)
{
    memset(in, 0, sizeof *in);
    *got = 0;
    nng_msg *m;
    int rv = nng_recvmsg(s->sock, &m, (flags & PROTO_NONBLOCK) ? NNG_FLAG_NONBLOCK : 0);
    if (rv) {
        int rc = proto_nng_err(rv);
        return proto_seterr(err, errlen, rc, "%s: receive failed: %s", s->url, rkv_strerror(rc));
    }
    *got = 1;
    in->nmsg_ = m;
    int rc = proto_env_decode(nng_msg_body(m), nng_msg_len(m), &in->hdr, &in->payload, err, errlen);
    in->len = in->payload ? in->hdr.len : 0;
    return rc;
}

int proto_sock_recv(struct proto_sock *s, struct proto_in *in, int flags, char *err, size_t errlen)
{
    int got;
    return recv_env(s, in, flags, &got, err, errlen);
}

/* the peer's code when it is an rkv or errno code, else RKV_EPROTO */
static int peer_code(int64_t code)
{
    return code < 0 && code > -4200 ? (int)code : RKV_EPROTO;
}

/* what a reply says: 0 for a normal reply, else the error it carries */
static int check_reply(struct proto_sock *s, int type, uint64_t id, int rc, const char *derr,
                       const struct proto_in *r, char *err, size_t errlen)
{
    const char *name = proto_msg_name(type);
    struct proto_error e;
    char perr[256];
    if (rc == RKV_EVERSION) {
        /* the header and the ERROR payload are frozen, so the peer's text still reads */
        int said = r->hdr.type == PROTO_MSG_ERROR && r->payload &&
                   proto_json_decode(PROTO_MSG_ERROR, r->payload, r->len, &e, NULL, 0) == 0;
        return proto_seterr(err, errlen, RKV_EVERSION, "%s: %s%s%s%s", s->url, derr,
                            said ? " (peer says: " : "", said ? e.message : "", said ? ")" : "");
    }
    if (rc < 0)
        return proto_seterr(err, errlen, RKV_EPROTO, "%s: malformed reply to %s: %s", s->url, name,
                            derr);
    if (r->hdr.req_id != id)
        return proto_seterr(err, errlen, RKV_EPROTO,
                            "%s: reply to %s carries request id %" PRIu64 ", expected %" PRIu64,
                            s->url, name, r->hdr.req_id, id);
    if (r->hdr.type != PROTO_MSG_ERROR)
        return 0;
    rc = proto_json_decode(PROTO_MSG_ERROR, r->payload, r->len, &e, perr, sizeof perr);
    if (rc < 0)
        return proto_seterr(err, errlen, RKV_EPROTO, "%s: malformed error reply to %s: %s", s->url,
                            name, perr);
    return proto_seterr(err, errlen, peer_code(e.code), "%s", e.message);
}

/* an aio's completion, waited for in slices so the socket can heal meanwhile */
struct wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
};

static void wait_done(void *arg)
{
    struct wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void call_wait(struct proto_sock *s, struct wait *w, nng_aio *aio)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) != 0 && !w->done) {
            /* the aio's own timeout still ends the wait, or a shutdown cancels it */
            pthread_mutex_unlock(&w->mu);
            if (atomic_load(&s->shut))
                nng_aio_cancel(aio); /* its callback runs with NNG_ECANCELED */
            else
                proto_sock_heal(s);
            pthread_mutex_lock(&w->mu);
        }
    }
    w->done = 0;
    pthread_mutex_unlock(&w->mu);
}

int proto_call(struct proto_sock *s, int type, const void *payload, size_t len,
               struct proto_in *reply, int timeout_ms, char *err, size_t errlen)
{
    memset(reply, 0, sizeof *reply);
    if (s->kind != PROTO_SOCK_REQ)
        return proto_seterr(err, errlen, RKV_EINVAL, "%s: proto_call needs a req socket, not %s",
                            s->url, kind_name(s->kind));
    if (timeout_ms <= 0)
        timeout_ms = PROTO_DEFAULT_TIMEOUT_MS;
    const char *name = proto_msg_name(type);
    if (atomic_load(&s->shut))
        return proto_seterr(err, errlen, RKV_ECLOSED, "%s: cannot send %s: the socket is shut down",
                            s->url, name);
    uint64_t id = atomic_fetch_add(&s->next_id, 1);
    nng_msg *m = NULL;
    int rc = build_msg(type, id, payload, len, &m);
    if (rc < 0)
        return proto_seterr(err, errlen, rc, "%s: cannot send %s (%zu bytes): %s", s->url, name,
                            len, rkv_strerror(rc));
    /* a context per call, so threads may share the socket */
    nng_aio *aio = NULL;
    nng_ctx ctx;
    struct wait w = {.done = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    int rv = nng_aio_alloc(&aio, wait_done, &w);
    int have_ctx = 0;
    if (!rv) {
        rv = nng_ctx_open(&ctx, s->sock);
        have_ctx = !rv;
    }
    if (rv) {
        nng_msg_free(m);
        rc = proto_nng_err(rv);
        proto_seterr(err, errlen, rc, "%s: cannot send %s: %s", s->url, name, nng_strerror(rv));
        goto out;
    }
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    nng_aio_set_msg(aio, m);
    nng_aio_set_timeout(aio, timeout_ms);
    nng_ctx_send(ctx, aio);
    call_wait(s, &w, aio);
    rv = nng_aio_result(aio);
    if (rv) {
        nng_msg_free(nng_aio_get_msg(aio));
        rc = proto_nng_err(rv);
        proto_seterr(err, errlen, rc, "%s: sending %s failed: %s%s", s->url, name, rkv_strerror(rc),
                     rc == RKV_ETIMEOUT ? " (is the peer running?)" : "");
        goto out;
    }
    uint64_t now = now_ms();
    nng_aio_set_timeout(aio, now < deadline ? (nng_duration)(deadline - now) : 1);
    nng_ctx_recv(ctx, aio);
    call_wait(s, &w, aio);
    rv = nng_aio_result(aio);
    if (rv) {
        rc = proto_nng_err(rv);
        if (rc == RKV_ETIMEOUT)
            proto_seterr(err, errlen, rc, "%s: no reply to %s within %d ms (is the peer running?)",
                         s->url, name, timeout_ms);
        else
            proto_seterr(err, errlen, rc, "%s: waiting for the reply to %s failed: %s", s->url,
                         name, rkv_strerror(rc));
        goto out;
    }
    nng_msg *rm = nng_aio_get_msg(aio);
    char derr[256] = "";
    reply->nmsg_ = rm;
    rc = proto_env_decode(nng_msg_body(rm), nng_msg_len(rm), &reply->hdr, &reply->payload, derr,
                          sizeof derr);
    reply->len = reply->payload ? reply->hdr.len : 0;
    rc = check_reply(s, type, id, rc, derr, reply, err, errlen);
    if (rc < 0)
        proto_in_fini(reply);
out:
    if (have_ctx)
        nng_ctx_close(ctx);
    nng_aio_free(aio); /* waits for a callback still running */
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

int proto_call_json(struct proto_sock *s, int type, const void *msg, int reply_type,
                    void *reply_msg, int timeout_ms, char *err, size_t errlen)
{
    char *json;
    size_t len;
    int rc = proto_json_encode(type, msg, &json, &len, err, errlen);
    if (rc < 0)
        return rc;
    struct proto_in r;
    rc = proto_call(s, type, json, len, &r, timeout_ms, err, errlen);
    free(json);
    if (rc < 0)
        return rc;
    if (r.hdr.type != reply_type)
        rc = proto_seterr(err, errlen, RKV_EPROTO, "%s: %s was answered with %s, expected %s",
                          s->url, proto_msg_name(type), proto_msg_name(r.hdr.type),
                          proto_msg_name(reply_type));
    else
        rc = proto_json_decode(reply_type, r.payload, r.len, reply_msg, err, errlen);
    proto_in_fini(&r);
    return rc;
}

int proto_put_json(struct proto_wbuf *w, int type, const void *msg, char *err, size_t errlen)
{
    char *json;
    size_t len;
    int rc = proto_json_encode(type, msg, &json, &len, err, errlen);
    if (rc < 0)
        return rc;
    proto_wbuf_put_bytes(w, json, len);
    free(json);
    return proto_wbuf_err(w);
}

int proto_serve_one(struct proto_sock *s, proto_handler_fn fn, void *ctx, int timeout_ms, char *err,
                    size_t errlen)
{
    if (s->kind != PROTO_SOCK_REP)
        return proto_seterr(err, errlen, RKV_EINVAL, "%s: proto_serve_one needs a rep socket",
                            s->url);
    struct proto_in in;
    int got;
    int rc;
    char derr[256];
    if (timeout_ms > 0) {
        nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, timeout_ms);
        rc = recv_env(s, &in, 0, &got, derr, sizeof derr);
        nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, s->recv_ms);
    } else {
        rc = recv_env(s, &in, PROTO_NONBLOCK, &got, derr, sizeof derr);
    }
    if (rc < 0)
        proto_seterr(err, errlen, rc, "%s", derr);
    if (rc == RKV_ETIMEOUT)
        proto_sock_heal(s);
    if (!got)
        return rc;
    if (rc < 0) {
        /* garbage or another version: say so to the peer too */
        proto_sock_send_error(s, in.hdr.req_id, rc, derr);
        proto_in_fini(&in);
        return rc;
    }
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    int reply_type = PROTO_MSG_OK;
    char herr[512] = "";
    int hrc = fn(ctx, &in, &w, &reply_type, herr, sizeof herr);
    if (hrc >= 0 && proto_wbuf_err(&w) < 0) {
        hrc = proto_wbuf_err(&w);
        snprintf(herr, sizeof herr, "%s: reply too large or out of memory",
                 proto_msg_name(in.hdr.type));
    }
    if (hrc < 0) {
        rc = proto_sock_send_error(s, in.hdr.req_id, hrc, herr[0] ? herr : rkv_strerror(hrc));
        proto_seterr(err, errlen, 0, "%s", herr[0] ? herr : rkv_strerror(hrc));
    } else {
        rc = proto_sock_send(s, reply_type, in.hdr.req_id, w.data, w.len);
    }
    if (rc < 0)
        proto_seterr(err, errlen, rc, "%s: cannot send the reply to %s: %s", s->url,
                     proto_msg_name(in.hdr.type), rkv_strerror(rc));
    proto_wbuf_fini(&w);
    proto_in_fini(&in);
    return rc;
}
