/* wire_test.c - binary hot-path messages: round trips, every truncation, limits, random bytes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/proto.h"
#include "proto/wire.h"

static void test_buffers(void **state)
{
    (void)state;
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    proto_wbuf_put_u8(&w, 0xab);
    proto_wbuf_put_u16(&w, 0x1234);
    proto_wbuf_put_u32(&w, 0xdeadbeef);
    proto_wbuf_put_u64(&w, 0x0102030405060708ull);
    proto_wbuf_put_i32(&w, -2);
    proto_wbuf_put_f32(&w, -1.5f);
    proto_wbuf_put_bytes(&w, "xyz", 3);
    assert_int_equal(proto_wbuf_err(&w), 0);
    static const uint8_t want[] = {0xab, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde, 8,    7,
                                   6,    5,    4,    3,    2,    1,    0xfe, 0xff, 0xff,
                                   0xff, 0,    0,    0xc0, 0xbf, 'x',  'y',  'z'};
    assert_int_equal(w.len, sizeof want);
    assert_memory_equal(w.data, want, sizeof want);

    struct proto_rbuf r;
    proto_rbuf_init(&r, w.data, w.len);
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    int32_t i32;
    float f;
    char b[3];
    assert_int_equal(proto_rbuf_get_u8(&r, &u8), 0);
    assert_int_equal(proto_rbuf_get_u16(&r, &u16), 0);
    assert_int_equal(proto_rbuf_get_u32(&r, &u32), 0);
    assert_int_equal(proto_rbuf_get_u64(&r, &u64), 0);
    assert_int_equal(proto_rbuf_get_i32(&r, &i32), 0);
    assert_int_equal(proto_rbuf_get_f32(&r, &f), 0);
    assert_int_equal(u8, 0xab);
    assert_int_equal(u16, 0x1234);
    assert_int_equal(u32, 0xdeadbeef);
    assert_true(u64 == 0x0102030405060708ull);
    assert_int_equal(i32, -2);
    assert_true(f == -1.5f);
    assert_int_equal(proto_rbuf_left(&r), 3);
    /* overruns read nothing and leave the position alone */
    assert_int_equal(proto_rbuf_get_u32(&r, &u32), RKV_EFORMAT);
    assert_int_equal(proto_rbuf_get_u64(&r, &u64), RKV_EFORMAT);
    assert_int_equal(proto_rbuf_get_bytes(&r, b, 4), RKV_EFORMAT);
    assert_int_equal(proto_rbuf_left(&r), 3);
    assert_int_equal(proto_rbuf_get_bytes(&r, b, 3), 0);
    assert_memory_equal(b, "xyz", 3);
    assert_int_equal(proto_rbuf_get_u8(&r, &u8), RKV_EFORMAT);
    assert_int_equal(proto_rbuf_get_u16(&r, &u16), RKV_EFORMAT);

    /* the limit is sticky and nothing is read from the source */
    proto_wbuf_reset(&w);
    proto_wbuf_put_bytes(&w, (const void *)1, (size_t)PROTO_MAX_PAYLOAD + 1);
    assert_int_equal(proto_wbuf_err(&w), RKV_ETOOBIG);
    proto_wbuf_put_u8(&w, 1);
    assert_int_equal(w.len, 0);
    proto_wbuf_fini(&w);
    proto_wbuf_fini(&w);
}

/* a step with 3 sequences; seq 1 has no tokens and no blocks */
static int32_t g_tok0[] = {1, -7, 128000, 2147483647};
static int32_t g_tok2[] = {42};
static struct proto_block_ref g_blk0[] = {
    {0, PROTO_RES_DEVICE}, {5, PROTO_RES_HOST}, {4294967295u, PROTO_RES_BOTH}};
static struct proto_block_ref g_blk2[] = {{9, PROTO_RES_HOST}};
static struct proto_step_seq g_seqs[3];
static struct proto_step_req g_req;

static int32_t g_hist0[2] = {-7, 65535};
static struct proto_bias g_bias0[2] = {{0, -100.0f}, {128000, 7.5f}};

static void make_req(void)
{
    memset(g_seqs, 0, sizeof g_seqs);
    g_seqs[0] = (struct proto_step_seq){
        .session_id = 0xfedcba9876543210ull,
        .n_past = 1000,
        .n_tokens = 4,
        .tokens = g_tok0,
        .n_blocks = 3,
        .blocks = g_blk0,
        .sampling = {0.7f, 0.9f, 0.05f, 0.1f, 0.2f, 1.1f, 40, 12345678901ull, 1, 5, 2, g_bias0, 12,
                     "root ::= \"{\""},
        .flags = PROTO_STEP_SAMPLE | PROTO_STEP_RESET,
        .n_history = 2,
        .history = g_hist0,
        .n_drawn = 77,
    };
    g_seqs[1] = (struct proto_step_seq){.session_id = 2, .sampling = {.temperature = 0}};
    g_seqs[2] = (struct proto_step_seq){
        .session_id = 3,
        .n_past = 0,
        .n_tokens = 1,
        .tokens = g_tok2,
        .n_blocks = 1,
        .blocks = g_blk2,
        .sampling = {1.0f, 1.0f, 0.0f, -2.0f, 2.0f, 1.0f, -1, UINT64_MAX, 0, 20},
    };
    static uint64_t closes[2] = {5, 1ull << 63};
    g_req = (struct proto_step_req){
        .epoch = 77, .n_seqs = 3, .seqs = g_seqs, .n_close = 2, .close = closes, .n_steps = 4};
}

static void assert_seq_equal(const struct proto_step_seq *a, const struct proto_step_seq *b)
{
    assert_true(a->session_id == b->session_id);
    assert_int_equal(a->n_past, b->n_past);
    assert_int_equal(a->n_tokens, b->n_tokens);
    if (a->n_tokens)
        assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t));
    assert_int_equal(a->n_blocks, b->n_blocks);
    for (uint32_t i = 0; i < a->n_blocks; i++) {
        assert_int_equal(a->blocks[i].index, b->blocks[i].index);
        assert_int_equal(a->blocks[i].residency, b->blocks[i].residency);
    }
    const struct proto_sampling *x = &a->sampling, *y = &b->sampling;
    assert_true(x->temperature == y->temperature && x->top_p == y->top_p && x->min_p == y->min_p &&
                x->presence_penalty == y->presence_penalty &&
                x->frequency_penalty == y->frequency_penalty &&
                x->repetition_penalty == y->repetition_penalty);
    assert_int_equal(x->top_k, y->top_k);
    assert_true(x->seed == y->seed);
    assert_int_equal(x->want_logits, y->want_logits);
    assert_int_equal(x->n_top_logprobs, y->n_top_logprobs);
    assert_int_equal(x->n_bias, y->n_bias);
    for (uint32_t i = 0; i < x->n_bias; i++) {
        assert_int_equal(x->bias[i].id, y->bias[i].id);
        assert_true(x->bias[i].bias == y->bias[i].bias);
    }
    assert_int_equal(x->grammar_len, y->grammar_len);
    if (x->grammar_len) {
        assert_memory_equal(x->grammar, y->grammar, x->grammar_len);
        assert_int_equal(x->grammar[x->grammar_len], 0); /* the decoder terminates it */
    } else {
        assert_null(x->grammar);
    }
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->n_history, b->n_history);
    assert_int_equal(a->n_drawn, b->n_drawn);
    if (a->n_history)
        assert_memory_equal(a->history, b->history, a->n_history * sizeof(int32_t));
}

/* every prefix of a valid encoding, from an exact-size heap copy, is refused */
typedef int (*decode_fn)(const void *buf, size_t len, void **out, char *err, size_t errlen);

static int dec_req(const void *b, size_t n, void **out, char *e, size_t el)
{
    return proto_step_req_decode(b, n, (struct proto_step_req **)out, e, el);
}
static int dec_resp(const void *b, size_t n, void **out, char *e, size_t el)
{
    return proto_step_resp_decode(b, n, (struct proto_step_resp **)out, e, el);
}

static void check_prefixes(decode_fn fn, const uint8_t *buf, size_t len)
{
    char err[256];
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        void *out = (void *)1;
        err[0] = 0;
        assert_int_equal(fn(copy, n, &out, err, sizeof err), RKV_EFORMAT);
        assert_null(out);
        assert_true(strlen(err) > 0);
        free(copy);
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    void *out;
    assert_int_equal(fn(longer, len + 1, &out, err, sizeof err), RKV_EFORMAT);
    assert_true(strstr(err, "1 stray bytes after the message") != NULL);
    free(longer);
}

static void test_step_req(void **state)
{
    (void)state;
    make_req();
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    char err[256];
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), 0);
    /* 12 + (20 + 16 + 15 + 44 + 16 + 12 + 9 + 8) + (20 + 44 + 9) + (20 + 4 + 5 + 44 + 9)
     * + 4 + 16 + 1 */
    assert_int_equal(w.len, 12 + 140 + 73 + 82 + 20 + 1);
    struct proto_step_req *m;
    assert_int_equal(proto_step_req_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_true(m->epoch == 77);
    assert_int_equal(m->n_seqs, 3);
    for (int i = 0; i < 3; i++)
        assert_seq_equal(&m->seqs[i], &g_seqs[i]);
    assert_int_equal(m->n_close, 2);
    assert_true(m->close[0] == 5 && m->close[1] == 1ull << 63);
    assert_int_equal(m->n_steps, 4);
    assert_null(m->seqs[1].tokens);
    assert_null(m->seqs[1].blocks);
    assert_null(m->seqs[1].history);
    assert_null(m->seqs[1].sampling.bias);
    proto_step_req_destroy(m);
    check_prefixes(dec_req, w.data, w.len);

    /* an empty step */
    struct proto_step_req empty = {.epoch = 1};
    proto_wbuf_reset(&w);
    assert_int_equal(proto_step_req_encode(&empty, &w, err, sizeof err), 0);
    assert_int_equal(proto_step_req_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_int_equal(m->n_seqs, 0);
    assert_int_equal(m->n_steps, 1); /* 0 goes on the wire as one step */
    proto_step_req_destroy(m);
    proto_step_req_destroy(NULL);
    proto_wbuf_fini(&w);
}

static void test_step_req_limits(void **state)
{
    (void)state;
    make_req();
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    char err[256];
    struct proto_step_req *m = NULL;

    /* the encoder refuses what a decoder would */
    g_seqs[2].blocks[0].residency = 3;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 2: block 0 has residency 3 (0 device, 1 host, 2 both)");
    g_seqs[2].blocks[0].residency = PROTO_RES_HOST;
    g_seqs[0].sampling.temperature = NAN;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 0: temperature is not a finite number");
    g_seqs[0].sampling.temperature = 1;
    g_seqs[0].sampling.n_top_logprobs = 21;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    g_seqs[0].sampling.n_top_logprobs = 0;
    g_seqs[0].sampling.n_bias = PROTO_MAX_LOGIT_BIAS + 1;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 0: n_bias is 301, the limit is 300");
    g_seqs[0].sampling.n_bias = 2;
    g_seqs[0].sampling.grammar_len = PROTO_MAX_GRAMMAR + 1;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 0: grammar_len is 1048577, the limit is 1048576");
    g_seqs[0].sampling.grammar_len = 12;
    g_bias0[1].bias = INFINITY;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 0: bias 1 is not a finite number");
    g_bias0[1].bias = 7.5f;
    g_bias0[0].id = -1;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 0: bias 0 has token id -1");
    g_bias0[0].id = 0;
    g_seqs[1].n_tokens = PROTO_MAX_STEP_TOKENS + 1;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: seq 1: n_tokens is 65537, the limit is 65536");
    g_seqs[1].n_tokens = 0;
    struct proto_step_req many = {.n_seqs = PROTO_MAX_SEQS + 1, .seqs = g_seqs};
    assert_int_equal(proto_step_req_encode(&many, &w, err, sizeof err), RKV_EINVAL);
    assert_int_equal(w.len, 0);
    g_req.n_steps = PROTO_MAX_DECODE_STEPS + 1;
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), RKV_EINVAL);
    assert_string_equal(err, "step_req: n_steps is 17, the limit is 16");
    g_req.n_steps = 2;

    /* and the decoder refuses hand-made bytes */
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), 0);
    uint8_t *b = malloc(w.len);
    memcpy(b, w.data, w.len);
    proto_put_u32(b + 8, PROTO_MAX_SEQS + 1);
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: n_seqs is 4097, the limit is 4096");
    proto_put_u32(b + 8, 3);
    proto_put_u32(b + 12 + 12, PROTO_MAX_STEP_TOKENS + 1); /* seq 0 n_tokens */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: n_tokens is 65537, the limit is 65536");
    proto_put_u32(b + 12 + 12, 4);
    proto_put_u32(b + 12 + 32, PROTO_MAX_BLOCKS + 1); /* seq 0 n_blocks */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: n_blocks is 1048577, the limit is 1048576");
    proto_put_u32(b + 12 + 32, 3);
    b[12 + 36 + 5 + 4] = 7; /* seq 0 block 1 residency */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: block 1 has residency 7 (0 device, 1 host, 2 both)");
    b[12 + 36 + 5 + 4] = 1;
    b[12 + 89 - 2] = 2; /* seq 0 want_logits */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: want_logits is 2, not 0 or 1");
    b[12 + 89 - 2] = 1;
    proto_put_u32(b + 12 + 51, 0x7fc00000); /* seq 0 temperature = NaN */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    proto_put_u32(b + 12 + 51, 0x3f800000);
    proto_put_u16(b + 12 + 89, PROTO_MAX_LOGIT_BIAS + 1); /* seq 0 n_bias */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: n_bias is 301, the limit is 300");
    proto_put_u16(b + 12 + 89, 2);
    proto_put_u32(b + 12 + 91 + 8 + 4, 0x7fc00000); /* seq 0 bias 1 = NaN */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: bias 1 is not a finite number");
    proto_put_u32(b + 12 + 91 + 8 + 4, 0x40f00000); /* 7.5 */
    proto_put_u32(b + 12 + 91, 0xffffffffu);        /* seq 0 bias 0 id = -1 */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: bias 0 has token id -1");
    proto_put_u32(b + 12 + 91, 0);
    proto_put_u32(b + 12 + 91 + 16, PROTO_MAX_GRAMMAR + 1); /* seq 0 grammar_len */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: seq 0: grammar_len is 1048577, the limit is 1048576");
    proto_put_u32(b + 12 + 91 + 16, 13); /* one byte more than is there before the flags */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    proto_put_u32(b + 12 + 91 + 16, 12);
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), 0);
    assert_int_equal(m->seqs[0].sampling.n_bias, 2);
    assert_true(m->seqs[0].sampling.bias[1].bias == 7.5f);
    proto_step_req_destroy(m);
    b[w.len - 1] = 0; /* n_steps, the last byte */
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_req: n_steps 0 is outside 1..16");
    b[w.len - 1] = PROTO_MAX_DECODE_STEPS + 1;
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    b[w.len - 1] = PROTO_MAX_DECODE_STEPS;
    assert_int_equal(proto_step_req_decode(b, w.len, &m, err, sizeof err), 0);
    assert_int_equal(m->n_steps, PROTO_MAX_DECODE_STEPS);
    proto_step_req_destroy(m);
    assert_int_equal(proto_step_req_decode(b, (size_t)PROTO_MAX_PAYLOAD + 1, &m, err, sizeof err),
                     RKV_ETOOBIG);
    free(b);
    proto_wbuf_fini(&w);
}

static void test_step_req_big(void **state)
{
    (void)state;
    /* one sequence at the token limit, one at a large block count */
    int32_t *tok = malloc(PROTO_MAX_STEP_TOKENS * sizeof *tok);
    struct proto_block_ref *blk = malloc(100000 * sizeof *blk);
    for (int i = 0; i < PROTO_MAX_STEP_TOKENS; i++)
        tok[i] = i * 3 - 5;
    for (int i = 0; i < 100000; i++)
        blk[i] = (struct proto_block_ref){(uint32_t)i * 7, (uint8_t)(i % 3)};
    struct proto_step_seq seqs[2] = {
        {.session_id = 1, .n_tokens = PROTO_MAX_STEP_TOKENS, .tokens = tok},
        {.session_id = 2, .n_past = 25600000, .n_blocks = 100000, .blocks = blk},
    };
    struct proto_step_req req = {.epoch = 5, .n_seqs = 2, .seqs = seqs};
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    char err[256];
    assert_int_equal(proto_step_req_encode(&req, &w, err, sizeof err), 0);
    struct proto_step_req *m;
    assert_int_equal(proto_step_req_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_seq_equal(&m->seqs[0], &seqs[0]);
    assert_seq_equal(&m->seqs[1], &seqs[1]);
    proto_step_req_destroy(m);
    proto_wbuf_fini(&w);
    free(tok);
    free(blk);
}

static void test_step_resp(void **state)
{
    (void)state;
    struct proto_step_out outs[3];
    memset(outs, 0, sizeof outs);
    outs[0] = (struct proto_step_out){
        .session_id = 11, .token = 500, .logprob = -0.25f, .n_top = 2, .status = 0};
    outs[0].top[0] = (struct proto_logprob){500, -0.25f};
    outs[0].top[1] = (struct proto_logprob){7, -3.5f};
    outs[1] = (struct proto_step_out){
        .session_id = UINT64_MAX, .token = -1, .logprob = -INFINITY, .status = RKV_ENOSPACE};
    outs[2].session_id = 3;
    outs[2].n_top = PROTO_MAX_TOP_LOGPROBS;
    for (int i = 0; i < PROTO_MAX_TOP_LOGPROBS; i++)
        outs[2].top[i] = (struct proto_logprob){i, -(float)i};
    /* a row of four greedy decode steps: three more tokens after the first */
    outs[0].n_more = 3;
    for (int i = 0; i < 3; i++)
        outs[0].more[i] = (struct proto_logprob){600 + i, -0.5f * (float)i};
    struct proto_step_resp resp = {.epoch = 1234567890123ull, .n_seqs = 3, .seqs = outs};
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    char err[256];
    assert_int_equal(proto_step_resp_encode(&resp, &w, err, sizeof err), 0);
    assert_int_equal(w.len, 12 + (22 + 16 + 24) + 22 + (22 + 160));
    struct proto_step_resp *m;
    assert_int_equal(proto_step_resp_decode(w.data, w.len, &m, err, sizeof err), 0);
    assert_true(m->epoch == resp.epoch);
    assert_int_equal(m->n_seqs, 3);
    for (int i = 0; i < 3; i++) {
        assert_true(m->seqs[i].session_id == outs[i].session_id);
        assert_int_equal(m->seqs[i].token, outs[i].token);
        assert_true(m->seqs[i].logprob == outs[i].logprob);
        assert_int_equal(m->seqs[i].n_top, outs[i].n_top);
        assert_memory_equal(m->seqs[i].top, outs[i].top, outs[i].n_top * sizeof outs[i].top[0]);
        assert_int_equal(m->seqs[i].status, outs[i].status);
        assert_int_equal(m->seqs[i].n_more, outs[i].n_more);
        assert_memory_equal(m->seqs[i].more, outs[i].more, outs[i].n_more * sizeof outs[i].more[0]);
    }
    proto_step_resp_destroy(m);
    check_prefixes(dec_resp, w.data, w.len);

    /* n_top over the limit, both ways */
    uint8_t *b = malloc(w.len);
    memcpy(b, w.data, w.len);
    b[12 + 16] = PROTO_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(proto_step_resp_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_resp: seq 0: n_top is 21, the limit is 20");
    b[12 + 16] = 2;
    b[12 + 21 + 16] = PROTO_MAX_DECODE_STEPS; /* seq 0 n_more */
    assert_int_equal(proto_step_resp_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    assert_string_equal(err, "step_resp: seq 0: n_more is 16, the limit is 15");
    proto_put_u32(b + 8, 5000);
    assert_int_equal(proto_step_resp_decode(b, w.len, &m, err, sizeof err), RKV_EFORMAT);
    free(b);
    outs[0].n_more = PROTO_MAX_DECODE_STEPS;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_step_resp_encode(&resp, &w, err, sizeof err), RKV_EINVAL);
    outs[0].n_more = 3;
    outs[1].n_top = 21;
    proto_wbuf_reset(&w);
    assert_int_equal(proto_step_resp_encode(&resp, &w, err, sizeof err), RKV_EINVAL);
    proto_wbuf_fini(&w);
}

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void test_random_bytes(void **state)
{
    (void)state;
    /* random bytes, and valid encodings with random bytes flipped */
    make_req();
    struct proto_wbuf w;
    proto_wbuf_init(&w);
    char err[256];
    assert_int_equal(proto_step_req_encode(&g_req, &w, err, sizeof err), 0);
    decode_fn fns[2] = {dec_req, dec_resp};
    for (int i = 0; i < 30000; i++) {
        size_t len = i % 2 ? w.len : rnd() % 300;
        uint8_t *b = malloc(len ? len : 1);
        if (i % 2) {
            memcpy(b, w.data, len);
            for (int k = 0; k < 3; k++)
                b[rnd() % len] = (uint8_t)rnd();
        } else {
            for (size_t j = 0; j < len; j++)
                b[j] = (uint8_t)(rnd() % 4 ? rnd() % 3 : rnd());
        }
        void *out = NULL;
        int k = i % 2 ? 0 : (int)(rnd() % 2);
        int rc = fns[k](b, len, &out, err, sizeof err);
        assert_true(rc == 0 || rc == RKV_EFORMAT);
        assert_true((rc == 0) == (out != NULL));
        free(out); /* every decoder's result is one allocation */
        free(b);
    }
    proto_wbuf_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buffers),         cmocka_unit_test(test_step_req),
        cmocka_unit_test(test_step_req_limits), cmocka_unit_test(test_step_req_big),
        cmocka_unit_test(test_step_resp),       cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
