/* hosttail.h - the host-tail tactic's rules, one place for kvmgr's planner and the worker: where
 * a session's host KV blocks are attended (the GPU over the link, CPU threads, or both at once
 * by the split host read) and when a step splits. Rates in GB/s, 0 = unknown. */
#ifndef RKV_HOSTTAIL_H
#define RKV_HOSTTAIL_H

#include <stdint.h>

/* CPU_TAIL's rule: host blocks are attended on the cpu when its measured rate beats the rate
 * they reach the gpu (the link, or the host-pool read rate when that is slower; without a link
 * the read rate alone) and, where the worker splits its host reads, the rate of that split
 * (the cpu and the link together: split_gbps; 0 no split). Never with a rate unknown */
int hosttail_cpu_faster(double pcie_gbps, double host_stream_gbps, double cpu_gbps,
                        double split_gbps);
/* the split host read's automatic share: the cpu's part of the two rates a tail is read at
 * together (the gpu's host-block attention rate, the cpu's), as a percent 0..100 rounded; 0
 * when either is unknown */
uint32_t hosttail_split_auto(double gpu_host_gbps, double cpu_gbps);
/* the rate a tail is read at with pct percent of it on the cpu and the rest on the gpu, both at
 * once: the tail over the longer of the two parts' times; 0 when pct is 0 or a rate unknown */
double hosttail_split_gbps(uint32_t pct, double gpu_host_gbps, double cpu_gbps);

/* how a step with the split on reads its decode rows' host tails, from the link time of one
 * layer's tail (tail_us): a tail under min_us is left to the gpu (the cpu's part would stand on
 * the layer's critical path beside the gpu's own work, which a short tail does not hide); one
 * of at least async_us runs the cpu's part off the thread that launches the layers */
enum hosttail_split_mode {
    HOSTTAIL_SPLIT_OFF = 0,
    HOSTTAIL_SPLIT_INLINE = 1,
    HOSTTAIL_SPLIT_ASYNC = 2,
};
enum hosttail_split_mode hosttail_split_mode(double tail_us, uint32_t min_us, uint32_t async_us);

#endif
