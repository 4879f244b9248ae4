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
        # kvmgr reports a tail's growth ("tail resized", from == to) once a second: let the
        # last of the request's arrive before counting
        time.sleep(1.5)
        ev2 = events(srv)
        assert ev2[:len(ev)] == ev, ev2
        assert srv.metric("rkv:tactic_transitions_total", to="cpu_tail") == len(spills(ev2))
        assert any(e["to"] == "cpu_tail" for e in rkvctl_events(srv))
        # every transition is recorded once, though EVENTS_GET runs on every STATUS that is
        # ahead: none twice, and nothing more comes
        assert len(set(ev2)) == len(ev2), ev2
        time.sleep(0.6)
        assert events(srv) == ev2

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


def test_tail_follows_the_session_as_it_grows(rkvd_factory):
    """a spilled session's tail grows with the session without a change of tactic: kvmgr sends
    each change as an event from the tactic to itself ("tail resized"), so `rkvctl sessions
    list` shows the host blocks a step really streams. Before, it showed the tail of the first
    spill (1-2 blocks) for the whole life of the session. The worker is stopped mid-stream
    (SIGSTOP), so the session holds still while kvmgr's once-a-second report catches up."""
    from test_rkvctl import ok, wait_for
    srv = rkvd_factory(*TIGHT)
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
    stream = c.completions.create(model="tiny", prompt="a named story that outgrows the pool",
                                  max_tokens=1200, temperature=0, stream=True,
                                  extra_body={"ignore_eos": True, "session_id": "grows"})
    room = 8 * 16  # the device pool: 8 blocks of 16 positions
    worker = srv.child_pid("rkv-worker")
    n = 0
    for _ in stream:
        n += 1
        if n == 3 * room:
            os.kill(worker, signal.SIGSTOP)
            break
    try:
        def caught_up():
            s = [x for x in ok(srv, "sessions", "list")["sessions"] if x["id"] == "grows"]
            if s and s[0]["tactic"] == "cpu_tail" and \
                    s[0]["tail_tokens"] >= s[0]["kv_tokens"] - room:
                return s[0]
            return None

        s = wait_for(caught_up, "the tail of the stopped session to cover what the device "
                     "cannot hold", timeout=10)
        assert s["kv_tokens"] > 2 * room, s
    finally:
        os.kill(worker, signal.SIGCONT)
    for _ in stream:
        pass
    resized = [e for e in events(srv) if e[1] == e[2] == "cpu_tail"]
    assert resized and all(e[3].startswith("tail resized") for e in resized), events(srv)
