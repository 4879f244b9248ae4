/* hosttail.c - CPU_TAIL's rule (hosttail.h). */
#include "common/hosttail.h"

int hosttail_cpu_faster(double pcie_gbps, double host_stream_gbps, double cpu_gbps,
                        double split_gbps)
{
    double streamed = pcie_gbps;
    if (host_stream_gbps > 0 && (streamed <= 0 || host_stream_gbps < streamed))
        streamed = host_stream_gbps;
    return cpu_gbps > 0 && streamed > 0 && cpu_gbps > streamed && cpu_gbps > split_gbps;
}
