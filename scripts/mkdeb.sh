#!/usr/bin/env bash
# mkdeb.sh - make deb: a binary .deb of rkv built with dpkg-deb from the build tree.
#
#   scripts/mkdeb.sh [BUILD [OUTDIR]]   -> OUTDIR/rkv_VERSION_ARCH.deb (default build, BUILD)
#
# installs /usr/bin/{rkvd,rkv-kvmgr,rkv-worker,...}, /lib/systemd/system/rkvd.service,
# /usr/lib/sysusers.d/rkv.conf, /usr/lib/tmpfiles.d/rkv.conf, /etc/rkv/rkvd.conf (a
# conffile), man pages and docs. the maintainer scripts create the rkv user, enable
# rkvd.service, and start it only when rkvd.conf names a model. they honour DPKG_ROOT,
# so `dpkg --root DIR --force-script-chrootless` works on a throwaway root.
# env: RKV_DEB_VERSION overrides the version (default 0.1.0~gitN.SHA).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build=$top/$build ;; esac
outdir=${2:-$build}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
for t in dpkg-deb dpkg-shlibdeps; do
  if ! command -v $t >/dev/null; then
    echo "mkdeb.sh: $t is missing; install it: apt-get install dpkg-dev" >&2
    exit 1
  fi
done

if [ -n "${RKV_DEB_VERSION:-}" ]; then
  version=$RKV_DEB_VERSION
elif git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
  version="0.1.0~git$(git -C "$top" rev-list --count HEAD).$(git -C "$top" rev-parse --short=8 HEAD)"
else
  version=0.1.0
fi
arch=$(dpkg --print-architecture)
stage=$outdir/deb/rkv
out=$outdir/rkv_${version}_${arch}.deb
rm -rf "$stage" "$outdir"/rkv_*_"$arch".deb
mkdir -p "$stage/DEBIAN"

"$top/scripts/install.sh" --build "$build" --prefix /usr --destdir "$stage" \
  --unitdir /lib/systemd/system --sysconfdir /etc --gzip-man --no-setup

# shared-library dependencies the way debhelper computes them
shl=$outdir/deb/shlibs
rm -rf "$shl"
mkdir -p "$shl/debian"
printf 'Source: rkv\n\nPackage: rkv\nArchitecture: any\n' >"$shl/debian/control"
elfs=()
for f in "$stage"/usr/bin/*; do
  file -b "$f" 2>/dev/null | grep -q ELF && elfs+=("$f")
done
# cuBLAS comes from the CUDA toolkit (not a Debian package): no dependency
# for it, just no error
deps=$(cd "$shl" && dpkg-shlibdeps -O --ignore-missing-info \
  -l"${CUDA_HOME:-/usr/local/cuda}/lib64" "${elfs[@]}" 2>"$shl/warnings" |
  sed -n 's/^shlibs:Depends=//p')
if [ -z "$deps" ]; then
  echo "mkdeb.sh: dpkg-shlibdeps found no dependencies:" >&2
  cat "$shl/warnings" >&2
  exit 1
fi

size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: rkv
Version: $version
Architecture: $arch
Maintainer: rkv developers <rkv@localhost>
Installed-Size: $size
Depends: $deps, systemd | systemd-standalone-sysusers
Recommends: systemd
Section: net
Priority: optional
Homepage: https://localhost/rkv
Description: LLM serving daemon with a KV residency manager
 rkvd serves OpenAI-compatible completions over HTTP to many concurrent
 sessions on one or more GPUs (or the CPU), and keeps serving when the
 sessions' KV caches no longer fit in VRAM: rkv-kvmgr places each
 session's KV in VRAM or pinned host RAM and rkv-worker attends over both.
 .
 This package holds the daemon, its helper processes, a hardened systemd
 unit, the rkv system user and an example configuration.
EOF
echo /etc/rkv/rkvd.conf >"$stage/DEBIAN/conffiles"

cat >"$stage/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# postinst: the rkv user and directories, enable rkvd.service, start it only
# when a model is configured
set -e
root=${DPKG_ROOT:-}
conf=$root/etc/rkv/rkvd.conf
if [ "$1" = configure ]; then
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers ${root:+--root="$root"} rkv.conf
    elif ! getent passwd rkv >/dev/null; then
        adduser --system --group --home /var/lib/rkv --no-create-home \
            --shell /usr/sbin/nologin --gecos "rkv LLM serving daemon" rkv
    fi
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles ${root:+--root="$root"} --create rkv.conf || true
    fi
fi
if [ "$1" = configure ] || [ "$1" = abort-upgrade ] || [ "$1" = abort-deconfigure ] ||
   [ "$1" = abort-remove ]; then
    if command -v deb-systemd-helper >/dev/null 2>&1; then
        # removes only a mask that deb-systemd-helper made at removal
        deb-systemd-helper unmask rkvd.service >/dev/null || true
        # was-enabled is true on a first install: enable; later keep the admin's choice
        if deb-systemd-helper --quiet was-enabled rkvd.service; then
            deb-systemd-helper enable rkvd.service >/dev/null || true
        else
            deb-systemd-helper update-state rkvd.service >/dev/null || true
        fi
    fi
    if [ -z "$root" ] && [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if grep -Eq '^[[:space:]]*model[[:space:]]*=[[:space:]]*[^[:space:]]' "$conf" 2>/dev/null; then
            deb-systemd-invoke restart rkvd.service >/dev/null || true
        else
            echo "rkv: rkvd.service is enabled but not started: no model is configured." >&2
            echo "rkv: set \"model = /path/to/model.gguf\" in /etc/rkv/rkvd.conf, then:" >&2
            echo "rkv:   systemctl start rkvd" >&2
        fi
    fi
fi
exit 0
EOF

cat >"$stage/DEBIAN/prerm" <<'EOF'
#!/bin/sh
# prerm: stop rkvd before its files go
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    deb-systemd-invoke stop rkvd.service >/dev/null || true
fi
exit 0
EOF

cat >"$stage/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# postrm: forget the unit; purge also drops the state (sqlite: sessions, keys)
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if command -v deb-systemd-helper >/dev/null 2>&1; then
    if [ "$1" = remove ]; then
        deb-systemd-helper mask rkvd.service >/dev/null || true
    fi
    if [ "$1" = purge ]; then
        deb-systemd-helper purge rkvd.service >/dev/null || true
        deb-systemd-helper unmask rkvd.service >/dev/null || true
    fi
fi
if [ "$1" = purge ]; then
    rm -rf "${DPKG_ROOT:-}/var/lib/rkv"
fi
exit 0
EOF
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

(cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' |
  sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"

dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >/dev/null
echo "$out"
