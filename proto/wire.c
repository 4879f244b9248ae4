/* wire.c - byte buffers and the bounds-checked codecs of the hot-path binary messages. */
#include "proto/wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/proto.h"

/* --- writer ------------------------------------------------------------------ */

void proto_wbuf_init(struct proto_wbuf *w)
{
    memset(w, 0, sizeof *w);
}

void proto_wbuf_fini(struct proto_wbuf *w)
{
    free(w->data);
    memset(w, 0, sizeof *w);
}

void proto_wbuf_reset(struct proto_wbuf *w)
{
    w->len = 0;
    w->err = 0;
}

int proto_wbuf_err(const struct proto_wbuf *w)
{
    return w->err;
}

/* room for n more bytes, or a sticky error */
static uint8_t *wbuf_room(struct proto_wbuf *w, size_t n)
{
    if (w->err)
        return NULL;
    if (n > PROTO_MAX_PAYLOAD || w->len > PROTO_MAX_PAYLOAD - n) {
        w->err = RKV_ETOOBIG;
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->data, cap);
        if (!p) {
            w->err = RKV_ENOMEM;
            return NULL;
        }
        w->data = p;
        w->cap = cap;
    }
    uint8_t *at = w->data + w->len;
    w->len += n;
    return at;
}

void proto_wbuf_put_u8(struct proto_wbuf *w, uint8_t v)
{
    uint8_t *p = wbuf_room(w, 1);
    if (p)
        *p = v;
}

void proto_wbuf_put_u16(struct proto_wbuf *w, uint16_t v)
{
    uint8_t *p = wbuf_room(w, 2);
    if (p)
        proto_put_u16(p, v);
}

void proto_wbuf_put_u32(struct proto_wbuf *w, uint32_t v)
{
    uint8_t *p = wbuf_room(w, 4);
    if (p)
        proto_put_u32(p, v);
}

void proto_wbuf_put_u64(struct proto_wbuf *w, uint64_t v)
{
    uint8_t *p = wbuf_room(w, 8);
    if (p)
        proto_put_u64(p, v);
}

void proto_wbuf_put_i32(struct proto_wbuf *w, int32_t v)
{
    proto_wbuf_put_u32(w, (uint32_t)v);
}

void proto_wbuf_put_f32(struct proto_wbuf *w, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    proto_wbuf_put_u32(w, u);
}

void proto_wbuf_put_bytes(struct proto_wbuf *w, const void *src, size_t n)
{
    uint8_t *p = wbuf_room(w, n);
    if (p && n)
        memcpy(p, src, n);
}

/* --- reader ------------------------------------------------------------------ */

void proto_rbuf_init(struct proto_rbuf *r, const void *p, size_t len)
{
    r->p = p;
    r->len = p ? len : 0;
    r->pos = 0;
}

size_t proto_rbuf_left(const struct proto_rbuf *r)
{
    return r->len - r->pos;
}

/* n bytes at the read position, advancing, or NULL past the end */
static const uint8_t *rbuf_take(struct proto_rbuf *r, size_t n)
{
    if (n > r->len - r->pos)
        return NULL;
    const uint8_t *at = r->p + r->pos;
    r->pos += n;
    return at;
}

int proto_rbuf_get_u8(struct proto_rbuf *r, uint8_t *v)
{
    const uint8_t *p = rbuf_take(r, 1);
    if (!p)
        return RKV_EFORMAT;
    *v = *p;
    return 0;
}

int proto_rbuf_get_u16(struct proto_rbuf *r, uint16_t *v)
{
    const uint8_t *p = rbuf_take(r, 2);
    if (!p)
        return RKV_EFORMAT;
    *v = proto_get_u16(p);
    return 0;
}

int proto_rbuf_get_u32(struct proto_rbuf *r, uint32_t *v)
{
    const uint8_t *p = rbuf_take(r, 4);
    if (!p)
        return RKV_EFORMAT;
    *v = proto_get_u32(p);
    return 0;
}

int proto_rbuf_get_u64(struct proto_rbuf *r, uint64_t *v)
{
    const uint8_t *p = rbuf_take(r, 8);
    if (!p)
        return RKV_EFORMAT;
    *v = proto_get_u64(p);
    return 0;
}

int proto_rbuf_get_i32(struct proto_rbuf *r, int32_t *v)
{
    uint32_t u;
    int rc = proto_rbuf_get_u32(r, &u);
    if (rc == 0)
        *v = (int32_t)u;
    return rc;
}

int proto_rbuf_get_f32(struct proto_rbuf *r, float *v)
{
    uint32_t u;
    int rc = proto_rbuf_get_u32(r, &u);
    if (rc == 0)
        memcpy(v, &u, 4);
    return rc;
}

int proto_rbuf_get_bytes(struct proto_rbuf *r, void *dst, size_t n)
{
    const uint8_t *p = rbuf_take(r, n);
    if (!p)
        return RKV_EFORMAT;
    if (n)
        memcpy(dst, p, n);
    return 0;
}

/* --- shared checks ----------------------------------------------------------------- */

#define SAMPLING_WIRE 44 /* 6 f32 + i32 + u64 + 2 u8 + u16, the bias entries, u32 + grammar */
#define BIAS_WIRE     8
#define SEQ_MIN_WIRE  (8 + 4 + 4 + 4 + SAMPLING_WIRE + 1 + 4 + 4)
#define OUT_MIN_WIRE  (8 + 4 + 4 + 1 + 4 + 1)
#define BLOCK_WIRE    5

static int truncated(const char *what, const struct proto_rbuf *r, char *err, size_t errlen)
{
    return proto_seterr(err, errlen, RKV_EFORMAT, "%s: message ends early (%zu bytes)", what,
                        r->len);
}

static int check_sampling(const char *what, uint32_t seq, const struct proto_sampling *s, char *err,
                          size_t errlen)
{
    const float f[6] = {
        s->temperature,       s->top_p, s->min_p, s->presence_penalty, s->frequency_penalty,
        s->repetition_penalty};
    static const char *const names[6] = {
        "temperature",       "top_p", "min_p", "presence_penalty", "frequency_penalty",
        "repetition_penalty"};
    for (int i = 0; i < 6; i++)
        if (!isfinite(f[i]))
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: %s is not a finite number",
                                what, seq, names[i]);
    if (s->want_logits > 1)
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: want_logits is %u, not 0 or 1",
                            what, seq, s->want_logits);
    if (s->n_top_logprobs > PROTO_MAX_TOP_LOGPROBS)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: seq %u: n_top_logprobs is %u, the limit is %d", what, seq,
                            s->n_top_logprobs, PROTO_MAX_TOP_LOGPROBS);
    if (s->n_bias > PROTO_MAX_LOGIT_BIAS)
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: n_bias is %u, the limit is %d",
                            what, seq, s->n_bias, PROTO_MAX_LOGIT_BIAS);
    if (s->grammar_len > PROTO_MAX_GRAMMAR)
        return proto_seterr(err, errlen, RKV_EFORMAT,
                            "%s: seq %u: grammar_len is %u, the limit is %u", what, seq,
                            s->grammar_len, PROTO_MAX_GRAMMAR);
    return 0;
}

/* one logit bias entry, the index j of its list for the message */
static int check_bias(const char *what, uint32_t seq, uint32_t j, const struct proto_bias *b,
                      char *err, size_t errlen)
{
    if (b->id < 0)
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: bias %u has token id %d", what,
                            seq, j, b->id);
    if (!isfinite(b->bias))
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: bias %u is not a finite number",
                            what, seq, j);
    return 0;
}

static int check_count(const char *what, const char *field, uint32_t seq, uint64_t n,
                       uint64_t limit, char *err, size_t errlen)
{
    if (n <= limit)
        return 0;
    if (seq == UINT32_MAX)
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: %s is %llu, the limit is %llu", what,
                            field, (unsigned long long)n, (unsigned long long)limit);
    return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: %s is %llu, the limit is %llu", what,
                        seq, field, (unsigned long long)n, (unsigned long long)limit);
}

/* first: the index of b[0] in its table, for the message */
static int check_blocks(const char *what, uint32_t seq, const struct proto_block_ref *b, uint32_t n,
                        uint32_t first, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < n; i++)
        if (b[i].residency > PROTO_RES_BOTH)
            return proto_seterr(err, errlen, RKV_EFORMAT,
                                "%s: seq %u: block %u has residency %u (0 device, 1 host, 2 both)",
                                what, seq, first + i, b[i].residency);
    return 0;
}

static void put_blocks(struct proto_wbuf *w, const struct proto_block_ref *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        proto_wbuf_put_u32(w, b[i].index);
        proto_wbuf_put_u8(w, b[i].residency);
    }
}

/* reads n block refs into b (or only checks them when b is NULL) */
static int get_blocks(const char *what, uint32_t seq, struct proto_rbuf *r,
                      struct proto_block_ref *b, uint32_t n, char *err, size_t errlen)
{
    if ((uint64_t)n * BLOCK_WIRE > proto_rbuf_left(r))
        return truncated(what, r, err, errlen);
    for (uint32_t i = 0; i < n; i++) {
        struct proto_block_ref ref;
        proto_rbuf_get_u32(r, &ref.index);
        proto_rbuf_get_u8(r, &ref.residency);
        int rc = check_blocks(what, seq, &ref, 1, i, err, errlen);
        if (rc < 0)
            return rc;
        if (b)
            b[i] = ref;
    }
    return 0;
}

static int end_check(const char *what, const struct proto_rbuf *r, char *err, size_t errlen)
{
    if (proto_rbuf_left(r))
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: %zu stray bytes after the message", what,
                            proto_rbuf_left(r));
    return 0;
}

static int finish_encode(struct proto_wbuf *w, const char *what, char *err, size_t errlen)
{
    int rc = proto_wbuf_err(w);
    if (rc == RKV_ETOOBIG)
        return proto_seterr(err, errlen, rc, "%s: encoding is over the %u byte limit", what,
                            PROTO_MAX_PAYLOAD);
    return rc;
}

/* --- STEP_REQ --------------------------------------------------------------------- */

int proto_step_req_encode(const struct proto_step_req *m, struct proto_wbuf *w, char *err,
                          size_t errlen)
{
    const char *what = "step_req";
    int rc = check_count(what, "n_seqs", UINT32_MAX, m->n_seqs, PROTO_MAX_SEQS, err, errlen);
    if (rc == 0)
        rc = check_count(what, "n_close", UINT32_MAX, m->n_close, PROTO_MAX_SEQS, err, errlen);
    for (uint32_t i = 0; rc == 0 && i < m->n_seqs; i++) {
        const struct proto_step_seq *s = &m->seqs[i];
        rc = check_count(what, "n_tokens", i, s->n_tokens, PROTO_MAX_STEP_TOKENS, err, errlen);
        if (rc == 0)
            rc = check_count(what, "n_blocks", i, s->n_blocks, PROTO_MAX_BLOCKS, err, errlen);
        if (rc == 0)
            rc = check_blocks(what, i, s->blocks, s->n_blocks, 0, err, errlen);
        if (rc == 0)
            rc = check_sampling(what, i, &s->sampling, err, errlen);
        for (uint32_t j = 0; rc == 0 && j < s->sampling.n_bias; j++)
            rc = check_bias(what, i, j, &s->sampling.bias[j], err, errlen);
        if (rc == 0)
            rc = check_count(what, "n_history", i, s->n_history, PROTO_MAX_HISTORY, err, errlen);
        if (rc == 0 && (s->flags & ~PROTO_STEP_FLAGS))
            rc = proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: unknown flags 0x%x", what, i,
                              s->flags);
    }
    if (rc == 0)
        rc = check_count(what, "n_steps", UINT32_MAX, m->n_steps, PROTO_MAX_DECODE_STEPS, err,
                         errlen);
    if (rc < 0)
        return RKV_EINVAL;
    proto_wbuf_put_u64(w, m->epoch);
    proto_wbuf_put_u32(w, m->n_seqs);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const struct proto_step_seq *s = &m->seqs[i];
        const struct proto_sampling *sp = &s->sampling;
        proto_wbuf_put_u64(w, s->session_id);
        proto_wbuf_put_u32(w, s->n_past);
        proto_wbuf_put_u32(w, s->n_tokens);
        for (uint32_t t = 0; t < s->n_tokens; t++)
            proto_wbuf_put_i32(w, s->tokens[t]);
        proto_wbuf_put_u32(w, s->n_blocks);
        put_blocks(w, s->blocks, s->n_blocks);
        proto_wbuf_put_f32(w, sp->temperature);
        proto_wbuf_put_f32(w, sp->top_p);
        proto_wbuf_put_f32(w, sp->min_p);
        proto_wbuf_put_f32(w, sp->presence_penalty);
        proto_wbuf_put_f32(w, sp->frequency_penalty);
        proto_wbuf_put_f32(w, sp->repetition_penalty);
        proto_wbuf_put_i32(w, sp->top_k);
        proto_wbuf_put_u64(w, sp->seed);
        proto_wbuf_put_u8(w, sp->want_logits);
        proto_wbuf_put_u8(w, sp->n_top_logprobs);
        proto_wbuf_put_u16(w, sp->n_bias);
        for (uint32_t j = 0; j < sp->n_bias; j++) {
            proto_wbuf_put_i32(w, sp->bias[j].id);
            proto_wbuf_put_f32(w, sp->bias[j].bias);
        }
        proto_wbuf_put_u32(w, sp->grammar_len);
        proto_wbuf_put_bytes(w, sp->grammar, sp->grammar_len);
        proto_wbuf_put_u8(w, s->flags);
        proto_wbuf_put_u32(w, s->n_history);
        for (uint32_t t = 0; t < s->n_history; t++)
            proto_wbuf_put_i32(w, s->history[t]);
        proto_wbuf_put_u32(w, s->n_drawn);
    }
    proto_wbuf_put_u32(w, m->n_close);
    for (uint32_t i = 0; i < m->n_close; i++)
        proto_wbuf_put_u64(w, m->close[i]);
    proto_wbuf_put_u8(w, m->n_steps ? m->n_steps : 1);
    return finish_encode(w, what, err, errlen);
}

/* where a step_req's arrays go, and how many of each it has */
struct step_req_room {
    int32_t *tok;
    struct proto_block_ref *blk;
    struct proto_bias *bia;
    char *chr; /* grammar texts, each NUL-terminated */
    uint64_t n_seqs, n_tok, n_blk, n_bia, n_chr;
    uint32_t n_close;
};

/* one pass over a step_req: with m NULL it checks everything and counts what at holds;
 * with m set (a second pass over checked bytes) it fills m, placing tokens at at->tok,
 * blocks at at->blk, bias entries at at->bia and grammar texts at at->chr */
static int step_req_walk(struct proto_rbuf *r, struct proto_step_req *m, struct step_req_room *at,
                         char *err, size_t errlen)
{
    int32_t *tok = at->tok;
    struct proto_block_ref *blk = at->blk;
    struct proto_bias *bia = at->bia;
    char *chr = at->chr;
    uint64_t *n_tok = &at->n_tok, *n_blk = &at->n_blk, *n_bia = &at->n_bia;
    const char *what = "step_req";
    uint64_t epoch;
    uint32_t n_seqs;
    if (proto_rbuf_get_u64(r, &epoch) || proto_rbuf_get_u32(r, &n_seqs))
        return truncated(what, r, err, errlen);
    int rc = check_count(what, "n_seqs", UINT32_MAX, n_seqs, PROTO_MAX_SEQS, err, errlen);
    if (rc < 0)
        return rc;
    if ((uint64_t)n_seqs * SEQ_MIN_WIRE > proto_rbuf_left(r))
        return truncated(what, r, err, errlen);
    if (m) {
        m->epoch = epoch;
        m->n_seqs = n_seqs;
    }
    at->n_seqs = n_seqs;
    for (uint32_t i = 0; i < n_seqs; i++) {
        struct proto_step_seq s = {0};
        struct proto_sampling *sp = &s.sampling;
        if (proto_rbuf_get_u64(r, &s.session_id) || proto_rbuf_get_u32(r, &s.n_past) ||
            proto_rbuf_get_u32(r, &s.n_tokens))
            return truncated(what, r, err, errlen);
        rc = check_count(what, "n_tokens", i, s.n_tokens, PROTO_MAX_STEP_TOKENS, err, errlen);
        if (rc < 0)
            return rc;
        if ((uint64_t)s.n_tokens * 4 > proto_rbuf_left(r))
            return truncated(what, r, err, errlen);
        s.tokens = tok;
        for (uint32_t t = 0; t < s.n_tokens; t++) {
            int32_t v = 0;
            proto_rbuf_get_i32(r, &v);
            if (tok)
                *tok++ = v;
        }
        *n_tok += s.n_tokens;
        if (proto_rbuf_get_u32(r, &s.n_blocks))
            return truncated(what, r, err, errlen);
        rc = check_count(what, "n_blocks", i, s.n_blocks, PROTO_MAX_BLOCKS, err, errlen);
        if (rc == 0)
            rc = get_blocks(what, i, r, blk, s.n_blocks, err, errlen);
        if (rc < 0)
            return rc;
        s.blocks = blk;
        if (blk)
            blk += s.n_blocks;
        *n_blk += s.n_blocks;
        if (proto_rbuf_get_f32(r, &sp->temperature) || proto_rbuf_get_f32(r, &sp->top_p) ||
            proto_rbuf_get_f32(r, &sp->min_p) || proto_rbuf_get_f32(r, &sp->presence_penalty) ||
            proto_rbuf_get_f32(r, &sp->frequency_penalty) ||
            proto_rbuf_get_f32(r, &sp->repetition_penalty) || proto_rbuf_get_i32(r, &sp->top_k) ||
            proto_rbuf_get_u64(r, &sp->seed) || proto_rbuf_get_u8(r, &sp->want_logits) ||
            proto_rbuf_get_u8(r, &sp->n_top_logprobs) || proto_rbuf_get_u16(r, &sp->n_bias))
            return truncated(what, r, err, errlen);
        rc = check_sampling(what, i, sp, err, errlen);
        if (rc < 0)
            return rc;
        if ((uint64_t)sp->n_bias * BIAS_WIRE > proto_rbuf_left(r))
            return truncated(what, r, err, errlen);
        sp->bias = bia;
        for (uint32_t j = 0; j < sp->n_bias; j++) {
            struct proto_bias b;
            proto_rbuf_get_i32(r, &b.id);
            proto_rbuf_get_f32(r, &b.bias);
            rc = check_bias(what, i, j, &b, err, errlen);
            if (rc < 0)
                return rc;
            if (bia)
                *bia++ = b;
        }
        *n_bia += sp->n_bias;
        if (proto_rbuf_get_u32(r, &sp->grammar_len))
            return truncated(what, r, err, errlen);
        rc = check_count(what, "grammar_len", i, sp->grammar_len, PROTO_MAX_GRAMMAR, err, errlen);
        if (rc < 0)
            return rc;
        const uint8_t *text = rbuf_take(r, sp->grammar_len);
        if (!text)
            return truncated(what, r, err, errlen);
        if (chr && sp->grammar_len) {
            memcpy(chr, text, sp->grammar_len);
            chr[sp->grammar_len] = 0;
            sp->grammar = chr;
            chr += sp->grammar_len + 1;
        }
        at->n_chr += sp->grammar_len ? sp->grammar_len + 1 : 0;
        if (proto_rbuf_get_u8(r, &s.flags) || proto_rbuf_get_u32(r, &s.n_history))
            return truncated(what, r, err, errlen);
        if (s.flags & ~PROTO_STEP_FLAGS)
            return proto_seterr(err, errlen, RKV_EFORMAT, "%s: seq %u: unknown flags 0x%x", what, i,
                                s.flags);
        rc = check_count(what, "n_history", i, s.n_history, PROTO_MAX_HISTORY, err, errlen);
        if (rc < 0)
            return rc;
        if ((uint64_t)s.n_history * 4 > proto_rbuf_left(r))
            return truncated(what, r, err, errlen);
        s.history = tok;
        for (uint32_t t = 0; t < s.n_history; t++) {
            int32_t v = 0;
            proto_rbuf_get_i32(r, &v);
            if (tok)
                *tok++ = v;
        }
        *n_tok += s.n_history;
        if (proto_rbuf_get_u32(r, &s.n_drawn))
            return truncated(what, r, err, errlen);
        if (m)
            m->seqs[i] = s;
    }
    uint32_t n_close;
    if (proto_rbuf_get_u32(r, &n_close))
        return truncated(what, r, err, errlen);
    rc = check_count(what, "n_close", UINT32_MAX, n_close, PROTO_MAX_SEQS, err, errlen);
    if (rc < 0)
        return rc;
    if ((uint64_t)n_close * 8 > proto_rbuf_left(r))
        return truncated(what, r, err, errlen);
    at->n_close = n_close;
    for (uint32_t i = 0; i < n_close; i++) {
        uint64_t v = 0;
        proto_rbuf_get_u64(r, &v);
        if (m)
            m->close[i] = v;
    }
    if (m)
        m->n_close = n_close;
    uint8_t n_steps;
    if (proto_rbuf_get_u8(r, &n_steps))
        return truncated(what, r, err, errlen);
    if (n_steps == 0 || n_steps > PROTO_MAX_DECODE_STEPS)
        return proto_seterr(err, errlen, RKV_EFORMAT, "%s: n_steps %u is outside 1..%u", what,
                            n_steps, PROTO_MAX_DECODE_STEPS);
    if (m)
        m->n_steps = n_steps;
    return end_check(what, r, err, errlen);
}

int proto_step_req_decode(const void *buf, size_t len, struct proto_step_req **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    if (len > PROTO_MAX_PAYLOAD)
        return proto_seterr(err, errlen, RKV_ETOOBIG, "step_req: %zu bytes, the limit is %u", len,
                            PROTO_MAX_PAYLOAD);
    struct proto_rbuf r;
    struct step_req_room n = {0};
    proto_rbuf_init(&r, buf, len);
    int rc = step_req_walk(&r, NULL, &n, err, errlen);
    if (rc < 0)
        return rc;
    /* one allocation: header, closes, seqs, tokens, bias entries, blocks, grammar texts;
     * bounded by ~2x len */
    size_t sz = sizeof(struct proto_step_req) + n.n_close * sizeof(uint64_t) +
                n.n_seqs * sizeof(struct proto_step_seq) + n.n_tok * sizeof(int32_t) +
                n.n_bia * sizeof(struct proto_bias) + n.n_blk * sizeof(struct proto_block_ref) +
                n.n_chr;
    struct proto_step_req *m = calloc(1, sz);
    if (!m)
        return RKV_ENOMEM;
    m->close = (uint64_t *)(m + 1);
    m->seqs = (struct proto_step_seq *)(m->close + n.n_close);
    struct step_req_room at = {0};
    at.tok = (int32_t *)(m->seqs + n.n_seqs);
    at.bia = (struct proto_bias *)(at.tok + n.n_tok);
    at.blk = (struct proto_block_ref *)(at.bia + n.n_bia);
    at.chr = (char *)(at.blk + n.n_blk);
    proto_rbuf_init(&r, buf, len);
    rc = step_req_walk(&r, m, &at, err, errlen);
    if (rc < 0) {
        free(m);
        return rc;
    }
    /* empty arrays point nowhere rather than at the next seq's data */
    if (!m->n_close)
        m->close = NULL;
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        if (!m->seqs[i].n_tokens)
            m->seqs[i].tokens = NULL;
        if (!m->seqs[i].n_blocks)
            m->seqs[i].blocks = NULL;
        if (!m->seqs[i].n_history)
            m->seqs[i].history = NULL;
        if (!m->seqs[i].sampling.n_bias)
            m->seqs[i].sampling.bias = NULL;
    }
    *out = m;
    return 0;
}

void proto_step_req_destroy(struct proto_step_req *m)
{
    free(m);
}

/* --- STEP_RESP -------------------------------------------------------------------- */

int proto_step_resp_encode(const struct proto_step_resp *m, struct proto_wbuf *w, char *err,
                           size_t errlen)
{
    const char *what = "step_resp";
    int rc = check_count(what, "n_seqs", UINT32_MAX, m->n_seqs, PROTO_MAX_SEQS, err, errlen);
    for (uint32_t i = 0; rc == 0 && i < m->n_seqs; i++) {
        rc = check_count(what, "n_top", i, m->seqs[i].n_top, PROTO_MAX_TOP_LOGPROBS, err, errlen);
        if (rc == 0)
            rc = check_count(what, "n_more", i, m->seqs[i].n_more, PROTO_MAX_DECODE_STEPS - 1, err,
                             errlen);
    }
    if (rc < 0)
        return RKV_EINVAL;
    proto_wbuf_put_u64(w, m->epoch);
    proto_wbuf_put_u32(w, m->n_seqs);
    for (uint32_t i = 0; i < m->n_seqs; i++) {
        const struct proto_step_out *o = &m->seqs[i];
        proto_wbuf_put_u64(w, o->session_id);
        proto_wbuf_put_i32(w, o->token);
        proto_wbuf_put_f32(w, o->logprob);
        proto_wbuf_put_u8(w, o->n_top);
        for (unsigned t = 0; t < o->n_top; t++) {
            proto_wbuf_put_i32(w, o->top[t].id);
            proto_wbuf_put_f32(w, o->top[t].logprob);
        }
        proto_wbuf_put_i32(w, o->status);
        proto_wbuf_put_u8(w, o->n_more);
        for (unsigned t = 0; t < o->n_more; t++) {
            proto_wbuf_put_i32(w, o->more[t].id);
            proto_wbuf_put_f32(w, o->more[t].logprob);
        }
    }
    return finish_encode(w, what, err, errlen);
}

int proto_step_resp_decode(const void *buf, size_t len, struct proto_step_resp **out, char *err,
                           size_t errlen)
{
    const char *what = "step_resp";
    *out = NULL;
    struct proto_rbuf r;
    proto_rbuf_init(&r, buf, len);
    uint64_t epoch;
    uint32_t n_seqs;
    if (proto_rbuf_get_u64(&r, &epoch) || proto_rbuf_get_u32(&r, &n_seqs))
        return truncated(what, &r, err, errlen);
    int rc = check_count(what, "n_seqs", UINT32_MAX, n_seqs, PROTO_MAX_SEQS, err, errlen);
    if (rc < 0)
        return rc;
    if ((uint64_t)n_seqs * OUT_MIN_WIRE > proto_rbuf_left(&r))
        return truncated(what, &r, err, errlen);
    struct proto_step_resp *m =
        calloc(1, sizeof *m + (size_t)n_seqs * sizeof(struct proto_step_out));
    if (!m)
        return RKV_ENOMEM;
    m->epoch = epoch;
    m->n_seqs = n_seqs;
    m->seqs = (struct proto_step_out *)(m + 1);
    for (uint32_t i = 0; rc == 0 && i < n_seqs; i++) {
        struct proto_step_out *o = &m->seqs[i];
        if (proto_rbuf_get_u64(&r, &o->session_id) || proto_rbuf_get_i32(&r, &o->token) ||
            proto_rbuf_get_f32(&r, &o->logprob) || proto_rbuf_get_u8(&r, &o->n_top)) {
            rc = truncated(what, &r, err, errlen);
            break;
        }
        rc = check_count(what, "n_top", i, o->n_top, PROTO_MAX_TOP_LOGPROBS, err, errlen);
        for (unsigned t = 0; rc == 0 && t < o->n_top; t++)
            if (proto_rbuf_get_i32(&r, &o->top[t].id) || proto_rbuf_get_f32(&r, &o->top[t].logprob))
                rc = truncated(what, &r, err, errlen);
        if (rc == 0 && (proto_rbuf_get_i32(&r, &o->status) || proto_rbuf_get_u8(&r, &o->n_more)))
            rc = truncated(what, &r, err, errlen);
        if (rc == 0)
            rc = check_count(what, "n_more", i, o->n_more, PROTO_MAX_DECODE_STEPS - 1, err, errlen);
        for (unsigned t = 0; rc == 0 && t < o->n_more; t++)
            if (proto_rbuf_get_i32(&r, &o->more[t].id) ||
                proto_rbuf_get_f32(&r, &o->more[t].logprob))
                rc = truncated(what, &r, err, errlen);
    }
    if (rc == 0)
        rc = end_check(what, &r, err, errlen);
    if (rc < 0) {
        free(m);
        return rc;
    }
    if (!n_seqs)
        m->seqs = NULL;
    *out = m;
    return 0;
}

void proto_step_resp_destroy(struct proto_step_resp *m)
{
    free(m);
}
