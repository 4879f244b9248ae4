"""Sliding-window layers keep their KV only while a window reads it (docs/runtime.md, "Sliding
windows"): rkv-gen on the cpu backend splits each position block into a global and local parts
and drops the dead local parts. Its KV bytes, counted from the blocks its allocator holds, stay
within a quarter of the all-global layout's on long sessions, and its logits are the same bits
as the layout that keeps every position (--swa-full) across prefill in chunks shorter and longer
than the window, decode past it, KV split between device and host, and batches; against the
NumPy reference as well. Prefix reuse of a table whose window is live is in
worker/forward_test.c (rkv-gen has no prefix cache)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ref_model import TOP, RefModel  # noqa: E402
from test_reference import _need, _run, compare_steps  # noqa: E402

GEMMA = TOP / "build" / "models" / "gemma-3-270m-q4_k_m.gguf"


def gen(model, tmp_path, prompt, n, extra=(), batch=1, tag="a"):
    """rkv-gen greedy on the cpu backend, f32 kv (the byte counts and the reference's
    tolerance below are f32's): (json output, logits (steps, batch, n_vocab))"""
    dump = tmp_path / f"logits-{tag}.bin"
    r = _run([_need("rkv-gen"), "--model", str(model), "--prompt-ids", ",".join(map(str, prompt)),
              "-n", str(n), "--temp", "0", "--ignore-eos", "--dump-logits", str(dump), "--json",
              "--backend", "cpu", "--batch", str(batch), "--kv-dtype", "f32", *extra])
    info = json.loads(r.stdout)
    raw = np.fromfile(dump, dtype="<f4")
    return info, raw.reshape(-1, batch, info["n_vocab"])


def split_vs_full(model, tmp_path, prompt, n, extra=(), batch=1):
    """the split layout's run and the --swa-full run of the same flags: identical tokens and
    logits, bit for bit; returns both runs' kv figures"""
    a, la = gen(model, tmp_path, prompt, n, extra, batch, "split")
    b, lb = gen(model, tmp_path, prompt, n, [*extra, "--swa-full"], batch, "full")
    assert [s["ids"] for s in a["sessions"]] == [s["ids"] for s in b["sessions"]]
    assert la.shape == lb.shape and la.shape[0] == n
    assert np.array_equal(la, lb), f"logits differ by up to {np.abs(la - lb).max()}"
    assert b["kv"]["parts"] == 1 and b["kv"]["bytes"] == b["kv"]["all_global_bytes"]
    return a["kv"], b["kv"]


def live_blocks(n_pos, B, n_swa, parts):
    """the blocks a session of n_pos positions holds: every global part, and the local parts
    of the position blocks a step from n_pos reads (kv_live_blocks)"""
    n = -(-n_pos // B)
    first = max(0, n_pos + 1 - n_swa) // B
    return n + (n - first) * (parts - 1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """gemma3-tiny: seven layers (global 5), one kv head of 32, a window of 8"""
    path = tmp_path_factory.mktemp("swa") / "gemma3-tiny.gguf"
    _run([_need("rkv-mkmodel"), "--preset", "gemma3-tiny", "--dtype", "f32", "--seed", "3",
          "--out", str(path)])
    return path


def prompt_of(n, vocab=512, seed=1):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(3, vocab, size=n)]


def test_long_session_bytes_and_logits(tiny, tmp_path):
    """400 prompt positions in chunks of 64 and 40 decoded, in blocks of 16: the session ends
    holding its 28 global parts and the last position block's 6 local parts, 0.15 of the
    all-global bytes, with the same logits at every step"""
    prompt, n, B = prompt_of(400), 40, 16
    split, full = split_vs_full(tiny, tmp_path, prompt, n, ["--block-size", str(B), "--chunk",
                                                            "64"])
    n_pos = len(prompt) + n
    assert split["parts"] == 7
    assert split["block_bytes"] * 7 == full["block_bytes"] == 2 * 7 * B * 32 * 4
    assert split["all_global_bytes"] == full["bytes"]
    assert split["bytes"] == live_blocks(n_pos, B, 8, 7) * split["block_bytes"]
    assert split["bytes"] <= 0.25 * full["bytes"]
    # at its peak a session holds every part of a prefill chunk's blocks, not of the prompt's
    assert split["peak_bytes"] < 0.5 * full["peak_bytes"]


@pytest.mark.parametrize("extra", [
    ["--block-size", "4", "--chunk", "5", "--host-frac", "0.5", "--split-seed", "3"],
    ["--block-size", "1", "--chunk", "3", "--host-frac", "1"],
    ["--block-size", "16", "--chunk", "64", "--host-frac", "0.3", "--split-seed", "5"],
])
def test_splits_and_batches_exact(tiny, tmp_path, extra):
    """KV partly or wholly on the host, prefill chunks shorter and longer than the window,
    blocks smaller than the window and wider, two sessions a batch: bit for bit the logits of
    the layout that keeps every position"""
    split, full = split_vs_full(tiny, tmp_path, prompt_of(90, seed=2), 24, extra, batch=2)
    assert split["bytes"] < full["bytes"]


def test_split_layout_matches_reference(tiny, tmp_path):
    """the split layout's logits equal the NumPy reference's (float64) at every step of a prompt
    and a decode past the window"""
    ref = RefModel(str(tiny))
    prompt = prompt_of(30, seed=4)
    info, logits = gen(tiny, tmp_path, prompt, 8, ["--block-size", "4", "--chunk", "7"])
    assert info["kv"]["parts"] == 7
    compare_steps(ref, prompt, info["sessions"][0]["ids"], logits[:, 0, :])


@pytest.mark.skipif(not GEMMA.exists(), reason=f"{GEMMA} is not there (scripts/deps.sh --venv)")
def test_gemma3_270m_long_session(tmp_path):
    """Gemma 3 270M (18 layers, 3 global, a window of 512) at 6004 positions in blocks of 64:
    its KV bytes within a quarter of the all-global layout's, the same logits"""
    prompt, n, B = [(i * 7919) % 20000 + 100 for i in range(6000)], 4, 64
    split, full = split_vs_full(GEMMA, tmp_path, prompt, n, ["--block-size", str(B)])
    assert split["parts"] == 6
    assert split["bytes"] == live_blocks(len(prompt) + n, B, 512, 6) * split["block_bytes"]
    assert split["bytes"] <= 0.25 * full["bytes"], split["bytes"] / full["bytes"]
