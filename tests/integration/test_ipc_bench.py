"""rkv-bench ipc, the relay's hop (docs/runtime.md, "Block tables through rkvd"): one nng
request/reply round trip between two processes, empty and at a KV_PREP's sizes; it runs end
to end and writes its JSON."""
import json
import subprocess

from conftest import rkv_bin


def test_ipc_quick(tmp_path):
    out = tmp_path / "ipc.json"
    r = subprocess.run([rkv_bin("rkv-bench"), "ipc", "--quick", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "round trip" in r.stdout
    res = json.loads(out.read_text())
    assert res["suite"] == "ipc"
    rows = {row["case"]: row for row in res["rows"]}
    assert list(rows) == ["empty", "kv_prep b=1", "kv_prep b=64"]
    for row in rows.values():
        assert row["round_trips"] >= 600
        assert 0 < row["p50_us"] <= row["p99_us"]
    # a batch's prep and tables grow with it
    assert rows["kv_prep b=64"]["request_bytes"] > rows["kv_prep b=1"]["request_bytes"]
    assert rows["kv_prep b=64"]["reply_bytes"] > rows["kv_prep b=1"]["reply_bytes"]
