"""rkv-gen through the engine: kv splits, batches and prefill chunks change nothing.

For rkv-mkmodel's tiny models (llama and qwen2, every dtype), rkv-gen runs greedy with
all KV on the device, half and all of it tagged host (small blocks so there are many),
and as a batch of 4 copies; every dumped step's logits equal the all-device run within
1e-5 of the row's max |logit| and the generated tokens are identical.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")

ARCHS = {"llama": "tiny", "qwen2": "tiny-qwen2"}
DTYPES = ["f32", "f16", "bf16", "q8_0"]
PROMPT = "1,5,9,200,17,3,3,77,300,12,45,6,7,8,9,10,11,400,2,2,90"
N_GEN = 16
RTOL = 1e-5


def binary(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (make {BUILD}/bin/{name})")
    return str(path)


def run(args, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    mk = binary("rkv-mkmodel")
    d = tmp_path_factory.mktemp("models")
    out = {}
    for arch, preset in ARCHS.items():
        for dtype in DTYPES:
            path = d / f"{preset}-{dtype}.gguf"
            run([mk, "--preset", preset, "--dtype", dtype, "--seed", "11", "--out", str(path)])
            out[arch, dtype] = path
    return out


def gen(model, tmp_path, tag, *extra, prompt=PROMPT, n=N_GEN):
    """greedy rkv-gen -> (json, logits (steps*sessions, n_vocab))"""
    dump = tmp_path / f"{tag}.bin"
    r = run([binary("rkv-gen"), "--model", str(model), "--prompt-ids", prompt, "-n", str(n),
             "--temp", "0", "--ignore-eos", "--backend", "cpu", "--dump-logits", str(dump),
             "--json", *extra])
    info = json.loads(r.stdout)
    raw = np.fromfile(dump, dtype="<f4")
    return info, raw.reshape(-1, info["n_vocab"])


def assert_close(got, ref, what):
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    scale = np.abs(ref).max(axis=1, keepdims=True)
    err = np.abs(got - ref) / scale
    worst = err.max(axis=1)
    bad = np.nonzero(worst > RTOL)[0]
    assert bad.size == 0, f"{what}: steps {bad[:5].tolist()} differ, worst {worst.max():.3g}"


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_split_and_batch_match(models, tmp_path, arch, dtype):
    model = models[arch, dtype]
    base, ref = gen(model, tmp_path, "base", "--host-frac", "0", "--block-size", "4")
    ids = base["sessions"][0]["ids"]
    assert len(ids) == N_GEN and base["sessions"][0]["finish_reason"] == "length"
    assert ref.shape[0] == N_GEN  # prefill's last position, then one row per decode step
    # greedy takes the argmax of what it dumped
    assert np.argmax(ref, axis=1).tolist() == ids
    for frac in ["0.5", "1.0"]:
        for seed in ["1", "2"]:
            info, got = gen(model, tmp_path, f"h{frac}-{seed}", "--host-frac", frac,
                            "--split-seed", seed, "--block-size", "4")
            assert info["sessions"][0]["ids"] == ids, f"host-frac {frac}: other tokens"
            assert_close(got, ref, f"{arch} {dtype} host-frac {frac} seed {seed}")
    # 4 copies in one batch: steps x sessions rows, each session the unbatched logits
    info, got = gen(model, tmp_path, "b4", "--batch", "4", "--host-frac", "0.5",
                    "--block-size", "3")
    assert [s["ids"] for s in info["sessions"]] == [ids] * 4
    assert_close(got, np.repeat(ref, 4, axis=0), f"{arch} {dtype} batch 4")


@pytest.mark.parametrize("chunk", ["1", "7", "64"])
def test_chunked_prefill_matches(models, tmp_path, chunk):
    model = models["qwen2", "f16"]
    base, ref = gen(model, tmp_path, "base")
    info, got = gen(model, tmp_path, f"c{chunk}", "--chunk", chunk, "--block-size", "5")
    assert info["sessions"][0]["ids"] == base["sessions"][0]["ids"]
    assert_close(got, ref, f"chunk {chunk}")


def test_threads_do_not_change_logits(models, tmp_path):
    model = models["llama", "q8_0"]
    _, a = gen(model, tmp_path, "t1", "--threads", "1")
    _, b = gen(model, tmp_path, "t3", "--threads", "3")
    assert np.array_equal(a, b)


def test_warmup_changes_nothing_but_the_clock(models, tmp_path):
    """--warmup prefills the first chunk once untimed, then the timed run writes the same KV
    again: the same tokens and logits bit for bit, chunked or not, spilled or not"""
    model = models["llama", "f32"]
    for extra in ((), ("--chunk", "5", "--block-size", "4", "--host-frac", "0.5")):
        info, ref = gen(model, tmp_path, "nw", *extra)
        winfo, got = gen(model, tmp_path, "w", "--warmup", *extra)
        assert winfo["sessions"] == info["sessions"]
        assert np.array_equal(got, ref), extra
        assert winfo["timings"]["prefill_ms"] > 0


def test_json_and_text(models, tmp_path):
    model = models["llama", "f32"]
    info, _ = gen(model, tmp_path, "j", "--batch", "2")
    assert set(info) >= {"model", "n_vocab", "prompt_ids", "sessions", "timings"}
    assert info["prompt_ids"] == [int(x) for x in PROMPT.split(",")]
    assert info["n_vocab"] == 512 and len(info["sessions"]) == 2
    t = info["timings"]
    assert {"prefill_ms", "decode_ms", "prefill_tok_s", "decode_tok_s"} <= set(t)
    assert t["decode_tok_s"] > 0 and t["prefill_tok_s"] > 0
    # text mode prints what --json reports as text
    r = run([binary("rkv-gen"), "--model", str(model), "--prompt", "hello there", "-n", "8",
             "--ignore-eos", "--backend", "cpu"])
    rj = run([binary("rkv-gen"), "--model", str(model), "--prompt", "hello there", "-n", "8",
              "--ignore-eos", "--backend", "cpu", "--json"])
    assert r.stdout == json.loads(rj.stdout)["sessions"][0]["text"] + "\n"


def test_stops_at_eos(models, tmp_path):
    """without --ignore-eos a run ends at an end-of-generation token (not in ids) or at -n"""
    model = models["llama", "f32"]
    r = run([binary("rkv-gen"), "--model", str(model), "--prompt-ids", PROMPT, "-n", "40",
             "--json", "--backend", "cpu"])
    s = json.loads(r.stdout)["sessions"][0]
    assert s["finish_reason"] in ("stop", "length")
    assert len(s["ids"]) <= 40
    if s["finish_reason"] == "length":
        assert len(s["ids"]) == 40


@pytest.mark.parametrize("args,flag", [
    (["--temp", "abc"], "--temp"),
    (["--top-p", "2"], "--top-p"),
    (["--block-size", "0"], "--block-size"),
    (["--host-frac", "1.5"], "--host-frac"),
    (["--backend", "tpu"], "--backend"),
    (["--bogus"], "--bogus"),
    (["--prompt-ids", "1,x"], "--prompt-ids"),
    (["--prompt-ids", "99999"], "--prompt-ids"),
])
def test_bad_flags(models, args, flag):
    base = [binary("rkv-gen"), "--model", str(models["llama", "f32"]), "-n", "2"]
    if "--prompt-ids" not in args:
        base += ["--prompt-ids", "1,2"]
    r = run(base + args, check=False)
    assert r.returncode == 1
    assert flag in r.stderr, r.stderr


def test_missing_model_names_file(tmp_path):
    r = run([binary("rkv-gen"), "--model", str(tmp_path / "nope.gguf"), "--prompt-ids", "1",
             "-n", "1"], check=False)
    assert r.returncode == 1 and "nope.gguf" in r.stderr


# --- model files the engine refuses, with a message naming the key or tensor ------------


def write_gguf(path, arch="llama", drop=(), raw=None, extra_kv=None):
    """a small llama-shaped model; raw = (name, type, bytes of a 256-value block, fix) stores
    that matrix as random blocks of a ggml type, fix(blocks) edits them first"""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    dim, ffn, n_vocab, n_head = 256, 256, 32, 4
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(dim)
    w.add_block_count(1)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    if "eps" not in drop:
        w.add_layer_norm_rms_eps(1e-5)
    for k, v in (extra_kv or {}).items():
        w.add_string(k, v)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    shapes = {"token_embd.weight": (n_vocab, dim), "output_norm.weight": (dim,),
              "blk.0.attn_norm.weight": (dim,), "blk.0.attn_q.weight": (dim, dim),
              "blk.0.attn_k.weight": (dim, dim), "blk.0.attn_v.weight": (dim, dim),
              "blk.0.attn_output.weight": (dim, dim), "blk.0.ffn_norm.weight": (dim,),
              "blk.0.ffn_gate.weight": (ffn, dim), "blk.0.ffn_up.weight": (ffn, dim),
              "blk.0.ffn_down.weight": (dim, ffn)}
    for name, shape in shapes.items():
        if name in drop:
            continue
        if raw and name == raw[0]:
            _, qtype, nb, fix = raw
            blocks = rng.integers(0, 255, (shape[0] * shape[1] // 256, nb), dtype=np.uint8)
            fix(blocks)
            data = blocks.reshape(shape[0], -1)
            w.add_tensor(name, data, raw_shape=data.shape,
                         raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
        else:
            w.add_tensor(name, rng.normal(0, 0.1, shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gen_error(path):
    r = run([binary("rkv-gen"), "--model", str(path), "--prompt-ids", "1,2", "-n", "1",
             "--backend", "cpu"], check=False)
    assert r.returncode == 1
    return r.stderr


def test_good_handmade_model_runs(tmp_path):
    write_gguf(tmp_path / "ok.gguf")
    run([binary("rkv-gen"), "--model", str(tmp_path / "ok.gguf"), "--prompt-ids", "1,2",
         "-n", "3", "--backend", "cpu"])


def _no_fix(blocks):
    pass


@pytest.mark.parametrize("qtype,nb", [("TQ2_0", 66), ("IQ1_S", 50), ("IQ2_XXS", 66)])
def test_unsupported_tensor_type_named(tmp_path, qtype, nb):
    p = tmp_path / "model.gguf"
    write_gguf(p, raw=("blk.0.attn_q.weight", qtype, nb, _no_fix))
    err = gen_error(p)
    assert (f"{p}: tensor blk.0.attn_q.weight has type {qtype}, which rkv does not support "
            "(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
            "IQ4_NL, IQ4_XS)") in err, err


def test_nan_scale_named(tmp_path):
    """a Q4_K block whose f16 scale is NaN (0x7e00) or its min infinite (0x7c00) is refused
    with the tensor and the block, not run"""
    def finite(b):
        b[:, 0:4] = np.frombuffer(np.array([0.01, 0.001], np.float16).tobytes(), np.uint8)

    for at, bits in ((0, 0x7e00), (2, 0x7c00)):
        def fix(b, at=at, bits=bits):
            finite(b)
            b[3, at:at + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
        p = tmp_path / f"nan{at}.gguf"
        write_gguf(p, raw=("blk.0.ffn_up.weight", "Q4_K", 144, fix))
        err = gen_error(p)
        assert ("tensor blk.0.ffn_up.weight (Q4_K) has a NaN or infinite scale in block 3 "
                "(row 3)") in err, err
    p = tmp_path / "ok.gguf"
    write_gguf(p, raw=("blk.0.ffn_up.weight", "Q4_K", 144, finite))
    run([binary("rkv-gen"), "--model", str(p), "--prompt-ids", "1,2", "-n", "2",
         "--backend", "cpu"])


def test_missing_tensor_named(tmp_path):
    p = tmp_path / "model.gguf"
    write_gguf(p, drop=("blk.0.ffn_up.weight",))
    assert "tensor blk.0.ffn_up.weight is missing" in gen_error(p)


def test_missing_eps_key_named(tmp_path):
    p = tmp_path / "model.gguf"
    write_gguf(p, drop=("eps",))
    assert "llama.attention.layer_norm_rms_epsilon is missing" in gen_error(p)


def test_unknown_arch_and_rope_scaling_named(tmp_path):
    p = tmp_path / "a.gguf"
    write_gguf(p, arch="gptneox")
    assert "general.architecture 'gptneox' is not supported" in gen_error(p)
    p = tmp_path / "b.gguf"
    write_gguf(p, extra_kv={"llama.rope.scaling.type": "longrope"})
    assert ("llama.rope.scaling.type 'longrope' is not supported by rkv (none, linear, yarn)"
            in gen_error(p))
    # yarn needs its factor
    write_gguf(p, extra_kv={"llama.rope.scaling.type": "yarn"})
    assert "llama.rope.scaling.factor is missing" in gen_error(p)


def test_rkv_bench_cpu_quick(tmp_path):
    """the cpu suite runs end to end (tiny models generated on demand) and writes its JSON"""
    out = tmp_path / "bench.json"
    r = run([binary("rkv-bench"), "cpu", "--quick", "--threads", "2", "--models-dir",
             str(tmp_path / "models"), "--json", str(out)])
    assert "prefill tok/s" in r.stdout and "attention" in r.stdout
    res = json.loads(out.read_text())
    assert res["suite"] == "cpu" and res["threads"] == 2
    assert [(m["model"], m["dtype"]) for m in res["models"]] == [("tiny", "f32"),
                                                                ("tiny-qwen2", "q8_0")]
    for m in res["models"]:
        assert m["prefill_tok_s"] > 0 and m["decode_tok_s"] > 0 and m["decode_batch8_tok_s"] > 0
    a = res["attention"]
    assert a["resident_ms"] > 0 and a["host_half_ms"] > 0
    # CPU_TAIL's work, against the same bytes read by the backend's threads at once (and a
    # one-thread memcpy) in the same run
    t = res["attention_tail"]
    assert t["ctx"] == 32768 and t["gbps"] > 0 and t["memcpy_gbps"] > 0
    assert t["read_threads"] == 2 and t["read_gbps"] > 0
    assert t["over_read"] == pytest.approx(t["gbps"] / t["read_gbps"])
    assert t["over_memcpy"] == pytest.approx(t["gbps"] / t["memcpy_gbps"])
    assert "of the pool read by 2 threads" in r.stdout
    bad = run([binary("rkv-bench"), "nosuch"], check=False)
    assert bad.returncode == 1 and "unknown suite 'nosuch'" in bad.stderr


def test_rkv_bench_migrate_quick(tmp_path):
    """the migrate suite: every batch both ways and the turnover rows (n out and n in by one
    pass), each against a ceiling of the same run; a gpu side only where there is one"""
    out = tmp_path / "migrate.json"
    r = run([binary("rkv-bench"), "migrate", "--quick", "--json", str(out)])
    assert "turnover" in r.stdout
    res = json.loads(out.read_text())
    cpu = res["cpu"]
    rows = cpu["rows"]
    assert sorted({(x["direction"], x["blocks"]) for x in rows}) == sorted(
        (d, n) for d in ("demote", "promote") for n in (1, 2, 4, 8, 16, 32, 64))
    for x in rows:
        assert x["gbps"] > 0 and x["ratio"] == pytest.approx(x["gbps"] / x["ceiling_gbps"])
    turns = cpu["turnover"]
    assert [t["blocks_each_way"] for t in turns] == [1, 2, 4, 8, 16, 32]
    for t in turns:
        assert t["bytes"] == 2 * t["blocks_each_way"] * cpu["block_bytes"]
        assert t["gbps"] > 0 and t["overlap"] > 0
        assert t["ratio"] == pytest.approx(t["gbps"] / t["ceiling_gbps"])
    assert ("gpu" in res) != ("gpu_skipped" in res)
