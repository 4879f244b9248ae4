"""KV residency as real processes (rkvd + rkv-kvmgr + rkv-worker, CPU backend): the seeds'
never-shipped dynamic-residency gate. Sessions arrive until the device pool overflows, kvmgr
spills their older blocks to the host pool (WINDOW / CPU_TAIL), the worker attends device and
host blocks as two partial sets merged by log-sum-exp, and every token's log-probabilities equal
those of an all-resident server. When the load drains, sessions come back to RESIDENT."""
import concurrent.futures as cf
import sqlite3
import time

import pytest

openai = pytest.importorskip("openai")

# tiny model, f32 KV, 16 positions per block: one block = 2 layers x (K,V) x 2 kv heads x 16
# positions x 16 dims x 4 bytes = 8 KiB, so a 64 KiB device pool holds 8 blocks
TIGHT = ("--block-size", "16", "--vram-target", "64KiB", "--host-budget", "8MiB",
         "--max-running", "16")
ROOMY = ("--block-size", "16", "--vram-target", "64MiB", "--host-budget", "8MiB",
         "--max-running", "16")

PROMPTS = [f"Session {i}: the story of a {w} who walked to the sea and back again, slowly."
           for i, w in enumerate(["fox", "cat", "dog", "owl", "eel", "yak", "bee", "elk"])]
MAX_TOKENS = 48  # prompt ~25 + 48 positions: 5 blocks per session, 40 for eight


def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)


def run_one(srv, prompt, session=None):
    """greedy completion with log-probabilities: (tokens, [(logprob, {alt: logprob})])"""
    extra = {"session_id": session} if session else {}
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS,
                                       temperature=0, logprobs=5, extra_body=extra)
    lp = r.choices[0].logprobs
    return lp.tokens, list(zip(lp.token_logprobs, lp.top_logprobs))


def assert_same(got, want, what):
    toks_g, lps_g = got
    toks_w, lps_w = want
    assert toks_g == toks_w, f"{what}: tokens differ"
    worst = 0.0
    for i, ((lg, tg), (lw, tw)) in enumerate(zip(lps_g, lps_w)):
        assert tg.keys() == tw.keys(), f"{what}: token {i}: alternatives differ"
        for k in tw:
            worst = max(worst, abs(tg[k] - tw[k]) / max(1.0, abs(tw[k])))
        worst = max(worst, abs(lg - lw) / max(1.0, abs(lw)))
    # log-probabilities are logits minus a log-sum-exp: 1e-5 relative on them is the
    # issue's logit tolerance
    assert worst <= 1e-5, f"{what}: log-probabilities differ by {worst:.2e} (relative)"


class Background:
    """long requests running beside the measured ones: their KV alone outgrows the device
    pool, so it spills whatever the timing of the others"""

    def __init__(self, srv, n=2, tokens=600):
        self.srv, self.n, self.tokens = srv, n, tokens

    def __enter__(self):
        self.ex = cf.ThreadPoolExecutor(self.n)
        self.futs = [self.ex.submit(self._one, i) for i in range(self.n)]
        # wait until they hold KV (their first tokens came back)
        deadline = time.monotonic() + 30
        while self.srv.metric("rkv:generation_tokens_total") < self.n and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def _one(self, i):
        r = client(self.srv).completions.create(model="tiny", prompt=f"background {i}",
                                                max_tokens=self.tokens, temperature=0,
                                                extra_body={"ignore_eos": True})
        return r.choices[0].finish_reason

    def __exit__(self, *exc):
        for f in self.futs:
            assert f.result(timeout=300) == "length"
        self.ex.shutdown()


def events(srv):
    db = sqlite3.connect(f"file:{srv.state_dir}/rkv.db?mode=ro", uri=True)
    try:
        return db.execute("SELECT session_id, from_tactic, to_tactic, reason FROM tactic_events"
                          " ORDER BY id").fetchall()
    finally:
        db.close()


def resident_answers(model, root, args):
    """each prompt alone on a server started with args, which leave room for everything (all
    blocks resident)"""
    from conftest import Rkvd, _stop_checked
    srv = Rkvd(model, root, args).start()
    try:
        out = {p: run_one(srv, p) for p in PROMPTS}
        assert not [e for e in events(srv) if e[2] != "resident"], "the roomy server spilled"
    finally:
        _stop_checked(srv)
    return out


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    return resident_answers(tiny_model, tmp_path_factory.mktemp("roomy"), ROOMY)


def test_overflow_spills_exactly_and_drains_back(rkvd_factory, reference):
    srv = rkvd_factory(*TIGHT)
    # all eight at once (40 blocks of KV against 8 device blocks), beside two long requests
    with Background(srv), cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = dict(zip(PROMPTS, ex.map(lambda p: run_one(srv, p, session=p[:10]), PROMPTS)))
    for p in PROMPTS:
        assert_same(got[p], reference[p], p[:10])
    ev = wait_events(srv, lambda ev: any(e[2] in ("window", "cpu_tail") for e in ev))
    spilled = {e[0] for e in ev if e[2] in ("window", "cpu_tail")}
    assert spilled, f"nothing spilled with 40 blocks of KV on 8 device blocks: {ev}"
    # the sessions are named: idle now, their KV is kept (parked on the host, or promoted back
    # to the device when room came back as the others were parked). A new turn of one session
    # fits the device alone: it runs resident. Which kvmgr session serves it is not visible
    # here, and it may already have been promoted before the turn (then the turn records no
    # transition), so check the end state: some spilled session's last placement is resident.
    again = run_one(srv, PROMPTS[0], session=PROMPTS[0][:10])
    assert_same(again, reference[PROMPTS[0]], "second turn")

    def back(ev):
        last = {}
        for sid, _, to, _ in ev:
            if to != "parked":
                last[sid] = to
        return [s for s in spilled if last.get(s) == "resident"]
    ev = wait_events(srv, back)
    assert back(ev), f"no spilled session came back to resident: {ev}"


def test_next_turn_under_pressure_rewrites_its_last_prompt_position_exactly(rkvd_factory,
                                                                             reference):
    """a named session's next turn with the same prompt recomputes the last prompt position
    (for its logits) inside a block that WINDOW may have moved to the host: kvmgr cuts the
    session back to what is written, so that block becomes a private device block again"""
    srv = rkvd_factory(*TIGHT)
    with Background(srv):
        for p in PROMPTS[:3]:
            first = run_one(srv, p, session="turns-" + p[:10])
            again = run_one(srv, p, session="turns-" + p[:10])
            assert_same(first, reference[p], "first turn " + p[:10])
            assert_same(again, reference[p], "next turn " + p[:10])
    ev = wait_events(srv, lambda ev: any(e[2] in ("window", "cpu_tail") for e in ev))
    assert any(e[2] in ("window", "cpu_tail") for e in ev), f"nothing spilled: {ev}"


def pool_use(srv):
    pool = srv.ctl("status")["pool"]
    return pool["device_used"], pool["host_used"]


def wait_events(srv, pred, timeout=5):
    """kvmgr numbers its transitions; rkvd stores them a moment later (within a status poll,
    250 ms, when pub/sub missed them)"""
    deadline = time.monotonic() + timeout
    while not pred(events(srv)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return events(srv)


def test_forced_cpu_tail_is_exact_and_leaks_nothing(rkvd_factory, reference):
    srv = rkvd_factory(*TIGHT, "--mode", "cpu_tail")
    with Background(srv), cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = list(ex.map(lambda p: run_one(srv, p), PROMPTS))
    for p, g in zip(PROMPTS, got):
        assert_same(g, reference[p], p[:10])
    ev = wait_events(srv, lambda ev: any(e[2] == "cpu_tail" for e in ev))
    assert any(e[2] == "cpu_tail" for e in ev), ev
    # private sessions are closed when their request ends: every block goes back to the pools
    # once the worker's last step is acknowledged
    deadline = time.monotonic() + 10
    while pool_use(srv) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool_use(srv) == (0, 0)


def test_resident_mode_queues_instead_of_spilling(rkvd_factory, reference):
    srv = rkvd_factory(*TIGHT, "--mode", "resident")
    with cf.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: run_one(srv, p), PROMPTS[:4]))
    for p, g in zip(PROMPTS[:4], got):
        assert_same(g, reference[p], p[:10])
    assert not [e for e in events(srv) if e[2] in ("window", "cpu_tail")], events(srv)


def session_row(srv, name):
    """the named session's row of `rkvctl sessions list` (kvmgr's sid, its tactic)"""
    listed = srv.ctl("sessions", "list")["sessions"]
    rows = [s for s in listed if s["id"] == name]
    assert len(rows) == 1, listed
    return rows[0]


def parked_at(srv, sid):
    """wall ms of the session's first move to parked, or None"""
    db = sqlite3.connect(f"file:{srv.state_dir}/rkv.db?mode=ro", uri=True)
    try:
        row = db.execute("SELECT MIN(ts_ms) FROM tactic_events WHERE session_id = ? AND "
                         "to_tactic = 'parked'", (sid,)).fetchone()
    finally:
        db.close()
    return row[0]


@pytest.mark.parametrize("grace_ms", [0, 2500])
def test_a_session_between_turns_keeps_its_kv_on_the_gpu_for_park_after_ms(rkvd_factory,
                                                                            reference, grace_ms):
    """a named session's turn ends; then a long request outgrows the device pool. With
    --park-after-ms 0 kvmgr parks the idle session at once for room; with 2500 its blocks stay
    on the device (windowed with the running one) until 2.5 s after its last step, then it
    parks: a client's next turn within the grace finds its KV where it was"""
    srv = rkvd_factory(*TIGHT, "--park-after-ms", str(grace_ms))
    assert_same(run_one(srv, PROMPTS[0], session="between"), reference[PROMPTS[0]], "turn 1")
    t_done = time.time() * 1000
    sid = session_row(srv, "between")["sid"]
    with Background(srv, n=1, tokens=2000):
        if grace_ms:
            time.sleep(max(0.0, (t_done + 1000) / 1000 - time.time()))
            row = session_row(srv, "between")
            # its device blocks stay: all of it resident, or a device part whose host tail the
            # link (window) or the cpu threads (cpu_tail, where the planner measured the cpu's
            # attention faster than the link: on the cpu backend, a memcpy) read
            assert row["tactic"] in ("resident", "window", "cpu_tail"), row
            assert parked_at(srv, sid) is None
        deadline = time.monotonic() + 10
        while parked_at(srv, sid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        at = parked_at(srv, sid)
        assert at is not None, f"never parked under pressure: {events(srv)}"
        if grace_ms:
            # the grace counts from the turn's last step, a little before t_done
            assert at >= t_done + grace_ms - 600, (at - t_done)
        else:
            assert at <= t_done + 2000, (at - t_done)
    # the next turn reads its kv back from the host: the same tokens
    assert_same(run_one(srv, PROMPTS[0], session="between"), reference[PROMPTS[0]], "turn 2")
