/* supervisor.h - rkvd's children (kvmgr, workers): spawn, restart with backoff, give up. */
#ifndef RKV_SUPERVISOR_H
#define RKV_SUPERVISOR_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

struct sup;
struct sup_child;

struct sup_child_spec {
    const char *name;      /* "kvmgr", "worker0": for logs and events */
    char *const *argv;     /* argv[0] is the executable path; copied */
    uint32_t max_restarts; /* within window_ms; one more death = give up */
    uint64_t window_ms;
    uint64_t backoff_min_ms; /* first restart delay, doubled per death in the window */
    uint64_t backoff_max_ms;
};

enum sup_event {
    SUP_STARTED, /* a process is running (first start or restart) */
    SUP_EXITED,  /* it died or exited; status = wait status */
    SUP_GAVE_UP, /* too many deaths in the window: the caller should exit non-zero */
    SUP_STOPPED, /* it exited after sup_stop_all */
};

enum sup_state { SUP_RUNNING, SUP_BACKOFF, SUP_FAILED, SUP_DONE };

typedef void (*sup_event_cb)(void *ud, struct sup_child *c, enum sup_event ev, int status);

int sup_create(uv_loop_t *loop, sup_event_cb cb, void *ud, struct sup **out);
/* starts the child now */
int sup_add(struct sup *s, const struct sup_child_spec *spec, struct sup_child **out);
const char *sup_child_name(const struct sup_child *c);
pid_t sup_child_pid(const struct sup_child *c); /* 0 when not running */
enum sup_state sup_child_state(const struct sup_child *c);
uint32_t sup_child_restarts(const struct sup_child *c); /* total restarts */
/* sends a signal to the running process (restart on demand: SIGTERM) */
int sup_child_kill(struct sup_child *c, int sig);
/* SIGTERM to every child, SIGKILL after deadline_ms; done_cb when all exited (or, for a
 * child that SIGKILL does not end, 5 s after it) */
void sup_stop_all(struct sup *s, uint64_t deadline_ms, void (*done_cb)(void *ud), void *ud);
/* sig to every running child, at once (rkvd's "exit now"); NULL is fine */
void sup_kill_all(struct sup *s, int sig);
/* frees everything; children must have exited (after sup_stop_all's done) */
void sup_destroy(struct sup *s);

#endif
