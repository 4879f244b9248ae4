"""swa_check.py - a sliding-window model's KV through the served path on a GPU (issue: a 32k
Gemma 3 session's KV bytes, as `rkvctl sessions` reports them, at most a quarter of an
all-global model of the same shape). Two servers in turn on the same model: swa_kv = window,
then swa_kv = full. Each takes one named session of --ctx prompt tokens and --decode greedy
tokens; then its KV bytes (`rkvctl sessions list`), decode tok/s and tokens. Judged: the
window's bytes over the full layout's (<= 0.25) and the same tokens from both (the layouts give
the same logits); reported: the window layout's decode tok/s over the full one's.

  python3 tests/gpu/swa_check.py --bin DIR --out DIR [--backend cuda|cpu] [--quick]
--quick: gemma3-tiny, f32, 600 positions in blocks of 16 (the cpu smoke test). Standard library only; writes
OUT/swa_check.json and OUT/rkvd-*.log; exit 0 when both servers ran every request (targets are
in the JSON; --strict also fails on a FAIL)."""
import argparse
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_demo  # noqa: E402  (its Rkvd and SSE reader)


def log(msg):
    print(f"swa_check: {msg}", flush=True)


def complete(srv, ids, n, session, timeout):
    """one greedy streamed completion of n tokens: (tokens, seconds from the first token to the
    last)"""
    body = {"model": srv.model_id, "prompt": ids, "max_tokens": n, "temperature": 0,
            "stream": True, "ignore_eos": True, "logprobs": 1, "session_id": session}
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    toks, t_first, t_last = [], None, None
    for ch in gpu_demo.sse_choices(r):
        lp = ch.get("logprobs") or {}
        got = lp.get("tokens") or []
        if got:
            t_last = time.monotonic()
            t_first = t_first or t_last
            toks += got
    c.close()
    return toks, (t_last - t_first) if t_first and t_last else 0.0


def run_server(a, layout, vocab):
    srv = gpu_demo.Rkvd(a.bin, a.model, Path(a.work) / f"srv-{layout}",
                        ["--swa-kv", layout, "--ctx-size", str(a.ctx + a.decode + 64),
                         "--block-size", str(a.block_size),
                         *(["--threads", str(a.threads)] if a.threads else [])], a.backend)
    out = {"swa_kv": layout}
    try:
        if not srv.start(timeout=a.start_timeout):
            raise RuntimeError(f"rkvd ({layout}) did not become healthy: {srv.log()[-2000:]}")
        t = time.monotonic()
        toks, dec_s = complete(srv, gpu_demo.prompt_ids("swa", a.ctx, vocab), a.decode, "swa", a.io_timeout)
        out["seconds"] = round(time.monotonic() - t, 3)
        out["tokens"] = toks
        out["decode_tok_s"] = round((len(toks) - 1) / dec_s, 2) if dec_s > 0 else None
        time.sleep(2.5)  # the worker's tables of the last step reach rkvd's counts
        sess = {x["id"]: x for x in srv.ctl("sessions", "list")["sessions"]}
        out["kv_tokens"] = sess["swa"]["kv_tokens"]
        out["kv_bytes"] = sess["swa"]["kv_bytes"]
    except Exception as e:  # noqa: BLE001 - recorded, judged below
        out["error"] = repr(e)[:2000]
    finally:
        out["exit"] = srv.stop()
        (Path(a.out) / f"rkvd-{layout}.log").write_text(srv.log()[-400000:])
    log(f"{layout}: {out.get('kv_tokens')} positions hold {out.get('kv_bytes')} bytes of kv, "
        f"decode {out.get('decode_tok_s')} tok/s{' error ' + out['error'] if 'error' in out else ''}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/rkv-swa-check")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--preset", help="rkv-mkmodel preset (gemma3-4b; quick gemma3-tiny)")
    ap.add_argument("--dtype", help="weights (q4_k_m; quick f32)")
    ap.add_argument("--model", help="a GGUF to use instead of making one")
    ap.add_argument("--ctx", type=int, help="prompt tokens (32768; quick 600)")
    ap.add_argument("--decode", type=int, help="decoded tokens (64; quick 32)")
    ap.add_argument("--block-size", type=int, help="positions a block (256; quick 16: the tiny "
                    "model's window is 8)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--io-timeout", type=float, default=600)
    a = ap.parse_args(argv)
    q = a.quick
    for k, quick, full in (("preset", "gemma3-tiny", "gemma3-4b"), ("dtype", "f32", "q4_k_m"),
                           ("ctx", 600, 32768), ("decode", 32, 64), ("block_size", 16, 256)):
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    if a.ctx < 1 or a.decode < 2:
        ap.error(f"--ctx {a.ctx} / --decode {a.decode}: a prompt token and two decoded at least")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    res = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "targets": [],
           "config": {k: str(v) for k, v in vars(a).items()}}
    if a.model:
        a.model = Path(a.model)
    else:
        a.model = Path(a.work) / f"{a.preset}-{a.dtype}.gguf"
        if not a.model.exists():
            t = time.monotonic()
            r = subprocess.run([str(Path(a.bin) / "rkv-mkmodel"), "--preset", a.preset, "--dtype",
                                a.dtype, "--seed", "1", "--out", str(a.model)],
                               capture_output=True, text=True, timeout=1800)
            if r.returncode:
                sys.exit(f"swa_check: rkv-mkmodel: {r.stderr[-500:]}")
            res["mkmodel_s"] = round(time.monotonic() - t, 1)
    vocab = {"gemma3-tiny": 512, "gemma3-4b": 262144}.get(a.preset, 512)
    runs = [run_server(a, layout, vocab) for layout in ("window", "full")]
    res["window"], res["full"] = runs

    def target(name, value, need, at_most):
        ok = value is not None and (value <= need if at_most else value >= need)
        st = "SKIP" if value is None else "PASS" if ok else "FAIL"
        res["targets"].append({"target": name, "status": st, "value": value,
                               "need": ("<= " if at_most else ">= ") + str(need)})
        log(f"{st}  {name}: {value}")

    w, f = runs
    both = all("error" not in x for x in runs)
    ratio = round(w["kv_bytes"] / f["kv_bytes"], 4) if both and f.get("kv_bytes") else None
    target(f"kv bytes of a {a.ctx}-position session, window over all-global", ratio, 0.25, True)
    same = (w["tokens"] == f["tokens"]) if both else None
    target("the same tokens from both layouts", None if same is None else int(same), 1, False)
    # reported, not judged: a cuda worker records no decode graphs for a layout of parts
    res["decode_window_over_full"] = (round(w["decode_tok_s"] / f["decode_tok_s"], 3)
                                      if both and w.get("decode_tok_s") and f.get("decode_tok_s")
                                      else None)
    log(f"decode tok/s, window layout over full: {res['decode_window_over_full']}")
    for x in runs:
        x["n_tokens"] = len(x.pop("tokens", []) or [])
    (Path(a.out) / "swa_check.json").write_text(json.dumps(res, indent=1))
    failed = not both or any(x.get("exit") for x in runs)
    if a.strict and any(t["status"] == "FAIL" for t in res["targets"]):
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
