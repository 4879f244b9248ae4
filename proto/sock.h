/* sock.h - nng sockets carrying rkv envelopes: req/rep calls with timeouts, pub/sub, loop fds. */
#ifndef RKV_PROTO_SOCK_H
#define RKV_PROTO_SOCK_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"
#include "proto/wire.h"

/*
 * Every wait here is bounded: a peer that sends garbage gets an ERROR reply
 * and the caller an error; a peer that is gone or silent gives RKV_ETIMEOUT
 * (or RKV_ECLOSED), never a hang. nng's positive error codes never escape:
 * they become RKV_E* / -errno (proto_nng_err).
 *
 * Server shape (libuv): poll proto_sock_recv_fd() with uv_poll_t; when it is
 * readable call proto_serve_one(s, fn, ctx, 0, ...) until it returns
 * -EAGAIN. A plain thread may call it with a timeout instead.
 */

#define PROTO_DEFAULT_TIMEOUT_MS 5000

enum proto_sock_kind {
    PROTO_SOCK_REQ, /* dials url; proto_call, safe from several threads */
    PROTO_SOCK_REP, /* listens on url; proto_serve_one / proto_sock_recv + proto_sock_send */
    PROTO_SOCK_PUB, /* listens on url; proto_sock_send */
    PROTO_SOCK_SUB, /* dials url; proto_sock_subscribe, then proto_sock_recv */
};

struct proto_sock;

/* url: "ipc:///run/rkv/kvmgr.sock" (or any nng url). dialers connect in the
 * background and keep retrying, so the listener may start later. send and
 * receive timeouts start at PROTO_DEFAULT_TIMEOUT_MS. errors name the url. */
int proto_sock_open(struct proto_sock **out, enum proto_sock_kind kind, const char *url, char *err,
                    size_t errlen);
/* NULL is fine */
void proto_sock_close(struct proto_sock *s);
/* from any thread: proto_call's waiting on s end within 100 ms with RKV_ECLOSED (each caller
 * cancels its own wait; nng_close stays with proto_sock_close), and later ones fail at once;
 * s stays valid until proto_sock_close. NULL is fine */
void proto_sock_shutdown(struct proto_sock *s);
/* ms > 0; for proto_sock_send/recv and proto_serve_one's blocking waits */
int proto_sock_set_timeouts(struct proto_sock *s, int send_ms, int recv_ms);
/* an fd that polls readable when a message can be received (NNG_OPT_RECVFD);
 * do not read or close it */
int proto_sock_recv_fd(struct proto_sock *s, int *fd);
/* rep/pub only: listens again when nng stopped accepting because a peer hung
 * up mid-handshake (a bug of nng 1.5, see sock.c); 1 when it did, 0 when all
 * was well. cheap: call it from the process's periodic timer. existing
 * peers reconnect by themselves. proto_serve_one calls it after a timeout. */
int proto_sock_heal(struct proto_sock *s);
/* sub only: receive messages of this type (0 = every type); call once per type */
int proto_sock_subscribe(struct proto_sock *s, int type);

/* a received envelope; payload points into it until proto_in_fini */
struct proto_in {
    struct proto_hdr hdr;
    const void *payload;
    size_t len;
    void *nmsg_; /* the nng message holding it */
};
void proto_in_fini(struct proto_in *in);

#define PROTO_NONBLOCK 1 /* proto_sock_recv: -EAGAIN when nothing is queued */

/* one envelope; the type decides the JSON flag. rep: the reply to the last
 * request received (echo its req_id). pub: to every subscriber. */
int proto_sock_send(struct proto_sock *s, int type, uint64_t req_id, const void *payload,
                    size_t len);
/* an ERROR envelope {code, message} */
int proto_sock_send_error(struct proto_sock *s, uint64_t req_id, int code, const char *message);
/* receives and checks one envelope (proto_env_decode). on a bad envelope it
 * returns that error with text in err and in->hdr as far as it was read. */
int proto_sock_recv(struct proto_sock *s, struct proto_in *in, int flags, char *err, size_t errlen);

/* sends a request and waits up to timeout_ms (<= 0: PROTO_DEFAULT_TIMEOUT_MS)
 * for the reply. returns 0 with *reply filled (free with proto_in_fini), or:
 *   an ERROR reply     -> its code (an RKV_E* / -errno, else RKV_EPROTO),
 *                         the peer's message in err
 *   other version      -> RKV_EVERSION, text naming both versions in err
 *   malformed reply    -> RKV_EPROTO
 *   no reply in time   -> RKV_ETIMEOUT
 *   connection dropped -> RKV_ECLOSED: the peer may or may not have handled
 *                         the request; retry only what is idempotent */
int proto_call(struct proto_sock *s, int type, const void *payload, size_t len,
               struct proto_in *reply, int timeout_ms, char *err, size_t errlen);
/* proto_call for control messages: encodes msg, expects a reply of
 * reply_type (RKV_EPROTO otherwise) and decodes it into reply_msg */
int proto_call_json(struct proto_sock *s, int type, const void *msg, int reply_type,
                    void *reply_msg, int timeout_ms, char *err, size_t errlen);

/* answers one request. fn writes the reply payload into reply (use
 * proto_put_json for JSON) and sets *reply_type; when fn returns < 0 the
 * reply is an ERROR with that code and fn's text in err. */
typedef int (*proto_handler_fn)(void *ctx, const struct proto_in *req, struct proto_wbuf *reply,
                                int *reply_type, char *err, size_t errlen);
/* receives one request (timeout_ms 0: only what is queued now, else waits up
 * to timeout_ms) and answers it. 0 when a valid request was answered (even
 * with an ERROR from fn); -EAGAIN / RKV_ETIMEOUT when none came; a decode
 * error (RKV_EFORMAT, RKV_EVERSION, ...) when the request was garbage; it was
 * answered with an ERROR carrying the same text, which is in err. */
int proto_serve_one(struct proto_sock *s, proto_handler_fn fn, void *ctx, int timeout_ms, char *err,
                    size_t errlen);

/* appends the JSON encoding of a control message to w */
int proto_put_json(struct proto_wbuf *w, int type, const void *msg, char *err, size_t errlen);

/* nng's positive error code -> RKV_E* / -errno (0 stays 0) */
int proto_nng_err(int nng_rv);

#endif
