/* sample_host.cuh - the host side of greedy and sampled picks on the device. */
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "worker/backend.h"
}

/* device and pinned host buffers of the picks */
struct cuda_sampling {
    void *greedy_buf; /* greedy's ids and logprobs */
    size_t greedy_cap;
    void *smp_dev; /* sampled rows, penalty ids, saved logits, picks and scratch */
    size_t smp_dev_cap;
    void *smp_host; /* pinned: the rows and penalty ids up, the picks down */
    size_t smp_host_cap;
};

void cuda_sampling_fini(struct cuda_sampling *s);
/* the vtable's greedy and sample (struct backend_i) */
int cu_greedy(void *ctx, const struct be_tensor *logits, uint32_t n, int32_t *ids, float *logprobs);
int cu_sample(void *ctx, const struct be_tensor *logits, uint32_t n,
              const struct sample_dev_row *const *rows, struct sample_dev_out *outs);
