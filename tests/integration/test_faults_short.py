"""The fault campaign in short (issue 9; `make faults` runs it for FAULT_MINUTES): 25 s of load
from 8 threads against rkvd on the cpu backend while the worker and kvmgr are SIGKILLed and rkvd
is SIGTERMed and restarted (tests/faults/faults.py). Every request completes or gets a clean
error, none hangs or is dropped, sqlite is intact after each stop, rkvd's fds stay equal at quiet
points, kvmgr's pools return to baseline, and a session afterwards gives the reference text."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    for b in ("rkvd", "rkv-kvmgr", "rkv-worker", "rkvctl", "rkv-mkmodel", "rkv-gen", "rkv-tok"):
        if not (BUILD / "bin" / b).exists():
            pytest.skip(f"{BUILD / 'bin' / b} is not built")
    tmp = tmp_path_factory.mktemp("faults")
    out = tmp / "faults.json"
    env = dict(os.environ, RKV_TOP=str(TOP), RKV_BUILD=str(BUILD))
    r = subprocess.run([sys.executable, str(TOP / "tests" / "faults" / "faults.py"),
                        "--seconds", "25", "--threads", "8", "--kills-per-round", "3",
                        "--kill-every", "2", "--out", str(out), "--workdir", str(tmp / "w")],
                       env=env, capture_output=True, text=True, timeout=150)
    assert out.exists(), f"faults.py wrote no result (exit {r.returncode}):\n{r.stderr[-4000:]}"
    res = json.loads(out.read_text())
    res["_log"] = (tmp / "w" / "r" / "rkvd.log").read_text(errors="replace")
    res["_exit"] = r.returncode
    return res


def test_every_request_ends_cleanly(campaign):
    c = campaign
    assert "exception" not in c, c["exception"]
    assert c["checks"]["no_violations"], c["violation_examples"]
    assert c["checks"]["every_request_counted"]
    assert sum(c["outcomes"].values()) == c["requests"] and c["outcomes"].get("ok", 0) > 100


def test_faults_happened(campaign):
    f = campaign["faults"]
    assert f.get("rkvd SIGTERM", 0) >= 2
    assert sum(n for k, n in f.items() if k.endswith("SIGKILL")) >= 3
    assert not campaign["problems"], campaign["problems"]


def test_state_intact_and_nothing_leaked(campaign):
    c = campaign
    assert c["integrity"] and all(x == "ok" for x in c["integrity"])
    assert all(code == 0 for code in c["rkvd_exits"]), c["_log"][-3000:]
    assert c["checks"]["rkvd_fds_equal_at_quiet_points"], c["rkvd_quiet_points"]
    assert c["checks"]["rkvd_rss_flat"], c["rkvd_quiet_points"]
    assert c["pool_used_after_evict"] == c["pool_baseline"] == 0
    assert c["sessions_left_after_evict"] == 0


def test_reference_text_afterwards(campaign):
    assert campaign["reference_mismatch"] == []
    assert campaign["ok"] and campaign["_exit"] == 0
