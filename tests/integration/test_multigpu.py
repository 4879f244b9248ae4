"""Several GPUs, simulated on the CPU backend (--workers 2: one kvmgr with a device pool per worker
and one shared host pool). While worker 1 is drained, a pinned session and a conversation share
worker 0. Once worker 1 takes sessions again and the conversation's KV no longer fits worker 0
(it spills to the host), kvmgr's planner moves it to worker 1 through the host pool: between two
turns (its KV parked) or in the middle of a turn's decode. It goes on resident on worker 1 with
the text of a single-worker server and of rkv-gen, nothing is prefilled again, and the move
shows in the tactic-event log, the metrics and rkvctl. Everything is sequential and driven by
the requests' own growth: no step of the tests depends on timing."""
import json
import sqlite3
import subprocess
import time

import pytest

openai = pytest.importorskip("openai")

# tiny model, f32 KV, 16 positions per block: one block is 8 KiB, so a 256 KiB device pool
# holds 32 blocks (512 positions) per worker. The pinned session keeps ~20 blocks resident on
# worker 0, the conversation grows to ~28: together they spill, alone each fits.
TWO = ("--workers", "2", "--block-size", "16", "--vram-target", "256KiB", "--host-budget",
       "8MiB", "--max-running", "16")
ONE = ("--workers", "1", "--block-size", "16", "--vram-target", "64MiB", "--host-budget",
       "8MiB", "--max-running", "16")

KEEP = ("keep", ["A pinned story about a quiet harbour and its boats.", " More:"], [300, 2])
# spills on worker 0 in its first turn; moves at the start of its second
CONV = ("fox", ["The fox walked to the sea and back again, slowly.", " Then the fox said:",
                " And the sea answered:"], [400, 24, 24])
# fits worker 0 in its first turn; spills and moves halfway through its second turn's decode
MID = ("owl", ["An owl counted the stars above the harbour.", " The owl went on:",
               " Then it slept."], [40, 300, 24])
# the same with seeded sampling in the turn that moves: the new worker's sampler is rebuilt
# from the history and skips the draws made before the move
SEEDED = ("bee", ["A bee hummed over the clover by the wall.", " The bee said:"], [40, 300],
          [None, {"temperature": 1.0, "seed": 7}])


def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)


def converse(srv, ref, conv, first=0, upto=None, history=()):
    """turns [first, upto) of a conversation, sent as token ids so that each turn's prompt is
    exactly the session's history plus the new text: [(prompt ids, answer text)]. The
    answer's ids are rkv-gen's for the same prompt (the test checks the texts agree); a
    conversation's optional 4th item gives a turn seeded sampling instead (its last turn)."""
    sid, texts, lens = conv[:3]
    sampling = conv[3] if len(conv) > 3 else [None] * len(texts)
    out, history = [], list(history)
    for text, n, sp in list(zip(texts, lens, sampling))[first:upto]:
        prompt = history + list(ref.tokens(text, bos=not history))
        r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                           temperature=sp["temperature"] if sp else 0,
                                           seed=sp["seed"] if sp else None,
                                           extra_body={"session_id": sid, "ignore_eos": True})
        out.append((prompt, r.choices[0].text))
        history = prompt + gen(ref, prompt, n)["ids"] if not sp else None
    return out


def gen(ref, prompt, n):
    return ref.gen(ids=tuple(prompt), n=n, sampling=("--temp", "0", "--ignore-eos"))


def history_of(ref, turns, lens):
    prompt, _ = turns[-1]
    return prompt + gen(ref, prompt, lens[len(turns) - 1])["ids"]


def rkvctl(srv, *args):
    from conftest import rkv_bin
    r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"), *args],
                       capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


def events(srv):
    db = sqlite3.connect(f"file:{srv.state_dir}/rkv.db?mode=ro", uri=True)
    try:
        return db.execute("SELECT session_id, from_tactic, to_tactic, reason, gpu FROM "
                          "tactic_events ORDER BY id").fetchall()
    finally:
        db.close()


def wait_for(pred, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def single(tiny_model, tmp_path_factory, ref):
    """the same conversations on one worker with room for everything"""
    from conftest import Rkvd, _stop_checked
    srv = Rkvd(tiny_model, tmp_path_factory.mktemp("one"), ONE).start()
    try:
        return {c[0]: converse(srv, ref, c) for c in (KEEP, CONV, MID, SEEDED)}
    finally:
        _stop_checked(srv)


def pinned_on_worker0(srv, ref):
    """worker 1 drained (nothing moves while a worker is drained), the pinned session's ~20
    blocks resident on worker 0"""
    # rkvd serves once one worker is up; nothing moves while another is down
    wait_for(lambda: all(w["up"] for w in json.loads(rkvctl(srv, "--json", "workers"))["workers"]),
             "both workers to be up")
    rkvctl(srv, "workers", "drain", "1")
    keep = converse(srv, ref, KEEP, 0, 1)
    rkvctl(srv, "sessions", "pin", KEEP[0])
    return keep + converse(srv, ref, KEEP, 1, 2, history_of(ref, keep, KEEP[2]))  # kvmgr learns it


def sessions_of(srv):
    return {s["id"]: s for s in json.loads(rkvctl(srv, "--json", "sessions"))["sessions"]}


def spilled(srv, sid):
    return [e for e in events(srv) if e[0] == sid and e[2] in ("window", "cpu_tail")]


def test_session_moves_to_the_idle_gpu_mid_conversation(rkvd_factory, single, ref):
    srv = rkvd_factory(*TWO)
    keep = pinned_on_worker0(srv, ref)
    fox = converse(srv, ref, CONV, 0, 1)
    ev = events(srv)
    assert any(e[2] in ("window", "cpu_tail") for e in ev), f"worker 0 did not spill: {ev}"
    assert srv.metric("rkv:kv_sessions_moved_total") == 0
    sessions = {s["id"]: s for s in json.loads(rkvctl(srv, "--json", "sessions"))["sessions"]}
    assert sessions[KEEP[0]]["worker"] == 0 and sessions[CONV[0]]["worker"] == 0, sessions

    # worker 1 is free again: the conversation's next turn moves there with its KV
    rkvctl(srv, "workers", "drain", "1", "--off")
    pre = (srv.metric("rkv:prompt_tokens_total"), srv.metric("rkv:prefix_cache_hits_total"),
           srv.metric("rkv:prefill_tokens_total"))
    fox += converse(srv, ref, CONV, 1, 2, history_of(ref, fox, CONV[2]))
    assert srv.metric("rkv:kv_sessions_moved_total", from_gpu="0", to_gpu="1") == 1, \
        srv.log()[-3000:]
    # only the turn's new tokens were computed: the moved KV (every position but the last
    # sampled token, which no step has fed yet) was reused
    prompt, hits, prefill = (srv.metric("rkv:prompt_tokens_total") - pre[0],
                             srv.metric("rkv:prefix_cache_hits_total") - pre[1],
                             srv.metric("rkv:prefill_tokens_total") - pre[2])
    assert hits == len(history_of(ref, fox[:1], CONV[2])) - 1, (prompt, hits, prefill)
    assert prefill == prompt - hits
    # and it stays there (hysteresis): a third turn runs on worker 1 without a move
    fox += converse(srv, ref, CONV, 2, 3, history_of(ref, fox, CONV[2]))
    assert srv.metric("rkv:kv_sessions_moved_total") == 1

    # the move is a tactic transition with its reason, on the gpu it went to
    wait_for(lambda: any(e[3].startswith("rebalance") for e in events(srv)), "the move event",
             timeout=15)
    ev = [e for e in events(srv) if e[3].startswith("rebalance")]
    assert len(ev) == 1 and ev[0][4] == 1 and ev[0][2] == "resident", ev
    assert "moved from gpu 0 to gpu 1" in ev[0][3], ev
    assert "moved from gpu 0 to gpu 1" in srv.log()
    sessions = {s["id"]: s for s in json.loads(rkvctl(srv, "--json", "sessions"))["sessions"]}
    assert sessions[KEEP[0]]["worker"] == 0 and sessions[CONV[0]]["worker"] == 1, sessions
    assert ev[0][0] == sessions[CONV[0]]["sid"]
    status = rkvctl(srv, "status")
    assert "sessions per gpu: 0: 1, 1: 1" in status, status
    assert json.loads(rkvctl(srv, "--json", "status"))["sessions_per_gpu"] == [1, 1]

    # the same text as one worker computing everything, and as rkv-gen
    assert keep == single[KEEP[0]]
    assert fox == single[CONV[0]]
    for (prompt, answer), n in list(zip(fox, CONV[2])) + list(zip(keep, KEEP[2])):
        assert answer == gen(ref, prompt, n)["text"], prompt[-8:]


def test_session_moves_in_the_middle_of_a_decode(rkvd_factory, single, ref):
    srv = rkvd_factory(*TWO)
    keep = pinned_on_worker0(srv, ref)
    owl = converse(srv, ref, MID, 0, 1)
    sid = sessions_of(srv)[MID[0]]["sid"]
    assert not spilled(srv, sid), events(srv)  # 4 blocks beside 20: it fits
    # worker 1 is empty and takes sessions, but nothing spills on worker 0: nothing moves
    rkvctl(srv, "workers", "drain", "1", "--off")
    assert srv.metric("rkv:kv_sessions_moved_total") == 0
    # the second turn's decode outgrows worker 0 after ~130 tokens: its KV spills, the planner
    # moves it to worker 1, and the decode goes on there within the same request
    owl += converse(srv, ref, MID, 1, 2, history_of(ref, owl, MID[2]))
    assert srv.metric("rkv:kv_sessions_moved_total", from_gpu="0", to_gpu="1") == 1, \
        srv.log()[-3000:]
    wait_for(lambda: any(e[3].startswith("rebalance") for e in events(srv)), "the move event",
             timeout=15)
    ev = [e for e in events(srv) if e[0] == sid]
    first_spill = next(i for i, e in enumerate(ev) if e[2] in ("window", "cpu_tail"))
    moved = [i for i, e in enumerate(ev) if e[3].startswith("rebalance")]
    assert len(moved) == 1 and moved[0] > first_spill and ev[moved[0]][1] != "parked", ev
    owl += converse(srv, ref, MID, 2, 3, history_of(ref, owl, MID[2]))
    assert srv.metric("rkv:kv_sessions_moved_total") == 1
    assert sessions_of(srv)[MID[0]]["worker"] == 1
    assert keep == single[KEEP[0]]
    assert owl == single[MID[0]]
    for (prompt, answer), n in zip(owl, MID[2]):
        assert answer == gen(ref, prompt, n)["text"], prompt[-8:]


def test_seeded_sampling_survives_a_move(rkvd_factory, single, ref):
    srv = rkvd_factory(*TWO)
    pinned_on_worker0(srv, ref)
    bee = converse(srv, ref, SEEDED, 0, 1)
    rkvctl(srv, "workers", "drain", "1", "--off")
    bee += converse(srv, ref, SEEDED, 1, 2, history_of(ref, bee, SEEDED[2]))
    assert srv.metric("rkv:kv_sessions_moved_total", from_gpu="0", to_gpu="1") == 1, \
        srv.log()[-3000:]
    assert bee == single[SEEDED[0]]
    assert bee[1][1] != gen(ref, bee[1][0], SEEDED[2][1])["text"]  # it did sample
