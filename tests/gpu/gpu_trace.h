/* gpu_trace.h - the kernels of a stretch of work on the gpu's own clock (CUPTI activity records,
 * libcupti loaded at run time): when each ran, for how long, and the gaps and overlaps between
 * them, so a decode step's time can be split by kernel as it runs (cuda graphs, programmatic
 * launches), not as ncu's one-kernel-at-a-time replay sees it. */
#ifndef RKV_GPU_TRACE_H
#define RKV_GPU_TRACE_H

#include <stdio.h>

/* starts recording kernels; 0, or -1 (printed) when CUPTI cannot be loaded or enabled */
int gt_begin(void);
/* the same, and the memory copies too (gt_end prints them apart: per direction and stream,
 * their bytes, the time the copy engines were busy and the rate while busy) */
int gt_begin_copies(void);
/* stops (after the work was synchronized), prints the summary under label to out: span, gpu
 * busy, per kernel name the launches, time and the gaps before them, and the kernels of one
 * stretch in order (from index first, or the middle when first < 0; n of them); when csv is not
 * NULL, every kernel as a line there (copies too, as "memcpy HtoD" and the like with their bytes
 * for grid and 0 for block). Returns the number of kernels seen, or -1 */
int gt_end(const char *label, FILE *out, FILE *csv, int first, int n);

#endif
