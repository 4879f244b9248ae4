"""A child that is alive but answers nothing (found by the fault campaign; here SIGSTOP stands in
for it): a kvmgr silent for kvmgr_timeout, or a worker whose step failed after step_timeout, is
killed by rkvd and started again by the supervisor, and a request sent meanwhile is answered with
the same text as before."""
import os
import signal
import threading
import time

import openai


def test_hung_kvmgr_is_restarted(rkvd_factory):
    srv = rkvd_factory("--kvmgr-timeout", "2")
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    want = c.completions.create(model="tiny", prompt="the fox", max_tokens=8, temperature=0)
    old = srv.child_pid("rkv-kvmgr")
    os.kill(old, signal.SIGSTOP)
    out = {}

    def ask():
        try:
            out["r"] = c.completions.create(model="tiny", prompt="the fox", max_tokens=8,
                                            temperature=0)
        except Exception as e:  # noqa: BLE001 - judged below
            out["e"] = e
    t = threading.Thread(target=ask, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(40)
    assert not t.is_alive(), "the request hung behind the stopped kvmgr"
    assert "e" not in out, out.get("e")
    assert out["r"].choices[0].text == want.choices[0].text
    assert time.monotonic() - t0 < 30
    new = srv.child_pid("rkv-kvmgr")
    assert new != old
    assert "has not answered for 2 s: killing it" in srv.log()
    st, _, _ = srv.request("GET", "/health")
    assert st == 200


def test_hung_worker_is_restarted(rkvd_factory):
    # a worker that stops answering mid-load: its step fails after step_timeout, rkvd sees the
    # process still there and kills it, the new one continues the request from kvmgr's KV
    srv = rkvd_factory("--step-timeout", "2")
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    want = c.completions.create(model="tiny", prompt="the fox", max_tokens=8, temperature=0)
    old = srv.child_pid("rkv-worker")
    os.kill(old, signal.SIGSTOP)
    out = {}

    def ask():
        try:
            out["r"] = c.completions.create(model="tiny", prompt="the fox", max_tokens=8,
                                            temperature=0)
        except Exception as e:  # noqa: BLE001 - judged below
            out["e"] = e
    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(40)
    assert not t.is_alive(), "the request hung behind the stopped worker"
    assert "e" not in out, out.get("e")
    assert out["r"].choices[0].text == want.choices[0].text
    assert srv.child_pid("rkv-worker") != old
    assert "is alive but did not answer its step within step_timeout (2 s): killing it" in srv.log()
