"""The weight block formats (common/quant.c) against gguf.quants, the reference: rkv
dequantizes random blocks of every type and every tensor of the real Gemma 3 270M Q4_K_M file
to the same bits; rkv-mkmodel quantizes Q4_0..Q8_0 to gguf.quants.quantize's bytes and every
type within its rounding error; a file with a type rkv does not read says which."""
import json
import subprocess
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from conftest import TOP, rkv_bin

# type: offsets of its f16 scales within a block (random scales there are kept finite)
TYPES = {
    QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
    QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
    QT.IQ4_NL: (0,), QT.IQ4_XS: (0,),
}
GEMMA = TOP / "build" / "models" / "gemma-3-270m-q4_k_m.gguf"


def dump(path):
    """rkv's view: name -> (type, crc32 of its values dequantized to f32)"""
    r = subprocess.run([rkv_bin("rkv-gguf-dump"), str(path), "--json", "--dequant"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return {t["name"]: (t["type"], t["dequant_crc32"]) for t in json.loads(r.stdout)["tensors"]}


def crc_f32(values):
    return "%08x" % zlib.crc32(np.ascontiguousarray(values, dtype=np.float32).tobytes())


def test_random_blocks_dequantize_as_gguf_quants(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "blocks.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    data = {}
    for qt, scales in TYPES.items():
        n_val, n_bytes = gguf.GGML_QUANT_SIZES[qt]
        rows, per_row = 16, 3  # 3 blocks a row
        b = rng.integers(0, 256, (rows * per_row, n_bytes), dtype=np.uint8)
        for at in scales:  # finite scales of either sign, subnormals and zeros among them
            f = rng.choice([0.0, 6e-8, -3e-5, 1.0], size=b.shape[0]) * rng.standard_normal(b.shape[0])
            b[:, at:at + 2] = f.astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw = b.reshape(rows, per_row * n_bytes)
        w.add_tensor(qt.name, raw, raw_shape=raw.shape, raw_dtype=qt)
        data[qt.name] = (qt, raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = dump(path)
    for name, (qt, raw) in data.items():
        assert got[name] == (name, crc_f32(dequantize(raw, qt))), name


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    path = d / "f32.gguf"
    subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "tiny256", "--dtype", "f32", "--seed",
                    "4", "--out", str(path)], check=True, capture_output=True)
    return {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(str(path)).tensors}


# relative rms error of a round trip on the generator's uniform values: the step of each
# format's levels over the values' spread
MAX_ERR = {"q8_0": 0.005, "q6_k": 0.02, "q5_0": 0.04, "q5_1": 0.04, "q5_k": 0.04, "q4_0": 0.08,
           "q4_1": 0.08, "q4_k": 0.08, "iq4_nl": 0.085, "iq4_xs": 0.085, "q3_k": 0.16,
           "q2_k": 0.33}


@pytest.mark.parametrize("dtype", sorted(MAX_ERR))
def test_mkmodel_quantizes(tmp_path, f32_model, dtype):
    path = tmp_path / f"{dtype}.gguf"
    subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "tiny256", "--dtype", dtype, "--seed",
                    "4", "--out", str(path)], check=True, capture_output=True)
    seen = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type == QT.F32:
            continue
        seen.add(t.tensor_type.name)
        x = f32_model[t.name]
        raw = np.asarray(t.data)
        if t.tensor_type in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0):
            assert quantize(x, t.tensor_type).tobytes() == raw.tobytes(), t.name
        v = dequantize(raw, t.tensor_type)
        err = np.sqrt(np.mean((v - x) ** 2) / np.mean(x ** 2))
        assert err < MAX_ERR[dtype], (t.name, err)
    assert seen == {dtype.upper()}


def test_k_m_mix_assigns_types_as_llama_cpp(tmp_path):
    """q4_k_m on 12 layers: attn_v and ffn_down of the first and last eighth of the layers
    (0; 10, 11) and of every third between (3, 6, 9), and output, in Q6_K, the rest Q4_K;
    rows that are not whole 256-value blocks take the fallbacks (tiny: Q5_0, Q8_0)"""
    path = tmp_path / "m.gguf"
    subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "small", "--dtype", "q4_k_m", "--seed",
                    "1", "--out", str(path)], check=True, capture_output=True)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    six = {i for i in range(12) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"}
    assert six == {0, 3, 6, 9, 10, 11}
    assert all(types[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if i in six else "Q4_K")
               for i in range(12))
    assert types["blk.3.attn_q.weight"] == "Q4_K"
    tiny = tmp_path / "t.gguf"
    subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "tiny", "--dtype", "q4_k_m", "--out",
                    str(tiny)], check=True, capture_output=True)
    tt = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tiny)).tensors}
    assert tt["blk.1.attn_q.weight"] == "Q5_0" and tt["output.weight"] == "Q8_0"


@pytest.mark.skipif(not GEMMA.exists(), reason=f"{GEMMA} is not there (scripts/deps.sh --venv)")
def test_real_file_dequantizes_as_gguf_quants():
    """Gemma 3 270M Q4_K_M as published: every tensor is read and dequantized to the same bits
    as gguf.quants (its types: F32, Q4_K, Q5_0, Q6_K, Q8_0)"""
    got = dump(GEMMA)
    r = gguf.GGUFReader(str(GEMMA))
    types = set()
    for t in r.tensors:
        types.add(t.tensor_type.name)
        assert got[t.name] == (t.tensor_type.name,
                               crc_f32(dequantize(np.asarray(t.data), t.tensor_type))), t.name
    assert {"Q4_K", "Q6_K"} <= types


def test_unknown_type_is_not_dequantized(tmp_path):
    path = tmp_path / "tq.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    raw = np.zeros((2, 66), dtype=np.uint8)
    w.add_tensor("t", raw, raw_shape=raw.shape, raw_dtype=QT.TQ2_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert dump(path)["t"] == ("TQ2_0", "")
