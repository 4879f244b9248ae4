/* wire.h - hot-path binary messages (STEP_REQ, STEP_RESP) and the byte buffers under them. */
#ifndef RKV_PROTO_WIRE_H
#define RKV_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

/* --- byte buffers ------------------------------------------------------------ */

/* growable little-endian writer. errors are sticky: after the first failure
 * (no memory, over PROTO_MAX_PAYLOAD) puts do nothing and proto_wbuf_err
 * returns the code, so an encoder checks once at the end. */
struct proto_wbuf {
    uint8_t *data;
    size_t len, cap;
    int err;
};
void proto_wbuf_init(struct proto_wbuf *w);
void proto_wbuf_fini(struct proto_wbuf *w);
void proto_wbuf_reset(struct proto_wbuf *w); /* len = 0, err = 0, memory kept */
int proto_wbuf_err(const struct proto_wbuf *w);
void proto_wbuf_put_u8(struct proto_wbuf *w, uint8_t v);
void proto_wbuf_put_u16(struct proto_wbuf *w, uint16_t v);
void proto_wbuf_put_u32(struct proto_wbuf *w, uint32_t v);
void proto_wbuf_put_u64(struct proto_wbuf *w, uint64_t v);
void proto_wbuf_put_i32(struct proto_wbuf *w, int32_t v);
void proto_wbuf_put_f32(struct proto_wbuf *w, float v);
void proto_wbuf_put_bytes(struct proto_wbuf *w, const void *p, size_t n);

/* bounds-checked reader over len bytes; a get past the end returns
 * RKV_EFORMAT, reads nothing and leaves pos where it was */
struct proto_rbuf {
    const uint8_t *p;
    size_t len, pos;
};
void proto_rbuf_init(struct proto_rbuf *r, const void *p, size_t len);
size_t proto_rbuf_left(const struct proto_rbuf *r);
int proto_rbuf_get_u8(struct proto_rbuf *r, uint8_t *v);
int proto_rbuf_get_u16(struct proto_rbuf *r, uint16_t *v);
int proto_rbuf_get_u32(struct proto_rbuf *r, uint32_t *v);
int proto_rbuf_get_u64(struct proto_rbuf *r, uint64_t *v);
int proto_rbuf_get_i32(struct proto_rbuf *r, int32_t *v);
int proto_rbuf_get_f32(struct proto_rbuf *r, float *v);
int proto_rbuf_get_bytes(struct proto_rbuf *r, void *dst, size_t n);

/* --- messages ------------------------------------------------------------------ */

#define PROTO_MAX_SEQS         4096
#define PROTO_MAX_STEP_TOKENS  65536
#define PROTO_MAX_BLOCKS       (1u << 20)
#define PROTO_MAX_TOP_LOGPROBS 20
#define PROTO_MAX_HISTORY (1u << 24)
#define PROTO_MAX_DECODE_STEPS 16 /* greedy decode steps one STEP_REQ may ask for */
#define PROTO_MAX_LOGIT_BIAS   300 /* logit bias entries of one sequence */
#define PROTO_MAX_GRAMMAR (1u << 20) /* bytes of one sequence's grammar text */

/* step_seq flags */
#define PROTO_STEP_SAMPLE 1u /* sample a token from the last position */
#define PROTO_STEP_RESET 2u  /* (re)build the session's sampler from history */
#define PROTO_STEP_FLAGS (PROTO_STEP_SAMPLE | PROTO_STEP_RESET)

enum proto_residency { PROTO_RES_DEVICE = 0, PROTO_RES_HOST = 1, PROTO_RES_BOTH = 2 };

/* wire: u32 index, u8 residency */
struct proto_block_ref {
    uint32_t index;
    uint8_t residency; /* enum proto_residency */
};

/* wire: i32 id, f32 bias */
struct proto_bias {
    int32_t id;
    float bias; /* added to the logit of id before sampling */
};

/* wire: f32 temperature top_p min_p presence_penalty frequency_penalty
 * repetition_penalty, i32 top_k, u64 seed, u8 want_logits, u8 n_top_logprobs,
 * u16 n_bias, n_bias x bias, u32 grammar_len, grammar_len bytes. floats must be finite,
 * want_logits 0/1, n_top_logprobs <= 20, n_bias <= PROTO_MAX_LOGIT_BIAS, bias ids >= 0,
 * grammar_len <= PROTO_MAX_GRAMMAR */
struct proto_sampling {
    float temperature, top_p, min_p;
    float presence_penalty, frequency_penalty, repetition_penalty;
    int32_t top_k;
    uint64_t seed;
    uint8_t want_logits;
    uint8_t n_top_logprobs;
    /* the worker reads sampling only to build a sampler (PROTO_STEP_RESET), so rkvd sends the
     * bias list only then */
    uint16_t n_bias;
    const struct proto_bias *bias; /* (n_bias,) */
    /* GBNF text every sampled token must keep the output a prefix of (structured output;
     * common/grammar.h), sent like the bias list with PROTO_STEP_RESET only; the decoder
     * NUL-terminates it. 0 bytes: unconstrained */
    uint32_t grammar_len;
    const char *grammar; /* (grammar_len,) */
};

/* one sequence of a step. wire: u64 session_id, u32 n_past, u32 n_tokens,
 * i32 tokens[n_tokens], u32 n_blocks, block refs, sampling, u8 flags,
 * u32 n_history, i32 history[n_history], u32 n_drawn */
struct proto_step_seq {
    uint64_t session_id;
    uint32_t n_past;                /* tokens already in the KV */
    uint32_t n_tokens;              /* <= PROTO_MAX_STEP_TOKENS */
    int32_t *tokens;                /* (n_tokens,) */
    uint32_t n_blocks;              /* <= PROTO_MAX_BLOCKS */
    struct proto_block_ref *blocks; /* (n_blocks,) in position order */
    struct proto_sampling sampling;
    uint8_t flags;       /* PROTO_STEP_* */
    uint32_t n_history;  /* with PROTO_STEP_RESET: every token before this step's */
    int32_t *history;    /* (n_history,) */
    uint32_t n_drawn;    /* with PROTO_STEP_RESET: tokens this request sampled already
                          * (the rebuilt sampler's rng skips their draws) */
};

/* STEP_REQ: rkvd -> worker. wire: u64 epoch, u32 n_seqs, seqs, u32 n_close,
 * u64 close[n_close], u8 n_steps */
struct proto_step_req {
    uint64_t epoch;
    uint32_t n_seqs;             /* <= PROTO_MAX_SEQS */
    struct proto_step_seq *seqs; /* (n_seqs,) */
    uint32_t n_close;            /* <= PROTO_MAX_SEQS: sessions that ended (free their state) */
    uint64_t *close;             /* (n_close,) */
    /* decode steps to run, 1..PROTO_MAX_DECODE_STEPS (the encoder sends 0 as 1). with more
     * than one, every sequence samples and none asks for top alternatives: the worker feeds
     * each step's sampled token to the next, so each sequence's blocks cover n_past +
     * n_tokens + n_steps - 1 positions; a worker that cannot runs fewer, and says how many
     * in each output */
    uint8_t n_steps;
};

struct proto_logprob {
    int32_t id;
    float logprob;
};

/* wire: u64 session_id, i32 token, f32 logprob, u8 n_top, n_top x (i32 id,
 * f32 logprob), i32 status, u8 n_more, n_more x (i32 id, f32 logprob) */
struct proto_step_out {
    uint64_t session_id;
    int32_t token;
    float logprob;
    uint8_t n_top; /* <= PROTO_MAX_TOP_LOGPROBS */
    struct proto_logprob top[PROTO_MAX_TOP_LOGPROBS];
    int32_t status; /* 0 or an RKV_E* code for this sequence */
    /* the tokens of the request's later decode steps (n_steps > 1), in order: token was
     * picked first, more[0] from it, and so on */
    uint8_t n_more; /* < PROTO_MAX_DECODE_STEPS */
    struct proto_logprob more[PROTO_MAX_DECODE_STEPS - 1];
};

/* STEP_RESP: worker -> rkvd. wire: u64 epoch, u32 n_seqs, outs */
struct proto_step_resp {
    uint64_t epoch;
    uint32_t n_seqs;
    struct proto_step_out *seqs; /* (n_seqs,) */
};

/* encoders append to w (reset it first for a fresh payload) and check the
 * limits above: RKV_EINVAL for a message the decoder would refuse (text in
 * err), RKV_ETOOBIG over PROTO_MAX_PAYLOAD, RKV_ENOMEM */
int proto_step_req_encode(const struct proto_step_req *m, struct proto_wbuf *w, char *err,
                          size_t errlen);
int proto_step_resp_encode(const struct proto_step_resp *m, struct proto_wbuf *w, char *err,
                           size_t errlen);

/* decoders parse exactly len bytes into one allocation (*out, free with the
 * matching _free, which takes NULL); RKV_EFORMAT for anything truncated,
 * over a limit, or with trailing bytes, with text in err; RKV_ENOMEM */
int proto_step_req_decode(const void *buf, size_t len, struct proto_step_req **out, char *err,
                          size_t errlen);
int proto_step_resp_decode(const void *buf, size_t len, struct proto_step_resp **out, char *err,
                           size_t errlen);
void proto_step_req_destroy(struct proto_step_req *m);
void proto_step_resp_destroy(struct proto_step_resp *m);

#endif
