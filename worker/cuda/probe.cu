/* probe.cu - finds cuda devices without failing on machines that have no driver or gpu. */
#include <cuda_runtime.h>

#include "common/err.h"
#include "worker/cuda/cuda_backend.h"

extern "C" int rkv_cuda_backend_probe(void)
{
    int n = 0;
    /* no driver or no device both read as "no device": auto falls back to cpu */
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return RKV_ENODEV;
    }
    return n;
}
