/* hosttail.c - the host-tail tactic's rules (hosttail.h). */
#include "common/hosttail.h"

int hosttail_cpu_faster(double pcie_gbps, double host_stream_gbps, double cpu_gbps,
                        double split_gbps)
{
    double streamed = pcie_gbps;
    if (host_stream_gbps > 0 && (streamed <= 0 || host_stream_gbps < streamed))
        streamed = host_stream_gbps;
    return cpu_gbps > 0 && streamed > 0 && cpu_gbps > streamed && cpu_gbps > split_gbps;
}

uint32_t hosttail_split_auto(double gpu_host_gbps, double cpu_gbps)
{
    if (!(gpu_host_gbps > 0) || !(cpu_gbps > 0))
        return 0;
    return (uint32_t)(100.0 * cpu_gbps / (cpu_gbps + gpu_host_gbps) + 0.5);
}

double hosttail_split_gbps(uint32_t pct, double gpu_host_gbps, double cpu_gbps)
{
    if (pct == 0 || !(gpu_host_gbps > 0) || !(cpu_gbps > 0))
        return 0;
    const double p = pct > 100 ? 1.0 : pct / 100.0, tc = p / cpu_gbps,
                 tg = (1.0 - p) / gpu_host_gbps;
    return 1.0 / (tc > tg ? tc : tg);
}

enum hosttail_split_mode hosttail_split_mode(double tail_us, uint32_t min_us, uint32_t async_us)
{
    if (tail_us < (double)min_us)
        return HOSTTAIL_SPLIT_OFF;
    return tail_us >= (double)async_us ? HOSTTAIL_SPLIT_ASYNC : HOSTTAIL_SPLIT_INLINE;
}
