"""The OpenAI/vLLM surface beyond generation, through the openai client: GET /v1/models/{id},
POST /tokenize and POST /detokenize (vLLM's shapes), against the real daemon and the
tokenizer's reference ids.
"""

import json

import pytest

openai = pytest.importorskip("openai")


def client(rkvd, root=False):
    return openai.OpenAI(base_url=rkvd.url if root else rkvd.base_url, api_key="none",
                         max_retries=0, timeout=60)


def model_name(rkvd):
    return client(rkvd).models.list().data[0].id


def post(rkvd, path, body):
    """the JSON answer of POST path (outside /v1/, as vLLM serves it) through the client"""
    return client(rkvd, root=True).post(path, body=body, cast_to=object)


def bad_request(rkvd, path, body):
    with pytest.raises(openai.BadRequestError) as e:
        post(rkvd, path, body)
    return e.value.body


def test_model_by_id(rkvd):
    c = client(rkvd)
    name = model_name(rkvd)
    m = c.models.retrieve(name)
    assert (m.id, m.object, m.owned_by) == (name, "model", "rkv")
    listed = c.models.list().data[0]
    assert m.created == listed.created
    assert m.model_extra["max_model_len"] == listed.model_extra["max_model_len"]
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"
    assert "no-such-model" in e.value.body["message"]
    st, _, _ = rkvd.request("POST", f"/v1/models/{name}", {})
    assert st == 405


def test_tokenize_prompt(rkvd, ref):
    name = model_name(rkvd)
    text = "The quick brown fox"
    r = post(rkvd, "/tokenize", {"model": name, "prompt": text})
    assert r["tokens"] == list(ref.tokens(text))
    assert r["count"] == len(r["tokens"])
    assert r["max_model_len"] == client(rkvd).models.retrieve(name).model_extra["max_model_len"]
    # the same ids /v1/completions prefills
    done = client(rkvd).completions.create(model=name, prompt=text, max_tokens=1)
    assert done.usage.prompt_tokens == r["count"]
    # a token-id prompt comes back as it went in; no model means the served one
    ids = list(ref.tokens("hello world"))
    assert post(rkvd, "/tokenize", {"prompt": ids})["tokens"] == ids


def test_tokenize_messages(rkvd, ref):
    name = model_name(rkvd)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = post(rkvd, "/tokenize", {"model": name, "messages": msgs})
    assert r["tokens"] == list(ref.chat_ids(json.dumps(msgs)))
    done = client(rkvd).chat.completions.create(model=name, messages=msgs, max_tokens=1)
    assert done.usage.prompt_tokens == r["count"]
    # without the assistant's prefix the prompt is a strict prefix of the one with it
    bare = post(rkvd, "/tokenize", {"model": name, "messages": msgs,
                                    "add_generation_prompt": False})
    assert bare["count"] < r["count"]
    assert r["tokens"][:bare["count"]] == bare["tokens"]


def test_prompt_text_reads_control_tokens(rkvd):
    """a completion's text prompt reads control tokens written out as those tokens, as vLLM
    and llama.cpp's server do: the chat template's text written by hand prefills what chat
    does, with one BOS though the text starts with it and the model adds one"""
    name = model_name(rkvd)
    msgs = [{"role": "user", "content": "Hi there"}]
    chat = post(rkvd, "/tokenize", {"model": name, "messages": msgs})["tokens"]
    text = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    r = post(rkvd, "/tokenize", {"model": name, "prompt": text})
    assert r["tokens"] == chat
    bos = chat[0]
    assert r["tokens"].count(bos) == 1
    done = client(rkvd).completions.create(model=name, prompt=text, max_tokens=1)
    assert done.usage.prompt_tokens == len(chat)
    # without the BOS text the model's own BOS still leads
    assert post(rkvd, "/tokenize", {"model": name, "prompt": text[len("<|begin_of_text|>"):]}
                )["tokens"] == chat


def test_detokenize_round_trip(rkvd, ref):
    name = model_name(rkvd)
    for text in ["The quick brown fox", "naïve café — ünïcode ✓", "  two  spaces"]:
        ids = post(rkvd, "/tokenize", {"model": name, "prompt": text})["tokens"]
        assert post(rkvd, "/detokenize", {"model": name, "tokens": ids}) == {"prompt": text}
    assert post(rkvd, "/detokenize", {"model": name, "tokens": []}) == {"prompt": ""}


def test_tokenize_errors(rkvd):
    name = model_name(rkvd)
    e = bad_request(rkvd, "/tokenize", {"model": name})
    assert e["param"] == "prompt"
    e = bad_request(rkvd, "/tokenize", {"model": name, "prompt": "x", "messages": []})
    assert e["param"] == "prompt" and "not both" in e["message"]
    e = bad_request(rkvd, "/tokenize", {"prompt": "x", "add_generation_prompt": False})
    assert e["param"] == "add_generation_prompt"
    e = bad_request(rkvd, "/tokenize", {"prompt": "x", "max_tokens": 3})
    assert e["param"] == "max_tokens" and "unknown field" in e["message"]
    e = bad_request(rkvd, "/detokenize", {"model": name})
    assert e["param"] == "tokens"
    e = bad_request(rkvd, "/detokenize", {"tokens": "abc"})
    assert e["param"] == "tokens"
    e = bad_request(rkvd, "/detokenize", {"tokens": [1, 10**9]})
    assert e["param"] == "tokens[1]" and "token id" in e["message"]
    with pytest.raises(openai.NotFoundError) as nf:
        post(rkvd, "/detokenize", {"model": "nope", "tokens": [1]})
    assert nf.value.body["code"] == "model_not_found"
    st, hdr, _ = rkvd.request("GET", "/tokenize")
    assert st == 405 and hdr["allow"] == "POST"


def test_echo(rkvd, ref):
    """echo: the prompt's text, then the completion, streamed and not; token-id prompts read
    back as /detokenize reads them"""
    c = client(rkvd)
    name = model_name(rkvd)
    text = "Once upon a time"
    plain = c.completions.create(model=name, prompt=text, max_tokens=6, temperature=0)
    echoed = c.completions.create(model=name, prompt=text, max_tokens=6, temperature=0,
                                  echo=True)
    assert echoed.choices[0].text == text + plain.choices[0].text
    assert echoed.usage == plain.usage
    chunks = list(c.completions.create(model=name, prompt=text, max_tokens=6, temperature=0,
                                       echo=True, stream=True))
    assert chunks[0].choices[0].text.startswith(text)
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == echoed.choices[0].text
    ids = list(ref.tokens(text))
    by_ids = c.completions.create(model=name, prompt=ids, max_tokens=6, temperature=0,
                                  echo=True)
    assert by_ids.choices[0].text == echoed.choices[0].text
    # a stop at once still echoes, in the stream's first chunk too
    first = plain.choices[0].text[:1]
    if first.strip():
        stopped = list(c.completions.create(model=name, prompt=text, max_tokens=6,
                                            temperature=0, echo=True, stream=True,
                                            stop=[first]))
        assert "".join(ch.choices[0].text for ch in stopped if ch.choices) == text
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=name, prompt=text, max_tokens=2, echo=True, logprobs=1)
    assert e.value.body["param"] == "echo"
