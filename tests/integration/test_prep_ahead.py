"""prep_ahead: while a decode step runs, rkvd asks kvmgr for the block tables of the next
step (every sequence one token on, PROTO_KV_AHEAD), so KV_PREP leaves the critical path. The
output must not change, the tables must really be used, and the tokens those steps add must
still become shareable by prefix (kvmgr learns their ids one step later)."""
import concurrent.futures as cf

import pytest

openai = pytest.importorskip("openai")

BLOCK = 16
PROMPTS = [f"Stream {i}: a long walk along the {w} river, told one step at a time."
           for i, w in enumerate(["north", "south", "east", "west"])]


def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)


def run(srv, prompt, n, session=None):
    """greedy with log-probabilities: (tokens, [(logprob, {alt: logprob})])"""
    extra = {"session_id": session} if session else {}
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                       logprobs=3, extra_body={"ignore_eos": True, **extra})
    lp = r.choices[0].logprobs
    return lp.tokens, list(zip(lp.token_logprobs, lp.top_logprobs))


def assert_same(got, want, what):
    assert got[0] == want[0], f"{what}: tokens differ"
    for i, ((lg, tg), (lw, tw)) in enumerate(zip(got[1], want[1])):
        assert tg.keys() == tw.keys(), f"{what}: token {i}: alternatives differ"
        for k in tw:
            assert abs(tg[k] - tw[k]) <= 1e-5 * max(1.0, abs(tw[k])), f"{what}: token {i}"
        assert abs(lg - lw) <= 1e-5 * max(1.0, abs(lw)), f"{what}: token {i}"


def workload(srv):
    """four concurrent streams (two named, with a second turn), then one alone"""
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        futs = [ex.submit(run, srv, p, 40 + 8 * i, f"s{i}" if i < 2 else None)
                for i, p in enumerate(PROMPTS)]
        out = [f.result() for f in futs]
    out.append(run(srv, PROMPTS[0], 24, "s0"))  # the next turn of a named session
    out.append(run(srv, PROMPTS[3], 70))
    return out


def test_same_output_with_and_without_and_the_tables_are_used(rkvd_factory):
    on = rkvd_factory("--block-size", str(BLOCK))
    got_on = workload(on)
    used = on.metric("rkv:kv_prep_ahead_steps_total")
    gen = on.metric("rkv:generation_tokens_total")
    # the last step of each burst and the steps after a stream joined or left cannot use
    # them; every other decode step does
    assert used >= 0.5 * 70, f"{used} of the steps used tables asked for ahead ({gen} tokens)"
    off = rkvd_factory("--block-size", str(BLOCK), "--prep-ahead", "false")
    got_off = workload(off)
    assert off.metric("rkv:kv_prep_ahead_steps_total") == 0
    for i, (a, b) in enumerate(zip(got_on, got_off)):
        assert_same(a, b, f"request {i}")


def test_generated_tokens_stay_shareable(rkvd_factory, ref):
    """a request whose prompt is an earlier request's prompt and answer (as token ids) finds
    every full block of it: the ids of the positions added ahead reached kvmgr"""
    hits = {}
    for mode in ("true", "false"):
        srv = rkvd_factory("--block-size", str(BLOCK), "--prep-ahead", mode)
        ids = list(ref.tokens(PROMPTS[1]))
        n = 50
        answer = ref.gen(ids=tuple(ids), n=n, sampling=("--temp", "0", "--ignore-eos"))["ids"]
        assert len(answer) == n
        r = client(srv).completions.create(model="tiny", prompt=ids, max_tokens=n,
                                           temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == n
        h0 = srv.metric("rkv:prefix_cache_hits_total")
        follow = ids + answer + ids[1:6]
        client(srv).completions.create(model="tiny", prompt=follow, max_tokens=2,
                                       temperature=0)
        hits[mode] = srv.metric("rkv:prefix_cache_hits_total") - h0
        # the first request's kv covers its prompt and all but its last answer token
        assert hits[mode] == (len(ids) + n - 1) // BLOCK * BLOCK, (mode, hits[mode])
    assert hits["true"] == hits["false"]
