"""Per-key limits against a real rkvd (CPU backend, tiny model) with the real openai client:
requests and tokens per window, concurrent requests, the per-key max_tokens cap, the
x-ratelimit-* headers, live changes with rkvctl keys limits, and the config defaults. The
window is shortened (--rate-limit-window) so waiting it out takes seconds; each check leaves
the refill far more time than the requests take, so a slow machine (ASan) passes too."""
import json
import time

import openai
import pytest

WINDOW = "2"
# requests: 2 per 6 s refill one every 3 s, far slower than a 1-token request
REQ_WINDOW = "6"


def rkvctl(srv, *args):
    return srv.ctl(*args)


def client(srv, key):
    # max_retries=0: the client would otherwise retry a 429 itself
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0, timeout=60)


def complete_raw(c, prompt="Hello", max_tokens=4, **kw):
    raw = c.completions.with_raw_response.create(model="tiny", prompt=prompt,
                                                 max_tokens=max_tokens, temperature=0, **kw)
    return raw.headers, raw.parse()


def rate_limit_error(fn):
    with pytest.raises(openai.RateLimitError) as ei:
        fn()
    e = ei.value
    assert e.status_code == 429
    body = e.response.json()["error"]
    assert body["code"] == "rate_limit_exceeded"
    retry = int(e.response.headers["retry-after"])
    assert retry >= 1
    return e, body, retry


@pytest.fixture
def srv(rkvd_factory):
    return rkvd_factory("--rate-limit-window", WINDOW)


def test_requests_per_window(rkvd_factory):
    srv = rkvd_factory("--rate-limit-window", REQ_WINDOW)
    k = rkvctl(srv, "keys", "add", "alice", "--rpm", "2")
    assert k["limits"] == {"rpm": 2, "tpm": "default", "max_concurrent": "default",
                           "max_tokens": "default", "max_prompt": "default"}
    c = client(srv, k["secret"])
    h, r = complete_raw(c)
    assert r.usage.completion_tokens == 4
    assert h["x-ratelimit-limit-requests"] == "2"
    assert h["x-ratelimit-remaining-requests"] == "1"
    assert h["x-ratelimit-reset-requests"] in ("3s", "4s")  # one request of a 6 s window
    assert "x-ratelimit-limit-tokens" not in h  # tokens are not limited for this key
    h, r = complete_raw(c)
    assert h["x-ratelimit-remaining-requests"] == "0"
    e, body, retry = rate_limit_error(lambda: complete_raw(c))
    assert body["type"] == "requests"
    assert f"rkvctl keys limits {k['id']} --rpm N" in body["message"]
    assert "requests per 6s: limit 2" in body["message"]
    assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= retry <= 3
    # the secret never reaches the log
    assert k["secret"] not in srv.log()
    # a request refills in window/rpm = 3 s
    time.sleep(retry + 0.05)
    h, r = complete_raw(c)
    assert r.choices[0].finish_reason == "length"
    # another key is not limited by alice's use, and has no limit headers
    other = rkvctl(srv, "keys", "add", "bob")
    h, r = complete_raw(client(srv, other["secret"]))
    assert "x-ratelimit-limit-requests" not in h


def test_tokens_per_window_and_streams(srv):
    k = rkvctl(srv, "keys", "add", "carol", "--tpm", "40")
    c = client(srv, k["secret"])
    # charged at the end: prompt + completion tokens, as OpenAI's usage counts them
    h, r = complete_raw(c, max_tokens=4)
    assert h["x-ratelimit-limit-tokens"] == "40"
    assert h["x-ratelimit-remaining-tokens"] == "40"
    assert r.usage.prompt_tokens + r.usage.completion_tokens > 4
    # a stream also reports the budget in its headers; its 64 tokens put the bucket 30 below
    # zero, 1.5 s of refill at 40 per 2 s
    with c.completions.with_streaming_response.create(
            model="tiny", prompt="Hello", max_tokens=64, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) as resp:
        rem = int(resp.headers["x-ratelimit-remaining-tokens"])
        assert 0 < rem <= 40
        text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in resp.iter_lines()
                       if ln.startswith("data: {"))
        assert text
    e, body, retry = rate_limit_error(lambda: complete_raw(c))
    assert body["type"] == "tokens"
    assert "--tpm N" in body["message"] and "tokens per 2s: limit 40" in body["message"]
    assert 1 <= retry <= 2
    assert e.response.headers["x-ratelimit-remaining-tokens"] == "0"
    time.sleep(retry + 0.05)
    h, r = complete_raw(c)
    assert r.usage.completion_tokens == 4


def test_concurrent_requests(srv):
    k = rkvctl(srv, "keys", "add", "dave", "--max-concurrent", "1")
    c = client(srv, k["secret"])
    # long enough to be still in flight when the second request comes (64 tokens of the tiny
    # model could all be out by then on a fast machine; 500 were, once, on a loaded one)
    with c.completions.with_streaming_response.create(
            model="tiny", prompt="Hello", max_tokens=1900, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) as resp:
        lines = resp.iter_lines()
        first = next(ln for ln in lines if ln.startswith("data: {"))
        assert json.loads(first[6:])["choices"]
        # the stream is in flight: a second request of the key is refused
        e, body, _ = rate_limit_error(lambda: complete_raw(c))
        assert body["type"] == "requests"
        assert "concurrent requests: limit 1" in body["message"]
        assert "--max-concurrent N" in body["message"]
        rest = [ln for ln in lines if ln]
        assert rest[-1] == "data: [DONE]"
    # it finished: the next one is admitted
    h, r = complete_raw(c)
    assert r.usage.completion_tokens == 4


def test_max_tokens_cap_changes_live(srv):
    k = rkvctl(srv, "keys", "add", "erin", "--max-tokens", "5")
    c = client(srv, k["secret"])
    with pytest.raises(openai.BadRequestError) as ei:
        complete_raw(c, max_tokens=10)
    msg = ei.value.response.json()["error"]["message"]
    assert "max_tokens" in msg and "[1, 5]" in msg
    assert f"rkvctl keys limits {k['id']} --max-tokens N" in msg
    # chat without max_tokens gets the key's cap
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    # raised live, no restart
    out = rkvctl(srv, "keys", "limits", str(k["id"]), "--max-tokens", "default", "--rpm", "100")
    assert out["limits"]["max_tokens"] == "default" and out["limits"]["rpm"] == 100
    h, r = complete_raw(c, max_tokens=10)
    assert r.usage.completion_tokens == 10
    assert h["x-ratelimit-limit-requests"] == "100"
    listed = {x["id"]: x for x in rkvctl(srv, "keys", "list")["keys"]}
    assert listed[k["id"]]["limits"]["rpm"] == 100
    # and they survive a restart (sqlite)
    srv.stop()
    srv.exit_code = None
    srv.port = None
    srv.start()
    listed = {x["id"]: x for x in rkvctl(srv, "keys", "list")["keys"]}
    assert listed[k["id"]]["limits"] == {"rpm": 100, "tpm": "default",
                                         "max_concurrent": "default", "max_tokens": "default",
                                         "max_prompt": "default"}


def test_prompt_cap(srv, ref):
    k = rkvctl(srv, "keys", "add", "heidi", "--max-prompt", "6")
    c = client(srv, k["secret"])
    long_prompt = "the cat sat on a warm mat while rain fell"
    n = len(ref.tokens(long_prompt))
    assert n > 6
    for prompt in (long_prompt, list(ref.tokens(long_prompt))):  # text and token ids
        with pytest.raises(openai.BadRequestError) as ei:
            complete_raw(c, prompt=prompt)
        msg = ei.value.response.json()["error"]["message"]
        assert f"the prompt has {n} tokens but API key {k['id']} may send at most 6" in msg
        assert f"rkvctl keys limits {k['id']} --max-prompt N" in msg
    h, r = complete_raw(c, prompt="Hi")
    assert r.usage.prompt_tokens <= 6
    rkvctl(srv, "keys", "limits", str(k["id"]), "--max-prompt", "0")
    h, r = complete_raw(c, prompt=long_prompt)
    assert r.usage.prompt_tokens == n


def test_config_defaults(rkvd_factory):
    srv = rkvd_factory("--rate-limit-window", REQ_WINDOW, "--key-rpm", "1", "--key-max-tokens",
                       "3")
    own = rkvctl(srv, "keys", "add", "frank", "--rpm", "0")
    dflt = rkvctl(srv, "keys", "add", "grace")
    h, r = complete_raw(client(srv, dflt["secret"]), max_tokens=3)
    assert h["x-ratelimit-limit-requests"] == "1"
    rate_limit_error(lambda: complete_raw(client(srv, dflt["secret"]), max_tokens=3))
    # rpm 0 of its own: unlimited, but the default max_tokens cap still applies
    for _ in range(3):
        h, r = complete_raw(client(srv, own["secret"]), max_tokens=3)
        assert "x-ratelimit-limit-requests" not in h
    with pytest.raises(openai.BadRequestError):
        complete_raw(client(srv, own["secret"]), max_tokens=4)
    # a wrong key is still 401, not 429
    with pytest.raises(openai.AuthenticationError):
        complete_raw(client(srv, "rkv-" + "0" * 48))
