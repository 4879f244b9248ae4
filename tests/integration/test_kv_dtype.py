"""KV element types as real processes: 8-bit KV (q8, fp8) against f16 KV on the same generated
models (full logits from rkv-gen), an 8-bit server that spills giving the logits of one that does
not, what rkvctl, the status API and /metrics say about the dtype, and the errors for a dtype
rkv does not have or a model the 8-bit types cannot hold."""
import concurrent.futures as cf
import json
import subprocess
import time

import numpy as np
import pytest

from conftest import Rkvd, _stop_checked, rkv_bin
from test_residency import (PROMPTS, Background, assert_same, resident_answers, run_one,
                            wait_events)

# prompt positions per model: + 256 steps, most of the tiny models' 2048 positions, and 4k on
# small (12 layers, head_dim 64: two q8 groups a row)
N_PROMPT = {"tiny": 1700, "qwen3-tiny": 1700, "small": 4000}
N_GEN = 256
# logits nmse against f16 KV that the issue allows
NMSE = {"q8": 1e-3, "fp8": 3e-3}


def prompt_ids(n, n_vocab=512):
    """n token ids below n_vocab, deterministic, with no run of a repeated token"""
    return [(i * 37 + 11) % (n_vocab - 3) for i in range(n)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """tiny (head_dim 16: one short q8 group a row), qwen3-tiny (head_dim 32: one whole one) and
    small"""
    d = tmp_path_factory.mktemp("kvmodels")
    out = {}
    for preset in N_PROMPT:
        path = d / f"{preset}.gguf"
        r = subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", preset, "--dtype", "f32",
                            "--seed", "3", "--out", str(path)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        out[preset] = path
    return out


def gen_logits(model, tmp_path, kv_dtype, prompt, n):
    """rkv-gen greedy: (ids, logits (n, n_vocab) float64)"""
    dump = tmp_path / f"logits-{kv_dtype}.bin"
    r = subprocess.run([rkv_bin("rkv-gen"), "--model", str(model), "--prompt-ids",
                        ",".join(map(str, prompt)), "-n", str(n), "--temp", "0", "--ignore-eos",
                        "--backend", "cpu", "--threads", "2", "--block-size", "64", "--kv-dtype",
                        kv_dtype, "--dump-logits", str(dump), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout)
    ids = info["sessions"][0]["ids"]
    logits = np.fromfile(dump, dtype="<f4").astype(np.float64).reshape(-1, info["n_vocab"])
    assert logits.shape[0] == n and len(ids) == n
    return ids, logits


def forced_logits(model, tmp_path, kv_dtype, prompt, want_ids):
    """the logits of every step given want_ids' context (teacher forcing): greedy runs that
    restart after each step whose token differs, its context fed as prompt. Returns (logits
    (len(want_ids), n_vocab), the steps whose greedy token differs)"""
    rows, differ, pos = [], [], 0
    while pos < len(want_ids):
        ids, logits = gen_logits(model, tmp_path, kv_dtype, prompt + want_ids[:pos],
                                 len(want_ids) - pos)
        k = next((i for i, t in enumerate(ids) if t != want_ids[pos + i]), len(ids))
        # steps 0..k had want_ids' context (the tokens before them agree)
        rows.append(logits[:k + 1])
        if k < len(ids):
            differ.append(pos + k)
        pos += k + 1
        assert len(differ) <= 8, f"{kv_dtype}: greedy tokens differ at steps {differ} already"
    return np.concatenate(rows)[:len(want_ids)], differ


@pytest.fixture(scope="module")
def f16_runs(models, tmp_path_factory):
    """each model's f16 KV run, made when a test first asks for it"""
    d = tmp_path_factory.mktemp("f16runs")
    runs = {}

    def get(preset):
        if preset not in runs:
            runs[preset] = gen_logits(models[preset], d, "f16", prompt_ids(N_PROMPT[preset]),
                                      N_GEN)
        return runs[preset]
    return get


@pytest.mark.parametrize("preset,kv_dtype", [("tiny", "q8"), ("qwen3-tiny", "q8"),
                                             ("small", "q8"), ("tiny", "fp8"),
                                             ("qwen3-tiny", "fp8")])
def test_8bit_kv_tracks_f16_kv(models, f16_runs, tmp_path, preset, kv_dtype):
    """256 greedy steps after a 1700-token (4000 on small) prompt, each step given f16 KV's
    context: the logits stay within the dtype's nmse of f16 KV's and the greedy token agrees on
    at least 99 % of the steps"""
    want_ids, want = f16_runs(preset)
    got, differ = forced_logits(models[preset], tmp_path, kv_dtype,
                                prompt_ids(N_PROMPT[preset]), want_ids)
    err = ((got - want) ** 2).sum() / (want ** 2).sum()
    agree = 1 - len(differ) / N_GEN
    print(f"{preset} {kv_dtype}: nmse {err:.3g}, greedy agreement {agree:.1%} (differ at "
          f"{differ})")
    assert err <= NMSE[kv_dtype], f"{kv_dtype} logits nmse {err:.3g} > {NMSE[kv_dtype]}"
    assert agree >= 0.99, f"{kv_dtype}: greedy tokens differ at steps {differ} of {N_GEN}"
    # and the 8-bit KV did round: the logits are not f16's
    assert err > 0


# the tiny model in q8 with 16 positions a block: 2 layers x (K, V) x 2 kv heads x 16 positions
# x (16 levels + one bf16 scale) = 2304 bytes, so 18 KiB of device pool hold 8 blocks
Q8_BLOCK = 2 * 2 * 2 * 16 * (16 + 2)
TIGHT_Q8 = ("--kv-dtype", "q8", "--block-size", "16", "--vram-target", f"{8 * Q8_BLOCK}B",
            "--host-budget", "8MiB", "--max-running", "16")
ROOMY_Q8 = ("--kv-dtype", "q8", "--block-size", "16", "--vram-target", "64MiB",
            "--host-budget", "8MiB", "--max-running", "16")


@pytest.fixture(scope="module")
def q8_reference(tiny_model, tmp_path_factory):
    return resident_answers(tiny_model, tmp_path_factory.mktemp("roomyq8"), ROOMY_Q8)


@pytest.mark.parametrize("mode", ["auto", "cpu_tail"])
def test_q8_spilled_sessions_give_the_resident_logits(rkvd_factory, q8_reference, mode):
    """eight sessions beside two long ones on 8 device blocks spill (their 8-bit blocks move
    to the host pool as they are): every token and log-probability is the all-resident q8
    server's"""
    srv = rkvd_factory(*TIGHT_Q8, "--mode", mode)
    with Background(srv), cf.ThreadPoolExecutor(len(PROMPTS)) as ex:
        got = dict(zip(PROMPTS, ex.map(lambda p: run_one(srv, p), PROMPTS)))
    for p in PROMPTS:
        assert_same(got[p], q8_reference[p], p[:10])
    spill = ("window", "cpu_tail") if mode == "auto" else ("cpu_tail",)
    ev = wait_events(srv, lambda ev: any(e[2] in spill for e in ev))
    assert any(e[2] in spill for e in ev), f"nothing spilled on 8 q8 device blocks: {ev}"


def kv_pool(srv, timeout=10):
    """the status API's pool once kvmgr has made its pools (rkvd learns the block bytes from
    kvmgr's status, polled a few times a second)"""
    deadline = time.monotonic() + timeout
    while True:
        pool = srv.ctl("status")["pool"]
        if pool["kv_bytes_per_token"] or time.monotonic() > deadline:
            return pool
        time.sleep(0.05)


def test_status_and_metrics_show_the_kv_dtype(rkvd_factory):
    srv = rkvd_factory(*TIGHT_Q8)
    run_one(srv, PROMPTS[0])
    pool = kv_pool(srv)
    # a position: 2 layers x (K, V) x 2 kv heads x 18 bytes
    assert pool["kv_dtype"] == "q8"
    assert pool["kv_bytes_per_token"] == Q8_BLOCK // 16 == 144
    assert pool["device_total"] == 8 * Q8_BLOCK
    r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(srv.run_dir / "admin.sock"),
                        "status"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "kv: q8, 144 bytes a token" in r.stdout, r.stdout
    assert srv.metric("rkv:kv_bytes_per_token") == 144
    assert srv.metric("rkv:cache_config_info", cache_dtype="q8", block_size="16") == 1


def test_f16_is_the_default_and_f32_takes_twice_its_bytes(tiny_model, tmp_path):
    """a server started without --kv-dtype holds f16 KV: 2 x 2 x 2 x 16 x 2 bytes a position"""
    srv = Rkvd(tiny_model, tmp_path / "dflt", ("--block-size", "16"), kv_dtype=None).start()
    try:
        pool = kv_pool(srv)
        assert pool["kv_dtype"] == "f16"
        assert pool["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2
        assert srv.metric("rkv:cache_config_info", cache_dtype="f16", block_size="16") == 1
    finally:
        _stop_checked(srv)
    srv = Rkvd(tiny_model, tmp_path / "f32", ("--block-size", "16", "--kv-dtype", "f32")).start()
    try:
        assert kv_pool(srv)["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    finally:
        _stop_checked(srv)


def test_unknown_kv_dtype_is_refused_by_name(tiny_model, tmp_path):
    r = subprocess.run([rkv_bin("rkvd"), "--model", str(tiny_model), "--kv-dtype", "int8",
                        "--state-dir", str(tmp_path / "s"), "--runtime-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert '--kv-dtype: expected one of f32|f16|q8|fp8, got "int8"' in r.stderr, r.stderr
    r = subprocess.run([rkv_bin("rkv-gen"), "--model", str(tiny_model), "--prompt-ids", "1,2",
                        "-n", "1", "--kv-dtype", "int8"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert "--kv-dtype: 'int8' is not one of f32, f16, q8, fp8" in r.stderr, r.stderr


def test_8bit_kv_needs_head_dim_a_multiple_of_8(tmp_path):
    """a head_dim of 12 has no 8-bit rows: rkv-gen says so and names the fix; f16 runs it"""
    from test_reference import write_model
    path = tmp_path / "hd12.gguf"
    write_model(path, "llama", "f32", seed=2, dim=48, n_head=4, n_head_kv=2)
    base = [rkv_bin("rkv-gen"), "--model", str(path), "--prompt-ids", "1,2", "-n", "2",
            "--backend", "cpu"]
    for dt in ("q8", "fp8"):
        r = subprocess.run([*base, "--kv-dtype", dt], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert (f"--kv-dtype {dt} needs a head_dim that is a multiple of 8 and this model's is "
                "12: use --kv-dtype f16") in r.stderr, r.stderr
    r = subprocess.run([*base, "--kv-dtype", "f16"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
