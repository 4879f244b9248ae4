"""Operations: the systemd unit, the example config, make install and the .deb.

Fast checks: the example rkvd.conf documents every key `rkvd --help` lists with its
default and rkvd accepts it; the unit carries the settings issue 9 asks for, passes
`systemd-analyze verify` once installed and scores exposure <= 3.0 in
`systemd-analyze security`; scripts/install.sh lays out a DESTDIR; scripts/mkdeb.sh
builds a .deb whose files, control fields and conffiles are right, and whose
maintainer scripts, run by `dpkg --root` on a throwaway root, create the rkv user and
enable (not start) rkvd.service, and purge removes it all again.

Slow (RKV_SLOW_TESTS=1): the .deb installed with apt into a debootstrap'ed Debian 12
(minbase + systemd); rkvd run from it by hand in a chroot as the rkv user until /health
is 200; then that root booted with systemd-nspawn, where the packaged rkvd.service must
start (notify, STATUS=), serve through its sandbox, restart after a SIGKILL with the dead
kvmgr's /dev/shm pools removed, stay failed after a config error (exit 2) and stop
cleanly. Each part skips, saying why, when its tool cannot run here.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import rkv_bin as binary

TOP = Path(os.environ.get("RKV_TOP", Path(__file__).resolve().parents[2]))
BUILD = TOP / os.environ.get("RKV_BUILD", "build")
UNIT = TOP / "systemd" / "rkvd.service"
CONF = TOP / "systemd" / "rkvd.conf"


def need_tool(name):
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


def run(args, check=True, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=kw.pop("timeout", 300),
                       **kw)
    if check:
        assert r.returncode == 0, (f"{' '.join(map(str, args))} exited {r.returncode}:\n"
                                   f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def help_keys():
    """rkvd --help -> {key: default or None}"""
    out = run([binary("rkvd"), "--help"]).stdout
    keys = {}
    for line in out.splitlines():
        m = re.match(r"\s+--([a-z0-9-]+)\s+\S+\s+(.*)$", line)
        if not m or m.group(1) == "config":
            continue
        d = re.search(r"\(default ([^)]*)\)\s*$", m.group(2))
        keys[m.group(1).replace("-", "_")] = d.group(1) if d else None
    assert len(keys) > 10, out
    return keys


def conf_entries():
    """the example's commented-out "#key = value" lines -> {key: value}"""
    out = {}
    for line in CONF.read_text().splitlines():
        m = re.match(r"#([a-z_0-9]+) =\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def unit_settings(text):
    """[Service]/[Unit] lines -> {key: [values]}"""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        k, _, v = line.partition("=")
        out.setdefault(k.strip(), []).append(v.strip())
    return out


# --- the example config -----------------------------------------------------------


def test_example_config_documents_every_key():
    keys, entries = help_keys(), conf_entries()
    missing = sorted(set(keys) - set(entries))
    assert not missing, f"systemd/rkvd.conf does not document {missing}"
    extra = sorted(set(entries) - set(keys))
    assert not extra, f"systemd/rkvd.conf documents keys rkvd does not have: {extra}"
    for k, d in keys.items():
        if d is not None and not d.startswith("the "):
            assert entries[k] == d, f"rkvd.conf: {k} shows {entries[k]!r}, rkvd's default is {d!r}"
    # each entry has a comment above it saying what it means
    lines = CONF.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"#[a-z_0-9]+ =", line):
            assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 4, \
                f"rkvd.conf line {i + 1}: {line} has no explanation above it"


def test_example_config_is_accepted(tmp_path):
    """every documented default uncommented: rkvd gets past its config and fails
    only on the (missing) model file, not with a config error (exit 2)"""
    text = []
    for line in CONF.read_text().splitlines():
        m = re.match(r"#([a-z_0-9]+) =\s*(.*)$", line)
        if m and m.group(2):
            line = f"{m.group(1)} = {m.group(2)}"
        text.append(line)
    missing_model = tmp_path / "no-such-model.gguf"
    text.append(f"model = {missing_model}")
    text.append(f"state_dir = {tmp_path / 'state'}")
    text.append(f"runtime_dir = {tmp_path / 'run'}")
    conf = tmp_path / "rkvd.conf"
    conf.write_text("\n".join(text) + "\n")
    r = run([binary("rkvd"), "--config", str(conf)], check=False, timeout=30)
    assert r.returncode == 1, f"rkvd exited {r.returncode}:\n{r.stderr}"
    assert str(missing_model) in r.stderr, r.stderr
    # and a bad value is refused at start with the key named, exit 2
    conf.write_text(conf.read_text() + "max_running = lots\n")
    r = run([binary("rkvd"), "--config", str(conf)], check=False, timeout=30)
    assert r.returncode == 2 and "max_running" in r.stderr, r.stderr


@pytest.mark.parametrize("prog", ["rkvd", "rkv-kvmgr", "rkv-worker"])
def test_man_page_lists_every_option(prog):
    out = run([binary(prog), "--help"]).stdout
    flags = re.findall(r"^\s+(--[a-z0-9-]+)", out, re.M)
    assert flags
    page = (TOP / "docs" / "man" / f"{prog}.8").read_text().replace("\\-", "-")
    missing = [f for f in flags if not re.search(rf"{f}\b(?!-)", page)]
    assert not missing, f"docs/man/{prog}.8 does not document {missing}"
    if not shutil.which("man"):
        return  # the rendering check needs man-db
    r = run(["man", "--warnings", "-l", str(TOP / "docs" / "man" / f"{prog}.8")], check=False,
            env=dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8"))
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


# --- the unit --------------------------------------------------------------------


def test_unit_has_the_required_settings():
    s = unit_settings(UNIT.read_text())
    want = {
        "Type": "notify", "Restart": "on-failure", "User": "rkv", "StateDirectory": "rkv",
        "RuntimeDirectory": "rkv", "ConfigurationDirectory": "rkv", "LimitMEMLOCK": "infinity",
        "DevicePolicy": "closed", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "NoNewPrivileges": "yes", "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes", "RestrictRealtime": "yes", "LockPersonality": "yes",
        "SystemCallArchitectures": "native", "CapabilityBoundingSet": "",
        "RemoveIPC": "no",
    }
    for k, v in want.items():
        assert s.get(k, [None])[-1] == v, f"rkvd.service: {k}={s.get(k)}, want {v!r}"
    assert "DynamicUser" not in s or s["DynamicUser"][-1] == "no"
    assert s["WatchdogSec"], "rkvd.service has no WatchdogSec"
    assert "@system-service" in s["SystemCallFilter"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    allow = " ".join(s["DeviceAllow"])
    for dev in ("char-nvidia*", "char-nvidiactl", "char-nvidia-uvm"):
        assert dev + " rw" in allow, f"rkvd.service: no DeviceAllow={dev} rw"
    exec_start = s["ExecStart"][-1]
    assert "--state-dir /var/lib/rkv" in exec_start and "--runtime-dir /run/rkv" in exec_start
    # every relaxation says why: the line above it is a comment
    lines = UNIT.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"(MemoryDenyWriteExecute|PrivateDevices|ProcSubset|PrivateUsers)=", line):
            assert lines[i - 1].startswith("#"), f"rkvd.service: {line} has no reason above it"


def install(tmp_path, prefix, *extra):
    r = run([str(TOP / "scripts" / "install.sh"), "--no-setup", "--build", str(BUILD),
             "--prefix", str(prefix), *extra])
    return r


def test_installed_unit_verifies(tmp_path):
    """systemd-analyze verify on the unit installed under a prefix in tmp: its
    ExecStart exists there, and its man pages (Documentation=) resolve"""
    sa = need_tool("systemd-analyze")
    binary("rkvd")
    prefix = tmp_path / "usr"
    install(tmp_path, prefix, "--sysconfdir", str(tmp_path / "etc"))
    unit = prefix / "lib" / "systemd" / "system" / "rkvd.service"
    assert f"ExecStart={prefix}/bin/rkvd --config {tmp_path}/etc/rkv/rkvd.conf" in unit.read_text()
    env = dict(os.environ, MANPATH=str(prefix / "share" / "man"))
    r = run([sa, "verify", str(unit)], check=False, env=env)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_unit_security_exposure():
    sa = need_tool("systemd-analyze")
    r = run([sa, "security", "--offline=true", "--no-pager", str(UNIT)], check=False)
    m = re.search(r"Overall exposure level for rkvd.service: ([0-9.]+) (\w+)", r.stdout + r.stderr)
    if m is None and "--offline" in r.stderr:
        pytest.skip(f"systemd-analyze {sa} has no --offline: {r.stderr.strip()[:200]}")
    assert m, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= 3.0, f"exposure {m.group(1)} {m.group(2)}:\n{r.stdout}"


# --- make install -----------------------------------------------------------------


def test_make_install_target_calls_the_script():
    r = run(["make", "-n", "-C", str(TOP), f"BUILD={BUILD}", "DESTDIR=/x", "install"],
            check=False)
    assert f"scripts/install.sh --build {BUILD} --prefix /usr/local --destdir \"/x\"" in r.stdout, \
        r.stdout[-2000:] + r.stderr[-2000:]
    r = run(["make", "-n", "-C", str(TOP), f"BUILD={BUILD}", "PREFIX=/opt/rkv", "install"],
            check=False)
    assert "--prefix /opt/rkv" in r.stdout
    r = run(["make", "-n", "-C", str(TOP), f"BUILD={BUILD}", "deb"], check=False)
    assert f"scripts/mkdeb.sh {BUILD}" in r.stdout


def test_install_destdir_layout(tmp_path):
    binary("rkvd")
    dest = tmp_path / "dest"
    install(tmp_path, "/usr/local", "--destdir", str(dest))
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    for f in ("usr/local/bin/rkvd", "usr/local/bin/rkv-kvmgr", "usr/local/bin/rkv-worker",
              "usr/local/lib/systemd/system/rkvd.service", "usr/local/lib/sysusers.d/rkv.conf",
              "usr/local/lib/tmpfiles.d/rkv.conf", "etc/rkv/rkvd.conf",
              "usr/local/share/man/man8/rkvd.8", "usr/local/share/man/man8/rkv-kvmgr.8",
              "usr/local/share/man/man8/rkv-worker.8",
              "usr/local/share/doc/rkv/rkvd.conf.example"):
        assert f in files, f"make install did not install {f}; it installed {sorted(files)}"
    for b in ("rkvd", "rkv-kvmgr", "rkv-worker"):
        assert os.access(dest / "usr/local/bin" / b, os.X_OK)
    unit = (dest / "usr/local/lib/systemd/system/rkvd.service").read_text()
    assert "ExecStart=/usr/local/bin/rkvd " in unit
    # a second install keeps the operator's config
    (dest / "etc/rkv/rkvd.conf").write_text("model = /srv/m.gguf\n")
    r = install(tmp_path, "/usr/local", "--destdir", str(dest))
    assert (dest / "etc/rkv/rkvd.conf").read_text() == "model = /srv/m.gguf\n"
    assert "keeping the existing" in r.stderr


# --- the .deb -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    need_tool("dpkg-deb")
    need_tool("dpkg-shlibdeps")
    binary("rkvd")
    out = tmp_path_factory.mktemp("deb")
    r = run([str(TOP / "scripts" / "mkdeb.sh"), str(BUILD), str(out)])
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.exists() and path.parent == out, r.stdout
    return path


def test_deb_contents(deb, tmp_path):
    root = tmp_path / "x"
    run(["dpkg-deb", "-x", str(deb), str(root)])
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    want = {"usr/bin/rkvd", "usr/bin/rkv-kvmgr", "usr/bin/rkv-worker",
            "lib/systemd/system/rkvd.service", "usr/lib/sysusers.d/rkv.conf",
            "usr/lib/tmpfiles.d/rkv.conf", "etc/rkv/rkvd.conf",
            "usr/share/man/man8/rkvd.8.gz", "usr/share/man/man8/rkv-kvmgr.8.gz",
            "usr/share/man/man8/rkv-worker.8.gz"}
    assert want <= files, f"missing from the .deb: {sorted(want - files)}"
    assert not [f for f in files if f.startswith(("usr/local", "build", "tmp"))], sorted(files)
    assert "ExecStart=/usr/bin/rkvd " in (root / "lib/systemd/system/rkvd.service").read_text()
    assert (root / "etc/rkv/rkvd.conf").read_bytes() == CONF.read_bytes()

    ctl = tmp_path / "ctl"
    run(["dpkg-deb", "-e", str(deb), str(ctl)])
    assert (ctl / "conffiles").read_text().split() == ["/etc/rkv/rkvd.conf"]
    control = (ctl / "control").read_text()
    for dep in ("libc6", "libnng1", "libuv1", "libsqlite3-0", "libsystemd0"):
        assert re.search(rf"^Depends:.*\b{re.escape(dep)}\b", control, re.M), control
    for s in ("postinst", "prerm", "postrm"):
        assert os.access(ctl / s, os.X_OK)
        run(["sh", "-n", str(ctl / s)])
    # every file is owned by root
    listing = run(["dpkg-deb", "-c", str(deb)]).stdout
    assert all(l.split()[1] == "root/root" for l in listing.splitlines()), listing


def test_deb_installs_on_a_throwaway_root(deb, tmp_path):
    """dpkg --root with the maintainer scripts run chrootless (they honour DPKG_ROOT):
    the rkv user exists, rkvd.service is enabled, the directories belong to rkv,
    nothing is started; purge takes it all away again"""
    need_tool("dpkg")
    need_tool("systemd-sysusers")
    need_tool("deb-systemd-helper")
    if os.geteuid() != 0:
        pytest.skip("dpkg --root needs root to chown the installed files")
    root = tmp_path / "root"
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/updates").mkdir()
    (root / "var/lib/dpkg/status").write_text("")
    dpkg = ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends",
            "--log=/dev/null"]
    r = run(dpkg + ["-i", str(deb)])
    assert "enabled but not started" not in r.stderr  # no systemd in a --root install
    passwd = (root / "etc/passwd").read_text()
    m = re.search(r"^rkv:x:(\d+):(\d+):[^:]*:/var/lib/rkv:/usr/sbin/nologin$", passwd, re.M)
    assert m, passwd
    uid = int(m.group(1))
    assert uid < 1000, f"rkv is not a system user: uid {uid}"
    assert re.search(rf"^rkv:x:{m.group(2)}:", (root / "etc/group").read_text(), re.M)
    link = root / "etc/systemd/system/multi-user.target.wants/rkvd.service"
    assert link.is_symlink() and os.readlink(link) == "/lib/systemd/system/rkvd.service"
    st = (root / "var/lib/rkv").stat()
    assert st.st_uid == uid and (st.st_mode & 0o777) == 0o750
    assert (root / "usr/bin/rkvd").exists()
    status = run(["dpkg", f"--root={root}", "-s", "rkv"]).stdout
    assert "Status: install ok installed" in status

    # the operator's config survives a reinstall (conffile), and purge removes all
    conf = root / "etc/rkv/rkvd.conf"
    conf.write_text(conf.read_text() + "model = /srv/model.gguf\n")
    run(dpkg + ["-i", str(deb)])
    assert "model = /srv/model.gguf" in conf.read_text()
    run(dpkg + ["--purge", "rkv"])
    assert not (root / "usr/bin/rkvd").exists()
    assert not conf.exists()
    assert not link.exists()
    assert not (root / "var/lib/rkv").exists()


# --- slow: a debootstrap root, used with chroot and booted with systemd-nspawn ----------

SLOW = os.environ.get("RKV_SLOW_TESTS") == "1"
slow = pytest.mark.skipif(not SLOW, reason="slow (debootstrap + apt): set RKV_SLOW_TESTS=1")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apt_install(pkg, tool):
    if shutil.which(tool):
        return None
    r = run(["apt-get", "install", "-y", "-qq", pkg], check=False, timeout=600,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if r.returncode != 0 or not shutil.which(tool):
        return f"{tool} is missing and apt-get could not install {pkg}:\n{r.stderr[-1500:]}"
    return None


def get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as h:
            return h.status, h.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def debroot(deb, tmp_path_factory):
    """Debian 12 (minbase + systemd) with the .deb installed by apt and the tiny model in
    /var/lib/rkv"""
    if os.geteuid() != 0:
        pytest.skip("debootstrap and chroot need root")
    why = apt_install("debootstrap", "debootstrap")
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("debroot") / "root"
    mirror = os.environ.get("RKV_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    r = run(["debootstrap", "--variant=minbase", "--include=systemd,systemd-sysv,dbus",
             "bookworm", str(root), mirror], check=False, timeout=1200)
    if r.returncode != 0:
        pytest.skip(f"debootstrap bookworm from {mirror} failed (no network?):\n"
                    f"{r.stderr[-1500:]}")
    # /var/tmp: a booted container mounts a fresh /tmp
    shutil.copy(deb, root / "var/tmp" / deb.name)
    m = run(["mount", "-t", "proc", "proc", str(root / "proc")], check=False)
    if m.returncode != 0:
        pytest.skip(f"cannot mount /proc in the chroot: {m.stderr.strip()}")
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = run(["chroot", str(root), "apt-get", "install", "-y", "-q", f"/var/tmp/{deb.name}"],
                env=env, timeout=900)
        # no systemd runs in a chroot: enabled, not started, and said so? (no /run/systemd)
        assert "Setting up rkv" in r.stdout
        run(["chroot", str(root), "getent", "passwd", "rkv"])
        assert (root / "etc/systemd/system/multi-user.target.wants/rkvd.service").is_symlink()
        assert (root / "var/lib/rkv").stat().st_mode & 0o777 == 0o750
        run(["chroot", str(root), "systemd-analyze", "verify", "--man=no",
             "/lib/systemd/system/rkvd.service"])
        run([binary("rkv-mkmodel"), "--preset", "tiny", "--dtype", "f32", "--seed", "1",
             "--out", str(root / "var/lib/rkv/tiny.gguf")])
        run(["chroot", str(root), "chown", "rkv:rkv", "/var/lib/rkv/tiny.gguf"])
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)
    yield root
    # a few hundred MB: not kept among pytest's last runs
    if not any(str(root) in l for l in Path("/proc/self/mounts").read_text().splitlines()):
        shutil.rmtree(root, ignore_errors=True)


def configure(root, port, *extra):
    conf = root / "etc/rkv/rkvd.conf"
    base = conf.read_text().split("# --- test ---\n")[0]
    conf.write_text(base + "# --- test ---\nmodel = /var/lib/rkv/tiny.gguf\n"
                    f"listen = 127.0.0.1:{port}\nbackend = cpu\nthreads = 2\n"
                    "vram_target = 64MiB\nhost_budget = 64MiB\n" + "".join(extra))


@slow
def test_deb_in_debootstrap_chroot(debroot, tmp_path):
    """the installed rkvd, run by hand as rkv in the chroot, serves"""
    root = debroot
    port = free_port()
    configure(root, port)
    mounts = []
    try:
        for what, where in (("proc", "proc"), ("tmpfs", "dev/shm")):
            (root / where).mkdir(parents=True, exist_ok=True)
            run(["mount", "-t", what, what, str(root / where)])
            mounts.append(root / where)
        run(["chroot", str(root), "install", "-d", "-o", "rkv", "-g", "rkv", "/run/rkv"])
        p = subprocess.Popen(["chroot", "--userspec=rkv:rkv", str(root), "/usr/bin/rkvd",
                              "--config", "/etc/rkv/rkvd.conf"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(lambda: p.poll() is not None or
                     get(f"http://127.0.0.1:{port}/health")[0] == 200, 120, "/health")
            assert p.poll() is None, f"rkvd in the chroot exited {p.returncode}"
        finally:
            p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out[-3000:]
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], check=False)


class Container:
    """the debootstrap root booted with systemd-nspawn (host network); commands run in it
    through nsenter"""

    def __init__(self, root, log):
        self.log = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--register=no", "--keep-unit", "--quiet", "-D", str(root),
             "-b", "--console=pipe", "-M", "rkvtest"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self.init = wait_for(self._init_pid, 60, "the container's init")
            wait_for(lambda: self.sh("systemctl is-system-running").stdout.strip()
                     in ("running", "degraded"), 180, "the container to boot")
        except BaseException:
            self.stop()
            raise

    def _init_pid(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited {self.proc.returncode}:\n"
                                 f"{Path(self.log).read_text(errors='replace')[-3000:]}")
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return None
        return int(kids.split()[0]) if kids.split() else None

    def sh(self, cmd, check=False, timeout=120):
        return run(["nsenter", "-t", str(self.init), "-a", "/bin/sh", "-c", cmd], check=check,
                   timeout=timeout)

    def show(self, *props):
        out = self.sh("systemctl show rkvd " + " ".join(f"-p {p}" for p in props),
                      check=True).stdout
        return dict(l.split("=", 1) for l in out.splitlines() if "=" in l)

    def stop(self):
        if self.proc.poll() is None:
            if getattr(self, "init", None):
                self.sh("systemctl poweroff")
            else:
                self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@slow
def test_deb_service_under_systemd(debroot, tmp_path):
    """the packaged unit, booted by systemd in the debootstrap root: Type=notify start with
    STATUS, serving through the whole hardening set (CPU backend), restart after a
    SIGKILL with the dead kvmgr's /dev/shm pools collected, no restart on a config error
    (exit 2), a clean stop that leaves no pool behind"""
    why = apt_install("systemd-container", "systemd-nspawn")
    if why:
        pytest.skip(why)
    root = debroot
    port = free_port()
    configure(root, port)
    try:
        c = Container(root, tmp_path / "nspawn.log")
    except AssertionError as e:
        pytest.skip(f"systemd-nspawn cannot boot the root here: {e}\n"
                    f"{(tmp_path / 'nspawn.log').read_text(errors='replace')[-2000:]}")
    try:
        # enabled by the package, so it started at boot
        wait_for(lambda: c.show("ActiveState")["ActiveState"] in ("active", "failed"), 120,
                 "rkvd.service to start")
        st = c.show("ActiveState", "StatusText", "MainPID", "User", "WatchdogUSec",
                    "NRestarts")
        assert st["ActiveState"] == "active", c.sh("journalctl -u rkvd --no-pager").stdout
        assert st["StatusText"].startswith("serving"), st
        assert st["User"] == "rkv" and st["WatchdogUSec"] == "30s", st
        assert get(f"http://127.0.0.1:{port}/health")[0] == 200
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as h:
            assert json.loads(h.read())["usage"]["completion_tokens"] == 4
        exposure = c.sh("systemd-analyze security rkvd.service --no-pager").stdout
        m = re.search(r"Overall exposure level for rkvd.service: ([0-9.]+)", exposure)
        assert m and float(m.group(1)) <= 3.0, exposure[-1500:]
        ps = c.sh("ls /dev/shm").stdout.split()
        assert ps and all(f.startswith("rkv-") for f in ps), ps

        # SIGKILL the main process: systemd restarts the unit, the old pools go
        main = int(st["MainPID"])
        c.sh(f"kill -9 {main}", check=True)
        wait_for(lambda: c.show("NRestarts")["NRestarts"] == "1" and
                 c.show("ActiveState")["ActiveState"] == "active" and
                 get(f"http://127.0.0.1:{port}/health")[0] == 200, 60, "the restart")
        pools = c.sh("ls /dev/shm").stdout.split()
        pids = {f.split("-")[1] for f in pools}
        assert len(pids) == 1 and not (set(ps) & set(pools)), (ps, pools)

        # a configuration error: exit 2, failed, not restarted
        configure(root, port, "max_running = lots\n")
        c.sh("systemctl restart rkvd")
        wait_for(lambda: c.show("ActiveState")["ActiveState"] == "failed", 60, "failure")
        time.sleep(6)  # past RestartSec: a restart would have happened by now
        st = c.show("ActiveState", "ExecMainStatus", "NRestarts")
        assert st == {"ActiveState": "failed", "ExecMainStatus": "2", "NRestarts": "0"}, st
        assert "max_running" in c.sh("journalctl -u rkvd --no-pager -n 20").stdout

        # fixed, started, stopped cleanly: exit 0 and /dev/shm empty
        configure(root, port)
        c.sh("systemctl start rkvd", check=True)
        assert c.show("ActiveState")["ActiveState"] == "active"
        c.sh("systemctl stop rkvd", check=True)
        st = c.show("ActiveState", "ExecMainStatus", "Result")
        assert st == {"ActiveState": "inactive", "ExecMainStatus": "0", "Result": "success"}, st
        assert c.sh("ls /dev/shm").stdout.split() == []

        # the maintainer scripts under a running systemd: without a model the service
        # stays stopped and the admin is told why; with one, a reinstall (an upgrade)
        # starts it
        conf = root / "etc/rkv/rkvd.conf"
        conf.write_text(conf.read_text().split("# --- test ---\n")[0])
        reinstall = (f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall "
                     f"/var/tmp/{deb_name(root)} 2>&1")
        out = c.sh(reinstall, check=True).stdout
        assert "enabled but not started: no model is configured" in out, out
        assert c.show("ActiveState")["ActiveState"] == "inactive"
        configure(root, port)
        c.sh(reinstall, check=True)
        assert c.show("ActiveState")["ActiveState"] == "active"
        assert get(f"http://127.0.0.1:{port}/health")[0] == 200
    finally:
        c.stop()


def deb_name(root):
    return next((root / "var/tmp").glob("rkv_*.deb")).name
