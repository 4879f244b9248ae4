"""make bench-system's driver (tests/gpu/bench_system.py) in its cpu --quick mode, so the script
the gpu run depends on cannot rot: every part runs against real rkvd processes on the tiny model,
writes its JSON, judges the issue's targets, and leaves no process behind."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")
BINS = ("rkvd", "rkv-kvmgr", "rkv-worker", "rkvctl", "rkv-mkmodel", "rkv-gen")


def _leftovers(work):
    """live processes whose command line names the run's work dir"""
    key = str(work).encode()
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if key in f.read():
                    out.append(int(p))
        except OSError:
            pass
    return out


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    for b in BINS:
        if not (BUILD / "bin" / b).exists():
            pytest.skip(f"{BUILD / 'bin' / b} is not built (make {BUILD / 'bin' / b})")
    tmp = tmp_path_factory.mktemp("bench")
    out, work = tmp / "out", tmp / "w"
    r = subprocess.run([sys.executable, str(TOP / "tests" / "gpu" / "bench_system.py"),
                        "--bin", str(BUILD / "bin"), "--out", str(out), "--work", str(work),
                        "--backend", "cpu", "--quick", "--threads", "2",
                        # no part is skipped for time on a loaded machine (quick takes ~30 s)
                        "--deadline", "400"],
                       capture_output=True, text=True, timeout=500)
    path = out / "bench_system.json"
    assert path.exists(), f"no JSON (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    res = json.loads(path.read_text())
    res["_rc"], res["_stdout"], res["_work"], res["_out"] = r.returncode, r.stdout, work, out
    return res


def test_every_part_ran_without_error(bench):
    assert bench["_rc"] == 0, bench["_stdout"][-4000:]
    assert bench["errors"] == [], bench["errors"]
    assert bench["server"]["exit"] == 0
    assert not _leftovers(bench["_work"]), "a child of the benchmark outlived it"
    assert (bench["_out"] / "rkvd-server.log").exists()


def test_model_shape_from_gguf_matches_the_pool(bench):
    # the gguf header's kv bytes per token is what kvmgr's pool line says (tiny, f16 kv)
    pool = bench["server"]
    assert pool["block_bytes"] // pool["block_size"] == bench["model"]["kv_bytes_per_token"]
    assert pool["block_size"] == 32
    assert not any("kv bytes/token" in n for n in bench["notes"])


def test_http_runs_have_both_figures(bench):
    runs = bench["http"]["runs"]
    assert [r["batch"] for r in runs] == [1, 4]
    for r in runs:
        assert r["errors"] == []
        assert r["http_tok_s"] > 0 and r["engine_tok_s"] > 0 and r["rkvd_itl_tok_s"] > 0
        assert r["engine"].startswith("rkv-gen --batch")
        assert r["ratio"] == pytest.approx(r["http_tok_s"] / r["engine_tok_s"], rel=1e-2)


def test_structured_part_runs_both_and_judges_the_ratio(bench):
    st = bench["structured"]
    for side in ("unconstrained", "constrained"):
        runs = st[side]["runs"]
        assert runs and all(not r["errors"] for r in runs), runs
        assert all(r.get("http_tok_s") for r in runs), runs
    assert set(st["ratios"]) == {str(r["batch"]) for r in st["constrained"]["runs"]}
    assert all(v and v > 0 for v in st["ratios"].values()), st["ratios"]
    names = [t["target"] for t in bench["targets"]]
    assert any(n.startswith("structured output batch 1:") for n in names), names


def test_http_runs_read_the_step_lines_of_their_window(bench):
    # the key is there for every measured run; a window shorter than two step-line periods
    # (the cpu's quick runs often are) reads None rather than lines from around it
    for r in bench["http"]["runs"]:
        assert "steps" in r
        st = r["steps"]
        if st is not None:
            assert st["worker_steps"] > 0 and st["worker_forward_ms"] > 0


def test_step_lines_keeps_only_whole_periods_inside_the_window():
    sys.path.insert(0, str(TOP / "tests" / "gpu"))
    import bench_system  # noqa: E402 - the driver's module, imported from its folder

    log = (
        "2026-11-30T02:37:17.000Z rkv-worker[1] info: 10 steps in 1.0 s (1.0 sampled rows, 1.0 "
        "of them picked by the backend, 1.0 tokens each): forward 9.000 ms, sampling 0.000 ms, "
        "the rest of the step 0.010 ms, between steps 1.000 ms (rkvd, kvmgr, ipc)\n"
        "2026-11-30T02:37:18.000Z rkv-worker[1] info: 30 steps in 1.0 s (1.0 sampled rows, 1.0 "
        "of them picked by the backend, 1.0 tokens each): forward 3.000 ms, sampling 0.100 ms, "
        "the rest of the step 0.010 ms, between steps 0.500 ms (rkvd, kvmgr, ipc); host kv "
        "layers: 0 prefetched\n"
        "2026-11-30T02:37:18.001Z rkvd[2] info: worker 0: 30 steps in 1.0 s: kvmgr kv_prep 0.010 "
        "ms (30 of the steps used tables asked for ahead, of 30 asked), worker step 3.500 ms, "
        "rkvd loop between steps 0.100 ms\n"
        "2026-11-30T02:37:19.000Z rkv-worker[1] info: 10 steps in 1.0 s (1.0 sampled rows, 1.0 "
        "of them picked by the backend, 1.0 tokens each): forward 1.000 ms, sampling 0.000 ms, "
        "the rest of the step 0.010 ms, between steps 0.100 ms (rkvd, kvmgr, ipc)\n")
    import datetime
    t = datetime.datetime(2026, 11, 30, 2, 37, 16, tzinfo=datetime.timezone.utc).timestamp()
    # 17.0 covers 16.0-17.0 and 19.0 covers 18.0-19.0: inside [16.0, 19.0] both, weighted
    both = bench_system.step_lines(log, t, t + 3.0)
    assert both["worker_lines"] == 3 and both["worker_steps"] == 50
    assert both["worker_forward_ms"] == pytest.approx((10 * 9 + 30 * 3 + 10 * 1) / 50, abs=1e-3)
    # from 17.0 the first line's period starts outside; until 18.0005 the rkvd line ends outside
    mid = bench_system.step_lines(log, t + 1.0, t + 2.0005)
    assert mid["worker_lines"] == 1 and mid["worker_forward_ms"] == pytest.approx(3.0)
    assert mid["worker_between_steps_ms"] == pytest.approx(0.5)
    assert mid["rkvd_lines"] == 0 and mid["rkvd_loop_ms"] is None
    last = bench_system.step_lines(log, t + 1.0, t + 2.5)
    assert last["worker_lines"] == 1
    assert last["rkvd_lines"] == 1 and last["rkvd_loop_ms"] == pytest.approx(0.1)
    assert last["rkvd_kv_prep_ms"] == pytest.approx(0.01)
    assert bench_system.step_lines(log, t + 3.5, t + 4.0) is None


def test_ramp_reaches_overflow_and_drains(bench):
    rp = bench["ramp"]["phases"]
    ups = [p["n"] for p in rp if " up " in p["label"]]
    downs = [p["n"] for p in rp if " down " in p["label"]]
    assert ups[0] == 1 and ups[-1] == 6 and downs[-1] == 1
    # the target holds 2 sessions: 6 overflow, 1 fits (every session resident, no tail)
    peak = [p for p in rp if p["label"] == "ramp up 6"][0]
    assert not peak["fits"] and peak["active_kv_host_bytes"] > 0
    assert sum(peak["tactics"].values()) == 6
    assert rp[0]["fits"] and rp[0]["tactics"] == {"resident": 1}
    last = rp[-1]
    assert last["fits"] and last["to_resident_s"] is not None
    for p in rp:
        assert p["agg_tok_s"] > 0 and p["per_session_tok_s"]["min"] > 0
        assert p["bound_tok_s"] is None  # cpu: no ceilings
    # the all-resident reference counts the same phases up to the fitting count
    assert [p["n"] for p in bench["ramp"]["resident"]] == [1, 2]


def test_spill_curve_moves_the_tail(bench):
    pts = bench["spill"]["points"]
    assert [p["host_frac_wanted"] for p in pts] == [0.0, 0.5, 1.0]
    assert pts[0]["host_frac"] == 0 and pts[0]["tactic"] == "resident"
    # the planner sizes the window (with its margin) as the session grows: near, not at, 50%
    assert 0.2 < pts[1]["host_frac"] < 0.85 and pts[1]["tactic"] != "resident", pts[1]
    assert pts[2]["host_frac"] > 0.85, pts[2]
    for p in pts:
        assert p["decode_tok_s"] > 0 and p["prefill_tok_s"] > 0
        # a turn prefills only its new tokens: the session's KV is reused
        assert p["prefilled_tokens"] == bench["spill"]["prefill_tokens"]


def test_ttft_against_the_engine(bench):
    t = bench["ttft"]
    assert t["ctx"] == 1024 and t["chunk"] == 256 and t["ttft_s"] > 0
    # the engine's prefill of the same tokens in the same chunks, after the server stopped
    assert t["engine_prefill_s"] > 0 and "--warmup" in t["engine"]
    assert t["ratio"] == pytest.approx(t["ttft_s"] / t["engine_prefill_s"], rel=0.02)
    names = [x["target"] for x in bench["targets"]]
    assert "time to first token of a 1024-token prompt through HTTP <= 1.1 x the engine's " \
        "prefill" in names


def test_gaps_measures_a_stream_alone_and_beside_a_long_prefill(bench):
    g = bench["gaps"]
    assert g["ctx"] == 1024 and g["prefill_tok_s"] > 0 and g["ttft_s"] > 0
    for w in ("alone", "during_prefill"):
        assert g[w]["n"] >= 1, g
        assert 0 < g[w]["median_ms"] <= g[w]["max_ms"], g


def test_gap_stats_reads_only_the_window():
    sys.path.insert(0, str(TOP / "tests" / "gpu"))
    import bench_system
    st = bench_system.gap_stats([0.0, 0.1, 0.3, 0.6, 1.0, 5.0], 0.05, 1.0)
    assert st == {"n": 3, "median_ms": 300.0, "max_ms": 400.0}
    # chunks under 1 ms apart are one burst (a round trip of several decode steps)
    st = bench_system.gap_stats([0.1, 0.1002, 0.1004, 0.3, 0.3001, 0.7], 0.0, 1.0)
    assert st == {"n": 2, "median_ms": 400.0, "max_ms": 400.0}
    assert bench_system.gap_stats([0.0, 1.0], 0.5, 2.0) == {"n": 0, "median_ms": None,
                                                            "max_ms": None}


def test_budget_change_keeps_the_outputs(bench):
    b = bench["budget"]
    assert b["errors"] == [] and b["baseline_errors"] == []
    # the streams asked for their top two alternatives, so a divergence could be judged
    assert b["divergences"] == [None] * b["streams"] and b["diverged_at_near_ties"] == "0/0"
    # two runs without the change agree (the cpu backend is deterministic), so every
    # difference would be the change's
    assert b["control_same_text"] == f"{b['streams']}/{b['streams']}"
    assert b["same_text_where_control_agrees"] == f"{b['streams']}/{b['streams']}"
    assert b["same_text"] == f"{b['streams']}/{b['streams']}", (
        f"greedy text changed by the budget change at chars {b['diverged_at_char']} "
        f"(texts in {bench['_out'] / 'budget_texts.json'})")
    # halving came while the streams ran (at 1/16 of their tokens) and moved tails to host
    assert any("window 0->" in x or "cpu_tail 0->" in x for x in b["halve_summary"])
    assert b["halve_in_force_s"] is not None and b["halved_readings"] >= 1
    assert b["tactics_halved"]["window"] + b["tactics_halved"]["cpu_tail"] >= 1
    # restoring: in force, or the streams had ended first and the JSON says so
    ended = any("ended before the restored plan" in n for n in bench["notes"])
    assert (b.get("restore_in_force_s") is not None) != ended


def test_targets_are_judged(bench):
    names = {t["target"]: t["status"] for t in bench["targets"]}
    assert len(names) >= 10
    assert all(s in ("PASS", "FAIL", "SKIP") for s in names.values())
    # without ceilings the bound target cannot be judged, and says so
    bound = [t for t in bench["targets"] if "max(HBM, PCIe) bound" in t["target"]]
    assert bound and bound[0]["status"] == "SKIP" and "no ceiling" in bound[0]["detail"]
    assert names["budget change: no failed request"] == "PASS"
    assert names["budget change: outputs identical to the run without it"] == "PASS"
    assert names["budget change: outputs identical where two runs without it agree"] == "PASS"
    assert [s for t, s in names.items() if "at a near tie" in t] == ["PASS"]
    hf = bench["hf_offloaded"]
    assert "skipped" in hf and "CUDA" in hf["skipped"]


def test_divergence_tells_near_ties_from_real_changes():
    """the budget part's judge of a changed greedy stream: where it leaves the baseline, and by
    how much the baseline preferred its own token there"""
    sys.path.insert(0, str(TOP / "tests" / "gpu"))
    from bench_system import NEAR_TIE, divergence
    base = [("a", -0.1, {"a": -0.1, "b": -0.105}), ("c", -0.2, {"c": -0.2, "d": -3.0}),
            ("e", -0.3, {"e": -0.3, "f": -0.9})]
    assert divergence(base, base) is None
    # the changed run took b, which the baseline had 0.005 nats below a: a near tie
    i, m = divergence(base, [("b", -0.1, {}), ("x", 0, {})])
    assert i == 0 and abs(m - 0.005) < 1e-9 and m <= NEAR_TIE
    # d was 2.8 nats below c: a real change
    i, m = divergence(base, [base[0], ("d", -0.2, {}), base[2]])
    assert i == 1 and m > NEAR_TIE
    # a token the baseline did not list, or a shorter stream: no margin
    assert divergence(base, [base[0], base[1], ("z", -1, {})]) == (2, None)
    assert divergence(base, base[:2]) == (2, None)


def test_burst_rate_counts_whole_steps():
    """the ramp's per-stream rate: bursts of 8 tokens every 40 ms (runs of decode steps) read
    200 tok/s wherever the window starts and ends, also inside a burst; one token every 0.52 s
    reads 1/0.52 where counting tokens in a 3 s window reads 5 or 6 steps' worth"""
    sys.path.insert(0, str(TOP / "tests" / "gpu"))
    import bench_system  # noqa: E402 - the driver's module, imported from its folder

    times, cum = [], []
    for b in range(40):
        for k in range(8):
            times.append(b * 0.040 + k * 1e-5)
            cum.append(b * 8 + k + 1)
    for t0, t1 in [(0.0, 1.0), (0.0301, 0.80002), (0.04003, 1.5)]:
        r = bench_system.burst_rate(times, cum, t0, t1)
        assert r == pytest.approx(200.0, rel=1e-3), (t0, t1, r)
    assert bench_system.burst_rate(times, cum, 0.0, 0.05) is None  # one burst end only
    slow = [0.1 + 0.52 * k for k in range(20)]
    r = bench_system.burst_rate(slow, list(range(1, 21)), 1.0, 4.0)
    assert r == pytest.approx(1 / 0.52, rel=1e-6)
