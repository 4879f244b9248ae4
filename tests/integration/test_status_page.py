"""The status page at GET / in headless Chromium (Debian's chromium package) while a load runs:
it renders the tactic histogram from the admin JSON, leaves no console errors, and its
screenshot is kept under the build dir (status-page.png) as a test artifact."""
import json
import os
import re
import shutil
import subprocess
import threading
import time

import pytest

from conftest import BUILD

CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\]|Uncaught|Failed to load resource")


def chromium():
    """the chromium binary; installs Debian's package when it is missing and we may"""
    path = shutil.which("chromium")
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and this user cannot apt-get install it "
                    "(apt-get install chromium)")
    try:
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
                           capture_output=True, text=True, timeout=900,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    except subprocess.TimeoutExpired:
        pytest.skip("apt-get install chromium took over 15 minutes")
    path = shutil.which("chromium")
    if not path:
        pytest.skip("chromium could not be installed: " + (r.stderr or r.stdout)[-300:])
    return path


def run_chromium(tmp_path, url, *mode):
    """(stdout, console lines) of one headless run"""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=5000", "--window-size=1280,1000", *mode, url]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, [ln for ln in r.stderr.splitlines() if CONSOLE.search(ln)]


def test_console_errors_are_seen(tmp_path):
    # the check below means something: a page that logs an error is caught
    _, console = run_chromium(tmp_path, "data:text/html,<script>console.error('boom')</script>",
                              "--dump-dom")
    assert any("boom" in ln for ln in console), console


def test_status_page_renders_a_running_load(rkvd_factory, tmp_path):
    chromium()
    srv = rkvd_factory("--block-size", "16")
    stop = threading.Event()
    errors = []

    def load(i):
        n = 0
        while not stop.is_set():
            st, _, body = srv.request("POST", "/v1/completions",
                                      {"prompt": f"session {i} keeps talking, turn {n}",
                                       "max_tokens": 48, "session_id": f"page-{i}"})
            if st != 200:
                errors.append(body)
                return
            n += 1

    threads = [threading.Thread(target=load, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        # the page polls the admin API; wait until kvmgr has published the sessions
        deadline = time.monotonic() + 30
        while True:
            st, _, body = srv.request("GET", "/admin/v1/tactics")
            if sum(json.loads(body)["result"]["gpus"][0]["sessions"].values()):
                break
            assert time.monotonic() < deadline, "no histogram from kvmgr"
            time.sleep(0.1)
        dom, console = run_chromium(tmp_path, srv.url + "/", "--dump-dom")
        shot = BUILD / "status-page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        _, console2 = run_chromium(tmp_path, srv.url + "/", f"--screenshot={shot}")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert not console and not console2, console + console2
    # the histogram of gpu 0 is drawn with the sessions of the load
    assert 'id="hist-0"' in dom
    counts = {t: int(n) for t, n in re.findall(r'data-tactic="(\w+)">(\d+)<', dom)}
    assert set(counts) == {"resident", "window", "cpu_tail", "parked"}
    assert sum(counts.values()) >= 1, counts
    assert '<canvas width="440" height="120">' in dom
    # the other panels filled in, and no error shown
    assert '<div id="err"></div>' in dom
    assert "page-0" in dom and "tokens/s" in dom and "healthy" in dom
    assert shot.stat().st_size > 10000
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_status_page_is_plain_html(rkvd):
    st, headers, body = rkvd.request("GET", "/")
    assert st == 200 and headers["content-type"].startswith("text/html")
    text = body.decode()
    # self-contained: no external scripts, styles or images
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "/admin/v1/" in text
    st, _, _ = rkvd.request("POST", "/", b"x")
    assert st == 405
