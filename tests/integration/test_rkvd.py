"""rkvd end to end on the CPU backend with the tiny model, through the official openai client:
greedy output equals rkv-gen's, usage counts, 64 concurrent streams, multi-turn session reuse
measured by /metrics, and /metrics itself."""
import asyncio
import json

import pytest

openai = pytest.importorskip("openai")

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog",
    "def fibonacci(n):",
    "In 1969, the first humans",
    "Hello",
    "Straße, café, naïve: 日本語",
]
N = 12


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60, **kw)


def aclient(srv):
    return openai.AsyncOpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)


def expect_usage(usage, n_prompt, ref_out):
    # rkv-gen leaves the end-of-generation token out of its ids; usage counts it
    n_gen = len(ref_out["ids"]) + (1 if ref_out["finish_reason"] == "stop" else 0)
    assert usage.prompt_tokens == n_prompt
    assert usage.completion_tokens == n_gen
    assert usage.total_tokens == n_prompt + n_gen


# --- 1. the openai client ------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_equals_rkv_gen(rkvd, ref, prompt):
    want = ref.gen(prompt, n=N)
    r = client(rkvd).completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0)
    assert r.object == "text_completion"
    assert r.model == "tiny"
    assert r.choices[0].text == want["text"]
    assert r.choices[0].finish_reason == want["finish_reason"]
    expect_usage(r.usage, len(ref.tokens(prompt)), want)


def test_step_sizes_follow_the_backend_unless_set(rkvd, rkvd_factory, ref):
    """a cpu worker steps 512 tokens and prompt chunks of 256 by default (a gpu one 2048 and
    2048: the worker's hello says which); a step size set caps the chunk too, and a prompt over
    many steps still gives rkv-gen's text"""
    rkvd.wait_log("worker 0 is up (cpu): steps of up to 512 tokens, prompt chunks of 256")
    srv = rkvd_factory("--max-batch-tokens", "8", "--max-running", "4")
    srv.wait_log("worker 0 is up (cpu): steps of up to 8 tokens, prompt chunks of 8")
    prompt = PROMPTS[1] + " " + PROMPTS[3]
    assert len(ref.tokens(prompt)) > 16
    want = ref.gen(prompt, n=N)
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0)
    assert r.choices[0].text == want["text"]
    small = rkvd_factory("--max-batch-tokens", "64", "--prefill-chunk", "500")
    small.wait_log("worker 0 is up (cpu): steps of up to 64 tokens, prompt chunks of 64")


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_completion_stream_equals_rkv_gen(rkvd, ref, prompt):
    want = ref.gen(prompt, n=N)
    stream = client(rkvd).completions.create(model="tiny", prompt=prompt, max_tokens=N,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == want["text"]
    assert finish == want["finish_reason"]
    expect_usage(usage, len(ref.tokens(prompt)), want)


def test_completion_token_ids_prompt(rkvd, ref):
    ids = list(ref.tokens(PROMPTS[1]))
    want = ref.gen(ids=tuple(ids), n=N)
    r = client(rkvd).completions.create(model="tiny", prompt=ids, max_tokens=N, temperature=0)
    assert r.choices[0].text == want["text"]
    expect_usage(r.usage, len(ids), want)


CHATS = [
    [{"role": "user", "content": "Tell me a story about a fox."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_equals_rkv_gen(rkvd, ref, messages):
    ids = ref.chat_ids(json.dumps(messages))
    want = ref.gen(ids=ids, n=N)
    c = client(rkvd)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=N, temperature=0)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert msg.content == want["text"]
    assert r.choices[0].finish_reason == want["finish_reason"]
    expect_usage(r.usage, len(ids), want)

    stream = c.chat.completions.create(model="tiny", messages=messages, max_tokens=N,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    text, roles, finish, usage = "", [], None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices:
            d = chunk.choices[0].delta
            if d.role:
                roles.append(d.role)
            text += d.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert roles == ["assistant"]
    assert text == want["text"]
    assert finish == want["finish_reason"]
    expect_usage(usage, len(ids), want)


def test_models_and_health(rkvd):
    models = client(rkvd).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    st, _, body = rkvd.request("GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}


def test_logprobs_match_text(rkvd, ref):
    want = ref.gen(PROMPTS[0], n=N)
    r = client(rkvd).completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=N,
                                        temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(want["ids"])
    assert len(lp.top_logprobs) == len(want["ids"])
    for t, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0
        # greedy: the sampled token is the most likely one
        assert max(top.values()) == pytest.approx(l, abs=1e-5)


SAMPLING = [
    ({"temperature": 1.0, "seed": 42}, ("--temp", "1", "--seed", "42")),
    ({"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7},
     ("--temp", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7")),
    ({"temperature": 0.7, "min_p": 0.05, "seed": 3},
     ("--temp", "0.7", "--min-p", "0.05", "--seed", "3")),
    ({"temperature": 0, "presence_penalty": 1.0, "frequency_penalty": 0.5},
     ("--temp", "0", "--presence-penalty", "1.0", "--frequency-penalty", "0.5")),
    ({"temperature": 0, "repetition_penalty": 1.3}, ("--temp", "0", "--repeat-penalty", "1.3")),
]


@pytest.mark.parametrize("kw,flags", SAMPLING, ids=[str(k) for k, _ in SAMPLING])
def test_sampling_equals_rkv_gen(rkvd, ref, kw, flags):
    want = ref.gen(PROMPTS[0], n=20, sampling=flags)
    c = client(rkvd)
    for _ in range(2):  # seeded: the same every time
        # top_k, min_p and repetition_penalty are not in the client's signature
        r = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=20,
                                 extra_body=kw)
        assert r.choices[0].text == want["text"]


def test_stop_strings_cut_like_rkv_gen(rkvd, ref):
    full = ref.gen(PROMPTS[0], n=20)["text"]
    c = client(rkvd)
    # pieces of the greedy answer: inside a token, across tokens, a control byte
    for stop in (full[1:3], full[4:7], full[-5:-3], "\x11", "never in the answer"):
        r = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=20,
                                 temperature=0, stop=[stop])
        ch = r.choices[0]
        if stop in full:
            assert ch.text == full[:full.index(stop)], stop
            assert ch.finish_reason == "stop"
        else:
            assert ch.text == full and ch.finish_reason == "length"
        # streamed: the same text, never a piece of the stop string
        text = "".join(k.choices[0].text for k in c.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop],
            stream=True))
        assert text == ch.text


@pytest.mark.parametrize("n_prompt", [2040, 2047])
def test_generation_stops_at_the_context_end(rkvd, ref, n_prompt):
    ids = [507] + [(i * 7) % 500 + 1 for i in range(n_prompt - 1)]
    r = client(rkvd).completions.create(model="tiny", prompt=ids, max_tokens=100,
                                        temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 2048 - n_prompt
    assert r.choices[0].text == ref.gen(ids=tuple(ids), n=2048 - n_prompt,
                                        sampling=("--temp", "0", "--ignore-eos"))["text"]


# --- 2. concurrency -------------------------------------------------------------------

WORDS = ("the quick brown fox jumps over a lazy dog while we are reading code and numbers "
         "in many languages it is what tokenizers see every day").split()


def many_prompts(n):
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 9)) + f" {i}"
            for i in range(n)]


def test_64_concurrent_streams_equal_solo(rkvd, ref):
    prompts = many_prompts(64)
    c = client(rkvd)
    solo = []
    for p in prompts:
        r = c.completions.create(model="tiny", prompt=p, max_tokens=N, temperature=0)
        solo.append((r.choices[0].text, r.choices[0].finish_reason))
    # solo answers are rkv-gen's (spot-checked: rkv-gen is a process per prompt)
    for i in (0, 31, 63):
        want = ref.gen(prompts[i], n=N)
        assert solo[i] == (want["text"], want["finish_reason"])

    async def one(ac, p):
        stream = await ac.completions.create(model="tiny", prompt=p, max_tokens=N,
                                             temperature=0, stream=True)
        text, finish = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_of_them():
        ac = aclient(rkvd)
        try:
            return await asyncio.gather(*(one(ac, p) for p in prompts))
        finally:
            await ac.close()

    got = asyncio.run(all_of_them())
    for i, (g, s) in enumerate(zip(got, solo)):
        assert g == s, f"stream {i} ({prompts[i]!r})"


def test_64_streams_over_two_workers_equal_solo(rkvd, rkvd_factory):
    prompts = many_prompts(64)
    c = client(rkvd)
    solo = [c.completions.create(model="tiny", prompt=p, max_tokens=N,
                                 temperature=0).choices[0].text for p in prompts]
    two = rkvd_factory("--workers", "2", "--threads", "1")
    two.wait_log("worker 1 is up")

    async def one(ac, p):
        stream = await ac.completions.create(model="tiny", prompt=p, max_tokens=N,
                                             temperature=0, stream=True)
        return "".join([chunk.choices[0].text async for chunk in stream])

    async def all_of_them():
        ac = aclient(two)
        try:
            return await asyncio.gather(*(one(ac, p) for p in prompts))
        finally:
            await ac.close()

    assert asyncio.run(all_of_them()) == solo


# --- 3. multi-turn session reuse -------------------------------------------------------


def test_second_turn_prefills_only_new_tokens(rkvd, ref):
    c = client(rkvd)
    p1 = list(ref.tokens("The first turn of a conversation about foxes and dogs"))
    a1 = ref.gen(ids=tuple(p1), n=8)
    assert a1["finish_reason"] == "length"  # the answer's tokens are then all in the history
    r1 = c.completions.create(model="tiny", prompt=p1, max_tokens=8, temperature=0,
                              extra_body={"session_id": "conv-1"})
    assert r1.choices[0].text == a1["text"]

    new = list(ref.tokens(" and now the second turn asks more", bos=False))
    p2 = p1 + a1["ids"] + new
    hits0 = rkvd.metric("rkv:prefix_cache_hits_total")
    pre0 = rkvd.metric("rkv:prefill_tokens_total")
    r2 = c.completions.create(model="tiny", prompt=p2, max_tokens=8, temperature=0,
                              extra_body={"session_id": "conv-1"})
    hits = rkvd.metric("rkv:prefix_cache_hits_total") - hits0
    pre = rkvd.metric("rkv:prefill_tokens_total") - pre0
    # the last answer token was sampled but never run through the model: it is the
    # only old token that needs computing
    assert hits == len(p1) + len(a1["ids"]) - 1
    assert pre == len(new) + 1
    assert r2.usage.prompt_tokens == len(p2)

    # same answer as a fresh request without the session
    want = ref.gen(ids=tuple(p2), n=8)
    assert r2.choices[0].text == want["text"]
    r3 = c.completions.create(model="tiny", prompt=p2, max_tokens=8, temperature=0)
    assert r3.choices[0].text == want["text"]


def test_session_turn_uses_its_own_sampling(rkvd, ref):
    """a session's next turn samples with that request's parameters, not the last one's"""
    c = client(rkvd)
    p1 = list(ref.tokens("A session that changes its sampling"))
    a1 = ref.gen(ids=tuple(p1), n=8)
    c.completions.create(model="tiny", prompt=p1, max_tokens=8, temperature=0,
                         extra_body={"session_id": "resample"})
    p2 = p1 + a1["ids"] + list(ref.tokens(" next", bos=False))
    want = ref.gen(ids=tuple(p2), n=12, sampling=("--temp", "1", "--seed", "5"))
    r = c.completions.create(model="tiny", prompt=p2, max_tokens=12, temperature=1.0, seed=5,
                             extra_body={"session_id": "resample"})
    assert r.choices[0].text == want["text"]
    fresh = c.completions.create(model="tiny", prompt=p2, max_tokens=12, temperature=1.0,
                                 seed=5)
    assert fresh.choices[0].text == want["text"]


def test_chat_second_turn_reuses_the_rendered_conversation(rkvd, ref):
    c = client(rkvd)
    m1 = [{"role": "user", "content": "Tell me about foxes."}]
    ids1 = ref.chat_ids(json.dumps(m1))
    a1 = ref.gen(ids=ids1, n=8)
    r1 = c.chat.completions.create(model="tiny", messages=m1, max_tokens=8, temperature=0,
                                   extra_body={"session_id": "chat-1"})
    assert r1.choices[0].message.content == a1["text"]
    m2 = m1 + [{"role": "assistant", "content": a1["text"]},
               {"role": "user", "content": "And dogs?"}]
    ids2 = ref.chat_ids(json.dumps(m2))
    # what the session holds: the first prompt, the answer (KV for all but its last token)
    held = list(ids1) + a1["ids"]
    lcp = 0
    while lcp < min(len(held) - 1, len(ids2)) and held[lcp] == ids2[lcp]:
        lcp += 1
    assert lcp >= len(ids1)  # at least the whole first prompt
    hits0 = rkvd.metric("rkv:prefix_cache_hits_total")
    r2 = c.chat.completions.create(model="tiny", messages=m2, max_tokens=8, temperature=0,
                                   extra_body={"session_id": "chat-1"})
    assert rkvd.metric("rkv:prefix_cache_hits_total") - hits0 == lcp
    assert r2.usage.prompt_tokens == len(ids2)
    assert r2.usage.prompt_tokens_details.cached_tokens == lcp
    assert r2.choices[0].message.content == ref.gen(ids=ids2, n=8)["text"]


def test_counters_add_up(rkvd, ref):
    """prompt, generation and success counters move by exactly what the requests did"""
    names = ("rkv:prompt_tokens_total", "rkv:generation_tokens_total")
    before = [rkvd.metric(n) for n in names]
    ok0 = rkvd.metric("rkv:request_success_total", finished_reason="length")
    c = client(rkvd)
    n_prompt = n_gen = 0
    for p in PROMPTS[:3]:
        r = c.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0,
                                 extra_body={"ignore_eos": True})
        n_prompt += r.usage.prompt_tokens
        n_gen += r.usage.completion_tokens
        assert r.usage.prompt_tokens == len(ref.tokens(p)) and r.usage.completion_tokens == 5
    after = [rkvd.metric(n) for n in names]
    assert after[0] - before[0] == n_prompt
    assert after[1] - before[1] == n_gen
    assert rkvd.metric("rkv:request_success_total", finished_reason="length") - ok0 == 3
    assert rkvd.metric("rkv:num_requests_running") == 0
    assert rkvd.metric("rkv:num_requests_waiting") == 0


def test_session_header_reuses_kv(rkvd, ref):
    c = client(rkvd, default_headers={"X-Session-Id": "hdr-conv"})
    p1 = list(ref.tokens("A header session starts here"))
    a1 = ref.gen(ids=tuple(p1), n=6)
    c.completions.create(model="tiny", prompt=p1, max_tokens=6, temperature=0)
    p2 = p1 + a1["ids"] + list(ref.tokens(" next", bos=False))
    hits0 = rkvd.metric("rkv:prefix_cache_hits_total")
    r2 = c.completions.create(model="tiny", prompt=p2, max_tokens=6, temperature=0)
    assert rkvd.metric("rkv:prefix_cache_hits_total") - hits0 == len(p1) + len(a1["ids"]) - 1
    assert r2.choices[0].text == ref.gen(ids=tuple(p2), n=6)["text"]


# --- 7. /metrics -----------------------------------------------------------------------


def test_metrics_parse_with_prometheus_client(rkvd):
    from prometheus_client.parser import text_string_to_metric_families
    # something to count
    client(rkvd).completions.create(model="tiny", prompt="count me", max_tokens=4,
                                    temperature=0)
    fams = {f.name: f for f in text_string_to_metric_families(rkvd.metrics_text())}
    want = {
        "rkv:num_requests_running": "gauge",
        "rkv:num_requests_waiting": "gauge",
        "rkv:prompt_tokens": "counter",
        "rkv:generation_tokens": "counter",
        "rkv:prefill_tokens": "counter",
        "rkv:prefix_cache_hits": "counter",
        "rkv:prefix_cache_queries": "counter",
        "rkv:request_success": "counter",
        "rkv:time_to_first_token_seconds": "histogram",
        "rkv:inter_token_latency_seconds": "histogram",
        "rkv:e2e_request_latency_seconds": "histogram",
        "rkv:request_queue_time_seconds": "histogram",
        "rkv:iteration_tokens_total": "histogram",
        "rkv:kv_cache_bytes": "gauge",
        "rkv:healthy": "gauge",
    }
    for name, typ in want.items():
        assert name in fams, f"/metrics lacks {name}; has {sorted(fams)}"
        assert fams[name].type == typ, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in fams.values() for s in f.samples}
    assert samples[("rkv:healthy", ())] == 1
    gen = [v for (n, _), v in samples.items() if n == "rkv:generation_tokens_total"]
    assert gen and gen[0] >= 4
    e2e = [v for (n, l), v in samples.items()
           if n == "rkv:e2e_request_latency_seconds_bucket" and dict(l).get("le") == "+Inf"]
    cnt = [v for (n, _), v in samples.items() if n == "rkv:e2e_request_latency_seconds_count"]
    assert e2e and e2e == cnt and cnt[0] >= 1
