"""rkvctl against a real rkvd (CPU backend, tiny model): every command in --json form, budgets
that re-plan sessions live and survive a restart, API keys on /v1 and /admin/v1, and the exit
codes and one-line messages for bad values, unknown commands and a daemon that is not there."""
import grp
import json
import os
import shutil
import socket
import stat
import subprocess
import time

import pytest

import conftest
from conftest import rkv_bin


def rkvctl(srv_or_sock, *args, json_out=True, timeout=60):
    """(exit code, parsed JSON or stdout text, stderr text)"""
    sock = srv_or_sock if isinstance(srv_or_sock, str) else str(srv_or_sock.run_dir /
                                                               "admin.sock")
    argv = [rkv_bin("rkvctl"), "--socket", sock] + (["--json"] if json_out else []) + list(args)
    r = subprocess.run(argv, capture_output=True, timeout=timeout, text=True)
    out = r.stdout
    if json_out and out.strip():
        try:
            out = json.loads(out)
        except ValueError:  # --watch / --follow: one object per line
            out = [json.loads(ln) for ln in out.strip().splitlines()]
    return r.returncode, out, r.stderr


def ok(srv, *args):
    rc, out, err = rkvctl(srv, *args)
    assert rc == 0, f"rkvctl {' '.join(args)} -> {rc}: {err}"
    return out


def complete(srv, prompt, session=None, n=8, headers=None):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    if session:
        body["session_id"] = session
    st, _, data = srv.request("POST", "/v1/completions", body, headers=headers)
    assert st == 200, data
    return json.loads(data)


def wait_for(fn, what, timeout=20):
    """polls fn until it returns something true (the histogram comes once a second)"""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def hist(srv):
    return ok(srv, "tactics")["gpus"][0]["sessions"]


@pytest.fixture(scope="module")
def srv(tiny_model, tmp_path_factory):
    s = conftest.Rkvd(tiny_model, tmp_path_factory.mktemp("ctl"),
                      ["--block-size", "16", "--admin-group", grp.getgrgid(os.getgid()).gr_name])
    s.start()
    yield s
    conftest._stop_checked(s)


# --- no daemon, usage ------------------------------------------------------------------


def test_daemon_not_running(tmp_path):
    rc, out, err = rkvctl(str(tmp_path / "admin.sock"), "status")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1
    assert "is rkvd running?" in err and "--socket" in err
    # a socket file nobody listens on (an rkvd that was killed)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    rc, out, err = rkvctl(str(stale), "budget", "get")
    assert rc == 2 and "stale" in err
    # RKV_RUNTIME_DIR picks the default socket
    r = subprocess.run([rkv_bin("rkvctl"), "status"], capture_output=True, text=True,
                       env={**os.environ, "RKV_RUNTIME_DIR": str(tmp_path / "nowhere")})
    assert r.returncode == 2 and str(tmp_path / "nowhere" / "admin.sock") in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["frobnicate"], 'unknown command "frobnicate"'),
    (["status", "--bogus"], "unknown option --bogus"),
    (["budget", "set", "--vram-target", "lots"], "expected a size like 512MiB"),
    (["budget", "set"], "give at least one of --vram-target"),
    (["budget", "frob"], "get or set"),
    (["mode", "set", "fast"], "expected auto, resident, window or cpu_tail"),
    (["sessions", "show"], "missing the session ID"),
    (["workers", "restart", "x"], "expected a worker number"),
    (["keys", "add", "bob", "--scope", "root"], "expected user or admin"),
    (["tactics", "--watch", "0"], "--watch: expected seconds"),
    (["events", "--limit", "0"], "--limit: expected a whole number from 1 to 1000"),
    (["help", "nonsense"], 'no help topic "nonsense"'),
    ([], "COMMANDS"),
])
def test_usage_errors(tmp_path, args, needle):
    # refused before any socket is touched: the socket does not exist
    rc, out, err = rkvctl(str(tmp_path / "none.sock"), *args, json_out=False)
    assert rc == 1, err
    assert needle in err


@pytest.mark.parametrize("topic", ["status", "budget", "mode", "tactics", "sessions", "workers",
                                   "events", "keys"])
def test_help_every_command(tmp_path, topic):
    for argv in ([topic, "--help"], ["help", topic]):
        rc, out, err = rkvctl(str(tmp_path / "none.sock"), *argv, json_out=False)
        assert rc == 0, err
        assert out.startswith("NAME\n") and "SYNOPSIS" in out and f"rkvctl {topic}" in out
    for t in ["json", "exit-codes", "sizes", "times"]:
        rc, out, _ = rkvctl(str(tmp_path / "none.sock"), "help", t, json_out=False)
        assert rc == 0 and out.startswith("NAME")
    rc, out, _ = rkvctl(str(tmp_path / "none.sock"), "--help", json_out=False)
    assert rc == 0 and "EXIT STATUS" in out and "exit-codes" in out


# --- every command against a real rkvd ---------------------------------------------------


def test_socket_mode_and_group(srv):
    st = os.stat(srv.run_dir / "admin.sock")
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert st.st_gid == os.getgid()


def test_status(srv):
    s = ok(srv, "status")
    assert s["version"] and s["model"] == "tiny" and s["backend"] == "cpu"
    assert s["deterministic"] is False
    assert s["healthy"] is True and s["health_reason"] == ""
    assert s["kvmgr"]["up"] is True and s["kvmgr"]["pid"] > 0
    assert s["kvmgr"]["mode"] in ("auto", "resident", "window", "cpu_tail")
    assert len(s["workers"]) == 1
    w = s["workers"][0]
    assert w["id"] == 0 and w["gpu"] == -1 and w["up"] is True and w["state"] == "running"
    assert w["pid"] == srv.child_pid("rkv-worker")
    # the step sizes its hello gave it: a cpu worker's defaults
    assert w["max_batch_tokens"] == 512 and w["prefill_chunk"] == 256
    assert w["prefill_beside_decode"] == 256
    assert s["block_size"] == 16 and s["ctx_size"] > 0
    assert s["budgets"]["vram_target"] > 0 and s["budgets"]["host_budget"] == 1 << 30
    assert set(s["pool"]) == {"device_used", "device_total", "host_used", "host_total",
                              "kv_dtype", "kv_bytes_per_token"}
    # the harness's f32 KV: 2 layers x (K, V) x 2 kv heads x 16 dims x 4 bytes a position
    assert s["pool"]["kv_dtype"] == "f32"
    assert s["pool"]["kv_bytes_per_token"] in (0, 2 * 2 * 2 * 16 * 4)  # 0: before the pools
    assert s["uptime_ms"] > 0
    before = s["tokens"]["generated"]
    complete(srv, "status counts tokens", n=5)
    s = ok(srv, "status")
    assert s["tokens"]["generated"] == before + 5
    rc, text, _ = rkvctl(srv, "status", json_out=False)
    assert rc == 0 and "model tiny" in text and "workers:" in text and "budgets:" in text
    assert " tokens " in text and " 512/256/256 " in text, text


def test_mode(srv):
    assert ok(srv, "mode", "get") == {"mode": "auto"}
    assert ok(srv, "mode", "set", "window") == {"mode": "window"}
    assert ok(srv, "mode", "get") == {"mode": "window"}
    assert ok(srv, "status")["kvmgr"]["mode"] in ("window", "auto")  # status polls kvmgr
    assert ok(srv, "mode", "set", "auto") == {"mode": "auto"}
    rc, text, _ = rkvctl(srv, "mode", json_out=False)
    assert rc == 0 and text.strip() == "auto"


def test_sessions(srv):
    complete(srv, "a conversation that the operator will inspect", session="conv-1")
    lst = ok(srv, "sessions", "list")["sessions"]
    mine = [s for s in lst if s["id"] == "conv-1"]
    assert len(mine) == 1
    s = mine[0]
    assert s["tokens"] > 8 and s["kv_tokens"] > 0 and s["busy"] is False
    assert s["pinned"] is False and s["worker"] == 0
    assert s["tactic"] in ("resident", "window", "cpu_tail", "parked")
    assert s["tail_tokens"] <= s["kv_tokens"]
    shown = ok(srv, "sessions", "show", "conv-1")
    assert shown["session"]["sid"] == s["sid"]
    # the numeric id works too, and the events are this session's
    assert ok(srv, "sessions", "show", "#%d" % s["sid"])["session"]["id"] == "conv-1"
    assert all(e["session"] == s["sid"] for e in shown["events"])
    assert ok(srv, "sessions", "pin", "conv-1") == {"sid": s["sid"], "id": "conv-1",
                                                    "pinned": True}
    assert [x for x in ok(srv, "sessions")["sessions"] if x["id"] == "conv-1"][0]["pinned"]
    # a pinned session keeps serving
    complete(srv, "a conversation that the operator will inspect and pin", session="conv-1")
    assert ok(srv, "sessions", "unpin", "conv-1")["pinned"] is False
    assert ok(srv, "sessions", "evict", "conv-1") == {"sid": s["sid"], "id": "conv-1",
                                                      "evicted": True}
    assert not [x for x in ok(srv, "sessions")["sessions"] if x["id"] == "conv-1"]
    rc, out, err = rkvctl(srv, "sessions", "evict", "conv-1")
    assert rc == 3 and 'no session "conv-1"' in err and len(err.strip().splitlines()) == 1
    assert out["ok"] is False and out["error"]["name"] == "not found"
    # the session comes back with its next request (KV rebuilt from the token history)
    complete(srv, "a conversation that the operator will inspect", session="conv-1")
    rc, text, _ = rkvctl(srv, "sessions", json_out=False)
    assert rc == 0 and "conv-1" in text and "tactic" in text


def test_tactics(srv):
    complete(srv, "tactics need a session", session="tac-1")
    h = wait_for(lambda: ok(srv, "tactics") if sum(hist(srv).values()) else None, "a histogram")
    assert h["tactics"] == ["resident", "window", "cpu_tail", "parked"]
    g = h["gpus"][0]
    assert g["gpu"] == 0 and g["age_ms"] >= 0
    assert set(g["sessions"]) == set(h["tactics"]) == set(g["bytes"])
    assert g["device_total"] > 0 and g["host_total"] > 0
    assert ok(srv, "tactics", "--gpu", "0")["gpus"][0]["gpu"] == 0
    # --watch: one JSON object per drawing
    rc, frames, err = rkvctl(srv, "tactics", "--watch", "0.1", "--count", "3")
    assert rc == 0 and len(frames) == 3 and all(f["gpus"][0]["gpu"] == 0 for f in frames)
    rc, text, _ = rkvctl(srv, "tactics", "--watch", "0.1", "--count", "2", json_out=False)
    assert rc == 0 and text.count("GPU 0") == 2 and text.count("resident") == 2
    rc, text, _ = rkvctl(srv, "tactics", json_out=False)
    assert "\u2588" in text  # a bar for the tactic that has sessions
    rc, out, err = rkvctl(srv, "tactics", "--gpu", "3")
    assert rc == 3 and "gpu must be an integer from -1 to 0" in err


def test_workers(srv):
    w = ok(srv, "workers", "list")["workers"]
    assert len(w) == 1 and w[0]["up"] is True and w[0]["draining"] is False
    assert ok(srv, "workers", "drain", "0") == {"worker": 0, "draining": True}
    assert ok(srv, "workers")["workers"][0]["draining"] is True
    complete(srv, "a drained single worker still serves")  # nowhere else to go
    assert ok(srv, "workers", "drain", "0", "--off") == {"worker": 0, "draining": False}
    rc, out, err = rkvctl(srv, "workers", "drain", "7")
    assert rc == 3 and "worker must be an integer from 0 to 0" in err


def test_events(srv):
    # transitions need pressure: a budget the sessions do not fit in, then room again
    for i in range(4):
        complete(srv, f"events come from sessions that must move {i} times", session=f"ev-{i}")
    wait_for(lambda: hist(srv)["resident"] >= 4, "resident sessions")
    ok(srv, "budget", "set", "--vram-target", "64KiB")
    ok(srv, "budget", "set", "--vram-target", "1GiB")
    evs = wait_for(lambda: ok(srv, "events", "--since", "1h")["events"], "an event")
    e = evs[-1]
    assert set(e) == {"ts_ms", "session", "gpu", "from", "to", "reason", "bytes_moved",
                      "elapsed_us"}
    assert e["ts_ms"] > time.time() * 1000 - 3600e3
    res = ok(srv, "events", "--since", "1h", "--limit", "1")
    assert len(res["events"]) == 1 and res["next_since"] == res["events"][0]["ts_ms"] + 1
    assert ok(srv, "events", "--since", str(res["next_since"] + 10**9))["events"] == []
    moved = {e["session"] for e in evs}
    name = [s["id"] for s in ok(srv, "sessions")["sessions"] if s["sid"] in moved][0]
    sid = [s for s in ok(srv, "sessions")["sessions"] if s["id"] == name][0]["sid"]
    mine = ok(srv, "events", "--session", name)["events"]
    assert mine and all(x["session"] == sid for x in mine)
    # --follow prints existing ones first; --count ends it
    rc, lines, err = rkvctl(srv, "events", "--since", "1d", "--follow", "--count", "2")
    assert rc == 0 and len(lines) == 2 and all("reason" in x for x in lines)
    rc, out, err = rkvctl(srv, "events", "--since", "yesterday")
    assert rc == 3 and "since must be a time" in err and len(err.strip().splitlines()) == 1
    rc, text, _ = rkvctl(srv, "events", "--since", "1h", json_out=False)
    assert rc == 0 and "->" in text


def test_refused_values(srv):
    for args, needle in [
        (["budget", "set", "--vram-target", "1KiB"], "vram_target must be a size"),
        (["sessions", "show", "no-such-session"], 'no session "no-such-session"'),
        (["keys", "revoke", "999"], "no live key 999"),
        (["workers", "restart", "3"], "worker must be an integer from 0 to 0"),
    ]:
        rc, out, err = rkvctl(srv, *args)
        assert rc == 3, (args, err)
        assert needle in err and len(err.strip().splitlines()) == 1
        assert out["ok"] is False and out["error"]["message"]


def test_http_admin(srv):
    st, _, body = srv.request("GET", "/admin/v1/status")
    j = json.loads(body)
    assert st == 200 and j["ok"] is True and j["result"]["model"] == "tiny"
    st, _, body = srv.request("GET", "/admin/v1/tactics?gpu=0")
    assert st == 200 and json.loads(body)["result"]["gpus"][0]["gpu"] == 0
    st, _, body = srv.request("GET", "/admin/v1/tactics?gpu=x")
    assert st == 400 and "gpu must be an integer" in json.loads(body)["error"]["message"]
    st, _, body = srv.request("GET", "/admin/v1/no_such")
    assert st == 404 and "unknown admin command" in json.loads(body)["error"]["message"]
    st, _, body = srv.request("GET", "/admin/v1/status?bogus=1")
    assert st == 400 and 'unknown argument "bogus"' in json.loads(body)["error"]["message"]
    # changes need POST and an admin key
    st, _, body = srv.request("GET", "/admin/v1/mode_set?mode=auto")
    assert st == 405 and "use POST" in json.loads(body)["error"]["message"]
    st, _, body = srv.request("PUT", "/admin/v1/status", {})
    assert st == 405 and "use GET" in json.loads(body)["error"]["message"]
    st, _, body = srv.request("POST", "/admin/v1/mode_set", {"mode": "auto"})
    assert st == 401 and "admin key" in json.loads(body)["error"]["message"]


def test_keys(srv):
    k_user = ok(srv, "keys", "add", "alice")
    k_admin = ok(srv, "keys", "add", "ops", "--scope", "admin")
    try:
        assert k_user["scope"] == "user" and k_user["secret"].startswith("rkv-")
        assert k_admin["scope"] == "admin" and k_admin["id"] != k_user["id"]
        keys = {k["id"]: k for k in ok(srv, "keys", "list")["keys"]}
        assert keys[k_user["id"]]["name"] == "alice" and not keys[k_user["id"]]["revoked"]
        assert k_user["secret"].startswith(keys[k_user["id"]]["prefix"])
        assert "secret" not in keys[k_user["id"]]
        # once a key exists, /v1 needs one
        st, _, _ = srv.request("GET", "/v1/models")
        assert st == 401
        user = {"Authorization": "Bearer " + k_user["secret"]}
        admin = {"Authorization": "Bearer " + k_admin["secret"]}
        st, _, _ = srv.request("GET", "/v1/models", headers=user)
        assert st == 200
        complete(srv, "keys let requests in", headers=user)
        st, _, _ = srv.request("GET", "/v1/models", headers={"Authorization": "Bearer rkv-00"})
        assert st == 401
        # admin HTTP: a user key reads, an admin key changes
        st, _, _ = srv.request("GET", "/admin/v1/status", headers=user)
        assert st == 200
        st, _, body = srv.request("POST", "/admin/v1/mode_set", {"mode": "auto"}, headers=user)
        assert st == 403 and "user scope" in json.loads(body)["error"]["message"]
        st, _, body = srv.request("POST", "/admin/v1/mode_set", {"mode": "auto"}, headers=admin)
        assert st == 200 and json.loads(body)["result"] == {"mode": "auto"}
        st, _, body = srv.request("POST", "/admin/v1/mode_set", {"mode": "turbo"}, headers=admin)
        assert st == 400 and "auto, resident, window or cpu_tail" in body.decode()
        assert ok(srv, "keys", "revoke", str(k_user["id"])) == {"id": k_user["id"],
                                                                 "revoked": True}
        # the table marks a revoked key
        rc, text, _ = rkvctl(srv, "keys", "list", json_out=False)
        rows = {ln.split()[0]: ln.split() for ln in text.splitlines()[1:]}
        assert rc == 0 and text.splitlines()[0].split()[3] == "state"
        assert rows[str(k_user["id"])][3] == "REVOKED" and rows[str(k_admin["id"])][3] == "live"
        st, _, _ = srv.request("GET", "/v1/models", headers=user)
        assert st == 401
        assert ok(srv, "status")["api_keys"] == 1
    finally:
        for k in ok(srv, "keys", "list")["keys"]:
            if not k["revoked"]:
                ok(srv, "keys", "revoke", str(k["id"]))
    st, _, _ = srv.request("GET", "/v1/models")
    assert st == 200


def test_worker_restart(srv):
    old = srv.child_pid("rkv-worker")
    res = ok(srv, "workers", "restart", "0")
    assert res == {"worker": 0, "old_pid": old, "restarting": True}

    def back():
        w = ok(srv, "workers")["workers"][0]
        return w if w["up"] and w["pid"] not in (0, old) else None

    w = wait_for(back, "the worker to come back", timeout=60)
    assert w["restarts"] >= 1
    srv.wait_healthy()
    complete(srv, "a restarted worker serves again")


# --- budgets: live re-plan, persisted --------------------------------------------------------


def test_budget_replans_live_and_persists(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("bud")
    srv = conftest.Rkvd(tiny_model, root, ["--block-size", "16"]).start()
    try:
        b = ok(srv, "budget", "get")
        assert b["budget"]["vram_target"] == 1 << 30 and b["set_at_runtime"] is False
        for i in range(4):
            complete(srv, f"session number {i} talks for a little while about memory", session=f"b{i}")
        wait_for(lambda: hist(srv)["resident"] == 4, "4 resident sessions")
        # each session holds 2-3 blocks of 16 positions (8 KiB each): 64 KiB fits some, not all
        res = ok(srv, "budget", "set", "--vram-target", "64KiB")
        assert res["budget"]["vram_target"] == 65536
        assert res["before"][0]["sessions"]["resident"] == 4
        after = res["after"][0]["sessions"]
        assert after["resident"] < 4 and after["parked"] + after["window"] + after["cpu_tail"] > 0
        assert sum(after.values()) == 4
        assert res["after"][0]["bytes"]["resident"] <= 65536
        assert res["summary"][0].startswith("gpu 0:") and "resident 4->" in res["summary"][0]
        demoted = [s for s in ok(srv, "sessions")["sessions"] if s["tactic"] != "resident"]
        assert len(demoted) == 4 - after["resident"]
        assert all(s["tail_tokens"] > 0 for s in demoted)
        evs = ok(srv, "events", "--since", "1h")["events"]
        assert any(e["from"] == "resident" and "budget changed" in e["reason"] for e in evs)
        # with room again a demoted session is promoted back (parked ones when their
        # next request comes)
        res = ok(srv, "budget", "set", "--vram-target", "1MiB", "--host-budget", "512MiB")
        assert res["budget"]["vram_target"] == 1 << 20
        for s in demoted:
            complete(srv, f"session number {s['id'][1:]} talks for a little while about memory",
                     session=s["id"])
        wait_for(lambda: hist(srv)["resident"] == 4, "4 resident sessions again")
        assert all(s["tactic"] == "resident" for s in ok(srv, "sessions")["sessions"])
        promoted = [e for e in ok(srv, "events", "--since", "1h")["events"]
                    if e["to"] == "resident" and e["from"] != "resident"]
        assert {e["session"] for e in promoted} >= {s["sid"] for s in demoted}
        res = ok(srv, "budget", "set", "--vram-target", "3MiB", "--compute-reserve", "0")
        assert res["budget"] == {"vram_target": 3 << 20, "host_budget": 512 << 20,
                                 "compute_reserve": 0}
        rc, text, _ = rkvctl(srv, "budget", "get", json_out=False)
        assert "3.00 MiB" in text and "512.00 MiB" in text
    finally:
        conftest._stop_checked(srv)
    # a new rkvd on that state (the sqlite file) starts with the budgets set at runtime
    root2 = tmp_path_factory.mktemp("bud2")
    shutil.copytree(root / "state", root2 / "state")
    srv2 = conftest.Rkvd(tiny_model, root2, ["--block-size", "16"]).start()
    try:
        b = ok(srv2, "budget", "get")["budget"]
        assert b["vram_target"] == 3 << 20 and b["host_budget"] == 512 << 20
        assert ok(srv2, "status")["budgets"]["vram_target"] == 3 << 20
        assert "--vram-target 3145728B" in open(f"/proc/{srv2.child_pid('rkv-kvmgr')}/cmdline",
                                                "rb").read().replace(b"\0", b" ").decode()
    finally:
        conftest._stop_checked(srv2)


def test_bad_admin_group_refused(tiny_model, tmp_path):
    r = subprocess.run([rkv_bin("rkvd"), "--model", str(tiny_model), "--listen", "127.0.0.1:0",
                        "--backend", "cpu", "--state-dir", str(tmp_path / "s"), "--runtime-dir",
                        str(tmp_path / "r"), "--threads", "1", "--admin-group",
                        "no-such-group-rkv"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert 'admin_group: no group "no-such-group-rkv"' in r.stderr
