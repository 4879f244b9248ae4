"""Tool calling through the real openai client against a real rkvd: the request fields' 400s, the
tools and tool messages rendered by each model family's own template exactly as Python's jinja2
renders it (POST /tokenize against rkv-tok on the jinja2 text), and answers parsed into
tool_calls, one-shot and streamed. A random-weight model writes no calls, so the answers come
from rkvd's test-only test_scripted_output (RKV_TEST_OUTPUT), which the output parser reads a
few characters at a time like a model's text."""
import datetime
import json
import os

import pytest

from conftest import TOP, Rkvd, _root, _stop_checked
from test_chat_template import special_texts, tok
from test_jinja import hf_env

openai = pytest.importorskip("openai")

TEMPLATES = TOP / "tests" / "data" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get-time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]

ASK = [{"role": "system", "content": "You help."},
       {"role": "user", "content": "Weather in Paris, naïve question?"}]
# one call, its answer, and the next question: every template takes a single call
ROUND = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc123XYZ", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc123XYZ", "content": "{\"temp\": 21}"},
    {"role": "user", "content": "And in Oslo?"}]


def client(srv, root=False):
    return openai.OpenAI(base_url=srv.url if root else srv.base_url, api_key="none",
                         max_retries=0, timeout=60)


def start(model, tmp_path_factory, template=None, script=None):
    """rkvd with a template (a name in tests/data/templates or a path), and with a scripted
    answer when script is given"""
    if isinstance(template, str):
        template = TEMPLATES / f"{template}.jinja"
    extra = ["--chat-template", str(template)] if template else []
    if script is not None:
        extra += ["--test-scripted-output", "true"]
    old = os.environ.get("RKV_TEST_OUTPUT")
    if script is not None:
        os.environ["RKV_TEST_OUTPUT"] = script
    try:
        return Rkvd(model, _root(tmp_path_factory, "tools"), extra).start()
    finally:
        os.environ.pop("RKV_TEST_OUTPUT", None)
        if old is not None:
            os.environ["RKV_TEST_OUTPUT"] = old


def bad(call):
    with pytest.raises(openai.BadRequestError) as e:
        call()
    return e.value.body


# --- rendering parity ------------------------------------------------------------------------


def for_template(messages):
    """the messages as rkv hands them to templates: null content as "", arguments parsed"""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if "tool_calls" in m:
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(
                c["function"]["arguments"]))) for c in m["tool_calls"]]
        out.append(m)
    return out


def reference_ids(model, template, messages, tools, **kwargs):
    """the ids of jinja2's rendering (HF transformers' environment), BOS once as rkv adds it"""
    env = hf_env()
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    bos, eos = special_texts(model)
    text = env.from_string((TEMPLATES / f"{template}.jinja").read_text()).render(
        messages=for_template(messages), tools=tools, add_generation_prompt=True,
        bos_token=bos, eos_token=eos, **kwargs)
    if text.startswith(bos):
        text = text[len(bos):]
    return json.loads(tok(model, "--file", "-", "--bos", "--special", data=text.encode())), text


@pytest.fixture(scope="module", params=["llama31", "qwen25", "qwen3", "mistral_v7"])
def templated(request, tiny_model, tmp_path_factory):
    srv = start(tiny_model, tmp_path_factory, request.param)
    yield request.param, srv
    _stop_checked(srv)


def rkv_ids(srv, messages, **body):
    r = client(srv, root=True).post("/tokenize", body=dict(messages=messages, **body),
                                    cast_to=object)
    return r["tokens"]


@pytest.mark.parametrize("messages", [ASK, ROUND], ids=["ask", "round-trip"])
def test_tools_render_as_jinja2(templated, tiny_model, messages):
    template, srv = templated
    want, text = reference_ids(tiny_model, template, messages, TOOLS)
    assert "get_weather" in text and "The weather in a city" in text
    assert rkv_ids(srv, messages, tools=TOOLS) == want
    # the chat endpoint prefills the same ids
    r = client(srv).chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                            max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == len(want)


def test_tool_messages_without_tools_render_as_jinja2(templated, tiny_model):
    template, srv = templated
    want, text = reference_ids(tiny_model, template, ROUND, None)
    assert "Paris" in text and "21" in text
    assert rkv_ids(srv, ROUND) == want


# --- request validation ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tiny_model, tmp_path_factory):
    srv = start(tiny_model, tmp_path_factory, "qwen25")
    yield srv
    _stop_checked(srv)


@pytest.mark.parametrize("body,param,words", [
    (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools[0].function.name",
     ["1 to 64 characters"]),
    (dict(tools=[WEATHER, WEATHER]), "tools[1].function.name", ["also tools[0]'s"]),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
     "tools[0].function.parameters", ["JSON schema object"]),
    (dict(tools=[{"type": "code_interpreter"}]), "tools[0].type", ["\"function\""]),
    (dict(tools=TOOLS, tool_choice="always"), "tool_choice", ["\"required\""]),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name", ["not one of the request's tools"]),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice", ["send one of them"]),
    (dict(tool_choice="required"), "tool_choice", ["needs tools"]),
    (dict(parallel_tool_calls="no"), "parallel_tool_calls", ["true or false"]),
    (dict(functions=[{"name": "f"}]), "functions", ["as tools"]),
    (dict(function_call={"name": "f"}), "function_call", ["tool_choice"]),
])
def test_bad_fields_are_400_naming_them(qwen, body, param, words):
    c = client(qwen)
    extra = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    kw = {k: v for k, v in body.items() if k in ("tools", "tool_choice")}
    err = bad(lambda: c.chat.completions.create(model="tiny", messages=ASK, max_tokens=1,
                                                extra_body=extra, **kw))
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err


@pytest.mark.parametrize("messages,param", [
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[0].tool_calls"),
    ([{"role": "tool", "content": "x", "tool_call_id": 7}], "messages[0].tool_call_id"),
])
def test_bad_messages_are_400_naming_them(qwen, messages, param):
    err = bad(lambda: client(qwen).chat.completions.create(model="tiny", messages=messages,
                                                           max_tokens=1))
    assert err["param"] == param, err


def test_template_without_tools_is_400_saying_how(rkvd):
    """the tiny model renders with a built-in family: no tool support"""
    err = bad(lambda: client(rkvd).chat.completions.create(model="tiny", messages=ASK,
                                                           tools=TOOLS, max_tokens=1))
    assert "no tool support" in err["message"] and "--chat-template" in err["message"], err
    # tool_choice none with no tools, and an empty list, are fine
    r = client(rkvd).chat.completions.create(model="tiny", messages=ASK, tools=[],
                                             tool_choice="none", max_tokens=1)
    assert r.choices[0].message.tool_calls is None


def test_tokenize_takes_tools(qwen, tiny_model):
    with_tools = rkv_ids(qwen, ASK, tools=TOOLS)
    assert len(with_tools) > len(rkv_ids(qwen, ASK)) + 20
    err = bad(lambda: client(qwen, root=True).post("/tokenize", body={"prompt": "x",
                                                                      "tools": TOOLS},
                                                   cast_to=object))
    assert err["param"] == "tools", err


# --- answers parsed into tool_calls --------------------------------------------------------------

HERMES = ('Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
          '"unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "get-time", "arguments": {}}\n'
          '</tool_call>')
CALLS = [("get_weather", {"city": "Paris", "unit": "C"}), ("get-time", {})]


def calls_of(tool_calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def stream(srv, max_tokens=2, **kw):
    """content, reasoning, the client-reassembled calls and the finish reason of a stream"""
    chunks = list(client(srv).chat.completions.create(model="tiny", messages=ASK,
                                                      max_tokens=max_tokens, stream=True, **kw))
    content = reasoning = ""
    calls = {}
    finish = None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                assert slot["id"] is None, "a call's id comes once"
                slot["id"] = tc.id
                assert tc.type == "function" and tc.function.arguments == ""
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


@pytest.fixture(scope="module")
def hermes(tiny_model, tmp_path_factory):
    srv = start(tiny_model, tmp_path_factory, "qwen25", HERMES)
    yield srv
    _stop_checked(srv)


def test_hermes_calls_one_shot(hermes):
    r = client(hermes).chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                               max_tokens=2)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content == "Checking both.\n"
    assert calls_of(ch.message.tool_calls) == CALLS
    ids = [c.id for c in ch.message.tool_calls]
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() for i in ids)
    assert len(set(ids)) == 2 and all(c.type == "function" for c in ch.message.tool_calls)


def test_hermes_calls_streamed(hermes):
    content, reasoning, calls, finish = stream(hermes, tools=TOOLS)
    assert content == "Checking both.\n" and reasoning == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == CALLS
    assert all(c["id"].startswith("call_") for c in calls)
    assert finish == "tool_calls"


def test_parallel_false_keeps_the_first_call(hermes):
    r = client(hermes).chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                               parallel_tool_calls=False, max_tokens=2)
    assert calls_of(r.choices[0].message.tool_calls) == CALLS[:1]
    _, _, calls, _ = stream(hermes, tools=TOOLS, parallel_tool_calls=False)
    assert [c["name"] for c in calls] == ["get_weather"]


def test_tool_choice_none_and_no_tools_leave_the_text(hermes):
    for kw in (dict(tools=TOOLS, tool_choice="none"), {}):
        r = client(hermes).chat.completions.create(model="tiny", messages=ASK, max_tokens=2,
                                                   **kw)
        assert r.choices[0].message.content == HERMES
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "stop"
        content, _, calls, finish = stream(hermes, **kw)
        assert (content, calls, finish) == (HERMES, [], "stop")


@pytest.mark.parametrize("template,script,content,calls", [
    ("llama31", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
     [("get_weather", {"city": "Oslo"})]),
    ("llama31", '{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
                '{"name": "get-time", "parameters": {}}', None,
     [("get_weather", {"city": "Oslo"}), ("get-time", {})]),
    ("llama31", "It is sunny.", "It is sunny.", []),
    ("mistral_v7", 'Let me see.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "Let me see.",
     [("get_weather", {"city": "Rome"})]),
    ("mistral_v7", '[TOOL_CALLS][{"name": "get-time", "arguments": {}}]', None,
     [("get-time", {})]),
    # looks like a call, does not parse: all of it is content
    ("qwen25", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", []),
    ("mistral_v7", "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]get weather[ARGS]{}", []),
])
def test_formats(tiny_model, tmp_path_factory, template, script, content, calls):
    srv = start(tiny_model, tmp_path_factory, template, script)
    try:
        r = client(srv).chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                max_tokens=2)
        m = r.choices[0].message
        assert m.content == content
        assert calls_of(m.tool_calls or []) == calls
        assert r.choices[0].finish_reason == ("tool_calls" if calls else "stop")
        s_content, _, s_calls, finish = stream(srv, tools=TOOLS)
        assert s_content == (content or "")
        assert [(c["name"], json.loads(c["arguments"])) for c in s_calls] == calls
        assert finish == r.choices[0].finish_reason
    finally:
        _stop_checked(srv)


def test_scripted_output_needs_its_variable(tiny_model, tmp_path_factory):
    srv = Rkvd(tiny_model, _root(tmp_path_factory, "tools"), ["--test-scripted-output", "true"])
    os.environ.pop("RKV_TEST_OUTPUT", None)
    with pytest.raises(Exception):
        srv.start(timeout=15)
    assert "RKV_TEST_OUTPUT" in srv.log()


# --- markers that are control tokens ------------------------------------------------------------

MARK = 506  # a token of the tiny model, made the control token [TOOL_CALLS]


@pytest.fixture(scope="module")
def marker_model(tiny_model, tmp_path_factory):
    """the tiny model whose token MARK is Mistral's control token [TOOL_CALLS]"""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    out = tmp_path_factory.mktemp("marker") / "marker.gguf"
    reader = gguf.GGUFReader(str(tiny_model), "r")
    toks = reader.get_field("tokenizer.ggml.tokens").contents()
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    merges = reader.get_field("tokenizer.ggml.merges").contents()
    old = toks[MARK]
    toks[MARK], types[MARK] = "[TOOL_CALLS]", 3
    arr, s, i32 = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32
    meta = {"tokenizer.ggml.tokens": MetadataDetails(arr, toks, sub_type=s),
            "tokenizer.ggml.token_type": MetadataDetails(arr, types, sub_type=i32),
            "tokenizer.ggml.merges": MetadataDetails(
                arr, [m for m in merges if m.replace(" ", "") != old], sub_type=s)}
    writer = gguf.GGUFWriter(str(out), arch=reader.get_field("general.architecture").contents(),
                             endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, meta, [])
    return out


def test_control_token_markers_reach_the_parser(marker_model, tmp_path_factory):
    """a control token renders as nothing, but a call marker that is one is the parser's: the
    model forced to write [TOOL_CALLS] three times (not a call) gets it back as content"""
    srv = start(marker_model, tmp_path_factory, "mistral_v7")
    try:
        c = client(srv)
        kw = dict(model="marker", messages=ASK, max_tokens=3, temperature=0,
                  logit_bias={str(MARK): 100})
        r = c.chat.completions.create(tools=TOOLS, **kw)
        assert r.choices[0].message.content == "[TOOL_CALLS]" * 3
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "length"
        for other in (dict(tools=TOOLS, tool_choice="none"), {}):
            r = c.chat.completions.create(**other, **kw)
            assert r.choices[0].message.content == ""
            assert r.usage.completion_tokens == 3
    finally:
        _stop_checked(srv)


def test_templates_without_tools_refuse_them(tiny_model, tmp_path_factory):
    """chatml, gemma3 and phi3 never read tools: a 400 naming the cure, plain chats still work"""
    for template in ("chatml", "gemma3", "phi3"):
        srv = start(tiny_model, tmp_path_factory, template)
        try:
            c = client(srv)
            err = bad(lambda: c.chat.completions.create(model="tiny", messages=ASK[1:],
                                                        tools=TOOLS, max_tokens=1))
            assert "no tool support" in err["message"], err
            r = c.chat.completions.create(model="tiny", messages=ASK[1:], max_tokens=1)
            assert r.choices[0].message.tool_calls is None
        finally:
            _stop_checked(srv)


# --- forced calls: the model's own tokens under a grammar ----------------------------------
jsonschema = pytest.importorskip("jsonschema")


# bounded arguments: a random-weight model's strings end where maxLength says
BOUNDED = [
    {"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                             "unit": {"enum": ["C", "F"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get-time", "parameters": {
            "type": "object", "properties": {"utc": {"type": "boolean"}},
            "additionalProperties": False}}}]


def forced(srv, tool_choice, n=1, stream_it=False, seed=1):
    """the calls of each choice of a random-weight model's answer under a forced tool_choice"""
    c = client(srv)
    kw = dict(model="tiny", messages=ASK, tools=BOUNDED, tool_choice=tool_choice, max_tokens=300,
              temperature=1.0, seed=seed, n=n)
    if not stream_it:
        r = c.chat.completions.create(**kw)
        return [(ch.finish_reason, ch.message.tool_calls or []) for ch in r.choices]
    content, _, calls, finish = stream(srv, **{k: v for k, v in kw.items()
                                               if k not in ("model", "messages", "n")})
    return content, calls, finish


def check_call(name, args):
    tool = {t["function"]["name"]: t for t in BOUNDED}[name]
    jsonschema.validate(args, tool["function"].get("parameters", {"type": "object"}))


@pytest.mark.parametrize("template", ["qwen25", "llama31", "mistral_v7"])
def test_required_and_named_calls_always_parse(tiny_model, tmp_path_factory, template):
    """tool_choice "required" / a named tool: the answer is a call of a listed tool whose
    arguments validate against its parameters, whatever the weights say"""
    srv = start(tiny_model, tmp_path_factory, template)
    try:
        for seed in range(4):
            for finish, calls in forced(srv, "required", n=2, seed=seed):
                assert finish == "tool_calls" and len(calls) == 1, (template, seed)
                check_call(calls[0].function.name, json.loads(calls[0].function.arguments))
            named = {"type": "function", "function": {"name": "get_weather"}}
            for finish, calls in forced(srv, named, seed=seed):
                assert finish == "tool_calls" and calls[0].function.name == "get_weather"
                check_call("get_weather", json.loads(calls[0].function.arguments))
    finally:
        _stop_checked(srv)


def test_required_call_streams(qwen):
    content, calls, finish = forced(qwen, "required", stream_it=True, seed=5)
    assert finish == "tool_calls" and len(calls) == 1 and content == ""
    check_call(calls[0]["name"], json.loads(calls[0]["arguments"]))


def test_tool_loop_through_a_session(tiny_model, tmp_path_factory):
    """an agent's loop: five turns of forced calls and tool answers in one session; each turn's
    prompt is the last one plus what is new, and only that is prefilled (the rest is the
    session's KV: usage's cached_tokens)"""
    srv = start(tiny_model, tmp_path_factory, "qwen25")
    try:
        c = client(srv)
        msgs = list(ASK)
        last_prompt = 0
        for turn in range(5):
            r = c.chat.completions.create(
                model="tiny", messages=msgs, tools=BOUNDED, max_tokens=200, seed=turn,
                tool_choice="required" if turn < 4 else "none", temperature=1.0,
                extra_body={"session_id": "agent-loop"})
            ch = r.choices[0]
            u = r.usage
            cached = (u.prompt_tokens_details.cached_tokens
                      if u.prompt_tokens_details else 0) or 0
            if turn:
                # the previous prompt and answer are in the session: at most the new
                # messages and the template's wrapping are prefilled
                assert cached >= last_prompt, (turn, cached, last_prompt)
            last_prompt = u.prompt_tokens
            if turn == 4:
                assert ch.finish_reason in ("stop", "length") and not ch.message.tool_calls
                break
            assert ch.finish_reason == "tool_calls", turn
            call = ch.message.tool_calls[0]
            check_call(call.function.name, json.loads(call.function.arguments))
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": call.function.arguments}}]})
            msgs.append({"role": "tool", "tool_call_id": call.id,
                         "content": json.dumps({"turn": turn, "ok": True})})
    finally:
        _stop_checked(srv)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_logprobs_are_the_one_shot_ones(qwen, tool_choice):
    """through the output parser, which holds text back (a "<" may start <tool_call>), a
    stream's chunks carry the logprobs of every token, in order, as the one-shot answer
    lists them: a call's tokens and text released late included"""
    c = client(qwen)
    kw = dict(model="tiny", messages=ASK, tools=BOUNDED, tool_choice=tool_choice, max_tokens=40,
              temperature=0, logprobs=True, top_logprobs=2)
    one = c.chat.completions.create(**kw).choices[0].logprobs.content
    got = []
    for chunk in c.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                got += ch.logprobs.content
    assert len(one) > 0
    assert [(t.token, t.logprob) for t in got] == [(t.token, t.logprob) for t in one]
    assert [[a.token for a in t.top_logprobs] for t in got] == \
        [[a.token for a in t.top_logprobs] for t in one]
