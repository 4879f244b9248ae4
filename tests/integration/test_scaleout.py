"""Scale-out: two rkvd instances behind Debian's nginx hashing X-Session-Id.

Runs docs/examples/nginx-rkv.conf (its upstream servers and listen address swapped for
loopback ports picked here) in front of two rkvd processes on the CPU backend, each with
its own state and runtime dirs, serving the tiny model. A multi-turn session (the same
X-Session-Id, the second prompt = first prompt + answer + more) stays on one instance:
the other's rkv:prefix_cache_queries_total does not move, and the second turn reuses the
whole prefix there (rkv:prefix_cache_hits_total rises by it, on that instance only).
Several sessions spread over both instances, each staying on its own. nginx is installed
with apt when missing (as root); the test skips, saying why, when that is not possible.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
EXAMPLE = TOP / "docs" / "examples" / "nginx-rkv.conf"
HITS = "rkv:prefix_cache_hits_total"
QUERIES = "rkv:prefix_cache_queries_total"


def find_nginx():
    for p in (shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def install_nginx():
    """nginx from apt when missing; the reason as text when it cannot be had"""
    path = find_nginx()
    if path:
        return path, None
    if os.geteuid() != 0:
        return None, "nginx is not installed and installing it needs root (apt-get install nginx-light)"
    if not shutil.which("apt-get"):
        return None, "nginx is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    errors = []
    for pkg in ("nginx-light", "nginx"):
        r = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg],
                           capture_output=True, text=True, timeout=600, env=env)
        if r.returncode == 0 and find_nginx():
            # the package's init script may have started a system nginx on :80; this test
            # runs its own
            subprocess.run(["nginx", "-s", "stop"], capture_output=True, timeout=30)
            return find_nginx(), None
        errors.append(f"apt-get install {pkg}: {r.stderr.strip()[-500:]}")
    return None, "nginx is not installed and apt-get could not install it:\n" + "\n".join(errors)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_config(ports, listen_port):
    """the shipped example with our upstreams and listen address"""
    text = EXAMPLE.read_text()
    servers = re.findall(r"^\s*server 127\.0\.0\.1:\d+ .*;$", text, re.M)
    assert len(servers) == 2, f"{EXAMPLE}: expected two upstream server lines"
    for line, port in zip(servers, ports):
        text = text.replace(line, re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{port}", line), 1)
    assert "hash $http_x_session_id consistent;" in text
    text, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{listen_port};", text)
    assert n == 1
    return text


class Nginx:
    def __init__(self, binary, root, site):
        self.root = Path(root)
        for d in ("logs", "tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "rkv.conf").write_text(site)
        conf = self.root / "nginx.conf"
        tmp = self.root / "tmp"
        conf.write_text(f"""
daemon off;
worker_processes 1;
pid {self.root}/nginx.pid;
error_log {self.root}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format up '$http_x_session_id $upstream_addr $status';
    access_log {self.root}/logs/access.log up;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {self.root}/rkv.conf;
}}
""")
        t = subprocess.run([binary, "-t", "-p", str(self.root), "-c", str(conf)],
                           capture_output=True, text=True, timeout=30)
        assert t.returncode == 0, f"nginx -t refused the example:\n{t.stderr}"
        self.proc = subprocess.Popen([binary, "-p", str(self.root), "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_listening(self, port, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read().decode(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not listen in time")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()

    def access_log(self):
        return (self.root / "logs" / "access.log").read_text()


@pytest.fixture
def cluster(rkvd_factory, tmp_path):
    binary, why = install_nginx()
    if binary is None:
        pytest.skip(why)
    a = rkvd_factory()
    b = rkvd_factory()
    port = free_port()
    ngx = Nginx(binary, tmp_path / "nginx", site_config([a.port, b.port], port))
    try:
        ngx.wait_listening(port)
        yield port, [a, b], ngx
    finally:
        ngx.stop()


def client(port, session):
    from openai import OpenAI
    return OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                  timeout=120, default_headers={"X-Session-Id": session})


def counters(servers):
    return [(s.metric(QUERIES), s.metric(HITS)) for s in servers]


def turn(port, servers, session, prompt, n):
    """one request through nginx -> (completion, index of the instance that served it,
    prefix hits there)"""
    before = counters(servers)
    r = client(port, session).completions.create(model="tiny", prompt=prompt, max_tokens=n,
                                                   temperature=0)
    after = counters(servers)
    served = [i for i in range(len(servers)) if after[i][0] > before[i][0]]
    assert len(served) == 1, f"{session}: queries moved on {served} ({before} -> {after})"
    i = served[0]
    other = 1 - i
    assert after[other] == before[other], f"{session}: the other instance moved too"
    assert after[i][0] - before[i][0] == len(prompt)
    return r, i, after[i][1] - before[i][1]


def test_session_stays_on_its_instance_and_reuses_its_prefix(cluster, ref):
    port, servers, ngx = cluster
    p1 = list(ref.tokens("A conversation that nginx pins to one rkvd by its session id"))
    a1 = ref.gen(ids=tuple(p1), n=8)
    assert a1["finish_reason"] == "length"
    r1, home, hits1 = turn(port, servers, "conv-scaleout", p1, 8)
    assert r1.choices[0].text == a1["text"]
    assert hits1 == 0

    new = list(ref.tokens(" and a second question about it", bos=False))
    p2 = p1 + a1["ids"] + new
    r2, where, hits2 = turn(port, servers, "conv-scaleout", p2, 8)
    assert where == home, "the second turn went to the other instance"
    # the whole first turn is reused but its last answer token (never run through the model)
    assert hits2 == len(p1) + len(a1["ids"]) - 1
    assert r2.choices[0].text == ref.gen(ids=tuple(p2), n=8)["text"]
    assert servers[1 - home].metric(HITS) == 0

    # a third turn still there
    p3 = p2 + ref.gen(ids=tuple(p2), n=8)["ids"] + list(ref.tokens(" once more", bos=False))
    _, where, hits3 = turn(port, servers, "conv-scaleout", p3, 4)
    assert where == home and hits3 == len(p2) + 8 - 1

    log = [l.split() for l in ngx.access_log().splitlines()]
    ups = {l[1] for l in log if l[0] == "conv-scaleout"}
    assert ups == {f"127.0.0.1:{servers[home].port}"}, log


def test_sessions_spread_over_both_instances_and_stick(cluster, ref):
    port, servers, _ = cluster
    prompt = list(ref.tokens("Many sessions share a balancer"))
    ans = ref.gen(ids=tuple(prompt), n=4)
    nxt = prompt + ans["ids"] + list(ref.tokens(" go on", bos=False))
    homes = {}
    # keep opening sessions until both instances have some (consistent hashing puts
    # each id on either with about even odds: 40 ids all on one has odds 2^-39)
    for k in range(40):
        sid = f"user-{k}"
        _, homes[sid], hits = turn(port, servers, sid, prompt, 4)
        assert hits == 0
        if len(set(homes.values())) == 2 and k >= 3:
            break
    assert set(homes.values()) == {0, 1}, f"every session went to one instance: {homes}"
    for sid, home in homes.items():
        _, where, hits = turn(port, servers, sid, nxt, 4)
        assert where == home, f"{sid} moved from instance {home} to {where}"
        assert hits == len(prompt) + len(ans["ids"]) - 1


def test_requests_without_a_session_are_spread(cluster, ref):
    """no X-Session-Id: an empty hash key, which nginx balances round-robin"""
    from openai import OpenAI
    port, servers, _ = cluster
    c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
               timeout=120)
    before = [s.metric(QUERIES) for s in servers]
    for _ in range(4):
        c.completions.create(model="tiny", prompt="no session", max_tokens=2, temperature=0)
    moved = [s.metric(QUERIES) - b for s, b in zip(servers, before)]
    assert all(m > 0 for m in moved), f"prompt tokens per instance: {moved}"
