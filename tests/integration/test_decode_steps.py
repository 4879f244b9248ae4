"""decode_steps: when every running sequence decodes without asking for top alternatives and
nothing waits, one request to the worker runs several decode steps (each feeding the token the
one before sampled), so the round trip through rkvd, kvmgr and the IPC is paid once per several
tokens. The text, the log-probabilities, stop strings, max_tokens, seeded sampling and sessions
must come out exactly as with one step per request, the steps must really run, and the ids the
later steps picked must reach kvmgr (the blocks they fill become shareable by prefix)."""
import concurrent.futures as cf

import pytest

pytest.importorskip("openai")

# the same prompts, block size and client as prep_ahead's tests
from test_prep_ahead import BLOCK, PROMPTS, client  # noqa: E402


def run(srv, prompt, n, session=None, logprobs=False, stop=None, ignore_eos=True):
    """greedy: (text, finish_reason, completion tokens, token logprobs or None)"""
    extra = {"ignore_eos": ignore_eos}
    if session:
        extra["session_id"] = session
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                       logprobs=0 if logprobs else None, stop=stop,
                                       extra_body=extra)
    c = r.choices[0]
    lps = c.logprobs.token_logprobs if logprobs else None
    return c.text, c.finish_reason, r.usage.completion_tokens, lps


def streamed(srv, prompt, n):
    """the same, streamed: the chunks' text joined"""
    s = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    return "".join(ch.choices[0].text for ch in s if ch.choices)


def workload(srv, stop):
    """concurrent streams of lengths that are no multiple of the steps (two named, with a
    second turn), then alone: 1 and 2 tokens, log-probabilities, a stop string, a stream"""
    lens = [13, 21, 37, 50]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        futs = [ex.submit(run, srv, p, lens[i], f"s{i}" if i < 2 else None)
                for i, p in enumerate(PROMPTS)]
        out = [f.result() for f in futs]
    out.append(run(srv, PROMPTS[0] + " And then?", 19, "s0"))  # the next turn of s0
    out.append(run(srv, PROMPTS[1] + " Go on.", 11, "s1"))
    out.append(run(srv, PROMPTS[2], 1))
    out.append(run(srv, PROMPTS[2], 2))
    out.append(run(srv, PROMPTS[3], 30, logprobs=True))
    out.append(run(srv, PROMPTS[3], 60, stop=[stop]))
    out.append(run(srv, PROMPTS[1], 45, ignore_eos=False))
    out.append(streamed(srv, PROMPTS[0], 33))
    return out


def test_same_output_as_one_step_per_request(rkvd_factory):
    one = rkvd_factory("--block-size", str(BLOCK), "--decode-steps", "1")
    # a stop string from the middle of what the model says, so it cuts a run of steps
    text = run(one, PROMPTS[3], 60)[0]
    assert len(text) > 40, text
    stop = text[25:29]
    got_one = workload(one, stop)
    assert one.metric("rkv:decode_steps_extra_total") == 0
    many = rkvd_factory("--block-size", str(BLOCK))  # the default: up to 8
    got_many = workload(many, stop)
    extra = many.metric("rkv:decode_steps_extra_total")
    gen = many.metric("rkv:generation_tokens_total")
    # most tokens come from the later steps: everything here is greedy
    assert extra >= 0.5 * gen, f"{extra} of {gen} tokens from later decode steps"
    for i, (a, b) in enumerate(zip(got_many, got_one)):
        if isinstance(b, str):
            assert a == b, f"request {i} (streamed): text differs"
            continue
        assert a[:3] == b[:3], f"request {i}: text, finish reason or token count differ"
        if b[3] is not None:
            assert len(a[3]) == len(b[3])
            for k, (x, y) in enumerate(zip(a[3], b[3])):
                assert abs(x - y) <= 1e-5 * max(1.0, abs(y)), f"request {i}: logprob {k}"
    # the stop string really cut a run short, the 1 and 2 token requests stopped at their max
    assert got_many[9][1] == "stop" and stop not in got_many[9][0]
    assert got_many[6][1:3] == ("length", 1) and got_many[7][1:3] == ("length", 2)


def sampled(srv, prompt, n, **kw):
    r = client(srv).completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                       extra_body={"ignore_eos": True}, **kw)
    return r.choices[0].text, r.usage.completion_tokens


def test_sampled_requests_run_several_steps_with_the_same_draws(rkvd_factory):
    """a seeded request that samples (temperature, top_p, a penalty) runs several steps per
    request too, the sampler's draws in the same order: the same text as one step per request.
    A request that asks for top alternatives keeps one step per request"""
    one = rkvd_factory("--block-size", str(BLOCK), "--decode-steps", "1")
    many = rkvd_factory("--block-size", str(BLOCK))
    kinds = [dict(temperature=0.8, seed=7), dict(temperature=1.2, top_p=0.9, seed=11),
             dict(temperature=0.7, seed=3, presence_penalty=0.5)]
    for i, kw in enumerate(kinds):
        a, b = sampled(many, PROMPTS[i], 37, **kw), sampled(one, PROMPTS[i], 37, **kw)
        assert a == b, f"sampling {kw}: {a!r} vs {b!r}"
    assert many.metric("rkv:decode_steps_extra_total") >= 0.5 * 3 * 37
    before = many.metric("rkv:decode_steps_extra_total")
    r = client(many).completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=20,
                                        temperature=0, logprobs=2,
                                        extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 20
    assert many.metric("rkv:decode_steps_extra_total") == before


def test_tokens_of_later_steps_stay_shareable(rkvd_factory, ref):
    """a request whose prompt is an earlier request's prompt and answer (as token ids) finds
    every full block of it: kvmgr learned the ids the later decode steps picked"""
    srv = rkvd_factory("--block-size", str(BLOCK), "--prep-ahead", "false")
    ids = list(ref.tokens(PROMPTS[2]))
    n = 50
    answer = ref.gen(ids=tuple(ids), n=n, sampling=("--temp", "0", "--ignore-eos"))["ids"]
    r = client(srv).completions.create(model="tiny", prompt=ids, max_tokens=n, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == n
    assert srv.metric("rkv:decode_steps_extra_total") > 0
    h0 = srv.metric("rkv:prefix_cache_hits_total")
    follow = ids + answer + ids[1:6]
    r = client(srv).completions.create(model="tiny", prompt=follow, max_tokens=2, temperature=0)
    hits = srv.metric("rkv:prefix_cache_hits_total") - h0
    # the first request's kv covers its prompt and all but its last answer token
    assert hits == (len(ids) + n - 1) // BLOCK * BLOCK, hits


def test_tables_asked_ahead_serve_the_next_run(rkvd_factory):
    """while a run of decode steps works, kvmgr places the next run's positions (prep_ahead):
    a lone greedy stream uses those tables for most of its runs, and says the same"""
    srv = rkvd_factory("--block-size", str(BLOCK))
    off = rkvd_factory("--block-size", str(BLOCK), "--prep-ahead", "false")
    got = [run(x, PROMPTS[0], 100) for x in (srv, off)]
    assert got[0] == got[1]
    runs = srv.metric("rkv:decode_steps_extra_total") / 7  # runs of 8 steps, about
    used = srv.metric("rkv:kv_prep_ahead_steps_total")
    assert runs >= 10 and used >= 0.6 * runs, f"{used} runs used tables asked ahead of ~{runs}"
    assert off.metric("rkv:kv_prep_ahead_steps_total") == 0


def test_host_split_reaches_the_worker(rkvd_factory):
    """rkvd's host_split goes to every worker's command line (a cpu worker has no host reads to
    split: it starts and serves as before)"""
    from conftest import _proc_cmdline
    srv = rkvd_factory("--block-size", str(BLOCK), "--host-split", "35")
    args = _proc_cmdline(srv.child_pid("rkv-worker"))
    assert args[args.index(b"--host-split") + 1] == b"35", args
    assert run(srv, PROMPTS[0], 4)[2] == 4


def test_deterministic_flag_reaches_the_worker_and_outputs_hold(rkvd_factory):
    """--deterministic true reaches the worker (its log says so) and a request's tokens are the
    same alone, crowded by other streams, and after its prompt went through the prefix cache
    (the cpu backend is batch-invariant either way; make gpu-test checks the cuda kernels bit for
    bit)"""
    srv = rkvd_factory("--block-size", str(BLOCK), "--deterministic", "true")
    assert "deterministic: batch-invariant kernels" in srv.log()
    from test_rkvctl import ok  # noqa: E402 - rkvctl against this server
    assert ok(srv, "status")["deterministic"] is True
    alone = run(srv, PROMPTS[3], 40, logprobs=True)
    with cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        futs = [ex.submit(run, srv, p, 40, None, True) for p in PROMPTS]
        crowded = [f.result() for f in futs]
    assert crowded[3][:3] == alone[:3]
    assert crowded[3][3] == alone[3]  # the same log-probabilities, bit for bit
    assert run(srv, PROMPTS[3], 40, logprobs=True) == alone  # the prompt is cached by now
