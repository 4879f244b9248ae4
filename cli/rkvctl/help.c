/* help.c - rkvctl's man-page-style help topics (rkvctl help TOPIC, COMMAND --help). */
#include "cli/rkvctl/rkvctl.h"

#include <stdio.h>
#include <string.h>

static const struct topic {
    const char *name;
    const char *summary;
    const char *text;
} g_topics[] = {
    {"rkvctl", "the admin CLI: commands, global options",
     "NAME\n"
     "    rkvctl - steer and watch a running rkvd\n\n"
     "SYNOPSIS\n"
     "    rkvctl [--socket PATH] [--json] COMMAND [ARGS...]\n\n"
     "DESCRIPTION\n"
     "    rkvctl talks to rkvd over its admin socket (nng req/rep on a unix socket,\n"
     "    mode 0660, group admin_group). Whoever can open the socket is an admin.\n\n"
     "COMMANDS\n"
     "    status                          version, model, uptime, workers, kvmgr, budgets, pools\n"
     "    budget get|set                  VRAM target, host budget, compute reserve (live)\n"
     "    mode get|set MODE               tactic mode: auto resident window cpu_tail\n"
     "    tactics [--gpu N] [--watch [SEC]]  sessions and KV bytes per tactic, as bars\n"
     "    sessions [list|show|evict|pin|unpin ID]\n"
     "    workers [list|restart N|drain N]\n"
     "    events [--since T] [--session ID] [--follow]   the tactic-transition log\n"
     "    keys add NAME [--scope user|admin] [LIMITS] | list | revoke ID\n"
     "         | limits ID LIMITS                                API keys and their limits\n"
     "    help [TOPIC]                    this text, or a topic below\n\n"
     "GLOBAL OPTIONS\n"
     "    --socket PATH   the admin socket (default $RKV_RUNTIME_DIR/admin.sock, else\n"
     "                    /run/rkv/admin.sock)\n"
     "    --json          print the result as JSON (see rkvctl help json)\n"
     "    --timeout SEC   how long to wait for rkvd (default 15)\n"
     "    -h, --help      help; COMMAND --help for one command\n\n"
     "EXIT STATUS\n"
     "    0 ok, 1 usage error (bad option or value), 2 rkvd unreachable, 3 refused by\n"
     "    rkvd (the message says why). See rkvctl help exit-codes.\n"},
    {"status", "what rkvd is doing now",
     "NAME\n    rkvctl status - version, model, uptime, workers, kvmgr state, budgets, pool use\n\n"
     "SYNOPSIS\n    rkvctl [--json] status\n\n"
     "DESCRIPTION\n"
     "    One screen: rkv version, the served model and backend, uptime and health,\n"
     "    kvmgr (pid, mode, sessions), every worker (gpu, pid, state, restarts, step\n"
     "    sizes as tokens a step / prompt tokens of a sequence a step / prompt tokens of\n"
     "    a step that also decodes, last step time), the sessions per gpu (where each runs now: "
     "kvmgr places new\n"
     "    sessions and moves spilled ones between gpus), the budgets, device and host\n"
     "    KV pool use, requests running and waiting, and tokens per second over the\n"
     "    last few seconds.\n"},
    {"budget", "VRAM target, host budget, compute reserve",
     "NAME\n    rkvctl budget - read or change the memory budgets, live\n\n"
     "SYNOPSIS\n"
     "    rkvctl budget get [--gpu N]\n"
     "    rkvctl budget set [--vram-target SIZE] [--host-budget SIZE] [--compute-reserve SIZE]\n"
     "                      [--gpu N]\n\n"
     "DESCRIPTION\n"
     "    set hands the new budgets to kvmgr, which re-plans every session at once\n"
     "    (parking idle ones, moving tails to host, or promoting them back), then\n"
     "    stores them in rkvd's state database so they survive a restart. The answer\n"
     "    shows the tactic histogram before and after the re-plan. Options not given\n"
     "    keep their value. A VRAM target above the size of the pool made at start\n"
     "    cannot grow the pool until rkvd restarts. kvmgr applies one VRAM target to\n"
     "    every GPU: --gpu is accepted but only selects which GPU's histogram matters.\n\n"
     "    SIZE is 512MiB, 24GiB, 64KiB, 1.5GiB, 100B, or a bare number of MiB (see\n"
     "    rkvctl help sizes).\n\n"
     "EXAMPLES\n"
     "    rkvctl budget set --vram-target 20GiB\n"
     "    rkvctl budget set --host-budget 64GiB --compute-reserve 2GiB\n"},
    {"mode", "the tactic mode",
     "NAME\n    rkvctl mode - read or force the tactic mode\n\n"
     "SYNOPSIS\n    rkvctl mode get\n    rkvctl mode set auto|resident|window|cpu_tail\n\n"
     "DESCRIPTION\n"
     "    auto lets kvmgr choose per session (park idle ones, then WINDOW, then\n"
     "    CPU_TAIL, then queue). The others force a tactic where the budgets allow.\n"
     "    The mode is persisted like the budgets.\n"},
    {"tactics", "sessions and KV bytes per tactic, as a bar chart",
     "NAME\n    rkvctl tactics - the tactic histogram per GPU\n\n"
     "SYNOPSIS\n    rkvctl tactics [--gpu N] [--watch [SEC]] [--count N]\n\n"
     "DESCRIPTION\n"
     "    Draws, per GPU, one bar per tactic (resident, window, cpu_tail, parked) with\n"
     "    the number of sessions and their KV bytes, and the device and host pool use.\n"
     "    --watch redraws in place every SEC seconds (default 1) until Ctrl-C;\n"
     "    --count N stops after N drawings. With --json each drawing is one line.\n"},
    {"sessions", "list, inspect, evict and pin sessions",
     "NAME\n    rkvctl sessions - the sessions whose KV rkv holds\n\n"
     "SYNOPSIS\n"
     "    rkvctl sessions [list]\n"
     "    rkvctl sessions show|evict|pin|unpin ID\n\n"
     "DESCRIPTION\n"
     "    ID is the session_id an API client sent, or #N for rkv's numeric id (the\n"
     "    # column of list; requests without a session_id have private sessions).\n"
     "    list shows each session's tactic, tokens and tail (positions on host).\n"
     "    show adds its recent tactic transitions. evict frees its KV now (the next\n"
     "    request of the session re-prefills); a session serving a request cannot be\n"
     "    evicted. pin asks kvmgr to keep the session resident from its next step on;\n"
     "    unpin undoes it.\n"},
    {"workers", "list, restart and drain workers",
     "NAME\n    rkvctl workers - the worker processes (one per GPU)\n\n"
     "SYNOPSIS\n"
     "    rkvctl workers [list]\n    rkvctl workers restart N\n"
     "    rkvctl workers drain N [--off]\n\n"
     "DESCRIPTION\n"
     "    restart stops worker N (SIGTERM); the supervisor starts it again and its\n"
     "    sessions continue (their KV stays in kvmgr). drain stops sending new\n"
     "    sessions to worker N; its sessions finish there. --off takes it back.\n"},
    {"events", "the tactic-transition log",
     "NAME\n    rkvctl events - tactic transitions kvmgr published\n\n"
     "SYNOPSIS\n"
     "    rkvctl events [--since T] [--session ID] [--limit N] [--follow] [--count N]\n\n"
     "DESCRIPTION\n"
     "    Prints transitions oldest first: time, session, gpu, from -> to, reason and\n"
     "    bytes moved. --since T takes an age (30s, 10m, 2h, 1d), a UTC time\n"
     "    (2026-11-29T12:00:00Z) or unix milliseconds (see rkvctl help times).\n"
     "    --limit N prints at most the N newest (default 100). --follow keeps\n"
     "    printing new transitions until Ctrl-C; --count N stops after N events.\n"},
    {"keys", "API keys for /v1 and the HTTP admin API",
     "NAME\n    rkvctl keys - API keys\n\n"
     "SYNOPSIS\n"
     "    rkvctl keys add NAME [--scope user|admin] [LIMITS]\n    rkvctl keys list\n"
     "    rkvctl keys revoke ID\n    rkvctl keys limits ID [LIMITS]\n"
     "    LIMITS: [--rpm N] [--tpm N] [--max-concurrent N] [--max-tokens N]\n"
     "            [--max-prompt N]\n\n"
     "DESCRIPTION\n"
     "    Once any key exists, /v1/* needs \"Authorization: Bearer rkv-...\" with a live\n"
     "    key (401 otherwise). Keys with admin scope may also change things through\n"
     "    POST /admin/v1/COMMAND. add prints the secret once: only a salted PBKDF2\n"
     "    hash is stored. revoke takes the numeric id from list.\n\n"
     "    Limits (per key, enforced on /v1; over one the client gets 429 with\n"
     "    Retry-After and type \"requests\" or \"tokens\"): --rpm requests and --tpm\n"
     "    prompt + completion tokens per window (rkvd's rate_limit_window, 60 s),\n"
     "    --max-concurrent requests in flight, --max-tokens the largest max_tokens of\n"
     "    one request, --max-prompt the longest prompt in tokens (400 beyond it).\n"
     "    N = 0 is unlimited; \"default\" follows rkvd's key_rpm, key_tpm,\n"
     "    key_max_concurrent, key_max_tokens, key_max_prompt. limits changes them live (without\n"
     "    LIMITS it prints them); list shows them.\n"},
    {"json", "the --json output, for scripts",
     "NAME\n    rkvctl --json - stable machine-readable output\n\n"
     "DESCRIPTION\n"
     "    With --json rkvctl prints the result object of the admin command as JSON on\n"
     "    stdout (the same object GET /admin/v1/COMMAND returns under \"result\").\n"
     "    Sizes are bytes, times unix milliseconds (ts_ms, created_ms) or durations in\n"
     "    milliseconds (*_ms). Fields are only ever added, never renamed.\n\n"
     "    status         {version, model, model_path, backend, deterministic, listen, uptime_ms,\n"
     "                    healthy, health_reason,\n"
     "                    kvmgr{up,pid,restarts,mode,sessions,uptime_ms},\n"
     "                    workers[{id,gpu,pid,up,draining,restarts,state,step_ms,\n"
     "                    max_batch_tokens,prefill_chunk,prefill_beside_decode,\n"
     "                    prefill_beside_decode_now}],\n"
     "                    budgets{vram_target,host_budget,compute_reserve},\n"
     "                    pool{device_used,device_total,host_used,host_total,kv_dtype,\n"
     "                    kv_bytes_per_token},\n"
     "                    requests{running,waiting,sessions},\n"
     "                    tokens{prompt,cached,generated,per_second}, block_size, ctx_size,\n"
     "                    api_keys, sessions_per_gpu[N per worker] (added by rkvctl\n"
     "                    from sessions_list)}\n"
     "    budget get     {budget{vram_target,host_budget,compute_reserve,gpu}, set_at_runtime}\n"
     "    budget set     {budget{...}, before[HIST], after[HIST], summary[\"gpu 0: ...\"]}\n"
     "    mode get|set   {mode}\n"
     "    tactics        {tactics[names], gpus[HIST]}; HIST = {gpu, sessions{TACTIC:n},\n"
     "                    bytes{TACTIC:n}, device_used, device_total, host_used, host_total,\n"
     "                    age_ms}; with --watch one such object per line\n"
     "    sessions list  {sessions[SESSION]}; SESSION = {sid, id, worker, tokens, kv_tokens,\n"
     "                    kv_bytes, busy, pinned, idle_ms, tactic, tail_blocks, tail_tokens}\n"
     "    sessions show  {session: SESSION, events[EVENT]}\n"
     "    sessions evict {sid, id, evicted}; pin/unpin {sid, id, pinned}\n"
     "    workers list   {workers[...as in status]}; restart {worker, old_pid, restarting};\n"
     "                   drain {worker, draining}\n"
     "    events         {events[EVENT], next_since}; EVENT = {ts_ms, session, gpu, from, to,\n"
     "                    reason, bytes_moved, elapsed_us}; with --follow one EVENT per line\n"
     "    keys add       {id, name, scope, secret, limits}; keys list {keys[{id, name, scope,\n"
     "                    prefix, created_ms, revoked, limits}]}; keys revoke {id, revoked};\n"
     "                    keys limits {id, name, limits}; LIMITS = {rpm, tpm, max_concurrent,\n"
     "                    max_tokens, max_prompt}, each a number (0 = unlimited) or\n"
     "                    \"default\"\n\n"
     "    Errors go to stderr as one line (with --json: {\"ok\":false,\"error\":{code,\n"
     "    name,message}} on stdout as well) with the exit codes of rkvctl help exit-codes.\n"},
    {"exit-codes", "what rkvctl's exit status means",
     "NAME\n    rkvctl exit codes\n\n"
     "    0   the command succeeded\n"
     "    1   usage: unknown command or option, a missing or malformed value; nothing\n"
     "        was sent to rkvd\n"
     "    2   rkvd is unreachable: no socket at the path, nobody listening, no permission\n"
     "        to open it, or no answer in time\n"
     "    3   rkvd refused the command: a bad value, an unknown session, a busy\n"
     "        session, kvmgr not answering; the message says what to do\n"},
    {"sizes", "how sizes are written",
     "NAME\n    sizes\n\n"
     "    In: 512MiB, 24GiB, 1.5GiB, 64KiB, 100B, or a bare number meaning MiB (24000).\n"
     "    Out: 1.50 GiB, 64.00 KiB (powers of 1024).\n"},
    {"times", "how times are written",
     "NAME\n    times\n\n"
     "    In (--since): an age 30s, 10m, 2h, 1d, 500ms; a UTC time 2026-11-29T12:00:00Z or\n"
     "    \"2026-11-29 12:00:00\"; or unix milliseconds.\n"
     "    Out: local wall-clock time (12:34:56) for events, durations as 2h 5m, 41s.\n"},
};
#define N_TOPICS (sizeof g_topics / sizeof g_topics[0])

int rkvctl_help(const char *topic, FILE *f)
{
    if (!topic) {
        fputs(g_topics[0].text, f);
        fputs("\nHELP TOPICS (rkvctl help TOPIC)\n", f);
        for (size_t i = 0; i < N_TOPICS; i++)
            fprintf(f, "    %-12s %s\n", g_topics[i].name, g_topics[i].summary);
        return 0;
    }
    for (size_t i = 0; i < N_TOPICS; i++) {
        if (strcmp(g_topics[i].name, topic) == 0) {
            fputs(g_topics[i].text, f);
            return 0;
        }
    }
    return -1;
}
