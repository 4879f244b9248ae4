/* graph.cuh - a decode step's layers recorded as a cuda graph and replayed while its shape holds.
 */
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "worker/backend.h"
}

struct cuda_ctx;

/* decode steps of up to this many rows run as cuda graphs by default (the graph knob's 1): there
 * the launches weigh most, and a small batch keeps its shape for many steps; a large one changes
 * as sessions come and go, and each new shape costs a recording */
#define CUDA_GRAPH_ROWS 16

/* the recording (the graph knob: 1, the default, steps of up to CUDA_GRAPH_ROWS rows; 2 every
 * decode step; 0 none): made when a step repeats the last one's shape, replayed while it holds */
struct cuda_graph {
    cudaGraphExec_t exec; /* the recording of key, or NULL */
    uint64_t key;
    uint64_t seen;  /* the shape of the last step run as usual */
    uint64_t rec;   /* the shape being recorded */
    uint64_t bad;   /* a shape whose recording failed: run as usual */
    int capturing;  /* the stream is recording */
    int cap_failed; /* an op could not take part in the recording */
};

/* the vtable's graph_begin and graph_end (struct backend_i) */
int cu_graph_begin(void *ctx, const struct be_batch *b, const struct be_attn *at,
                   const void *owner);
int cu_graph_end(void *ctx, int failed);
/* drops the recording: it holds pointers to tensors and pools that may go */
void cuda_graph_drop(struct cuda_ctx *c);
