"""GGUF files across two independent implementations: rkv-mkmodel's models read by the Python
`gguf` package, files written by gguf.GGUFWriter read by rkv's reader (through rkv-gguf-dump),
and rkv-mkmodel's determinism."""
import json
import os
import subprocess
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")

DTYPES = ["f32", "f16", "bf16", "q8_0"]
QTYPE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}
# preset -> (arch, dim, layers, heads, kv heads, ffn, vocab, ctx), as docs/model-format.md
PRESETS = {
    "tiny": ("llama", 64, 2, 4, 2, 160, 512, 2048),
    "tiny-qwen2": ("qwen2", 64, 2, 4, 2, 160, 512, 2048),
}
SPECIALS = {
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
              "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}


def tool(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (make {path.relative_to(TOP)})")
    return str(path)


def mkmodel(out, *args):
    r = subprocess.run([tool("rkv-mkmodel"), *args, "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def dump(path):
    r = subprocess.run([tool("rkv-gguf-dump"), str(path), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def field_value(f):
    """a ReaderField's value as plain python (lists for arrays)"""
    v = f.contents()
    return v


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(preset, dtype) -> path, all with seed 5"""
    d = tmp_path_factory.mktemp("models")
    return {(p, dt): mkmodel(d / f"{p}-{dt}.gguf", "--preset", p, "--dtype", dt, "--seed", "5")
            for p in PRESETS for dt in DTYPES}


def expected_tensors(arch, dim, n_layer, n_head, n_kv, ffn, vocab):
    hd = dim // n_head
    t = {"token_embd.weight": [dim, vocab], "output_norm.weight": [dim],
         "output.weight": [dim, vocab]}
    for i in range(n_layer):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": [dim], b + "attn_q.weight": [dim, n_head * hd],
                  b + "attn_k.weight": [dim, n_kv * hd], b + "attn_v.weight": [dim, n_kv * hd],
                  b + "attn_output.weight": [n_head * hd, dim], b + "ffn_norm.weight": [dim],
                  b + "ffn_gate.weight": [dim, ffn], b + "ffn_up.weight": [dim, ffn],
                  b + "ffn_down.weight": [ffn, dim]})
        if arch == "qwen2":
            t.update({b + "attn_q.bias": [n_head * hd], b + "attn_k.bias": [n_kv * hd],
                      b + "attn_v.bias": [n_kv * hd]})
    return t


def as_f32(t):
    """a ReaderTensor's values as float32, shape (n_out, n_in) for matrices"""
    if t.tensor_type in (QT.F32, QT.F16):
        return np.asarray(t.data, dtype=np.float32)
    return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)


# --- (a) rkv-mkmodel's files through gguf.GGUFReader ----------------------------------------

@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_mkmodel_read_by_gguf_py(models, preset, dtype):
    arch, dim, n_layer, n_head, n_kv, ffn, vocab, ctx = PRESETS[preset]
    r = gguf.GGUFReader(models[preset, dtype])
    kv = {k: field_value(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert kv["general.architecture"] == arch
    assert kv["general.alignment"] == 32
    assert kv[f"{arch}.block_count"] == n_layer
    assert kv[f"{arch}.embedding_length"] == dim
    assert kv[f"{arch}.feed_forward_length"] == ffn
    assert kv[f"{arch}.attention.head_count"] == n_head
    assert kv[f"{arch}.attention.head_count_kv"] == n_kv
    assert kv[f"{arch}.context_length"] == ctx
    assert kv[f"{arch}.rope.dimension_count"] == dim // n_head
    assert 0 < kv[f"{arch}.attention.layer_norm_rms_epsilon"] < 1e-4
    assert r.fields[f"{arch}.rope.freq_base"].types == [VT.FLOAT32]

    # tokenizer: 256 bytes, learned merges, the family's specials, reserved padding
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    merges = kv["tokenizer.ggml.merges"]
    specials = SPECIALS[arch]
    assert len(tokens) == len(types) == vocab
    assert len(set(tokens)) == vocab
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.pre"] == {"llama": "llama-bpe", "qwen2": "qwen2"}[arch]
    n_learned = 256 + len(merges)
    assert n_learned + len(specials) == vocab  # tiny: merges fill the vocab exactly
    assert tokens[n_learned:] == specials
    assert set(types[:n_learned]) == {1} and set(types[n_learned:]) == {3}
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index
    s0 = n_learned
    bos, eos = kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"]
    eot = kv["tokenizer.ggml.eot_token_id"]
    if arch == "llama":
        assert (bos, eos, eot) == (s0, s0 + 1, s0 + 4)
        assert kv["tokenizer.ggml.add_bos_token"] is True
        assert "<|start_header_id|>" in kv["tokenizer.chat_template"]
    else:
        assert (bos, eos, eot) == (s0, s0 + 2, s0 + 2)
        assert kv["tokenizer.ggml.add_bos_token"] is False
        assert "<|im_start|>" in kv["tokenizer.chat_template"]

    # tensors: names, ggml shapes, types
    want = expected_tensors(arch, dim, n_layer, n_head, n_kv, ffn, vocab)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(want)
    for name, t in got.items():
        assert [int(x) for x in t.shape] == want[name], name
        vector = len(want[name]) == 1
        assert t.tensor_type == (QT.F32 if vector else QTYPE[dtype]), name
        assert t.data_offset % 32 == 0


def test_mkmodel_values(models):
    """same seed, any dtype: the same underlying values, rounded as the dtype says"""
    for preset in PRESETS:
        ref = {t.name: as_f32(t) for t in gguf.GGUFReader(models[preset, "f32"]).tensors}
        q = ref["blk.0.attn_q.weight"]
        assert abs(q.std() * np.sqrt(64) - 1) < 0.1  # std 1/sqrt(n_in)
        down = ref["blk.1.ffn_down.weight"]
        assert abs(down.std() * np.sqrt(160) - 1) < 0.1
        norm = ref["blk.0.attn_norm.weight"]
        assert np.all(np.abs(norm - 1) <= 0.1) and norm.std() > 0.01
        assert len(np.unique(q)) == q.size  # no repeats: the generator is not stuck
        for dtype, rtol in (("f16", 2**-11), ("bf16", 2**-8)):
            for t in gguf.GGUFReader(models[preset, dtype]).tensors:
                np.testing.assert_allclose(as_f32(t), ref[t.name], rtol=rtol, atol=1e-7,
                                           err_msg=t.name)
        for t in gguf.GGUFReader(models[preset, "q8_0"]).tensors:
            v = as_f32(t)
            r = ref[t.name]
            if t.tensor_type == QT.F32:
                np.testing.assert_array_equal(v, r)
                continue
            # q8_0: per 32-block scale d = amax/127; every value within d/2 (+ f16 of d)
            blocks = r.reshape(-1, 32)
            d = np.abs(blocks).max(axis=1, keepdims=True) / 127
            err = np.abs(v.reshape(-1, 32) - blocks)
            assert np.all(err <= d * 0.5 + d * 2**-10 * 127 + 1e-7), t.name


# --- (b) gguf.GGUFWriter's files through rkv's reader ---------------------------------------

def write_assorted(path, alignment):
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    w.add_uint8("k.u8", 250)
    w.add_int8("k.i8", -128)
    w.add_uint16("k.u16", 65535)
    w.add_int16("k.i16", -32768)
    w.add_uint32("k.u32", 4294967295)
    w.add_int32("k.i32", -2147483648)
    w.add_uint64("k.u64", 18446744073709551615)
    w.add_int64("k.i64", -9223372036854775808)
    w.add_float32("k.f32", 3.14159)
    w.add_float64("k.f64", 2.718281828459045)
    w.add_bool("k.true", True)
    w.add_bool("k.false", False)
    w.add_string("k.str", "héllo wörld 中文 😀")
    w.add_string("k.empty", "")
    w.add_array("k.astr", ["a", "", "ü", "Ġhello", "<|eot_id|>"])
    w.add_array("k.aint", [1, -2, 3, 2**31 - 1])
    w.add_array("k.afloat", [0.5, -1.25, 1e-3])
    w.add_array("k.abool", [True, False, True])
    w.add_tensor("t.f32", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("t.f16", rng.standard_normal((2, 5)).astype(np.float16))
    w.add_tensor("t.bf16", gguf.quants.quantize(rng.standard_normal((4, 6)).astype(np.float32),
                                                QT.BF16), raw_dtype=QT.BF16)
    w.add_tensor("t.q8_0", gguf.quants.quantize(rng.standard_normal((3, 64)).astype(np.float32),
                                                QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("t.vec", np.arange(7, dtype=np.float32))
    w.add_tensor("t.3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def same_scalar(vt, want, got):
    if vt == VT.FLOAT32:
        return np.float32(got) == np.float32(want)
    if vt == VT.FLOAT64:
        return float(got) == float(want)
    if vt == VT.BOOL:
        return got is bool(want)
    return got == want


def compare_with_gguf_py(path):
    """rkv-gguf-dump --json and gguf.GGUFReader agree on every key, value and tensor byte"""
    r = gguf.GGUFReader(str(path))
    d = dump(path)
    fields = [f for f in r.fields.values() if not f.name.startswith("GGUF.")]
    assert d["version"] == 3
    assert d["file_size"] == path.stat().st_size
    assert [m["key"] for m in d["metadata"]] == [f.name for f in fields]
    for f, m in zip(fields, d["metadata"]):
        vt = f.types[0]
        assert m["type"] == vt.name.lower(), f.name
        want = f.contents()
        if vt == VT.ARRAY:
            et = f.types[1] if len(f.types) > 1 else None
            assert m["count"] == len(want), f.name
            if et is not None:
                assert m["elem_type"] == et.name.lower(), f.name
            for w_, g_ in zip(want, m["value"]):
                assert same_scalar(et, w_, g_), (f.name, w_, g_)
            assert len(m["value"]) == len(want)
        else:
            assert same_scalar(vt, want, m["value"]), (f.name, want, m["value"])
    assert [t["name"] for t in d["tensors"]] == [t.name for t in r.tensors]
    for t, g in zip(r.tensors, d["tensors"]):
        assert g["type"] == t.tensor_type.name, t.name
        assert g["type_id"] == int(t.tensor_type)
        assert g["dims"] == [int(x) for x in t.shape], t.name
        assert g["n_elements"] == int(t.n_elements)
        assert g["n_bytes"] == int(t.n_bytes), t.name
        assert g["offset"] == int(t.data_offset), t.name
        raw = np.asarray(t.data).tobytes()
        assert len(raw) == g["n_bytes"]
        assert g["crc32"] == f"{zlib.crc32(raw):08x}", t.name
    return d


@pytest.mark.parametrize("alignment", [32, 64])
def test_gguf_py_file_read_by_rkv(tmp_path, alignment):
    path = write_assorted(tmp_path / "assorted.gguf", alignment)
    d = compare_with_gguf_py(path)
    assert d["alignment"] == alignment
    assert all(t["offset"] % alignment == 0 for t in d["tensors"])
    by = {m["key"]: m for m in d["metadata"]}
    # 64-bit extremes survive exactly
    assert by["k.u64"]["value"] == 18446744073709551615
    assert by["k.i64"]["value"] == -9223372036854775808
    assert by["k.str"]["value"] == "héllo wörld 中文 😀"
    assert by["k.astr"]["value"] == ["a", "", "ü", "Ġhello", "<|eot_id|>"]

    # v2 has the same layout (64-bit counts): only the version differs
    raw = bytearray(path.read_bytes())
    raw[4:8] = (2).to_bytes(4, "little")
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(raw))
    d2 = dump(v2)
    assert d2.pop("version") == 2 and d.pop("version") == 3
    assert d2 == d


def test_mkmodel_file_read_by_both(models):
    compare_with_gguf_py(models["tiny-qwen2", "q8_0"])
    compare_with_gguf_py(models["tiny", "bf16"])


def test_truncated_file_refused(tmp_path, models):
    data = models["tiny", "f16"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) - 1000])
    r = subprocess.run([tool("rkv-gguf-dump"), str(cut)], capture_output=True, text=True)
    assert r.returncode == 1
    assert str(cut) in r.stderr and "output.weight" in r.stderr and "truncated" in r.stderr
    bad = tmp_path / "v1.gguf"
    bad.write_bytes(data[:4] + b"\x01\x00\x00\x00" + data[8:])
    r = subprocess.run([tool("rkv-gguf-dump"), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "version 1 is not supported" in r.stderr


# --- (c) determinism and the command line ------------------------------------------------------

def test_mkmodel_deterministic(tmp_path, models):
    again = mkmodel(tmp_path / "again.gguf", "--preset", "tiny", "--dtype", "q8_0", "--seed", "5")
    assert again.read_bytes() == models["tiny", "q8_0"].read_bytes()
    other = mkmodel(tmp_path / "other.gguf", "--preset", "tiny", "--dtype", "q8_0", "--seed", "6")
    a, b = models["tiny", "q8_0"].read_bytes(), other.read_bytes()
    assert len(a) == len(b) and a != b
    # only the weights move with the seed: the header (metadata, tokenizer) is the same
    data_at = dump(other)["data_offset"]
    assert a[:data_at] == b[:data_at] and a[data_at:] != b[data_at:]
    # --arch overrides the preset's family
    q = mkmodel(tmp_path / "q.gguf", "--preset", "tiny", "--arch", "qwen2", "--seed", "5")
    assert gguf.GGUFReader(q).fields["general.architecture"].contents() == "qwen2"


def test_mkmodel_flags(tmp_path):
    mk = tool("rkv-mkmodel")
    r = subprocess.run([mk, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--preset" in r.stdout
    for args, msg in ((["--preset", "nope"], "unknown preset 'nope'"),
                      (["--dtype", "iq1_s"], "unknown --dtype 'iq1_s' (f32, f16, bf16, q8_0, q4_0"),
                      (["--arch", "gpt2"], "unknown --arch 'gpt2'"),
                      (["--seed", "-1"], "--seed '-1'"),
                      (["--seed", "12x"], "--seed '12x'"),
                      (["--frobnicate", "1"], "unknown flag '--frobnicate'"),
                      (["--seed"], "--seed needs a value"),
                      ([], "--out FILE is required")):
        out = [] if not args or args == ["--seed"] else ["--out", str(tmp_path / "x.gguf")]
        r = subprocess.run([mk, *out, *args], capture_output=True, text=True)
        assert r.returncode == 1, args
        assert msg in r.stderr, (args, r.stderr)
        assert not (tmp_path / "x.gguf").exists()
    # an unwritable destination names the path and leaves nothing behind
    r = subprocess.run([mk, "--out", str(tmp_path / "no" / "dir.gguf")], capture_output=True,
                       text=True)
    assert r.returncode == 1 and str(tmp_path / "no") in r.stderr
