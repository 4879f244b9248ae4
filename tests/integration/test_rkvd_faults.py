"""rkvd under faults, with streams in flight: a SIGKILLed worker is restarted and its requests
go on with the same tokens (KV survives in kvmgr); a SIGKILLed kvmgr ends every request cleanly
(completed, or a 5xx) and rkvd recovers; SIGTERM lets running streams finish and exits 0;
clients that leave, a worker that keeps dying, a busy port, a restart of rkvd itself."""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

openai = pytest.importorskip("openai")

N_TOK = 300


def prompts(n):
    return [f"stream number {i} tells a story about" + " fox" * (i % 5) for i in range(n)]


class Streams:
    """n streaming completions on threads; each records its text, finish reason and error"""

    def __init__(self, srv, ps, max_tokens=N_TOK, timeout=60, sampling=None):
        self.sampling = sampling or {"temperature": 0}
        self.c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0,
                               timeout=timeout)
        self.ps = ps
        self.max_tokens = max_tokens
        self.text = [""] * len(ps)
        self.chunks = [0] * len(ps)
        self.finish = [None] * len(ps)
        self.error = [None] * len(ps)
        self.done = [False] * len(ps)
        self.cv = threading.Condition()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(len(ps))]

    def _run(self, i):
        try:
            s = self.c.completions.create(model="tiny", prompt=self.ps[i],
                                          max_tokens=self.max_tokens, stream=True,
                                          extra_body={"ignore_eos": True}, **self.sampling)
            for chunk in s:
                with self.cv:
                    self.text[i] += chunk.choices[0].text
                    self.chunks[i] += 1
                    self.finish[i] = chunk.choices[0].finish_reason or self.finish[i]
                    self.cv.notify_all()
        except Exception as e:  # noqa: BLE001 - recorded and judged by the test
            self.error[i] = e
        with self.cv:
            self.done[i] = True
            self.cv.notify_all()

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def wait_all_started(self, min_chunks=5, timeout=60):
        """until every stream has min_chunks chunks (or ended)"""
        with self.cv:
            ok = self.cv.wait_for(
                lambda: all(n >= min_chunks or d for n, d in zip(self.chunks, self.done)),
                timeout)
            assert ok, f"streams did not start: {self.chunks}"
            return sum(1 for d in self.done if not d)

    def join(self, timeout=90):
        for t in self.threads:
            t.join(timeout)
        hung = [i for i, t in enumerate(self.threads) if t.is_alive()]
        assert not hung, f"streams {hung} hang"
        return self


def baseline(srv, ps, sampling=None, max_tokens=N_TOK):
    s = Streams(srv, ps, max_tokens=max_tokens, sampling=sampling).start().join()
    assert s.error == [None] * len(ps), s.error
    assert s.finish == ["length"] * len(ps)
    return s.text


def test_worker_sigkill_during_16_streams(rkvd_factory):
    srv = rkvd_factory()
    ps = prompts(16)
    # long enough that the kill lands while they run (300 tokens could end first)
    want = baseline(srv, ps, max_tokens=1200)
    restarts0 = srv.metric("rkv:worker_restarts_total")
    worker = srv.child_pid("rkv-worker")

    s = Streams(srv, ps, max_tokens=1200).start()
    running = s.wait_all_started()
    prefill0 = srv.metric("rkv:prefill_tokens_total")
    os.kill(worker, signal.SIGKILL)
    s.join()
    assert running > 0, "every stream ended before the kill: make them longer"
    # the KV stayed in kvmgr: nothing was computed again
    assert srv.metric("rkv:prefill_tokens_total") == prefill0
    assert s.error == [None] * 16, s.error
    assert s.finish == ["length"] * 16
    for i in range(16):
        assert s.text[i] == want[i], f"stream {i} differs after the worker restart"
    assert srv.child_pid("rkv-worker", other_than=worker) != worker
    assert srv.metric("rkv:worker_restarts_total") == restarts0 + 1
    srv.wait_healthy()


def test_worker_sigkill_seeded_sampling_goes_on(rkvd_factory):
    """the rebuilt sampler re-accepts the history and skips the rng draws the request made"""
    srv = rkvd_factory()
    ps = prompts(4)
    sampling = {"temperature": 1.0, "seed": 11}
    want = baseline(srv, ps, sampling)
    s = Streams(srv, ps, sampling=sampling).start()
    s.wait_all_started()
    os.kill(srv.child_pid("rkv-worker"), signal.SIGKILL)
    s.join()
    assert s.error == [None] * 4, s.error
    assert s.text == want


@pytest.mark.parametrize("workers", [1, 2])
def test_kvmgr_sigkill_during_streams(rkvd_factory, ref, workers):
    srv = rkvd_factory("--workers", str(workers), "--threads", str(2 // workers))
    for w in range(workers):
        srv.wait_log(f"worker {w} is up")
    ps = prompts(8)
    want = baseline(srv, ps)
    kvmgr = srv.child_pid("rkv-kvmgr")
    s = Streams(srv, ps, timeout=60).start()
    running = s.wait_all_started()
    os.kill(kvmgr, signal.SIGKILL)
    s.join()
    assert running > 0
    for i in range(8):
        e = s.error[i]
        if e is None:
            assert s.finish[i] == "length", f"stream {i} ended without a finish reason"
            # the KV was rebuilt from the token history: the same tokens
            assert s.text[i] == want[i], f"stream {i} differs after the kvmgr restart"
            continue
        # a clean server error: an HTTP 5xx, or an SSE error event mid-stream
        assert isinstance(e, openai.APIError) and not isinstance(e, openai.APITimeoutError), \
            f"stream {i}: {e!r}"
        status = getattr(e, "status_code", None)
        assert status is None or status >= 500, f"stream {i}: {e!r}"

    # rkvd serves again on a new kvmgr, with the same answers
    assert srv.child_pid("rkv-kvmgr", other_than=kvmgr) != kvmgr
    srv.wait_healthy()
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    want = ref.gen("after the kvmgr restart", n=12)
    r = c.completions.create(model="tiny", prompt="after the kvmgr restart", max_tokens=12,
                             temperature=0)
    assert r.choices[0].text == want["text"]


def test_kvmgr_sigkill_mid_grammar_answer_continues(rkvd_factory):
    """a JSON-constrained answer part way when kvmgr dies: its history is prefilled again in
    chunks, the chunk that samples replays the answer so far into the grammar, and the answer
    is the uninterrupted one (the first chunk once replayed prompt tokens into the grammar, and
    the request failed with 500)"""
    srv = rkvd_factory("--prefill-chunk", "64", "--max-batch-tokens", "128")
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    prompt = " ".join(f"item {i} is a plain word list entry" for i in range(40))
    # forty items at least: an answer of about 250 tokens
    schema = {"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "integer"}, "minItems": 40}},
        "required": ["items"], "additionalProperties": False}
    kw = dict(model="tiny", prompt=prompt, max_tokens=300, temperature=0,
              extra_body={"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "items", "schema": schema}}})
    want = c.completions.create(**kw).choices[0].text
    kvmgr = srv.child_pid("rkv-kvmgr")
    got, n = "", 0
    for chunk in c.completions.create(stream=True, **kw):
        got += chunk.choices[0].text if chunk.choices else ""
        n += 1
        if n == 20:
            os.kill(kvmgr, signal.SIGKILL)
    assert n > 20 and srv.child_pid("rkv-kvmgr", other_than=kvmgr) != kvmgr
    assert got == want
    assert len(json.loads(got)["items"]) >= 40


def test_sigterm_lets_streams_finish(rkvd_factory):
    srv = rkvd_factory()
    ps = prompts(8)
    want = baseline(srv, ps)
    s = Streams(srv, ps).start()
    running = s.wait_all_started()
    srv.proc.send_signal(signal.SIGTERM)
    s.join()
    assert running > 0
    assert s.error == [None] * 8, s.error
    assert s.finish == ["length"] * 8
    assert s.text == want
    assert srv.stop(signal_it=False) == 0
    assert srv.stragglers() == []


def test_busy_port_exits_1_and_stops_children(tiny_model, tmp_path_factory):
    from conftest import Rkvd, rkv_bin
    srv = Rkvd(tiny_model, tmp_path_factory.mktemp("busy"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([rkv_bin("rkvd"), "--model", str(tiny_model), "--listen",
                            f"127.0.0.1:{port}", "--backend", "cpu", "--state-dir",
                            str(srv.state_dir), "--runtime-dir", str(srv.run_dir), "--threads",
                            "1"], capture_output=True, timeout=60)
    log = r.stderr.decode(errors="replace")
    assert r.returncode == 1, log
    assert f"127.0.0.1:{port}" in log and "address already in use" in log, log
    assert srv.stragglers() == []


def test_named_session_after_kvmgr_restart(rkvd_factory, ref):
    """the session's KV is gone with kvmgr: its next turn is computed from the token history"""
    srv = rkvd_factory()
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    p1 = list(ref.tokens("A conversation that outlives its kvmgr"))
    a1 = ref.gen(ids=tuple(p1), n=8)
    c.completions.create(model="tiny", prompt=p1, max_tokens=8, temperature=0,
                         extra_body={"session_id": "survivor"})
    kvmgr = srv.child_pid("rkv-kvmgr")
    os.kill(kvmgr, signal.SIGKILL)
    srv.wait_log("kvmgr restarted")
    srv.wait_healthy()
    p2 = p1 + a1["ids"] + list(ref.tokens(" and then", bos=False))
    hits0 = srv.metric("rkv:prefix_cache_hits_total")
    pre0 = srv.metric("rkv:prefill_tokens_total")
    r = c.completions.create(model="tiny", prompt=p2, max_tokens=8, temperature=0,
                             extra_body={"session_id": "survivor"})
    assert r.choices[0].text == ref.gen(ids=tuple(p2), n=8)["text"]
    assert srv.metric("rkv:prefix_cache_hits_total") == hits0
    assert srv.metric("rkv:prefill_tokens_total") - pre0 == len(p2)


def test_worker_that_keeps_dying_stops_rkvd_nonzero(rkvd_factory):
    srv = rkvd_factory()
    pid = None
    for _ in range(6):  # 5 restarts are allowed within the window
        new = srv.child_pid("rkv-worker", timeout=30)
        assert new != pid
        pid = new
        os.kill(pid, signal.SIGKILL)
        if srv.proc.poll() is not None:
            break
        deadline = time.monotonic() + 30
        while srv.proc.poll() is None and os.path.exists(f"/proc/{pid}") and \
                _state(pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    code = srv.stop(signal_it=False)
    assert code == 1, srv.log()[-3000:]
    assert "keeps dying" in srv.log()
    assert srv.stragglers() == []


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_sigterm_deadline_cuts_long_streams_and_exits_0(rkvd_factory):
    srv = rkvd_factory("--shutdown-timeout", "1")
    s = Streams(srv, prompts(16), max_tokens=1900).start()
    s.wait_all_started()
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    s.join()
    assert srv.stop(signal_it=False) == 0
    # 1 s for the streams, then the children's own shutdown
    assert time.monotonic() - t0 < 15
    assert srv.stragglers() == []
    for i in range(16):
        # cut at the deadline (the connection closes) or finished in time
        assert s.error[i] is not None or s.finish[i] == "length"


def test_clients_leaving_mid_stream_do_not_disturb_the_rest(rkvd_factory):
    import http.client
    srv = rkvd_factory()
    ps = prompts(16)
    want = baseline(srv, ps)
    # 16 streams that stay, and 16 whose clients leave after their first chunk
    conns = []
    for i in range(16):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                  body=json.dumps({"prompt": f"leaving {i}", "max_tokens": 1500,
                                   "stream": True, "ignore_eos": True}))
        conns.append(c)
    s = Streams(srv, ps).start()
    for c in conns:
        r = c.getresponse()
        assert r.status == 200
        r.fp.readline()
        c.close()
    s.join()
    assert s.error == [None] * 16, s.error
    assert s.text == want
    # the cancelled ones are gone too
    deadline = time.monotonic() + 30
    while srv.metric("rkv:num_requests_running") != 0:
        assert time.monotonic() < deadline, "cancelled requests still run"
        time.sleep(0.05)
    assert srv.request("GET", "/health")[0] == 200


def test_worker_sigkill_during_chunked_prefill(rkvd_factory, ref):
    """long prompts, prefilled 256 tokens a step: a worker killed part way re-runs no more
    than the chunk it was computing, and every answer is the uninterrupted one"""
    srv = rkvd_factory("--prefill-chunk", "256", "--max-batch-tokens", "512")
    ps = [[507] + [(i * 13 + k * 7) % 500 + 1 for k in range(1800)] for i in range(4)]
    wants = [ref.gen(ids=tuple(p), n=8, sampling=("--temp", "0", "--ignore-eos"))["text"]
             for p in ps]
    worker = srv.child_pid("rkv-worker")
    pre0 = srv.metric("rkv:prefill_tokens_total")
    s = Streams(srv, ps, max_tokens=8).start()
    deadline = time.monotonic() + 30
    while srv.metric("rkv:prefill_tokens_total") == pre0:  # part way into the prompts
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(worker, signal.SIGKILL)
    s.join()
    assert s.error == [None] * 4, s.error
    assert s.text == wants
    total = sum(len(p) for p in ps)
    # at most one step (512 tokens) computed again
    assert total <= srv.metric("rkv:prefill_tokens_total") - pre0 <= total + 512


def test_sigterm_right_after_a_worker_sigkill(rkvd_factory):
    """the worker is restarted while rkvd drains: the streams still finish, exit 0"""
    srv = rkvd_factory()
    ps = prompts(8)
    want = baseline(srv, ps)
    s = Streams(srv, ps).start()
    s.wait_all_started()
    os.kill(srv.child_pid("rkv-worker"), signal.SIGKILL)
    srv.proc.send_signal(signal.SIGTERM)
    s.join()
    assert s.error == [None] * 8, s.error
    assert s.text == want
    assert srv.stop(signal_it=False) == 0
    assert srv.stragglers() == []


def test_sigterm_with_a_step_stuck_in_a_stopped_worker_exits(rkvd_factory):
    """a step that no worker will answer (its worker is SIGSTOPped) does not hold rkvd past
    the drain: the streams are cut at shutdown_timeout and rkvd exits, well before
    step_timeout"""
    srv = rkvd_factory("--shutdown-timeout", "1", "--step-timeout", "120")
    s = Streams(srv, prompts(4), max_tokens=1900).start()
    s.wait_all_started()
    worker = srv.child_pid("rkv-worker")
    os.kill(worker, signal.SIGSTOP)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    s.join()
    # 1 s of drain, then 5 s for the children before SIGKILL
    assert srv.stop(timeout=30, signal_it=False) == 0
    assert time.monotonic() - t0 < 20
    assert srv.stragglers() == []
    assert all(e is not None for e in s.error), s.error


def test_second_sigterm_exits_now_and_takes_the_children(rkvd_factory):
    """a second signal during the drain means "exit now": rkvd exits 1 at once, and kvmgr and
    the worker go with it rather than outliving it"""
    srv = rkvd_factory("--shutdown-timeout", "60")
    s = Streams(srv, prompts(2), max_tokens=1900).start()
    s.wait_all_started()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.stop(timeout=10, signal_it=False) == 1
    deadline = time.monotonic() + 5
    while srv.stragglers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.stragglers() == []
    s.join()


def test_named_session_across_an_rkvd_restart(tiny_model, tmp_path_factory, ref):
    """the state dir keeps the session's tokens; the next rkvd recomputes its KV"""
    from conftest import Rkvd, _stop_checked
    root = tmp_path_factory.mktemp("again")
    p1 = list(ref.tokens("Remember this across a restart"))
    a1 = ref.gen(ids=tuple(p1), n=8)
    p2 = p1 + a1["ids"] + list(ref.tokens(" and then", bos=False))
    body = {"max_tokens": 8, "temperature": 0, "session_id": "durable"}
    srv = Rkvd(tiny_model, root).start()
    try:
        st, _, data = srv.request("POST", "/v1/completions", body={"prompt": p1, **body})
        assert st == 200 and json.loads(data)["choices"][0]["text"] == a1["text"]
    finally:
        _stop_checked(srv)
    srv = Rkvd(tiny_model, root).start()
    try:
        st, _, data = srv.request("POST", "/v1/completions", body={"prompt": p2, **body})
        assert st == 200, data
        r = json.loads(data)
        assert r["choices"][0]["text"] == ref.gen(ids=tuple(p2), n=8)["text"]
        assert r["usage"]["prompt_tokens"] == len(p2)
    finally:
        _stop_checked(srv)


def test_request_during_a_worker_restart_waits_for_it(rkvd_factory, ref):
    """once serving, a request that arrives while the worker restarts is queued, not a 503"""
    srv = rkvd_factory()
    worker = srv.child_pid("rkv-worker")
    os.kill(worker, signal.SIGKILL)
    srv.wait_log("worker0 died")
    st, _, data = srv.request("POST", "/v1/completions",
                              body={"prompt": "while it restarts", "max_tokens": 8,
                                    "temperature": 0})
    assert st == 200, data
    assert json.loads(data)["choices"][0]["text"] == ref.gen("while it restarts", n=8)["text"]
    assert srv.child_pid("rkv-worker", other_than=worker) != worker


def test_worker_silent_after_its_restart_is_dialed_anew(rkvd_factory):
    """a restarted worker that does not answer hello for 10 s (stopped here; a model still
    loading, or an nng 1.5 dialer stuck after its peer's restart) gets a fresh socket from the
    driver, and rkvd serves again once it answers"""
    srv = rkvd_factory()
    old = srv.child_pid("rkv-worker")
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 20
    new = None
    while new is None and time.monotonic() < deadline:
        try:
            p = srv.child_pid("rkv-worker")
        except Exception:  # noqa: BLE001 - between the old one and the new one
            p = None
        if p and p != old:
            new = p
            os.kill(new, signal.SIGSTOP)
        time.sleep(0.001)
    assert new, "the worker was not restarted"
    try:
        srv.wait_log("has not answered hello for 10 s", timeout=30)
    finally:
        os.kill(new, signal.SIGCONT)
    srv.wait_log("dialing it anew")
    srv.wait_healthy(30)
    st, _, body = srv.request("POST", "/v1/completions", body={"prompt": "hi", "max_tokens": 3})
    assert st == 200, body
