"""scripts/trace-phases.py, which reads gpu_bench's CUPTI trace on the device machine: a
synthetic trace of known kernels gives back each phase (end to end, overlapping kernels
included) and the layer's sum; bad input names the problem."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
SCRIPT = TOP / "scripts" / "trace-phases.py"

# one layer: (kernel, duration, start relative to the previous kernel's end)
LAYER = [("ls_kernel_qkv", 10.0, 0.5), ("rope_kv_write_kernel", 2.0, -1.0),
         ("attn_dec_kernel", 12.0, 0.25), ("ls_kernel_o", 16.0, -3.0),
         ("ls_kernel_gate_up", 50.0, 1.0), ("ls_kernel_down", 30.0, 0.0)]


def _write(path, label, n_layers):
    rows, t = [], 0.0
    rows.append([label, 0, "0.000", "5.000", "0.000", 1, 256, "embed_kernel"])
    t = 5.0
    for _ in range(n_layers):
        for name, dur, gap in LAYER:
            start = t + gap
            rows.append([label, len(rows), f"{start:.3f}", f"{dur:.3f}", f"{gap:.3f}", 132,
                         576, name])
            t = start + dur
    rows.append([label, len(rows), f"{t + 1:.3f}", "250.000", "1.000", 132, 256, "gemv"])
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if f.tell() == 0:
            w.writerow(["label", "index", "start_us", "duration_us", "gap_us", "grid", "block",
                        "kernel"])
        w.writerows(rows)


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def test_copy_rows_are_not_kernels_of_a_layer(tmp_path):
    """a prefill trace's copy rows ("memcpy HtoD", gpu_trace's copies) between the kernels
    leave the phases as they are without them"""
    plain, mixed = tmp_path / "plain.csv", tmp_path / "mixed.csv"
    _write(plain, "b=1 ctx=4096", 8)
    _write(mixed, "b=1 ctx=4096", 8)
    with open(mixed, newline="") as f:
        rows = list(csv.reader(f))
    out = [rows[0]]
    for i, r in enumerate(rows[1:]):
        out.append(r)
        if i % 3 == 0:
            out.append(["b=1 ctx=4096", f"c{i}", r[2], "40.000", "0", 1048576, 0,
                        "memcpy HtoD"])
    with open(mixed, "w", newline="") as f:
        csv.writer(f).writerows(out)
    a, b = _run(plain), _run(mixed)
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout == b.stdout


def test_phases_of_a_synthetic_trace(tmp_path):
    trace = tmp_path / "trace.csv"
    _write(trace, "b=1 ctx=4096", 8)
    _write(trace, "b=64 ctx=4096", 3)  # three layers: too few attention launches
    r = _run(trace)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "b=1 ctx=4096: one layer, medians of 6 layers (us)"
    # each phase: from the end of the kernel before to the end of its own
    want = [dur + gap for _, dur, gap in LAYER]
    got = [float(x.split()[0]) for x in lines[1:7]]
    assert got == pytest.approx(want, abs=0.006)
    assert [x.split()[1] for x in lines[1:7]] == [n for n, _, _ in LAYER]
    assert float(lines[7].split()[0]) == pytest.approx(sum(want), abs=0.006)
    assert lines[7].split()[1:] == ["the", "layer"]
    assert "b=64 ctx=4096: fewer than four attention launches" in r.stdout


def test_one_case_by_label(tmp_path):
    trace = tmp_path / "trace.csv"
    _write(trace, "b=1 ctx=512", 5)
    _write(trace, "b=1 ctx=4096", 5)
    r = _run(trace, "b=1 ctx=512")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("b=1 ctx=512:") and "ctx=4096" not in r.stdout


def test_bad_input_names_the_problem(tmp_path):
    r = _run(tmp_path / "missing.csv")
    assert r.returncode == 1 and "cannot read" in r.stderr and "RKV_PROFILE_TRACE" in r.stderr
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    r = _run(other)
    assert r.returncode == 1 and "is not a gpu_bench trace" in r.stderr
    trace = tmp_path / "trace.csv"
    _write(trace, "b=1 ctx=4096", 5)
    r = _run(trace, "b=2 ctx=1")
    assert r.returncode == 1 and "no case 'b=2 ctx=1'" in r.stderr and "b=1 ctx=4096" in r.stderr
    r = _run()
    assert r.returncode == 2 and "usage" in r.stderr
