"""bench_system.py - issue 8's system benchmarks against a running rkvd (make bench-system):
  1. load ramp: sessions arrive one by one up to --sessions-max under a VRAM target that holds
     --fit-sessions of them, then leave back to 1; per phase aggregate and per-session decode
     tok/s, tactic histogram, device/host bytes, PCIe bytes/s, against the all-resident run and
     max(HBM bound, PCIe bound) for the bytes placed; after each leave, the time until every
     session is RESIDENT again; each stream's tok/s and longest gap between tokens, and the
     rotation's swaps (--no-rotation runs it with rotation off: the A/B);
  2. spill curve: one session of --spill-ctx positions, VRAM target lowered live (rkvctl budget
     set) so its host tail goes 0 -> 100%: decode and prefill tok/s against the bound; beside it
     Hugging Face transformers' offloaded KV cache on a same-shape random-weight llama, when torch
     and transformers import and a CUDA device answers;
  3. HTTP overhead: streamed tok/s through HTTP + IPC against the engine's tok/s (gpu_bench's
     decode records when their shape matches, else rkv-gen on the same backend) at batch 1 and N;
  3b. structured output (--parts structured): the same HTTP batches with every row under a
     response_format grammar against them unconstrained, in one run (>= 0.95 at batch 1, >= 0.9
     at the largest);
  4. budget change under load: the KV room halved and restored with greedy streams running:
     time until each plan is in force, no failed request, the same text as without the change;
  5. time to first token: one prompt of --ttft-ctx tokens through HTTP, nothing else running,
     against the engine's prefill of the same tokens in the same chunks (rkv-gen --warmup on
     the same backend, after the server stopped): <= 1.1 x.
Every figure is printed as a ratio to its bound or reference, each target as PASS/FAIL/SKIP.
Standard library only (the gpu machine has no venv); plots with matplotlib when it imports.

  python3 tests/gpu/bench_system.py --bin DIR --out DIR [--backend cuda|cpu] [--quick] ...
writes OUT/bench_system.json, OUT/*.png, OUT/rkvd-*.log. Exit 0 when every part ran without a
failed request or a crash (targets are judged in the JSON; --strict also fails on a FAIL)."""
import argparse
import bisect
import datetime
import http.client
import json
import math
import os
import re
import shutil
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_demo  # noqa: E402  (its Rkvd: HTTP get, log; its SSE reader)

T0 = time.monotonic()
RES = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "targets": [],
       "errors": [], "notes": []}
CHILDREN = []  # Popen objects in their own process groups, killed on exit
GIB, MIB = 1 << 30, 1 << 20


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def note(msg):
    RES["notes"].append(msg)
    log("note: " + msg)


def rnd(x, k=3):
    return None if x is None else round(x, k)


def ratio(v, ref):
    return v / ref if v is not None and ref else None


# --- the model's shape, from the gguf header ----------------------------------------------------

GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
               11: "<q", 12: "<d"}


def gguf_meta(path):
    """the metadata key/values of a GGUF file (arrays of strings as their length only)"""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("<Q")).decode(errors="replace")

        def value(t):
            if t in GGUF_SCALAR:
                return rd(GGUF_SCALAR[t])
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("<I"), rd("<Q")
                if et == 8:  # tokenizer strings: skip
                    for _ in range(n):
                        f.seek(rd("<Q"), 1)
                    return n
                if et in GGUF_SCALAR:
                    f.seek(n * struct.calcsize(GGUF_SCALAR[et]), 1)
                    return n
                return [value(et) for _ in range(n)]
            raise ValueError(f"{path}: gguf value type {t} unknown")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        rd("<I")
        rd("<Q")
        meta = {}
        for _ in range(rd("<Q")):
            k = rstr()
            meta[k] = value(rd("<I"))
        return meta


def model_shape(path, kv_dtype):
    m = gguf_meta(path)
    a = m["general.architecture"]
    heads = m[f"{a}.attention.head_count"]
    dim = m[f"{a}.embedding_length"]
    hd = m.get(f"{a}.attention.key_length", dim // heads)
    s = {"arch": a, "n_layer": m[f"{a}.block_count"], "dim": dim,
         "ff": m[f"{a}.feed_forward_length"], "n_head": heads,
         "n_kv": m.get(f"{a}.attention.head_count_kv", heads), "head_dim": hd,
         "vocab": m.get(f"{a}.vocab_size") or m.get("tokenizer.ggml.tokens"),
         "rope_theta": m.get(f"{a}.rope.freq_base", 10000.0),
         "eps": m.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
         "ctx": m.get(f"{a}.context_length", 4096)}
    # a (head, position) row: f32/f16 elements, or 8-bit levels and their scales (worker/kv.h)
    row = {"f32": 4 * hd, "f16": 2 * hd, "q8": hd + 2 * -(-hd // 32), "fp8": hd + 4}[kv_dtype]
    s["kv_bytes_per_token"] = s["n_layer"] * s["n_kv"] * 2 * row
    return s


# --- rkvd ---------------------------------------------------------------------------------------


def kill_group(p, grace=10):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(grace)
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # children left in the group
    except OSError:
        pass
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        pass


def cleanup():
    for p in CHILDREN:
        kill_group(p, 2)


class Server(gpu_demo.Rkvd):
    """one rkvd (its own process group) with kvmgr and a worker; what their logs say (get and
    log from gpu_demo's)"""

    def __init__(self, a, name, vram, host, extra=()):
        self.a, self.name = a, name
        self.root = Path(a.work) / name
        # budgets set at runtime persist in the state dir and would override the flags
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        self.log_path = self.root / "rkvd.log"
        self.args = [str(Path(a.bin) / "rkvd"), "--model", str(a.model), "--listen", "127.0.0.1:0",
                     "--backend", a.backend, "--state-dir", str(self.root / "state"),
                     "--runtime-dir", str(self.root / "run"), "--vram-target", f"{vram}B",
                     "--host-budget", f"{host}B", "--kv-dtype", a.kv_dtype,
                     "--block-size", str(a.block_size), "--ctx-size", str(a.ctx_size),
                     "--max-sessions", "4096", "--max-batch-tokens", str(a.max_batch_tokens),
                     "--prefill-chunk", str(a.prefill_chunk), "--prefill-beside-decode",
                     str(a.prefill_beside_decode), "--log-level", "info", *extra]
        if a.backend == "cuda" and a.reserve:
            self.args += ["--compute-reserve", f"{a.reserve}B"]
        if a.threads:
            self.args += ["--threads", str(a.threads)]
        self.args += shlex.split(a.rkvd_args or "")
        if a.no_rotation:
            self.args.append("--no-rotation")
        self.port = self.proc = None
        self.used_at_hello = self.weights = self.plan_overhead = 0

    def start(self, timeout):
        self._log = open(self.log_path, "ab")
        # the worker's and rkvd's step lines every STEP_REPORT_MS, so a short run's window is
        # read on its own (step_lines); the worker inherits the environment
        env = dict(os.environ)
        env.setdefault("RKV_STEP_REPORT_MS", str(STEP_REPORT_MS))
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        CHILDREN.append(self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            txt = self.log()
            if self.port is None:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", txt)
                self.port = int(m.group(1)) if m else None
            elif self.get("/health")[0] == 200 and "attached to kvmgr" in txt:
                self.model_id = json.loads(self.get("/v1/models")[1])["data"][0]["id"]
                self._parse(txt)
                return True
            time.sleep(0.1)
        code = self.proc.poll()
        why = f"exited with {code}" if code is not None else f"not healthy in {timeout:.0f} s"
        raise RuntimeError(f"rkvd ({self.name}) {why}; log tail:\n{self.log()[-3000:]}")

    def _parse(self, txt):
        m = re.search(r"pools: (\d+) device block\(s\) per gpu .*? and (\d+) host block\(s\) "
                      r".*? of (\d+) bytes, (\d+) positions", txt)
        self.dev_blocks, self.host_blocks = int(m.group(1)), int(m.group(2))
        self.block_bytes, self.block_size = int(m.group(3)), int(m.group(4))
        self.bpt = self.block_bytes // self.block_size
        w = re.search(r"on (\w+): .*?([\d.]+) MiB of weights", txt)
        self.weights = int(float(w.group(2)) * MIB) if w else 0
        # the reserve: --reserve, else what the worker measured on the model (kvmgr's
        # default, 512 MiB, when it could not)
        rm = re.search(r"compute reserve (\d+) MiB measured", txt)
        self.reserve = self.a.reserve or (int(rm.group(1)) * MIB if rm else 512 * MIB)
        u = re.search(r"in use now ([\d.]+) (GiB|MiB|KiB)", txt)
        self.used_at_hello = (int(float(u.group(1)) * {"GiB": GIB, "MiB": MIB, "KiB": 1024}[
            u.group(2)]) if u else 0)
        # kvmgr plans a live target with what the gpu held at the first hello (weights, cuda
        # contexts, kept scratch) and the reserve
        self.plan_overhead = (max(self.weights, self.used_at_hello) + self.reserve
                              if self.a.backend == "cuda" else 0)
        r = re.search(r"kv rates .*?: pcie h2d ([\d.]+), attention device ([\d.]+), host "
                      r"([\d.]+), cpu ([\d.]+) GB/s", txt)
        self.rates = dict(zip(("pcie_h2d", "attn_device", "attn_host", "cpu"),
                              map(float, r.groups()))) if r else {}

    def info(self):
        return {"dev_blocks": self.dev_blocks, "host_blocks": self.host_blocks,
                "block_bytes": self.block_bytes, "block_size": self.block_size,
                "weights_bytes": self.weights, "used_at_hello_bytes": self.used_at_hello,
                "worker_rates_gbps": self.rates, "args": self.args[1:]}

    def stop(self):
        code = None
        if self.proc:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            code = self.proc.poll()
            kill_group(self.proc, 2)
            self._log.close()
        Path(self.a.out, f"rkvd-{self.name}.log").write_text(self.log()[-300000:])
        return code

    def metrics(self):
        out = {}
        for line in self.get("/metrics")[1].decode(errors="replace").splitlines():
            if line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, 1)[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def sessions(self):
        """rkvctl sessions, read over the admin HTTP API (no key exists, the peer is loopback):
        a turn of a few hundred ms gets readings while it runs, where starting rkvctl for each
        took about as long as the turn on a loaded machine"""
        st, body = self.get("/admin/v1/sessions_list")
        if st == 200:
            return json.loads(body)["result"]["sessions"]
        return self.ctl("sessions", "list")["sessions"]

    def budget_set(self, vram):
        t = time.monotonic()
        r = self.ctl("budget", "set", "--vram-target", f"{int(vram)}B")
        return time.monotonic() - t, r


# --- streaming clients --------------------------------------------------------------------------


prompt_ids = gpu_demo.prompt_ids


class Stream:
    """one greedy streamed completion on a thread, repeated while repeat is set (a named
    session's next turn sends the same prompt: its KV is reused and the context stays within
    prompt + max_tokens). Counts tokens per chunk from logprobs.tokens."""

    def __init__(self, srv, prompt, max_tokens, session=None, repeat=False, top=0, body=None):
        self.srv, self.prompt, self.max_tokens = srv, prompt, max_tokens
        self.body = body or {}  # more request fields (response_format: no ignore_eos then)
        self.session, self.repeat, self.top = session, repeat, top
        self.times, self.cum = [], []  # chunk arrival times and tokens so far
        self.texts, self.finish, self.errors = [], [], []
        self.toks = []  # per turn: (token, logprob, {alternative: logprob}) with top > 0
        self.turns = self.busy_retries = 0
        self.stopping = threading.Event()
        self.conn = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.t_start = time.monotonic()
        self.thread.start()
        return self

    def tokens(self):
        return self.cum[-1] if self.cum else 0

    def first_time(self):
        return self.times[0] if self.times else None

    def tokens_in(self, t0, t1):
        """tokens whose chunk arrived in (t0, t1]"""
        def at(t):
            i = bisect.bisect_right(self.times, t)
            return self.cum[i - 1] if i else 0
        return at(t1) - at(t0)

    def rate_in(self, t0, t1):
        """tok/s over whole steps in (t0, t1]: the chunks of one step (several with
        decode_steps) arrive together, so from the end of the first such burst to the end of
        the last, the tokens after the first burst over the time between (None with fewer than
        two bursts). A window of a few slow steps counted by tokens_in is off by up to a step"""
        return burst_rate(self.times, self.cum, t0, t1)

    def _turn(self):
        body = {"model": self.srv.model_id, "prompt": self.prompt, "max_tokens": self.max_tokens,
                "temperature": 0, "stream": True, "ignore_eos": True, "logprobs": self.top}
        if self.session:
            body["session_id"] = self.session
        body.update(self.body)
        if "response_format" in body:
            body.pop("ignore_eos")
        c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=self.srv.a.io_timeout)
        with self.lock:
            self.conn = c
        try:
            c.request("POST", "/v1/completions", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 409:  # the previous turn's sequence is still being closed
                r.read()
                return "busy"
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
            text, fin, toks = [], None, []
            for ch in gpu_demo.sse_choices(r):
                lp = ch.get("logprobs")
                n = len(lp.get("tokens") or []) if lp else int(bool(ch.get("text")))
                if lp and self.top:
                    toks += zip(lp.get("tokens") or [], lp.get("token_logprobs") or [],
                                lp.get("top_logprobs") or [])
                if not n and not ch.get("finish_reason"):
                    continue
                t = time.monotonic()
                self.times.append(t)
                self.cum.append(self.tokens() + n)
                text.append(ch.get("text", ""))
                fin = ch.get("finish_reason") or fin
            self.texts.append("".join(text))
            self.toks.append(toks)
            self.finish.append(fin)
            return fin
        finally:
            c.close()

    def _run(self):
        while not self.stopping.is_set():
            try:
                fin = self._turn()
            except Exception as e:  # noqa: BLE001 - judged by the caller
                if not self.stopping.is_set():
                    self.errors.append(repr(e))
                return
            if fin == "busy":
                self.busy_retries += 1
                if self.busy_retries > 500:
                    self.errors.append("session stayed busy (409) for 500 retries")
                    return
                time.sleep(0.01)
                continue
            self.turns += 1
            if fin != "length":
                self.errors.append(f"turn ended with finish_reason {fin!r}, not 'length'")
                return
            if not self.repeat:
                return

    def leave(self):
        """the client goes away mid-stream (rkvd cancels the request)"""
        self.stopping.set()
        with self.lock:
            c = self.conn
        try:
            if c and c.sock:
                c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(30)

    def join(self, a):
        """until the turn ends; a stream cannot hang (each read has io_timeout), so the wait
        is not cut by the overall deadline, which would judge half-finished streams"""
        self.thread.join(max(a.io_timeout, left(a)) + 5)
        if self.thread.is_alive():
            self.errors.append("still running after the wait")
        return self

    def wait_tokens(self, k, deadline):
        while self.tokens() < k and not self.errors and self.thread.is_alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {self.session or ''} got {self.tokens()} of {k} "
                                   f"tokens before its deadline")
            time.sleep(0.005)
        if self.errors:
            raise RuntimeError(f"stream {self.session or ''}: {self.errors[0]}")


STEP_REPORT_MS = 500
_WORKER_LINE = re.compile(
    r"^(\S+)Z rkv-worker\[\d+\] info: (\d+) steps in ([\d.]+) s \(.*?\): forward ([\d.]+) ms, "
    r"sampling ([\d.]+) ms, the rest of the step ([\d.]+) ms, between steps ([\d.]+) ms", re.M)
_RKVD_LINE = re.compile(
    r"^(\S+)Z rkvd\[\d+\] info: worker \d+: (\d+) steps in ([\d.]+) s: kvmgr kv_prep ([\d.]+) "
    r"ms .*?worker step ([\d.]+) ms, rkvd loop between steps ([\d.]+) ms", re.M)


def step_lines(log_text, t0, t1):
    """where a step's time went between wall-clock times t0 and t1 (seconds since the epoch),
    from the worker's and rkvd's step lines whose whole period lies inside: per-step means in
    ms, weighted by steps; None when no line fits (a window shorter than two periods)"""
    def inside(ts, period):
        end = datetime.datetime.fromisoformat(ts).replace(
            tzinfo=datetime.timezone.utc).timestamp()
        return end - period >= t0 and end <= t1

    def mean(rows, col):
        n = sum(r[0] for r in rows)
        return rnd(sum(r[0] * r[col] for r in rows) / n, 3) if n else None

    w = [(int(m[1]), float(m[3]), float(m[4]), float(m[5]), float(m[6]))
         for m in (x.groups() for x in _WORKER_LINE.finditer(log_text)) if inside(m[0], float(m[2]))]
    d = [(int(m[1]), float(m[3]), float(m[4]), float(m[5]))
         for m in (x.groups() for x in _RKVD_LINE.finditer(log_text)) if inside(m[0], float(m[2]))]
    if not w and not d:
        return None
    return {"worker_lines": len(w), "worker_steps": sum(r[0] for r in w),
            "worker_forward_ms": mean(w, 1), "worker_sampling_ms": mean(w, 2),
            "worker_rest_ms": mean(w, 3), "worker_between_steps_ms": mean(w, 4),
            "rkvd_lines": len(d), "rkvd_kv_prep_ms": mean(d, 1), "rkvd_worker_step_ms": mean(d, 2),
            "rkvd_loop_ms": mean(d, 3)}


def burst_rate(times, cum, t0, t1):
    """Stream.rate_in over arrival times and cumulative tokens: a burst ends where the next
    arrival comes over a third of the window's longest gap later; None without two such ends"""
    i, j = bisect.bisect_right(times, t0), bisect.bisect_right(times, t1) - 1
    if j <= i:
        return None
    gaps = [times[k + 1] - times[k] for k in range(i, j)]
    cut = max(gaps) / 3
    # bursts that end inside the window (the last one may go on past t1)
    ends = [k for k in range(i, j) if times[k + 1] - times[k] > cut]
    if len(ends) < 2:
        return None
    a, b = ends[0], ends[-1]
    return (cum[b] - cum[a]) / (times[b] - times[a])


def steady_rate(streams):
    """aggregate tok/s while every stream was decoding: from the last first chunk to the
    first last chunk"""
    ta = max(s.times[0] for s in streams)
    tb = min(s.times[-1] for s in streams)
    if len(streams) == 1:
        ta, tb = streams[0].times[0], streams[0].times[-1]
    if tb <= ta:
        return None, 0
    return sum(s.tokens_in(ta, tb) for s in streams) / (tb - ta), tb - ta


# --- ceilings and engine references ---------------------------------------------------------------


def gpu_bench(a):
    """gpu_bench --suite decode --quick --json: ceilings and the engine's decode tok/s"""
    exe = Path(a.gpu_bench) if a.gpu_bench else Path(a.bin) / "gpu_bench"
    res = {"path": str(exe)}
    if a.backend != "cuda" and not a.gpu_bench:
        res["skipped"] = "cpu backend: no ceilings (HBM and PCIe bounds read 'no ceiling')"
        return res
    if not exe.exists():
        res["skipped"] = (f"{exe} not found: no ceilings (build it with make gpu "
                          "and pack it, or pass --gpu-bench)")
        return res
    js = Path(a.out) / "gpu_bench.json"
    cmd = [str(exe), "--suite", "decode", "--quick", "--json", str(js)]
    # the ceilings are what matter for a preset gpu_bench does not build
    cmd += ["--preset", a.preset if a.preset in ("small", "llama3-8b") else "small"]
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.gpu_bench_timeout)
    except subprocess.TimeoutExpired:
        res["skipped"] = f"gpu_bench ran past {a.gpu_bench_timeout} s"
        return res
    res["wall_s"] = rnd(time.monotonic() - t, 1)
    Path(a.out, "gpu_bench.txt").write_text(r.stdout + r.stderr)
    if r.returncode == 77:
        res["skipped"] = "gpu_bench: no CUDA device"
        return res
    try:
        recs = json.loads(js.read_text())["records"]
    except (OSError, ValueError, KeyError) as e:
        res["skipped"] = f"gpu_bench exit {r.returncode}, no json ({e}): {r.stderr[-300:]}"
        return res
    res["exit"] = r.returncode
    res["records"] = recs
    by = {x["name"]: x["value"] for x in recs}
    res["hbm_gbps"] = by.get("hbm stream read")
    h2d = [by.get("pinned h2d 64MiB copies"), by.get("zero-copy kernel read")]
    # as gpu_bench: the faster of the two ways host bytes reach the gpu
    res["pcie_gbps"] = max([x for x in h2d if x] or [0]) or None
    for x in recs:
        m = re.match(r"decode b=(\d+) ctx=(\d+)( host=0\.0%)? \(tok/s\)", x["name"])
        if m and (m.group(1) != "1" or m.group(3)):
            res.setdefault("decode", {})[f"b{m.group(1)}_ctx{m.group(2)}"] = x["value"]
    log(f"gpu_bench: hbm {res['hbm_gbps']} GB/s, pcie {res['pcie_gbps']} GB/s, decode "
        f"{res.get('decode')}")
    return res


def engine_rkv_gen(a, shape, batch, ctx, n):
    """the engine alone (rkv-gen, no HTTP, no IPC): decode tok/s at batch x ctx"""
    ids = prompt_ids("ramp-1", ctx, shape["vocab"])
    cmd = [str(Path(a.bin) / "rkv-gen"), "--model", str(a.model), "--prompt-ids",
           ",".join(map(str, ids)), "-n", str(n), "--batch", str(batch), "--backend", a.backend,
           "--kv-dtype", a.kv_dtype, "--block-size", str(a.block_size), "--ignore-eos", "--json"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, left(a) - 30))
    if r.returncode:
        raise RuntimeError(f"rkv-gen exit {r.returncode}: {r.stderr[-500:]}")
    return json.loads(r.stdout)["timings"]["decode_tok_s"]


def left(a):
    return a.deadline_at - time.monotonic()


# --- bounds -------------------------------------------------------------------------------------


def decode_bound(a, n_seq, dev_kv, host_kv):
    """tok/s bound of a decode step of n_seq sequences: the weights and device KV at HBM speed,
    the host KV over PCIe, overlapped (docs/performance.md); None without ceilings"""
    c = a.ceil
    if not c.get("hbm_gbps"):
        return None
    t_hbm = (a.weight_bytes + dev_kv) / (c["hbm_gbps"] * 1e9)
    t_pcie = host_kv / (c["pcie_gbps"] * 1e9) if c.get("pcie_gbps") else 0
    return n_seq / max(t_hbm, t_pcie)


def kv_split(srv, sess):
    """(device KV bytes, host KV bytes) of sessions from rkvctl sessions list"""
    dev = host = 0
    for s in sess:
        host += s["tail_tokens"] * srv.bpt
        dev += (s["kv_tokens"] - s["tail_tokens"]) * srv.bpt
    return dev, host


# --- 3. HTTP overhead ---------------------------------------------------------------------------


def bench_http(a, srv, shape, body=None, batches=None):
    out = {"ctx": a.ctx, "tokens": a.http_tokens, "runs": []}
    for b in batches or a.http_batches:
        if left(a) < a.reserve_s:
            out["runs"].append({"batch": b, "skipped": "out of time"})
            continue
        prompts = [prompt_ids(f"ramp-{i + 1}", a.ctx, shape["vocab"]) for i in range(b)]
        # the prompts' KV first, so the measured streams find it in the prefix cache and all
        # decode at once instead of waiting for each other's prefill (a prompt's blocks become
        # shareable once a decode step after the prefill has reported them written)
        t = time.monotonic()
        warm = [Stream(srv, p, 4).start() for p in prompts]
        for s in warm:
            s.join(a)
        warm_s = time.monotonic() - t
        m0 = srv.metrics()
        streams = [Stream(srv, p, a.http_tokens, body=body).start() for p in prompts]
        for s in streams:
            s.join(a)
        m1 = srv.metrics()
        for _ in range(100):  # rkvd counts a request a moment after its last chunk
            done = m1.get("rkv:request_success_total", 0) - m0.get("rkv:request_success_total", 0)
            if done >= b:
                break
            time.sleep(0.02)
            m1 = srv.metrics()
        itl = [m1.get(f"rkv:inter_token_latency_seconds_{k}", 0) -
               m0.get(f"rkv:inter_token_latency_seconds_{k}", 0) for k in ("sum", "count")]
        errs = [e for s in warm + streams for e in s.errors]
        run = {"batch": b, "errors": errs[:5], "prefill_warmup_s": rnd(warm_s),
               "prefilled_tokens": m1.get("rkv:prefill_tokens_total", 0) -
               m0.get("rkv:prefill_tokens_total", 0)}
        if not errs and all(s.times for s in streams):
            rate, span = steady_rate(streams)
            if not rate or span < 0.2 * (max(s.times[-1] for s in streams) -
                                         min(s.times[0] for s in streams)):
                # the streams barely overlapped (a loaded cpu): every token over the whole span
                t0, t1 = min(s.times[0] for s in streams), max(s.times[-1] for s in streams)
                rate = sum(s.tokens_in(t0, t1) for s in streams) / (t1 - t0) if t1 > t0 else None
                run["overlap"] = "short: rate over the whole span"
            # the client's clock is the measure; rkvd's mean inter-token latency (b / itl) is a
            # cross-check that reads high when the client lags behind the stream
            run.update(http_tok_s=rnd(rate, 1), steady_s=rnd(span),
                       ttft_s=rnd(min(s.first_time() for s in streams) - streams[0].t_start),
                       rkvd_itl_tok_s=rnd(b * itl[1] / itl[0], 1) if itl[0] > 0 else None)
            # the step lines of the window where every stream decoded (wall clock)
            wall = time.time() - time.monotonic()
            ta, tb = max(s.times[0] for s in streams), min(s.times[-1] for s in streams)
            run["steps"] = step_lines(srv.log(), ta + wall, tb + wall)
        out["runs"].append(run)
        log(f"http: batch {b}: {run}")
    return out


# every row constrained: an array of at least 1000 strings cannot end within the run, so each
# step masks every row, mostly inside a string (the state whose mask admits most of the
# vocabulary: one costly walk, then the grammar's shared cache)
STRUCTURED_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "long", "schema": {"type": "array", "minItems": 1000, "items": {"type": "string"}}}}


def bench_structured(a, srv, shape):
    """streamed tok/s with every row under a grammar against the same batches unconstrained,
    in one run (structured output's cost: >= 0.95 at batch 1, >= 0.9 at 64)"""
    batches = sorted({1, max(a.http_batches)})
    free = bench_http(a, srv, shape, batches=batches)
    cons = bench_http(a, srv, shape, body={"response_format": STRUCTURED_FORMAT},
                      batches=batches)
    out = {"unconstrained": free, "constrained": cons, "ratios": {}}
    for f, c in zip(free["runs"], cons["runs"]):
        r = ratio(c.get("http_tok_s"), f.get("http_tok_s"))
        out["ratios"][str(f["batch"])] = rnd(r)
        need = 0.95 if f["batch"] == 1 else 0.9
        target(f"structured output batch {f['batch']}: constrained tok/s >= {need} x free",
               rnd(r), need, f"{c.get('http_tok_s')} vs {f.get('http_tok_s')}")
    return out


def http_engine_refs(a, shape, http):
    """the engine's tok/s for each batch of the HTTP run: gpu_bench's record when it ran this
    shape, else rkv-gen on the same backend"""
    dec = a.ceil.get("decode", {})
    for run in http["runs"]:
        if "http_tok_s" not in run:
            continue
        key = f"b{run['batch']}_ctx{a.ctx}"
        if key in dec and a.preset in ("llama3-8b", "small"):
            run["engine_tok_s"], run["engine"] = dec[key], "gpu_bench " + key
        elif left(a) > a.reserve_s:
            try:
                run["engine_tok_s"] = rnd(engine_rkv_gen(a, shape, run["batch"], a.ctx,
                                                         a.http_tokens), 1)
                run["engine"] = f"rkv-gen --batch {run['batch']} --backend {a.backend}"
            except Exception as e:  # noqa: BLE001 - recorded; the target reads SKIP
                run["engine_error"] = repr(e)[:400]
        run["ratio"] = rnd(ratio(run["http_tok_s"], run.get("engine_tok_s")))
        target(f"http batch {run['batch']}: streamed tok/s >= 0.95 x engine", run["ratio"],
               0.95, f"{run['http_tok_s']} vs {run.get('engine_tok_s')} ({run.get('engine')})")


# --- 5. time to first token -------------------------------------------------------------------


def server_chunk(a):
    """rkvd's prefill chunk: its step on a gpu (2048 tokens by default), 256 on the cpu"""
    step = a.max_batch_tokens or (2048 if a.backend == "cuda" else 512)
    return min(a.prefill_chunk or (step if a.backend == "cuda" else 256), step)


def bench_ttft(a, srv, shape, full_target):
    """one prompt of ttft_ctx tokens through HTTP with nothing else running (after a short
    request, so the path is warm): the time until its first token arrives"""
    vocab = shape["vocab"]
    warm = Stream(srv, prompt_ids("ttft-warm", a.block_size, vocab), 2, session="ttft-warm")
    warm.start().join(a)
    st = Stream(srv, prompt_ids("ttft", a.ttft_ctx, vocab), 1, session="ttft")
    st.start().join(a)
    if st.errors or not st.times:
        raise RuntimeError(f"ttft: the prompt failed: {st.errors}")
    ttft = st.first_time() - st.t_start
    out = {"ctx": a.ttft_ctx, "chunk": server_chunk(a), "ttft_s": rnd(ttft, 4),
           "http_prefill_tok_s": rnd(a.ttft_ctx / ttft, 1)}
    log(f"ttft: a {a.ttft_ctx}-token prompt's first token after {out['ttft_s']} s through HTTP "
        f"({out['http_prefill_tok_s']} tok/s)")
    evict(srv, "ttft")
    evict(srv, "ttft-warm")
    return out


def ttft_engine_ref(a, shape, res):
    """the engine alone on the same prompt: rkv-gen's prefill time (one untimed chunk first),
    same model, backend, kv dtype, block size and chunk as the server's; then the target"""
    ids = prompt_ids("ttft", a.ttft_ctx, shape["vocab"])
    cmd = [str(Path(a.bin) / "rkv-gen"), "--model", str(a.model), "--prompt-ids",
           ",".join(map(str, ids)), "-n", "1", "--backend", a.backend, "--kv-dtype", a.kv_dtype,
           "--block-size", str(a.block_size), "--chunk", str(res["chunk"]), "--warmup",
           "--ignore-eos", "--json"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, left(a) - 10))
    if r.returncode:
        raise RuntimeError(f"rkv-gen exit {r.returncode}: {r.stderr[-500:]}")
    eng = json.loads(r.stdout)["timings"]["prefill_ms"] / 1e3
    res["engine_prefill_s"] = rnd(eng, 4)
    res["engine"] = f"rkv-gen --chunk {res['chunk']} --warmup --backend {a.backend}"
    res["ratio"] = rnd(ratio(res["ttft_s"], eng))
    target(f"time to first token of a {a.ttft_ctx}-token prompt through HTTP <= 1.1 x the "
           "engine's prefill", res["ratio"], 1.1, f"{res['ttft_s']} s vs {res['engine_prefill_s']}"
           f" s ({res['engine']})", at_most=True)


# --- 1. load ramp -------------------------------------------------------------------------------


def measure(a, srv, streams, secs, label):
    """one window: every stream decoding, nobody arriving"""
    s0, m0, t0 = srv.sessions(), srv.metrics(), time.monotonic()
    time.sleep(secs)
    t1 = time.monotonic()
    m1, s1 = srv.metrics(), srv.sessions()
    tac = srv.ctl("tactics", "--count", "1")["gpus"][0]
    w = t1 - t0
    gen = (m1.get("rkv:generation_tokens_total", 0) - m0.get("rkv:generation_tokens_total", 0))
    moved = (m1.get("rkv:kv_bytes_migrated_total", 0) - m0.get("rkv:kv_bytes_migrated_total", 0))
    # each stream's rate over whole steps (its chunks arrive once a step), summed: gen / w
    # counts whole steps only, off by up to one step's tokens (a 3 s window of 0.5 s steps
    # reads 5 or 6 of them); that figure stays in the record as window_tok_s
    steps = [st.rate_in(t0, t1) for st in streams]
    per = steps if all(x is not None for x in steps) else [st.tokens_in(t0, t1) / w
                                                            for st in streams]
    agg = sum(per) if per is steps else gen / w
    mine = {st.session: st for st in streams}
    active = [x for x in s1 if x["id"] in mine]
    # the KV the window's steps read: the mean of its start and its end (a phase's tails grow
    # through its window; the end alone overstates the host bytes, by a fifth at 20 sessions)
    d1, h1 = kv_split(srv, active)
    d0, h0 = kv_split(srv, [x for x in s0 if x["id"] in mine] or active)
    dev, host = (d0 + d1) // 2, (h0 + h1) // 2
    # every decode step of a WINDOW session reads its host tail once over the link (a
    # CPU_TAIL session's tail is read by the worker's cpu threads instead; a rotated one's
    # waits on the host and is not read: its swaps count among kvmgr's moves)
    tail0 = {x["id"]: x["tail_tokens"] for x in s0}
    streamed = sum((x["tail_tokens"] + tail0.get(x["id"], x["tail_tokens"])) / 2 * srv.bpt *
                   mine[x["id"]].tokens_in(t0, t1) for x in active
                   if x["tactic"] not in ("cpu_tail", "rotated")) / w
    tactics = {}
    for x in active:
        tactics[x["tactic"]] = tactics.get(x["tactic"], 0) + 1
    # each stream's longest wait between two bursts in the window (a rotation turn shows here)
    gaps = [gap_stats(st.times, t0, t1)["max_ms"] for st in streams]
    swaps = (m1.get("rkv:rotation_swaps_total", 0) - m0.get("rkv:rotation_swaps_total", 0))
    bound = decode_bound(a, len(streams), dev, host)
    rec = {"label": label, "n": len(streams), "window_s": rnd(w), "agg_tok_s": rnd(agg, 2),
           "agg_over": "whole steps" if per is steps else "the window",
           "window_tok_s": rnd(gen / w, 2), "client_tok_s": rnd(sum(per), 2),
           "per_session_tok_s": {"mean": rnd(sum(per) / len(per), 2), "min": rnd(min(per), 2),
                                 "max": rnd(max(per), 2)},
           "per_session": {st.session: {"tok_s": rnd(r, 2), "longest_gap_ms": g}
                           for st, r, g in zip(streams, per, gaps)},
           "longest_gap_ms": max((g for g in gaps if g is not None), default=None),
           "rotation_swaps_per_s": rnd(swaps / w, 2), "rotated": tac.get("rotated", 0),
           "tactics": tactics, "histogram": tac["sessions"], "histogram_bytes": tac["bytes"],
           "device_used": tac["device_used"], "host_used": tac["host_used"],
           "active_kv_device_bytes": dev, "active_kv_host_bytes": host,
           "pcie_migrated_Bps": rnd(moved / w, 0), "pcie_streamed_Bps": rnd(streamed, 0),
           "pcie_Bps": rnd(moved / w + streamed, 0), "fits": all(
               x["tactic"] == "resident" and x["tail_tokens"] == 0 for x in active),
           "bound_tok_s": rnd(bound, 2), "ratio_to_bound": rnd(ratio(agg, bound))}
    errs = [e for st in streams for e in st.errors]
    if errs:
        raise RuntimeError(f"{label}: a stream failed: {errs[0]}")
    log(f"ramp {label}: n={rec['n']} {rec['agg_tok_s']} tok/s ({rec['per_session_tok_s']}), "
        f"{tactics}, dev {dev >> 20} MiB host {host >> 20} MiB, pcie "
        f"{rec['pcie_Bps'] / 1e9:.3f} GB/s ({rec['pcie_migrated_Bps'] / 1e9:.3f} of it kvmgr's "
        f"moves), bound {rec['bound_tok_s']} -> {rec['ratio_to_bound']}")
    return rec


def wait_resident(srv, names, timeout):
    """seconds until every session in names is RESIDENT with no tail (None: not in time)"""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        ss = [x for x in srv.sessions() if x["id"] in names]
        if len(ss) == len(names) and all(
                x["tactic"] == "resident" and x["tail_tokens"] == 0 for x in ss):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def evict(srv, name, timeout=10):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if srv.ctl("sessions", "evict", name, check=False) is not None:
            return True
        time.sleep(0.02)
    return False


def ramp(a, srv, shape, n_max, up, down, label):
    """sessions ramp-1..n_max arrive one by one (a window at each count in up), then leave,
    oldest first (a window at each count in down, after the time to all-RESIDENT)"""
    phases, streams = [], []
    try:
        for k in range(1, n_max + 1):
            if left(a) < a.ramp_floor:
                note(f"{label}: out of time at {k - 1} sessions")
                break
            st = Stream(srv, prompt_ids(f"ramp-{k}", a.ctx, shape["vocab"]), a.turn_tokens,
                        session=f"ramp-{k}", repeat=True).start()
            streams.append(st)
            st.wait_tokens(1, min(time.monotonic() + a.io_timeout, a.deadline_at))
            if k in up:
                # the peak's window spans several rotation cycles, so each stream's share is
                # judged over whole turns rather than the one or two a short window catches
                secs = a.window if k < n_max or label == "resident" else a.peak_window
                ph = measure(a, srv, streams, secs, f"{label} up {k}")
                ph["arrival_ttft_s"] = rnd(st.first_time() - st.t_start)
                phases.append(ph)
        for k in down:
            if left(a) < a.ramp_floor / 2 or k >= len(streams):
                continue
            while len(streams) > k:
                st = streams.pop(0)
                st.leave()
                if not evict(srv, st.session):
                    note(f"{label}: {st.session} could not be evicted after it left")
            # the time to all-RESIDENT is asked only where the remaining sessions fit
            res = wait_resident(srv, {s.session for s in streams}, a.resident_timeout) \
                if k <= a.fit_sessions else None
            ph = measure(a, srv, streams, a.window, f"{label} down {k}")
            ph["to_resident_s"] = rnd(res)
            phases.append(ph)
    finally:
        for st in streams:
            st.leave()
        for st in streams:
            evict(srv, st.session, 2)
    return phases


def judge_ramp(a, rp, ref, spill):
    """the issue's targets on the ramp's phases"""
    ref_at = {p["n"]: p["agg_tok_s"] for p in ref}
    fits = [p for p in rp if p["fits"] and p["label"].endswith(f"up {p['n']}")]
    over = [p for p in rp if not p["fits"]]
    worst = min(fits, key=lambda p: ratio(p["agg_tok_s"], ref_at.get(p["n"])) or 9, default=None)
    for p in fits:
        p["ratio_to_resident"] = rnd(ratio(p["agg_tok_s"], ref_at.get(p["n"])))
    target("ramp, while everything fits: aggregate tok/s >= 0.95 x the all-resident run "
           "(worst phase)", worst and worst.get("ratio_to_resident"), 0.95,
           worst and f"n={worst['n']}: {worst['agg_tok_s']} vs {ref_at.get(worst['n'])}",
           none_means="no phase that fits with a resident reference")
    if not over:
        target("ramp, under overflow: aggregate >= 0.9 x max(HBM, PCIe) bound", None, 0.9,
               "", none_means="no phase overflowed (raise --sessions-max)")
    else:
        w = min(over, key=lambda p: p["ratio_to_bound"] if p["ratio_to_bound"] else 9)
        target("ramp, under overflow: aggregate >= 0.9 x max(HBM, PCIe) bound (worst phase)",
               w["ratio_to_bound"], 0.9, f"{w['label']}: {w['agg_tok_s']} vs {w['bound_tok_s']}",
               none_means="no ceiling (gpu_bench did not run)")
        # the seeds' two spilled sessions ran slower than one: the aggregate against one session
        # with the same tail, interpolated on the spill curve (step time vs tail bytes)
        pts = sorted((p["host_kv_bytes"], 1 / p["decode_tok_s"]) for p in spill.get("points", [])
                     if p.get("decode_tok_s"))
        worst_r, worst_p = None, None
        for p in over:
            spilled = [t for t, n in p["tactics"].items() if t != "resident" for _ in range(n)]
            tail = p["active_kv_host_bytes"] / max(1, len(spilled))
            one = interp(pts, tail)
            p["single_session_spill_tok_s"] = rnd(1 / one, 2) if one else None
            r = ratio(p["agg_tok_s"], p["single_session_spill_tok_s"])
            p["ratio_to_single_spill"] = rnd(r)
            if r is not None and (worst_r is None or r < worst_r):
                worst_r, worst_p = r, p
        target("ramp, under overflow: aggregate >= one spilled session's tok/s (worst phase)",
               worst_r, 1.0, worst_p and f"{worst_p['label']}: {worst_p['agg_tok_s']} vs "
               f"{worst_p['single_session_spill_tok_s']} (spill curve at the same tail)",
               none_means="no spill curve covering the tail")
    # rotation (the issue's overflow table): the aggregate against the all-resident one at the
    # fitting count, the slowest session's share at the peak, the longest gap of any stream
    full = ref_at.get(a.fit_sessions)
    ups_over = [p for p in over if " up " in p["label"]]
    w = min(ups_over, key=lambda p: p["agg_tok_s"], default=None)
    target(f"ramp, under overflow: aggregate >= 0.85 x the {a.fit_sessions}-session "
           "all-resident aggregate (worst phase)", w and ratio(w["agg_tok_s"], full), 0.85,
           w and f"{w['label']}: {w['agg_tok_s']} vs {full}",
           none_means="no overflow phase or no resident reference at the fitting count")
    peak = max(ups_over, key=lambda p: p["n"], default=None)
    target("ramp, at the peak: slowest session's tok/s >= 0.8 x aggregate / sessions",
           peak and ratio(peak["per_session_tok_s"]["min"], peak["agg_tok_s"] / peak["n"]), 0.8,
           peak and f"{peak['label']}: {peak['per_session_tok_s']['min']} vs "
           f"{rnd(peak['agg_tok_s'] / peak['n'], 2)}", none_means="no overflow phase")
    gap = max(rp, key=lambda p: p.get("longest_gap_ms") or 0, default=None)
    target("ramp, any phase: longest gap between two tokens of a stream <= max_stall_ms, ms",
           gap and gap.get("longest_gap_ms"), a.max_stall_ms,
           gap and f"{gap['label']} (rotation {'off' if a.no_rotation else 'on'})",
           none_means="no phase with two bursts", at_most=True)
    target("ramp, at the peak: time to first token of the newest session <= 2 s",
           peak and peak.get("arrival_ttft_s"), 2.0, peak and peak["label"],
           none_means="no overflow phase", at_most=True)
    downs = [p for p in rp if " down " in p["label"]]
    if downs:
        last = downs[-1]
        fitting = [p for p in downs if p["n"] <= a.fit_sessions]
        slow = max((p["to_resident_s"] if p["to_resident_s"] is not None else math.inf)
                   for p in fitting) if fitting else None
        target("ramp, after the drain: every session RESIDENT within 1 s (slowest leave once "
               "they fit), seconds", slow, 1.0, "" if slow != math.inf else
               f"not within {a.resident_timeout} s", none_means="the drain did not reach the "
               "fitting count", at_most=True)
        target(f"ramp, after the drain (n={last['n']}): tok/s >= 0.95 x resident",
               ratio(last["agg_tok_s"], ref_at.get(last["n"])), 0.95,
               f"{last['agg_tok_s']} vs {ref_at.get(last['n'])}",
               none_means="no resident reference at that count")


def interp(pts, x):
    if not pts:
        return None
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return None  # beyond the curve: no extrapolation


# --- 2. spill curve -----------------------------------------------------------------------------


def bench_spill(a, srv, shape, full_target):
    """one named session of spill_ctx positions; per host fraction: budget set, then a turn that
    appends spill_prefill new tokens (prefill over the spilled KV) and decodes spill_decode"""
    out = {"ctx": a.spill_ctx, "prefill_tokens": a.spill_prefill, "decode_tokens": a.spill_decode,
           "points": []}
    base = prompt_ids("spill-base", a.spill_ctx, shape["vocab"])
    st = Stream(srv, base, 2, session="spill").start()
    st.join(a)
    if st.errors or not st.times:
        raise RuntimeError(f"spill: the base prefill failed: {st.errors}")
    out["base_prefill_tok_s"] = rnd(a.spill_ctx / (st.first_time() - st.t_start), 1)
    log(f"spill: base prefill of {a.spill_ctx} tokens: {out['base_prefill_tok_s']} tok/s")
    prompt = list(base)
    t_res_prefill = None
    for i, frac in enumerate(a.spill_fracs):
        if left(a) < a.reserve_s:
            out["points"].append({"host_frac_wanted": frac, "skipped": "out of time"})
            continue
        # the fraction of the context the turn starts from (its decoded blocks land on device)
        ctx_blocks = -(-(len(prompt) + a.spill_prefill) // srv.block_size)
        dev_blocks = max(2, math.ceil((1 - frac) * ctx_blocks)) if frac > 0 else ctx_blocks + 4
        tgt = full_target if frac == 0 else srv.plan_overhead + dev_blocks * srv.block_bytes + \
            srv.block_bytes // 2
        set_s, _ = srv.budget_set(tgt)
        prompt += prompt_ids(f"spill-{i}", a.spill_prefill, shape["vocab"])
        m0 = srv.metrics()
        st = Stream(srv, list(prompt), a.spill_decode, session="spill").start()
        seen, idle = [], []
        while st.thread.is_alive():
            ss = [x for x in srv.sessions() if x["id"] == "spill"]
            if ss and st.times and st.thread.is_alive():
                (seen if ss[0]["busy"] else idle).append(ss[0])
            time.sleep(0.02)
        st.join(a)
        if not seen and not idle:
            # the turn ended before a reading came back (a loaded machine): one after it
            idle += [x for x in srv.sessions() if x["id"] == "spill"]
        m1 = srv.metrics()
        if st.errors or not st.times:
            raise RuntimeError(f"spill at {frac}: {st.errors}")
        ttft = st.first_time() - st.t_start
        rate, _ = steady_rate([st])
        # a reading while the turn decodes (else one between its chunks): the median host
        # share of them, so that one reading taken while kvmgr re-plans does not decide
        readings = seen or idle[-1:]
        readings.sort(key=lambda x: x["tail_tokens"] / max(1, x["kv_tokens"]))
        sp = readings[len(readings) // 2] if readings else None
        moved = m1.get("rkv:kv_bytes_migrated_total", 0) - m0.get("rkv:kv_bytes_migrated_total", 0)
        prefilled = m1.get("rkv:prefill_tokens_total", 0) - m0.get("rkv:prefill_tokens_total", 0)
        p = {"host_frac_wanted": frac, "vram_target": tgt, "budget_set_s": rnd(set_s),
             "tactic": sp and sp["tactic"], "kv_tokens": sp and sp["kv_tokens"],
             "tail_tokens": sp and sp["tail_tokens"],
             "host_frac": rnd(sp["tail_tokens"] / sp["kv_tokens"]) if sp else None,
             "host_kv_bytes": sp["tail_tokens"] * srv.bpt if sp else 0,
             "device_kv_bytes": (sp["kv_tokens"] - sp["tail_tokens"]) * srv.bpt if sp else 0,
             "readings": [len(seen), len(idle)],
             "reading_tactics": sorted({x["tactic"] for x in readings}),
             "ttft_s": rnd(ttft), "prefilled_tokens": prefilled, "migrated_bytes": moved,
             "prefill_tok_s": rnd(prefilled / ttft, 1) if ttft > 0 else None,
             "decode_tok_s": rnd(rate, 2)}
        p["decode_bound_tok_s"] = rnd(decode_bound(a, 1, p["device_kv_bytes"],
                                                   p["host_kv_bytes"]), 2)
        p["decode_ratio"] = rnd(ratio(p["decode_tok_s"], p["decode_bound_tok_s"]))
        if frac == 0:
            t_res_prefill = ttft
        elif t_res_prefill and a.ceil.get("pcie_gbps"):
            # the resident turn's time, or every prefill chunk reading the tail plus the
            # promotion's copies over the link, whichever is longer
            chunks = -(-prefilled // server_chunk(a)) if prefilled else 1
            t_link = (chunks * p["host_kv_bytes"] + moved) / (a.ceil["pcie_gbps"] * 1e9)
            p["prefill_bound_tok_s"] = rnd(prefilled / max(t_res_prefill, t_link), 1)
            p["prefill_ratio"] = rnd(ratio(p["prefill_tok_s"], p["prefill_bound_tok_s"]))
        out["points"].append(p)
        log(f"spill {frac:.0%}: {p['tactic']} host {p['host_frac']}, decode {p['decode_tok_s']} "
            f"tok/s (bound {p['decode_bound_tok_s']} -> {p['decode_ratio']}), prefill "
            f"{p['prefill_tok_s']} tok/s of {prefilled} (ttft {p['ttft_s']} s)")
    srv.budget_set(full_target)
    evict(srv, "spill")
    return out


# --- 3. decode gaps beside a long prefill ---------------------------------------------------


def gap_stats(times, t0, t1):
    """the waits between a stream's bursts inside [t0, t1], in ms: count, median, longest (None
    when fewer than two bursts came). Chunks less than 1 ms apart are one burst: a worker round
    trip of several decode steps sends its tokens together"""
    ts = []
    for t in times:
        if t0 <= t <= t1 and (not ts or t - last > 1e-3):
            ts.append(t)
        last = t
    gaps = sorted((y - x) * 1e3 for x, y in zip(ts, ts[1:]))
    if not gaps:
        return {"n": 0, "median_ms": None, "max_ms": None}
    return {"n": len(gaps), "median_ms": rnd(gaps[len(gaps) // 2], 2), "max_ms": rnd(gaps[-1], 2)}


def bench_gaps(a, srv, shape, full_target):
    """the price of the step size: one stream decodes, then another session's prompt of gaps_ctx
    tokens prefills beside it; the decoding stream's waits between tokens alone and during that
    prefill (its chunks share the steps), and the prompt's prefill rate"""
    vocab = shape["vocab"]
    n_dec = a.gaps_decode  # enough tokens to outlast the window and the prefill
    dec = Stream(srv, prompt_ids("gaps-dec", a.block_size, vocab), n_dec, session="gaps-dec")
    dec.start()
    long = None
    try:
        dec.wait_tokens(8, time.monotonic() + a.io_timeout)
        t_alone = time.monotonic()
        time.sleep(a.window)
        long = Stream(srv, prompt_ids("gaps-long", a.gaps_ctx, vocab), 2, session="gaps-long")
        long.start().join(a)
        if long.errors or not long.times:
            raise RuntimeError(f"gaps: the long prompt failed: {long.errors}")
        if not dec.thread.is_alive():
            raise RuntimeError(f"gaps: the decoding stream ended before the prefill did "
                               f"({dec.tokens()} tokens; errors {dec.errors}): raise "
                               f"--gaps-decode")
    finally:
        dec.leave()
    t_first = long.first_time()
    out = {"ctx": a.gaps_ctx, "ttft_s": rnd(t_first - long.t_start),
           "prefill_tok_s": rnd(a.gaps_ctx / (t_first - long.t_start), 1),
           "alone": gap_stats(dec.times, t_alone, long.t_start),
           "during_prefill": gap_stats(dec.times, long.t_start, t_first)}
    log(f"gaps: a {a.gaps_ctx}-token prompt prefilled at {out['prefill_tok_s']} tok/s beside a "
        f"decoding stream, whose waits between tokens went from {out['alone']['median_ms']} ms "
        f"(longest {out['alone']['max_ms']}) alone to {out['during_prefill']['median_ms']} ms "
        f"(longest {out['during_prefill']['max_ms']}) during the prefill")
    evict(srv, "gaps-long")  # their KV leaves room for the parts after
    evict(srv, "gaps-dec")
    return out


HF_CHILD = r'''
import json, sys, time
out, shape, ctx, n_dec, chunk = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
res = {}
def save():
    open(out, "w").write(json.dumps(res))
try:
    import torch
except Exception as e:
    res["skipped"] = "torch not available: %r" % (e,); save(); sys.exit(0)
if not torch.cuda.is_available():
    res["skipped"] = "torch has no CUDA device"; save(); sys.exit(0)
try:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except Exception as e:
    res["skipped"] = "transformers not available: %r" % (e,); save(); sys.exit(0)
res["torch"], res["transformers"] = torch.__version__, transformers.__version__
cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["dim"],
                  intermediate_size=shape["ff"], num_hidden_layers=shape["n_layer"],
                  num_attention_heads=shape["n_head"], num_key_value_heads=shape["n_kv"],
                  head_dim=shape["head_dim"], max_position_embeddings=ctx + n_dec + 64,
                  rope_theta=shape["rope_theta"], rms_norm_eps=shape["eps"])
try:  # transformers >= 4.56; OffloadedCache before (deprecated since)
    from transformers.cache_utils import DynamicCache
    cache, res["cache"] = DynamicCache(config=cfg, offloading=True), "DynamicCache(offloading=True)"
except TypeError:
    from transformers.cache_utils import OffloadedCache
    cache, res["cache"] = OffloadedCache(), "OffloadedCache"
t = time.time()
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg)
model.eval()
torch.cuda.synchronize()
res["build_s"] = round(time.time() - t, 2); save()
ids = torch.randint(shape["vocab"] // 8, shape["vocab"] // 2, (1, ctx), device="cuda")
with torch.no_grad():
    torch.cuda.synchronize(); t = time.time()
    for s in range(0, ctx, chunk):  # chunked: a ctx x ctx mask would not fit at 128k
        h = model.model(input_ids=ids[:, s:s + chunk], past_key_values=cache,
                        use_cache=True).last_hidden_state
    tok = model.lm_head(h[:, -1:]).argmax(-1)
    torch.cuda.synchronize()
    res["prefill_s"] = round(time.time() - t, 3)
    res["prefill_tok_s"] = round(ctx / (time.time() - t), 1); save()
    times = []
    for i in range(n_dec):
        torch.cuda.synchronize(); t = time.time()
        h = model.model(input_ids=tok, past_key_values=cache, use_cache=True).last_hidden_state
        tok = model.lm_head(h[:, -1:]).argmax(-1)
        torch.cuda.synchronize(); times.append(time.time() - t)
        res["decode_steps"] = len(times)
        res["decode_tok_s"] = round((len(times) - 1) / sum(times[1:]), 3) if len(times) > 1 \
            else None
        save()
res["max_gpu_mem_bytes"] = torch.cuda.max_memory_allocated(); save()
'''


def bench_hf(a, shape):
    """transformers' offloaded KV cache on the same shape (child process, bounded)"""
    if not a.hf:
        return {"skipped": "--no-hf"}
    budget = min(a.hf_timeout, left(a) - 15)
    if budget < 30:
        return {"skipped": "out of time"}
    outp = Path(a.work) / "hf.json"
    outp.unlink(missing_ok=True)
    cmd = [a.hf_python, "-c", HF_CHILD, str(outp), json.dumps(shape), str(a.hf_ctx),
           str(a.hf_decode), str(a.hf_chunk)]
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    CHILDREN.append(p)
    try:
        txt = p.communicate(timeout=budget)[0].decode(errors="replace")
        res = {"exit": p.returncode}
    except subprocess.TimeoutExpired:
        kill_group(p, 2)
        txt = (p.communicate()[0] or b"").decode(errors="replace")
        res = {"timed_out_after_s": rnd(budget, 1)}
    res["wall_s"] = rnd(time.monotonic() - t, 1)
    try:
        res.update(json.loads(outp.read_text()))
    except (OSError, ValueError):
        res.setdefault("skipped", f"no result; output tail: {txt[-600:]}")
    if res.get("exit") and not res.get("skipped"):
        res["error_tail"] = txt[-1500:]
    res.update(ctx=a.hf_ctx, decode_tokens=a.hf_decode, chunk=a.hf_chunk)
    log(f"transformers offloaded cache: {res}")
    return res


# --- 4. budget change under load ----------------------------------------------------------------


def budget_server(a, shape, full, host):
    """bench_budget on an rkvd started with --deterministic (then stopped)"""
    bsrv = Server(a, "budget", full, host, extra=("--deterministic", "true"))
    try:
        t = time.monotonic()
        bsrv.start(min(240, left(a)))
        res = bench_budget(a, bsrv, shape, full)
        if isinstance(res, dict):
            res.update(deterministic=True, server_startup_s=rnd(time.monotonic() - t, 1))
        return res
    finally:
        if bsrv.proc:
            bsrv.stop()

NEAR_TIE = 0.02  # nats: the baseline's top two closer than this are a tie float order can flip


def divergence(base, chg):
    """where the changed run's tokens ((token, logprob, {alternative: logprob}) each) leave the
    baseline's: None when identical, else (index, margin), margin being the baseline's logprob
    of its own token minus its logprob of the changed run's token (None when that token was not
    among its alternatives: not a near tie)"""
    for i, (b, c) in enumerate(zip(base, chg)):
        if b[0] != c[0]:
            alt = (b[2] or {}).get(c[0])
            return i, (None if alt is None or b[1] is None else b[1] - alt)
    if len(base) != len(chg):
        return min(len(base), len(chg)), None
    return None


def bench_budget(a, srv, shape, after):
    """greedy streams; the KV room (target - weights - reserve), sized to 1.2 x what the streams
    hold, halved then restored mid-run; the server's target is set to after at the end"""
    n, T = a.budget_streams, a.budget_tokens
    prompts = [prompt_ids(f"budget-{i}", a.budget_ctx, shape["vocab"]) for i in range(n)]
    blocks = n * -(-(a.budget_ctx + T + 1) // srv.block_size)
    room = int(blocks * 1.2 + 1) * srv.block_bytes
    out = {"streams": n, "ctx": a.budget_ctx, "tokens": T, "room_bytes": room}
    srv.budget_set(srv.plan_overhead + room)

    def run(change):
        ss = [Stream(srv, p, T, top=2).start() for p in prompts]
        ev = {}
        if change:
            dl = min(time.monotonic() + a.io_timeout, a.deadline_at)
            # halve early (1/16 of the tokens): the re-plan, the moves and the rkvctl round
            # trips must fit in what is left of the streams on a slow, loaded machine too
            for s in ss:
                s.wait_tokens(max(1, T // 16), dl)
            half = srv.plan_overhead + room // 2
            cap = (half - srv.plan_overhead) // srv.block_bytes
            t = time.monotonic()
            ev["halve_set_s"], r = srv.budget_set(half)
            ev["halve_summary"] = r.get("summary")
            moved = not any("no session changed" in x for x in r.get("summary", []))
            # in force: every running session has the tactic the re-plan gave it (a tail on
            # host); then up to ten readings of the device KV of the running sessions against the
            # room, stopping at half the tokens so that the restore is seen in force too
            on_dev_max = samples = 0
            while samples < 10 and time.monotonic() < dl and (
                    samples == 0 or min(s.tokens() for s in ss) < T // 2):
                busy = [x for x in srv.sessions() if x["busy"]]
                if not busy:
                    break
                if "halve_in_force_s" not in ev and (not moved or all(
                        x["tail_tokens"] > 0 or x["tactic"] != "resident" for x in busy)):
                    ev["halve_in_force_s"] = rnd(time.monotonic() - t)
                    ev["tactics_halved"] = srv.ctl("tactics", "--count", "1")["gpus"][0][
                        "sessions"]
                if "halve_in_force_s" in ev:
                    samples += 1
                    on_dev_max = max(on_dev_max, sum(
                        -(-x["kv_tokens"] // srv.block_size) - x["tail_blocks"] for x in busy))
                time.sleep(0.02)
            ev["halved_room_blocks"], ev["halved_device_blocks_max"] = cap, on_dev_max
            ev["halved_readings"] = samples
            ev["tokens_at_restore"] = [s.tokens() for s in ss]
            t = time.monotonic()
            ev["restore_set_s"], r = srv.budget_set(srv.plan_overhead + room)
            ev["restore_summary"] = r.get("summary")
            while time.monotonic() - t < a.resident_timeout:
                busy = [x for x in srv.sessions() if x["busy"]]
                if not busy:
                    break  # the streams ended first: not in force while they ran
                if all(x["tactic"] == "resident" and x["tail_tokens"] == 0 for x in busy):
                    ev["restore_in_force_s"] = rnd(time.monotonic() - t)
                    break
                time.sleep(0.02)
        for s in ss:
            s.join(a)
        ev["errors"] = [e for s in ss for e in s.errors]
        ev["texts"] = [s.texts[0] if s.texts else None for s in ss]
        ev["toks"] = [s.toks[0] if s.toks else None for s in ss]
        ev["rate"] = rnd(steady_rate(ss)[0], 2) if all(s.times for s in ss) else None
        return ev

    try:
        # every run takes the same path for the prompts: found in the prefix cache, the last
        # prompt token computed by the decode step (the first run would otherwise prefill them)
        warm = [Stream(srv, p, 1, top=2).start() for p in prompts]
        for w in warm:
            w.join(a)
        base = run(False)
        ctrl = run(False)  # a second run without the change: what differs without it
        chg = run(True)
    finally:
        srv.budget_set(after)
    if chg.get("restore_in_force_s") is None:
        note("budget change: the streams ended before the restored plan was seen in force; "
             "raise --budget-tokens")
    same = sum(1 for x, y in zip(base["texts"], chg["texts"]) if x is not None and x == y)
    # streams whose two runs without the change agree: there a difference is the change's
    stable = [i for i, (x, y) in enumerate(zip(base["texts"], ctrl["texts"]))
              if x is not None and x == y]
    same_stable = sum(1 for i in stable if chg["texts"][i] == base["texts"][i])
    out["control_same_text"] = f"{len(stable)}/{n}"
    out["same_text_where_control_agrees"] = f"{same_stable}/{len(stable)}"
    # where each changed stream's text leaves the baseline's (None: identical)
    out["diverged_at_char"] = [None if x == y else next(
        (i for i, (p, q) in enumerate(zip(x or "", y or "")) if p != q), min(len(x or ""),
                                                                             len(y or "")))
        for x, y in zip(base["texts"], chg["texts"])]
    # a stream that diverges where the baseline's top two tokens were within NEAR_TIE nats
    # took the other side of a tie: the device and host parts of attention are summed in
    # another order once the KV moves, and random weights make such ties common
    div = [divergence(x, y) if x is not None and y is not None else (0, None)
           for x, y in zip(base["toks"], chg["toks"])]
    ties = sum(1 for d in div if d is not None and d[1] is not None and d[1] <= NEAR_TIE)
    out["divergences"] = [None if d is None else {"token": d[0], "margin": rnd(d[1], 5)}
                          for d in div]
    out["diverged_at_near_ties"] = f"{ties}/{n - same}"
    if same < n:
        Path(a.out, "budget_texts.json").write_text(json.dumps(
            {"baseline": base["texts"], "changed": chg["texts"]}))
    out.update(baseline_errors=base["errors"], errors=chg["errors"], same_text=f"{same}/{n}",
               baseline_tok_s=base["rate"], changed_tok_s=chg["rate"],
               **{k: v for k, v in chg.items() if k not in ("texts", "toks", "errors", "rate")})
    log(f"budget change: {out}")
    target("budget change: no failed request", 1.0 if not (chg["errors"] or base["errors"])
           else 0.0, 1.0, f"{len(chg['errors']) + len(base['errors'])} failed")
    target("budget change: outputs identical to the run without it", same / n, 1.0,
           f"{same}/{n} streams")
    target("budget change: outputs identical where two runs without it agree",
           ratio(same_stable, len(stable)), 1.0,
           f"{same_stable}/{len(stable)} streams ({len(stable)}/{n} agree between two runs "
           "without the change)", none_means="no stream agreed between two runs without it")
    target(f"budget change: every stream identical or leaving the baseline at a near tie "
           f"(top two within {NEAR_TIE} nats)", (same + ties) / n, 1.0,
           f"{same} identical, {ties} at near ties, {n - same - ties} otherwise")
    target("budget change: halved plan in force while the streams ran",
           1.0 if chg.get("halve_in_force_s") is not None else 0.0, 1.0,
           f"{chg.get('halve_in_force_s')} s after rkvctl budget set began")
    target("budget change: halved room honoured (room / most device KV of the running "
           "sessions, within 1%)", ratio(chg.get("halved_room_blocks"),
                                         chg.get("halved_device_blocks_max")), 0.99,
           f"{chg.get('halved_device_blocks_max')} blocks on device, room "
           f"{chg.get('halved_room_blocks')}", none_means="the halved plan was never in force")
    target("budget change: restored plan in force (every running session RESIDENT)",
           1.0 if chg.get("restore_in_force_s") is not None else 0.0, 1.0,
           f"{chg.get('restore_in_force_s')} s after rkvctl budget set began")
    return out


# --- targets, plots ----------------------------------------------------------------------------


def target(name, value, need, detail="", none_means="no reference", at_most=False):
    """one of the issue's targets: value >= need (at_most: value <= need); None is a SKIP"""
    ok = value is not None and (value <= need if at_most else value >= need)
    st = "SKIP" if value is None else ("PASS" if ok else "FAIL")
    RES["targets"].append({"target": name, "status": st, "value": rnd(value),
                           "need": ("<= " if at_most else ">= ") + str(need),
                           "detail": detail if value is not None else none_means})
    log(f"{st}  {name}: {none_means if value is None else '%.3f' % value} {detail}")


def plots(a):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        note(f"no plots: matplotlib does not import here ({e.__class__.__name__}); the JSON "
             "holds every figure")
        return
    rp = ((RES.get("ramp") or {}).get("phases") or [])
    if rp:
        fig, ax = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
        x = range(len(rp))
        rot = "rotation " + RES["ramp"].get("rotation", "on")
        ax[0].plot(x, [p["agg_tok_s"] for p in rp], "o-", label=f"aggregate tok/s ({rot})")
        ax[0].plot(x, [p["bound_tok_s"] or float("nan") for p in rp], "k--", label="bound")
        ref = {p["n"]: p["agg_tok_s"] for p in RES["ramp"].get("resident", [])}
        ax[0].plot(x, [ref.get(p["n"], float("nan")) for p in rp], "gs", label="all-resident")
        full = ref.get(RES["ramp"].get("fit_sessions"))
        if full:
            ax[0].axhline(full, color="g", lw=0.8, ls=":", label="all-resident, device full")
        ax[0].set_ylabel("decode tok/s")
        ax[0].legend()
        # per session: the mean and the slowest, against the fair share of the aggregate
        ax[1].plot(x, [p["per_session_tok_s"]["mean"] for p in rp], "o-", label="mean session")
        ax[1].plot(x, [p["per_session_tok_s"]["min"] for p in rp], "v-", label="slowest session")
        ax[1].plot(x, [0.8 * p["agg_tok_s"] / p["n"] for p in rp], "k:",
                   label="0.8 x aggregate / sessions")
        ax[1].set_ylabel("tok/s per session")
        ax[1].legend()
        bottom = [0] * len(rp)
        for tac in ("resident", "window", "cpu_tail", "rotated", "parked"):
            v = [p["tactics"].get(tac, 0) for p in rp]
            ax[2].bar(x, v, bottom=bottom, label=tac)
            bottom = [b + y for b, y in zip(bottom, v)]
        ax[2].set_xticks(list(x))
        ax[2].set_xticklabels([p["label"].split(" ", 1)[1] for p in rp], rotation=60)
        ax[2].set_ylabel("running sessions")
        ax[2].legend()
        fig.tight_layout()
        fig.savefig(Path(a.out) / "ramp.png", dpi=110)
    pts = [p for p in ((RES.get("spill") or {}).get("points") or []) if p.get("decode_tok_s")]
    if pts:
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        hx = [100 * (p["host_frac"] or 0) for p in pts]
        ax[0].plot(hx, [p["decode_tok_s"] for p in pts], "o-", label="rkv decode")
        ax[0].plot(hx, [p["decode_bound_tok_s"] or float("nan") for p in pts], "k--",
                   label="bound")
        hf = RES.get("hf_offloaded", {})
        if hf.get("decode_tok_s"):
            ax[0].plot([100], [hf["decode_tok_s"]], "r^", label="transformers offloaded")
        ax[1].plot(hx, [p["prefill_tok_s"] for p in pts], "o-", label="rkv prefill")
        ax[1].plot(hx, [p.get("prefill_bound_tok_s") or float("nan") for p in pts], "k--",
                   label="bound")
        for i, what in enumerate(("decode", "prefill")):
            ax[i].set_xlabel("host tail, % of the KV")
            ax[i].set_ylabel(f"{what} tok/s")
            ax[i].legend()
        fig.tight_layout()
        fig.savefig(Path(a.out) / "spill.png", dpi=110)
    runs = [r for r in ((RES.get("http") or {}).get("runs") or []) if r.get("http_tok_s")]
    if runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(runs))
        ax.bar([i - 0.2 for i in xs], [r["http_tok_s"] for r in runs], 0.4, label="HTTP + IPC")
        ax.bar([i + 0.2 for i in xs], [r.get("engine_tok_s") or 0 for r in runs], 0.4,
               label="engine")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"batch {r['batch']}" for r in runs])
        ax.set_ylabel("decode tok/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(Path(a.out) / "http.png", dpi=110)
    log(f"plots in {a.out}")


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="rkvd, rkv-kvmgr, rkv-worker, rkvctl, ...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/rkv-bench-system", help="models, state, sockets")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="small sizes (the cpu smoke test)")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a FAILed target too")
    ap.add_argument("--deadline", type=float, help="seconds for everything (480; quick 55)")
    ap.add_argument("--parts", default="http,structured,ramp,spill,gaps,ttft,budget,hf")
    ap.add_argument("--preset", help="rkv-mkmodel preset (llama3-8b; quick: tiny)")
    ap.add_argument("--dtype", help="weights (bf16; quick: f32)")
    ap.add_argument("--model", help="a GGUF to use instead of making one")
    ap.add_argument("--keep-model", action="store_true", help="keep the generated model in "
                    "--work for the next run (else it is deleted at the end)")
    ap.add_argument("--kv-dtype", default="f16", choices=("f16", "f32", "q8", "fp8"))
    ap.add_argument("--block-size", type=int, help="positions per block (256; quick 32)")
    ap.add_argument("--threads", type=int, help="cpu worker threads (cpu backend)")
    ap.add_argument("--max-batch-tokens", type=int, help="rkvd's step size (0, rkvd's default: "
                    "2048 on a GPU, 512 on the CPU)")
    ap.add_argument("--prefill-chunk", type=int, help="(0, rkvd's default: the step size on a "
                    "GPU, 256 on the CPU)")
    ap.add_argument("--prefill-beside-decode", type=int, help="prompt tokens of a step that "
                    "also decodes (0, rkvd's default: 512 on a GPU, the chunk on the CPU)")
    ap.add_argument("--rkvd-args", help="more rkvd flags for every server, one string (e.g. "
                    "\"--prep-ahead false\" for an A/B)")
    ap.add_argument("--no-rotation", action="store_true", help="pass --no-rotation to rkvd: "
                    "sessions past the device spill (WINDOW / CPU_TAIL) instead of taking turns "
                    "(the ramp's A/B against rotation)")
    ap.add_argument("--max-stall-ms", type=float, default=1000, help="rkvd's max_stall_ms, "
                    "which the ramp's longest gap between two tokens of a stream is judged "
                    "against (pass the flag to rkvd with --rkvd-args when it is not 1000)")
    ap.add_argument("--reserve", default=0, type=int,
                    help="compute reserve, bytes (0: the one the worker measures)")
    ap.add_argument("--ctx", type=int, help="prompt of each ramp / http / budget session "
                    "(4096; quick 256)")
    ap.add_argument("--turn-tokens", type=int, help="tokens per ramp turn; a session's next "
                    "turn reuses its prompt's KV (ctx/4)")
    ap.add_argument("--fit-sessions", type=int, help="sessions the ramp's target holds (16; "
                    "quick 2)")
    ap.add_argument("--sessions-max", type=int, help="ramp peak (64; quick 6)")
    ap.add_argument("--up", help="counts measured on the way up (default: a spread)")
    ap.add_argument("--down", help="counts measured on the way down")
    ap.add_argument("--window", type=float, help="seconds per measurement window (3; quick 0.4)")
    ap.add_argument("--peak-window", type=float, help="seconds of the ramp's peak window, over "
                    "which each stream's share is judged (max(window, 10 x max_stall_ms))")
    ap.add_argument("--resident-timeout", type=float, default=10)
    ap.add_argument("--spill-ctx", type=int, help="the spill session's context (32768; quick "
                    "2048): 131072 is the issue's figure but its prefill alone takes minutes")
    ap.add_argument("--gaps-ctx", type=int, help="the gaps part's long prompt, prefilled beside "
                    "a decoding stream (32768; quick 1024)")
    ap.add_argument("--ttft-ctx", type=int, help="the ttft part's prompt (32768; quick 1024)")
    ap.add_argument("--gaps-decode", type=int, help="tokens the gaps part's decoding stream asks "
                    "for, enough to outlast the window and the prefill (4096; quick 16384: the "
                    "tiny model decodes ~10k tok/s)")
    ap.add_argument("--spill-fracs", help="host fractions (0,0.25,0.5,0.75,0.9,1; quick 0,0.5,1)")
    ap.add_argument("--spill-prefill", type=int, help="new tokens per point (512; quick 64)")
    ap.add_argument("--spill-decode", type=int, help="decoded tokens per point (32; quick 1500)")
    ap.add_argument("--http-batches", help="1,64 (quick 1,4)")
    ap.add_argument("--http-tokens", type=int, help="decoded tokens per stream (256; quick 200): at batch 64 fewer leave the streams too little time together")
    ap.add_argument("--budget-streams", type=int, help="(12; quick 2)")
    ap.add_argument("--budget-tokens", type=int, help="(192; quick 2000)")
    ap.add_argument("--budget-ctx", type=int, help="prompt of each stream (--ctx; quick 4096): "
                    "the prompt's KV must outweigh the decoded tokens' for halving to bite")
    ap.add_argument("--budget-nondeterministic", dest="budget_deterministic",
                    action="store_false", help="run the budget part on the main server (default: "
                    "one of its own started with --deterministic true)")
    ap.add_argument("--gpu-bench", help="gpu_bench binary (default BIN/gpu_bench)")
    ap.add_argument("--gpu-bench-timeout", type=float, default=90)
    ap.add_argument("--no-hf", dest="hf", action="store_false")
    ap.add_argument("--hf-python", default="python3", help="the python that has torch")
    ap.add_argument("--hf-ctx", type=int, help="(the spill ctx)")
    ap.add_argument("--hf-decode", type=int, default=16)
    ap.add_argument("--hf-chunk", type=int, default=4096)
    ap.add_argument("--hf-timeout", type=float, default=120, help="seconds for the "
                    "transformers run, building the model included")
    ap.add_argument("--io-timeout", type=float, help="seconds one request may stall (120)")
    a = ap.parse_args(argv)
    try:
        shlex.split(a.rkvd_args or "")
    except ValueError as e:
        ap.error(f"--rkvd-args {a.rkvd_args!r}: {e} (quote it as one shell word)")
    q = a.quick
    dflt = {"deadline": (55, 480), "preset": ("tiny", "llama3-8b"), "dtype": ("f32", "bf16"),
            "block_size": (32, 256), "ctx": (256, 4096), "fit_sessions": (2, 16),
            "sessions_max": (6, 64), "window": (0.4, 3.0), "spill_ctx": (2048, 32768),
            "gaps_ctx": (1024, 32768), "gaps_decode": (16384, 4096), "ttft_ctx": (1024, 32768),
            "spill_prefill": (64, 512), "spill_decode": (1500, 32), "http_batches": ("1,4", "1,64"),
            "http_tokens": (200, 256), "budget_streams": (2, 12), "budget_tokens": (2000, 192),
            "budget_ctx": (4096, 0), "io_timeout": (30, 120), "max_batch_tokens": (0, 0),
            "prefill_chunk": (0, 0), "prefill_beside_decode": (0, 0), "spill_fracs": ("0,0.5,1", "0,0.25,0.5,0.75,0.9,1")}
    for k, (quick, full) in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    if a.ttft_ctx < 1:
        ap.error(f"--ttft-ctx {a.ttft_ctx}: a prompt needs a token at least (default 32768)")
    if a.gaps_ctx < 1 or a.gaps_decode < 8:
        ap.error(f"--gaps-ctx {a.gaps_ctx} / --gaps-decode {a.gaps_decode}: the long prompt needs "
                 "a token at least and the decoding stream 8 (defaults 32768 and 4096)")
    a.turn_tokens = a.turn_tokens or (a.ctx if q else max(8, a.ctx // 4))
    if a.peak_window is None:
        a.peak_window = a.window if q else max(a.window, 10 * a.max_stall_ms / 1000)
    if not a.peak_window > 0:
        ap.error(f"--peak-window {a.peak_window}: seconds above 0")
    a.hf_ctx = a.hf_ctx or a.spill_ctx
    a.budget_ctx = a.budget_ctx or a.ctx
    a.http_batches = [int(x) for x in str(a.http_batches).split(",")]
    a.spill_fracs = [float(x) for x in a.spill_fracs.split(",")]
    a.parts = set(a.parts.split(","))
    n, f = a.sessions_max, a.fit_sessions
    if a.up is None:
        up = {1, 2, f // 2, f, f + max(1, f // 4), (f + n) // 2, n}
        up |= set(range(f, n + 1, max(1, (n - f) // 4))) if n > f else set()
        a.up = sorted(x for x in up if 1 <= x <= n)
    else:
        a.up = [int(x) for x in a.up.split(",")]
    if a.down is None:
        a.down = sorted({(f + n) // 2, f, f // 2, 1} - {n}, reverse=True)
    else:
        a.down = [int(x) for x in a.down.split(",")]
    a.reserve_s = 8 if q else 45  # time kept for what follows a part
    a.after_ramp_s = 10 if q else 75  # the spill curve and the budget change
    if a.backend == "cpu":
        a.reserve = 0
    return a


def make_model(a):
    if a.model:
        a.model = Path(a.model)
        return
    a.model = Path(a.work) / f"{a.preset}-{a.dtype}.gguf"
    if a.model.exists():
        return
    t = time.monotonic()
    r = subprocess.run([str(Path(a.bin) / "rkv-mkmodel"), "--preset", a.preset, "--dtype",
                        a.dtype, "--seed", "1", "--out", str(a.model)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"rkv-mkmodel: {r.stderr[-500:]}")
    RES["mkmodel_s"] = rnd(time.monotonic() - t, 1)


def guard(name, fn, *args):
    """one part: its failure is recorded and the next part still runs"""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the JSON says what broke
        RES["errors"].append(f"{name}: {e!r}"[:2000])
        log(f"error in {name}: {e!r}")
        return None


def run_all(a):
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    RES["config"] = {k: (str(v) if isinstance(v, (Path, set)) else v) for k, v in vars(a).items()}
    make_model(a)
    shape = model_shape(a.model, a.kv_dtype)
    a.weight_bytes = a.model.stat().st_size
    RES["model"] = {"path": str(a.model), "bytes": a.weight_bytes, **shape}
    bpt = shape["kv_bytes_per_token"]
    log(f"model {a.model.name}: {shape['n_layer']} layers, kv {bpt} bytes/token ({a.kv_dtype})")
    a.ceil = gpu_bench(a) if {"ramp", "spill", "http"} & a.parts else {}
    RES["ceilings"] = {k: v for k, v in a.ceil.items() if k != "records"}
    if a.ceil.get("skipped"):
        note(a.ceil["skipped"])
    # one server for every part: its pool holds the http run's streams, the resident ramp,
    # the spill session and the budget streams; the ramp and the spill curve lower the target
    # live (kvmgr plans a live target with what the gpu held at the first hello and the reserve)
    per_ramp = a.ctx + a.turn_tokens + 2 * a.block_size
    spill_tok = a.spill_ctx + a.spill_prefill * (len(a.spill_fracs) + 1) + a.spill_decode
    budget_tok = a.budget_streams * (a.budget_ctx + a.budget_tokens + a.block_size)
    # the gaps part: its long prompt and the decoding stream (a short prompt and gaps_decode
    # tokens)
    gaps_tok = a.gaps_ctx + a.gaps_decode + 6 * a.block_size if "gaps" in a.parts else 0
    ttft_tok = a.ttft_ctx + 4 * a.block_size if "ttft" in a.parts else 0
    room = max(max(a.http_batches) * (a.ctx + a.http_tokens + 2 * a.block_size),
               a.fit_sessions * per_ramp, spill_tok + 4 * a.block_size, int(1.25 * budget_tok),
               gaps_tok, ttft_tok)
    room = int(room * bpt * 1.15) + 8 * a.block_size * bpt
    est_used = (a.weight_bytes + 3 * GIB // 2) if a.backend == "cuda" else 0
    # the worker measures the reserve at start (1.2 GiB on llama3-8b in steps of 512 tokens:
    # activations and the copy path's staging buffers; a gpu worker's default steps of 2048
    # take more activations: 2 GiB here, the server's log says what it measured)
    full = est_used + (a.reserve or (2 * GIB if a.backend == "cuda" else 5 * GIB // 4)) + room
    # host: the ramp's overflow (every session but the fitting ones, a margin for write-through
    # copies), the spill session, the budget streams' halved share
    host = int(max(0.9 * a.sessions_max * per_ramp, 1.3 * spill_tok, 1.3 * budget_tok) *
               bpt) + GIB // 4
    try:  # the host pool is shared memory: what /dev/shm can hold
        st = os.statvfs("/dev/shm")
        shm_free = st.f_bavail * st.f_frsize
    except OSError:
        shm_free = 0
    if shm_free and host > 0.9 * shm_free:
        note(f"host budget {host / GIB:.1f} GiB lowered to {0.9 * shm_free / GIB:.1f} GiB, what "
             "/dev/shm has free (mount -o remount,size=... /dev/shm for more): sessions the "
             "host pool cannot take wait for room")
        host = int(0.9 * shm_free)
    a.ctx_size = max(a.ctx + a.turn_tokens, a.ctx + a.http_tokens,
                     a.budget_ctx + a.budget_tokens, spill_tok, a.gaps_ctx + 2, a.ttft_ctx + 2,
                     a.block_size + a.gaps_decode) + 2 * a.block_size
    # the ramp's KV room holds fit_sessions sessions of ctx + a turn
    room_ramp = a.fit_sessions * -(-(a.ctx + a.turn_tokens) // a.block_size) * a.block_size * bpt
    on_main = {"http", "ramp", "spill", "gaps", "ttft"} | (set() if a.budget_deterministic else
                                                    {"budget"})
    if not on_main & a.parts:
        a.parts.add("none")  # no part runs on the main server
    srv = Server(a, "server", full, host)
    ref = []
    try:
        if "none" not in a.parts:
            t = time.monotonic()
            srv.start(min(240, left(a)))
            RES["server"] = {"startup_s": rnd(time.monotonic() - t, 1), **srv.info(),
                             "vram_target": full, "host_budget": host}
            if srv.bpt != bpt:
                note(f"kv bytes/token: the pool says {srv.bpt}, the gguf header {bpt}; the "
                     "pool's is used")
                bpt = srv.bpt
            if srv.dev_blocks * srv.block_bytes < room * 0.9:
                note(f"the server got {srv.dev_blocks} device blocks, less than the "
                     f"{room // srv.block_bytes} wanted (the gpu holds more than estimated)")
            log(f"server: {srv.dev_blocks} device blocks, {srv.host_blocks} host blocks of "
                f"{srv.block_bytes} bytes; weights {srv.weights >> 20} MiB")
            if "http" in a.parts:
                RES["http"] = guard("http", bench_http, a, srv, shape)
            if "structured" in a.parts and left(a) > a.reserve_s:
                RES["structured"] = guard("structured", bench_structured, a, srv, shape)
            if "ramp" in a.parts and left(a) > a.reserve_s * 2:
                # the all-resident run: the same sessions up to the fitting count, full target
                a.ramp_floor = a.reserve_s
                ref = guard("resident ramp", ramp, a, srv, shape, a.fit_sessions,
                            [x for x in a.up if x <= a.fit_sessions], [], "resident") or []
                # the ramp stops early enough for the parts that follow it
                a.ramp_floor = a.reserve_s + (a.after_ramp_s if {"spill", "budget"} & a.parts
                                              else 0) + (min(a.hf_timeout, 90) if "hf" in
                                                         a.parts and a.backend == "cuda" else 0)
                tgt = srv.plan_overhead + room_ramp
                RES["ramp"] = {"resident": ref, "ctx": a.ctx, "turn_tokens": a.turn_tokens,
                               "rotation": "off" if a.no_rotation else "on",
                               "fit_sessions": a.fit_sessions, "sessions_max": a.sessions_max,
                               "vram_target": tgt, "kv_room_bytes": room_ramp}
                log(f"ramp: vram target {tgt / GIB:.2f} GiB (KV room {room_ramp / GIB:.2f} GiB: "
                    f"{a.fit_sessions} sessions of {a.ctx} + {a.turn_tokens})")
                if guard("ramp budget", srv.budget_set, tgt):
                    RES["ramp"]["phases"] = guard("ramp", ramp, a, srv, shape, a.sessions_max,
                                                  a.up, a.down, "ramp")
                guard("ramp budget", srv.budget_set, full)
            elif "ramp" in a.parts:
                note(f"ramp: skipped, {left(a):.0f} s left of the deadline and it wants more "
                     f"than {2 * a.reserve_s:.0f} (raise --deadline / DEADLINE)")
            for part, fn in (("spill", bench_spill), ("gaps", bench_gaps), ("ttft", bench_ttft),
                             ("budget", bench_budget)):
                if part not in a.parts or (part == "budget" and a.budget_deterministic):
                    continue
                if left(a) > a.reserve_s * 2:
                    RES[part] = guard(part, fn, a, srv, shape, full)
                else:
                    note(f"{part}: skipped, {left(a):.0f} s left of the deadline and it wants "
                         f"more than {2 * a.reserve_s:.0f} (raise --deadline / DEADLINE)")
    except Exception as e:  # noqa: BLE001 - the server did not start
        RES["errors"].append(f"server: {e!r}"[:2000])
        log(f"error: {e!r}")
    finally:
        if srv.proc:
            RES.setdefault("server", {})["exit"] = srv.stop()
    if "budget" in a.parts and a.budget_deterministic:
        # a server of its own with batch-invariant kernels: what a stream computes must not
        # depend on the other streams of its steps (which the budget change reshuffles)
        if left(a) > a.reserve_s * 2:
            RES["budget"] = guard("budget", budget_server, a, shape, full, host)
        else:
            note(f"budget: skipped, {left(a):.0f} s left of the deadline and it wants more than "
                 f"{2 * a.reserve_s:.0f} (raise --deadline / DEADLINE)")
    if RES.get("http"):
        guard("http engine", http_engine_refs, a, shape, RES["http"])
    if RES.get("ttft") and left(a) > 5:
        guard("ttft engine", ttft_engine_ref, a, shape, RES["ttft"])
    if (RES.get("ramp") or {}).get("phases"):
        guard("ramp targets", judge_ramp, a, RES["ramp"]["phases"], ref, RES.get("spill") or {})
    if "hf" in a.parts:
        if a.backend != "cuda":
            RES["hf_offloaded"] = {"skipped": "cpu backend: transformers' offloaded cache needs "
                                   "a CUDA device"}
            note(RES["hf_offloaded"]["skipped"])
        else:
            RES["hf_offloaded"] = guard("hf", bench_hf, a, shape) or {"skipped": "error"}
        spill_all = [p for p in (RES.get("spill") or {}).get("points", [])
                     if p.get("host_frac_wanted") == 1 and p.get("decode_tok_s")]
        hf = RES["hf_offloaded"]
        if spill_all and hf.get("decode_tok_s") and a.hf_ctx == a.spill_ctx:
            hf["rkv_all_host_decode_tok_s"] = spill_all[0]["decode_tok_s"]
            hf["rkv_over_hf_decode"] = rnd(spill_all[0]["decode_tok_s"] / hf["decode_tok_s"], 2)


def summary():
    log("summary (ratio to bound/reference; targets from issue 8):")
    for r in ((RES.get("http") or {}).get("runs") or []):
        if r.get("http_tok_s"):
            log(f"  http b={r['batch']}: {r['http_tok_s']} tok/s vs engine "
                f"{r.get('engine_tok_s')} -> {r.get('ratio')}")
    for p in ((RES.get("ramp") or {}).get("phases") or []):
        log(f"  {p['label']:>16}: {p['agg_tok_s']:>9} tok/s  bound {p['bound_tok_s']} -> "
            f"{p['ratio_to_bound']}  resident-ratio {p.get('ratio_to_resident')}  "
            f"{p['tactics']}  pcie {p['pcie_Bps'] / 1e9:.2f} GB/s"
            + (f"  to-resident {p['to_resident_s']} s" if "to_resident_s" in p else ""))
    g = RES.get("gaps") or {}
    if g.get("during_prefill"):
        log(f"  gaps: {g['ctx']}-token prefill {g['prefill_tok_s']} tok/s; a decoding stream's "
            f"longest wait {g['alone']['max_ms']} ms alone, {g['during_prefill']['max_ms']} ms "
            f"during it")
    for p in ((RES.get("spill") or {}).get("points") or []):
        if p.get("decode_tok_s"):
            log(f"  spill host {p['host_frac']}: decode {p['decode_tok_s']} -> "
                f"{p['decode_ratio']}, prefill {p['prefill_tok_s']} -> {p.get('prefill_ratio')}")
    t = RES.get("ttft") or {}
    if t.get("ttft_s"):
        log(f"  ttft: {t['ctx']} tokens in {t['ttft_s']} s through HTTP, the engine "
            f"{t.get('engine_prefill_s')} s -> {t.get('ratio')}")
    hf = RES.get("hf_offloaded")
    if hf:
        log(f"  transformers offloaded: {hf.get('skipped') or hf}")
    for t in RES["targets"]:
        log(f"  {t['status']:4}  {t['target']}: {t['value']} (need {t['need']}) {t['detail']}")


def main(argv=None):
    a = parse_args(argv)
    a.deadline_at = T0 + a.deadline
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rc = 0
    try:
        run_all(a)
    except BaseException as e:  # noqa: BLE001 - the JSON says what broke; children die below
        RES["errors"].append(repr(e)[:2000])
        log(f"error: {e!r}")
        rc = 1
    finally:
        cleanup()
        made = Path(a.work) / f"{a.preset}-{a.dtype}.gguf"
        if not a.keep_model and str(a.model) == str(made):
            made.unlink(missing_ok=True)
        try:
            plots(a)
        except Exception as e:  # noqa: BLE001
            note(f"plots failed: {e!r}")
        RES["wall_s"] = rnd(time.monotonic() - T0, 1)
        summary()
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "bench_system.json").write_text(json.dumps(RES, indent=1))
        log(f"results in {Path(a.out) / 'bench_system.json'} ({RES['wall_s']} s)")
    if RES["errors"]:
        rc = 1
    if a.strict and any(t["status"] == "FAIL" for t in RES["targets"]):
        rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
