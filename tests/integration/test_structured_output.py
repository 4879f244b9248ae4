"""Structured output through the openai client: response_format json_object and json_schema on
/v1/chat/completions and /v1/completions. The tests' model has random weights, so nothing but
the grammar's token masks makes its answers JSON: every answer must parse and validate against
its schema (the jsonschema package), streamed or not, and schemas rkv cannot follow are a 400
naming the keyword."""

import concurrent.futures as cf
import json

import pytest

openai = pytest.importorskip("openai")
import jsonschema  # noqa: E402  (scripts/deps.sh installs it)

MSGS = [{"role": "user", "content": "Give me a JSON answer."}]
PROMPT = "JSON:"

# bounded strings, arrays and numbers: a random model's answer ends within max_tokens
S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": S}, "required": ["name"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "why": S},
     "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"]},
    {"type": "object", "properties": {"v": {"const": "fixed"}, "n": {"type": "null"}},
     "required": ["v", "n"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1,
                                               "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -5, "maximum": 5},
        "y": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["x", "y"]}},
     "required": ["p"]},
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0,
                                                        "maximum": 1000}, S]}},
     "required": ["id"]},
    {"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [
        {"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}],
        "items": False}}, "required": ["pair"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
     "maxItems": 4},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                             "maximum": 9}},
                      "required": ["x"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
     "required": ["a", "b"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
     "required": ["code"]},
    {"type": "object", "properties": {"k": {"type": "string", "minLength": 2, "maxLength": 4}},
     "required": ["k"]},
    {"type": "object", "properties": {"opt1": S, "opt2": {"type": "boolean"},
                                      "req": {"enum": [1, 2, 3]}}, "required": ["req"],
     "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"oneOf": [{"const": "a"}, {"const": "b"}]}},
     "required": ["kind"]},
    {"type": "object", "properties": {"m": {"type": ["string", "null"], "maxLength": 6}},
     "required": ["m"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
               {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    {"type": "object", "properties": {"rows": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"n": S, "v": {"type": "integer", "minimum": 0,
                                                       "maximum": 50}},
        "required": ["n", "v"], "additionalProperties": False}}}, "required": ["rows"]},
    {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
        "required": ["v", "next"], "additionalProperties": False}},
     "$ref": "#/$defs/node"},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"}},
     "required": ["day"]},
    {"type": "string", "enum": ["yes", "no"]},
]

MAX_TOKENS = 400


def client(rkvd):
    return openai.OpenAI(base_url=rkvd.base_url, api_key="none", max_retries=0, timeout=300)


def model(c):
    return c.models.list().data[0].id


def schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                    "strict": True}}


def generate(rkvd, endpoint, fmt, seed, stream=False, temperature=1.0):
    """(text, finish_reason) of one answer"""
    c = client(rkvd)
    kw = dict(model=model(c), seed=seed, temperature=temperature, max_tokens=MAX_TOKENS)
    if endpoint == "chat":
        kw["response_format"] = fmt
    else:
        kw["extra_body"] = {"response_format": fmt}  # the client's completions lack the field
    if endpoint == "chat":
        if not stream:
            ch = c.chat.completions.create(messages=MSGS, **kw).choices[0]
            return ch.message.content, ch.finish_reason
        text, fin = "", None
        for ch in c.chat.completions.create(messages=MSGS, stream=True, **kw):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                fin = ch.choices[0].finish_reason or fin
        return text, fin
    if not stream:
        ch = c.completions.create(prompt=PROMPT, **kw).choices[0]
        return ch.text, ch.finish_reason
    text, fin = "", None
    for ch in c.completions.create(prompt=PROMPT, stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
    return text, fin


def check(text, fin, schema, what):
    assert fin == "stop", f"{what}: finished by {fin}: {text!r}"
    try:
        doc = json.loads(text)
    except ValueError as e:
        pytest.fail(f"{what}: not JSON ({e}): {text!r}")
    if schema is not None:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            pytest.fail(f"{what}: {text!r} does not validate: {e.message}")
    return doc


def test_every_answer_follows_its_schema(rkvd):
    """20 schemas x 10 answers, chat and completions, streamed and not, sampled at T=1"""
    jobs = []
    for i, schema in enumerate(SCHEMAS):
        jsonschema.Draft202012Validator.check_schema(schema)
        for k in range(10):
            jobs.append((i, schema, "chat" if k % 2 else "completions", 1000 * i + k, k % 3 == 0))
    assert len(SCHEMAS) >= 20 and len(jobs) >= 200
    with cf.ThreadPoolExecutor(8) as ex:
        futs = {ex.submit(generate, rkvd, ep, schema_format(schema), seed, stream): (i, ep, seed)
                for i, schema, ep, seed, stream in jobs}
        for f in cf.as_completed(futs):
            i, ep, seed = futs[f]
            text, fin = f.result()
            check(text, fin, SCHEMAS[i], f"schema {i} {ep} seed {seed}")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_json_object_mode(rkvd, endpoint, stream):
    for seed in range(4):
        text, fin = generate(rkvd, endpoint, {"type": "json_object"}, seed, stream)
        assert isinstance(check(text, fin, None, f"json_object seed {seed}"), dict)


def test_greedy_is_reproducible_and_streaming_agrees(rkvd):
    fmt = schema_format(SCHEMAS[6])
    a = generate(rkvd, "chat", fmt, 1, temperature=0)
    b = generate(rkvd, "chat", fmt, 2, temperature=0, stream=True)
    assert a == b
    check(*a, SCHEMAS[6], "greedy")


def test_seeded_answers_repeat(rkvd):
    fmt = schema_format(SCHEMAS[17])
    assert generate(rkvd, "completions", fmt, 5) == generate(rkvd, "completions", fmt, 5)


def test_pydantic_parse(rkvd):
    pydantic = pytest.importorskip("pydantic")

    class Step(pydantic.BaseModel):
        explanation: str = pydantic.Field(max_length=10)
        output: int = pydantic.Field(ge=0, le=100)

    class Answer(pydantic.BaseModel):
        steps: list[Step] = pydantic.Field(max_length=2)
        final: bool

    c = client(rkvd)
    r = c.beta.chat.completions.parse(model=model(c), messages=MSGS, response_format=Answer,
                                      max_tokens=MAX_TOKENS, seed=3)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(msg.parsed, Answer), msg.content


def test_session_turns_keep_their_own_format(rkvd):
    """a session's second turn with another (or no) format: the grammar belongs to a request"""
    c = client(rkvd)
    first = c.chat.completions.create(model=model(c), messages=MSGS, max_tokens=MAX_TOKENS,
                                      response_format=schema_format(SCHEMAS[3]), seed=1,
                                      extra_body={"session_id": "so-turns"})
    check(first.choices[0].message.content, first.choices[0].finish_reason, SCHEMAS[3], "turn 1")
    msgs = MSGS + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "Again."}]
    second = c.chat.completions.create(model=model(c), messages=msgs, max_tokens=MAX_TOKENS,
                                       response_format=schema_format(SCHEMAS[1]), seed=2,
                                       extra_body={"session_id": "so-turns"})
    check(second.choices[0].message.content, second.choices[0].finish_reason, SCHEMAS[1],
          "turn 2")
    third = c.chat.completions.create(model=model(c), messages=msgs, max_tokens=5, seed=2,
                                      extra_body={"session_id": "so-turns"})
    assert third.choices[0].finish_reason in ("stop", "length")


def bad_request(rkvd, endpoint="chat", **kw):
    c = client(rkvd)
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "chat":
            c.chat.completions.create(model=model(c), messages=MSGS, max_tokens=4, **kw)
        else:
            kw["extra_body"] = {**kw.get("extra_body", {}),
                                "response_format": kw.pop("response_format")}
            c.completions.create(model=model(c), prompt=PROMPT, max_tokens=4, **kw)
    err = e.value.body
    return err.get("param"), err.get("message")


def test_bad_formats_are_400s_naming_the_field(rkvd):
    param, msg = bad_request(rkvd, response_format={"type": "xml"})
    assert param == "response_format.type" and "json_schema" in msg
    param, msg = bad_request(rkvd, response_format=schema_format(
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}}))
    assert param == "response_format.json_schema.schema" and "patternProperties" in msg
    param, msg = bad_request(rkvd, endpoint="completions",
                             response_format={"type": "json_schema",
                                              "json_schema": {"schema": {"type": "object"}}})
    assert param == "response_format.json_schema.name"
    param, msg = bad_request(rkvd, response_format={"type": "json_schema",
                                                    "json_schema": {"name": "x",
                                                                    "schema": "object"}})
    assert param == "response_format.json_schema.schema"
    param, msg = bad_request(rkvd, response_format={"type": "json_object", "schema": {}})
    assert param == "response_format" and "'schema'" in msg
    param, msg = bad_request(rkvd, response_format={"type": "json_object"},
                             extra_body={"ignore_eos": True})
    assert param == "ignore_eos"
    param, msg = bad_request(rkvd, response_format=schema_format(
        {"$ref": "#/$defs/missing"}))
    assert param == "response_format.json_schema.schema" and "missing" in msg
    # the server still answers afterwards
    text, fin = generate(rkvd, "chat", {"type": "text"}, 1)
    assert fin in ("stop", "length")


def test_every_choice_follows_the_schema(rkvd):
    """n choices share the prompt's KV; each samples under its own copy of the grammar"""
    c = client(rkvd)
    schema = SCHEMAS[5]
    r = c.chat.completions.create(model=model(c), messages=MSGS, n=4, seed=11, temperature=1.0,
                                  max_tokens=MAX_TOKENS, response_format=schema_format(schema))
    assert len(r.choices) == 4
    texts = set()
    for ch in r.choices:
        check(ch.message.content, ch.finish_reason, schema, f"choice {ch.index}")
        texts.add(ch.message.content)
    assert len(texts) > 1  # sampled at T=1 with seeds derived per choice


LONG = schema_format({"type": "array", "minItems": 1000, "items": {"type": "string"}})


def long_stream(srv, kill_after=None):
    """a seeded completion under a grammar that cannot end within max_tokens; with kill_after,
    the worker is SIGKILLed once that many chunks arrived"""
    import os
    import signal
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    text, n, fin = "", 0, None
    for ch in c.completions.create(model=model(c), prompt=PROMPT, max_tokens=200, seed=9,
                                   temperature=1.0, stream=True,
                                   extra_body={"response_format": LONG}):
        if ch.choices:
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
            n += 1
            if n == kill_after:
                os.kill(srv.child_pid("rkv-worker"), signal.SIGKILL)
    return text, fin


def test_a_restarted_worker_goes_on_inside_the_grammar(rkvd_factory):
    """the rebuilt sampler replays the answer so far into its grammar: the same text as an
    uninterrupted run, still a prefix the schema allows"""
    srv = rkvd_factory()
    want = long_stream(srv)
    assert want[1] == "length" and want[0].startswith("[")
    restarts = srv.metric("rkv:worker_restarts_total")
    got = long_stream(srv, kill_after=20)
    assert srv.metric("rkv:worker_restarts_total") == restarts + 1, "no restart mid-stream"
    assert got == want
