/* ipc.c - the ipc suite: one nng request/reply round trip between two processes over ipc://,
 * empty and at the sizes of a KV_PREP and its KV_TABLES (batch 1 and 64). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/rkv-bench/bench.h"
#include "common/err.h"
#include "proto/kvwire.h"
#include "proto/sock.h"

/*
 * This is the hop a block table pays for each process it passes through: rkvd's driver
 * sends KV_PREP to kvmgr and waits for KV_TABLES, then puts the tables into the worker's
 * STEP_REQ. A child process plays kvmgr: it waits for its socket's receive fd to poll
 * readable (kvmgr's uv_poll), decodes the request and sends the case's prepared reply; the
 * parent plays rkvd's driver and decodes the reply. The child is forked before either
 * process opens a socket (nng's threads do not survive a fork). The cases take turns for
 * at least min_s after a warm-up; each reports the median and the 99th percentile of
 * single round trips.
 */

#define BLOCKS_PER_SEQ 16     /* a 4096-token context in blocks of 256 */
#define MAX_CALLS      500000 /* timed round trips kept per case */

struct ipc_case {
    const char *name;
    uint32_t n_seqs;                /* 0: empty request and reply */
    struct proto_wbuf prep, tables; /* the encoded KV_PREP and KV_TABLES */
    double *t_us;                   /* (n,) round trip times */
    size_t n;
    double p50_us, p99_us, mean_us;
};

struct ipc_server {
    struct ipc_case *cases;
    size_t n_cases;
};

static int serve_prep(void *ctx, const struct proto_in *req, struct proto_wbuf *reply,
                      int *reply_type, char *err, size_t errlen)
{
    const struct ipc_server *s = ctx;
    if (req->hdr.type != PROTO_MSG_KV_PREP) {
        *reply_type = PROTO_MSG_OK;
        proto_wbuf_put_bytes(reply, "{}", 2);
        return 0;
    }
    struct proto_kv_prep *m;
    int rc = proto_kv_prep_decode(req->payload, req->len, &m, err, errlen);
    if (rc)
        return rc;
    uint32_t n = m->n_seqs;
    proto_kv_prep_destroy(m);
    const struct proto_wbuf *tables = NULL;
    for (size_t i = 0; i < s->n_cases; i++)
        if (s->cases[i].n_seqs == n)
            tables = &s->cases[i].tables;
    if (!tables)
        return proto_seterr(err, errlen, RKV_EINVAL, "no case of %u sequences", n);
    *reply_type = PROTO_MSG_KV_TABLES;
    proto_wbuf_put_bytes(reply, tables->data, tables->len);
    return 0;
}

/* the child: answers until the parent closes its end of the pipe */
static int serve(struct ipc_server *s, const char *url, int stop_fd)
{
    char err[256] = "";
    struct proto_sock *sock = NULL;
    int fd, rc = proto_sock_open(&sock, PROTO_SOCK_REP, url, err, sizeof err);
    if (rc == 0)
        rc = proto_sock_recv_fd(sock, &fd);
    while (rc == 0) {
        struct pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            rc = -errno;
        if (rc || p[1].revents)
            break;
        while ((rc = proto_serve_one(sock, serve_prep, s, 0, err, sizeof err)) == 0)
            ;
        if (rc == -EAGAIN)
            rc = 0;
    }
    if (rc)
        fprintf(stderr, "rkv-bench: ipc server: %s%s%s\n", err, *err ? ": " : "",
                rkv_strerror(rc));
    proto_sock_close(sock);
    return rc;
}

/* a decode step's KV_PREP (one token a sequence) and the KV_TABLES answering it */
static int encode_case(uint32_t n, struct proto_wbuf *prep, struct proto_wbuf *tables)
{
    static const int32_t token = 42;
    struct proto_kv_prep_seq *ps = calloc(n, sizeof *ps);
    struct proto_kv_table *ts = calloc(n, sizeof *ts);
    struct proto_block_ref *blocks = calloc(BLOCKS_PER_SEQ, sizeof *blocks);
    int rc = ps && ts && blocks ? 0 : RKV_ENOMEM;
    for (uint32_t i = 0; !rc && i < BLOCKS_PER_SEQ; i++)
        blocks[i] = (struct proto_block_ref){i * 64 + 1, PROTO_RES_DEVICE};
    for (uint32_t i = 0; !rc && i < n; i++) {
        uint32_t pos = BLOCKS_PER_SEQ * 256 - 1;
        ps[i] = (struct proto_kv_prep_seq){i + 1, pos, PROTO_KV_ACTIVE, pos - 1, 0, 1, &token};
        ts[i] = (struct proto_kv_table){i + 1, 0, 0, 0, BLOCKS_PER_SEQ, blocks};
    }
    char err[256] = "";
    if (!rc) {
        struct proto_kv_prep p = {0, 1, 0, NULL, 0, NULL, n, ps};
        struct proto_kv_tables t = {2, 1, n, ts};
        rc = proto_kv_prep_encode(&p, prep, err, sizeof err);
        if (!rc)
            rc = proto_kv_tables_encode(&t, tables, err, sizeof err);
        if (rc)
            fprintf(stderr, "rkv-bench: ipc: encoding batch %u: %s\n", n, err);
    }
    free(ps);
    free(ts);
    free(blocks);
    return rc;
}

/* calls round trips of case c; keeps their times in c->t_us */
static int run_calls(struct proto_sock *req, struct ipc_case *c, size_t calls, int keep)
{
    int type = c->n_seqs ? PROTO_MSG_KV_PREP : PROTO_MSG_STATUS_GET;
    const void *payload = c->n_seqs ? (const void *)c->prep.data : "{}";
    size_t len = c->n_seqs ? c->prep.len : 2;
    int rc = 0;
    for (size_t i = 0; !rc && i < calls; i++) {
        char err[256];
        struct proto_in reply;
        double t0 = bench_now_s();
        rc = proto_call(req, type, payload, len, &reply, 2000, err, sizeof err);
        if (rc) {
            fprintf(stderr, "rkv-bench: ipc: %s: %s\n", c->name, err);
            break;
        }
        if (c->n_seqs) {
            struct proto_kv_tables *m;
            rc = proto_kv_tables_decode(reply.payload, reply.len, &m, err, sizeof err);
            proto_kv_tables_destroy(m);
        }
        proto_in_fini(&reply);
        if (keep && c->n < MAX_CALLS)
            c->t_us[c->n++] = (bench_now_s() - t0) * 1e6;
    }
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_cases(struct ipc_case *cases, size_t n_cases, cJSON *out)
{
    printf("nng req/rep round trip over ipc:// between two processes (the server polls its fd "
           "as kvmgr does)\n");
    printf("  %-14s %10s %10s %10s %10s %10s\n", "case", "req B", "reply B", "p50 us", "p99 us",
           "mean us");
    cJSON *rows = cJSON_AddArrayToObject(out, "rows");
    for (size_t i = 0; i < n_cases; i++) {
        struct ipc_case *c = &cases[i];
        qsort(c->t_us, c->n, sizeof *c->t_us, cmp_double);
        double sum = 0;
        for (size_t k = 0; k < c->n; k++)
            sum += c->t_us[k];
        c->p50_us = c->t_us[c->n / 2];
        c->p99_us = c->t_us[c->n * 99 / 100];
        c->mean_us = sum / (double)c->n;
        size_t req_b = PROTO_HDR_SIZE + (c->n_seqs ? c->prep.len : 2);
        size_t reply_b = PROTO_HDR_SIZE + (c->n_seqs ? c->tables.len : 2);
        printf("  %-14s %10zu %10zu %10.1f %10.1f %10.1f\n", c->name, req_b, reply_b, c->p50_us,
               c->p99_us, c->mean_us);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "case", c->name);
        cJSON_AddNumberToObject(r, "seqs", c->n_seqs);
        cJSON_AddNumberToObject(r, "request_bytes", (double)req_b);
        cJSON_AddNumberToObject(r, "reply_bytes", (double)reply_b);
        cJSON_AddNumberToObject(r, "round_trips", (double)c->n);
        cJSON_AddNumberToObject(r, "p50_us", c->p50_us);
        cJSON_AddNumberToObject(r, "p99_us", c->p99_us);
        cJSON_AddNumberToObject(r, "mean_us", c->mean_us);
        cJSON_AddItemToArray(rows, r);
    }
}

/* the parent: the cases in turn, 200 calls each, so a busy machine slows them alike; round 0
 * warms up */
static int measure(struct ipc_case *cases, size_t n_cases, const char *url, double min_s)
{
    char err[256] = "";
    struct proto_sock *req;
    int rc = proto_sock_open(&req, PROTO_SOCK_REQ, url, err, sizeof err);
    if (rc) {
        fprintf(stderr, "rkv-bench: ipc: %s\n", err);
        return rc;
    }
    double start = bench_now_s();
    for (int round = 0; !rc && (round < 4 || bench_now_s() - start < min_s); round++)
        for (size_t i = 0; !rc && i < n_cases; i++)
            rc = run_calls(req, &cases[i], 200, round > 0);
    proto_sock_close(req);
    return rc;
}

int bench_ipc(const struct bench_opts *o, cJSON *out)
{
    struct ipc_case cases[] = {{"empty", 0}, {"kv_prep b=1", 1}, {"kv_prep b=64", 64}};
    const size_t n_cases = sizeof cases / sizeof cases[0];
    char url[256];
    const char *tmp = getenv("TMPDIR");
    snprintf(url, sizeof url, "ipc://%s/rkv-bench-ipc-%d.sock", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    int rc = 0;
    for (size_t i = 0; i < n_cases; i++) {
        proto_wbuf_init(&cases[i].prep);
        proto_wbuf_init(&cases[i].tables);
        cases[i].t_us = malloc(MAX_CALLS * sizeof *cases[i].t_us);
        if (!cases[i].t_us)
            rc = RKV_ENOMEM;
        if (!rc && cases[i].n_seqs)
            rc = encode_case(cases[i].n_seqs, &cases[i].prep, &cases[i].tables);
    }
    int stop[2] = {-1, -1};
    pid_t child = -1;
    if (!rc && pipe(stop) < 0)
        rc = -errno;
    if (!rc) {
        fflush(NULL);
        child = fork();
        if (child < 0)
            rc = -errno;
    }
    if (child == 0) {
        close(stop[1]);
        struct ipc_server s = {cases, n_cases};
        _exit(serve(&s, url, stop[0]) ? 1 : 0);
    }
    if (!rc)
        rc = measure(cases, n_cases, url, o->quick ? 0.05 : 3.0);
    if (stop[1] >= 0)
        close(stop[1]);
    if (stop[0] >= 0)
        close(stop[0]);
    int status = 0;
    if (child > 0 && waitpid(child, &status, 0) == child && !rc &&
        (!WIFEXITED(status) || WEXITSTATUS(status)))
        rc = RKV_EIO;
    if (rc)
        fprintf(stderr, "rkv-bench: ipc: %s\n", rkv_strerror(rc));
    else
        print_cases(cases, n_cases, out);
    for (size_t i = 0; i < n_cases; i++) {
        proto_wbuf_fini(&cases[i].prep);
        proto_wbuf_fini(&cases[i].tables);
        free(cases[i].t_us);
    }
    return rc;
}
