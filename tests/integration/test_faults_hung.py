"""A child that is alive but answers nothing (found by the fault campaign; here SIGSTOP stands in
for it): a kvmgr silent for kvmgr_timeout, or a worker whose step failed after step_timeout, is
killed by rkvd and started again by the supervisor, and a request sent meanwhile is answered with
the same text as before."""
import os
import signal
import threading
import time

import openai
import pytest


@pytest.mark.parametrize("child,flag,killed", [
    ("rkv-kvmgr", "--kvmgr-timeout", "has not answered for 2 s: killing it"),
    # a worker that stops answering mid-load: its step fails after step_timeout, rkvd sees the
    # process still there and kills it, the new one continues the request from kvmgr's KV
    ("rkv-worker", "--step-timeout",
     "is alive but did not answer its step within step_timeout (2 s): killing it"),
])
def test_hung_child_is_restarted(rkvd_factory, child, flag, killed):
    srv = rkvd_factory(flag, "2")
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    want = c.completions.create(model="tiny", prompt="the fox", max_tokens=8, temperature=0)
    old = srv.child_pid(child)
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
    assert not t.is_alive(), f"the request hung behind the stopped {child}"
    assert "e" not in out, out.get("e")
    assert out["r"].choices[0].text == want.choices[0].text
    assert time.monotonic() - t0 < 30
    assert srv.child_pid(child, other_than=old) != old
    assert killed in srv.log()
    st, _, _ = srv.request("GET", "/health")
    assert st == 200
