"""gpu_demo.py - the whole system on a gpu: rkvd --backend cuda (kvmgr's VRAM slab opened by the
worker through CUDA IPC, pinned shared-memory host pool) serving HTTP; greedy streams, the VRAM
budget read with nvidia-smi, seeded sampled completions picked on the gpu that must match a
host-sampling server's, a worker SIGKILLed mid-stream whose streams must finish with the same
text and no prompt recomputed. Standard library only (the gpu machine has no venv).

  python3 tests/gpu/gpu_demo.py --bin DIR --out DIR [--presets small,llama3-8b] [--deadline S]
writes OUT/gpu_demo.json (every figure) and OUT/rkvd-<preset>.log."""
import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

T0 = time.monotonic()
RESULTS = {"phases": []}


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def size_bytes(s):
    m = re.fullmatch(r"(\d+)(GiB|MiB)", s)
    return int(m.group(1)) << (30 if m.group(2) == "GiB" else 20)


def sse_choices(resp):
    """the first choice of each server-sent event of a streamed completion; an error event
    raises"""
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        ev = json.loads(line[5:])
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev['error']}")
        yield ev["choices"][0]


def nvidia_smi():
    """(used MiB on gpu 0, {pid: used MiB})"""
    try:
        used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=20).stdout.split("\n")[0].split(",")
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=20).stdout
        per = {}
        for line in apps.strip().splitlines():
            pid, mib = [x.strip() for x in line.split(",")]
            per[int(pid)] = int(mib)
        return int(used[0]), int(used[1]), per
    except Exception as e:  # noqa: BLE001 - a reading, not a requirement
        log(f"nvidia-smi: {e}")
        return -1, -1, {}


def comm_of(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def prompt_ids(key, n, vocab):
    """n token ids seeded by key, away from both ends of the vocabulary (special tokens); two
    keys share no block, so prefix sharing does not join their sessions"""
    r = random.Random(key)
    lo, hi = max(3, vocab // 8), max(4, vocab // 2)
    return [r.randrange(lo, hi) for _ in range(n)]


class Rkvd:
    def __init__(self, bindir, model, root, extra, backend, env=None):
        self.env = {**os.environ, "RKV_STEP_REPORT_MS": "100", **(env or {})}
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / "rkvd.log"
        self.args = [str(Path(bindir) / "rkvd"), "--model", str(model), "--listen",
                     "127.0.0.1:0", "--backend", backend, "--state-dir", str(self.root / "state"),
                     "--runtime-dir", str(self.root / "run"), *extra]
        self.port = None

    def start(self, timeout):
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            # a pool the worker cannot map will not come right by waiting
            if re.search(r"cannot map kvmgr's|kvmgr cannot create|cudaIpcOpenMemHandle", self.log()):
                time.sleep(1)
                return False
            if self.port is None:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log())
                self.port = int(m.group(1)) if m else None
            elif self.get("/health")[0] == 200:
                self.model_id = json.loads(self.get("/v1/models")[1])["data"][0]["id"]
                return True
            time.sleep(0.1)
        return False

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def get(self, path, timeout=5):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        except OSError:
            return 0, b""

    def metric(self, name):
        st, body = self.get("/metrics")
        total = 0.0
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def ctl(self, *args, check=True):
        """`rkvctl --json ARGS` over this server's admin socket, parsed; a failure raises, or
        with check=False answers None"""
        r = subprocess.run([str(Path(self.args[0]).parent / "rkvctl"), "--socket",
                            str(self.root / "run" / "admin.sock"), "--json", "--timeout", "20",
                            *args], capture_output=True, text=True, timeout=40)
        if r.returncode:
            if check:
                raise RuntimeError(f"rkvctl {' '.join(args)}: exit {r.returncode}: "
                                   f"{r.stderr.strip()[-500:]}")
            return None
        return json.loads(r.stdout)

    def child(self, comm):
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                s = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            rest = s[s.rindex(")") + 2:].split()
            if name == comm and int(rest[1]) == self.proc.pid and rest[0] != "Z":
                return int(p)
        return None


def sampled(srv, prompt, n_tok, seed):
    """one seeded completion at temperature 0.8, top_p 0.95: its text"""
    body = json.dumps({"model": srv.model_id, "prompt": prompt, "max_tokens": n_tok,
                       "temperature": 0.8, "top_p": 0.95, "seed": seed, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)["choices"][0]["text"]


def dev_sampled_rows(srv):
    """the cuda backend's count of rows sampled on the device, from the worker's last step
    report (None: no report yet)"""
    m = re.findall(r"rows sampled on the device: (\d+)", srv.log())
    return int(m[-1]) if m else None


def sampled_device(srv, prompt, n_tok):
    """sampled rows go to the gpu's sampler by default: the same seed twice must give the same
    text, and another seed another text"""
    texts = [sampled(srv, prompt, n_tok, 7) for _ in range(2)]
    other = sampled(srv, prompt, n_tok, 8)
    time.sleep(0.2)
    return {"text": texts[0], "device_rows": dev_sampled_rows(srv),
            "same_seed_same_text": texts[0] == texts[1], "other_seed_differs": other != texts[0]}


def sampled_host(a, model, root, extra, prompt, n_tok, out, deadline, log_to):
    """the same seeded completion from a server sampling the same logits on the host
    (RKV_CUDA_DEV_SAMPLE=0; started after the first one stopped, so both see the same free
    gpu) must read the same (the two samplers pick bit for bit alike)"""
    host = Rkvd(a.bin, model, root / "srv-host-sample", extra, a.backend,
                {"RKV_CUDA_DEV_SAMPLE": "0"})
    try:
        if not host.start(timeout=min(150, deadline - time.monotonic())):
            out["error"] = "the host-sampling rkvd did not become healthy"
            return out
        text = sampled(host, prompt, n_tok, 7)
        time.sleep(0.2)
        out["host_rows_on_device"] = dev_sampled_rows(host)
        out["host_sampler_same_text"] = text == out["text"]
        if text != out["text"]:
            out["texts"] = {"device": out["text"][:400], "host": text[:400]}
    except Exception as e:  # noqa: BLE001 - judged below
        out["error"] = repr(e)
    finally:
        host.stop()
        Path(log_to).write_text(host.log()[-200000:])
    out["ok"] = (out["same_seed_same_text"] and out.get("host_sampler_same_text", False)
                 and (out["device_rows"] or 0) > 0 and out.get("host_rows_on_device") in (0, None))
    out.pop("text")
    return out


class Streams:
    """n greedy streaming completions on threads: text, chunk count, finish reason, error,
    time of the first and last chunk"""

    def __init__(self, srv, prompts, max_tokens):
        self.srv, self.prompts, self.max_tokens = srv, prompts, max_tokens
        n = len(prompts)
        self.text, self.chunks = [""] * n, [0] * n
        self.finish, self.error = [None] * n, [None] * n
        self.t_first, self.t_last = [None] * n, [None] * n
        self.cv = threading.Condition()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(n)]

    def _run(self, i):
        body = json.dumps({"model": self.srv.model_id, "prompt": self.prompts[i], "max_tokens": self.max_tokens,
                           "temperature": 0, "stream": True, "ignore_eos": True})
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=120)
            c.request("POST", "/v1/completions", body=body,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
            for ch in sse_choices(r):
                now = time.monotonic()
                with self.cv:
                    self.text[i] += ch.get("text", "")
                    self.chunks[i] += 1
                    self.finish[i] = ch.get("finish_reason") or self.finish[i]
                    self.t_first[i] = self.t_first[i] or now
                    self.t_last[i] = now
                    self.cv.notify_all()
        except Exception as e:  # noqa: BLE001 - recorded and judged by the caller
            self.error[i] = repr(e)
        with self.cv:
            self.cv.notify_all()

    def start(self):
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def wait_chunks(self, k, timeout):
        with self.cv:
            return self.cv.wait_for(lambda: all(c >= k or e for c, e in
                                                zip(self.chunks, self.error)), timeout)

    def join(self, timeout):
        for t in self.threads:
            t.join(max(0.1, timeout - (time.monotonic() - self.t0)))
        self.hung = sum(t.is_alive() for t in self.threads)
        return self

    def summary(self):
        # chunks are not tokens (a chunk waits for a whole utf-8 character); with ignore_eos a
        # stream that ends on "length" produced exactly max_tokens
        toks = sum(self.max_tokens for f in self.finish if f == "length")
        ends = [t for t in self.t_last if t]
        wall = (max(ends) - self.t0) if ends else 0
        dec = [self.max_tokens / (l - self.t0) for f, l in zip(self.finish, self.t_last)
               if f == "length" and l]
        return {"streams": len(self.prompts), "tokens": toks, "wall_s": round(wall, 3),
                "aggregate_tok_s": round(toks / wall, 1) if wall else 0,
                "per_stream_tok_s": round(sum(dec) / len(dec), 1) if dec else 0,
                "ttft_s": round(min(f for f in self.t_first if f) - self.t0, 3)
                if any(self.t_first) else None,
                "errors": [e for e in self.error if e], "hung": self.hung,
                "finish": sorted(set(map(str, self.finish)))}


def phase(a, preset, vram, host, n_streams, n_tok, deadline):
    res = {"preset": preset, "vram_target": vram, "host_budget": host, "ok": False}
    RESULTS["phases"].append(res)
    root = Path(a.work) / preset
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model.gguf"
    t = time.monotonic()
    mk = subprocess.run([str(Path(a.bin) / "rkv-mkmodel"), "--preset", preset, "--dtype", "bf16",
                         "--seed", "1", "--out", str(model)], capture_output=True, text=True)
    res["mkmodel_s"] = round(time.monotonic() - t, 1)
    if mk.returncode:
        res["error"] = "rkv-mkmodel: " + mk.stderr[-500:]
        return res
    res["model_bytes"] = model.stat().st_size
    used0, total, _ = nvidia_smi()
    res["gpu_used_before_mib"], res["gpu_total_mib"] = used0, total
    srv = Rkvd(a.bin, model, root / "srv", ["--vram-target", vram, "--host-budget", host,
                                             "--log-level", "info"], a.backend)
    t = time.monotonic()
    up = srv.start(timeout=min(150, deadline - time.monotonic()))
    res["startup_s"] = round(time.monotonic() - t, 1)
    try:
        if not up:
            res["error"] = "rkvd did not become healthy"
            return res
        log(f"{preset}: healthy after {res['startup_s']} s")
        prompts = [f"request {i} tells a long story about the fox and the" + " river" * i
                   for i in range(n_streams)]
        one = Streams(srv, prompts[:1], n_tok).start().join(120)
        res["batch1"] = one.summary()
        log(f"{preset}: batch 1: {res['batch1']}")
        base = Streams(srv, prompts, n_tok).start().join(120)
        res["batchN"] = base.summary()
        log(f"{preset}: batch {n_streams}: {res['batchN']}")
        if a.backend == "cuda" and preset != "llama3-8b":
            res["sampled"] = sampled_device(srv, prompts[0], n_tok)
        used, _, per = nvidia_smi()
        res["gpu_used_serving_mib"] = used
        res["gpu_per_process_mib"] = {f"{pid} {comm_of(pid)}": m for pid, m in per.items()}
        res["rkv_gpu_mib"] = used - used0
        res["vram_target_mib"] = size_bytes(vram) >> 20
        res["budget_ratio"] = round((used - used0) / (size_bytes(vram) >> 20), 4)
        m = re.search(r"pools: (\d+) device block\(s\) per gpu \(([^,]+), ([^)]+)\) and (\d+) "
                      r"host block\(s\) \(([^)]+)\) of (\d+) bytes", srv.log())
        res["pools_log"] = m.group(0) if m else None
        res["worker_attached_ipc"] = "(cuda ipc)" in srv.log()
        if time.monotonic() > deadline - 60:
            res["kill_test"] = "skipped: out of time"
        else:
            worker = srv.child("rkv-worker")
            restarts0 = srv.metric("rkv:worker_restarts_total")
            # longer streams, killed a fixed time after every stream has its first chunk
            # (a random-weights model's text comes in few chunks)
            long_tok = n_tok * 4
            want = Streams(srv, prompts, long_tok).start().join(120)
            # a second run without a kill: on a random-weights model the top logits are
            # nearly tied, and the batch's grouping (which prompts share a prefill chunk,
            # how many rows a gemv step has) can flip an argmax with no kill at all; only
            # the streams on which the two runs agree can show what the kill changed
            want2 = Streams(srv, prompts, long_tok).start().join(120)
            steady = [x == y for x, y in zip(want.text, want2.text)]
            s = Streams(srv, prompts, long_tok).start()
            s.wait_chunks(1, 60)
            time.sleep(0.3)
            prefill0 = srv.metric("rkv:prefill_tokens_total")
            os.kill(worker, signal.SIGKILL)
            t_kill = time.monotonic()
            log(f"{preset}: SIGKILLed worker {worker} mid-stream")
            s.join(180)
            same = sum(x == y for x, y in zip(s.text, want.text))
            same_steady = sum(x == y for x, y, k in zip(s.text, want.text, steady) if k)
            for _ in range(100):
                if srv.metric("rkv:worker_restarts_total") > restarts0:
                    break
                time.sleep(0.1)
            res["kill_test"] = {
                "baseline": want.summary(), "summary": s.summary(),
                "killed_with_streams_running": sum(1 for f in s.t_last if f and f > t_kill), "same_text": f"{same}/{n_streams}",
                "same_without_kill": f"{sum(steady)}/{n_streams}",
                "same_text_where_runs_agree": f"{same_steady}/{sum(steady)}",
                "prefill_tokens_recomputed": srv.metric("rkv:prefill_tokens_total") - prefill0,
                "worker_restarts": srv.metric("rkv:worker_restarts_total") - restarts0,
                "new_worker": srv.child("rkv-worker"),
                "resume_s": round(max((t for t in s.t_last if t), default=t_kill) - t_kill, 2),
                "gpu_used_after_restart_mib": nvidia_smi()[0]}
            log(f"{preset}: kill test: {res['kill_test']}")
            res["ok"] = (same_steady == sum(steady) and sum(steady) > 0
                         and not s.summary()["errors"] and s.hung == 0
                         and not base.summary()["errors"] and not want.summary()["errors"]
                         and not want2.summary()["errors"])
        if isinstance(res["kill_test"], str):
            res["ok"] = not base.summary()["errors"] and base.hung == 0
    except Exception as e:  # noqa: BLE001 - the next phase still runs
        res["error"] = repr(e)
    finally:
        res["rkvd_exit"] = srv.stop()
        logtxt = srv.log()
        Path(a.out, f"rkvd-{preset}.log").write_text(logtxt[-200000:])
        if "text" in res.get("sampled", {}):
            sampled_host(a, model, root, srv.args[srv.args.index("--vram-target"):], prompts[0],
                         n_tok, res["sampled"], deadline, Path(a.out, f"rkvd-{preset}-host.log"))
            log(f"{preset}: sampled on the device and on the host: {res['sampled']}")
            res["ok"] = res["ok"] and res["sampled"]["ok"]
        if not res["ok"]:
            log(f"{preset}: rkvd log tail:\n{logtxt[-3000:]}")
        try:
            model.unlink()
        except OSError:
            pass
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/rkv-gpu-demo")
    ap.add_argument("--backend", default="cuda", help="cpu: try the driver without a gpu")
    ap.add_argument("--presets", default="small,llama3-8b")
    ap.add_argument("--deadline", type=float, default=330, help="seconds for everything")
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    deadline = T0 + a.deadline
    plans = {"tiny": ("1GiB", "1GiB", 4, 64), "small": ("4GiB", "1GiB", 8, 200), "llama3-8b": ("24GiB", "4GiB", 8, 128)}
    try:
        for p in a.presets.split(","):
            if time.monotonic() > deadline - (100 if p == "llama3-8b" else 40):
                RESULTS["phases"].append({"preset": p, "skipped": "out of time"})
                continue
            vram, host, n, tok = plans[p]
            phase(a, p, vram, host, n, tok, deadline)
    finally:
        Path(a.out, "gpu_demo.json").write_text(json.dumps(RESULTS, indent=1))
        print(json.dumps(RESULTS, indent=1))
    return 0 if all(p.get("ok") for p in RESULTS["phases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
