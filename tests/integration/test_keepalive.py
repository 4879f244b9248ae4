"""SSE keep-alives: a streamed request that has nothing to send (here: queued behind a long one
with room for one sequence) gets ": keep-alive" comment lines every sse_keepalive_ms, which the
openai client skips; its answer is unchanged, and with 0 no comment is sent."""
import http.client
import json
import threading
import time

import pytest

openai = pytest.importorskip("openai")


def raw_stream(srv, body):
    """(comment lines before the first data event, comments after it, the data payloads)"""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    before = after = 0
    data = []
    for raw in r:
        line = raw.decode().rstrip("\n")
        if line.startswith(":"):
            if data:
                after += 1
            else:
                before += 1
        elif line.startswith("data: "):
            data.append(line[6:])
    c.close()
    return before, after, data


def long_request(srv):
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=300)
    return c.completions.create(model="tiny", prompt="long", max_tokens=2000, temperature=0,
                                extra_body={"ignore_eos": True})


def queued(srv):
    """a streamed request that waits while long ones hold the only running slot"""
    longs = [threading.Thread(target=long_request, args=(srv,)) for _ in range(3)]
    for t in longs:
        t.start()
    time.sleep(0.3)  # the long ones go first
    body = {"model": "tiny", "prompt": "short", "max_tokens": 8, "temperature": 0,
            "stream": True}
    got = raw_stream(srv, body)
    for t in longs:
        t.join()
    return got


def test_a_waiting_stream_gets_comments(rkvd_factory):
    srv = rkvd_factory("--max-running", "1", "--sse-keepalive-ms", "200")
    before, after, data = queued(srv)
    assert before >= 1, "no keep-alive while the request waited"
    assert data[-1] == "[DONE]" and len(data) >= 2
    # the openai client reads through comments: the same text as a plain request
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    text = "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]
                   if json.loads(d)["choices"])
    plain = c.completions.create(model="tiny", prompt="short", max_tokens=8, temperature=0)
    assert text == plain.choices[0].text


def test_zero_sends_none(rkvd_factory):
    srv = rkvd_factory("--max-running", "1", "--sse-keepalive-ms", "0")
    before, after, data = queued(srv)
    assert before == 0 and after == 0 and data[-1] == "[DONE]"
