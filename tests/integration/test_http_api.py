"""rkvd's HTTP/OpenAI layer against the real daemon (CPU backend, tiny model).

The openai client talks to rkvd as it would to vLLM: models, completions and
chat, streamed and not, with logprobs and usage; greedy streams equal the
non-stream text; errors come back in the OpenAI shape naming the field; the
HTTP limits answer 413/431; keep-alive and pipelining work on raw sockets;
a client leaving mid-stream cancels its generation and rkvd serves on.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")


def binary(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (make {BUILD}/bin/{name})")
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="module")
def rkvd(tmp_path_factory):
    for b in ("rkv-kvmgr", "rkv-worker"):
        binary(b)
    d = tmp_path_factory.mktemp("rkvd")
    model = d / "tiny.gguf"
    subprocess.run([binary("rkv-mkmodel"), "--preset", "tiny", "--dtype", "f32", "--seed", "1",
                    "--out", str(model)], check=True, capture_output=True, timeout=120)
    port = free_port()
    (d / "state").mkdir()
    (d / "rt").mkdir()
    log = open(d / "rkvd.log", "w")
    p = subprocess.Popen([binary("rkvd"), "--model", str(model), "--listen", f"127.0.0.1:{port}",
                          "--backend", "cpu", "--threads", "1", "--state-dir", str(d / "state"),
                          "--runtime-dir", str(d / "rt"), "--shutdown-timeout", "5"],
                         stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert p.poll() is None, f"rkvd exited {p.returncode}:\n{(d / 'rkvd.log').read_text()}"
        try:
            if get(base + "/health", timeout=1)[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "rkvd did not become healthy in 60 s:\n" + (
            d / "rkvd.log").read_text()
        time.sleep(0.1)
    yield {"base": base, "port": port, "proc": p, "log": d / "rkvd.log"}
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        log.close()


@pytest.fixture(scope="module")
def client(rkvd):
    return openai.OpenAI(base_url=rkvd["base"] + "/v1", api_key="unused", max_retries=0)


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny"]


def test_completion_greedy_stream_equals_non_stream(client):
    kw = dict(model="tiny", prompt="Hello there", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert r.id.startswith("cmpl-")
    assert r.object == "text_completion"
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    again = client.completions.create(**kw)
    assert again.choices[0].text == c.text
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_logprobs_shape(client):
    r = client.completions.create(model="tiny", prompt="abc", max_tokens=5, temperature=0,
                                  logprobs=3, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert lp.text_offset[0] == 0
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    # greedy: the sampled token is the most likely one
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert abs(l - max(top.values())) < 1e-4


def test_logprobs_index_the_text(client):
    """offsets stay within the text and bytes add up to it, also when the model emits control
    tokens (they render to nothing): sampled until a control token shows in the output"""
    for seed in range(1, 40):
        r = client.completions.create(model="tiny", prompt="abc", max_tokens=48, temperature=1.5,
                                      seed=seed, logprobs=1, extra_body={"ignore_eos": True})
        c = r.choices[0]
        lp = c.logprobs
        if "" in lp.tokens:
            break
    else:
        pytest.fail("no control token in 39 sampled answers")
    text = c.text
    assert len(lp.text_offset) == len(lp.tokens) == 48
    assert all(0 <= o <= len(text) for o in lp.text_offset)
    assert lp.text_offset == sorted(lp.text_offset)
    for tok, off in zip(lp.tokens, lp.text_offset):
        if tok and "\ufffd" not in tok:
            assert text[off:off + len(tok)] == tok
    # streamed: the same offsets
    chunks = list(client.completions.create(
        model="tiny", prompt="abc", max_tokens=48, temperature=1.5, seed=seed, logprobs=1,
        stream=True, extra_body={"ignore_eos": True}))
    offs = [o for ch in chunks if ch.choices and ch.choices[0].logprobs
            for o in ch.choices[0].logprobs.text_offset]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
    assert offs == lp.text_offset
    # chat: each token's bytes, joined, are the content
    msgs = [{"role": "user", "content": "abc"}]
    for seed in range(1, 40):
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=48,
                                           temperature=1.5, seed=seed, logprobs=True,
                                           extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        if any(not t.bytes for t in content):
            break
    else:
        pytest.fail("no control token in 39 sampled chat answers")
    raw = b"".join(bytes(t.bytes) for t in content)
    assert raw.decode("utf-8", errors="replace") == r.choices[0].message.content


def test_chat_stream_with_usage(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant"
    assert len(r.choices[0].logprobs.content) == 8
    assert bytes(r.choices[0].logprobs.content[0].bytes)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == m.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


@pytest.mark.parametrize("kw,param,status", [
    (dict(max_tokens=-5), "max_tokens", 400),
    (dict(temperature=3.5), "temperature", 400),
    (dict(n=17), "n", 400),
    (dict(extra_body={"temprature": 0.5}), "temprature", 400),
    (dict(model="nope"), "model", 404),
])
def test_errors_name_the_field(client, kw, param, status):
    args = dict(model="tiny", prompt="x", max_tokens=4)
    args.update(kw)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert param in err["message"]


def raw(port, data, read_until_close=True):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
            if not read_until_close and out.count(b"HTTP/1.1 ") >= 1 and b"\r\n\r\n" in out:
                return out


def test_http_limits(rkvd):
    port = rkvd["port"]
    big = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    assert raw(port, big).startswith(b"HTTP/1.1 431 ")
    huge = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 5000000\r\n\r\n")
    out = raw(port, huge)
    assert out.startswith(b"HTTP/1.1 413 ")
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["message"]


def test_keepalive_and_pipelining(rkvd):
    body = json.dumps({"prompt": "x", "max_tokens": 2, "temperature": 0}).encode()
    post = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    models = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = raw(rkvd["port"], post + models + post + last)
    parts = out.split(b"HTTP/1.1 200 OK\r\n")
    assert len(parts) == 5  # four answers, in order
    assert b"text_completion" in parts[1] and b'"object":"list"' in parts[2]
    assert b"text_completion" in parts[3] and b'"object":"list"' in parts[4]


def test_disconnect_cancels_and_server_lives_on(rkvd, client):
    s = client.completions.create(model="tiny", prompt="x", max_tokens=2000, stream=True,
                                  extra_body={"ignore_eos": True})
    for i, _ in enumerate(s):
        if i == 3:
            break
    s.close()
    deadline = time.monotonic() + 10
    while True:
        status, metrics = get(rkvd["base"] + "/metrics")
        running = [l for l in metrics.decode().splitlines()
                   if l.startswith("rkv:num_requests_running")]
        if running and all(l.rsplit(" ", 1)[1] in ("0", "0.0") for l in running):
            break
        assert time.monotonic() < deadline, f"the stream was not cancelled: {running}"
        time.sleep(0.05)
    r = client.completions.create(model="tiny", prompt="x", max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_cors_preflight_allows_the_headers_asked_for(rkvd_factory):
    """cors_origin set: answers carry the origin, and a browser SDK's preflight (openai-node
    adds X-Stainless-* headers) is allowed the headers it asks for; unset: no CORS headers"""
    srv = rkvd_factory("--cors-origin", "*")
    asked = "authorization,content-type,x-stainless-os,openai-organization"
    st, hd, _ = srv.request("OPTIONS", "/v1/chat/completions",
                            headers={"Origin": "http://app.example",
                                     "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": asked})
    assert st == 204
    assert hd["access-control-allow-origin"] == "*"
    assert hd["access-control-allow-headers"] == asked
    assert "POST" in hd["access-control-allow-methods"]
    st, hd, _ = srv.request("GET", "/v1/models", headers={"Origin": "http://app.example"})
    assert st == 200 and hd["access-control-allow-origin"] == "*"
    plain = rkvd_factory()
    st, hd, _ = plain.request("GET", "/v1/models", headers={"Origin": "http://app.example"})
    assert st == 200 and "access-control-allow-origin" not in hd
    # one origin or *, nothing else, refused at start by name
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvd"), "--model", "/nonexistent.gguf", "--cors-origin",
                        "https://a.example, https://b.example"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "cors_origin" in r.stderr and "one origin" in r.stderr, r.stderr


def test_a_stream_client_that_stops_reading_pauses_its_request(rkvd_factory):
    """a client that stops reading a long stream (8 choices with logprobs: megabytes) pauses the
    request's sequences once rkvd holds more than its write limit for it, instead of the whole
    answer piling up in rkvd; once it reads again the answer goes on to its end"""
    srv = rkvd_factory()
    body = json.dumps({"model": "tiny", "prompt": "a long answer", "max_tokens": 1900, "n": 8,
                       "logprobs": 20, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.connect(("127.0.0.1", srv.port))
    gen0 = srv.metric("rkv:generation_tokens_total")
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    total = 8 * 1900
    # it runs, then stops well before the end: nothing is read
    deadline = time.monotonic() + 30
    while srv.metric("rkv:generation_tokens_total") == gen0:
        assert time.monotonic() < deadline, "the request did not start"
        time.sleep(0.05)
    time.sleep(3)
    a = srv.metric("rkv:generation_tokens_total") - gen0
    time.sleep(1)
    b = srv.metric("rkv:generation_tokens_total") - gen0
    # a step in flight when the buffer filled may still land (8 sequences, a few decode steps)
    assert a < total and b - a <= 64, (a, b, total)
    # reading again: every choice runs to its length
    s.settimeout(60)
    data = b""
    while b"data: [DONE]" not in data:
        chunk = s.recv(1 << 16)
        assert chunk, "the stream ended early"
        data += chunk
    s.close()
    assert data.count(b'"finish_reason":"length"') == 8
    assert srv.metric("rkv:generation_tokens_total") - gen0 == total
