"""soak.py - load and soak run of rkvd (issue 9): N concurrent named chat sessions of several
streamed turns each, over the openai AsyncOpenAI client, for a fixed time, on the CPU backend
with the tiny model. Checks: no request fails; rkvd/kvmgr/worker memory and open fds stay flat;
once the sessions are evicted kvmgr's pools are back to where they started. Reports client-side
TTFT and inter-token latency (p50/p99) and tokens/s, and writes them as JSON.

    soak.py [--seconds S] [--sessions N] [--turns T] [--sample-every SEC] [--out FILE]

Binaries come from $RKV_TOP/$RKV_BUILD/bin (default: the repo's build/). Exit 0 when every check
passes, 1 otherwise (the JSON says which)."""
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")
MIB = 1 << 20
POOL_MIB = 64  # each of the two kv pools
POOL_BYTES = 2 * POOL_MIB * MIB

# words of the prompts; a turn is a few of them, so a conversation stays within a few blocks
WORDS = ("the cat sat on a warm mat while rain fell over the quiet town and people went home "
         "to cook soup read books and sleep until morning light came back again").split()


def bin_path(name):
    p = BUILD / "bin" / name
    if not p.exists():
        sys.exit(f"soak: {p} is not built (make {p.relative_to(TOP)})")
    return str(p)


def pct(xs, q):
    """q-th percentile (0..100) by nearest rank; None for no data"""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


# --- the server ---------------------------------------------------------------------------


sys.path.insert(0, str(TOP / "tests" / "integration"))
from conftest import Rkvd, make_tiny_model  # noqa: E402  (the integration tests' rkvd: start, log, stop)


class Server(Rkvd):
    """rkvd on the cpu backend (2 worker threads), its state and sockets under root"""

    def __init__(self, root, model, extra):
        super().__init__(model, root, extra)
        self.log_path.unlink(missing_ok=True)  # the port is read from a fresh log
        try:
            self.start(timeout=60)
        except AssertionError as e:
            self.stop()
            sys.exit(f"soak: {e}")

    def ctl(self, *args, check=True):
        r = subprocess.run([bin_path("rkvctl"), "--socket", str(self.run_dir / "admin.sock"),
                            "--json", *args], capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"rkvctl {' '.join(args)}: exit {r.returncode}: {r.stderr}")
        return json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}

    def status(self):
        try:
            return self.ctl("status", check=False)
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            return {}

    def pids(self):
        """{"rkvd": pid, "rkv-kvmgr": pid, "rkv-worker0": pid, ...} from /proc (no rkvctl
        call, so sampling does not stall the client loop)"""
        out = {"rkvd": self.proc.pid}
        n_workers = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            rest = stat[stat.rindex(")") + 2:].split()
            if int(rest[1]) != self.proc.pid or rest[0] == "Z":
                continue
            if comm == "rkv-kvmgr":
                out[comm] = int(d)
            elif comm == "rkv-worker":
                out[f"rkv-worker{n_workers}"] = int(d)
                n_workers += 1
        return out


def proc_sample(pid):
    """(VmRSS bytes, RssShmem bytes, open fds) of a live process, None when it is gone"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    kb = {k: int(v.split()[0]) * 1024 for k, v in
          (line.split(":", 1) for line in status.splitlines() if line.startswith(("VmRSS",
                                                                                 "RssShmem")))}
    return kb.get("VmRSS", 0), kb.get("RssShmem", 0), fds


def flat_check(samples, pool_bytes_max, slack=1.2, slack_bytes=8 * MIB, fd_slack=8):
    """samples: [(t, rss, shmem, fds)]. flat = the last third's max <= the first third's max *
    slack + slack_bytes (for VmRSS, and for VmRSS less the KV pools' shared pages, which grow
    as blocks are first touched, bounded by the budgets), and the last third's fds within
    +-fd_slack of the first third's. The pools' shared pages must stay within pool_bytes_max.
    Returns a dict with the figures and "ok" (judged on the private part, the fds and the
    shared pages' bound: a process that first touches more pool blocks late in the run is
    not leaking)."""
    n = len(samples)
    third = max(1, n // 3)
    first, last = samples[:third], samples[-third:]
    rss_first, rss_last = max(s[1] for s in first), max(s[1] for s in last)
    priv_first = max(s[1] - s[2] for s in first)
    priv_last = max(s[1] - s[2] for s in last)
    fd_first = max(s[3] for s in first)
    fd_lo, fd_hi = min(s[3] for s in last), max(s[3] for s in last)
    rss_ok = rss_last <= rss_first * slack + slack_bytes
    priv_ok = priv_last <= priv_first * slack + slack_bytes
    fd_ok = fd_first - fd_slack <= fd_lo and fd_hi <= fd_first + fd_slack
    shmem_max = max(s[2] for s in samples)
    shmem_ok = shmem_max <= pool_bytes_max + slack_bytes
    return {"samples": n, "rss_first_max": rss_first, "rss_last_max": rss_last,
            "private_first_max": priv_first, "private_last_max": priv_last,
            "fds_first_max": fd_first, "fds_last": [fd_lo, fd_hi],
            "shmem_max": shmem_max, "rss_flat": rss_ok, "private_flat": priv_ok,
            "fds_flat": fd_ok, "shmem_bounded": shmem_ok, "ok": priv_ok and fd_ok and shmem_ok}


# --- the load ----------------------------------------------------------------------------


class Load:
    def __init__(self, client, model, turns, max_tokens, deadline, seed):
        self.client = client
        self.model = model
        self.turns = turns
        self.max_tokens = max_tokens
        self.deadline = deadline
        self.rng = random.Random(seed)
        self.ttft = []   # seconds, one per turn
        self.itl = []    # seconds between content chunks
        self.tokens = 0  # completion tokens (usage)
        self.turns_done = 0
        self.conversations = 0
        self.errors = []
        self.sessions = set()

    def prompt(self):
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 12)))

    async def turn(self, sid, messages):
        t0 = time.monotonic()
        first, last, text, usage = None, None, [], None
        stream = await self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, stream=True,
            temperature=0.8, stream_options={"include_usage": True},
            extra_body={"session_id": sid})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices or not chunk.choices[0].delta.content:
                continue
            now = time.monotonic()
            if first is None:
                first = now
                self.ttft.append(now - t0)
            else:
                self.itl.append(now - last)
            last = now
            text.append(chunk.choices[0].delta.content)
        if usage is None:
            raise RuntimeError(f"session {sid}: the stream ended without a usage chunk")
        self.tokens += usage.completion_tokens
        self.turns_done += 1
        return "".join(text)

    async def user(self, u):
        """one simulated user: conversations of `turns` turns until the deadline"""
        gen = 0
        while time.monotonic() < self.deadline:
            sid = f"soak-{u}-{gen}"
            gen += 1
            self.sessions.add(sid)
            messages = [{"role": "system", "content": "you are a short-spoken helper"}]
            for _ in range(self.turns):
                if time.monotonic() >= self.deadline:
                    break
                messages.append({"role": "user", "content": self.prompt()})
                try:
                    reply = await self.turn(sid, messages)
                except Exception as e:  # every failure counts; the run goes on
                    self.errors.append(f"{sid}: {type(e).__name__}: {e}"[:300])
                    await asyncio.sleep(0.5)  # a broken server is not hammered
                    break
                messages.append({"role": "assistant", "content": reply})
            self.conversations += 1


async def sampler(server, every, stop, out):
    """samples every `every` s the memory and fds of rkvd and its children into out, from one
    interval after the load started (its connections open and buffers grow in that time)"""
    try:
        await asyncio.wait_for(stop.wait(), every)
    except asyncio.TimeoutError:
        pass
    while not stop.is_set():
        t = time.monotonic()
        for name, pid in server.pids().items():
            s = proc_sample(pid)
            if s is not None:
                out.setdefault(name, []).append((t, *s))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


async def drive(server, a):
    from openai import AsyncOpenAI
    # the client's default pool allows 1000 connections; no retries, so every failure counts
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="soak",
                         max_retries=0, timeout=300.0)
    t0 = time.monotonic()
    load = Load(client, a.model_name, a.turns, a.max_tokens, t0 + a.seconds, a.seed)
    stop = asyncio.Event()
    samples = {}
    samp = asyncio.create_task(sampler(server, a.sample_every, stop, samples))
    await asyncio.gather(*(load.user(u) for u in range(a.sessions)))
    wall = time.monotonic() - t0
    stop.set()
    await samp
    await client.close()
    return load, samples, wall


def pool_bytes(server):
    p = server.status().get("pool", {})
    return p.get("device_used", -1) + p.get("host_used", -1)


def wait_pool(server, want, timeout):
    """until kvmgr's pools hold want bytes (its figures follow the steps' acks); the last value"""
    deadline = time.monotonic() + timeout
    got = pool_bytes(server)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.25)
        got = pool_bytes(server)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--sessions", type=int, default=256, help="concurrent users")
    ap.add_argument("--turns", type=int, default=3, help="turns of one conversation")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(BUILD / "soak" / "soak.json"))
    ap.add_argument("--workdir", help="state, sockets, model and log (default: a temp dir)")
    ap.add_argument("--model-name", default="tiny")
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="rkv-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(work / "tiny.gguf")
    # small pools so the run spills and parks too (CPU mode: vram-target is the device pool);
    # rkvd keeps at most 2 named sessions per user (it forgets the least recently used), so
    # what it holds for sessions by design levels off within the first third
    server = Server(work / "r", model, ["--vram-target",
                                           f"{POOL_MIB}MiB", "--host-budget", f"{POOL_MIB}MiB", "--max-sessions",
                                           str(2 * a.sessions),
                                           "--max-waiting", str(max(1024, 2 * a.sessions))])
    result = {"config": vars(a), "workdir": str(work)}
    ok = False
    try:
        baseline = wait_pool(server, 0, 10)
        result["pool_baseline_bytes"] = baseline
        print(f"soak: {a.sessions} sessions x {a.turns} turns for {a.seconds:.0f} s against "
              f"rkvd :{server.port} (log {server.log_path})", file=sys.stderr, flush=True)
        cpu0 = time.process_time()
        load, samples, wall = asyncio.run(drive(server, a))
        # the client shares the machine: near 1.0 means it was the bottleneck and its latency
        # figures include its own queueing
        result["client_cpu_share"] = round((time.process_time() - cpu0) / wall, 3)

        # named sessions keep their kv: what they hold may not exceed their blocks. blocks
        # that a last step dropped go back once kvmgr has the worker's ack (an idle ack
        # follows 50 ms after the last step): read both until two readings agree, 5 s at most
        block_size = server.status().get("block_size", 256)
        deadline, last = time.monotonic() + 5, None
        while True:
            listed = server.ctl("sessions", "list").get("sessions", [])
            held_blocks = sum(-(-s["kv_tokens"] // block_size) for s in listed)
            used_before = pool_bytes(server)
            if (held_blocks, used_before) == last or time.monotonic() > deadline:
                break
            last = (held_blocks, used_before)
            time.sleep(0.3)
        for s in listed:
            server.ctl("sessions", "evict", s["id"] or f"#{s['sid']}", check=False)
        left = server.ctl("sessions", "list").get("sessions", [])
        used_after = wait_pool(server, baseline, 30)

        st = server.status()
        restarts = st.get("kvmgr", {}).get("restarts", 0) + sum(
            w.get("restarts", 0) for w in st.get("workers", []))
        result["restarts"] = restarts
        mem = {name: flat_check(s, POOL_BYTES) for name, s in samples.items() if len(s) >= 3}
        result.update({
            "wall_s": round(wall, 2),
            "requests": load.turns_done,
            "conversations": load.conversations,
            "errors": len(load.errors),
            "error_examples": load.errors[:10],
            "completion_tokens": load.tokens,
            "tokens_per_s": round(load.tokens / wall, 1),
            "ttft_ms": {"p50": round(1e3 * pct(load.ttft, 50), 2),
                        "p99": round(1e3 * pct(load.ttft, 99), 2)} if load.ttft else None,
            "itl_ms": {"p50": round(1e3 * pct(load.itl, 50), 2),
                       "p99": round(1e3 * pct(load.itl, 99), 2)} if load.itl else None,
            "sessions_listed_at_end": len(listed),
            "kv_blocks_held_by_sessions": held_blocks,
            "pool_used_before_evict_bytes": used_before,
            "sessions_left_after_evict": len(left),
            "pool_used_after_evict_bytes": used_after,
            "memory": mem,
            "samples": {k: [[round(t, 1), r, sh, f] for t, r, sh, f in v]
                        for k, v in samples.items()},
        })
        checks = {
            "no_errors": not load.errors,
            "requests_ran": load.turns_done > 0,
            "memory_and_fds_flat": bool(mem) and all(m["ok"] for m in mem.values()),
            "children_alive": server.proc.poll() is None and all(
                k in samples for k in ("rkvd", "rkv-kvmgr", "rkv-worker0")),
            "pool_back_to_baseline": used_after == baseline and not left,
            "no_restarts": restarts == 0,
        }
        result["checks"] = checks
        ok = all(checks.values())
    finally:
        rc = server.stop(timeout=60)
        result["rkvd_exit"] = rc
        ok = ok and rc == 0
        result["ok"] = ok
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result.get(k) for k in ("ok", "checks", "requests", "errors", "tokens_per_s",
                                          "ttft_ms", "itl_ms", "wall_s", "client_cpu_share")}
    print(json.dumps(summary, indent=1))
    for name, m in result.get("memory", {}).items():
        print(f"soak: {name}: VmRSS {m['rss_first_max'] / MIB:.1f} -> {m['rss_last_max'] / MIB:.1f}"
              f" MiB, private {m['private_first_max'] / MIB:.1f} -> "
              f"{m['private_last_max'] / MIB:.1f} MiB, fds {m['fds_first_max']} -> "
              f"{m['fds_last']}", file=sys.stderr)
    print(f"soak: {'PASS' if ok else 'FAIL'}; figures in {a.out}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
