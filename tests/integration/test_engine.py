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
