/* tok.h - tokenizer from GGUF metadata: SPM and byte-level BPE, chat templates. */
#ifndef RKV_TOK_H
#define RKV_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"

struct tok;

/* builds the tokenizer from tokenizer.ggml.* keys. errors name the key. */
int tok_load_gguf(const struct gguf_ctx *g, struct tok **out, char *errbuf, size_t errlen);
void tok_destroy(struct tok *t);

int32_t tok_n_vocab(const struct tok *t);
int32_t tok_bos(const struct tok *t);     /* -1 when the model has none */
int32_t tok_eos(const struct tok *t);
int tok_add_bos(const struct tok *t);      /* tokenizer.ggml.add_bos_token */
/* the pre-tokenizer that splits words ("llama3", "qwen2", "tekken", ...; "spm") */
const char *tok_pre_name(const struct tok *t);
/* end of generation: EOS, EOT, EOM (<|eot_id|>, <|im_end|>, <end_of_turn>, ...) */
int tok_is_eog(const struct tok *t, int32_t id);
int tok_is_control(const struct tok *t, int32_t id);

/* text -> ids. add_bos: prepend BOS if the model wants one. parse_special:
 * "<|eot_id|>" in text becomes the control token (chat templates need it;
 * user text does not). writes up to cap ids; *n gets the full count, and
 * RKV_ETOOBIG is returned when cap was too small.
 * as llama.cpp: special texts match leftmost-longest; user-defined tokens
 * (token_type 4) match even without parse_special; the text between special
 * tokens is tokenized on its own (SPM: each piece gets the space prefix).
 * any bytes are accepted: invalid utf-8 goes through the byte-level mapping
 * (BPE) or byte fallback (SPM), so decoding gives the bytes back. thread-safe
 * (t is read-only). */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_bos, int parse_special,
               int32_t *ids, size_t cap, size_t *n);

/* bytes a token stands for (byte-fallback and byte-level tokens decoded;
 * control tokens give their text only when render_special). returns the
 * byte count (may exceed cap: then nothing useful is written) or <0. */
int tok_token_bytes(const struct tok *t, int32_t id, int render_special, char *buf, size_t cap);

/* incremental detokenizer: never emits a partial UTF-8 sequence; invalid
 * sequences come out as U+FFFD (one per maximal invalid subpart) once they
 * can no longer complete. control tokens render as nothing; SPM's unknown
 * token renders as U+FFFD. */
struct tok_detok {
    const struct tok *t;
    char pending[8];
    size_t n_pending;
    int first;             /* SPM: strip the leading space of the first piece */
};
/* first is set for SPM models (decoding a whole text, as sentencepiece
 * does); clear d->first when the tokens continue a prompt, so a completion's
 * "▁Paris" keeps its space. */
void tok_detok_init(struct tok_detok *d, const struct tok *t);
/* writes the complete text `id` adds to out (cap bytes); *n = bytes written.
 * RKV_ETOOBIG when the text does not fit in cap (callers give >= 64; a few
 * long pieces need 3x their length): nothing is consumed then, so the call
 * can be repeated with a larger buffer. */
int tok_detok_push(struct tok_detok *d, int32_t id, char *out, size_t cap, size_t *n);
/* flushes what is pending (as U+FFFD if incomplete) */
int tok_detok_flush(struct tok_detok *d, char *out, size_t cap, size_t *n);

/* chat templates */
/* chats render with the model's own Jinja template (tokenizer.chat_template,
 * parsed once by tok_load_gguf, or the one tok_chat_set_template gives).
 * without one, or when it does not parse (a warning names the error), they
 * render with a built-in family.
 * the family comes from tokenizer.chat_template (<|start_header_id|> ->
 * llama3, <|im_start|> -> chatml, [INST] -> llama2, <start_of_turn> ->
 * gemma), else from general.architecture (llama with an <|eot_id|> token ->
 * llama3, qwen2 or qwen3 -> chatml, gemma* -> gemma), else FALLBACK; tok_load_gguf logs the choice and why.
 * rendering follows the real templates; a leading BOS is never part of the
 * text when the model adds one (add_bos_token): pass add_bos=1 to
 * tok_encode, and BOS appears once (a template's own bos_token at the start
 * is dropped from the text for that reason).
 *   LLAMA3:   "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(CONTENT) +
 *             "<|eot_id|>" per message; the prompt is the assistant header
 *   CHATML:   "<|im_start|>ROLE\nCONTENT<|im_end|>\n"; prompt
 *             "<|im_start|>assistant\n". a template that inserts a literal
 *             default system message (qwen's) has it inserted here too when
 *             the conversation starts without one.
 *   LLAMA2:   "[INST] " + strip("<<SYS>>\nSYSTEM\n<</SYS>>\n\n" + USER) + " [/INST]"
 *             then " " + strip(ASSISTANT) + " </s>"; later user turns start
 *             with "<s>" (the bos text); no generation prefix.
 *   GEMMA:    "<start_of_turn>ROLE\n" + trim(CONTENT) + "<end_of_turn>\n", ROLE
 *             "model" for the assistant; a system message's content + "\n\n"
 *             opens the first turn after it; prompt "<start_of_turn>model\n".
 *   FALLBACK: "ROLE: CONTENT\n\n" per message; prompt "assistant:". */
enum tok_chat_kind {
    TOK_CHAT_LLAMA3 = 0,
    TOK_CHAT_CHATML,      /* qwen2 and others */
    TOK_CHAT_LLAMA2,      /* [INST] ... [/INST], mistral */
    TOK_CHAT_FALLBACK,    /* documented plain "role: content" fallback */
    TOK_CHAT_GEMMA,       /* <start_of_turn>user ... <end_of_turn>, gemma 3 */
};
struct tok_chat_msg {
    const char *role;    /* system | user | assistant | tool */
    const char *content; /* NULL renders as None */
    /* NULL, or a JSON object of the message's other keys (tool_calls, tool_call_id, name), in
     * the order the template sees them after role and content; only templates read it */
    const char *extra_json;
};
/* the built-in family (what chats render with when there is no template) */
enum tok_chat_kind tok_chat_kind(const struct tok *t);
const char *tok_chat_kind_name(enum tok_chat_kind k);
/* 1 when chats render with a Jinja template */
int tok_chat_has_template(const struct tok *t);
/* replaces the template with src (Jinja2, len bytes), as a --chat-template
 * file does. name prefixes errors: "NAME line 3, column 14: unknown filter
 * 'frobnicate'". on error the tokenizer is unchanged. not thread-safe: call
 * it before the tokenizer is shared. */
int tok_chat_set_template(struct tok *t, const char *src, size_t len, const char *name,
                          char *errbuf, size_t errlen);
/* renders msgs (+ the assistant prefix when add_generation_prompt) into a
 * malloc'd NUL-terminated string for tok_encode(add_bos=1, parse_special=1).
 * the template sees messages (role, content), add_generation_prompt,
 * bos_token and eos_token. errors: RKV_EFORMAT when the template fails
 * (raise_exception, a value it cannot use), RKV_EUNSUPPORTED, RKV_ETOOBIG
 * for a render past jinja's limits, RKV_ENOMEM; the message in errbuf
 * (may be NULL). thread-safe. */
int tok_chat_render(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                    int add_generation_prompt, char **out, char *errbuf, size_t errlen);
/* tok_chat_render with more template variables: vars_json (NULL for none) is a JSON object
 * whose keys become variables after the ones above (tools, enable_thinking, ...). without it
 * the template sees tools = None, as HF transformers passes it. */
int tok_chat_render_vars(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                         int add_generation_prompt, const char *vars_json, char **out, char *errbuf,
                         size_t errlen);
/* the Jinja source chats render with (NUL-terminated), NULL for a built-in family */
const char *tok_chat_template_src(const struct tok *t);
/* tok_chat_render without the message */
int tok_chat_apply(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                   int add_generation_prompt, char **out);

#endif
