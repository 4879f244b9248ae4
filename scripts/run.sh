#!/usr/bin/env bash
# make run: generate the default model if absent and start rkvd on the CPU
# backend on 127.0.0.1:8080 with its state under build/run/.
set -euo pipefail
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
model="$build/models/small.gguf"
preset=${RKV_RUN_PRESET:-small}
model="$build/models/$preset.gguf"
if [ ! -x "$build/bin/rkvd" ]; then
  echo "rkv: rkvd is not built yet (daemon/ has no main.c in this checkout)." >&2
  echo "rkv: what exists now: $(ls "$build/bin" 2>/dev/null | tr '\n' ' ')" >&2
  exit 1
fi
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  echo "rkv: generating $model (rkv-mkmodel --preset $preset)" >&2
  "$build/bin/rkv-mkmodel" --preset "$preset" --dtype f16 --seed 1 --out "$model.tmp"
  mv "$model.tmp" "$model"
fi
mkdir -p "$build/run/state" "$build/run/runtime"
cat >&2 <<EOT
rkv: starting rkvd on http://127.0.0.1:8080 (CPU backend, model $model)
rkv: try:
  curl -s http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model":"$preset","prompt":"Hello","max_tokens":16}'
EOT
exec "$build/bin/rkvd" --model "$model" --listen 127.0.0.1:8080 --backend cpu \
  --state-dir "$build/run/state" --runtime-dir "$build/run/runtime" "${@:2}"
