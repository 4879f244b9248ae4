#!/usr/bin/env python3
"""trace-phases.py - one decoder layer's phases from gpu_bench's CUPTI trace.

usage: scripts/trace-phases.py TRACE.CSV [LABEL...]

TRACE.CSV is what RKV_PROFILE_TRACE=DIR writes (DIR/trace.csv: label, index, start_us,
duration_us, gap_us, grid, block, kernel). For every traced case (or the LABELs named), the
layer is the run of kernels between two attention launches; each phase runs from the end of
the kernel before to the end of its own, so the phases of a layer add up to its time even
where kernels overlap (programmatic launches). Medians over the layers, the first and last left
out (they hold the embedding and the logits). Copy rows (a prefill trace's "memcpy HtoD" and
the like) are left out.
"""
import csv
import statistics
import sys


def layer_phases(rows):
    """[(kernel, median us)] of one layer, and the layers it is the median of"""
    attn = [i for i, r in enumerate(rows) if "attn" in r["kernel"]]
    if len(attn) < 4:
        return [], 0
    period = int(statistics.median(b - a for a, b in zip(attn, attn[1:])))
    end = [float(r["start_us"]) + float(r["duration_us"]) for r in rows]
    # a layer starts where the first one does: after the step's first kernel (the embedding),
    # so its kernels before attention (q/k/v, rope) come first
    before = attn[0] - 1
    phases = [[] for _ in range(period)]
    layers = 0
    for a in attn[1:-1]:
        lo = a - before
        if lo < 1 or lo + period > len(rows):
            continue
        layers += 1
        for j in range(period):
            phases[j].append(end[lo + j] - end[lo + j - 1])
    names = [rows[attn[1] - before + j]["kernel"] for j in range(period)]
    return [(n, statistics.median(p)) for n, p in zip(names, phases) if p], layers


def short(kernel):
    """a readable kernel name: the function, its template arguments cut at 48 characters"""
    k = kernel.strip('"')
    return k if len(k) <= 48 else k[:45] + "..."


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        with open(argv[1], newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.stderr.write(f"trace-phases: cannot read {argv[1]} ({e.strerror}): name the "
                         "trace.csv that RKV_PROFILE_TRACE=DIR wrote\n")
        return 1
    need = {"label", "start_us", "duration_us", "kernel"}
    if not rows or not need <= set(rows[0]):
        sys.stderr.write(f"trace-phases: {argv[1]} is not a gpu_bench trace (columns "
                         f"{', '.join(sorted(need))} wanted)\n")
        return 1
    by = {}
    for r in rows:
        # the copies a prefill trace also holds ("memcpy HtoD"...) are not kernels of a layer
        if not r["kernel"].startswith("memcpy "):
            by.setdefault(r["label"], []).append(r)
    labels = argv[2:] or list(by)
    for lab in labels:
        if lab not in by:
            sys.stderr.write(f"trace-phases: no case {lab!r} in the trace; it has: "
                             f"{', '.join(by)}\n")
            return 1
        phases, layers = layer_phases(by[lab])
        if not phases:
            print(f"{lab}: fewer than four attention launches, no layer to measure")
            continue
        print(f"{lab}: one layer, medians of {layers} layers (us)")
        for name, us in phases:
            print(f"  {us:8.2f}  {short(name)}")
        print(f"  {sum(us for _, us in phases):8.2f}  the layer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
