/* tuning.h - the cuda backend's tuning knobs: one table (name, default, range, doc), set by
 * RKV_CUDA_TUNE="name=value,name=value" and read once when the backend starts. Plain C, so the
 * unit test checks the table against docs/operations.md on machines without CUDA. */
#ifndef RKV_CUDA_TUNING_H
#define RKV_CUDA_TUNING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the environment variables the backend reads: the knobs, and a measurement that prints each
 * device-sampled row's phase times to stderr (the step waits for them) */
#define CUDA_TUNE_ENV         "RKV_CUDA_TUNE"
#define CUDA_DEBUG_STAMPS_ENV "RKV_DEBUG_SAMPLE_STAMPS"

/* X(name, default, lowest, highest, value names ("a|b|..." for 0, 1, ...; NULL: numbers only),
 * one-line doc). docs/operations.md's table lists the same rows (tuning_test.c checks) */
#define CUDA_TUNE_KNOBS(X)                                                                         \
    X(host_read, 0, 0, 3, "measure|copy|zerocopy|cpu",                                             \
      "how host KV blocks reach the GPU: the faster of copies and zero-copy reads, measured at "   \
      "start; copies into staging a layer ahead; zero-copy reads of pinned host memory; or the "   \
      "worker's CPU threads (CPU_TAIL, not in deterministic mode)")                                \
    X(host_split, 0, 0, 100, NULL,                                                                 \
      "percent of each decode row's host blocks (the oldest) the CPU attends while the GPU "       \
      "reads the rest; 0: the worker's host_split decides")                                        \
    X(split_min_us, 1000, 0, 1000000, NULL,                                                        \
      "the split runs for a step whose decode rows' host blocks take at least this many "          \
      "microseconds of the link a layer")                                                          \
    X(split_async_us, 1200, 0, 1000000, NULL,                                                      \
      "a split step whose decode tails take at least this many microseconds of the link a layer "  \
      "runs the CPU's part as a host function, off the thread that launches the layers")           \
    X(stage_mb, 512, 0, 1048576, NULL,                                                             \
      "MiB of each of the two staging buffers for a layer's host blocks; larger tails are read "   \
      "zero-copy")                                                                                 \
    X(stage_pass_kb, 0, 0, 1073741824, NULL,                                                       \
      "KiB of one staging pass: a layer's host blocks past it are staged in passes of whole "      \
      "sequences; 0: the staging buffer's size")                                                   \
    X(graph, 1, 0, 2, NULL,                                                                        \
      "decode steps recorded as CUDA graphs and replayed while their shape holds: 1 steps of up "  \
      "to 16 rows, 2 every decode step, 0 none")                                                   \
    X(deterministic, 0, 0, 1, NULL,                                                                \
      "1: the batch-invariant kernels of the worker's deterministic setting, for programs "        \
      "without it")                                                                                \
    X(attn_fixed, 0, 0, 1, NULL,                                                                   \
      "1: one key split per KV block, merged in position order across device and host, so a "      \
      "session's attention does not depend on where its blocks live")                              \
    X(precise, 0, 0, 1, NULL,                                                                      \
      "1: prefill gemms carry the activations' 16-bit rounding (two gemms each)")                  \
    X(qdot, 1, 0, 1, "exact|int",                                                                  \
      "decode matmuls over block-type weights: the activations rounded to 8 bits and integer "    \
      "dots, as the CPU backend does (int), or the weights dequantized exactly and f32 sums"      \
      " (exact)")                                                                                  \
    X(gemv_max_n, 8, 1, 8, NULL,                                                                   \
      "rows up to which matmuls and fused linears take the decode kernels; more go to cuBLAS")     \
    X(lin_mma, 2, 0, 8, NULL,                                                                      \
      "the fewest tokens whose decode linears over 16-bit weights run on tensor cores; 0: the "    \
      "register kernels")                                                                          \
    X(pair_n, 65536, 0, 65536, NULL,                                                               \
      "the most tokens whose k/v and gate/up gemms run as one strided batch of two; 0: two "       \
      "gemms")                                                                                     \
    X(lt_tune_n, 256, 0, 65536, NULL,                                                              \
      "gemms of 9 to this many tokens run on the cuBLASLt algorithm timed fastest for their "      \
      "shape; 0: cublasGemmEx's choice")                                                           \
    X(max_split, 0, 0, 65536, NULL,                                                                \
      "at most this many key splits per attention launch; 0: picked by the launch's shape")        \
    X(sample_cl, 8, 1, 8, NULL,                                                                    \
      "thread blocks (1, 2, 4 or 8) each row samples on in a step of few sampled rows")            \
    X(sample_cl_rows, 8, 0, 1048576, NULL,                                                         \
      "the most sampled rows a step may have for sample_cl; more take a block a row")

/* the knobs' values, one field each */
struct cuda_tune {
#define CUDA_TUNE_FIELD(name, def, lo, hi, names, doc) uint32_t name;
    CUDA_TUNE_KNOBS(CUDA_TUNE_FIELD)
#undef CUDA_TUNE_FIELD
    int sample_stamps; /* RKV_DEBUG_SAMPLE_STAMPS=1 */
};

/* host_read's values */
enum cuda_tune_host_read {
    CUDA_READ_MEASURE = 0,
    CUDA_READ_COPY = 1,
    CUDA_READ_ZEROCOPY = 2,
    CUDA_READ_CPU = 3,
};

/* one row of the table */
struct cuda_knob {
    const char *name;
    uint32_t def, lo, hi;
    const char *names; /* "a|b|..." or NULL */
    const char *doc;
};
extern const struct cuda_knob cuda_knobs[];
extern const size_t cuda_n_knobs;

/* every knob at its default */
void cuda_tune_defaults(struct cuda_tune *t);
/* spec "name=value,name=value" (value a number or one of the knob's names) over t; a part
 * that names no knob or whose value is out of range is logged as a warning naming it and
 * left out (the knob keeps its value). Returns the parts left out */
int cuda_tune_parse(struct cuda_tune *t, const char *spec);
/* the defaults, then RKV_CUDA_TUNE and RKV_DEBUG_SAMPLE_STAMPS from the environment */
void cuda_tune_read(struct cuda_tune *t);

#ifdef __cplusplus
}
#endif

#endif
