/* hosttail.h - CPU_TAIL's rule, the one host-tail rule kvmgr's planner and the worker share:
 * whether a session's host KV blocks are attended by cpu threads rather than read by the gpu
 * over the link. The worker's other host-tail decisions (the split host read) are
 * worker/tail_policy.h. Rates in GB/s, 0 = unknown. */
#ifndef RKV_HOSTTAIL_H
#define RKV_HOSTTAIL_H

/* host blocks are attended on the cpu when its measured rate beats the rate they reach the gpu
 * (the link, or the host-pool read rate when that is slower; without a link the read rate
 * alone) and, where the worker splits its host reads, the rate of that split (the cpu and the
 * link together: split_gbps; 0 no split). Never with a rate unknown */
int hosttail_cpu_faster(double pcie_gbps, double host_stream_gbps, double cpu_gbps,
                        double split_gbps);

#endif
