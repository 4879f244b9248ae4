"""rkv's tokenizer against HF tokenizers: byte-level BPE trained here, exported to GGUF,
token ids compared line by line for every pre-tokenizer rkv knows (each built as the
model's tokenizer.json builds it); round trips through rkv-mkmodel's tiny models."""
import json
import os
import random
import subprocess
from pathlib import Path

import gguf
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")

RE_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
             r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
             r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
RE_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
            r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek LLM's splits, with the code points its tokenizer.json holds
DS_LETTERS = ("\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
              "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
              "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
              "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a"
              "\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d"
              "\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
              "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115"
              "\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
              "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
              "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
              "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
              "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
              "\U000118a0-\U000118df\U0001e900-\U0001e943]+")
DS_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
DS_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


def split(pattern):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated")


# tokenizer.ggml.pre -> (the pre-tokenizers its tokenizer.json runs before ByteLevel,
# ByteLevel's own use_regex, the BPE model's ignore_merges)
PRES = {
    "llama-bpe": (lambda: [split(RE_LLAMA3)], False, True),
    "qwen2": (lambda: [split(RE_QWEN2)], False, False),
    "deepseek-r1-qwen": (lambda: [split(RE_QWEN2)], False, False),
    "gpt2": (lambda: [], True, False),
    "smollm": (lambda: [pre_tokenizers.Digits(individual_digits=True)], True, False),
    "tekken": (lambda: [split(RE_TEKKEN)], False, True),
    "gpt-4o": (lambda: [split(RE_GPT4O)], False, False),
    "deepseek-llm": (lambda: [split("[\r\n]"), split(DS_LETTERS), split(DS_PUNCT), split(r"\s+$"),
                              split(DS_CJK), split(r"\p{N}+")], False, False),
    "deepseek-coder": (lambda: [split("[\r\n]"), split(r"\s?\p{L}+"), split(r"\s?\p{P}+"),
                                split(DS_CJK), pre_tokenizers.Digits(individual_digits=True)],
                       False, False),
}

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def tool(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (make {path.relative_to(TOP)})")
    return str(path)


def rkv_tok(model, *args, data=None):
    r = subprocess.run([tool("rkv-tok"), "--model", str(model), *args], input=data,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


# --- corpus ----------------------------------------------------------------------

WORDS = ("the quick brown fox jumps over a lazy dog while we're reading code and "
         "numbers in many languages; it's what tokenizers see every day").split()
PIECES = [
    "don't", "I'M", "we'll", "they've", "She'd", "it's", "YOU'RE", "o'clock", "rock'n'roll",
    "café", "naïve", "résumé", "Ærøskøbing", "Straße", "ﬁnance", "Ελληνικά", "русский",
    "中文分词测试", "日本語のテキスト", "한국어 문장", "😀", "👍🏽", "🇺🇸", "👨‍👩‍👧", "∑x²",
    "12345678901234567890", "3.14159", "1,000,000", "2024-01-31", "0x7fff", "1e-9", "٣٤٥",
    "def f(x):", "    return x**2", "if (a && b) { c++; }", "#include <stdio.h>",
    "print(\"hi\")", "<div class='x'>", "a    b", "\t\tindent", "   lead", "trail   ",
    "!!!???", "...", "—", "--", "$$$", "@user", "#tag", "http://example.com/a?b=c",
    "x\ty", "CamelCaseWord", "snake_case_word", "ALLCAPS", " \u00a0 nbsp", "\r",
    "getHTTPResponseCode", "XMLHttpRequest", "path/to/file", "a/b//c", "ǅungla", "ǈj",
    "κόσμε", "ὯΩμέγα", "ΐῗ", "Ωhm", "Kelvin", "ℌℑ", "ＡＢＣ！？", "“quoted”", "‘single’",
    "、。「」", "漢字かなカナ", "Ⅻⅷ½", "e\u0301te\u0301", "हिन्दी", "العربية", "עִבְרִית",
    "𐐀𐐨", "ﬃ", "\u3000全角", "x = [1, 2, 3]  # list", "for i in range(10):", "\u2028\u2029", "I'm HE'S they'Re", "ǅ'S",
]


# newlines inside runs of other whitespace, which --lines cannot carry
WS_TEXT = ("def f(x):\n    if x:\n\n        return [1,\n 2]\r\n\t\tpass  \n\n\n   \t \n"
           "a/\nb  /\r\n  \n//c\n\u3000\n\u00a0\n \n全角\n\n")


def make_lines(rng, n):
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(WORDS))
            elif r < 0.9:
                parts.append(rng.choice(PIECES))
            else:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25))))
        sep = rng.choice([" ", " ", " ", "  ", "\t", "", "   "])
        lines.append(sep.join(parts))
    lines += ["", " ", "  ", "\t", "don't stop", "   leading spaces", "trailing spaces   ",
              "12345678901234567890123", "a\r\rb", "I'LL WE'VE", "ǅemal"]
    return lines


def train(pre, lines):
    splits, byte_regex, ignore_merges = PRES[pre]
    tk = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(splits() + [
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=byte_regex),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(lines, trainer)
    return tk


def export_gguf(tk, path, pre, arch="llama", eot=None, eom=None):
    vocab = tk.get_vocab()
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    merges = json.loads(tk.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    types = [gguf.TokenType.CONTROL if t in SPECIALS else gguf.TokenType.NORMAL for t in tokens]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.add_eos_token_id(vocab["<|end_of_text|>"])
    if eot is not None:
        w.add_eot_token_id(eot)
    if eom is not None:
        w.add_eom_token_id(eom)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def corpora():
    rng = random.Random(1234)
    return make_lines(rng, 3000), make_lines(random.Random(99), 400)


@pytest.mark.parametrize("pre", list(PRES))
def test_bpe_ids_match_hf(tmp_path, corpora, pre):
    train_lines, test_lines = corpora
    tk = train(pre, train_lines)
    assert tk.get_vocab_size() >= 900
    model = tmp_path / f"{pre}.gguf"
    export_gguf(tk, model, pre)

    text = tmp_path / "lines.txt"
    text.write_bytes("\n".join(test_lines).encode())
    got = [json.loads(line) for line in rkv_tok(model, "--file", str(text), "--lines").splitlines()]
    assert len(got) == len(test_lines)
    bad = [(line, ids, tk.encode(line).ids) for line, ids in zip(test_lines, got)
           if ids != tk.encode(line).ids]
    assert not bad, f"{len(bad)} of {len(test_lines)} lines differ, first: {bad[0]!r}"

    # the whole text at once: newlines inside words and runs
    whole = "\n".join(test_lines)
    ids = json.loads(rkv_tok(model, "--file", str(text)))
    assert ids == tk.encode(whole).ids

    f = tmp_path / "ws.txt"
    f.write_bytes(WS_TEXT.encode())
    assert json.loads(rkv_tok(model, "--file", str(f))) == tk.encode(WS_TEXT).ids

    # decode gives the text back
    out = rkv_tok(model, "--decode", ",".join(map(str, ids)))
    assert out.decode() == whole == tk.decode(ids)

    # special tokens: parsed only with --special
    s = "hi<|eot_id|>there"
    eot = tk.get_vocab()["<|eot_id|>"]
    assert json.loads(rkv_tok(model, "--special", s)) == tk.encode(s).ids
    assert eot in json.loads(rkv_tok(model, "--special", s))
    assert eot not in json.loads(rkv_tok(model, s))
    info = json.loads(rkv_tok(model, "--info"))
    assert info["n_vocab"] == tk.get_vocab_size()
    assert info["add_bos"] == PRES[pre][2]  # llama 3 and tekken want bos, as llama.cpp
    assert eot in info["eog"] and tk.get_vocab()["<|end_of_text|>"] in info["eog"]


def test_unknown_pre_refused(tmp_path, corpora):
    """a pre-tokenizer rkv does not know would give wrong ids silently: it refuses the file"""
    tk = train("gpt2", corpora[1])
    model = tmp_path / "unknown.gguf"
    export_gguf(tk, model, "no-such-pre")
    r = subprocess.run([tool("rkv-tok"), "--model", str(model), "--info"], capture_output=True,
                       timeout=60)
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "tokenizer.ggml.pre 'no-such-pre' is not supported" in err, err
    for name in PRES:
        assert name in err


def test_eot_and_eom_ids_end_generation(tmp_path, corpora):
    """tokenizer.ggml.eot_token_id and eom_token_id end generation whatever their text"""
    tk = train("gpt2", corpora[1])
    model = tmp_path / "eom.gguf"
    export_gguf(tk, model, "gpt2", eot=500, eom=501)
    eog = json.loads(rkv_tok(model, "--info"))["eog"]
    assert 500 in eog and 501 in eog and 502 not in eog


def random_text(rng, n):
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
                + list(" \t\n\r.,;:!?'\"()[]{}<>|-_=+*/\\@#$%^&~`") +
                ["é", "ß", "中", "文", "😀", "👍🏽", "\u00a0", "\u2581", "\u200d"])
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("preset", ["tiny", "tiny-qwen2"])
def test_mkmodel_roundtrip(tmp_path, preset):
    model = tmp_path / f"{preset}.gguf"
    r = subprocess.run([tool("rkv-mkmodel"), "--preset", preset, "--dtype", "f32", "--seed", "3",
                        "--out", str(model)], capture_output=True, timeout=300)
    if r.returncode != 0 and b"preset" in r.stderr:
        pytest.skip(f"rkv-mkmodel has no preset {preset}: {r.stderr.decode()[:200]}")
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    n_vocab = json.loads(rkv_tok(model, "--info"))["n_vocab"]
    rng = random.Random(7)
    for i in range(20):
        text = random_text(rng, rng.randint(0, 400))
        f = tmp_path / f"t{i}.txt"
        f.write_bytes(text.encode())
        ids = json.loads(rkv_tok(model, "--file", str(f)))
        assert all(0 <= t < n_vocab for t in ids)
        assert rkv_tok(model, "--decode", ",".join(map(str, ids)) or "[]").decode() == text
    # invalid utf-8 survives the byte-level mapping exactly
    raw = bytes(range(256)) * 2
    f = tmp_path / "raw.bin"
    f.write_bytes(raw)
    ids = json.loads(rkv_tok(model, "--file", str(f)))
    assert rkv_tok(model, "--special", "--decode", ",".join(map(str, ids))) == raw


def test_spm_ids_match_sentencepiece(tmp_path, corpora):
    """llama/mistral-style sentencepiece BPE with byte fallback, as llama.cpp converts it."""
    spm = pytest.importorskip("sentencepiece")
    import io
    train_lines, test_lines = corpora
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train_lines), model_writer=buf, vocab_size=1000, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", add_dummy_prefix=True, minloglevel=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()
    types = []
    for i in range(n):
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        else:
            types.append(gguf.TokenType.NORMAL)
    model = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(model), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # characters the training never saw go through byte fallback
    lines = test_lines + ["Ω☃ 𝔘nicode", "snow☃man 42", "\u2603\u2603"]
    text = tmp_path / "lines.txt"
    text.write_bytes("\n".join(lines).encode())
    got = [json.loads(line) for line in rkv_tok(model, "--file", str(text), "--lines").splitlines()]
    assert len(got) == len(lines)
    bad = [(line, ids, sp.encode(line)) for line, ids in zip(lines, got) if ids != sp.encode(line)]
    assert not bad, f"{len(bad)} of {len(lines)} lines differ, first: {bad[0]!r}"
    byte_ids = {i for i in range(n) if sp.is_byte(i)}
    assert any(set(ids) & byte_ids for ids in got)

    for line, ids in zip(lines, got):
        assert rkv_tok(model, "--decode", ",".join(map(str, ids)) or "[]").decode() == \
            sp.decode(ids), line
    assert json.loads(rkv_tok(model, "--bos", "hello"))[0] == 1
    assert json.loads(rkv_tok(model, "--special", "a</s>b"))[1:2] == [2]
