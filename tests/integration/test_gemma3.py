"""Gemma 3 270M Q4_K_M as published (scripts/deps.sh --venv puts it in build/models): its
SentencePiece tokenizer against sentencepiece itself, the cpu engine's logits against the NumPy
reference (ref_model.py, float64 over gguf.quants-dequantized weights) at every position of short
prompts and past the 512-position window, and rkvd serving it to the openai client with greedy
completions a base model of this size gives under exact math."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import Rkvd, _root, _stop_checked, rkv_bin  # noqa: E402
from ref_model import TOP, RefModel  # noqa: E402
from test_reference import compare_steps, run_gen  # noqa: E402
from test_tok import make_lines  # noqa: E402

GEMMA = TOP / "build" / "models" / "gemma-3-270m-q4_k_m.gguf"
pytestmark = pytest.mark.skipif(not GEMMA.exists(),
                                reason=f"{GEMMA} is not there (scripts/deps.sh --venv)")

# RKV_CPU_EXACT=1 (weights dequantized, f32 sums): the logits within 1.0e-6 of the reference's
# max |logit| at every position measured; 1e-4 as for every model.
RTOL_EXACT = 1e-4
# the integer path rounds each activation row to 8 bits a block: on this file the logits move by
# 3.4-8.9e-2 of a position's max |logit| ("1, 2, 3, 4," and "The opposite of hot is", every
# prefix); the post-attention and post-ffn norms of 18 layers, with norm weights up to 300,
# carry the rounding further than the tiny presets do. 1.5x the largest, rounded up.
RTOL_INT = 0.15

PROMPTS = ["1, 2, 3, 4,", "The opposite of hot is"]


def tok(*args, data=None):
    r = subprocess.run([rkv_bin("rkv-tok"), "--model", str(GEMMA), *args], input=data,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def ids_of(text, *flags):
    return json.loads(tok("--bos", *flags, text))


# --- tokenizer ------------------------------------------------------------------------------


def _pb(num, wire, value):
    """one protobuf field: varint (0), length-delimited (2) or 32-bit float (5)"""
    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(value)
    if wire == 5:
        return key + struct.pack("<f", value)
    return key + varint(len(value)) + value


def gguf_vocab():
    from gguf import GGUFReader
    r = GGUFReader(str(GEMMA))
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in f["tokenizer.ggml.tokens"].data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    return tokens, scores, types


@pytest.fixture(scope="module")
def spm_ref():
    """encode(text) as llama.cpp tokenizes Gemma: the user-defined pieces (runs of spaces and
    newlines, html tags: token type 4) split out of the raw text first, longest match, then each
    stretch between them by sentencepiece's own BPE over the file's pieces and scores (no dummy
    prefix, byte fallback), the model proto written from the GGUF"""
    import sentencepiece as spm
    tokens, scores, types = gguf_vocab()
    proto = b"".join(_pb(1, 2, _pb(1, 2, t.encode()) + _pb(2, 5, s) + _pb(3, 0, ty))
                     for t, s, ty in zip(tokens, scores, types))
    # trainer: model_type BPE, vocab_size, byte_fallback, unk_id 3
    proto += _pb(2, 2, _pb(3, 0, 2) + _pb(4, 0, len(tokens)) + _pb(35, 0, 1) + _pb(40, 0, 3))
    # normalizer: identity, no dummy prefix, whitespace kept and escaped as U+2581
    proto += _pb(3, 2, _pb(1, 2, b"identity") + _pb(3, 0, 0) + _pb(4, 0, 0) + _pb(5, 0, 1))
    sp = spm.SentencePieceProcessor(model_proto=proto)
    user = {t: i for i, t in enumerate(tokens) if types[i] == 4}
    longest = max(len(t) for t in user)

    def encode(text):
        out, i, start = [], 0, 0
        while i < len(text):
            for n in range(min(longest, len(text) - i), 0, -1):
                if text[i:i + n] in user:
                    out += sp.encode(text[start:i]) + [user[text[i:i + n]]]
                    i = start = i + n
                    break
            else:
                i += 1
        return out + sp.encode(text[start:])

    return encode


def test_tokenizer_matches_sentencepiece(tmp_path, spm_ref):
    """identical ids on a multilingual, code and whitespace-heavy corpus; the text comes back
    from the ids byte for byte"""
    import random
    lines = make_lines(random.Random(7), 300) + [
        "def f(x):\n    return x**2  # sq", "\tif (a) {\n\t\tb();\n\t}", "<table><tr><td>x</td>",
        "a" + " " * 40 + "b", "\n\n\n\nend", "1, 2, 3, 4,", "The opposite of hot is",
        "<start_of_turn>user not special here<end_of_turn>", "naïve café 日本語 🙂 \u2603",
        "x\u200by", "Ω☃ 𝔘nicode"]
    one_line = [line for line in lines if "\n" not in line]
    text = tmp_path / "lines.txt"
    text.write_bytes("\n".join(one_line).encode())
    got = [json.loads(x) for x in tok("--file", str(text), "--lines").splitlines()]
    assert len(got) == len(one_line)
    lines = one_line + [line for line in lines if "\n" in line]
    got += [json.loads(tok(line)) for line in lines[len(one_line):]]
    bad = [(line, ids, spm_ref(line)) for line, ids in zip(lines, got) if ids != spm_ref(line)]
    assert not bad, f"{len(bad)} of {len(lines)} lines differ, first: {bad[0]!r}"
    assert any(138 in ids for ids in got)  # "  ", a user-defined piece
    assert any(any(3 < i < 262 for i in ids) for ids in got)  # byte fallback <0xXX>
    for line, ids in list(zip(lines, got))[::10] + list(zip(lines, got))[-4:]:
        assert tok("--decode", ",".join(map(str, ids)) or "[]").decode() == line, line


def test_tokenizer_known_ids():
    """ids the published tokenizer gives: <bos> 2, digits one by one, the turn markers"""
    assert ids_of("Hello world") == [2, 9259, 1902]
    assert ids_of("The opposite of hot is") == [2, 818, 11688, 529, 3425, 563]
    assert ids_of("1, 2, 3, 4,") == [2, 236770, 236764, 236743, 236778, 236764, 236743, 236800,
                                     236764, 236743, 236812, 236764]
    assert ids_of("<start_of_turn>user\nHi<end_of_turn>\n", "--special") == \
        [2, 105, 2364, 107, 10979, 106, 107]
    # without --special the markers are text
    assert 105 not in ids_of("<start_of_turn>user")


# --- logits against the reference --------------------------------------------------------------


@pytest.fixture(scope="module")
def ref():
    return RefModel(str(GEMMA))


def _prefix_logits(tmp_path, ids, exact):
    """the cpu engine's logits at the last position of ids (a prefill), (n_vocab,)"""
    _, got = run_gen(GEMMA, tmp_path, prompt=ids, n=1,
                     env={"RKV_CPU_EXACT": "1" if exact else "0"})
    return got[0].astype(np.float64)


def test_ref_sees_gemma3(ref):
    """the reference reads the file as llama.cpp does: 18 layers, every 6th global, a window of
    512, heads of 256 (wider than 640 / 4), norm weights that already hold Gemma's +1"""
    assert (ref.arch, ref.n_layer, ref.dim, ref.n_head, ref.n_head_kv, ref.head_dim) == \
        ("gemma3", 18, 640, 4, 1, 256)
    assert ref.n_swa == 512 and ref.output is ref.tok_embd
    assert [i for i, L in enumerate(ref.layers) if not L["local"]] == [5, 11, 17]
    # llama.cpp's converter adds 1 to Gemma's norm weights: no weight is near -1 (a raw
    # weight w of the HF checkpoint multiplies as 1 + w)
    assert min(L["attn_norm"].min() for L in ref.layers) > 0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_every_position(ref, tmp_path, prompt):
    """the logits of every prompt position (a prefill of each prefix) equal the reference's:
    within RTOL_EXACT through RKV_CPU_EXACT=1, within RTOL_INT on the integer path, whose top
    token is the reference's or one tied with it within that"""
    ids = ids_of(prompt)
    want = ref.logits(ids)
    worst = {True: 0.0, False: 0.0}
    for i in range(1, len(ids) + 1):
        w = want[i - 1]
        scale = np.abs(w).max()
        for exact in (True, False):
            got = _prefix_logits(tmp_path, ids[:i], exact)
            rel = np.abs(got - w).max() / scale
            worst[exact] = max(worst[exact], rel)
            limit = (RTOL_EXACT if exact else RTOL_INT) * scale
            assert rel * scale <= limit, f"position {i - 1}, exact {exact}: {rel:.3g}"
            assert w[int(np.argmax(got))] >= w.max() - limit, f"position {i - 1}, exact {exact}"
    print(f"{prompt!r}: worst rel diff exact {worst[True]:.2e}, integer {worst[False]:.2e}")


def test_decode_past_the_window(ref, tmp_path):
    """a prompt of 600 tokens: decode steps past position 512, where the local layers' window
    cuts (it moves the logits far beyond the tolerance), equal the reference's within 1e-4"""
    rng = np.random.default_rng(3)
    words = ("the cat sat on a mat while it rained in town and we read old books about "
             "ships trains rivers maps").split()
    text = " ".join(rng.choice(words, 700))
    ids = ids_of(text)[:600]
    gen, got = run_gen(GEMMA, tmp_path, prompt=ids, env={"RKV_CPU_EXACT": "1"})
    compare_steps(ref, ids, gen, got)
    seq = ids + gen[:-1]
    rows = list(range(len(ids) - 1, len(seq)))
    windowed = ref.logits(seq, rows=rows)
    ref.n_swa = 10 ** 6
    try:
        unwindowed = ref.logits(seq, rows=rows)
    finally:
        ref.n_swa = 512
    assert np.abs(windowed - unwindowed).max() > 100 * RTOL_EXACT * np.abs(windowed).max()


# --- served by rkvd ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Rkvd(GEMMA, _root(tmp_path_factory, "gemma")).start(timeout=120)
    yield srv
    _stop_checked(srv)


def test_served_greedy_completions(server):
    """rkvd --model gemma-3-270m-q4_k_m.gguf through the openai client, greedy: the count goes
    on, the opposite of hot is cold, streamed and not; a Python header gets a body"""
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    model = c.models.list().data[0].id
    r = c.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0)
    assert r.choices[0].text.startswith(" 5, 6, 7, 8"), r.choices[0].text
    parts = [ch.choices[0].text for ch in c.completions.create(
        model=model, prompt="The opposite of hot is", max_tokens=4, temperature=0, stream=True)]
    assert "".join(parts).startswith(" cold"), parts
    r = c.completions.create(model=model, prompt="def fibonacci(n):\n", max_tokens=24,
                             temperature=0)
    body = r.choices[0].text
    assert "return" in body and "if" in body and body.startswith("    "), body


# --- chat -------------------------------------------------------------------------------------

# Gemma 3's chat template (the text part of the one its instruction-tuned checkpoints ship): the
# file carries none, so chats render with rkv's built-in gemma family, which must give this text
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "  Hot or cold?\n"}],
    [{"role": "system", "content": "Be brief.\n"},
     {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": " Hello! \n\n"},
     {"role": "user", "content": "def f(x):\n    return x\n\tWhat does it do?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "ünïcödé 中文 😀"}],
]


def test_builtin_chat_renders_as_the_gemma3_template(tmp_path):
    """no tokenizer.chat_template in the file: rkv's gemma family gives jinja2's text of Gemma
    3's template (BOS once, from the tokenizer), and so does rkv's interpreter given it"""
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    assert json.loads(tok("--info"))["chat"] == "gemma"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(
        jinja2.exceptions.TemplateError(msg))
    tmpl = tmp_path / "gemma3.jinja"
    tmpl.write_text(GEMMA3_TEMPLATE)
    for conv in CONVERSATIONS:
        want = env.from_string(GEMMA3_TEMPLATE).render(messages=conv, add_generation_prompt=True,
                                                        bos_token="<bos>", eos_token="<eos>")
        f = tmp_path / "conv.json"
        f.write_text(json.dumps(conv))
        assert "<bos>" + tok("--chat", str(f), "--gen").decode() == want
        assert "<bos>" + tok("--chat", str(f), "--gen", "--chat-template", str(tmpl)).decode() \
            == want
    ids = json.loads(tok("--bos", "--special", "<start_of_turn>user\nHi<end_of_turn>\n"))
    assert ids[0] == 2 and ids[1] == 105 and 106 in ids
    assert 106 in json.loads(tok("--info"))["eog"]  # <end_of_turn> ends generation


def test_served_chat_renders_gemma_turns(server, tmp_path):
    """rkvd renders a chat as the gemma turns (the prompt is the ids of rkv-tok's rendering) and
    stops on the tokenizer's end-of-generation set, which holds <end_of_turn>. this base model
    never writes <end_of_turn> itself (its row of the tied head is untrained: p < 1e-4 after six
    turns of "Say A." / "A"), so the stop on it is shown by the set, not by a generation"""
    openai = pytest.importorskip("openai")
    conv = CONVERSATIONS[2]
    f = tmp_path / "conv.json"
    f.write_text(json.dumps(conv))
    want = json.loads(tok("--file", "-", "--bos", "--special",
                          data=tok("--chat", str(f), "--gen")))
    assert want[0] == 2 and want.count(105) == 4 and want.count(106) == 3
    assert 106 in json.loads(tok("--info"))["eog"]
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    model = c.models.list().data[0].id
    r = c.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=conv)
    assert r.usage.prompt_tokens == len(want)
    text = r.choices[0].message.content
    assert "<end_of_turn>" not in text and "<start_of_turn>" not in text
    parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=model, max_tokens=8, temperature=0, messages=conv, stream=True)]
    assert "".join(parts) == text
