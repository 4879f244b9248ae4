"""logit_bias on /v1/completions and /v1/chat/completions through the openai client: a bias is
added to the logits before sampling (greedy included), and bad maps are a 400 naming it."""

import pytest

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox"
MSGS = [{"role": "user", "content": "Say something."}]


def client(rkvd, root=False):
    return openai.OpenAI(base_url=rkvd.url if root else rkvd.base_url, api_key="none",
                         max_retries=0, timeout=60)


def detok(rkvd, ids):
    return client(rkvd, root=True).post("/detokenize", body={"tokens": ids},
                                        cast_to=object)["prompt"]


@pytest.fixture(scope="module")
def forced(rkvd, ref):
    """a token whose text repeats as itself (so n of it read as n times its text), and that
    text"""
    for t in ref.tokens("abc def ghi jkl mno", bos=False):
        one = detok(rkvd, [t])
        if one.strip() and detok(rkvd, [t, t, t]) == one * 3:
            return t, one
    pytest.fail("no token of the probe text repeats as itself")


def complete(rkvd, stream=False, **kw):
    c = client(rkvd)
    if not stream:
        return c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT,
                                    **kw).choices[0].text
    chunks = c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, stream=True,
                                  **kw)
    return "".join(ch.choices[0].text for ch in chunks if ch.choices)


def chat(rkvd, stream=False, **kw):
    c = client(rkvd)
    name = c.models.list().data[0].id
    if not stream:
        return c.chat.completions.create(model=name, messages=MSGS, **kw).choices[0].message.content
    chunks = c.chat.completions.create(model=name, messages=MSGS, stream=True, **kw)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("gen", [complete, chat])
def test_plus_100_forces_the_token(rkvd, forced, gen, stream):
    t, text = forced
    got = gen(rkvd, stream=stream, temperature=0, max_tokens=8, logit_bias={str(t): 100},
              extra_body={"ignore_eos": True})
    assert got == text * 8
    # and an empty map changes nothing
    assert gen(rkvd, stream=stream, temperature=0, max_tokens=8, logit_bias={}) == \
        gen(rkvd, stream=stream, temperature=0, max_tokens=8)


def test_minus_100_changes_the_greedy_pick(rkvd, ref):
    ids = list(ref.tokens(PROMPT))
    greedy = ref.gen(ids=tuple(ids), n=1)["ids"][0]
    c = client(rkvd)
    name = c.models.list().data[0].id

    def first(**kw):
        r = c.completions.create(model=name, prompt=ids, max_tokens=1, temperature=0, logprobs=0,
                                 **kw)
        return r.choices[0].logprobs.token_logprobs[0], r.choices[0].text

    lp0, text0 = first()
    assert text0 == detok(rkvd, [greedy])
    lp1, text1 = first(logit_bias={str(greedy): -100})
    # logprobs are of the raw logits: the pick is another token, less likely than the argmax
    assert lp1 < lp0
    assert text1 != text0
    # a bias on another token that does not beat the argmax leaves it
    other = (greedy + 1) % 100
    assert first(logit_bias={str(other): -5})[1] == text0


@pytest.mark.parametrize("gen", [complete, chat])
def test_bias_with_a_seed_reproduces(rkvd, forced, gen):
    t, text = forced
    kw = dict(temperature=1.0, seed=7, max_tokens=12, extra_body={"ignore_eos": True})
    a = gen(rkvd, logit_bias={str(t): 3}, **kw)
    b = gen(rkvd, stream=True, logit_bias={str(t): 3}, **kw)
    assert a == b
    # +100 wins the draw too
    assert gen(rkvd, logit_bias={str(t): 100}, **kw) == text * 12


@pytest.mark.parametrize("bias, words", [
    ([1, 2], ["logit_bias must be an object"]),
    ("x", ["logit_bias must be an object"]),
    ({"abc": 1}, ["logit_bias key \"abc\" is not a token id", "integers in [0, "]),
    ({"-3": 1}, ["logit_bias key \"-3\""]),
    ({"1.5": 1}, ["logit_bias key \"1.5\""]),
    ({"99999999": 1}, ["logit_bias key \"99999999\"", "integers in [0, "]),
    ({"5": 101}, ["logit_bias[\"5\"] must be a number in [-100, 100], got 101"]),
    ({"5": -100.5}, ["got -100.5"]),
    ({"5": "1"}, ["logit_bias[\"5\"]", "got \"1\""]),
    ({"5": None}, ["logit_bias[\"5\"]", "got null"]),
    ({str(i): 1 for i in range(301)}, ["logit_bias has 301 entries; the limit is 300"]),
])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bad_bias_is_a_400_naming_it(rkvd, bias, words, endpoint):
    c = client(rkvd)
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "completions":
            c.completions.create(model=c.models.list().data[0].id, prompt=PROMPT, max_tokens=1,
                                 logit_bias=bias)
        else:
            c.chat.completions.create(model=c.models.list().data[0].id, messages=MSGS,
                                      max_tokens=1, logit_bias=bias)
    assert e.value.body["param"] == "logit_bias"
    for w in words:
        assert w in e.value.body["message"], e.value.body["message"]
