/* cuda_backend.h - entry points of the cuda backend; plain C, includes no CUDA header. */
#ifndef RKV_CUDA_BACKEND_H
#define RKV_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct backend;
struct backend_opts;

/* number of usable cuda devices (> 0), or RKV_ENODEV when there is none
 * (no driver, no device) */
int rkv_cuda_backend_probe(void);
/* starts the cuda backend on o->gpu (what backend_create calls). the kv pools
 * given to set_kv: the device pool in device memory (cudaMalloc or an IPC
 * mapping; plain host memory works but is read over PCIe), the host pool in
 * host memory, which the backend registers (mapped) unless it is already.
 * RKV_CUDA_TUNE=precise=1: prefill gemms keep ~f32 activations (2 gemms). */
int rkv_cuda_backend_create(const struct backend_opts *o, struct backend **out);
/* the same with a message naming the gpu and the fix */
int cuda_backend_create(const struct backend_opts *o, struct backend **out, char *errbuf,
                        size_t errlen);

/* device memory for tools and tests (kv pools, benchmark buffers) */
int rkv_cuda_dev_alloc(int gpu, size_t bytes, void **out);
void rkv_cuda_dev_free(void *p);
/* starts (1) / stops (0) the profiler's collection (ncu --profile-from-start off) */
void rkv_cuda_profiler(int on);
/* copies between any host and device addresses (unified addressing); the bytes are in place
 * on return, for every stream */
int rkv_cuda_copy(void *dst, const void *src, size_t n);
/* fills n elements of type (enum be_type; Q8_0 counts values) at dev with
 * uniform values in [-scale, scale) from seed, on the device */
int rkv_cuda_fill_random(void *dev, int type, size_t n, uint64_t seed, float scale);

/* ceilings measured on this machine, GB/s (1e9 bytes per second) */
struct rkv_cuda_ceilings {
    double hbm_read;      /* stream read of a buffer far larger than L2 */
    double d2d_copy;      /* cudaMemcpy device to device, read + write bytes */
    double h2d_pinned;    /* pinned host to device, 64 MiB copies */
    double h2d_pinned_1m; /* the same in 1 MiB copies */
    /* 1 MiB pieces 4 MiB apart on the host (a layer's slice of consecutive pool blocks), one
     * copy each and all in one strided copy: what staging a run of blocks can reach */
    double h2d_strided_1m, h2d_2d_1m;
    double h2d_batch_1m; /* the same pieces in one cudaMemcpyBatchAsync */
    double zero_copy;    /* kernel reads of mapped pinned host memory */
    double gemm_bf16;    /* TFLOP/s of a dense 8192^3 bf16 cuBLAS gemm (f32 sums): compute */
    char gpu_name[256];
    int n_sm;
};
int rkv_cuda_measure_ceilings(int gpu, size_t hbm_bytes, size_t host_bytes,
                              struct rkv_cuda_ceilings *out);

#ifdef __cplusplus
}
#endif

#endif
