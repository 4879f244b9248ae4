/* tok_int.h - private parts of the tokenizer shared by tok.c, tok_bpe.c, tok_spm.c, tok_chat.c. */
#ifndef RKV_TOK_INT_H
#define RKV_TOK_INT_H

#include <stddef.h>
#include <stdint.h>

#include "common/tok.h"

/* token types as stored in tokenizer.ggml.token_type */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

enum tok_model {
    TOK_MODEL_SPM = 0, /* "llama": sentencepiece with byte fallback */
    TOK_MODEL_BPE,     /* "gpt2": byte-level bpe */
};

/* most regexes one pre-tokenizer runs in sequence (deepseek-llm's six) */
#define TOK_PRE_MAX_RE 6

enum tok_flag {
    TOK_F_EOG = 1,
};

struct tok_entry {
    uint32_t text_off, text_len;   /* raw vocab text in t->text */
    uint32_t piece_off, piece_len; /* decoded bytes in t->pieces */
    float score;
    uint8_t type;
    uint8_t flags;
};

/* trie node over special token texts (children as a sibling list) */
struct tok_trie_node {
    int32_t child, sibling;
    int32_t id; /* token ending here or -1 */
    uint8_t byte;
};

struct tok_merge_slot {
    uint64_t key; /* (left id << 32 | right id) + 1; 0 = empty */
    int32_t rank;
    int32_t result;
};

struct tok {
    enum tok_model model;
    int32_t n_vocab;
    struct tok_entry *ent; /* (n_vocab) */
    char *text;            /* every token's text, NUL after each */
    char *pieces;          /* every token's decoded bytes */

    int32_t *map; /* open addressing text -> id, -1 empty; (map_mask + 1) */
    size_t map_mask;

    /* bpe */
    struct tok_merge_slot *merges; /* (merge_mask + 1) */
    size_t merge_mask;
    int32_t byte_tok[256];    /* bpe: token of each byte's mapped char; spm: <0xXX>; -1 none */
    void *re[TOK_PRE_MAX_RE]; /* pcre2_code *, run in order: each splits the last's pieces */
    int n_re;
    const char *pre_name; /* which pre-tokenizer: "llama3", "qwen2", "gpt2", ... */
    int ignore_merges;    /* llama 3, tekken: a word that is a token is not merged */

    /* special tokens */
    struct tok_trie_node *trie; /* node 0 is the root */
    int32_t n_trie;
    uint8_t special_first[32]; /* bitmap of first bytes of special texts */

    int32_t bos, eos, eot, eom, unk; /* eot, eom: end of turn / of message (tool call) */
    int add_bos;
    int add_space_prefix;

    /* chat */
    enum tok_chat_kind chat;
    char *chat_default_system;    /* chatml templates that add one; NULL if none */
    struct jinja_tmpl *chat_tmpl; /* the template chats render with; NULL: the family */
    char *chat_src;               /* its source text (NUL-terminated); NULL with it */
    char *arch;
};

/* the id of the token whose text is s[0..len), or -1 */
int32_t tok_find(const struct tok *t, const char *s, size_t len);
static inline const char *tok_text(const struct tok *t, int32_t id)
{
    return t->text + t->ent[id].text_off;
}

/* growable id output of one tok_encode call plus scratch reused across words */
struct tok_enc {
    const struct tok *t;
    int32_t *ids;
    size_t cap, n;
    int err;
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
    char *buf;
    size_t buf_cap;
    void *md;     /* pcre2_match_data * */
    void *mctx;   /* pcre2_match_context *, only after a jit stack overflow */
    void *jstack; /* pcre2_jit_stack * */
};

static inline void tok_enc_push(struct tok_enc *e, int32_t id)
{
    if (e->n < e->cap)
        e->ids[e->n] = id;
    e->n++;
}
/* grows a scratch buffer to hold n elements of size elem; 0 or RKV_ENOMEM */
int tok_enc_grow(void **p, size_t *cap, size_t n, size_t elem);

/* bpe (tok_bpe.c) */
int tok_bpe_init(struct tok *t, const char *pre, char *errbuf, size_t errlen);
int tok_bpe_add_merge(struct tok *t, int32_t left, int32_t right, int32_t rank, int32_t result);
void tok_bpe_fini(struct tok *t);
/* utf-8 of the char byte b maps to (gpt-2's bytes_to_unicode); returns its length */
size_t tok_bpe_byte_char(uint8_t b, char out[2]);
/* byte a code point stands for, or -1 when it is not a mapped char */
int tok_bpe_char_byte(uint32_t cp);
int tok_bpe_encode(struct tok_enc *e, const char *s, size_t len);
/* frees what tok_bpe_encode kept in e (match data, jit stack) */
void tok_bpe_enc_fini(struct tok_enc *e);
void tok_enc_fini(struct tok_enc *e);

/* spm (tok_spm.c): one fragment between special tokens */
int tok_spm_encode(struct tok_enc *e, const char *s, size_t len);

/* the merge loop both models share (tok.c): symbols in e->sym, linked by
 * prev/next (-1 at the ends); the best candidate (lowest key, then leftmost)
 * merges first until none is left */
struct tok_sym {
    int32_t id; /* token of the symbol's text, or -1 */
    int32_t prev, next;
    uint32_t start, len; /* bytes of the word; len 0 = merged away */
};
struct tok_cand {
    double key; /* bpe: merge rank; spm: -score */
    int32_t l, r, id;
    uint32_t size;
};
/* 1 when l and r merge into *id with priority *key */
typedef int (*tok_pair_fn)(const struct tok_enc *e, const struct tok_sym *l,
                           const struct tok_sym *r, double *key, int32_t *id);
int tok_merge_run(struct tok_enc *e, size_t nsym, tok_pair_fn fn);

/* chat (tok_chat.c): picks t->chat from the template / architecture and
 * parses the template (one that does not parse leaves the family) */
int tok_chat_detect(struct tok *t, const char *tmpl, size_t tmpl_len);

/* utf-8 helpers (tok.c) */
enum tok_utf8 { TOK_UTF8_OK, TOK_UTF8_BAD, TOK_UTF8_SHORT };
/* classifies the sequence at s: OK (valid char of *len bytes), BAD (maximal
 * invalid subpart of *len bytes), SHORT (valid prefix cut by the end, *len) */
enum tok_utf8 tok_utf8_scan(const uint8_t *s, size_t n, size_t *len);
/* decodes one valid sequence (as judged by tok_utf8_scan) */
uint32_t tok_utf8_decode(const uint8_t *s, size_t len);

#endif
