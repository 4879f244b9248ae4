/* gpu.h - the few CUDA runtime calls kvmgr and the worker's process shell need (device
 * slabs, IPC handles, pinned host pools, copies), resolved at run time with dlopen. */
#ifndef RKV_COMMON_GPU_H
#define RKV_COMMON_GPU_H

#include <stddef.h>
#include <stdint.h>

/*
 * Why dlopen: kvmgr and the worker's main() are plain C that may use only
 * common/ and proto/ (the layering of docs/runtime.md), must build without CUDA headers
 * and must start on machines without a driver (the cpu backend). So this
 * module loads libcudart at its first use ("libcudart.so.13", then
 * "libcudart.so", then CUDA_HOME's lib64; env RKV_CUDART names another
 * file) and looks up the functions it calls. When the library or a
 * device is missing every call returns RKV_ENODEV and rkv_gpu_why() says
 * why. All functions are thread-safe after the first rkv_gpu_count().
 *
 * An IPC handle (cudaIpcMemHandle_t, 64 bytes) opens at the base of the
 * allocation it was taken from, in another process only; it crosses
 * processes as 128 hex digits (rkv_gpu_handle_hex / _parse).
 */

#define RKV_GPU_IPC_BYTES 64
#define RKV_GPU_HEX_LEN   (2 * RKV_GPU_IPC_BYTES) /* hex digits, without the NUL */

/* number of usable devices (> 0), or RKV_ENODEV (no library, no driver, no gpu) */
int rkv_gpu_count(void);
/* what went wrong the first time, for messages; "" when the gpu works */
const char *rkv_gpu_why(void);

/* cudaMalloc on gpu and the IPC handle of the allocation */
int rkv_gpu_alloc(uint32_t gpu, size_t bytes, void **dptr, uint8_t handle[RKV_GPU_IPC_BYTES]);
void rkv_gpu_free(uint32_t gpu, void *dptr);
/* maps another process's allocation on gpu; close with rkv_gpu_ipc_close */
int rkv_gpu_ipc_open(uint32_t gpu, const uint8_t handle[RKV_GPU_IPC_BYTES], void **dptr);
void rkv_gpu_ipc_close(uint32_t gpu, void *dptr);
/* cudaHostRegister(portable | mapped): dma from and to these pages */
int rkv_gpu_host_register(void *base, size_t bytes);
void rkv_gpu_host_unregister(void *base);
/* cudaMemcpy(default kind: unified addressing tells the sides apart) */
int rkv_gpu_copy(uint32_t gpu, void *dst, const void *src, size_t bytes);
/* copy lanes of a device: the copies of one lane run in order, those of different lanes may
 * run at once (a device has a copy engine each way) */
enum rkv_gpu_lane { RKV_GPU_LANE_D2H, RKV_GPU_LANE_H2D, RKV_GPU_LANE_D2D, RKV_GPU_LANES };
/* cudaMemcpyAsync on the lane's stream of gpu (created at first use, not blocking other
 * streams); the host side must be pinned for the copy to overlap. Done by rkv_gpu_copy_wait,
 * which answers a failed copy */
int rkv_gpu_copy_async(uint32_t gpu, int lane, void *dst, const void *src, size_t bytes);
/* waits for every copy queued on gpu's lanes: 0, or the first lane's error */
int rkv_gpu_copy_wait(uint32_t gpu);
/* free and total device memory of gpu */
int rkv_gpu_mem_info(uint32_t gpu, size_t *free_bytes, size_t *total_bytes);

/* handle <-> hex (RKV_GPU_HEX_LEN digits + NUL); parse: 0 or RKV_EFORMAT */
void rkv_gpu_handle_hex(const uint8_t handle[RKV_GPU_IPC_BYTES], char hex[RKV_GPU_HEX_LEN + 1]);
int rkv_gpu_handle_parse(const char *hex, uint8_t handle[RKV_GPU_IPC_BYTES]);

#endif
