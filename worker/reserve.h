/* reserve.h - the device memory a step of the worker's model takes, measured on its real graph
 * before kvmgr sizes the device pool. */
#ifndef RKV_RESERVE_H
#define RKV_RESERVE_H

#include <stdint.h>

#include "worker/backend.h"
#include "worker/kv.h"
#include "worker/model.h"

/* runs the model's largest prefill chunk (max_tokens) and its widest decode step (max_seqs
 * sequences) over a small scratch kv pool on gpu, and sets *out to the device bytes those
 * steps took and gave back afterwards (activations, logits), plus what the backend may still
 * allocate (host-block staging) and a margin. The backend's kept scratch is not included: it
 * is on the gpu when kvmgr reads the free memory. 0 or a negative RKV_E* code (*out 0: use a
 * default). The backend's kv pools are unset afterwards. */
int reserve_measure(struct backend *be, struct model *m, enum kv_dtype dt, uint32_t max_tokens,
                    uint32_t max_seqs, int gpu, uint64_t *out);

#endif
