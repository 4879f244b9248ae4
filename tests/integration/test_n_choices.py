"""Several sequences in one request against a real rkvd (CPU backend, tiny model) with the real
openai client: n choices (streamed and not), seeds that reproduce them, the prompt prefilled
once and its full KV blocks shared by the other choices, best_of, prompt lists of each shape,
suffix (fill in the middle) with and without FIM tokens, and the 400s that name the field."""
import json
import math

import pytest

from conftest import Ref, Rkvd, _root, _stop_checked, rkv_bin

openai = pytest.importorskip("openai")

BLOCK = 16
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3 + "Then it"


def client(srv, key="none"):
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=120)


def texts(r):
    return [c.text for c in sorted(r.choices, key=lambda c: c.index)]


def sampled(c, prompt=PROMPT, **kw):
    args = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0, ignore_eos=True)
    args.update(kw)
    extra = {"ignore_eos": args.pop("ignore_eos")}
    return c.completions.create(**args, extra_body=extra)


def test_n_choices_and_seeds(rkvd, ref):
    c = client(rkvd)
    r = sampled(c, n=4, seed=7)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert all(ch.finish_reason == "length" for ch in r.choices)
    # the prompt once, every choice's tokens
    assert r.usage.prompt_tokens == len(ref.tokens(PROMPT))
    assert r.usage.completion_tokens == 4 * 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 32
    # the same seed gives the same four choices, and they are not all the same
    again = sampled(c, n=4, seed=7)
    assert texts(again) == texts(r)
    assert len(set(texts(r))) > 1, texts(r)
    # choice 0 samples with the request's seed: as n = 1 does
    assert texts(sampled(c, n=1, seed=7)) == texts(r)[:1]
    # another seed, other choices; without a seed they differ from each other
    assert texts(sampled(c, n=4, seed=8)) != texts(r)
    free = texts(sampled(c, n=4))
    assert len(set(free)) > 1, free


def test_n_streamed_matches_non_stream(rkvd):
    c = client(rkvd)
    want = texts(sampled(c, n=4, seed=11))
    got = ["", "", "", ""]
    finish = [None] * 4
    usage = None
    for chunk in sampled(c, n=4, seed=11, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            got[ch.index] += ch.text
            if ch.finish_reason:
                assert finish[ch.index] is None, "one finish per choice"
                finish[ch.index] = ch.finish_reason
    assert got == want
    assert finish == ["length"] * 4
    assert usage.completion_tokens == 32
    # one [DONE], every chunk's choice carries its index
    st, _, body = rkvd.request("POST", "/v1/completions",
                               {"prompt": PROMPT, "n": 3, "max_tokens": 3, "stream": True,
                                "seed": 1, "ignore_eos": True})
    assert st == 200
    events = [e[6:] for e in body.decode().split("\n\n") if e.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    idx = [json.loads(e)["choices"][0]["index"] for e in events[:-1]]
    assert sorted(set(idx)) == [0, 1, 2]


def test_chat_n_streamed_and_not(rkvd):
    c = client(rkvd)
    msgs = [{"role": "user", "content": "Tell me about the fox."}]
    kw = dict(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=3, n=3,
              extra_body={"ignore_eos": True})
    r = c.chat.completions.create(**kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    want = [ch.message.content for ch in r.choices]
    assert r.usage.completion_tokens == 18
    got, roles = ["", "", ""], [0, 0, 0]
    for chunk in c.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            if ch.delta.role:
                roles[ch.index] += 1
            got[ch.index] += ch.delta.content or ""
    assert got == want and roles == [1, 1, 1]


def test_prompt_prefilled_once_and_shared(rkvd_factory, ref):
    """greedy n = 4: one prefill of the prompt; the other three map its full blocks and compute
    only its last partial block"""
    srv = rkvd_factory("--block-size", str(BLOCK))
    n_p = len(ref.tokens(PROMPT))
    shared = (n_p - 1) // BLOCK * BLOCK
    assert shared >= 2 * BLOCK and n_p - shared > 1, (n_p, shared)
    pre0 = srv.metric("rkv:prefill_tokens_total")
    hits0 = srv.metric("rkv:prefix_cache_hits_total")
    r = client(srv).completions.create(model="tiny", prompt=PROMPT, n=4, max_tokens=8,
                                       temperature=0)
    computed = srv.metric("rkv:prefill_tokens_total") - pre0
    hits = srv.metric("rkv:prefix_cache_hits_total") - hits0
    assert computed == n_p + 3 * (n_p - shared), (computed, n_p, shared)
    assert hits == 3 * shared
    # greedy: n identical choices, each what computing everything gives
    want = ref.gen(PROMPT, n=8)["text"]
    assert texts(r) == [want] * 4
    assert r.usage.prompt_tokens == n_p
    assert r.usage.prompt_tokens_details is None or \
        r.usage.prompt_tokens_details.cached_tokens == 0


def mean_lp(choice):
    lps = choice.logprobs.token_logprobs
    return sum(lps) / len(lps)


def test_best_of_returns_the_best(rkvd):
    c = client(rkvd)
    # best_of's sequences sample as n's do with the same seed: the best two of these four
    four = sampled(c, n=4, seed=5, logprobs=0)
    rank = sorted(range(4), key=lambda i: (-mean_lp(four.choices[i]), i))
    for ch in four.choices:  # each choice's logprobs are its own
        assert "".join(ch.logprobs.tokens) == ch.text and len(ch.logprobs.tokens) == 8
    best = sampled(c, n=2, best_of=4, seed=5, logprobs=0)
    assert [ch.index for ch in best.choices] == [0, 1]
    assert texts(best) == [four.choices[i].text for i in rank[:2]]
    assert mean_lp(best.choices[0]) >= mean_lp(best.choices[1])
    # every generated token counts
    assert best.usage.completion_tokens == 4 * 8
    one = sampled(c, best_of=3, seed=5)
    assert len(one.choices) == 1 and one.usage.completion_tokens == 24
    # not streamed
    with pytest.raises(openai.BadRequestError) as ei:
        sampled(c, n=1, best_of=2, stream=True)
    err = ei.value.response.json()["error"]
    assert err["param"] == "best_of" and "cannot be streamed" in err["message"]


def test_prompt_lists(rkvd, ref):
    c = client(rkvd)
    a, b = "Once upon a time", "The fox"
    r = sampled(c, prompt=[a, b], n=2, seed=9)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    # index = prompt_index * n + i; each prompt's choices as its own request gives them
    assert texts(r)[:2] == texts(sampled(c, prompt=a, n=2, seed=9))
    assert texts(r)[2:] == texts(sampled(c, prompt=b, n=2, seed=9))
    assert r.usage.prompt_tokens == len(ref.tokens(a)) + len(ref.tokens(b))
    assert r.usage.completion_tokens == 4 * 8
    # the same prompts as token ids, a list of lists and a single list
    ids = [list(ref.tokens(a)), list(ref.tokens(b))]
    assert texts(sampled(c, prompt=ids, n=2, seed=9)) == texts(r)
    assert texts(sampled(c, prompt=ids[1], n=2, seed=9)) == texts(r)[2:]
    # greedy, each prompt's answer as computed alone
    g = c.completions.create(model="tiny", prompt=[a, b, a], max_tokens=6, temperature=0)
    want_a, want_b = ref.gen(a, n=6)["text"], ref.gen(b, n=6)["text"]
    assert texts(g) == [want_a, want_b, want_a]
    # echo: each prompt starts its own choices, streamed and not
    e = c.completions.create(model="tiny", prompt=[a, b], n=2, max_tokens=6, temperature=0,
                             echo=True)
    assert texts(e) == [a + want_a, a + want_a, b + want_b, b + want_b]
    got = ["", "", "", ""]
    for chunk in c.completions.create(model="tiny", prompt=[a, b], n=2, max_tokens=6,
                                      temperature=0, echo=True, stream=True):
        for ch in chunk.choices:
            got[ch.index] += ch.text
    assert got == texts(e)


@pytest.mark.parametrize("prompt,param,msg", [
    (["a", [1, 2]], "prompt[1]", "a string, as prompt[0] is"),
    ([[1, 2], []], "prompt[1]", "got []"),
    ([[1, 2], [3, 999999]], "prompt[1][1]", "a token id in [0, "),
    (["a", ""], "prompt[1]", "non-empty string"),
    (["a"] * 65, "prompt", "send at most 64"),
])
def test_prompt_list_400s(rkvd, prompt, param, msg):
    st, _, body = rkvd.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert st == 400
    err = json.loads(body)["error"]
    assert err["param"] == param and msg in err["message"], err


@pytest.mark.parametrize("req,param,msg", [
    ({"n": 17}, "n", "n must be an integer in [1, 16], got 17"),
    ({"n": 0}, "n", "got 0"),
    ({"n": 3, "best_of": 2}, "best_of", "best_of (2) must be at least n (3)"),
    ({"n": 2, "session_id": "s1"}, "n", "a session continues one conversation"),
    ({"prompt": ["a", "b"], "session_id": "s1"}, "prompt", "a session continues one"),
])
def test_fanout_400s(rkvd, req, param, msg):
    st, _, body = rkvd.request("POST", "/v1/completions",
                               {"prompt": "hi", "max_tokens": 1, **req})
    assert st == 400
    err = json.loads(body)["error"]
    assert err["param"] == param and msg in err["message"], err


def test_n_with_session_header_refused(rkvd):
    st, _, body = rkvd.request("POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                                "max_tokens": 1}, headers={"X-Session-Id": "conv"})
    assert st == 400 and json.loads(body)["error"]["param"] == "n"


def test_key_limits_count_every_sequence(rkvd_factory):
    srv = rkvd_factory()
    k = srv.ctl("keys", "add", "fan", "--max-tokens", "20")
    c = client(srv, k["secret"])
    ok = sampled(c, n=2, max_tokens=10, seed=1)
    assert ok.usage.completion_tokens == 20
    with pytest.raises(openai.BadRequestError) as ei:
        sampled(c, n=3, max_tokens=10, seed=1)
    err = ei.value.response.json()["error"]
    assert err["param"] == "n" and "3 sequences x max_tokens 10 = 30 tokens" in err["message"]
    assert f"rkvctl keys limits {k['id']} --max-tokens N" in err["message"]
    # chat without max_tokens: the cap shared by the choices
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                  n=4, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 20
    assert all(ch.finish_reason == "length" for ch in r.choices)
    # more than a whole window's tokens could never run
    t = srv.ctl("keys", "add", "fan-tpm", "--tpm", "30")
    with pytest.raises(openai.BadRequestError) as ei:
        sampled(client(srv, t["secret"]), n=4, max_tokens=8, seed=1)
    err = ei.value.response.json()["error"]
    assert "4 sequences x max_tokens 8 = 32 tokens" in err["message"]
    assert f"rkvctl keys limits {t['id']} --tpm N" in err["message"]


def test_suffix_without_fim_tokens(rkvd):
    with pytest.raises(openai.BadRequestError) as ei:
        client(rkvd).completions.create(model="tiny", prompt="def f(", suffix="return x",
                                        max_tokens=4)
    msg = ei.value.response.json()["error"]["message"]
    assert msg.startswith("suffix: ") and "no fill-in-the-middle tokens" in msg


@pytest.fixture(scope="module")
def fim_srv(tmp_path_factory):
    import subprocess
    out = tmp_path_factory.mktemp("fim") / "fim.gguf"
    r = subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "tiny", "--dtype", "f32", "--seed",
                        "1", "--fim", "--out", str(out)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    srv = Rkvd(out, _root(tmp_path_factory, "fim"), []).start()
    yield srv, Ref(out)
    _stop_checked(srv)


def test_suffix_fill_in_the_middle(fim_srv):
    srv, fref = fim_srv
    assert "fill in the middle: tokens" in srv.log()
    pre, suf, mid = (fref.tokens(t, bos=False, special=True)
                     for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert len(pre) == len(suf) == len(mid) == 1
    prompt, suffix = "def add(a, b):\n    ", "\n    return c\n"
    bos = fref.tokens("", bos=True)
    # llama.cpp's order: BOS PRE prompt SUF suffix MID
    ids = [*bos, *pre, *fref.tokens(prompt, bos=False), *suf, *fref.tokens(suffix, bos=False),
           *mid]
    c = client(srv)
    r = c.completions.create(model="fim", prompt=prompt, suffix=suffix, max_tokens=8,
                             temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].text == fref.gen(ids=tuple(ids), n=8)["text"]
    # token-id prompts take a suffix too; an empty suffix is none
    r2 = c.completions.create(model="fim", prompt=list(fref.tokens(prompt, bos=False)),
                              suffix=suffix, max_tokens=8, temperature=0)
    assert r2.choices[0].text == r.choices[0].text
    plain = c.completions.create(model="fim", prompt=prompt, suffix="", max_tokens=8,
                                 temperature=0)
    assert plain.usage.prompt_tokens == len(fref.tokens(prompt))
    # echo has no single text to echo
    st, _, body = srv.request("POST", "/v1/completions",
                              {"prompt": prompt, "suffix": suffix, "echo": True})
    assert st == 400 and json.loads(body)["error"]["param"] == "echo"
    assert math.isfinite(r.usage.total_tokens)


def wait_for(pred, what, timeout=30):
    import time
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_disconnect_mid_stream_ends_every_choice(rkvd_factory):
    """a client that leaves a stream of several choices cancels all of them; their sessions
    and KV go, and the server goes on serving"""
    import socket
    srv = rkvd_factory("--block-size", str(BLOCK))
    body = json.dumps({"prompt": PROMPT, "n": 4, "max_tokens": 2000, "stream": True,
                       "ignore_eos": True, "temperature": 1.0}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 8:
        got += s.recv(65536)
    assert srv.metric("rkv:num_requests_running") == 4
    s.close()
    wait_for(lambda: srv.metric("rkv:num_requests_running") == 0 and
             srv.metric("rkv:num_requests_waiting") == 0, "the choices to end")
    r = client(srv).completions.create(model="tiny", prompt="Hi", n=2, max_tokens=3)
    assert len(r.choices) == 2


def test_two_workers_give_the_same_choices(rkvd, rkvd_factory):
    """seeded choices do not depend on where they run: two workers answer as one does"""
    want = texts(sampled(client(rkvd), prompt=["Once upon a time", "The fox"], n=3, seed=21))
    srv = rkvd_factory("--workers", "2", "--block-size", str(BLOCK))
    c = client(srv)
    assert texts(sampled(c, prompt=["Once upon a time", "The fox"], n=3, seed=21)) == want
    # several at once, spread over both workers
    import concurrent.futures as cf
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: texts(sampled(c, prompt=["Once upon a time", "The fox"],
                                                   n=3, seed=21)), range(4)))
    assert got == [want] * 4
