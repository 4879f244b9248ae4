"""Fixtures for tests against the real processes: the tiny model (made once per session with
rkv-mkmodel), rkvd servers on free ports with their state under tmp dirs, and the reference
tools (rkv-gen, rkv-tok) whose answers the server must match."""
import functools
import http.client
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")


def rkv_bin(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.skip(f"{path} is not built (make {path.relative_to(TOP)})")
    return str(path)


def _proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _proc_stat(pid):
    """(comm, state, ppid) of a live process, None when it is gone"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    # comm may hold spaces: it sits between the first "(" and the last ")"
    comm = s[s.index("(") + 1:s.rindex(")")]
    rest = s[s.rindex(")") + 2:].split()
    return comm, rest[0], int(rest[1])


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


class Rkvd:
    """one rkvd process with its own state and runtime dirs; listens on a port the kernel picks"""

    def __init__(self, model, root, extra=(), kv_dtype="f32"):
        self.model = str(model)
        # f32 KV unless a test asks for another (in extra, or None: rkvd's own default): the
        # pool sizes the tests choose count f32 blocks, and their references (Ref.gen, the
        # numpy model) hold f32 KV
        self.kv_dtype = kv_dtype
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.root / "run"
        self.state_dir = self.root / "state"
        self.log_path = self.root / "rkvd.log"
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.exit_code = None
        # ipc:// paths are unix socket paths: 107 bytes at most
        assert len(str(self.run_dir / "kvmgr-events.sock")) < 100, self.run_dir

    # --- lifecycle ---

    def start(self, timeout=30):
        kv = [] if self.kv_dtype is None or any(a.startswith("--kv-dtype") for a in self.extra) \
            else ["--kv-dtype", self.kv_dtype]
        args = [rkv_bin("rkvd"), "--model", self.model, "--listen", "127.0.0.1:0",
                "--backend", "cpu", "--state-dir", str(self.state_dir),
                "--runtime-dir", str(self.run_dir), "--threads", "2", *kv, *self.extra]
        self._log = open(self.log_path, "ab")
        since = self._log.tell()  # a restart in the same root appends to the log
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        try:
            while self.port is None:
                m = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log()[since:])
                if m:
                    self.port = int(m.group(1))
                    break
                self._check_alive(deadline)
                time.sleep(0.02)
            self.wait_healthy(deadline - time.monotonic())
        except BaseException:
            # nothing of a server that did not come up outlives the test
            self.proc.kill()
            self.proc.wait()
            self.exit_code = self.proc.returncode
            for pid in self.stragglers():
                os.kill(pid, signal.SIGKILL)
            self._log.close()
            raise
        return self

    def _check_alive(self, deadline):
        if self.proc.poll() is not None:
            raise AssertionError(f"rkvd exited with {self.proc.returncode}:\n{self.log()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"rkvd did not come up in time:\n{self.log()}")

    def wait_healthy(self, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            try:
                st, _, _ = self.request("GET", "/health", timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            self._check_alive(deadline)
            time.sleep(0.05)

    def wait_log(self, text, timeout=30):
        """until rkvd's log holds text"""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            self._check_alive(deadline)
            time.sleep(0.02)

    def stop(self, timeout=60, signal_it=True):
        """SIGTERM (unless the test sent it: a second one means "exit now, 1"), wait for the
        exit; returns the exit code"""
        if self.proc is None:
            return self.exit_code
        if signal_it and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            for pid in self.stragglers():
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"rkvd did not exit within {timeout}s of SIGTERM:\n"
                                 f"{self.log()[-4000:]}")
        finally:
            self._log.close()
        return self.exit_code

    def stragglers(self):
        """live processes started for this server (their argv names its runtime dir)"""
        key = str(self.run_dir).encode()
        out = []
        for pid in _pids():
            st = _proc_stat(pid)
            if st and st[1] != "Z" and key in _proc_cmdline(pid):
                out.append(pid)
        return out

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # --- children ---

    def child_pid(self, comm, timeout=10, other_than=None):
        """pid of the live child named comm ("rkv-worker", "rkv-kvmgr"); with other_than, one
        that is not that pid (a killed child shows as live until its exit has torn it down)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in _pids():
                st = _proc_stat(pid)
                if (st and st[0] == comm and st[2] == self.proc.pid and st[1] != "Z"
                        and pid != other_than):
                    return pid
            time.sleep(0.02)
        raise AssertionError(f"rkvd has no live {comm} child")

    # --- admin ---

    def ctl(self, *args, timeout=60):
        """`rkvctl --json ARGS` over this server's admin socket, parsed; asserts it succeeded"""
        r = subprocess.run([rkv_bin("rkvctl"), "--socket", str(self.run_dir / "admin.sock"),
                            "--json", *args], capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"rkvctl {' '.join(args)} -> {r.returncode}: {r.stderr}"
        return json.loads(r.stdout)

    # --- http ---

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self):
        return self.url + "/v1"

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, headers dict lowercased, body bytes)"""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def metrics_text(self):
        st, _, body = self.request("GET", "/metrics")
        assert st == 200
        return body.decode()

    def samples(self, name):
        """[(labels, value)] of the samples named so, from one scrape of /metrics"""
        from prometheus_client.parser import text_string_to_metric_families
        return [(s.labels, s.value) for fam in text_string_to_metric_families(self.metrics_text())
                for s in fam.samples if s.name == name]

    def metric(self, name, **labels):
        """one sample's value from /metrics (0 when absent)"""
        return sum((v for lb, v in self.samples(name)
                    if all(lb.get(k) == want for k, want in labels.items())), 0.0)


def _root(tmp_path_factory, name):
    # short: the runtime dir holds unix sockets
    return tmp_path_factory.mktemp(name)


def make_tiny_model(out):
    """the tests' model (rkv-mkmodel tiny, f32, seed 1) at out, unless it is there already"""
    out = Path(out)
    if not out.exists():
        r = subprocess.run([rkv_bin("rkv-mkmodel"), "--preset", "tiny", "--dtype", "f32",
                            "--seed", "1", "--out", str(out)], capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny.gguf")


def _stop_checked(srv):
    code = srv.stop()
    left = srv.stragglers()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert code == 0, f"rkvd exited with {code}:\n{srv.log()[-4000:]}"
    assert not left, f"children outlived rkvd: {left}\n{srv.log()[-4000:]}"


@pytest.fixture(scope="session")
def rkvd(tiny_model, tmp_path_factory):
    """one server shared by the tests that leave it as they found it"""
    srv = Rkvd(tiny_model, _root(tmp_path_factory, "srv"),
               ["--http-header-timeout", "1", "--max-body", "64KiB"]).start()
    yield srv
    _stop_checked(srv)


@pytest.fixture
def rkvd_factory(tiny_model, tmp_path_factory):
    """start(extra_args) -> a fresh server, stopped and checked at teardown (unless the test
    stopped it itself)"""
    servers = []

    def start(*extra):
        srv = Rkvd(tiny_model, _root(tmp_path_factory, "own"), extra)
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        if srv.exit_code is None:
            _stop_checked(srv)


# --- references ---------------------------------------------------------------------


class Ref:
    """greedy outputs and tokenizations from the command-line tools, cached"""

    def __init__(self, model):
        self.model = str(model)

    def _run(self, *args, data=None):
        r = subprocess.run([*args], input=data, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        return r.stdout

    @functools.lru_cache(maxsize=None)
    def tokens(self, text, bos=True, special=False):
        """ids the server's tokenizer gives text (BOS added as completions does)"""
        args = [rkv_bin("rkv-tok"), "--model", self.model, "--file", "-"]
        if bos:
            args.append("--bos")
        if special:
            args.append("--special")
        return tuple(json.loads(self._run(*args, data=text.encode())))

    @functools.lru_cache(maxsize=None)
    def chat_ids(self, messages_json):
        """ids of a chat prompt as rkvd renders it (template + assistant prefix, BOS)"""
        r = subprocess.run([rkv_bin("rkv-tok"), "--model", self.model, "--chat", "/dev/stdin",
                            "--gen"], input=messages_json.encode(), capture_output=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        return self.tokens(r.stdout.decode(), True, True)

    @functools.lru_cache(maxsize=None)
    def gen(self, prompt=None, ids=None, n=16, sampling=("--temp", "0")):
        """rkv-gen's answer (greedy unless sampling holds other rkv-gen flags):
        {"ids": [...], "text": ..., "finish_reason": ...}"""
        args = [rkv_bin("rkv-gen"), "--model", self.model, "-n", str(n), *sampling,
                "--backend", "cpu", "--threads", "2", "--kv-dtype", "f32", "--json"]
        if ids is not None:
            args += ["--prompt-ids", ",".join(str(i) for i in ids)]
        else:
            args += ["--prompt", prompt]
        out = json.loads(self._run(*args))
        return out["sessions"][0]


@pytest.fixture(scope="session")
def ref(tiny_model):
    return Ref(tiny_model)
