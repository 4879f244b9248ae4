"""rkvd against malformed requests over real HTTP: each of a corpus of bad JSON, wrong types,
out-of-range values, unknown fields, invalid UTF-8, oversized bodies and headers, slow
headers, wrong methods and paths, bad auth and over-long prompts gets the right status and an
OpenAI-shaped error body, and the server stays healthy."""
import json
import socket
import subprocess
import time

import pytest

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


def j(**kw):
    return json.dumps(kw).encode()


# (id, method, path, headers, body, status, words the message must contain)
CASES = [
    # JSON itself
    ("truncated-json", "POST", C, {}, b'{"prompt": "x"', 400, []),
    ("trailing-comma", "POST", C, {}, b'{"prompt": "x",}', 400, []),
    ("empty-body", "POST", C, {}, b"", 400, []),
    ("array-body", "POST", C, {}, b"[]", 400, []),
    ("string-body", "POST", C, {}, b'"prompt"', 400, []),
    ("null-body", "POST", C, {}, b"null", 400, []),
    ("deep-nesting", "POST", C, {}, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, []),
    ("nan-literal", "POST", C, {}, b'{"prompt": "x", "temperature": NaN}', 400, []),
    # wrong types
    ("prompt-number", "POST", C, {}, j(prompt=5), 400, ["prompt"]),
    ("prompt-object", "POST", C, {}, j(prompt={"a": 1}), 400, ["prompt"]),
    ("prompt-missing", "POST", C, {}, j(max_tokens=4), 400, ["prompt"]),
    ("max-tokens-string", "POST", C, {}, j(prompt="x", max_tokens="10"), 400, ["max_tokens"]),
    ("max-tokens-float", "POST", C, {}, j(prompt="x", max_tokens=1.5), 400, ["max_tokens"]),
    ("temperature-string", "POST", C, {}, j(prompt="x", temperature="hot"), 400,
     ["temperature"]),
    ("stream-string", "POST", C, {}, j(prompt="x", stream="yes"), 400, ["stream"]),
    ("stop-number", "POST", C, {}, j(prompt="x", stop=7), 400, ["stop"]),
    ("seed-string", "POST", C, {}, j(prompt="x", seed="abc"), 400, ["seed"]),
    ("session-id-number", "POST", C, {}, j(prompt="x", session_id=12), 400, ["session_id"]),
    # out of range
    ("max-tokens-negative", "POST", C, {}, j(prompt="x", max_tokens=-1), 400, ["max_tokens"]),
    ("max-tokens-zero", "POST", C, {}, j(prompt="x", max_tokens=0), 400, ["max_tokens"]),
    ("max-tokens-huge", "POST", C, {}, j(prompt="x", max_tokens=10**9), 400, ["max_tokens"]),
    ("max-tokens-1e999", "POST", C, {}, b'{"prompt": "x", "max_tokens": 1e999}', 400,
     ["max_tokens"]),
    ("temperature-negative", "POST", C, {}, j(prompt="x", temperature=-1), 400,
     ["temperature"]),
    ("temperature-3", "POST", C, {}, j(prompt="x", temperature=3), 400, ["temperature"]),
    ("top-p-zero", "POST", C, {}, j(prompt="x", top_p=0), 400, ["top_p"]),
    ("top-p-1.5", "POST", C, {}, j(prompt="x", top_p=1.5), 400, ["top_p"]),
    ("n-17", "POST", C, {}, j(prompt="x", n=17), 400, ["n"]),
    ("best-of-below-n", "POST", C, {}, j(prompt="x", n=3, best_of=2), 400, ["best_of"]),
    ("logprobs-21", "POST", C, {}, j(prompt="x", logprobs=21), 400, ["logprobs"]),
    ("stop-too-many", "POST", C, {}, j(prompt="x", stop=[str(i) for i in range(9)]), 400,
     ["stop"]),
    ("session-id-long", "POST", C, {}, j(prompt="x", session_id="s" * 200), 400,
     ["session_id"]),
    ("token-id-over-vocab", "POST", C, {}, j(prompt=[1, 99999]), 400, ["99999"]),
    ("token-id-negative", "POST", C, {}, j(prompt=[1, -1]), 400, ["-1"]),
    # unsupported and unknown fields
    ("unknown-field", "POST", C, {}, j(prompt="x", frobnicate=1), 400, ["frobnicate"]),
    ("echo-logprobs", "POST", C, {}, j(prompt="x", echo=True, logprobs=1), 400, ["echo"]),
    ("logit-bias-range", "POST", C, {}, j(prompt="x", logit_bias={"5": 1000}), 400,
     ["logit_bias"]),
    ("logit-bias-over-vocab", "POST", C, {}, j(prompt="x", logit_bias={"99999": 1}), 400,
     ["logit_bias", "99999"]),
    ("messages-on-completions", "POST", C, {}, j(prompt="x", messages=OK_MSG), 400,
     ["messages"]),
    ("prompt-on-chat", "POST", CHAT, {}, j(messages=OK_MSG, prompt="x"), 400, ["prompt"]),
    ("tools", "POST", CHAT, {}, j(messages=OK_MSG, tools=[{"type": "function", "function":
                                                           {"name": "f"}}]), 400, ["tools", "no tool support"]),
    # chat messages
    ("messages-missing", "POST", CHAT, {}, j(max_tokens=3), 400, ["messages"]),
    ("messages-empty", "POST", CHAT, {}, j(messages=[]), 400, ["messages"]),
    ("messages-string", "POST", CHAT, {}, j(messages="hi"), 400, ["messages"]),
    ("message-no-role", "POST", CHAT, {}, j(messages=[{"content": "hi"}]), 400, ["role"]),
    ("message-bad-role", "POST", CHAT, {}, j(messages=[{"role": "wizard", "content": "hi"}]),
     400, ["wizard"]),
    ("message-content-number", "POST", CHAT, {}, j(messages=[{"role": "user", "content": 5}]),
     400, ["content"]),
    # bytes
    ("invalid-utf8", "POST", C, {}, b'{"prompt": "caf\xc3"}', 400, []),
    ("overlong-utf8", "POST", C, {}, b'{"prompt": "\xc0\xaf"}', 400, []),
    ("nul-byte-in-a-string", "POST", C, {}, b'{"prompt": "a\x00b", "max_tokens": 1}', 400,
     ["NUL byte at offset 13"]),
    ("max-tokens-bad-beside-max-completion-tokens", "POST", CHAT, {},
     j(messages=OK_MSG, max_completion_tokens=2, max_tokens="x"), 400, ["max_tokens"]),
    ("session-header-control-char", "POST", C, {"X-Session-Id": "a\x01b"},
     j(prompt="x", max_tokens=1), 400, []),
    ("invalid-utf8-chat", "POST", CHAT, {},
     b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, []),
    ("lone-surrogate", "POST", C, {}, b'{"prompt": "\\ud800"}', 400, []),
    ("empty-prompt", "POST", C, {}, j(prompt=""), 400, ["prompt"]),
    ("empty-token-list", "POST", C, {}, j(prompt=[]), 400, ["prompt"]),
    ("mixed-prompts", "POST", C, {}, j(prompt=["a", [1]]), 400, ["prompt[1]"]),
    ("stream-options-without-stream", "POST", C, {},
     j(prompt="x", stream_options={"include_usage": True}), 400, ["stream_options"]),
    ("empty-session-id", "POST", C, {}, j(prompt="x", session_id=""), 400, ["session_id"]),
    ("unknown-model", "POST", C, {}, j(prompt="x", model="nope"), 404, ["nope"]),
    ("wrong-content-type", "POST", C, {"Content-Type": "text/plain"}, j(prompt="x"), 415, []),
    # routes and methods
    # a key twice: cJSON would keep the first, a gateway capping max_tokens reads the last
    ("dup-max-tokens", "POST", C, {},
     b'{"model":"small","prompt":"x","max_tokens":1,"temperature":0,"max_tokens":3}', 400,
     ["max_tokens", "appears twice"]),
    ("dup-temperature", "POST", C, {}, b'{"prompt":"x","temperature":0,"temperature":7}', 400,
     ["temperature", "appears twice"]),
    ("dup-nested", "POST", CHAT, {},
     b'{"messages":[{"role":"user","content":"a","content":"b"}]}', 400,
     ["messages[0].content", "appears twice"]),
    ("get-completions", "GET", C, {}, None, 405, []),
    ("delete-chat", "DELETE", CHAT, {}, None, 405, []),
    ("post-models", "POST", "/v1/models", {}, j(prompt="x"), 405, []),
    ("post-health", "POST", "/health", {}, b"{}", 405, []),
    ("no-route", "GET", "/v2/completions", {}, None, 404, []),
    ("no-route-post", "POST", "/v1/embeddings", {}, j(input="x"), 404, []),
]


def check_error_body(status, headers, body, want_status, words):
    assert status == want_status, body[:300]
    assert headers.get("content-type", "").startswith("application/json"), headers
    e = json.loads(body)["error"]
    assert isinstance(e["message"], str) and e["message"], e
    assert isinstance(e["type"], str) and e["type"], e
    assert "param" in e and "code" in e, e
    for w in words:
        assert w in e["message"] or w == e.get("param"), (w, e)
    return e


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(rkvd, case):
    _, method, path, headers, body, status, words = case
    h = dict(headers)
    if body is not None and "Content-Type" not in h:
        h["Content-Type"] = "application/json"
    st, hd, data = rkvd.request(method, path, body=body, headers=h)
    check_error_body(st, hd, data, status, words)
    if status == 405:
        assert "allow" in hd


def test_admin_duplicate_arguments(rkvd):
    """the admin API reads each argument once too, in a body and in a query"""
    st, _, body = rkvd.request("GET", "/admin/v1/events?limit=1&limit=500")
    assert st == 400 and "\"limit\" appears twice" in json.loads(body)["error"]["message"]
    st, _, body = rkvd.request("POST", "/admin/v1/events", b'{"limit":1,"limit":2}',
                               headers={"Content-Type": "application/json"})
    assert st == 400 and "\"limit\" appears twice" in json.loads(body)["error"]["message"]


def test_prompt_longer_than_context(rkvd, ref):
    # 2048 positions (the tiny model's context): the message names both numbers
    ids = [int(t) % 500 + 1 for t in range(3000)]
    st, hd, data = rkvd.request("POST", C, body={"prompt": ids, "max_tokens": 4})
    e = check_error_body(st, hd, data, 400, ["3000", "2048"])
    text = "fox " * 2500
    n = len(ref.tokens(text))
    assert n > 2048
    st, hd, data = rkvd.request("POST", C, body={"prompt": text, "max_tokens": 4})
    check_error_body(st, hd, data, 400, [str(n), "2048"])
    msgs = [{"role": "user", "content": text}]
    st, hd, data = rkvd.request("POST", CHAT, body={"messages": msgs, "max_tokens": 4})
    check_error_body(st, hd, data, 400, ["2048"])
    assert e["type"] == "invalid_request_error"


# --- protocol level, on raw sockets -----------------------------------------------------


def raw(srv, data, timeout=10, pause=None):
    """send data (optionally in two parts with a pause), read to EOF: (status, headers, body)"""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    try:
        if pause:
            s.sendall(data[:pause[0]])
            time.sleep(pause[1])
            try:
                s.sendall(data[pause[0]:])
            except OSError:
                pass
        else:
            s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, body


POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
RAW_CASES = [
    ("garbage-request-line", b"GARBAGE\r\n\r\n", 400),
    ("bad-content-length", POST + b"Content-Length: abc\r\n\r\n{}", 400),
    ("bad-chunk-size", POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
    ("header-too-large", POST + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
    ("body-too-large", POST + b"Content-Length: 200000\r\n\r\n" + b"x" * 200000, 413),
    ("chunked-too-large", POST + b"Transfer-Encoding: chunked\r\n\r\n" +
     (b"8000\r\n" + b"x" * 0x8000 + b"\r\n") * 4 + b"0\r\n\r\n", 413),
]


@pytest.mark.parametrize("case", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_bad_http(rkvd, case):
    _, data, status = case
    st, hd, body = raw(rkvd, data)
    check_error_body(st, hd, body, status, [])


def test_slow_headers_get_408(rkvd):
    # the shared server runs with http_header_timeout 1 s
    t0 = time.monotonic()
    st, hd, body = raw(rkvd, POST + b"Content-Length: 2\r\n\r\n{}", pause=(20, 3))
    assert time.monotonic() - t0 < 3 + 2
    check_error_body(st, hd, body, 408, [])


def test_oversized_body_via_client(rkvd):
    st, hd, data = rkvd.request("POST", C, body={"prompt": "x" * 100000})
    check_error_body(st, hd, data, 413, [])


def test_server_healthy_after_the_corpus(rkvd, ref):
    """runs after the corpus above (file order): still healthy, still right"""
    st, _, body = rkvd.request("GET", "/health")
    assert st == 200, body
    st, _, body = rkvd.request("POST", C, body={"prompt": "Hello", "max_tokens": 6,
                                                "temperature": 0})
    assert st == 200, body
    assert json.loads(body)["choices"][0]["text"] == ref.gen("Hello", n=6)["text"]


# --- auth -------------------------------------------------------------------------------


def test_bad_auth_once_a_key_exists(rkvd_factory):
    from conftest import rkv_bin
    srv = rkvd_factory()
    body = {"prompt": "x", "max_tokens": 2}
    assert srv.request("POST", C, body=body)[0] == 200  # no key yet: open
    r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"),
                        "--json", "keys", "add", "tester"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    key = json.loads(r.stdout)["secret"]
    for name, h in [("none", {}), ("wrong", {"Authorization": "Bearer sk-wrong"}),
                    ("not-bearer", {"Authorization": "Basic " + key}),
                    ("empty", {"Authorization": "Bearer "})]:
        st, hd, data = srv.request("POST", C, body=body, headers=h)
        check_error_body(st, hd, data, 401, [])
        assert hd.get("www-authenticate", "").startswith("Bearer"), name
    st, _, data = srv.request("POST", C, body=body, headers={"Authorization": "Bearer " + key})
    assert st == 200, data
    assert srv.request("GET", "/health")[0] == 200


def test_full_queue_gets_429_with_retry_after(rkvd_factory):
    import http.client
    srv = rkvd_factory("--max-running", "1", "--max-waiting", "1")
    body = json.dumps({"prompt": "a long one", "max_tokens": 2000, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    conns = []

    def open_stream():
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", C, body=body, headers={"Content-Type": "application/json"})
        conns.append(c)
        return c

    try:
        r0 = open_stream().getresponse()  # running
        assert r0.status == 200
        r0.fp.readline()
        open_stream()  # queued behind it
        deadline = time.monotonic() + 10
        while srv.metric("rkv:num_requests_waiting") != 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        st, hd, data = srv.request("POST", C, body={"prompt": "one more", "max_tokens": 2})
        check_error_body(st, hd, data, 429, [])
        assert hd.get("retry-after") == "1"
    finally:
        for c in conns:
            c.close()
    # the streams' clients left: their slots free up, the server serves again
    deadline = time.monotonic() + 30
    while True:
        st, _, data = srv.request("POST", C, body={"prompt": "after", "max_tokens": 2})
        if st == 200:
            break
        assert st == 429 and time.monotonic() < deadline, data
        time.sleep(0.05)


def test_busy_session_gets_409(rkvd):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", rkvd.port, timeout=60)
    try:
        c.request("POST", C, headers={"Content-Type": "application/json"},
                  body=json.dumps({"prompt": "hold the session", "max_tokens": 1500,
                                   "stream": True, "ignore_eos": True,
                                   "session_id": "busy-one"}))
        r = c.getresponse()
        assert r.status == 200
        r.fp.readline()  # it runs
        st, hd, data = rkvd.request("POST", C, body={"prompt": "me too", "max_tokens": 2,
                                                     "session_id": "busy-one"})
        check_error_body(st, hd, data, 409, ["busy-one"])
    finally:
        c.close()
    # the first request's client left: the session is free again
    deadline = time.monotonic() + 30
    while True:
        st, _, data = rkvd.request("POST", C, body={"prompt": "me too", "max_tokens": 2,
                                                    "session_id": "busy-one"})
        if st == 200:
            break
        assert st == 409 and time.monotonic() < deadline, data
        time.sleep(0.05)


def test_switch_followed_by_a_word_names_the_switch():
    """`--prep-ahead maybe`: a switch takes true or false; the error says so (not only
    "unexpected argument")"""
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvd"), "--prep-ahead", "maybe"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert 'unexpected argument "maybe": --prep-ahead takes true or false' in r.stderr, r.stderr
    r = subprocess.run([rkv_bin("rkvd"), "--prep-ahead=maybe"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert "prep_ahead" in r.stderr or "prep-ahead" in r.stderr, r.stderr


def test_host_split_out_of_range_is_refused_by_name():
    """host_split is a percent (or -1 for the measured share): rkvd and the worker refuse
    anything else at start, naming the option and the range"""
    from conftest import rkv_bin
    for prog, val, want in (("rkvd", "101", "out of range, expected -1..100"),
                            ("rkv-worker", "-2", "out of range, expected -1..100"),
                            ("rkvd", "half", 'expected an integer, got "half"')):
        r = subprocess.run([rkv_bin(prog), "--host-split", val], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2, (prog, val, r.stderr)
        assert "--host-split" in r.stderr and want in r.stderr, r.stderr


def test_cuda_tune_names_the_bad_knob(tiny_model, tmp_path):
    """a worker given a knob it does not know, or a value out of its range, stops at start
    naming both (rkvd then reports its worker failing)"""
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkv-worker"), "--model", str(tiny_model), "--runtime-dir",
                        str(tmp_path), "--cuda-tune", "graph=7,bogus=1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    assert "graph=7 is not a whole number in [0, 2]" in r.stderr, r.stderr
    assert '"bogus=1" names no knob' in r.stderr and 'cuda_tune "graph=7,bogus=1"' in r.stderr


def test_vram_target_below_kvmgrs_least_is_refused_at_start(tmp_path):
    """rkv-kvmgr takes a VRAM target of 4 KiB at least: rkvd says so itself before starting
    anything, rather than leaving a kvmgr that exits at every restart"""
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvd"), "--model", str(tmp_path / "m.gguf"), "--vram-target",
                        "1KiB", "--state-dir", str(tmp_path / "s"), "--runtime-dir",
                        str(tmp_path / "r")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--vram-target: 1024B is below 4.00 KiB" in r.stderr, r.stderr
    assert "512MiB" in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()


def test_vram_target_with_no_room_for_a_block_says_what_it_must_be(tiny_model, tmp_path_factory):
    """a VRAM target above kvmgr's least but under one kv block leaves the planner nothing to
    run a session on (each keeps its newest blocks on the device): kvmgr refuses its pools
    with the target it needs, rather than a server whose every request waits and then gets 503"""
    from conftest import Rkvd, _root
    srv = Rkvd(tiny_model, _root(tmp_path_factory, "vram"), ["--vram-target", "4KiB"])
    with pytest.raises(AssertionError):
        srv.start(timeout=4)
    log = srv.log()
    assert "gpu 0: vram target 4.00 KiB leaves no room for a kv block" in log, log[-3000:]
    assert "raise --vram-target to" in log and "8 blocks" in log, log[-3000:]
    # once, not at every hello the worker retries (every 200 ms)
    assert log.count("leaves no room for a kv block") <= 2, log[-3000:]


def test_health_says_why_kvmgr_has_no_pools(tiny_model, tmp_path_factory):
    """while kvmgr refuses its pools, /health (and rkvctl status) carry its reason, so an
    operator sees the target to set without reading the logs"""
    import re
    from conftest import _root, rkv_bin
    root = _root(tmp_path_factory, "hp")
    log = root / "rkvd.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([rkv_bin("rkvd"), "--model", str(tiny_model), "--listen",
                                 "127.0.0.1:0", "--backend", "cpu", "--state-dir",
                                 str(root / "s"), "--runtime-dir", str(root / "r"),
                                 "--vram-target", "4KiB"], stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline, port, body = time.monotonic() + 15, None, ""
        while time.monotonic() < deadline and "leaves no room" not in body:
            time.sleep(0.1)
            m = port or re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())
            port = port or (int(m.group(1)) if m else None)
            if not port:
                continue
            c = http_client(port)
            c.request("GET", "/health")
            r = c.getresponse()
            body = r.read().decode()
            assert r.status == 503, body
        assert "kvmgr has no kv pools: gpu 0: vram target 4.00 KiB leaves no room" in body, body
        assert "raise --vram-target to" in body
        json.loads(body)  # still a JSON object
    finally:
        proc.terminate()
        proc.wait(60)


def http_client(port):
    import http.client
    return http.client.HTTPConnection("127.0.0.1", port, timeout=5)


def test_step_smaller_than_the_running_sequences_is_refused_at_start(tmp_path, tiny_model):
    """a step carries a token of every running sequence: rkvd refuses max_batch_tokens below
    max_running itself (not a worker that cannot set up its forward pass), and the worker alone
    says the same of its own switches"""
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvd"), "--model", str(tmp_path / "m.gguf"),
                        "--max-batch-tokens", "8", "--state-dir", str(tmp_path / "s"),
                        "--runtime-dir", str(tmp_path / "r")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, r.stderr
    assert "--max-batch-tokens 8 is below --max-running 64" in r.stderr, r.stderr
    assert "max_batch_tokens 0" in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()
    r = subprocess.run([rkv_bin("rkv-worker"), "--model", str(tiny_model), "--backend", "cpu",
                        "--max-seqs", "64", "--max-batch-tokens", "8", "--runtime-dir",
                        str(tmp_path / "w")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    assert "--max-seqs 64 is more than --max-batch-tokens 8" in r.stderr, r.stderr
