/* tok_chat.c - chat templates: the model's Jinja template, else the llama3, chatml, llama2,
 * gemma or fallback family. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/jinja.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/tok_int.h"

static const char *const kind_names[] = {"llama3", "chatml", "llama2", "fallback", "gemma"};

const char *tok_chat_kind_name(enum tok_chat_kind k)
{
    return (unsigned)k < sizeof kind_names / sizeof *kind_names ? kind_names[k] : "unknown";
}

enum tok_chat_kind tok_chat_kind(const struct tok *t)
{
    return t->chat;
}

static int has(const char *s, size_t n, const char *needle)
{
    return s && memmem(s, n, needle, strlen(needle)) != NULL;
}

/* qwen-style chatml templates insert a default system message when the
 * conversation has none: find the literal '<|im_start|>system\n...<|im_end|>' */
static int chatml_default_system(struct tok *t, const char *s, size_t n)
{
    static const char open[] = "<|im_start|>system";
    const char *end = s + n, *p = s;
    while ((p = memmem(p, (size_t)(end - p), open, sizeof open - 1)) != NULL) {
        p += sizeof open - 1;
        const char *body = NULL;
        if (p < end && *p == '\n')
            body = p + 1;
        else if (end - p >= 2 && p[0] == '\\' && p[1] == 'n')
            body = p + 2;
        if (!body)
            continue;
        const char *close = memmem(body, (size_t)(end - body), "<|im_end|>", 10);
        if (!close)
            return 0;
        size_t len = (size_t)(close - body);
        /* only a plain literal: no jinja expression or string quote inside */
        if (!len || memchr(body, '\'', len) || memchr(body, '"', len) || memchr(body, '{', len))
            continue;
        char *d = malloc(len + 1);
        if (!d)
            return RKV_ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < len; i++) {
            if (body[i] == '\\' && i + 1 < len && body[i + 1] == 'n') {
                d[k++] = '\n';
                i++;
            } else {
                d[k++] = body[i];
            }
        }
        d[k] = 0;
        t->chat_default_system = d;
        return 0;
    }
    return 0;
}

int tok_chat_detect(struct tok *t, const char *tmpl, size_t n)
{
    const char *why;
    const char *arch = t->arch ? t->arch : "";
    if (has(tmpl, n, "<|start_header_id|>")) {
        t->chat = TOK_CHAT_LLAMA3;
        why = "tokenizer.chat_template uses <|start_header_id|>";
    } else if (has(tmpl, n, "<|im_start|>")) {
        t->chat = TOK_CHAT_CHATML;
        why = "tokenizer.chat_template uses <|im_start|>";
        int rc = chatml_default_system(t, tmpl, n);
        if (rc < 0)
            return rc;
    } else if (has(tmpl, n, "[INST]")) {
        t->chat = TOK_CHAT_LLAMA2;
        why = "tokenizer.chat_template uses [INST]";
    } else if (has(tmpl, n, "<start_of_turn>")) {
        t->chat = TOK_CHAT_GEMMA;
        why = "tokenizer.chat_template uses <start_of_turn>";
    } else if (!strncmp(arch, "gemma", 5)) {
        t->chat = TOK_CHAT_GEMMA;
        why = tmpl ? "template not recognised; architecture gemma"
                   : "no tokenizer.chat_template; architecture gemma";
    } else if (!strcmp(arch, "llama") && tok_find(t, "<|eot_id|>", 10) >= 0) {
        t->chat = TOK_CHAT_LLAMA3;
        why = tmpl ? "template not recognised; architecture llama with an <|eot_id|> token"
                   : "no tokenizer.chat_template; architecture llama with an <|eot_id|> token";
    } else if (!strcmp(arch, "qwen2") || !strcmp(arch, "qwen3")) {
        t->chat = TOK_CHAT_CHATML;
        why = tmpl ? "template not recognised; architecture qwen2 or qwen3"
                   : "no tokenizer.chat_template; architecture qwen2 or qwen3";
    } else {
        t->chat = TOK_CHAT_FALLBACK;
        why = tmpl ? "tokenizer.chat_template is not a family rkv renders (llama3, chatml, "
                     "llama2, gemma) and the architecture names none"
                   : "no tokenizer.chat_template and the architecture names no template";
    }
    log_info("chat template: %s (%s)", tok_chat_kind_name(t->chat), why);
    if (!tmpl)
        return 0;
    char err[512];
    int rc = tok_chat_set_template(t, tmpl, n, "tokenizer.chat_template", err, sizeof err);
    if (rc == RKV_ENOMEM)
        return rc;
    if (rc < 0)
        log_warn("%s; chats render with the built-in %s family instead", err,
                 tok_chat_kind_name(t->chat));
    else
        log_info("chat template: the model's own tokenizer.chat_template");
    return 0;
}

int tok_chat_has_template(const struct tok *t)
{
    return t && t->chat_tmpl != NULL;
}

int tok_chat_set_template(struct tok *t, const char *src, size_t len, const char *name,
                          char *errbuf, size_t errlen)
{
    if (!t || !src)
        return RKV_EINVAL;
    struct jinja_tmpl *j = NULL;
    int rc = jinja_parse(src, len, name, &j, errbuf, errlen);
    if (rc < 0)
        return rc;
    char *copy = strndup(src, len);
    if (!copy) {
        jinja_destroy(j);
        return RKV_ENOMEM;
    }
    jinja_destroy(t->chat_tmpl);
    free(t->chat_src);
    t->chat_tmpl = j;
    t->chat_src = copy;
    return 0;
}

const char *tok_chat_template_src(const struct tok *t)
{
    return t ? t->chat_src : NULL;
}

/* --- rendering ----------------------------------------------------------------- */

/* python's str.strip() for ascii whitespace, as the jinja templates apply */
static void sb_trimmed(struct strbuf *b, const char *s)
{
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r\v\f", s[0])) {
        s++;
        n--;
    }
    while (n && strchr(" \t\n\r\v\f", s[n - 1]))
        n--;
    strbuf_add(b, s, n);
}

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

static void render_llama3(struct strbuf *b, const struct tok_chat_msg *m, size_t n, int gen)
{
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(b, "<|start_header_id|>");
        strbuf_puts(b, str_or_empty(m[i].role));
        strbuf_puts(b, "<|end_header_id|>\n\n");
        sb_trimmed(b, str_or_empty(m[i].content));
        strbuf_puts(b, "<|eot_id|>");
    }
    if (gen)
        strbuf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_chatml(const struct tok *t, struct strbuf *b, const struct tok_chat_msg *m,
                          size_t n, int gen)
{
    int has_system = n > 0 && m[0].role && !strcmp(m[0].role, "system");
    if (t->chat_default_system && !has_system) {
        strbuf_puts(b, "<|im_start|>system\n");
        strbuf_puts(b, t->chat_default_system);
        strbuf_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(b, "<|im_start|>");
        strbuf_puts(b, str_or_empty(m[i].role));
        strbuf_puts(b, "\n");
        strbuf_puts(b, str_or_empty(m[i].content));
        strbuf_puts(b, "<|im_end|>\n");
    }
    if (gen)
        strbuf_puts(b, "<|im_start|>assistant\n");
}

static void render_llama2(const struct tok *t, struct strbuf *b, const struct tok_chat_msg *m,
                          size_t n)
{
    const char *sys = NULL;
    if (n > 0 && m[0].role && !strcmp(m[0].role, "system")) {
        sys = str_or_empty(m[0].content);
        m++;
        n--;
    }
    const char *bos = t->bos >= 0 ? tok_text(t, t->bos) : "";
    const char *eos = t->eos >= 0 ? tok_text(t, t->eos) : "";
    for (size_t i = 0; i < n; i++) {
        const char *content = str_or_empty(m[i].content);
        if (m[i].role && !strcmp(m[i].role, "assistant")) {
            strbuf_puts(b, " ");
            sb_trimmed(b, content);
            strbuf_puts(b, " ");
            strbuf_puts(b, eos);
            continue;
        }
        /* the first bos comes from tok_encode(add_bos), later ones are text */
        if (i > 0)
            strbuf_puts(b, bos);
        strbuf_puts(b, "[INST] ");
        if (i == 0 && sys) {
            struct strbuf c = {0};
            strbuf_puts(&c, "<<SYS>>\n");
            strbuf_puts(&c, sys);
            strbuf_puts(&c, "\n<</SYS>>\n\n");
            strbuf_puts(&c, content);
            if (c.err)
                b->err = c.err;
            else
                sb_trimmed(b, c.s);
            strbuf_fini(&c);
        } else {
            sb_trimmed(b, content);
        }
        strbuf_puts(b, " [/INST]");
    }
}

/* as gemma 3's template: a system message becomes the first turn's
 * preamble, the assistant is "model", every content is trimmed */
static void render_gemma(struct strbuf *b, const struct tok_chat_msg *m, size_t n, int gen)
{
    const char *sys = NULL;
    if (n > 0 && m[0].role && !strcmp(m[0].role, "system")) {
        sys = str_or_empty(m[0].content);
        m++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = str_or_empty(m[i].role);
        strbuf_puts(b, "<start_of_turn>");
        strbuf_puts(b, !strcmp(role, "assistant") ? "model" : role);
        strbuf_puts(b, "\n");
        if (i == 0 && sys) {
            strbuf_puts(b, sys);
            strbuf_puts(b, "\n\n");
        }
        sb_trimmed(b, str_or_empty(m[i].content));
        strbuf_puts(b, "<end_of_turn>\n");
    }
    if (gen)
        strbuf_puts(b, "<start_of_turn>model\n");
}

static void render_fallback(struct strbuf *b, const struct tok_chat_msg *m, size_t n, int gen)
{
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(b, str_or_empty(m[i].role));
        strbuf_puts(b, ": ");
        strbuf_puts(b, str_or_empty(m[i].content));
        strbuf_puts(b, "\n\n");
    }
    if (gen)
        strbuf_puts(b, "assistant:");
}

/* a special token's text for the template, "" when the model has none */
static struct jinja_val *token_text(struct jinja_ctx *c, const struct tok *t, int32_t id)
{
    char buf[256];
    int n = id >= 0 ? tok_token_bytes(t, id, 1, buf, sizeof buf) : 0;
    if (n < 0 || (size_t)n > sizeof buf)
        n = 0;
    return jinja_str(c, buf, (size_t)n);
}

static struct jinja_val *str_or_none(struct jinja_ctx *c, const char *s)
{
    return s ? jinja_str(c, s, strlen(s)) : jinja_none(c);
}

/* a message with keys beyond role and content: role, content, then extra's keys in order */
static int message_from_json(struct jinja_ctx *c, const struct tok_chat_msg *m,
                             struct jinja_val **out)
{
    cJSON *o = cJSON_Parse(m->extra_json);
    cJSON *d = cJSON_CreateObject();
    int rc = RKV_ENOMEM;
    if (o && !cJSON_IsObject(o))
        rc = RKV_EINVAL;
    else if (o && d &&
             cJSON_AddItemToObject(d, "role",
                                   m->role ? cJSON_CreateString(m->role) : cJSON_CreateNull()) &&
             cJSON_AddItemToObject(
                 d, "content", m->content ? cJSON_CreateString(m->content) : cJSON_CreateNull()))
        rc = 0;
    while (rc == 0 && o->child) {
        cJSON *item = cJSON_DetachItemFromArray(o, 0);
        if (!strcmp(item->string, "role") || !strcmp(item->string, "content"))
            cJSON_Delete(item);
        else if (!cJSON_AddItemToObject(d, item->string, item)) {
            cJSON_Delete(item);
            rc = RKV_ENOMEM;
        }
    }
    if (rc == 0)
        rc = jinja_from_cjson(c, d, out);
    cJSON_Delete(o);
    cJSON_Delete(d);
    return rc;
}

static int render_jinja(const struct tok *t, const struct tok_chat_msg *m, size_t n, int gen,
                        const char *vars_json, char **out, char *errbuf, size_t errlen)
{
    struct jinja_ctx *c = NULL;
    int rc = jinja_ctx_create(&c);
    if (rc < 0)
        return rc;
    struct jinja_val *list = jinja_list(c);
    for (size_t i = 0; list && i < n && rc == 0; i++) {
        struct jinja_val *d = NULL;
        if (m[i].extra_json) {
            rc = message_from_json(c, &m[i], &d);
        } else if ((d = jinja_dict(c)) == NULL) {
            rc = RKV_ENOMEM;
        } else if ((rc = jinja_dict_set(c, d, "role", str_or_none(c, m[i].role))) == 0) {
            rc = jinja_dict_set(c, d, "content", str_or_none(c, m[i].content));
        }
        if (rc == 0)
            rc = jinja_list_append(c, list, d);
    }
    struct jinja_val *bos = token_text(c, t, t->bos);
    if (rc == 0 && !list)
        rc = RKV_ENOMEM;
    if (rc == 0 && (rc = jinja_ctx_set(c, "messages", list)) == 0 &&
        (rc = jinja_ctx_set(c, "add_generation_prompt", jinja_bool(c, gen))) == 0 &&
        (rc = jinja_ctx_set(c, "bos_token", bos)) == 0 &&
        (rc = jinja_ctx_set(c, "eos_token", token_text(c, t, t->eos))) == 0)
        /* HF transformers always passes tools, None without any */
        rc = jinja_ctx_set(c, "tools", jinja_none(c));
    if (rc == 0 && vars_json)
        rc = jinja_ctx_set_json(c, vars_json, strlen(vars_json), errbuf, errlen);
    if (rc < 0) {
        jinja_ctx_destroy(c);
        return rc;
    }
    char *s = NULL;
    size_t len = 0;
    rc = jinja_render(t->chat_tmpl, c, NULL, &s, &len, errbuf, errlen);
    jinja_ctx_destroy(c);
    if (rc < 0)
        return rc;
    /* templates write bos_token themselves, and tok_encode(add_bos=1) adds
     * it again when the model wants one: drop the template's, so BOS comes
     * once, as the families render */
    char bt[256];
    int bn = t->add_bos && t->bos >= 0 ? tok_token_bytes(t, t->bos, 1, bt, sizeof bt) : 0;
    if (bn > 0 && (size_t)bn <= sizeof bt && len >= (size_t)bn && !memcmp(s, bt, (size_t)bn)) {
        memmove(s, s + bn, len - (size_t)bn + 1);
    }
    *out = s;
    return 0;
}

int tok_chat_apply(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                   int add_generation_prompt, char **out)
{
    return tok_chat_render(t, msgs, n_msgs, add_generation_prompt, out, NULL, 0);
}

int tok_chat_render(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                    int add_generation_prompt, char **out, char *errbuf, size_t errlen)
{
    return tok_chat_render_vars(t, msgs, n_msgs, add_generation_prompt, NULL, out, errbuf, errlen);
}

int tok_chat_render_vars(const struct tok *t, const struct tok_chat_msg *msgs, size_t n_msgs,
                         int add_generation_prompt, const char *vars_json, char **out, char *errbuf,
                         size_t errlen)
{
    if (errbuf && errlen)
        errbuf[0] = 0;
    if (!t || !out || (!msgs && n_msgs))
        return RKV_EINVAL;
    *out = NULL;
    if (t->chat_tmpl) {
        int rc =
            render_jinja(t, msgs, n_msgs, add_generation_prompt, vars_json, out, errbuf, errlen);
        if (rc < 0 && errbuf && errlen && !errbuf[0])
            snprintf(errbuf, errlen, "chat template: %s", rkv_strerror(rc));
        return rc;
    }
    struct strbuf b = {0};
    switch (t->chat) {
    case TOK_CHAT_LLAMA3: render_llama3(&b, msgs, n_msgs, add_generation_prompt); break;
    case TOK_CHAT_CHATML: render_chatml(t, &b, msgs, n_msgs, add_generation_prompt); break;
    case TOK_CHAT_LLAMA2: render_llama2(t, &b, msgs, n_msgs); break;
    case TOK_CHAT_GEMMA: render_gemma(&b, msgs, n_msgs, add_generation_prompt); break;
    default: render_fallback(&b, msgs, n_msgs, add_generation_prompt); break;
    }
    return strbuf_take(&b, out, NULL);
}
