/* forward.h - batched forward steps (decode tokens and prefill chunks) over paged KV. */
#ifndef RKV_FORWARD_H
#define RKV_FORWARD_H

#include <stdint.h>

#include "worker/kv.h"
#include "worker/model.h"

/* one sequence's share of a step: n_tokens new tokens at positions
 * n_past.. (1 for decode, a chunk for prefill); its block table must cover
 * n_past + n_tokens positions, and KV of positions < n_past must already be
 * in it. the block of the tokens being written should be device-resident. */
struct fwd_seq {
    const int32_t *tokens;
    uint32_t n_tokens;
    uint32_t n_past;
    const struct kv_block_ref *blocks; /* (n_blocks): layout.n_parts per position block */
    uint32_t n_blocks;
};

struct fwd;

/* activations for up to max_tokens tokens from up to max_seqs sequences per
 * step; the kv layout must match the model (n_layer, n_kv_head, head_dim) */
int fwd_create(struct fwd **out, struct model *m, const struct kv_layout *l,
               const struct kv_pools *pools, uint32_t max_tokens, uint32_t max_seqs);
void fwd_destroy(struct fwd *f);
/* the kv layout a model needs, with the given block size and cache dtype */
int fwd_kv_layout(const struct model *m, uint32_t block_size, enum kv_dtype dtype,
                  struct kv_layout *out);
/* splits l into the model's global and local parts (kv_layout_set_window), so the local
 * layers' kv can be dropped once it leaves their window; the cpu backend reads such tables */
int fwd_kv_layout_window(const struct model *m, struct kv_layout *l);

/* runs one step. logits gets n_seqs rows of n_vocab floats (the last token
 * of each sequence, batch order), or with all_logits one row per token of
 * the step in batch order. */
int fwd_step(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs, int all_logits,
             float *logits);

/* fwd_step for the last row of each sequence, whose logits stay on the backend for
 * fwd_sample (the step's rows are the sequences, in order) */
int fwd_step_keep(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs);
/* after fwd_step_keep over n rows: rows[i] (not NULL) sampled on the backend into outs[i]
 * (sample_forward); *used 1 then, and logits row i is downloaded for each row the backend gave
 * back (status 1) and each i with rows[i] NULL and want[i] set. *used 0 when the backend has no
 * sample op: every row's logits are downloaded */
int fwd_sample(struct fwd *f, uint32_t n, const struct sample_dev_row *const *rows,
               struct sample_dev_out *outs, const uint8_t *want, float *logits, int *used);
/* prefills one sequence in chunks of at most `chunk` tokens (chunk <=
 * max_tokens); logits: the last prompt token's row */
/* fwd_step for the last row of each sequence, picked greedily on the backend (the argmax
 * and its log-softmax, sample_greedy's result) so the logits need not be downloaded: *used 1
 * with ids and logprobs set; *used 0 when the backend has no greedy op, and then logits is
 * filled as by fwd_step */
int fwd_step_greedy(struct fwd *f, const struct fwd_seq *seqs, uint32_t n_seqs, float *logits,
                    int32_t *ids, float *logprobs, int *used);
int fwd_prefill(struct fwd *f, const int32_t *tokens, uint32_t n_tokens, uint32_t n_past,
                const struct kv_block_ref *blocks, uint32_t n_blocks, uint32_t chunk,
                float *logits);

#endif
