"""tests/gpu/swa_check.py, the GPU's sliding-window check, in its cpu --quick mode, so the
script the gpu run depends on cannot rot: two real servers (swa_kv = window, then full) on
gemma3-tiny, the window layout's KV bytes within a quarter of the full one's, the same tokens."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")


def test_swa_check_quick(tmp_path):
    for b in ("rkvd", "rkv-kvmgr", "rkv-worker", "rkvctl", "rkv-mkmodel"):
        if not (BUILD / "bin" / b).exists():
            pytest.skip(f"{BUILD / 'bin' / b} is not built")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(TOP / "tests" / "gpu" / "swa_check.py"), "--bin",
                        str(BUILD / "bin"), "--out", str(out), "--work", str(tmp_path / "w"),
                        "--backend", "cpu", "--quick", "--threads", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "swa_check.json").read_text())
    w, f = res["window"], res["full"]
    assert w["swa_kv"] == "window" and f["swa_kv"] == "full"
    assert w["exit"] == 0 and f["exit"] == 0 and w["n_tokens"] == f["n_tokens"] == 32
    # 600 prompt positions and 32 decoded, in blocks of 16: about three position blocks of
    # local parts live beside every global one
    assert w["kv_tokens"] == f["kv_tokens"] and w["kv_tokens"] >= 631
    assert 0 < w["kv_bytes"] <= 0.25 * f["kv_bytes"]
    st = {t["target"].split(",")[0]: t["status"] for t in res["targets"]}
    assert st == {"kv bytes of a 600-position session": "PASS",
                  "the same tokens from both layouts": "PASS"}, res["targets"]
    assert (out / "rkvd-window.log").exists() and (out / "rkvd-full.log").exists()
