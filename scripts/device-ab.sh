#!/bin/sh
# device-ab.sh - gpu_bench decode suite (--quick) once per variant of the RKV_CUDA_* switches,
# in one run, for an a/b of kernel choices measured in the same run (env SUITE=prefill
# for the prefill cases, QUICK= for all of a suite's lengths):
#   here:  scripts/bench-system.sh --pack .benchpack build/bs
#   there: sh scripts/device-ab.sh .benchpack $OUT default RKV_CUDA_EARLY=0 RKV_CUDA_SPLIT_COST=2
# a variant is "default" or VAR=VALUE[,VAR=VALUE...], either after "PACK2:" to run another
# pack's gpu_bench (an older build against this tree's in one run; PACK2.tgz is unpacked beside
# it when only that came):
#   here:  git worktree add /tmp/base REV && (cd /tmp/base && scripts/bench-system.sh --pack
#          .mainpack build/bs) && cp /tmp/base/.mainpack.tgz .   (carry .mainpack.tgz too)
#   there: sh scripts/device-ab.sh .benchpack $OUT .mainpack:default default RKV_CUDA_X=1
# each writes OUT/ab-N.json and .txt, and
# OUT/ab.txt lists every variant's decode lines side by side in the order given.
set -u
PACK=${1:?usage: scripts/device-ab.sh PACK OUT VARIANT...}
OUT=${2:?usage: scripts/device-ab.sh PACK OUT VARIANT...}
shift 2
mkdir -p "$OUT"
# shellcheck source=scripts/pack-lib.sh
. "$(dirname "$0")/pack-lib.sh"
pack_env "$PACK" "$OUT" 8 >/dev/null || { echo "device-ab: cannot run from $PACK" >&2; exit 1; }
SUITE=${SUITE:-decode}
i=0
for v; do
    i=$((i + 1))
    bin=$PACK/bin/gpu_bench
    case $v in
    *:*)
        other=${v%%:*}
        v=${v#*:}
        if [ ! -d "$other/bin" ] && [ -f "$other.tgz" ]; then
            tar xzf "$other.tgz" -C "$(dirname "$other")" || exit 1
        fi
        bin=$other/bin/gpu_bench
        [ -x "$bin" ] || { echo "device-ab: no $bin (variant $i)" | tee -a "$OUT/ab.txt"; continue; }
        ;;
    esac
    envs=""
    [ "$v" = default ] || envs=$(echo "$v" | tr ',' ' ')
    echo "== variant $i: $v on $bin ($(date +%T))" | tee -a "$OUT/ab.txt"
    # shellcheck disable=SC2086 # envs is a list of VAR=VALUE words
    # shellcheck disable=SC2086 # QUICK is one word or none
    timeout "${AB_TIMEOUT:-150}" env $envs "$bin" --suite "$SUITE" ${QUICK---quick} \
        --json "$OUT/ab-$i.json" >"$OUT/ab-$i.txt" 2>&1
    echo "rc=$?" >>"$OUT/ab-$i.txt"
    grep -E "decode|prefill|^  attn|rc=" "$OUT/ab-$i.txt" | sed 's/  */ /g' | tee -a "$OUT/ab.txt"
done
