"""Prefix sharing across sessions through kvmgr: a request whose prompt starts with the tokens
another request already computed maps those full blocks to the same KV blocks (reference
counted, copy-on-write at the first divergent block) and prefills only the rest, with the same
output as computing everything."""
import concurrent.futures as cf

import pytest

openai = pytest.importorskip("openai")

BLOCK = 16
SYSTEM = ("You are a careful assistant. Answer briefly and precisely, cite nothing, and keep "
          "every answer under fifty words. ") * 2


def client(srv):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)


def complete(srv, prompt, n=12):
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                       logprobs=3)
    return r.choices[0].text, r.choices[0].logprobs.token_logprobs, r.usage


def common_prefix(ta, tb):
    """how many leading token ids two tokenizations share"""
    n = 0
    while n < min(len(ta), len(tb)) and ta[n] == tb[n]:
        n += 1
    return n


def complete_both(srv, a, b):
    """a, then b: both answers, and b's prefix-cache hits and prefilled tokens"""
    first = complete(srv, a)
    hits0 = srv.metric("rkv:prefix_cache_hits_total")
    pre0 = srv.metric("rkv:prefill_tokens_total")
    second = complete(srv, b)
    return (first, second, srv.metric("rkv:prefix_cache_hits_total") - hits0,
            srv.metric("rkv:prefill_tokens_total") - pre0)


def test_shared_prefix_is_not_recomputed(rkvd_factory, ref):
    srv = rkvd_factory("--block-size", str(BLOCK))
    a, b = SYSTEM + "Question one: why is the sky blue?", SYSTEM + "Question two: what is rain?"
    n_sys = len(ref.tokens(SYSTEM))
    assert n_sys > 3 * BLOCK, "the shared part must span several blocks"
    first, second, hits, computed = complete_both(srv, a, b)
    n_b = len(ref.tokens(b))
    # every full block inside the common prefix is shared, nothing more
    common = common_prefix(ref.tokens(a), ref.tokens(b))
    assert hits == common // BLOCK * BLOCK, (hits, common)
    assert computed == n_b - hits
    assert second[2].prompt_tokens == n_b
    # the same answer as computing everything (rkv-gen, no sharing)
    want = ref.gen(b, n=12)
    assert second[0] == want["text"]
    assert first[0] == ref.gen(a, n=12)["text"]


def test_concurrent_sharers_agree(rkvd_factory, ref):
    """several requests with one prefix at once: the first to write the blocks wins; every
    answer equals its unshared reference"""
    srv = rkvd_factory("--block-size", str(BLOCK))
    prompts = [SYSTEM + f"Question {i}: name a colour." for i in range(6)]
    complete(srv, prompts[0])  # writes the shared blocks
    with cf.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda p: complete(srv, p)[0], prompts))
    for p, g in zip(prompts, got):
        assert g == ref.gen(p, n=12)["text"], p
    assert srv.metric("rkv:prefix_cache_hits_total") >= 6 * 3 * BLOCK


def test_shared_prefix_longer_than_a_prefill_chunk(rkvd_factory, ref):
    """a prefix found in shared blocks that spans several prompt chunks is skipped whole: the
    session starts after it (it once skipped only the first chunk and recomputed the rest)"""
    chunk = 2 * BLOCK
    srv = rkvd_factory("--block-size", str(BLOCK), "--prefill-chunk", str(chunk))
    a, b = SYSTEM * 3 + "Question one: why?", SYSTEM * 3 + "Question two: what?"
    tb = ref.tokens(b)
    common = common_prefix(ref.tokens(a), tb)
    assert common > 3 * chunk, "the shared part must span several chunks"
    first, second, hits, computed = complete_both(srv, a, b)
    assert hits == common // BLOCK * BLOCK, (hits, common)
    assert computed == len(tb) - hits
    assert second[0] == ref.gen(b, n=12)["text"]
    assert first[0] == ref.gen(a, n=12)["text"]
    # the same prompt again: everything but its last block's tail comes from the cache
    hits0 = srv.metric("rkv:prefix_cache_hits_total")
    third = complete(srv, b)
    assert srv.metric("rkv:prefix_cache_hits_total") - hits0 == (len(tb) - 1) // BLOCK * BLOCK
    assert third[0] == second[0] and third[1] == pytest.approx(second[1], abs=1e-5)


def test_a_turn_that_diverges_does_not_change_a_shared_block(rkvd_factory, ref):
    """a named session's next turn that diverges after its old prompt rewrites the positions
    after it: the full block there was published (its tokens known and written), so it must be
    dropped, not overwritten in place, or another session that maps it by hash gets the new
    turn's KV (kvmgr once cut the session back only to the end of the step)"""
    srv = rkvd_factory("--block-size", str(BLOCK))
    c = client(srv)
    p = [(i * 37) % 400 + 5 for i in range(2 * BLOCK)]  # two full blocks
    extra = {"session_id": "diverge", "ignore_eos": True}
    r1 = c.completions.create(model="tiny", prompt=p, max_tokens=BLOCK + 4, temperature=0,
                              extra_body=extra)
    first = ref.gen(ids=tuple(p), n=BLOCK + 4)
    assert r1.choices[0].text == first["text"]
    x16 = list(first["ids"][:BLOCK])  # the turn's first generated block
    # the next turn: the same start, then other tokens where the answer was
    y = [(i * 53) % 400 + 7 for i in range(BLOCK)]
    c.completions.create(model="tiny", prompt=p + y, max_tokens=2, temperature=0,
                         extra_body=extra)
    # another session whose prompt is the first turn's text maps its third block by hash
    probe = p + x16 + [11, 12, 13]
    hits0 = srv.metric("rkv:prefix_cache_hits_total")
    r = c.completions.create(model="tiny", prompt=probe, max_tokens=8, temperature=0,
                             logprobs=1)
    want = ref.gen(ids=tuple(probe), n=8)
    assert r.choices[0].text == want["text"]
    # it did reuse the prompt's own blocks (the first two at least)
    assert srv.metric("rkv:prefix_cache_hits_total") - hits0 >= 2 * BLOCK


def test_a_session_whose_kv_was_dropped_continues_right(rkvd_factory, ref):
    """an idle named session whose KV the plan drops for room (device and host full) continues
    with the uninterrupted answer: kvmgr tells rkvd its KV is gone and the history is prefilled
    again (it once opened fresh blocks for the old positions, which read as its KV: other
    sessions' KV, or garbage)"""
    # 6 + 6 blocks of 16 positions; a step's chunk must fit the device
    srv = rkvd_factory("--block-size", str(BLOCK), "--vram-target", "48KiB", "--host-budget",
                       "48KiB", "--prefill-chunk", "32", "--max-batch-tokens", "64")
    c = client(srv)
    extra = {"session_id": "dropped", "ignore_eos": True}
    a = [(i * 29) % 400 + 5 for i in range(40)]
    r1 = c.completions.create(model="tiny", prompt=a, max_tokens=8, temperature=0,
                              extra_body=extra)
    first = ref.gen(ids=tuple(a), n=8)
    assert r1.choices[0].text == first["text"]
    # another session takes every block: the idle one's KV is dropped, not just moved
    b = [(i * 31) % 400 + 3 for i in range(150)]
    r = c.completions.create(model="tiny", prompt=b, max_tokens=8, temperature=0,
                             extra_body={"session_id": "big", "ignore_eos": True})
    assert r.choices[0].text == ref.gen(ids=tuple(b), n=8)["text"]
    # the conversation's next turn
    a2 = a + list(first["ids"]) + [7, 8, 9]
    r2 = c.completions.create(model="tiny", prompt=a2, max_tokens=8, temperature=0,
                              extra_body=extra)
    assert r2.choices[0].text == ref.gen(ids=tuple(a2), n=8)["text"]
    assert "its kv was dropped for room" in srv.log()
