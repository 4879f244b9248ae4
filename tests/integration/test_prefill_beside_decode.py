"""A step that carries a decoding sequence takes at most prefill_beside_decode prompt tokens, so
a stream decoding beside a long prompt gets a token every short step instead of waiting for the
whole prompt: counted as the stream's tokens that arrive while the prompt prefills (each
prefill step gives the decoding stream exactly one token; --decode-steps 1 keeps the steps
before the prompt's admission at one token each too)."""
import threading
import time

import pytest

openai = pytest.importorskip("openai")

PROMPT = "the quick brown fox jumps over the lazy dog " * 48  # ~1000 tokens of the tiny model


def decoder_tokens_while_prefilling(srv):
    """tokens a decoding stream got between another request's send and its first token, and
    that request's text"""
    c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=60)
    stamps, started, stop, errors = [], threading.Event(), threading.Event(), []

    def decode():
        try:
            decode_stream()
        except Exception as e:  # noqa: BLE001 - judged by the test
            errors.append(e)
            started.set()

    def decode_stream():
        s = c.completions.create(model="tiny", prompt="a stream that decodes", max_tokens=2048,
                                 stream=True, temperature=0, extra_body={"ignore_eos": True})
        for chunk in s:
            stamps.append(time.monotonic())
            if len(stamps) >= 8:
                started.set()
            if stop.is_set():
                s.close()
                break

    t = threading.Thread(target=decode, daemon=True)
    t.start()
    assert started.wait(30) and not errors, f"the decoding stream gave no tokens: {errors}"
    t0 = time.monotonic()
    s = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, stream=True,
                             temperature=0, extra_body={"ignore_eos": True})
    t1, text = None, ""
    for chunk in s:
        t1 = t1 or time.monotonic()
        text += chunk.choices[0].text
    stop.set()
    t.join(30)
    assert t1 is not None and not t.is_alive() and not errors, errors
    assert stamps[-1] > t1, "the decoding stream finished before the prompt's first token"
    return sum(t0 < x < t1 for x in stamps), text


def steps_of(srv, above, upto="+Inf"):
    """engine steps (rkv:iteration_tokens_total) that computed more than `above` tokens, and at
    most `upto` (bucket bounds), from one scrape (the server steps on between two)"""
    le = {}
    for labels, v in srv.samples("rkv:iteration_tokens_total_bucket"):
        le[labels["le"]] = le.get(labels["le"], 0.0) + v
    assert above in le and upto in le, f"no bucket {above} or {upto}: {sorted(le)}"
    return le[upto] - le[above]


def test_long_prompt_goes_in_short_steps_beside_a_decode(rkvd_factory):
    small = rkvd_factory("--max-batch-tokens", "512", "--prefill-chunk", "512",
                         "--prefill-beside-decode", "32", "--decode-steps", "1")
    w = small.ctl("status")["workers"][0]
    assert (w["max_batch_tokens"], w["prefill_chunk"], w["prefill_beside_decode"]) == (512, 512, 32)
    n_small, text_small = decoder_tokens_while_prefilling(small)
    # ~1000 prompt tokens in steps of 32: ~30 steps, each with one token of the stream (one
    # decode step a request: the stream's tokens come one a step; measured 35-40; a slow
    # request path before the prompt's admission only adds tokens)
    assert n_small >= 12, f"{n_small} tokens of the decoding stream while the prompt prefilled"
    # what the server ran, counted by its step histogram: every step beside the stream took at
    # most 32 prompt tokens and its one decode token, and the prompt needed ~30 of them
    assert steps_of(small, "64") == 0, "a step took more prompt tokens than 32 beside a decode"
    assert steps_of(small, "32", "64") >= 20, steps_of(small, "32", "64")
    whole = rkvd_factory("--max-batch-tokens", "512", "--prefill-chunk", "512",
                         "--prefill-beside-decode", "512", "--decode-steps", "1")
    _, text_whole = decoder_tokens_while_prefilling(whole)
    # the whole prompt in chunks of 512 beside the same stream: one or two long steps, none of
    # the short ones (the stream's token count in that window is timing: the request's path
    # before its admission, 5-10 tokens on an idle machine, 57 once on a loaded CI machine)
    assert steps_of(whole, "256", "512") >= 1, steps_of(whole, "256", "512")
    assert steps_of(whole, "32", "64") <= 1, steps_of(whole, "32", "64")
    assert text_small == text_whole  # the same greedy text, however the prompt was cut


def worker_status(srv):
    return srv.ctl("status")["workers"][0]


@pytest.mark.parametrize("target_ms", [0, 10000, 1])
def test_prompt_tokens_beside_a_decode_learned_for_a_step_time(rkvd_factory, target_ms):
    """--prefill-beside-decode-ms: the steps that prefill beside a decode learn the prompt
    tokens that make them take about that long, from --prefill-beside-decode and within 64 and
    --prefill-chunk: a generous target reaches the chunk, a target below any step's time the
    floor; 0 keeps the fixed size"""
    srv = rkvd_factory("--max-batch-tokens", "512", "--prefill-chunk", "512",
                       "--prefill-beside-decode", "128", "--decode-steps", "1",
                       "--prefill-beside-decode-ms", str(target_ms))
    assert worker_status(srv)["prefill_beside_decode_now"] == 128
    n, _ = decoder_tokens_while_prefilling(srv)
    now = worker_status(srv)["prefill_beside_decode_now"]
    if target_ms == 10000:
        assert now == 512 and n >= 2, (now, n)
    elif target_ms == 0:
        assert now == 128
    else:
        assert now < 128, now
