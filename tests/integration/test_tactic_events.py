"""kvmgr's tactic transitions reach rkvd's event log, rkv:tactic_transitions_total and `rkvctl
events` even when pub/sub never delivers them: pub/sub drops what is published while no
subscriber is connected (rkvd starting, or redialing a restarted kvmgr), so kvmgr numbers its
transitions, STATUS carries the newest number, and rkvd fetches what it has not seen with
EVENTS_GET."""
import json
import os
import signal
import subprocess
import time

import pytest

openai = pytest.importorskip("openai")
from test_residency import events, wait_events  # noqa: E402 (after the skip)

# one block = 8 KiB on the tiny model with 16 positions per block: 8 device blocks, so a
# request of ~200 positions spills; --mode cpu_tail makes the spilled tactic cpu_tail
TIGHT = ("--block-size", "16", "--vram-target", "64KiB", "--host-budget", "8MiB",
         "--mode", "cpu_tail")


def long_request(srv, prompt):
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=200, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"


def rkvctl_events(srv):
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"), "--json",
                        "events"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(r.stdout)["events"]


def spills(ev):
    return [e for e in ev if e[2] == "cpu_tail"]


def test_transitions_no_subscriber_heard_are_recorded(tiny_model, tmp_path_factory, monkeypatch):
    from conftest import Rkvd, _stop_checked
    root = tmp_path_factory.mktemp("ev")
    # kvmgr reads its `pub` key from RKV_PUB (rkvd and the workers have no such key): it
    # publishes where no one subscribes, so every transition is published before (and
    # without) rkvd's subscriber, as happens when rkvd connects late or kvmgr restarts
    monkeypatch.setenv("RKV_PUB", f"ipc://{root}/unheard.sock")
    srv = Rkvd(tiny_model, root / "srv", TIGHT).start()
    try:
        long_request(srv, "a story that outgrows the device pool")
        ev = wait_events(srv, lambda ev: spills(ev))
        assert spills(ev), f"no cpu_tail transition recorded: {ev}\n{srv.log()[-3000:]}"
        assert srv.metric("rkv:tactic_transitions_total", to="cpu_tail") == len(spills(ev))
        assert any(e["to"] == "cpu_tail" for e in rkvctl_events(srv))
        # every transition is recorded once, though EVENTS_GET runs on every STATUS that is
        # ahead: none twice
        time.sleep(0.6)
        assert len(events(srv)) == len(ev), events(srv)

        # a restarted kvmgr numbers its transitions from 1 again: rkvd takes them as new
        before = len(spills(events(srv)))
        kvmgr = srv.child_pid("rkv-kvmgr")
        os.kill(kvmgr, signal.SIGKILL)
        srv.wait_log("kvmgr restarted")
        srv.wait_healthy()
        long_request(srv, "another story after kvmgr came back")
        ev = wait_events(srv, lambda ev: len(spills(ev)) > before)
        assert len(spills(ev)) > before, f"nothing recorded after the restart: {ev}"
        assert srv.metric("rkv:tactic_transitions_total", to="cpu_tail") == len(spills(ev))
    finally:
        _stop_checked(srv)


def test_transitions_at_start_need_no_wait(rkvd_factory):
    """the first transitions of a fresh server are recorded without waiting for rkvd's
    subscriber (pub/sub delivers them when it is connected; EVENTS_GET when it is not)"""
    srv = rkvd_factory(*TIGHT)
    long_request(srv, "a story told at once")
    ev = wait_events(srv, lambda ev: spills(ev))
    assert spills(ev), ev
    time.sleep(0.6)
    ev = events(srv)
    assert srv.metric("rkv:tactic_transitions_total") == len(ev), ev
