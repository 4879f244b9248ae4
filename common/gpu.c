/* gpu.c - CUDA runtime calls through dlopen: device slabs, IPC handles, pinned pools, copies. */
#include "common/gpu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

/* cudaIpcMemHandle_t: passed by value to cudaIpcOpenMemHandle, so the same
 * 64-byte struct here keeps the calling convention */
typedef struct {
    char reserved[RKV_GPU_IPC_BYTES];
} ipc_handle;

/* cudaError_t and the enums are ints in the runtime's ABI */
struct cudart {
    int (*get_device_count)(int *n);
    int (*set_device)(int dev);
    int (*malloc_)(void **p, size_t n);
    int (*free_)(void *p);
    int (*ipc_get)(ipc_handle *h, void *p);
    int (*ipc_open)(void **p, ipc_handle h, unsigned flags);
    int (*ipc_close)(void *p);
    int (*host_register)(void *p, size_t n, unsigned flags);
    int (*host_unregister)(void *p);
    int (*memcpy_)(void *dst, const void *src, size_t n, int kind);
    int (*mem_info)(size_t *free_bytes, size_t *total);
    int (*stream_create)(void **stream, unsigned flags);
    int (*memcpy_async)(void *dst, const void *src, size_t n, int kind, void *stream);
    int (*stream_sync)(void *stream);
    const char *(*error_string)(int err);
};

enum {
    CUDA_HOST_REGISTER_PORTABLE = 1,
    CUDA_HOST_REGISTER_MAPPED = 2,
    CUDA_IPC_LAZY_PEER_ACCESS = 1,
    CUDA_MEMCPY_DEFAULT = 4,
    CUDA_STREAM_NON_BLOCKING = 1,
};

/* the copy lanes' streams, per device, created at first use */
#define MAX_LANE_GPUS 64
static void *lanes[MAX_LANE_GPUS][RKV_GPU_LANES];
static pthread_mutex_t lanes_mu = PTHREAD_MUTEX_INITIALIZER;

static struct cudart rt;
static int n_devices; /* > 0, or RKV_ENODEV */
static char why[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void *open_cudart(void)
{
    const char *env = getenv("RKV_CUDART");
    if (env && *env)
        return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                        "/usr/local/cuda/lib64/libcudart.so.13",
                                        "/usr/local/cuda/lib64/libcudart.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        char path[1024];
        snprintf(path, sizeof path, "%s/lib64/libcudart.so", home);
        return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    return NULL;
}

static void load(void)
{
    n_devices = RKV_ENODEV;
    void *h = open_cudart();
    if (!h) {
        snprintf(why, sizeof why,
                 "the CUDA runtime library (libcudart.so) was not found; install the CUDA "
                 "toolkit, add its lib64 to LD_LIBRARY_PATH or name the file in RKV_CUDART");
        return;
    }
    struct {
        const char *name;
        void **fn;
    } syms[] = {
        {"cudaGetDeviceCount", (void **)&rt.get_device_count},
        {"cudaSetDevice", (void **)&rt.set_device},
        {"cudaMalloc", (void **)&rt.malloc_},
        {"cudaFree", (void **)&rt.free_},
        {"cudaIpcGetMemHandle", (void **)&rt.ipc_get},
        {"cudaIpcOpenMemHandle", (void **)&rt.ipc_open},
        {"cudaIpcCloseMemHandle", (void **)&rt.ipc_close},
        {"cudaHostRegister", (void **)&rt.host_register},
        {"cudaHostUnregister", (void **)&rt.host_unregister},
        {"cudaMemcpy", (void **)&rt.memcpy_},
        {"cudaMemGetInfo", (void **)&rt.mem_info},
        {"cudaStreamCreateWithFlags", (void **)&rt.stream_create},
        {"cudaMemcpyAsync", (void **)&rt.memcpy_async},
        {"cudaStreamSynchronize", (void **)&rt.stream_sync},
        {"cudaGetErrorString", (void **)&rt.error_string},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].fn = dlsym(h, syms[i].name);
        if (!*syms[i].fn) {
            snprintf(why, sizeof why, "the CUDA runtime library has no %s; use CUDA 12 or 13",
                     syms[i].name);
            dlclose(h);
            memset(&rt, 0, sizeof rt);
            return;
        }
    }
    int n = 0, e = rt.get_device_count(&n);
    if (e || n <= 0) {
        snprintf(why, sizeof why, "no usable CUDA device (%s); check nvidia-smi and the driver",
                 e ? rt.error_string(e) : "0 devices");
        return; /* the library stays loaded: it is cheap and may be loaded again */
    }
    why[0] = 0;
    n_devices = n;
}

int rkv_gpu_count(void)
{
    pthread_once(&once, load);
    return n_devices;
}

const char *rkv_gpu_why(void)
{
    pthread_once(&once, load);
    return why;
}

/* the library is loaded and gpu exists; makes gpu current on this thread */
static int use(uint32_t gpu, const char *what)
{
    int n = rkv_gpu_count();
    if (n < 0) {
        log_error("%s on gpu %u: %s", what, gpu, why);
        return RKV_ENODEV;
    }
    if (gpu >= (uint32_t)n) {
        log_error("%s: gpu %u does not exist (this machine has %d); check --gpu and --workers",
                  what, gpu, n);
        return RKV_ENODEV;
    }
    int e = rt.set_device((int)gpu);
    if (e) {
        log_error("%s: cudaSetDevice(%u): %s", what, gpu, rt.error_string(e));
        return RKV_ECUDA;
    }
    return 0;
}

static int check(int e, const char *call, uint32_t gpu, size_t bytes)
{
    if (e == 0)
        return 0;
    log_error("%s on gpu %u (%zu bytes): %s", call, gpu, bytes, rt.error_string(e));
    return RKV_ECUDA;
}

int rkv_gpu_alloc(uint32_t gpu, size_t bytes, void **dptr, uint8_t handle[RKV_GPU_IPC_BYTES])
{
    *dptr = NULL;
    int rc = use(gpu, "device kv pool");
    if (rc)
        return rc;
    void *p = NULL;
    int e = rt.malloc_(&p, bytes);
    if (e) {
        size_t fr = 0, tot = 0;
        rt.mem_info(&fr, &tot);
        log_error("cudaMalloc of %zu bytes on gpu %u: %s (%zu of %zu bytes free); lower "
                  "--vram-target or raise --compute-reserve",
                  bytes, gpu, rt.error_string(e), fr, tot);
        return RKV_ENOSPACE;
    }
    ipc_handle h;
    if ((rc = check(rt.ipc_get(&h, p), "cudaIpcGetMemHandle", gpu, bytes))) {
        rt.free_(p);
        return rc;
    }
    memcpy(handle, h.reserved, RKV_GPU_IPC_BYTES);
    *dptr = p;
    return 0;
}

void rkv_gpu_free(uint32_t gpu, void *dptr)
{
    if (dptr && use(gpu, "freeing the device kv pool") == 0)
        rt.free_(dptr);
}

int rkv_gpu_ipc_open(uint32_t gpu, const uint8_t handle[RKV_GPU_IPC_BYTES], void **dptr)
{
    *dptr = NULL;
    int rc = use(gpu, "opening kvmgr's device kv pool");
    if (rc)
        return rc;
    ipc_handle h;
    memcpy(h.reserved, handle, RKV_GPU_IPC_BYTES);
    int e = rt.ipc_open(dptr, h, CUDA_IPC_LAZY_PEER_ACCESS);
    if (e) {
        log_error("cudaIpcOpenMemHandle on gpu %u: %s; kvmgr and the worker must run on the "
                  "same machine, as different processes, with the same driver",
                  gpu, rt.error_string(e));
        *dptr = NULL;
        return RKV_ECUDA;
    }
    return 0;
}

void rkv_gpu_ipc_close(uint32_t gpu, void *dptr)
{
    if (dptr && use(gpu, "closing kvmgr's device kv pool") == 0)
        rt.ipc_close(dptr);
}

int rkv_gpu_host_register(void *base, size_t bytes)
{
    if (rkv_gpu_count() < 0) {
        log_error("pinning the host kv pool: %s", why);
        return RKV_ENODEV;
    }
    int e = rt.host_register(base, bytes, CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_MAPPED);
    if (e) {
        log_error("cudaHostRegister of the host kv pool (%zu bytes): %s; check the memlock "
                  "limit (ulimit -l, LimitMEMLOCK=) and --host-budget",
                  bytes, rt.error_string(e));
        return RKV_ECUDA;
    }
    return 0;
}

void rkv_gpu_host_unregister(void *base)
{
    if (base && rkv_gpu_count() > 0)
        rt.host_unregister(base);
}

int rkv_gpu_copy(uint32_t gpu, void *dst, const void *src, size_t bytes)
{
    int rc = use(gpu, "kv block copy");
    return rc ? rc
              : check(rt.memcpy_(dst, src, bytes, CUDA_MEMCPY_DEFAULT), "cudaMemcpy", gpu, bytes);
}

/* the stream of gpu's lane (gpu current on this thread), created at first use */
static int lane_stream(uint32_t gpu, int lane, void **stream)
{
    if (gpu >= MAX_LANE_GPUS || lane < 0 || lane >= RKV_GPU_LANES)
        return RKV_EINVAL;
    pthread_mutex_lock(&lanes_mu);
    int rc = 0;
    if (!lanes[gpu][lane]) {
        void *st = NULL; /* kept only when made */
        rc = check(rt.stream_create(&st, CUDA_STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags",
                   gpu, 0);
        if (rc == 0)
            lanes[gpu][lane] = st;
    }
    *stream = lanes[gpu][lane];
    pthread_mutex_unlock(&lanes_mu);
    return rc;
}

int rkv_gpu_copy_async(uint32_t gpu, int lane, void *dst, const void *src, size_t bytes)
{
    void *st;
    int rc = use(gpu, "kv block copy");
    if (rc == 0)
        rc = lane_stream(gpu, lane, &st);
    return rc ? rc
              : check(rt.memcpy_async(dst, src, bytes, CUDA_MEMCPY_DEFAULT, st), "cudaMemcpyAsync",
                      gpu, bytes);
}

int rkv_gpu_copy_wait(uint32_t gpu)
{
    int rc = use(gpu, "waiting for kv block copies");
    if (rc || gpu >= MAX_LANE_GPUS)
        return rc ? rc : RKV_EINVAL;
    /* every lane is waited for, also after one failed: nothing may be left in flight */
    for (int l = 0; l < RKV_GPU_LANES; l++) {
        pthread_mutex_lock(&lanes_mu);
        void *st = lanes[gpu][l];
        pthread_mutex_unlock(&lanes_mu);
        int e = st ? check(rt.stream_sync(st), "cudaStreamSynchronize", gpu, 0) : 0;
        if (e && !rc)
            rc = e;
    }
    return rc;
}

int rkv_gpu_mem_info(uint32_t gpu, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    int rc = use(gpu, "reading free device memory");
    return rc ? rc : check(rt.mem_info(free_bytes, total_bytes), "cudaMemGetInfo", gpu, 0);
}

void rkv_gpu_handle_hex(const uint8_t handle[RKV_GPU_IPC_BYTES], char hex[RKV_GPU_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < RKV_GPU_IPC_BYTES; i++) {
        hex[2 * i] = digits[handle[i] >> 4];
        hex[2 * i + 1] = digits[handle[i] & 15];
    }
    hex[RKV_GPU_HEX_LEN] = 0;
}

static int nibble(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int rkv_gpu_handle_parse(const char *hex, uint8_t handle[RKV_GPU_IPC_BYTES])
{
    if (!hex || strlen(hex) != RKV_GPU_HEX_LEN)
        return RKV_EFORMAT;
    for (int i = 0; i < RKV_GPU_IPC_BYTES; i++) {
        int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return RKV_EFORMAT;
        handle[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}
