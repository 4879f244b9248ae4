#!/usr/bin/env python3
"""bench-plot.py - the GPU targets and curves from one gpu_bench JSON (make bench).

usage: scripts/bench-plot.py BENCH.JSON [OUTDIR]

Prints every target of the GPU benchmarks as a ratio to the bound gpu_bench measured in the
same run (resident prefill: to llama.cpp's tok/s on the same GPU kind, docs/performance.md),
with PASS / FAIL against the target; then the absolute batch-1 marks of docs/performance.md
(tok/s, lines that start with MARK), and, when matplotlib imports, writes two plots
into OUTDIR (default: the JSON's folder):
  spill.png      batch-1 decode tok/s against the share of the KV on host, one curve a context,
                 beside its bound (max of the HBM and PCIe times), and the ratio to it
  attention.png  attention GB/s against context: resident against the HBM ceiling, all on host
                 against the pinned H2D ceiling
A suite the run left out (--suite, --quick) is left out here too. Exit 0 when the JSON was read
(whatever the targets say), 2 when it cannot be (the message says what is wrong).
Standard library only, as on the GPU machine; plots only where matplotlib is installed.
"""
import json
import re
import sys
from pathlib import Path

# (label, test on a record's name, target ratio): the targets of single figures; the
# curves' targets (every resident and host attention context, the spill curves, the split
# steps, prefill) are in verdicts()
TARGETS = [
    ("attention resident, batch 64 x 4k", re.compile(r"^resident batch=64 ctx=4096 "), 0.85),
    ("decode b=1 4k resident", re.compile(r"^decode b=1 ctx=4096 host=0\.0%"), 0.90),
]
DECODE = re.compile(r"^decode b=(\d+) ctx=(\d+) host=([\d.]+)% \(tok/s\)$")
ATTN = re.compile(r"^(resident|host) ctx=(\d+) ")
SPLIT = re.compile(r"^split 1/2 ctx=(\d+) step ms")
PREFILL = re.compile(r"^prefill (\d+) half kv on host")
PREFILL_RES = re.compile(r"^prefill (\d+) resident \(tok/s\)$")
PREFILL_FLOPS = re.compile(r"^prefill 32768 resident \(TFLOP/s vs dense bf16 gemm\)$")
GEMM = re.compile(r"^(\S+) (\S+) \d+x\d+ m=(\d+) \(TFLOP/s vs dense bf16\)$")
# the absolute marks for batch 1 (tok/s at least; docs/performance.md), apart from the ratios:
# (label, test on a record's name, mark, llama.cpp's figure there). "All on host" is every block
# but the one being written, which stays on the device.
# "all on host": the rows that read every host block over the link (not the split's rows, which
# gpu_bench names "... split N% (tok/s)")
ALL_ON_HOST = r" host=9[5-9]\.\d% \(tok/s\)$"
MARKS = [
    ("decode 4k resident", re.compile(r"^decode b=1 ctx=4096 host=0\.0% \(tok/s\)$"), 237, 191.9),
    ("decode 32k resident", re.compile(r"^decode b=1 ctx=32768 host=0\.0% \(tok/s\)$"), 186,
     143.3),
    ("decode 128k resident", re.compile(r"^decode b=1 ctx=131072 host=0\.0% \(tok/s\)$"), 114,
     79.5),
    ("decode 8k, all KV on host", re.compile(r"^decode b=1 ctx=8192" + ALL_ON_HOST), 46, 6.85),
    ("decode 32k, all KV on host", re.compile(r"^decode b=1 ctx=32768" + ALL_ON_HOST), 10.6, 1.51),
    ("decode 128k, all KV on host", re.compile(r"^decode b=1 ctx=131072" + ALL_ON_HOST), 2.9, None),
]
PREFILL_ALL = re.compile(r"^prefill 32768 all kv on host \(tok/s\)$")
# resident prefill's mark: llama.cpp (CUDA, flash attention) on the same H200 kind, tok/s
# (measured 2026-11-29); the target is to match it
LLAMA_CPP_PREFILL = {4096: 20351.0, 32768: 9202.0, 131072: 2340.0}


class BadInput(Exception):
    pass


def load(path):
    """the device gpu_bench ran on, the RKV_* settings it ran under ({} in files from before it
    wrote them) and its records: [{suite, name, value, unit, bound, ratio}]"""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise BadInput(f"{path} is not JSON ({e}); give the file gpu_bench --json wrote") from e
    recs = doc.get("records") if isinstance(doc, dict) else None
    if not isinstance(recs, list) or not recs:
        raise BadInput(f"{path} has no \"records\" list: not a gpu_bench --json file")
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or not all(k in r for k in ("suite", "name", "value", "bound",
                                                                  "ratio")):
            raise BadInput(f"{path}: record {i} lacks suite, name, value, bound or ratio")
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    return str(doc.get("gpu") or "gpu"), env, recs


def series(recs):
    """the curves: spill {ctx: [(host %, tok/s, bound, ratio)]}, attention {kind: [(ctx, GB/s,
    ceiling, ratio)]}, split [(ctx, ratio)], prefill [(ctx, ratio)]"""
    spill, attn, split, prefill = {}, {"resident": [], "host": []}, [], []
    for r in recs:
        name, v, b, q = r["name"], r["value"], r["bound"], r["ratio"]
        m = DECODE.match(name) if r["suite"] == "decode" else None
        if m and m.group(1) == "1":
            spill.setdefault(int(m.group(2)), []).append((float(m.group(3)), v, b, q))
        m = ATTN.match(name) if r["suite"] == "attn" else None
        if m:
            attn[m.group(1)].append((int(m.group(2)), v, b, q))
        m = SPLIT.match(name) if r["suite"] == "attn" else None
        if m:
            split.append((int(m.group(1)), q))
        m = PREFILL.match(name) if r["suite"] == "prefill" else None
        if m:
            prefill.append((int(m.group(1)), q))
    for pts in spill.values():
        pts.sort()
    for pts in attn.values():
        pts.sort()
    return spill, attn, sorted(split), sorted(prefill)


def kib(ctx):
    """a context as the benchmarks name it: 512, 4k, 128k"""
    return f"{ctx // 1024}k" if ctx >= 1024 and ctx % 1024 == 0 else str(ctx)


def verdicts(recs):
    """[(label, ratio, target, ok)] for every target the run has a figure for"""
    spill, attn, split, prefill = series(recs)
    out = []
    # attention at every context: resident against the HBM ceiling, all on host against H2D
    for kind, what, target in (("resident", "resident", 0.85), ("host", "all on host", 0.9)):
        for ctx, _, _, q in attn[kind]:
            out.append((f"attention {what}, {kib(ctx)}", q, target, q >= target))
    for label, rx, target in TARGETS:
        for r in recs:
            if rx.match(r["name"]):
                out.append((label, r["ratio"], target, r["ratio"] >= target))
                break
    # the spill curves at 32k and 128k: every point against max(HBM bound, PCIe bound)
    for ctx in (32768, 131072):
        for host, _, _, q in spill.get(ctx, []):
            out.append((f"decode b=1 {kib(ctx)}, {host:g}% on host", q, 0.9, q >= 0.9))
    # the overlapped step: time against the larger of its parts (ratio = max / step)
    for ctx, q in split:
        out.append((f"split step 1/2 on host at {kib(ctx)} (max(parts) / step)", q, 1 / 1.1,
                    q >= 1 / 1.1))
    for ctx, q in prefill:
        if ctx == 32768:
            out.append(("prefill 32k, half the KV on host, over resident", q, 0.8, q >= 0.8))
    for r in recs:
        m = PREFILL_RES.match(r["name"]) if r["suite"] == "prefill" else None
        mark = LLAMA_CPP_PREFILL.get(int(m.group(1))) if m else None
        if mark:
            q = r["value"] / mark
            out.append((f"prefill {kib(int(m.group(1)))} resident, over llama.cpp's {mark:.0f} "
                        "tok/s", q, 1.0, q >= 1.0))
        if r["suite"] == "prefill" and PREFILL_FLOPS.match(r["name"]):
            out.append(("prefill 32k resident, achieved TFLOP/s over the dense bf16 gemm's",
                        r["ratio"], 0.55, r["ratio"] >= 0.55))
        # every prefill linear of every weight type (gpu_bench --suite gemm)
        m = GEMM.match(r["name"]) if r["suite"] == "gemm" else None
        if m:
            out.append((f"prefill linear {m.group(1)} {m.group(2)} m={m.group(3)}, TFLOP/s over "
                        "the dense bf16 gemm's", r["ratio"], 0.8, r["ratio"] >= 0.8))
    return out


def marks(recs):
    """[(label, value, mark, ok)] for the batch-1 marks the run has a
    figure for; prefill with all the KV on host is a ratio to resident prefill (at least 0.8)"""
    out = []
    for label, rx, mark, llama in MARKS:
        for r in recs:
            if r["suite"] == "decode" and rx.match(r["name"]):
                what = f"{label} (llama.cpp {llama:g})" if llama else label
                out.append((f"{what}, tok/s", r["value"], mark, r["value"] >= mark))
                break
    for r in recs:
        if r["suite"] == "prefill" and PREFILL_ALL.match(r["name"]):
            out.append(("prefill 32k, all KV on host, over resident", r["ratio"], 0.8,
                        r["ratio"] >= 0.8))
    return out


def plot(gpu, recs, outdir):
    """the PNGs, or a line saying why none"""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["no plots: matplotlib does not import here (the JSON holds every figure)"]
    spill, attn, _, _ = series(recs)
    made = []
    if spill:
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
        for ctx, pts in sorted(spill.items()):
            x = [p[0] for p in pts]
            line, = ax[0].plot(x, [p[1] for p in pts], "o-", label=f"{kib(ctx)} rkv")
            ax[0].plot(x, [p[2] for p in pts], "--", color=line.get_color(),
                       label=f"{kib(ctx)} bound")
            ax[1].plot(x, [p[3] for p in pts], "o-", color=line.get_color(), label=kib(ctx))
        ax[0].set_yscale("log")
        ax[0].set_xlabel("KV on host (%)")
        ax[0].set_ylabel("decode tok/s, batch 1")
        ax[0].legend(fontsize=8)
        ax[1].axhline(0.9, color="grey", linestyle=":", label="target 0.9")
        ax[1].set_ylim(0, 1.1)
        ax[1].set_xlabel("KV on host (%)")
        ax[1].set_ylabel("tok/s / max(HBM bound, PCIe bound)")
        ax[1].legend(fontsize=8)
        fig.suptitle(f"{gpu}: decode with part of the KV in host RAM (gpu_bench)")
        fig.tight_layout()
        fig.savefig(outdir / "spill.png", dpi=110)
        plt.close(fig)
        made.append(str(outdir / "spill.png"))
    if attn["resident"] or attn["host"]:
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
        for i, (kind, what) in enumerate((("resident", "HBM stream read"),
                                          ("host", "pinned H2D"))):
            pts = attn[kind]
            if not pts:
                continue
            x = [p[0] for p in pts]
            ax[i].plot(x, [p[1] for p in pts], "o-", label=f"attention, KV {kind}")
            ax[i].plot(x, [p[2] for p in pts], "--", label=f"ceiling: {what}")
            ax[i].plot(x, [p[2] * (0.85 if kind == "resident" else 0.9) for p in pts], ":",
                       label="target")
            ax[i].set_xscale("log", base=2)
            ax[i].set_xlabel("context (keys)")
            ax[i].set_ylabel("GB/s")
            ax[i].legend(fontsize=8)
        fig.suptitle(f"{gpu}: attention over one sequence's KV (gpu_bench)")
        fig.tight_layout()
        fig.savefig(outdir / "attention.png", dpi=110)
        plt.close(fig)
        made.append(str(outdir / "attention.png"))
    return [f"plot: {m}" for m in made] or ["no plots: no spill or attention figures in the run"]


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        gpu, env, recs = load(argv[1])
    except BadInput as e:
        print(f"bench-plot: {e}", file=sys.stderr)
        return 2
    outdir = Path(argv[2]) if len(argv) == 3 else Path(argv[1]).parent
    if not outdir.is_dir():
        print(f"bench-plot: {outdir} is not a folder; make it or name another", file=sys.stderr)
        return 2
    if env:
        print("settings: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    v = verdicts(recs)
    if not v:
        print("targets: none of the run's figures has a target (suites gemv or linear alone?)")
    for label, q, target, ok in v:
        print(f"{'PASS' if ok else 'FAIL'} {q:6.3f} (target {target:.3f}) {label}")
    print(f"targets: {sum(ok for *_, ok in v)} of {len(v)} met")
    mk = marks(recs)
    for label, q, mark, ok in mk:
        print(f"MARK {'PASS' if ok else 'FAIL'} {q:8.3f} (at least {mark:g}) {label}")
    if mk:
        print(f"marks: {sum(ok for *_, ok in mk)} of {len(mk)} met")
    for line in plot(gpu, recs, outdir):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
