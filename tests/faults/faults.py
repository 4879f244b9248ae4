"""faults.py - the fault campaign of issue 9: rkvd on the CPU backend with the tiny model under
load from many threads (streamed and non-streamed chat turns in named sessions, completions
without one), while the campaign SIGKILLs the worker, SIGKILLs kvmgr, SIGSTOPs one of them (a
hung child: rkvd's step_timeout / kvmgr_timeout must restart it) and SIGTERMs rkvd, then
restarts it on the same state dir.

Checks (each a key of "checks" in the JSON it writes):
  every request ended one way: completed, a clean HTTP error (OpenAI error JSON), a clean SSE
    error event ending in [DONE], or not accepted (connection refused or reset before any byte
    while rkvd was stopping); none hung past its deadline, none was cut off or malformed, and
    the count of outcomes equals the count of requests sent;
  rkvd exits 0 on every SIGTERM and leaves no child behind; sqlite's integrity_check says ok
    after every stop;
  rkvd's open fds are the same, and its RSS flat, at every quiet point of one rkvd's life
    (load paused, after each child was restarted);
  once idle and its sessions evicted, kvmgr's pools are back to their baseline (rkvctl status);
  afterwards a two-turn chat session gives the reference text (rkv-gen, greedy).

    faults.py [--seconds S] [--threads N] [--kills-per-round K] [--out FILE] [--workdir DIR]

Binaries come from $RKV_TOP/$RKV_BUILD/bin. Exit 0 when every check passed."""
import argparse
import http.client
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")
MIB = 1 << 20
REQ_DEADLINE = 60.0  # seconds one request may take, first byte to [DONE]

sys.path.insert(0, str(TOP / "tests" / "integration"))
from conftest import Ref, Rkvd, make_tiny_model, rkv_bin  # noqa: E402

WORDS = ("the cat sat on a warm mat while rain fell over the quiet town and people went home "
         "to cook soup read books and sleep until morning light came back again").split()

# outcomes that are fine, and those that break the rule "completed or a clean error"
CLEAN = ("ok", "http_error", "sse_error", "not_accepted")
VIOLATIONS = ("hang", "dropped", "truncated", "malformed")


def log(msg):
    print(f"faults: {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def proc_sample(pid):
    """(VmRSS bytes, open fds), None when the process is gone"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next(int(ln.split()[1]) * 1024 for ln in status.splitlines()
               if ln.startswith("VmRSS"))
    return rss, fds


# --- one request ---------------------------------------------------------------------------


class Outcome(Exception):
    def __init__(self, kind, detail=""):
        super().__init__(kind)
        self.kind, self.detail = kind, detail


def error_json(body):
    """the message of an OpenAI error body, or None when body is not one"""
    try:
        e = json.loads(body)["error"]
        if isinstance(e.get("message"), str) and e["message"] and "type" in e:
            return e["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return None


def request(port, path, body, stream):
    """one POST; returns ("ok", parsed) or raises Outcome"""
    t_end = time.monotonic() + REQ_DEADLINE
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=REQ_DEADLINE)
    got_bytes = False
    try:
        try:
            c.request("POST", path, body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
        except ConnectionRefusedError:
            raise Outcome("refused")
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Outcome("reset", str(e))
        try:
            r = c.getresponse()
        except (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError) as e:
            raise Outcome("reset", str(e))
        except socket.timeout:
            raise Outcome("hang", "no response head")
        got_bytes = True
        if r.status != 200:
            data = r.read()
            msg = error_json(data)
            if msg is None:
                raise Outcome("malformed", f"{r.status}: {data[:200]!r}")
            raise Outcome("http_error", f"{r.status}: {msg[:160]}")
        if not stream:
            data = r.read()
            try:
                j = json.loads(data)
                return j["choices"][0], j["usage"]
            except (ValueError, KeyError, IndexError):
                raise Outcome("malformed", f"200 body {data[:200]!r}")
        # SSE: data lines until [DONE]; a clean error is an error event then [DONE]
        text, finish, err, done = [], None, None, False
        while not done:
            if time.monotonic() > t_end:
                raise Outcome("hang", "stream past its deadline")
            line = r.readline()
            if not line:
                raise Outcome("truncated", "stream ended without [DONE]")
            line = line.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                break
            ev = json.loads(payload)
            if "error" in ev:
                err = error_json(payload) or "?"
                continue
            for ch in ev.get("choices", []):
                d = ch.get("delta", {}).get("content") if "delta" in ch else ch.get("text")
                if d:
                    text.append(d)
                finish = ch.get("finish_reason") or finish
        if err is not None:
            raise Outcome("sse_error", err[:160])
        if finish is None:
            raise Outcome("truncated", "[DONE] without a finish_reason")
        return {"text": "".join(text), "finish_reason": finish}, None
    except socket.timeout:
        raise Outcome("hang", "read timed out")
    except (ConnectionResetError, BrokenPipeError, http.client.IncompleteRead) as e:
        raise Outcome("truncated" if got_bytes else "reset", str(e))
    finally:
        c.close()


# --- the load ------------------------------------------------------------------------------


class Load:
    def __init__(self, state, threads, seed):
        self.state = state
        self.n = threads
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.outcomes = Counter()
        self.by_kind = Counter()  # "http_error 503: no worker..." -> n
        self.examples = []        # violations, with details
        self.sent = 0
        self.active = 0
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.idle = threading.Condition(self.lock)
        self.threads = [threading.Thread(target=self.user, args=(u,), daemon=True)
                        for u in range(threads)]

    def prompt(self, rng):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))

    def record(self, kind, detail, t0, t1):
        if kind in ("refused", "reset"):
            # before any byte: not accepted when rkvd was stopping or down then
            kind = "not_accepted" if self.state.was_down(t0) else "dropped"
        with self.lock:
            self.outcomes[kind] += 1
            if kind not in ("ok", "not_accepted"):
                self.by_kind[f"{kind} {detail}"[:120]] += 1
            if kind in VIOLATIONS and len(self.examples) < 20:
                self.examples.append(f"{kind}: {detail}"[:300])

    def user(self, u):
        rng = random.Random(self.rng.random())
        gen, messages, sid = 0, None, None
        while not self.stop.is_set():
            if self.paused.is_set():
                time.sleep(0.02)
                continue
            port = self.state.port
            if port is None:
                time.sleep(0.05)
                continue
            with self.lock:
                if self.paused.is_set():
                    continue
                self.active += 1
                self.sent += 1
            kind = rng.random()
            stream = rng.random() < 0.6
            # a fifth are long, so faults land mid-stream, and a few outlast rkvd's drain time
            x = rng.random()
            max_tokens = rng.randint(4, 24) if x < 0.8 else rng.randint(64, 160) if x < 0.97 \
                else 1000
            if kind < 0.7:
                # a turn of a named conversation (three turns, then a new session)
                if messages is None or len(messages) >= 7:
                    gen += 1
                    sid = f"f{u}-{gen}"
                    messages = [{"role": "system", "content": "be brief"}]
                messages.append({"role": "user", "content": self.prompt(rng)})
                path = "/v1/chat/completions"
                body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                        "temperature": 0.7, "stream": stream, "session_id": sid}
            else:
                path = "/v1/completions"
                body = {"model": "tiny", "prompt": self.prompt(rng), "max_tokens": max_tokens,
                        "temperature": 0, "stream": stream, "ignore_eos": max_tokens > 24}
            t0 = time.monotonic()
            try:
                choice, _ = request(port, path, body, stream)
                if path.endswith("chat/completions"):
                    content = choice.get("text") if stream else choice["message"]["content"]
                    messages.append({"role": "assistant", "content": content or ""})
                self.record("ok", "", t0, time.monotonic())
            except Outcome as o:
                if path.endswith("chat/completions"):
                    messages = None  # a failed turn: the next one starts a new conversation
                self.record(o.kind, o.detail, t0, time.monotonic())
                if o.kind in ("refused", "reset"):
                    time.sleep(0.05)  # rkvd is stopping: do not spin
            except Exception as e:  # noqa: BLE001 - anything else is a malformed answer
                messages = None
                self.record("malformed", f"{type(e).__name__}: {e}", t0, time.monotonic())
            with self.lock:
                self.active -= 1
                self.idle.notify_all()

    def start(self):
        for t in self.threads:
            t.start()

    def pause(self, timeout=REQ_DEADLINE + 10):
        """until no request is in flight; False when one still is after timeout"""
        self.paused.set()
        with self.lock:
            return self.idle.wait_for(lambda: self.active == 0, timeout)

    def resume(self):
        self.paused.clear()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(REQ_DEADLINE + 10)
        return not any(t.is_alive() for t in self.threads)


# --- the server and the faults ------------------------------------------------------------


class State:
    """the port the load uses (None while rkvd is down) and when rkvd was down"""

    def __init__(self):
        self.port = None
        self.lock = threading.Lock()
        self.down = []  # [start, end] (end None while down)

    def went_down(self):
        """SIGTERM is next: the load keeps sending to the stopping rkvd (it must answer or
        refuse cleanly) until stopped() says it is gone"""
        with self.lock:
            self.down.append([time.monotonic(), None])

    def stopped(self):
        with self.lock:
            self.port = None

    def came_up(self, port):
        with self.lock:
            if self.down:
                self.down[-1][1] = time.monotonic()
            self.port = port

    def was_down(self, t0):
        """a request sent at t0 found rkvd stopping or down (50 ms of grace for one that was
        in the listen backlog as the SIGTERM came: never accepted by rkvd)"""
        with self.lock:
            return any(s - 0.05 <= t0 and (e is None or t0 <= e) for s, e in self.down)


def ctl(srv, *args):
    r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"),
                        "--json", *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"rkvctl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def pool_used(srv):
    p = ctl(srv, "status").get("pool", {})
    return p.get("device_used", 0) + p.get("host_used", 0)


def wait_until(fn, timeout, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(every)


def integrity(state_dir):
    db = sqlite3.connect(str(Path(state_dir) / "rkv.db"))
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


def healthy_with_new(srv, comm, old_pid, timeout=60):
    """the child comm runs with a pid other than old_pid and /health says 200"""
    def ok():
        try:
            pid = srv.child_pid(comm, timeout=0.5)
            st, _, _ = srv.request("GET", "/health", timeout=2)
            return pid != old_pid and st == 200
        except (AssertionError, OSError):
            return False
    return wait_until(ok, timeout, 0.1)


def reference_session(srv, ref):
    """two greedy chat turns in one named session against rkv-gen; [] when equal"""
    bad = []
    m = [{"role": "user", "content": "Tell me about foxes."}]
    for turn, follow in enumerate(["And dogs?", None]):
        want = ref.gen(ids=ref.chat_ids(json.dumps(m)), n=8)["text"]
        choice, usage = request(srv.port, "/v1/chat/completions",
                                {"model": "tiny", "messages": m, "max_tokens": 8,
                                 "temperature": 0, "session_id": "faults-ref"}, False)
        got = choice["message"]["content"]
        if got != want:
            bad.append(f"turn {turn + 1}: {got!r} != reference {want!r}")
        if follow is None:
            break
        m = m + [{"role": "assistant", "content": got}, {"role": "user", "content": follow}]
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float,
                    default=60 * float(os.environ.get("FAULT_MINUTES", "5")))
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--kills-per-round", type=int, default=4,
                    help="worker/kvmgr SIGKILLs in one rkvd's life before its SIGTERM")
    ap.add_argument("--kill-every", type=float, default=3.0, help="seconds of load between faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(BUILD / "faults" / "faults.json"))
    ap.add_argument("--workdir")
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="rkv-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(work / "tiny.gguf")
    # small pools so sessions spill; short drain so a SIGTERM ends within seconds
    srv = Rkvd(model, work / "r", ["--vram-target", "32MiB", "--host-budget", "32MiB",
                                   "--shutdown-timeout", "1", "--max-sessions", "256",
                                   "--step-timeout", "5", "--kvmgr-timeout", "3"])
    srv.log_path.unlink(missing_ok=True)
    state = State()
    rng = random.Random(a.seed)
    kills = Counter()
    problems = []  # check failures other than request outcomes
    rounds = []    # per rkvd life: [(rss, fds)] at quiet points
    integrity_results = []
    exits = []
    result = {"config": vars(a), "workdir": str(work)}
    t_start = time.monotonic()
    deadline = t_start + a.seconds
    load = Load(state, a.threads, a.seed)
    try:
        srv.start(timeout=60)
        state.came_up(srv.port)
        wait_until(lambda: pool_used(srv) == 0, 10)
        baseline = pool_used(srv)
        log(f"{a.threads} threads for {a.seconds:.0f} s against rkvd :{srv.port} "
            f"(log {srv.log_path})")
        load.start()
        while time.monotonic() < deadline:
            samples = []
            deaths = {"rkv-worker": [], "rkv-kvmgr": []}  # this rkvd's children's
            # a quiet point at the start of this rkvd's life (after some load)
            time.sleep(min(a.kill_every, max(0.0, deadline - time.monotonic())))
            if not load.pause():
                problems.append("requests still in flight a minute after the load paused")
            samples.append(proc_sample(srv.proc.pid))
            load.resume()
            for _ in range(a.kills_per_round):
                if time.monotonic() >= deadline:
                    break
                time.sleep(a.kill_every)
                x = rng.random()
                # mostly one child SIGKILLed; sometimes both at once, or one hung (SIGSTOP:
                # rkvd's step_timeout / kvmgr_timeout must notice and restart it)
                sig = signal.SIGSTOP if x >= 0.9 else signal.SIGKILL
                comms = ["rkv-worker"] if x < 0.45 or x >= 0.95 else ["rkv-kvmgr"] if x < 0.8 \
                    or x >= 0.9 else ["rkv-kvmgr", "rkv-worker"]
                # rkvd's supervisor gives up (and rkvd exits for systemd to restart it) at the
                # 6th death of a child within 60 s: stay within its budget
                while any(len([t for t in deaths[c] if t > time.monotonic() - 62]) >= 4
                          for c in comms):
                    time.sleep(0.5)
                if srv.proc.poll() is not None:
                    problems.append(f"rkvd exited on its own with {srv.proc.returncode}")
                    break
                for c in comms:
                    deaths[c].append(time.monotonic())
                pids = [srv.child_pid(c) for c in comms]
                for p in pids:
                    os.kill(p, sig)
                kills[" + ".join(comms) + " " + sig.name] += 1
                if not all(healthy_with_new(srv, c, p) for c, p in zip(comms, pids)):
                    problems.append(f"rkvd did not recover from a {comms} SIGKILL within 60 s")
                    break
                time.sleep(a.kill_every / 2)
                if not load.pause():
                    problems.append("requests still in flight a minute after the load paused")
                samples.append(proc_sample(srv.proc.pid))
                load.resume()
            rounds.append(samples)
            # SIGTERM under load, check the database, start again on the same state
            state.went_down()
            code = srv.stop(timeout=60)
            state.stopped()
            kills["rkvd SIGTERM"] += 1
            exits.append(code)
            left = srv.stragglers()
            for p in left:
                os.kill(p, signal.SIGKILL)
            if code != 0 or left:
                problems.append(f"rkvd exited {code} on SIGTERM, children left: {left}")
            ic = integrity(srv.state_dir)
            integrity_results.append(ic)
            if ic != "ok":
                problems.append(f"integrity_check after stop {len(exits)}: {ic}")
            srv.exit_code = None
            srv.port = None
            srv.start(timeout=60)
            state.came_up(srv.port)
            log(f"round {len(rounds)}: {dict(kills)}, {dict(load.outcomes)}")
        # the end: the load drains, then the checks on an idle server
        if not load.finish():
            problems.append("load threads still running after the deadline (a request hung)")
        wait_until(lambda: ctl(srv, "status")["requests"]["running"] == 0 and
                   ctl(srv, "status")["requests"]["waiting"] == 0, 30, 0.2)
        listed = ctl(srv, "sessions", "list")["sessions"]
        for s in listed:
            subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"),
                            "sessions", "evict", s["id"] or f"#{s['sid']}"],
                           capture_output=True, timeout=60)
        left_sessions = ctl(srv, "sessions", "list")["sessions"]
        wait_until(lambda: pool_used(srv) == baseline, 30)
        used = pool_used(srv)
        ref_bad = reference_session(srv, Ref(model))
        state.went_down()
        code = srv.stop(timeout=60)
        exits.append(code)
        ic = integrity(srv.state_dir)
        integrity_results.append(ic)
        if code != 0:
            problems.append(f"rkvd exited {code} at the end")
        if ic != "ok":
            problems.append(f"integrity_check at the end: {ic}")
        # fds equal and RSS flat at the quiet points of each rkvd's life
        fd_ok, rss_ok, flat = True, True, []
        for i, s in enumerate(rounds):
            s = [x for x in s if x]
            if len(s) < 2:
                continue
            f0, f1 = s[0][1], max(x[1] for x in s[1:])
            r0, r1 = s[0][0], max(x[0] for x in s[1:])
            flat.append({"round": i + 1, "fds": [x[1] for x in s],
                         "rss_mib": [round(x[0] / MIB, 1) for x in s]})
            fd_ok &= f1 <= f0 + 2
            rss_ok &= r1 <= r0 * 1.2 + 8 * MIB
        sent = load.sent
        counted = sum(load.outcomes.values())
        checks = {
            "no_violations": not any(load.outcomes[k] for k in VIOLATIONS),
            "every_request_counted": sent == counted and sent > 0,
            "requests_completed": load.outcomes["ok"] > 0,
            "rkvd_exits_0": all(c == 0 for c in exits),
            "integrity_ok": all(x == "ok" for x in integrity_results),
            "rkvd_fds_equal_at_quiet_points": fd_ok,
            "rkvd_rss_flat": rss_ok,
            "pool_back_to_baseline": used == baseline and not left_sessions,
            "reference_text": not ref_bad,
            "no_other_problems": not problems,
        }
        result.update({
            "wall_s": round(time.monotonic() - t_start, 1),
            "requests": sent,
            "outcomes": dict(load.outcomes),
            "errors_by_kind": dict(load.by_kind.most_common(30)),
            "violation_examples": load.examples,
            "faults": dict(kills),
            "rkvd_exits": exits,
            "integrity": integrity_results,
            "rkvd_quiet_points": flat,
            "pool_used_after_evict": used,
            "pool_baseline": baseline,
            "sessions_left_after_evict": len(left_sessions),
            "reference_mismatch": ref_bad,
            "problems": problems,
            "checks": checks,
            "ok": all(checks.values()),
        })
    except BaseException as e:
        result["ok"] = False
        result["exception"] = f"{type(e).__name__}: {e}"[:2000]
        load.stop.set()
        raise
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
        for p in srv.stragglers():
            os.kill(p, signal.SIGKILL)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result.get(k) for k in ("ok", "checks", "requests", "outcomes", "faults",
                                          "wall_s")}
    print(json.dumps(summary, indent=1))
    log(f"{'PASS' if result['ok'] else 'FAIL'}; figures in {a.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
