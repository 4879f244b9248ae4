"""The engine's logits against the independent NumPy reference (ref_model.py).

1. the reference itself: batched vs one-token-at-a-time paths, dequantization vs
   gguf.quants, llama vs NeoX RoPE equivalence under the converter's row
   permutation, tied embeddings, linear rope scaling, on GGUFs written here;
2. rkv-gen on rkv-mkmodel's tiny models, every arch x dtype, all-resident and
   with half the KV on the host in small blocks: every step's logits equal the
   reference for prompt + generated[:i] within 1e-4 relative (the float types;
   the block types within their rounding, below), and greedy picks the
   reference's top token (or one tied with it within that tolerance).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ref_model import TOP, RefModel, dequantize, rkv_bin  # noqa: E402

ARCHS = ["llama", "qwen2"]
DTYPES = ["f32", "f16", "bf16", "q8_0"]
PRESET = {"llama": "tiny", "qwen2": "tiny-qwen2"}
QTYPE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}

RTOL = 1e-4  # of max|ref| per step
ATOL = 1e-5
# the cuda backend's prefill gemms (cublasGemmEx) round the activations to the
# weight type for 16-bit weights: f16 keeps 11 bits, bf16 8; q8_0 runs like f16.
# a wrong rope or a lost block is off by >1e-1, far above these.
RTOL_CUDA = {"f32": 1e-4, "f16": 2e-3, "bf16": 1e-2, "q8_0": 2e-3}
# the cpu backend's block types round each activation row to 8 bits (a scale per 32 values, per
# 256 for the k-quants and IQ4_XS) and sum in integers (worker/cpu/cpu_quant.h): on these models
# the logits move by 1.1-2.0e-2 of the step's max |logit| (q8_0 1.2 / 1.3e-2, q4_0 1.7e-2, q4_1
# 1.1e-2, q5_0 1.3e-2, q5_1 1.4e-2, iq4_nl 1.2e-2, q2_k 1.9e-2, q3_k 1.9e-2, q4_k 1.9e-2, q5_k
# 1.9e-2, q6_k 1.9e-2, iq4_xs 2.0e-2, q4_k_m 1.8e-2, q5_k_m 1.7e-2), the same on every cpu (the
# sums are exact, their float part in a fixed order); the tolerance is 1.5x that, rounded up.
# RKV_CPU_EXACT=1 (dequantized weights, f32 sums) keeps every type at RTOL.
RTOL_CPU = {"q8_0": 2e-2, "q4_0": 2.5e-2, "q4_1": 2e-2, "q5_0": 2e-2, "q5_1": 2e-2,
            "iq4_nl": 2e-2, "q2_k": 3e-2, "q3_k": 3e-2, "q4_k": 3e-2, "q5_k": 3e-2, "q6_k": 3e-2,
            "iq4_xs": 3e-2, "q4_k_m": 3e-2, "q5_k_m": 3e-2}


def rtol_for(backend, dtype):
    return RTOL_CUDA[dtype] if backend == "cuda" else RTOL_CPU.get(dtype, RTOL)


# --- GGUFs written here (the layout of docs/model-format.md) ----------------------------


def _store(w, name, arr, dtype):
    """matrix arr (n_out, n_in) float32 stored as dtype"""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "f32":
        w.add_tensor(name, arr)
    elif dtype == "f16":
        w.add_tensor(name, arr.astype(np.float16))
    else:
        q = gguf.quants.quantize(arr, QTYPE[dtype])
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=QTYPE[dtype])


def write_model(path, arch="llama", dtype="f32", seed=0, dim=64, n_layer=2, n_head=4,
                n_head_kv=2, ffn=96, n_vocab=128, tied=False, rope_dim=None, rope_scale=None,
                rope_base=10000.0, weights=None, rope_freqs=None, extra=None):
    """a small random model; weights (name -> float32 array) overrides what is drawn, extra(w)
    adds keys"""
    rng = np.random.default_rng(seed)
    hd = dim // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    if rope_dim is not None:
        w.add_rope_dimension_count(rope_dim)
    if rope_scale is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scale)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    if extra is not None:
        extra(w)

    def mat(n_out, n_in):
        return rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)

    t = {"token_embd.weight": rng.normal(0.0, 1.0, (n_vocab, dim)).astype(np.float32),
         "output_norm.weight": (1.0 + 0.1 * rng.normal(size=dim)).astype(np.float32)}
    if not tied:
        t["output.weight"] = mat(n_vocab, dim)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = (1.0 + 0.1 * rng.normal(size=dim)).astype(np.float32)
        t[p + "attn_q.weight"] = mat(n_head * hd, dim)
        t[p + "attn_k.weight"] = mat(n_head_kv * hd, dim)
        t[p + "attn_v.weight"] = mat(n_head_kv * hd, dim)
        if arch == "qwen2":
            t[p + "attn_q.bias"] = (0.1 * rng.normal(size=n_head * hd)).astype(np.float32)
            t[p + "attn_k.bias"] = (0.1 * rng.normal(size=n_head_kv * hd)).astype(np.float32)
            t[p + "attn_v.bias"] = (0.1 * rng.normal(size=n_head_kv * hd)).astype(np.float32)
        t[p + "attn_output.weight"] = mat(dim, n_head * hd)
        t[p + "ffn_norm.weight"] = (1.0 + 0.1 * rng.normal(size=dim)).astype(np.float32)
        t[p + "ffn_gate.weight"] = mat(ffn, dim)
        t[p + "ffn_up.weight"] = mat(ffn, dim)
        t[p + "ffn_down.weight"] = mat(dim, ffn)
    if rope_freqs is not None:
        t["rope_freqs.weight"] = np.asarray(rope_freqs, dtype=np.float32)
    t.update(weights or {})
    for name, arr in t.items():
        # norms and biases stay f32 (model-format.md)
        _store(w, name, arr, dtype if arr.ndim == 2 else "f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


TOKENS = [3, 17, 99, 5, 64, 127, 0, 42, 8, 77, 3, 3]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_paths_agree(tmp_path, arch, dtype):
    path = tmp_path / "m.gguf"
    write_model(path, arch, dtype, seed=1)
    m = RefModel(str(path))
    assert (m.arch, m.neox, m.n_head_kv) == (arch, arch == "qwen2", 2)
    a, b = m.logits(TOKENS), m.logits_naive(TOKENS)
    assert a.shape == (len(TOKENS), 128)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    # a prefix sees nothing of what follows it (causal)
    np.testing.assert_allclose(m.logits(TOKENS[:5]), a[:5], rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_matches_gguf_quants(tmp_path, dtype):
    path = tmp_path / "m.gguf"
    src = write_model(path, "qwen2", dtype, seed=2)
    for t in gguf.GGUFReader(str(path)).tensors:
        mine = dequantize(t)
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        np.testing.assert_array_equal(mine, ref.reshape(mine.shape), err_msg=t.name)
        # and close to what was written: q8_0 keeps about 2 digits
        tol = {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2}[dtype if mine.ndim == 2 else "f32"]
        np.testing.assert_allclose(mine, src[t.name], rtol=0, atol=tol * np.abs(src[t.name]).max())


def _neox_to_normal_rows(w, n_heads, hd):
    """rows of a q/k projection reordered per head so that pairs (i, i+hd/2) become (2i, 2i+1):
    what llama.cpp's converter does to HF weights"""
    w = w.reshape(n_heads, hd, -1)
    half = hd // 2
    order = np.empty(hd, dtype=np.int64)
    order[0::2] = np.arange(half)
    order[1::2] = np.arange(half) + half
    return w[:, order, :].reshape(n_heads * hd, -1)


@pytest.mark.parametrize("rope_scale", [None, 4.0])
def test_rope_conventions_equivalent(tmp_path, rope_scale):
    # a qwen2 model with zero biases rotates (i, i+d/2); the same model as llama with the
    # q/k rows permuted rotates (2i, 2i+1): the logits are the same
    src = write_model(tmp_path / "neox.gguf", "qwen2", "f32", seed=3, rope_scale=rope_scale,
                      weights={f"blk.{i}.attn_{x}.bias": np.zeros(64 if x == "q" else 32,
                                                                   np.float32)
                               for i in range(2) for x in "qkv"})
    perm = {}
    for i in range(2):
        perm[f"blk.{i}.attn_q.weight"] = _neox_to_normal_rows(src[f"blk.{i}.attn_q.weight"], 4, 16)
        perm[f"blk.{i}.attn_k.weight"] = _neox_to_normal_rows(src[f"blk.{i}.attn_k.weight"], 2, 16)
    keep = {k: v for k, v in src.items() if "bias" not in k}
    keep.update(perm)
    write_model(tmp_path / "normal.gguf", "llama", "f32", seed=99, rope_scale=rope_scale,
                weights=keep)
    a = RefModel(str(tmp_path / "neox.gguf")).logits(TOKENS)
    b = RefModel(str(tmp_path / "normal.gguf")).logits(TOKENS)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    # and the position matters: the unpermuted llama model differs
    keep.update({k: src[k] for k in perm})
    write_model(tmp_path / "wrong.gguf", "llama", "f32", seed=99, rope_scale=rope_scale,
                weights=keep)
    c = RefModel(str(tmp_path / "wrong.gguf")).logits(TOKENS)
    assert np.abs(a - c).max() > 1e-3


def test_linear_scaling(tmp_path):
    src = write_model(tmp_path / "s.gguf", "llama", "f32", seed=4, rope_scale=2.0)
    m = RefModel(str(tmp_path / "s.gguf"))
    assert m.rope_factor == 2.0
    write_model(tmp_path / "p.gguf", "llama", "f32", seed=4, weights=src)
    a = m.logits(TOKENS)
    assert np.abs(a - RefModel(str(tmp_path / "p.gguf")).logits(TOKENS)).max() > 1e-3
    np.testing.assert_allclose(a, m.logits_naive(TOKENS), rtol=0, atol=1e-10)
    # position p with factor f rotates pair i by (p / f) * base^(-2i/d)
    x = np.zeros((1, 1, 16))
    x[0, 0, 0] = 1.0
    y = m._rope_batched(x, np.array([3.0]))
    theta = 3.0 / 2.0
    assert np.allclose(y[0, 0, :2], [np.cos(theta), np.sin(theta)], atol=1e-15)
    x[0, 0, :2] = [0.0, 0.0]
    x[0, 0, 2] = 1.0
    theta = 1.5 * 10000.0 ** (-2.0 / 16)
    assert np.allclose(m._rope_batched(x, np.array([3.0]))[0, 0, 2:4],
                       [np.cos(theta), np.sin(theta)], atol=1e-15)


def test_tied_embeddings(tmp_path):
    # no output.weight: the logits use token_embd
    src = write_model(tmp_path / "t.gguf", "qwen2", "f16", seed=5, tied=True)
    mt = RefModel(str(tmp_path / "t.gguf"))
    assert mt.output is mt.tok_embd
    untied = dict(src)
    untied["output.weight"] = src["token_embd.weight"]
    write_model(tmp_path / "u.gguf", "qwen2", "f16", seed=5, weights=untied)
    np.testing.assert_allclose(mt.logits(TOKENS), RefModel(str(tmp_path / "u.gguf")).logits(TOKENS),
                               rtol=0, atol=1e-10)


def test_partial_rope(tmp_path):
    # rope_dim < head_dim rotates only the first rope_dim dims of each head
    write_model(tmp_path / "r.gguf", "qwen2", "f32", seed=6, rope_dim=8)
    m = RefModel(str(tmp_path / "r.gguf"))
    assert (m.rope_dim, m.head_dim) == (8, 16)
    np.testing.assert_allclose(m.logits(TOKENS), m.logits_naive(TOKENS), rtol=0, atol=1e-10)


# --- rkv-gen against the reference --------------------------------------------------------


def _need(name):
    path = rkv_bin(name)
    if path is None:
        pytest.skip(f"{name} is not built yet (make build/bin/{name}); "
                    "the engine comparison needs it")
    return str(path)


def _run(args, timeout=300, env=None):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=str(TOP),
                       env=env)
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """rkv-mkmodel's tiny models, made once: (arch, dtype) -> path"""
    mk = _need("rkv-mkmodel")
    d = tmp_path_factory.mktemp("models")
    out = {}
    for arch in ARCHS:
        for dtype in DTYPES:
            path = d / f"{arch}-{dtype}.gguf"
            _run([mk, "--preset", PRESET[arch], "--dtype", dtype, "--seed", "7", "--out",
                  str(path)])
            out[arch, dtype] = path
    return out


@pytest.fixture(scope="module")
def refs(models):
    cache = {}

    def get(arch, dtype):
        if (arch, dtype) not in cache:
            cache[arch, dtype] = RefModel(str(models[arch, dtype]))
        return cache[arch, dtype]

    return get


PROMPT = [1, 2, 3, 100, 200, 300, 42, 7, 500, 11]
N_GEN = 8


def _has_gpu():
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


# the cpu backend always; the cuda backend where a GPU is present
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _has_gpu(), reason="no NVIDIA GPU here (nvidia-smi -L); the cuda backend runs on a GPU host"))]


def run_gen(model, tmp_path, extra=(), prompt=PROMPT, n=N_GEN, batch=1, backend="cpu", env=None):
    """rkv-gen greedy; returns per session (generated ids, logits (steps, n_vocab) float32)"""
    gen = _need("rkv-gen")
    dump = tmp_path / "logits.bin"
    # the reference holds f32 KV; a caller that wants another dtype passes --kv-dtype
    if not any(str(a).startswith("--kv-dtype") for a in extra):
        extra = ("--kv-dtype", "f32", *extra)
    r = _run([gen, "--model", str(model), "--prompt-ids", ",".join(map(str, prompt)), "-n",
              str(n), "--temp", "0", "--ignore-eos", "--dump-logits", str(dump), "--json",
              "--backend", backend, "--batch", str(batch), *extra],
             env=None if env is None else {**os.environ, **env})
    info = json.loads(r.stdout)
    n_vocab = info["n_vocab"]
    assert info["prompt_ids"] == list(prompt)
    assert len(info["sessions"]) == batch
    raw = np.fromfile(dump, dtype="<f4")
    assert raw.size % (n_vocab * batch) == 0, f"{dump}: {raw.size} floats is not whole steps"
    # with --ignore-eos every session runs every step: (steps, batch, n_vocab)
    steps = raw.reshape(-1, batch, n_vocab)
    out = [(sess["ids"], steps[:, i, :]) for i, sess in enumerate(info["sessions"])]
    return out if batch > 1 else out[0]


def compare_steps(ref, prompt, ids, got, rtol=RTOL):
    """every dumped step equals the reference at the position that produced it"""
    assert len(ids) == N_GEN, f"rkv-gen made {len(ids)} tokens, asked for {N_GEN}"
    assert got.shape[0] == len(ids), f"{got.shape[0]} logit steps for {len(ids)} tokens"
    want = ref.logits(list(prompt) + list(ids[:-1]))[len(prompt) - 1 :]  # (steps, n_vocab)
    bad = []
    for i in range(len(ids)):
        diff = np.abs(got[i].astype(np.float64) - want[i])
        limit = rtol * np.abs(want[i]).max() + ATOL
        if diff.max() > limit:
            worst = np.argsort(-diff)[:5]
            bad.append(f"step {i}: max|diff| {diff.max():.3g} > {limit:.3g}; worst ids " +
                       ", ".join(f"{int(j)} (rkv {got[i][j]:.6f}, ref {want[i][j]:.6f})"
                                 for j in worst))
        # greedy picks the argmax of what it dumped, lowest id on ties
        assert ids[i] == int(np.argmax(got[i])), f"step {i}: token {ids[i]} is not the argmax"
        # and the reference's top token, or one within the tolerance of it (a near-tie)
        assert want[i][ids[i]] >= want[i].max() - limit, (
            f"step {i}: token {ids[i]} (ref {want[i][ids[i]]:.6f}) is not the reference's top "
            f"{int(np.argmax(want[i]))} (ref {want[i].max():.6f}) within {limit:.3g}")
    assert not bad, "rkv-gen logits differ from the NumPy reference:\n" + "\n".join(bad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rkv_gen_matches_reference(models, refs, tmp_path, arch, dtype, backend):
    ids, got = run_gen(models[arch, dtype], tmp_path, backend=backend)
    compare_steps(refs(arch, dtype), PROMPT, ids, got, rtol_for(backend, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rkv_gen_host_split_matches_reference(models, refs, tmp_path, arch, dtype, backend):
    # half the KV blocks on the host, 4 positions per block: 18 positions span 5 blocks
    ids, got = run_gen(models[arch, dtype], tmp_path, ["--host-frac", "0.5", "--block-size", "4"],
                       backend=backend)
    compare_steps(refs(arch, dtype), PROMPT, ids, got, rtol_for(backend, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_rkv_gen_batch_and_chunked_prefill_match_reference(models, refs, tmp_path, arch, dtype,
                                                           backend):
    # three sessions in one batch, each with its own random host/device split, and a
    # prefill cut into chunks of 3 that straddle the 4-position blocks
    out = run_gen(models[arch, dtype], tmp_path, ["--host-frac", "0.5", "--block-size", "4",
                                                  "--chunk", "3", "--split-seed", "11"], batch=3,
                  backend=backend)
    for ids, got in out:
        compare_steps(refs(arch, dtype), PROMPT, ids, got, rtol_for(backend, dtype))
    assert out[0][0] == out[1][0] == out[2][0]  # same prompt, greedy: same tokens


# every block format on rows of whole 256-value blocks (tiny256), and the _K_M mixes on the
# tiny preset too, where rows of 64 take llama.cpp's fallback types (Q5_0, Q5_1, Q8_0, IQ4_NL)
QDTYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl",
           "iq4_xs", "q4_k_m", "q5_k_m"]


@pytest.fixture(scope="module")
def qmodels(tmp_path_factory):
    mk = _need("rkv-mkmodel")
    d = tmp_path_factory.mktemp("qmodels")
    cache = {}

    def get(preset, dtype):
        if (preset, dtype) not in cache:
            path = d / f"{preset}-{dtype}.gguf"
            _run([mk, "--preset", preset, "--dtype", dtype, "--seed", "3", "--out", str(path)])
            cache[preset, dtype] = (path, RefModel(str(path)))
        return cache[preset, dtype]

    return get


@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantized_models_match_reference(qmodels, tmp_path, dtype):
    """the cpu backend reads every block format as gguf.quants dequantizes it: the logits of
    every step equal the reference's within the 8-bit activations' rounding (RTOL_CPU), all
    resident and with half the KV on host"""
    for preset in ("tiny256", "tiny") if dtype.endswith("_m") else ("tiny256",):
        path, ref = qmodels(preset, dtype)
        types = {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
        if preset == "tiny256":
            assert dtype.replace("_m", "").upper() in types, types
        ids, got = run_gen(path, tmp_path)
        compare_steps(ref, PROMPT, ids, got, rtol_for("cpu", dtype))
        ids, got = run_gen(path, tmp_path, ["--host-frac", "0.5", "--block-size", "4"])
        compare_steps(ref, PROMPT, ids, got, rtol_for("cpu", dtype))


@pytest.mark.parametrize("dtype", QDTYPES + ["q8_0"])
def test_quantized_exact_path_matches_reference(qmodels, tmp_path, dtype):
    """RKV_CPU_EXACT=1: every block type dequantized (the SIMD dequantization gives
    gguf.quants' bits) and summed as f32 weights are: the logits within 1e-4"""
    path, ref = qmodels("tiny" if dtype == "q8_0" else "tiny256", dtype)
    ids, got = run_gen(path, tmp_path, env={"RKV_CPU_EXACT": "1"})
    compare_steps(ref, PROMPT, ids, got)


def llama3_rope_freqs(head_dim, base, factor=8.0, low=1.0, high=4.0, old_ctx=8192):
    """the factors llama.cpp's converter writes for Llama 3.1's rope scaling"""
    out = []
    for i in range(0, head_dim, 2):
        freq = base ** (-i / head_dim)
        wavelen = 2 * np.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return out


def test_rope_freqs(tmp_path):
    """rope_freqs.weight (Llama 3.1+) divides each pair's frequency: the reference's two paths
    agree, the factors change the logits, and the cpu engine applies them (1e-4); a bad tensor
    is refused by name"""
    # a small base and short wavelengths so the factors bite within a short prompt
    freqs = llama3_rope_freqs(16, 10000.0, old_ctx=64)
    assert len(set(freqs)) > 2
    path, plain = tmp_path / "r.gguf", tmp_path / "p.gguf"
    write_model(path, "llama", "f32", seed=4, rope_freqs=freqs)
    write_model(plain, "llama", "f32", seed=4)
    m, p = RefModel(str(path)), RefModel(str(plain))
    a = m.logits(TOKENS)
    np.testing.assert_allclose(a, m.logits_naive(TOKENS), rtol=0, atol=1e-10)
    assert np.abs(a - p.logits(TOKENS)).max() > 1e-2 * np.abs(a).max()
    ids, got = run_gen(path, tmp_path, prompt=list(TOKENS), n=N_GEN)
    compare_steps(m, TOKENS, ids, got)
    for bad, msg in (([1.0] * 5, "expected F32 [8]"), ([1.0] * 7 + [-2.0], "rope_freqs.weight[7]")):
        write_model(path, "llama", "f32", seed=4, rope_freqs=bad)
        r = subprocess.run([_need("rkv-gen"), "--model", str(path), "--prompt-ids", "1,2", "-n",
                            "1", "--backend", "cpu"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and msg in r.stderr, r.stderr



def yarn_prompt(n, n_vocab=512):
    """n token ids below n_vocab, deterministic"""
    return [(i * 37 + 11) % (n_vocab - 3) for i in range(n)]


def test_yarn(tmp_path):
    """qwen2 with YaRN (rkv-mkmodel's qwen2-yarn-tiny: factor 4 over a trained context of 64):
    the reference's two paths agree, YaRN changes the logits, and the cpu engine gives the
    reference's logits (1e-4, exact mode) at every position up to twice the trained context"""
    path = tmp_path / "yarn.gguf"
    _run([_need("rkv-mkmodel"), "--preset", "qwen2-yarn-tiny", "--dtype", "f32", "--seed", "5",
          "--out", str(path)])
    ref = RefModel(str(path))
    # the ramp spans pairs 0..3 of 8: some extrapolate, some interpolate, some mix
    assert len(set(np.round(ref.rope_freqs, 6))) >= 4 and ref.rope_freqs.max() == 4.0
    assert ref.rope_mscale == pytest.approx(1 + 0.1 * np.log(4.0))
    short = yarn_prompt(20)
    a = ref.logits(short)
    np.testing.assert_allclose(a, ref.logits_naive(short), rtol=0, atol=1e-10)
    plain = RefModel(str(path))
    plain.rope_freqs, plain.rope_mscale = np.ones_like(plain.rope_freqs), 1.0
    assert np.abs(a - plain.logits(short)).max() > 1e-2 * np.abs(a).max()
    # prefill past the trained context, then decode on
    prompt = yarn_prompt(120)
    ids, got = run_gen(path, tmp_path, prompt=prompt, n=N_GEN, env={"RKV_CPU_EXACT": "1"})
    compare_steps(ref, prompt, ids, got)
    want = ref.logits(prompt)
    _, pre = run_gen(path, tmp_path, prompt=prompt[:100], n=1, env={"RKV_CPU_EXACT": "1"})
    assert np.abs(pre[0] - want[99]).max() <= RTOL * np.abs(want[99]).max()


def test_yarn_attn_factor(tmp_path):
    """rope.scaling.attn_factor scales the rotation's magnitude (q.k by its square); a YaRN
    model with sliding windows or a bad factor is refused by name"""
    def keys(attn_factor, factor=4.0):
        def add(w):
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(factor)
            w.add_rope_scaling_orig_ctx_len(32)
            w.add_rope_scaling_attn_factors(attn_factor)
        return add

    path = tmp_path / "y.gguf"
    write_model(path, "qwen2", "f32", seed=6, extra=keys(0.7))
    ref = RefModel(str(path))
    assert ref.rope_mscale == pytest.approx(0.7 * (1 + 0.1 * np.log(4.0)))
    prompt = yarn_prompt(48, 128)
    ids, got = run_gen(path, tmp_path, prompt=prompt, n=N_GEN, env={"RKV_CPU_EXACT": "1"})
    compare_steps(ref, prompt, ids, got)
    write_model(path, "qwen2", "f32", seed=6, extra=keys(1.0, factor=0.5))
    r = subprocess.run([_need("rkv-gen"), "--model", str(path), "--prompt-ids", "1,2", "-n", "1",
                        "--backend", "cpu"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "rope.scaling" in r.stderr, r.stderr


# --- qwen3 and gemma3 on the cpu backend (gpu_model_test holds the cuda backend to it) ------

NEW_ARCHS = {"qwen3": "qwen3-tiny", "gemma3": "gemma3-tiny"}
# longer than gemma3-tiny's window of 8, which every local layer's attention then cuts
LONG_PROMPT = [1, 2, 3, 100, 200, 300, 42, 7, 500, 11, 9, 8, 400, 401, 402, 17, 17, 250, 60, 5]


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_new_arch_reference_paths_agree(qmodels, arch):
    """the reference's batched and one-token paths agree on the presets' shapes (heads wider
    than dim / n_head, q/k head norms; gemma3's window, norms, GeGLU and tied head), and the
    window and the head norms matter"""
    _, m = qmodels(NEW_ARCHS[arch], "f32")
    assert m.head_dim == 32 and m.n_head * m.head_dim != m.dim
    a = m.logits(LONG_PROMPT)
    np.testing.assert_allclose(a, m.logits_naive(LONG_PROMPT), rtol=0, atol=1e-10)
    assert all(L["q_norm"] is not None for L in m.layers)
    if arch == "gemma3":
        assert m.output is m.tok_embd and m.n_swa == 8
        assert [L["local"] for L in m.layers] == [True] * 5 + [False, True]
        # a window longer than the prompt is no window: the logits move past position 8 only
        m.n_swa = 10 ** 6
        b = m.logits(LONG_PROMPT)
        m.n_swa = 8
        np.testing.assert_allclose(a[:8], b[:8], rtol=0, atol=1e-10)
        assert np.abs(a[8:] - b[8:]).max() > 1e-2 * np.abs(a).max()
    saved = [L["q_norm"] for L in m.layers]
    for L in m.layers:
        L["q_norm"] = np.ones_like(L["q_norm"])
    c = m.logits(LONG_PROMPT)
    for L, q in zip(m.layers, saved):
        L["q_norm"] = q
    assert np.abs(a - c).max() > 1e-3 * np.abs(a).max()


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rkv_gen_new_archs_match_reference(qmodels, tmp_path, arch, dtype):
    """the cpu engine's logits of every step equal the reference's within 1e-4 (q8_0 through
    RKV_CPU_EXACT=1), with a prompt longer than gemma3-tiny's window: all resident, and with
    half the KV on the host in blocks of 4, a prefill in chunks of 3 and two sessions a batch"""
    path, ref = qmodels(NEW_ARCHS[arch], dtype)
    env = {"RKV_CPU_EXACT": "1"}
    ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT, env=env)
    compare_steps(ref, LONG_PROMPT, ids, got)
    out = run_gen(path, tmp_path, ["--host-frac", "0.5", "--block-size", "4", "--chunk", "3",
                                   "--split-seed", "3"], prompt=LONG_PROMPT, batch=2, env=env)
    for sids, sgot in out:
        assert sids == ids
        compare_steps(ref, LONG_PROMPT, sids, sgot)


def test_phi3_fused_matrices(qmodels, tmp_path):
    """phi3's fused q/k/v and gate/up matrices, split as the HF model chunks them: the cpu
    engine's logits equal the reference's within 1e-4 (f32; q8_0 and q4_k_m through
    RKV_CPU_EXACT=1, and within the 8-bit activations' rounding on the integer path), resident
    and with half the KV on the host; swapping the halves of the fused ffn moves them"""
    for dtype in ("f32", "q8_0", "q4_k_m"):
        path, ref = qmodels("phi3-tiny", dtype)
        assert ref.arch == "phi3" and ref.neox
        ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT, env={"RKV_CPU_EXACT": "1"})
        compare_steps(ref, LONG_PROMPT, ids, got)
        out = run_gen(path, tmp_path, ["--host-frac", "0.5", "--block-size", "4", "--chunk", "3",
                                       "--split-seed", "3"], prompt=LONG_PROMPT, batch=2,
                      env={"RKV_CPU_EXACT": "1"})
        for sids, sgot in out:
            assert sids == ids
            compare_steps(ref, LONG_PROMPT, sids, sgot)
        if dtype != "f32":
            ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT)
            compare_steps(ref, LONG_PROMPT, ids, got, rtol_for("cpu", dtype))
    # the split's order matters: gate and up the other way round give other logits
    a = ref.logits(LONG_PROMPT)
    for L in ref.layers:
        L["w_gate"], L["w_up"] = L["w_up"], L["w_gate"]
    assert np.abs(ref.logits(LONG_PROMPT) - a).max() > 1e-2 * np.abs(a).max()


@pytest.mark.parametrize("attn_factor", [None, 1.19])
def test_phi3_longrope(tmp_path, attn_factor):
    """the 128k Phi-3 models' LongRoPE: the long factors divide each pair's frequency and the
    attention factor (given, or the converter's sqrt(1 + ln(s) / ln(orig))) scales cos and sin;
    the cpu engine's logits equal the reference's within 1e-4, and the factors matter"""
    path = tmp_path / "m.gguf"
    rng = np.random.default_rng(4)
    long_f = (1.0 + 3.0 * rng.random(8)).astype(np.float32)  # rope_dim 16: 8 pairs

    def keys(w):
        w.add_rope_scaling_orig_ctx_len(64)
        if attn_factor is not None:
            w.add_rope_scaling_attn_factors(attn_factor)
    write_model(path, "phi3", "f32", seed=2, n_vocab=512, extra=keys,
                weights={"rope_factors_long.weight": long_f,
                         "rope_factors_short.weight": np.ones(8, np.float32)})
    ref = RefModel(str(path))
    want = attn_factor or math.sqrt(1 + math.log(256 / 64) / math.log(64))
    assert ref.rope_mscale == pytest.approx(want, rel=1e-6)
    ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT)
    compare_steps(ref, LONG_PROMPT, ids, got)
    a = ref.logits(LONG_PROMPT)
    ref.rope_freqs, ref.rope_mscale = np.ones(8), 1.0
    assert np.abs(ref.logits(LONG_PROMPT) - a).max() > 1e-3 * np.abs(a).max()


# gemma3-tiny on the integer path moves by 2.1-2.9e-2 of a step's max |logit| (q8_0 and q4_k_m,
# seeds 1, 2, 3, 5; qwen3-tiny 1.3-1.6e-2, within RTOL_CPU): seven layers whose sub-block outputs
# are each renormed before the residual add carry the activations' rounding further than
# llama's two. 1.5x that, rounded up.
RTOL_CPU_GEMMA3 = 4.5e-2


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
@pytest.mark.parametrize("dtype", ["q8_0", "q4_k_m"])
def test_new_archs_quantized_match_reference(qmodels, tmp_path, arch, dtype):
    """the block types on the integer path: within the 8-bit activations' rounding
    (RTOL_CPU, RTOL_CPU_GEMMA3), and within 1e-4 through RKV_CPU_EXACT=1"""
    path, ref = qmodels(NEW_ARCHS[arch], dtype)
    ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT)
    compare_steps(ref, LONG_PROMPT, ids, got,
                  RTOL_CPU_GEMMA3 if arch == "gemma3" else rtol_for("cpu", dtype))
    ids, got = run_gen(path, tmp_path, prompt=LONG_PROMPT, env={"RKV_CPU_EXACT": "1"})
    compare_steps(ref, LONG_PROMPT, ids, got)


def _refused(path):
    r = subprocess.run([_need("rkv-gen"), "--model", str(path), "--prompt-ids", "1,2", "-n", "1",
                        "--backend", "cpu"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    return r.stderr


def test_unsupported_archs_refused_by_name(tmp_path):
    """mixture-of-experts files and other architectures are refused naming what rkv runs,
    never as a missing tensor"""
    supported = "(llama, qwen2, qwen3, gemma3"
    path = tmp_path / "m.gguf"
    write_model(path, "qwen3moe", "f32", seed=1)
    err = _refused(path)
    assert "'qwen3moe' is a mixture-of-experts architecture" in err and supported in err, err
    write_model(path, "falcon", "f32", seed=1)
    err = _refused(path)
    assert "'falcon' is not supported by rkv " + supported + ", phi3)" in err, err
    write_model(path, "llama", "f32", seed=1, extra=lambda w: w.add_expert_count(8))
    err = _refused(path)
    assert "llama.expert_count is 8" in err and "mixture-of-experts" in err, err
    write_model(path, "llama", "f32", seed=1,
                weights={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64), np.float32)})
    err = _refused(path)
    assert "expert tensors" in err and supported in err, err
