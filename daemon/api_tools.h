/* api_tools.h - OpenAI tool calling and reasoning content for chat: the request fields, the
 * template variables they become, and the parser that splits a model's output into content,
 * reasoning_content and tool_calls (one-shot and streaming). */
#ifndef RKV_API_TOOLS_H
#define RKV_API_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/strbuf.h"

struct cJSON;
struct api_request;
struct api_message;
struct api_error;
struct tok;

#define API_TOOLS_MAX     128 /* tools in one request */
#define API_TOOL_NAME_MAX 64  /* bytes in a tool's name, [a-zA-Z0-9_-] */
#define API_TOOL_ID_LEN   29  /* "call_" + 24 alphanumerics */

/* how a template's model writes its calls (api_tools_detect reads the template text):
 *   HERMES:  <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, several in a row
 *            (Hermes, Qwen 2.5, Qwen 3)
 *   LLAMA3:  {"name": N, "parameters": {...}} at the start of the output, optionally after
 *            <|python_tag|>, several separated by ';' (Llama 3.1, 3.2, 3.3)
 *   MISTRAL: [TOOL_CALLS][{"name": N, "arguments": {...}}, ...], or the v7/v11 form
 *            [TOOL_CALLS]N[ARGS]{...} (with an optional [CALL_ID]id before [ARGS]) */
enum api_tool_format {
    API_TOOL_FMT_NONE = 0, /* the template writes no tool calls rkv knows */
    API_TOOL_FMT_HERMES,
    API_TOOL_FMT_LLAMA3,
    API_TOOL_FMT_MISTRAL,
};
const char *api_tool_format_name(enum api_tool_format f);

enum api_tool_choice {
    API_TOOL_CHOICE_AUTO = 0, /* the model decides (the default with tools) */
    API_TOOL_CHOICE_NONE,     /* tools rendered, the output never parsed as calls */
    API_TOOL_CHOICE_REQUIRED, /* at least one call (needs constrained decoding) */
    API_TOOL_CHOICE_NAMED,    /* a call of one named tool (needs constrained decoding) */
};

/* the tool and reasoning part of a chat request (api_request.tools) */
struct api_tools {
    char *tools_json; /* the validated "tools" array, NULL when none */
    char **names;     /* (n_tools) each tool's function name */
    size_t n_tools;
    enum api_tool_choice choice;
    char *choice_name;      /* NAMED: the tool */
    bool parallel;          /* parallel_tool_calls (default true): false keeps the first call */
    char *kwargs_json;      /* chat_template_kwargs, a JSON object; NULL when none */
    char *reasoning_effort; /* "low" | "medium" | "high", NULL when none */
    /* set when the prompt renders (api_tools_render): what the output parser does */
    enum api_tool_format format;
    bool parse_calls;         /* tools given, choice not none, a known format */
    bool reasoning;           /* the template writes <think>...</think> */
    bool starts_in_reasoning; /* the prompt ends inside an open <think> */
};

/* the chat request's tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
 * reasoning_effort, functions and function_call: fills r->tools (always, for chat), or
 * RKV_EINVAL with err naming the field (400), RKV_ENOMEM */
int api_tools_parse(const struct cJSON *root, struct api_request *r, struct api_error *err);
/* one message's tool_calls (assistant) and tool_call_id / name: m->extra_json gets the JSON
 * object the template sees beside role and content (tool_calls with arguments parsed into an
 * object, as vLLM hands them to templates), NULL when there is none. param: "messages[3]" */
int api_tools_parse_message(const struct cJSON *mo, const char *param, struct api_message *m,
                            struct api_error *err);
void api_tools_free(struct api_tools *t);

/* renders a chat request's prompt with the model's template: messages with their tool
 * fields, tools, chat_template_kwargs and reasoning_effort as template variables; then sets
 * the parser fields of r->tools from the template text and the prompt. 0 with *text
 * (malloc'd), or negative with *status (400: the client's to fix, 500) and why filled. */
int api_tools_render(const struct tok *t, const struct api_request *r, char **text, int *status,
                     char *why, size_t whylen);

/* the call format a chat template's text implies */
enum api_tool_format api_tools_detect(const char *tmpl);

/* constrained decoding of tool_choice "required" or a named tool: the text the model must
 * write first (prefix), the JSON schema of the call object that follows (schema, malloc'd)
 * and the text after it (suffix). RKV_EINVAL when the choice is auto/none or the format has
 * no constraint. */
struct api_tool_constraint {
    const char *prefix;
    char *schema;
    const char *suffix;
};
int api_tools_constraint(const struct api_tools *t, struct api_tool_constraint *out);
/* 1 when tool_choice forces a call ("required" or a named tool, with tools) */
int api_tools_forces_call(const struct api_tools *t);

/* 1 when a control token whose text is s[0..n) is markup this request's output parser reads
 * (the format's call markers, <think> and </think>): the scheduler then puts its text in the
 * answer, where control tokens otherwise render as nothing (Mistral's [TOOL_CALLS], Llama's
 * <|python_tag|> are control tokens) */
int api_tools_keeps_token(const struct api_tools *t, const char *s, size_t n);

/* --- output parsing ----------------------------------------------------------------------- */

enum api_tev_kind {
    API_TEV_CONTENT,   /* text: content */
    API_TEV_REASONING, /* text: reasoning_content */
    API_TEV_CALL,      /* a complete tool call */
};
struct api_tev {
    enum api_tev_kind kind;
    const char *text; /* CONTENT, REASONING */
    size_t len;
    int index;             /* CALL: 0, 1, ... */
    const char *id;        /* CALL: "call_..." */
    const char *name;      /* CALL */
    const char *arguments; /* CALL: a JSON object as text */
};
/* an event's consumer: 0, or negative to stop the parser (returned by feed/finish) */
typedef int (*api_tev_fn)(void *ud, const struct api_tev *ev);

struct api_tparse;
/* a parser for one output; from the fields api_tools_render set (t may be NULL: text is
 * content). text outside calls is content; a call that does not parse stays content */
int api_tparse_create(const struct api_tools *t, struct api_tparse **out);
void api_tparse_destroy(struct api_tparse *p);
/* text as it comes (whole UTF-8 characters or not; any split): events for what is decided.
 * text that may still start a marker is held until the next feed or finish */
int api_tparse_feed(struct api_tparse *p, const char *text, size_t len, api_tev_fn fn, void *ud);
/* the end of the output: events for everything held */
int api_tparse_finish(struct api_tparse *p, api_tev_fn fn, void *ud);
/* calls emitted so far */
int api_tparse_calls(const struct api_tparse *p);

/* a whole output, collected (non-stream answers): an api_tev_fn with a struct api_tout ud */
struct api_tout {
    struct strbuf content, reasoning;
    struct cJSON *calls; /* the message's tool_calls, NULL until one */
};
int api_tout_collect(void *ud, const struct api_tev *ev);
void api_tout_fini(struct api_tout *o);
/* fills a chat message: content (null when empty beside calls or reasoning), reasoning_content
 * when there is some, tool_calls when there are calls */
int api_tout_message(const struct api_tout *o, struct cJSON *message);
/* a stream's delta object for ev (REASONING or CALL; part 0: the call's head with its id, type,
 * name and arguments "", part 1: its arguments), NULL when out of memory */
struct cJSON *api_tev_delta(const struct api_tev *ev, int part);

/* "call_" + 24 random alphanumerics into buf (>= API_TOOL_ID_LEN + 1 bytes) */
void api_tools_call_id(char *buf, size_t cap);

#endif
