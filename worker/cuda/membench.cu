/* membench.cu - the ceilings benchmarks report against: hbm stream read, pinned h2d, zero-copy
 * reads. */
#include <stdio.h>
#include <string.h>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_ctx.cuh"

// sums 16-byte loads, 4 in flight per thread; the sum keeps the loads alive
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ b.z ^ b.w ^ c.x ^ c.w ^ d.y ^ d.z;
    }
    for (; i < n; i += stride)
        acc ^= p[i].x;
    if (acc == 0x12345678u)
        *sink = acc;
}

/* median of reps timed runs, ms */
template <typename F> static float time_ms(int reps, F fn)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float t[32];
    fn(); /* warm-up */
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a);
        fn();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        cudaEventElapsedTime(&t[r], a, b);
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return t[reps / 2];
}

extern "C" int rkv_cuda_measure_ceilings(int gpu, size_t hbm_bytes, size_t host_bytes,
                                         struct rkv_cuda_ceilings *out)
{
    memset(out, 0, sizeof(*out));
    CU_TRY(cudaSetDevice(gpu));
    cudaDeviceProp p;
    CU_TRY(cudaGetDeviceProperties(&p, gpu));
    snprintf(out->gpu_name, sizeof(out->gpu_name), "%s", p.name);
    out->n_sm = p.multiProcessorCount;
    hbm_bytes &= ~(size_t)15;
    host_bytes &= ~(size_t)15;
    char *d = NULL, *d2 = NULL, *h = NULL;
    unsigned *sink = NULL;
    int rc = RKV_ECUDA;
    if (cudaMalloc(&d, hbm_bytes) != cudaSuccess || cudaMalloc(&d2, hbm_bytes) != cudaSuccess ||
        cudaMalloc(&sink, 4) != cudaSuccess ||
        cudaHostAlloc(&h, host_bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess)
        goto out;
    cudaMemset(d, 1, hbm_bytes);
    memset(h, 1, host_bytes);
    {
        size_t n16 = hbm_bytes / 16;
        /* the grid that fills the chip: 4 blocks of 512 per SM */
        unsigned grid = (unsigned)out->n_sm * 4;
        float ms = time_ms(9, [&] { read_kernel<<<grid, 512>>>((const uint4 *)d, n16, sink); });
        out->hbm_read = hbm_bytes / (ms * 1e6);
        ms = time_ms(9, [&] { cudaMemcpy(d2, d, hbm_bytes, cudaMemcpyDeviceToDevice); });
        out->d2d_copy = 2.0 * hbm_bytes / (ms * 1e6);
        ms = time_ms(5, [&] {
            for (size_t o = 0; o < host_bytes; o += 64 << 20) {
                size_t n = host_bytes - o < (64 << 20) ? host_bytes - o : (64 << 20);
                cudaMemcpyAsync(d + o, h + o, n, cudaMemcpyHostToDevice, 0);
            }
        });
        out->h2d_pinned = host_bytes / (ms * 1e6);
        ms = time_ms(5, [&] {
            for (size_t o = 0; o < host_bytes; o += 1 << 20) {
                size_t n = host_bytes - o < (1 << 20) ? host_bytes - o : (1 << 20);
                cudaMemcpyAsync(d + o, h + o, n, cudaMemcpyHostToDevice, 0);
            }
        });
        out->h2d_pinned_1m = host_bytes / (ms * 1e6);
        const size_t mib = (size_t)1 << 20, pitch = 4 * mib, rows = host_bytes / pitch;
        ms = time_ms(5, [&] {
            for (size_t i = 0; i < rows; i++)
                cudaMemcpyAsync(d + i * mib, h + i * pitch, mib, cudaMemcpyHostToDevice, 0);
        });
        out->h2d_strided_1m = rows * mib / (ms * 1e6);
        ms = time_ms(
            5, [&] { cudaMemcpy2DAsync(d, mib, h, pitch, mib, rows, cudaMemcpyHostToDevice, 0); });
        out->h2d_2d_1m = rows * mib / (ms * 1e6);
#if CUDART_VERSION >= 12080
        {
            void **dsts = (void **)malloc(rows * sizeof(void *));
            const void **srcs = (const void **)malloc(rows * sizeof(void *));
            size_t *sizes = (size_t *)malloc(rows * sizeof(size_t));
            if (!dsts || !srcs || !sizes) {
                free(dsts);
                free(srcs);
                free(sizes);
                goto out;
            }
            for (size_t i = 0; i < rows; i++) {
                dsts[i] = d + i * mib;
                srcs[i] = h + i * pitch;
                sizes[i] = mib;
            }
            cudaMemcpyAttributes at = {};
            at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
            size_t idx = 0;
            cudaStream_t st = NULL;
            cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
            ms = time_ms(5, [&] {
                cudaMemcpyBatchAsync(dsts, srcs, sizes, rows, &at, &idx, 1, st);
                cudaStreamSynchronize(st);
            });
            out->h2d_batch_1m = rows * mib / (ms * 1e6);
            cudaStreamDestroy(st);
            free(dsts);
            free(srcs);
            free(sizes);
        }
#endif
        void *hd = NULL;
        if (cudaHostGetDevicePointer(&hd, h, 0) != cudaSuccess)
            goto out;
        ms = time_ms(5,
                     [&] { read_kernel<<<grid, 512>>>((const uint4 *)hd, host_bytes / 16, sink); });
        out->zero_copy = host_bytes / (ms * 1e6);
        /* the compute ceiling prefill is judged against: a large dense bf16 product on
         * cuBLAS's own choice of kernel, 2 M N K flops */
        const int mnk = 8192;
        const size_t mat = (size_t)mnk * mnk * 2;
        cublasHandle_t bl = NULL;
        if (hbm_bytes >= 2 * mat && cublasCreate(&bl) == CUBLAS_STATUS_SUCCESS) {
            const float one = 1.0f, zero = 0.0f;
            ms = time_ms(7, [&] {
                cublasGemmEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, mnk, mnk, mnk, &one, d, CUDA_R_16BF, mnk,
                             d + mat, CUDA_R_16BF, mnk, &zero, d2, CUDA_R_16BF, mnk,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            });
            out->gemm_bf16 = 2.0 * mnk * mnk * (double)mnk / (ms * 1e9);
            cublasDestroy(bl);
        }
    }
    rc = cudaGetLastError() == cudaSuccess ? 0 : RKV_ECUDA;
out:
    cudaGetLastError();
    cudaFree(d);
    cudaFree(d2);
    cudaFree(sink);
    cudaFreeHost(h);
    return rc;
}

int cuda_measure_host_paths(double *copy_gbps, double *zerocopy_gbps)
{
    const size_t bytes = (size_t)64 << 20, piece = (size_t)1 << 20;
    char *h = NULL, *d = NULL;
    unsigned *sink = NULL;
    void *hd = NULL;
    int rc = RKV_ECUDA;
    cudaDeviceProp p;
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess ||
        cudaHostAlloc(&h, bytes, cudaHostAllocMapped) != cudaSuccess ||
        cudaMalloc(&d, bytes) != cudaSuccess || cudaMalloc(&sink, 4) != cudaSuccess ||
        cudaHostGetDevicePointer(&hd, h, 0) != cudaSuccess)
        goto out;
    memset(h, 1, bytes);
    {
        /* the copy path moves a layer's blocks in ~1 MiB pieces */
        float ms = time_ms(3, [&] {
            for (size_t o = 0; o < bytes; o += piece)
                cudaMemcpyAsync(d + o, h + o, piece, cudaMemcpyHostToDevice, 0);
        });
        *copy_gbps = bytes / (ms * 1e6);
        unsigned grid = (unsigned)p.multiProcessorCount * 4;
        ms = time_ms(3, [&] { read_kernel<<<grid, 512>>>((const uint4 *)hd, bytes / 16, sink); });
        *zerocopy_gbps = bytes / (ms * 1e6);
    }
    rc = cudaGetLastError() == cudaSuccess ? 0 : RKV_ECUDA;
out:
    cudaGetLastError();
    cudaFreeHost(h);
    cudaFree(d);
    cudaFree(sink);
    return rc;
}
