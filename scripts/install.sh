#!/usr/bin/env bash
# install.sh - make install: binaries, systemd unit, sysusers/tmpfiles snippets, example
# config, man pages and docs into DESTDIR/PREFIX.
#
#   scripts/install.sh [--build DIR] [--prefix DIR] [--destdir DIR] [--unitdir DIR]
#                      [--sysconfdir DIR] [--gzip-man] [--no-setup]
#
# --build      build tree holding bin/ (default build)
# --prefix     default /usr/local; binaries go to PREFIX/bin
# --destdir    staging root (packaging); nothing outside it is touched
# --unitdir    default /lib/systemd/system for PREFIX=/usr, else PREFIX/lib/systemd/system
# --sysconfdir default /etc; an existing SYSCONFDIR/rkv/rkvd.conf is kept
# --gzip-man   compress man pages (debian policy)
# --no-setup   do not create the rkv user / directories or reload systemd, even
#              when installing into the live system as root
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=build prefix=/usr/local destdir="" unitdir="" sysconfdir=/etc gzip_man=0 setup=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --destdir) destdir=$2; shift 2 ;;
    --unitdir) unitdir=$2; shift 2 ;;
    --sysconfdir) sysconfdir=$2; shift 2 ;;
    --gzip-man) gzip_man=1; shift ;;
    --no-setup) setup=0; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see scripts/install.sh --help)" >&2; exit 2 ;;
  esac
done
case "$prefix" in
  /*) ;;
  *) echo "install.sh: PREFIX must be an absolute path, got \"$prefix\"" >&2; exit 2 ;;
esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/usr
if [ -z "$unitdir" ]; then
  if [ "$prefix" = /usr ]; then unitdir=/lib/systemd/system; else unitdir=$prefix/lib/systemd/system; fi
fi
case "$build" in /*) ;; *) build=$top/$build ;; esac

# rkvd finds rkv-kvmgr and rkv-worker beside itself, so all three are required
for b in rkvd rkv-kvmgr rkv-worker; do
  if [ ! -x "$build/bin/$b" ]; then
    echo "install.sh: $build/bin/$b is missing; run make first (make BUILD=${build#$top/})" >&2
    exit 1
  fi
done

d=$destdir
bindir=$prefix/bin
mandir=$prefix/share/man
docdir=$prefix/share/doc/rkv
libdir=$prefix/lib

install -d "$d$bindir" "$d$unitdir" "$d$libdir/sysusers.d" "$d$libdir/tmpfiles.d" \
  "$d$sysconfdir/rkv" "$d$mandir/man8" "$d$docdir"

# every program make builds (the three processes, rkvctl and the tools)
for f in "$build"/bin/*; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  install -m 0755 "$f" "$d$bindir/"
done

# the unit names /usr/bin/rkvd; point it at this prefix
sed -e "s|/usr/bin/rkvd|$bindir/rkvd|g" -e "s|--config /etc/rkv/|--config $sysconfdir/rkv/|" \
  "$top/systemd/rkvd.service" >"$d$unitdir/rkvd.service"
chmod 0644 "$d$unitdir/rkvd.service"
install -m 0644 "$top/systemd/rkv.sysusers.conf" "$d$libdir/sysusers.d/rkv.conf"
install -m 0644 "$top/systemd/rkv.tmpfiles.conf" "$d$libdir/tmpfiles.d/rkv.conf"

# the example config: installed as the config when there is none, always as
# an example beside the docs
install -m 0644 "$top/systemd/rkvd.conf" "$d$docdir/rkvd.conf.example"
if [ -e "$d$sysconfdir/rkv/rkvd.conf" ]; then
  echo "install.sh: keeping the existing $d$sysconfdir/rkv/rkvd.conf" \
       "(the example is $d$docdir/rkvd.conf.example)" >&2
else
  install -m 0644 "$top/systemd/rkvd.conf" "$d$sysconfdir/rkv/rkvd.conf"
fi

# man pages: every docs/man/NAME.SECTION
for m in "$top"/docs/man/*.[1-8]; do
  [ -f "$m" ] || continue
  sec=${m##*.}
  install -d "$d$mandir/man$sec"
  if [ $gzip_man = 1 ]; then
    gzip -9n <"$m" >"$d$mandir/man$sec/$(basename "$m").gz"
    chmod 0644 "$d$mandir/man$sec/$(basename "$m").gz"
  else
    install -m 0644 "$m" "$d$mandir/man$sec/"
  fi
done

for f in operations.md scale-out.md api.md; do
  [ -f "$top/docs/$f" ] && install -m 0644 "$top/docs/$f" "$d$docdir/"
done
for f in "$top"/docs/examples/*; do
  [ -f "$f" ] || continue
  install -d "$d$docdir/examples"
  install -m 0644 "$f" "$d$docdir/examples/"
done

echo "install.sh: installed rkv${d:+ into $d}: prefix $prefix, units $unitdir, config $sysconfdir/rkv" >&2

# into the live system: the user and directories now, so the unit can start
if [ -z "$destdir" ] && [ $setup = 1 ] && [ "$(id -u)" -eq 0 ]; then
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers "$libdir/sysusers.d/rkv.conf"
  fi
  if command -v systemd-tmpfiles >/dev/null; then
    systemd-tmpfiles --create "$libdir/tmpfiles.d/rkv.conf" || true
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
  fi
  cat >&2 <<EOT
install.sh: next: set "model = /path/to/model.gguf" in $sysconfdir/rkv/rkvd.conf, then
  systemctl enable --now rkvd
  journalctl -u rkvd -f
EOT
fi
