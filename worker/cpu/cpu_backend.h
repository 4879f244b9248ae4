/* cpu_backend.h - the cpu backend (f32 math, integer dots for quantized weights, threaded). */
#ifndef RKV_CPU_BACKEND_H
#define RKV_CPU_BACKEND_H

#include <stdint.h>

struct backend;

/* n_threads: worker threads including the caller; 0 = online cpus */
int cpu_backend_create(uint32_t n_threads, struct backend **out);

#endif
