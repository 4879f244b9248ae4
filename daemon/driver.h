/* driver.h - rkvd's link to kvmgr and the workers: one thread per worker runs steps. */
#ifndef RKV_DRIVER_H
#define RKV_DRIVER_H

#include <stdint.h>
#include <uv.h>

#include "daemon/sched.h"
#include "proto/msg.h"
#include "proto/sock.h"

/*
 * Each worker has a thread that takes one step_job at a time: KV_PREP to
 * kvmgr (block tables, the previous step's epoch acknowledged), STEP_REQ to
 * the worker, results back to the loop (with prep_ahead, the KV_PREP of the next
 * decode step runs beside the worker's step, on a helper thread). The threads block on nng with
 * timeouts; the loop never does. A monitor thread polls kvmgr's status
 * (restart detection, pool use) and each idle worker's readiness, and
 * collects kvmgr's tactic events: from pub/sub at once, and with EVENTS_GET
 * whatever pub/sub dropped (STATUS carries kvmgr's newest event number); each
 * reaches the loop once, in kvmgr's order. Everything reaches the loop
 * through one uv_async_t and the callbacks below, which run on the loop
 * thread.
 */

struct driver_cbs {
    void (*job_done)(void *ud, struct step_job *job);
    /* max_batch_tokens, on_gpu: what the worker's hello answered (0: an older worker) */
    void (*worker_up)(void *ud, uint32_t worker, uint32_t max_batch_tokens, int on_gpu);
    void (*worker_down)(void *ud, uint32_t worker, const char *why);
    /* kvmgr answered with another pid than before (0 = first contact) */
    void (*kvmgr_changed)(void *ud, uint32_t old_pid, uint32_t new_pid);
    void (*kvmgr_down)(void *ud, const char *why);
    void (*kvmgr_status)(void *ud, const struct proto_status *st);
    void (*tactic_event)(void *ud, const struct proto_tactic_event *ev);
    void (*histogram)(void *ud, const struct proto_histogram *h);
    void *ud;
};

struct driver_config {
    uint32_t n_workers;
    const char *kvmgr_url;     /* req/rep */
    const char *kvmgr_pub_url; /* tactic events and histograms */
    const char *const *worker_urls;
    int step_timeout_ms;
    /* while a step whose sequences all sample runs, ask kvmgr for the tables of the
     * next step as the scheduler will likely build it (each of them one token more,
     * PROTO_KV_AHEAD); a next step that differs gets a KV_PREP of its own */
    int prep_ahead;
};

struct driver;

int driver_start(uv_loop_t *loop, const struct driver_config *cfg, const struct driver_cbs *cbs,
                 struct driver **out, char *errbuf, size_t errlen);
/* hands a job to its worker's thread; RKV_EBUSY if that worker has one, RKV_ECLOSED once
 * driver_stop began (the job stays the caller's) */
int driver_submit(struct driver *d, struct step_job *job);
/* a synchronous control call to kvmgr from the loop thread's point of view:
 * runs on the monitor thread and calls back on the loop */
typedef void (*driver_call_cb)(void *ud, int rc, const struct proto_in *reply, const char *err);
int driver_kvmgr_call(struct driver *d, int type, const void *payload, size_t len,
                      driver_call_cb cb, void *ud);
/* the supervisor saw worker's process die (an idle worker fails no step):
 * its thread probes it with hello until the new process is ready */
void driver_worker_lost(struct driver *d, uint32_t worker);
/* stops the threads (waits for a step in flight up to its timeout) */
void driver_stop(struct driver *d);

#endif
