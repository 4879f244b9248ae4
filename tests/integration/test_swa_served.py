"""Sliding-window KV through the served path (rkvd + rkv-kvmgr + rkv-worker, cpu backend;
docs/runtime.md, "Sliding windows"): with swa_kv = window a gemma3 session holds every global
part and only the local parts its window still reads, so the KV bytes the planner counts
(/metrics rkv:tactic_kv_bytes, rkvctl sessions) stay within a quarter of the all-global layout's (swa_kv =
full), while its tokens and log-probabilities are the same as the full layout's across decode
far past the window, a device pool too small for the session (its tail on the host, parked
while another session runs), a second turn of the same session (its kv reused), and a turn that
cuts the session back before its live window (kvmgr forgets it, rkvd prefills its history)."""
import subprocess
import time
import pytest

from conftest import Rkvd, _stop_checked, rkv_bin

openai = pytest.importorskip("openai")

# gemma3-tiny: 7 layers (1 global), one kv head of 32, a window of 8 positions. f32, 16
# positions a block: a part is 1 layer x (K,V) x 16 x 32 x 4 bytes = 4 KiB, a block of the
# full layout 28 KiB; a 96 KiB device pool holds 24 parts or 3 full blocks
COMMON = ("--block-size", "16", "--host-budget", "16MiB", "--max-running", "4")
TIGHT = ("--vram-target", "96KiB")
TURN1 = 600  # positions decoded past the prompt: 75 windows


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("swamodel") / "gemma3-tiny.gguf"
    r = subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "gemma3-tiny", "--dtype", "f32",
                        "--seed", "3", "--out", str(path)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return path


def server(gemma, tmp_path_factory, name, *extra):
    return Rkvd(gemma, tmp_path_factory.mktemp(name), [*COMMON, *extra]).start(timeout=60)


def complete(srv, prompt, n, session=None):
    """greedy completion with log-probabilities: (text, tokens, [(logprob, {alt: lp})])"""
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=300)
    extra = {"ignore_eos": True}
    if session:
        extra["session_id"] = session
    r = c.completions.create(model="gemma3-tiny", prompt=prompt, max_tokens=n, temperature=0,
                             logprobs=3, extra_body=extra)
    ch = r.choices[0]
    return ch.text, ch.logprobs.tokens, list(zip(ch.logprobs.token_logprobs,
                                                ch.logprobs.top_logprobs))


def run_all(srv):
    """the scenario on one server: what each request answered, and the KV bytes counted after
    the long first turn"""
    out = {}
    p1 = "The window slides along the river of tokens"
    out["turn1"] = complete(srv, p1, TURN1, session="long")
    # kvmgr publishes the planner's bytes per tactic every second: the idle session's blocks
    # (parked to make room) as its last step left them
    time.sleep(2.5)
    out["bytes1"] = srv.metric("rkv:tactic_kv_bytes")
    # rkvctl sessions: the blocks its last step's table named
    sess = {x["id"]: x for x in srv.ctl("sessions", "list")["sessions"]}
    out["ctl1"] = sess["long"]["kv_bytes"]
    # another session takes the device while "long" is idle: it is parked to the host
    out["other"] = complete(srv, "Another session, to make room", 64, session="other")
    # the second turn continues the history: its kv is reused from where it is
    p2 = p1 + out["turn1"][0] + " and on it goes"
    out["turn2"] = complete(srv, p2, 48, session="long")
    # a turn that diverges at the start: the window of the kept prefix is gone
    out["turn3"] = complete(srv, "The window closes", 24, session="long")
    out["moved"] = srv.metric("rkv:kv_bytes_migrated_total")
    # what a position takes, every layer: the same for both layouts
    out["bpt"] = srv.metric("rkv:kv_bytes_per_token")
    out["bpt_ctl"] = srv.ctl("status")["pool"]["kv_bytes_per_token"]
    return out


def test_window_kv_served(gemma, tmp_path_factory):
    full = server(gemma, tmp_path_factory, "swafull", *TIGHT, "--swa-kv", "full")
    try:
        want = run_all(full)
    finally:
        _stop_checked(full)
    win = server(gemma, tmp_path_factory, "swawin", *TIGHT)
    try:
        got = run_all(win)
        log = win.log()
    finally:
        _stop_checked(win)
    for k in ("turn1", "other", "turn2", "turn3"):
        assert got[k][1] == want[k][1], f"{k}: tokens differ"
        # the same keys; the device pool splits them between device and host at other
        # places in the two layouts, and the log-sum-exp merge of the two sets reorders sums
        worst = 0.0
        for (lg, tg), (lw, tw) in zip(got[k][2], want[k][2]):
            assert tg.keys() == tw.keys(), f"{k}: alternatives differ"
            for a in tw:
                worst = max(worst, abs(tg[a] - tw[a]) / max(1.0, abs(tw[a])))
            worst = max(worst, abs(lg - lw) / max(1.0, abs(lw)))
        assert worst <= 1e-5, f"{k}: log-probabilities differ by {worst:.2e} (relative)"
    assert len(got["turn1"][1]) == TURN1
    # the window layout counts every global part and the live local parts only
    assert want["bytes1"] >= 7 * 4096 * (TURN1 // 16)
    assert got["bytes1"] <= 0.25 * want["bytes1"], (got["bytes1"], want["bytes1"])
    assert want["ctl1"] >= 7 * 4096 * (TURN1 // 16)
    assert 0 < got["ctl1"] <= 0.25 * want["ctl1"], (got["ctl1"], want["ctl1"])
    # the device pool was too small for the session beside another: its live parts went to
    # the host and came back
    assert got["moved"] > 0
    # the third turn kept nothing it could continue from exactly: its history was prefilled
    assert "prefilling its" in log
    # a position's KV of all layers, whatever the layout (a window layout's block is one part)
    assert got["bpt"] == want["bpt"] == got["bpt_ctl"] == want["bpt_ctl"] > 0, (got, want)
    # the worker measured its kv rates over the window layout's tables (the planner's inputs)
    assert "measuring kv rates failed" not in log and "kv rates (" in log, log[-3000:]
