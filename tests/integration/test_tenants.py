"""Tenant isolation against a real rkvd with API keys, through the openai client and raw HTTP:
a session belongs to the key that made it (another key naming it gets its own), the prefix
cache is partitioned by key (cached_tokens and the hit counter never reveal another key's text),
a user key's admin reads show only its own sessions, and the gauges count what really runs."""
import json
import threading
import time

import openai
import pytest

from conftest import Rkvd, _root, _stop_checked

SECRET = [{"role": "system", "content": "You keep secrets for the user and never tell."},
          {"role": "user", "content": "Remember this: my locker code is 4821. Reply ok."}]
GUESS = [SECRET[0], {"role": "user", "content": "Remember this: my locker code is 1234. Reply ok."}]
# long enough for several 16-token blocks
SYSTEM = ("You are a careful assistant of the rkv test suite. Answer briefly, cite nothing, "
          "and keep every answer under ten words unless asked otherwise. " * 3)


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    s = Rkvd(tiny_model, _root(tmp_path_factory, "tenants"),
             ["--block-size", "16", "--max-running", "64"]).start()
    yield s
    _stop_checked(s)


@pytest.fixture(scope="module")
def keys(srv):
    a = srv.ctl("keys", "add", "tenant-a")
    b = srv.ctl("keys", "add", "tenant-b")
    c = srv.ctl("keys", "add", "tenant-c")
    adm = srv.ctl("keys", "add", "ops", "--scope", "admin")
    return {"a": a, "b": b, "c": c, "admin": adm}


def client(srv, key):
    return openai.OpenAI(base_url=srv.base_url, api_key=key["secret"], max_retries=0)


def chat(srv, key, messages, session=None, n=4, **kw):
    extra = {"ignore_eos": True, **({"session_id": session} if session else {})}
    return client(srv, key).chat.completions.create(
        model="tiny", messages=messages, max_tokens=n, temperature=0, extra_body=extra, **kw)


def cached(r):
    d = r.usage.prompt_tokens_details
    return (d.cached_tokens or 0) if d else 0


def admin_get(srv, key, path):
    hdr = {"Authorization": "Bearer " + key["secret"]} if key else None
    st, _, body = srv.request("GET", "/admin/v1/" + path, headers=hdr)
    return st, json.loads(body)


def hits(srv):
    return srv.metric("rkv:prefix_cache_hits_total")


def test_session_belongs_to_its_key(srv, keys):
    a, b = keys["a"], keys["b"]
    chat(srv, a, SECRET, session="conv-x")
    # a's next turn reuses its own KV
    turn2 = SECRET + [{"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "thanks"}]
    assert cached(chat(srv, a, turn2, session="conv-x")) > 0
    # b naming the same session with a's very text gets a session of its own: no cached
    # token, no hit counted
    before = hits(srv)
    assert cached(chat(srv, b, turn2, session="conv-x")) == 0
    assert hits(srv) == before, "b's prompt was served from a's KV"
    # nor does a wrong guess of a third key tell anything
    assert cached(chat(srv, keys["c"], GUESS, session="conv-x")) == 0
    assert hits(srv) == before
    # b's session goes on from b's own turn
    turn3 = turn2 + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "bye"}]
    assert cached(chat(srv, b, turn3, session="conv-x")) > 0
    # a's session is a's still: b overwrote nothing
    assert cached(chat(srv, a, turn3, session="conv-x")) > 0


def test_prefix_cache_partitioned_by_key(srv, keys):
    a, b = keys["a"], keys["b"]
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello there"}]
    chat(srv, a, msgs)
    ra = chat(srv, a, msgs)
    assert cached(ra) >= 16, "a's own prefix should be cached (16-token blocks)"
    before = hits(srv)
    rb = chat(srv, b, msgs)
    assert cached(rb) == 0
    assert hits(srv) == before, "b's prompt was served from a's cached blocks"
    # b's own repeat is cached: the partition, not a disabled cache
    assert cached(chat(srv, b, msgs)) >= 16


def test_busy_state_is_per_key(srv, keys):
    a, b = keys["a"], keys["b"]
    stream = client(srv, a).chat.completions.create(
        model="tiny", messages=SECRET, max_tokens=1900, temperature=0, stream=True,
        extra_body={"ignore_eos": True, "session_id": "conv-busy"})
    it = iter(stream)
    next(it)
    try:
        # a second request of a on its busy session: 409
        with pytest.raises(openai.APIStatusError) as e:
            chat(srv, a, SECRET, session="conv-busy")
        assert e.value.status_code == 409
        # b's session of that name is b's: a's busy one blocks nothing of b
        r = chat(srv, b, SECRET, session="conv-busy")
        assert r.choices[0].finish_reason == "length"
    finally:
        stream.close()


def test_admin_reads_show_a_user_key_its_own(srv, keys):
    a, b, adm = keys["a"], keys["b"], keys["admin"]
    chat(srv, a, SECRET, session="conv-admin")
    chat(srv, b, GUESS, session="conv-admin-b")
    # with keys, even a loopback peer needs one (behind a proxy every peer is loopback)
    for path in ("sessions_list", "session_show?session=conv-admin", "events", "keys_list",
                 "status"):
        st, body = admin_get(srv, None, path)
        assert st == 401 and "Bearer" in body["error"]["message"], path

    st, body = admin_get(srv, b, "sessions_list")
    assert st == 200
    mine = body["result"]["sessions"]
    assert mine and all(s["key"] == b["id"] for s in mine)
    assert "conv-admin" not in {s["id"] for s in mine}
    st, body = admin_get(srv, a, "sessions_list")
    a_sids = {s["sid"] for s in body["result"]["sessions"] if s["id"] == "conv-admin"}
    assert len(a_sids) == 1
    a_sid = a_sids.pop()

    # another key's session is not there for b, by name or by number
    for q in ("conv-admin", f"%23{a_sid}", str(a_sid)):
        st, body = admin_get(srv, b, "session_show?session=" + q)
        assert st == 404, (q, body)
        st, body = admin_get(srv, b, "events?session=" + q)
        assert st == 404, (q, body)
    st, body = admin_get(srv, a, "session_show?session=conv-admin")
    assert st == 200 and body["result"]["session"]["sid"] == a_sid

    # events: b sees those of its sessions only
    b_sids = {s["sid"] for s in admin_get(srv, b, "sessions_list")[1]["result"]["sessions"]}
    st, body = admin_get(srv, b, "events?limit=1000")
    assert st == 200 and all(e["session"] in b_sids for e in body["result"]["events"])

    # the key list is an admin's
    st, body = admin_get(srv, b, "keys_list")
    assert st == 403 and "admin scope" in body["error"]["message"]
    st, body = admin_get(srv, adm, "keys_list")
    assert st == 200 and {a["id"], b["id"]} <= {k["id"] for k in body["result"]["keys"]}
    # server-wide figures stay readable to a user key, as /metrics is
    st, body = admin_get(srv, b, "status")
    assert st == 200 and body["result"]["api_keys"] >= 3

    # the admin key and the socket see every key's sessions; a name two keys share is
    # ambiguous for them and named by number instead
    st, body = admin_get(srv, adm, "sessions_list")
    owners = {s["key"] for s in body["result"]["sessions"]}
    assert {a["id"], b["id"]} <= owners
    assert {s["key"] for s in srv.ctl("sessions", "list")["sessions"]} >= {a["id"], b["id"]}
    st, body = admin_get(srv, adm, "session_show?session=conv-x")
    assert st == 400 and "#N" in body["error"]["message"]
    st, body = admin_get(srv, adm, f"session_show?session=%23{a_sid}")
    assert st == 200 and body["result"]["session"]["key"] == a["id"]

    # a user key changes nothing
    st, _, body = srv.request("POST", "/admin/v1/session_evict", {"session": f"#{a_sid}"},
                              headers={"Authorization": "Bearer " + b["secret"]})
    assert st == 403


def test_gauges_count_running_streams(srv, keys):
    """every stream that receives tokens counts as running, in /metrics and in status"""
    n = 12
    started = threading.Barrier(n + 1, timeout=60)
    stop = threading.Event()
    errors = []

    def one(i):
        try:
            s = client(srv, keys["a"]).completions.create(
                model="tiny", prompt=f"stream {i}", max_tokens=2000, temperature=0, stream=True,
                extra_body={"ignore_eos": True})
            it = iter(s)
            next(it)
            started.wait()
            while not stop.is_set():
                next(it)
            s.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
            started.abort()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        started.wait()
        running = srv.metric("rkv:num_requests_running")
        waiting = srv.metric("rkv:num_requests_waiting")
        st, body = admin_get(srv, keys["admin"], "status")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert (running, waiting) == (n, 0)
    assert st == 200 and body["result"]["requests"]["running"] == n
    # and back to nothing once they are gone
    deadline = time.monotonic() + 20
    while srv.metric("rkv:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.metric("rkv:num_requests_running") == 0


def test_prefix_cache_scope_global(tiny_model, tmp_path_factory):
    """global: the operator's choice for one tenant; keys then share cached prefixes"""
    s = Rkvd(tiny_model, _root(tmp_path_factory, "global"),
             ["--block-size", "16", "--prefix-cache-scope", "global"]).start()
    try:
        a = s.ctl("keys", "add", "a")
        b = s.ctl("keys", "add", "b")
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
        chat(s, a, msgs)
        assert cached(chat(s, b, msgs)) >= 16
    finally:
        _stop_checked(s)
