/* supervisor.c - children as uv_process_t, restarted with exponential backoff. */
#include "daemon/supervisor.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/util.h"

struct sup_child {
    struct sup *sup;
    char name[32];
    char **argv;
    struct sup_child_spec spec;
    uv_process_t proc;
    uv_timer_t timer;
    int proc_live; /* proc handle open (not yet closed) */
    int n_handles; /* open uv handles; the child is freed when none remain */
    int closing;   /* sup_destroy called */
    pid_t pid;
    enum sup_state state;
    uint64_t window_start;
    uint32_t deaths_in_window;
    uint32_t restarts;
    struct sup_child *next;
};

struct sup {
    uv_loop_t *loop;
    sup_event_cb cb;
    void *ud;
    struct sup_child *children;
    int stopping;
    uv_timer_t kill_timer;
    int killed; /* the kill timer sent SIGKILL: its next expiry gives up waiting */
    void (*done_cb)(void *ud);
    void *done_ud;
};

static int child_start(struct sup_child *c);

/* how long sup_stop_all waits for the children after it sent them SIGKILL */
#define SUP_KILL_WAIT_MS 5000

int sup_create(uv_loop_t *loop, sup_event_cb cb, void *ud, struct sup **out)
{
    struct sup *s = calloc(1, sizeof *s);
    if (!s)
        return RKV_ENOMEM;
    s->loop = loop;
    s->cb = cb;
    s->ud = ud;
    uv_timer_init(loop, &s->kill_timer);
    *out = s;
    return 0;
}

static void check_all_stopped(struct sup *s)
{
    if (!s->stopping)
        return;
    for (struct sup_child *c = s->children; c; c = c->next)
        if (c->proc_live)
            return;
    uv_timer_stop(&s->kill_timer);
    if (s->done_cb) {
        void (*cb)(void *) = s->done_cb;
        s->done_cb = NULL;
        cb(s->done_ud);
    }
}

static void child_release(struct sup_child *c)
{
    if (--c->n_handles > 0 || !c->closing)
        return;
    for (char **a = c->argv; *a; a++)
        free(*a);
    free(c->argv);
    free(c);
}

static void proc_closed(uv_handle_t *h)
{
    struct sup_child *c = h->data;
    c->proc_live = 0;
    if (!c->closing)
        check_all_stopped(c->sup);
    child_release(c);
}

static void restart_timer(uv_timer_t *t)
{
    struct sup_child *c = t->data;
    if (c->sup->stopping || c->state != SUP_BACKOFF)
        return;
    c->restarts++;
    if (child_start(c) != 0) {
        /* spawn itself failed (binary gone?): counts as a death */
        c->state = SUP_FAILED;
        c->sup->cb(c->sup->ud, c, SUP_GAVE_UP, -1);
    }
}

static void on_exit_cb(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct sup_child *c = p->data;
    struct sup *s = c->sup;
    int status = term_signal ? term_signal : (int)(exit_status << 8);
    c->pid = 0;
    uv_close((uv_handle_t *)&c->proc, proc_closed);
    if (s->stopping) {
        c->state = SUP_DONE;
        s->cb(s->ud, c, SUP_STOPPED, status);
        return;
    }
    if (term_signal)
        log_warn("%s died from signal %d (%s)", c->name, term_signal, strsignal(term_signal));
    else
        log_warn("%s exited with status %d", c->name, (int)exit_status);
    s->cb(s->ud, c, SUP_EXITED, status);
    if (c->state == SUP_DONE)
        return; /* the callback decided it should not come back */

    uint64_t now = rkv_now_ms();
    if (now - c->window_start > c->spec.window_ms) {
        c->window_start = now;
        c->deaths_in_window = 0;
    }
    c->deaths_in_window++;
    if (c->deaths_in_window > c->spec.max_restarts) {
        log_error("%s died %u times within %llu s: giving up", c->name, c->deaths_in_window,
                  (unsigned long long)(c->spec.window_ms / 1000));
        c->state = SUP_FAILED;
        s->cb(s->ud, c, SUP_GAVE_UP, status);
        return;
    }
    uint64_t delay = c->spec.backoff_min_ms;
    for (uint32_t i = 1; i < c->deaths_in_window && delay < c->spec.backoff_max_ms; i++)
        delay *= 2;
    if (delay > c->spec.backoff_max_ms)
        delay = c->spec.backoff_max_ms;
    log_info("restarting %s in %llu ms (death %u of %u allowed in the window)", c->name,
             (unsigned long long)delay, c->deaths_in_window, c->spec.max_restarts);
    c->state = SUP_BACKOFF;
    uv_timer_start(&c->timer, restart_timer, delay, 0);
}

static int child_start(struct sup_child *c)
{
    uv_process_options_t o;
    uv_stdio_container_t stdio[3];
    memset(&o, 0, sizeof o);
    /* children share rkvd's stderr (journald) and get /dev/null as stdin */
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = 1;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    o.file = c->argv[0];
    o.args = c->argv;
    o.exit_cb = on_exit_cb;
    o.stdio = stdio;
    o.stdio_count = 3;
    c->proc.data = c;
    int rc = uv_spawn(c->sup->loop, &c->proc, &o);
    if (rc) {
        log_error("cannot start %s (%s): %s", c->name, c->argv[0], uv_strerror(rc));
        /* a failed uv_spawn still leaves an initialized handle to close */
        c->n_handles++;
        uv_close((uv_handle_t *)&c->proc, proc_closed);
        return rc;
    }
    c->n_handles++;
    c->proc_live = 1;
    c->pid = c->proc.pid;
    c->state = SUP_RUNNING;
    log_info("started %s (pid %d)", c->name, (int)c->pid);
    c->sup->cb(c->sup->ud, c, SUP_STARTED, 0);
    return 0;
}

int sup_add(struct sup *s, const struct sup_child_spec *spec, struct sup_child **out)
{
    struct sup_child *c = calloc(1, sizeof *c);
    if (!c)
        return RKV_ENOMEM;
    size_t n = 0;
    while (spec->argv[n])
        n++;
    c->argv = calloc(n + 1, sizeof *c->argv);
    if (!c->argv) {
        free(c);
        return RKV_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        c->argv[i] = strdup(spec->argv[i]);
    c->sup = s;
    c->spec = *spec;
    c->spec.argv = NULL;
    snprintf(c->name, sizeof c->name, "%s", spec->name);
    c->window_start = rkv_now_ms();
    uv_timer_init(s->loop, &c->timer);
    c->timer.data = c;
    c->n_handles = 1;
    c->next = s->children;
    s->children = c;
    int rc = child_start(c);
    if (rc)
        c->state = SUP_FAILED;
    if (out)
        *out = c;
    return rc;
}

const char *sup_child_name(const struct sup_child *c)
{
    return c->name;
}
pid_t sup_child_pid(const struct sup_child *c)
{
    return c->pid;
}
enum sup_state sup_child_state(const struct sup_child *c)
{
    return c->state;
}
uint32_t sup_child_restarts(const struct sup_child *c)
{
    return c->restarts;
}

int sup_child_kill(struct sup_child *c, int sig)
{
    if (!c->proc_live || !c->pid)
        return RKV_ESTATE;
    return uv_process_kill(&c->proc, sig);
}

static void kill_timer_cb(uv_timer_t *t)
{
    struct sup *s = t->data;
    if (s->killed) {
        /* SIGKILL did not end it either (a process in uninterruptible sleep, such as one
         * stuck in a gpu driver): stop waiting, so that rkvd exits and its service manager
         * sees it; the process is reaped by whoever inherits it */
        int any = 0;
        for (struct sup_child *c = s->children; c; c = c->next)
            if (c->proc_live && c->pid) {
                log_error("%s (pid %d) is still there %llu ms after SIGKILL: not waiting for "
                          "it any longer",
                          c->name, (int)c->pid, (unsigned long long)SUP_KILL_WAIT_MS);
                any = 1;
            }
        if (any && s->done_cb) {
            void (*cb)(void *) = s->done_cb;
            s->done_cb = NULL;
            cb(s->done_ud);
        }
        return;
    }
    s->killed = 1;
    for (struct sup_child *c = s->children; c; c = c->next) {
        if (c->proc_live && c->pid) {
            log_warn("%s did not stop in time: SIGKILL", c->name);
            uv_process_kill(&c->proc, SIGKILL);
        }
    }
    uv_timer_start(&s->kill_timer, kill_timer_cb, SUP_KILL_WAIT_MS, 0);
}

void sup_kill_all(struct sup *s, int sig)
{
    for (struct sup_child *c = s ? s->children : NULL; c; c = c->next)
        if (c->proc_live && c->pid)
            uv_process_kill(&c->proc, sig);
}

void sup_stop_all(struct sup *s, uint64_t deadline_ms, void (*done_cb)(void *ud), void *ud)
{
    s->stopping = 1;
    s->done_cb = done_cb;
    s->done_ud = ud;
    for (struct sup_child *c = s->children; c; c = c->next) {
        uv_timer_stop(&c->timer);
        if (c->proc_live && c->pid)
            uv_process_kill(&c->proc, SIGTERM);
        else
            c->state = SUP_DONE;
    }
    s->kill_timer.data = s;
    uv_timer_start(&s->kill_timer, kill_timer_cb, deadline_ms, 0);
    check_all_stopped(s);
}

static void child_timer_closed(uv_handle_t *h)
{
    child_release(h->data);
}

static void sup_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

void sup_destroy(struct sup *s)
{
    if (!s)
        return;
    for (struct sup_child *c = s->children, *n; c; c = n) {
        n = c->next;
        c->closing = 1;
        uv_close((uv_handle_t *)&c->timer, child_timer_closed);
    }
    s->kill_timer.data = s;
    uv_close((uv_handle_t *)&s->kill_timer, sup_timer_closed);
}
