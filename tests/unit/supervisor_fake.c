/* supervisor_fake: a stand-in for pagoda's programs in test_supervisor.
 *
 * Linked as BINDIR/pagoda-kvpool, -worker, -scheduler, -router and -gateway, it takes its role from
 * the name it was started under and accepts the flags the real program takes, refusing any other
 * (exit 64), so that a test sees what the supervisor passes. It appends one line per thing it
 * does to RUN_DIR/events.log ("<monotonic ms> <event> <name> <pid> <detail>", written with one
 * O_APPEND write so that lines of several processes do not mix) and writes its pid to
 * RUN_DIR/fake-<name>.pid. Events: start (detail: its arguments), ready, crash, hung-report,
 * term, exit, hang.
 *
 * Like the real programs, a fake started with PAGODA_HEARTBEAT_MS in its environment sends
 * heartbeats (wire.h) that often while it runs.
 *
 * Behaviour flags (passed with the supervisor's --X-arg):
 *   --ready-delay-ms N     push Control{ready} N ms after the start (default 0)
 *   --ready-delay-for NAME:N   the same, only for the fake named NAME ("worker-1")
 *   --never-ready          never push it
 *   --never-ready-if FILE  never push it when FILE exists at the start (a restart that stalls)
 *   --crash-after-ms N     N ms after ready (after the start with --never-ready), crash:
 *   --crash-code C         exit with status C (default 1), or
 *   --crash-signal S       kill itself with signal S
 *   --crash-once FILE      crash (or hang) only if FILE does not exist yet (and create it)
 *   --crash-after-group-ready  count --crash-after-ms from when both it is ready and RUN_DIR/ready
 *                          (the group's) exists: a crash that lands while the group still starts
 *                          is a failed start (whatever the machine's load), not a restart
 *   --hang-after-ms N      N ms after ready, stop: no more heartbeats, no answer to SIGTERM
 *                          (a blocked event loop); the process stays until it is killed
 *   --ignore-term          ignore SIGTERM
 *   --term-delay-ms N      on SIGTERM, wait N ms (draining) before exiting 0
 *   --report-hung I:J      (scheduler) 100 ms after ready, report worker I hung with the pid of
 *                          worker J's fake (repeatable; reports are sent in order)
 *   --check                (router) the router's check before the start: event "check" (detail:
 *                          its other arguments), then exit 0, or with --check-fails exit
 *                          PAGODA_EXIT_CANNOT_RUN (a file the router cannot take)
 *   --deposit-junk         (kvpool) before its deposit, send the keeper a message too large for
 *                          it (ignored) and a refusal, a message without descriptors (the keeper
 *                          lets go of what it holds; the deposit that follows replaces it)
 *
 * The keeper (deploy/keeper.h): a kvpool fake given a keeper link (WIRE_KVPOOL_KEEPER_ENV) does
 * what a GPU kvpool does with it, with a memfd of 8 bytes as its "pool": it takes what is offered
 * (event "offer", detail the counter in the memfd, or "none", or "bad: why"), then deposits the
 * offered memfd with its counter incremented, or a new one holding 1, before it is ready. So a
 * counter of N in the offer says that the same memory went through N kvpools, held by the
 * supervisor alone between them.
 * A fake runs only under the supervisor whose pid is in RUN_DIR/supervisor.pid (or, for an
 * engine's RUN_DIR/engine-I, in RUN_DIR's) and dies with
 * it (PR_SET_PDEATHSIG, and a check of its parent), so a failed test leaves no process
 * behind. */
#include "common/error.h"
#include "common/exit_status.h"
#include "common/fd_pass.h"
#include "wire/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { R_KVPOOL = 1, R_WORKER = 2, R_SCHEDULER = 4, R_ROUTER = 8, R_GATEWAY = 16, R_ALL = 31 };

struct flag {
    const char *name;
    int roles;     /* which roles accept it */
    int has_value; /* takes the next argument */
};

static const struct flag flags[] = {
    {"--run-dir", R_ALL, 1},
    {"--log-level", R_ALL, 1},
    {"--model", R_KVPOOL | R_WORKER | R_ROUTER, 1},
    {"--block-size", R_KVPOOL, 1},
    {"--kv-blocks", R_KVPOOL, 1},
    {"--kv-bytes", R_KVPOOL, 1},
    {"--worker-id", R_WORKER, 1},
    {"--backend", R_KVPOOL | R_WORKER, 1},
    {"--workers", R_SCHEDULER, 1},
    {"--listen", R_ROUTER | R_GATEWAY, 1},
    {"--scheduler", R_ROUTER, 1},
    {"--routing", R_ROUTER, 1},
    {"--router", R_GATEWAY, 1},
    {"--model-name", R_GATEWAY, 1},
    {"--ready-delay-ms", R_ALL, 1},
    {"--ready-delay-for", R_ALL, 1},
    {"--never-ready", R_ALL, 0},
    {"--never-ready-if", R_ALL, 1},
    {"--crash-after-ms", R_ALL, 1},
    {"--crash-code", R_ALL, 1},
    {"--crash-signal", R_ALL, 1},
    {"--crash-once", R_ALL, 1},
    {"--crash-after-group-ready", R_ALL, 0},
    {"--ignore-term", R_ALL, 0},
    {"--term-delay-ms", R_ALL, 1},
    {"--report-hung", R_SCHEDULER, 1},
    {"--hang-after-ms", R_ALL, 1},
    {"--deposit-junk", R_KVPOOL, 0},
    {"--check", R_ROUTER, 0},
    {"--check-fails", R_ROUTER, 0},
};

#define MAX_REPORTS 8

static char events_path[4200];
static char name[32] = "?";
static volatile sig_atomic_t term_received;

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

static void event(const char *what, const char *detail)
{
    char line[4096];
    int n = snprintf(line, sizeof(line), "%llu %s %s %d %s\n", now_ms(), what, name, (int)getpid(),
                     detail ? detail : "");
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line)) {
        n = sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    if (events_path[0] == '\0')
        return;
    int fd = open(events_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)n) < 0)
        perror("supervisor_fake: events.log");
    close(fd);
}

static void on_term(int signum)
{
    (void)signum;
    term_received = 1;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int usage_error(const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, arg);
    fprintf(stderr, "supervisor_fake (%s): %s\n", name, msg);
    event("usage", msg);
    return 64;
}

static int read_pid(const char *run_dir, int worker_id)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/fake-worker-%d.pid", run_dir, worker_id);
    FILE *f = fopen(path, "r");
    int pid = -1;
    if (f != NULL) {
        if (fscanf(f, "%d", &pid) != 1)
            pid = -1;
        fclose(f);
    }
    return pid;
}

/* The keeper link, as a GPU kvpool uses it (see the file comment). */
static void keeper_round(int junk)
{
    const char *text = getenv(WIRE_KVPOOL_KEEPER_ENV);
    if (text == NULL)
        return;
    int link = atoi(text);
    char msg[64], detail[700];
    int fds[4], n = 0, pool = -1;
    size_t len = 0;
    unsigned long long count = 0;
    int rc = fd_pass_recv(link, msg, sizeof(msg), &len, fds, 4, &n, MSG_DONTWAIT, "the offer");
    if (rc == PAGODA_ETIMEDOUT) {
        event("offer", "none");
    } else if (rc != 0 || n != 1 || len != 4 || memcmp(msg, "pool", 4) != 0 ||
               pread(fds[0], &count, sizeof(count), 0) != (ssize_t)sizeof(count)) {
        snprintf(detail, sizeof(detail), "bad: rc %d, %d descriptors, %zu bytes", rc, n, len);
        event("offer", detail);
        fd_pass_close(fds, n);
    } else {
        pool = fds[0];
        snprintf(detail, sizeof(detail), "%llu", count);
        event("offer", detail);
    }
    if (pool < 0 && (pool = memfd_create("supervisor_fake_pool", MFD_CLOEXEC)) < 0) {
        event("deposit", "memfd_create failed");
        return;
    }
    count++;
    if (pwrite(pool, &count, sizeof(count), 0) != (ssize_t)sizeof(count)) {
        event("deposit", "pwrite failed");
        return;
    }
    if (junk) {
        char big[2048];
        memset(big, 'j', sizeof(big));
        fd_pass_send(link, big, sizeof(big), &pool, 1, 0, "junk");
        fd_pass_send(link, "refused", 7, NULL, 0, 0, "a refusal");
    }
    rc = fd_pass_send(link, "pool", 4, &pool, 1, 0, "the deposit");
    snprintf(detail, sizeof(detail), "%llu%s", count, rc == 0 ? "" : " (send failed)");
    event("deposit", detail);
    close(pool);
    close(link);
}

int main(int argc, char **argv)
{
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    int role = 0;
    const char *sender = NULL;
    if (strcmp(base, "pagoda-kvpool") == 0)
        role = R_KVPOOL, sender = "kvpool";
    else if (strcmp(base, "pagoda-worker") == 0)
        role = R_WORKER, sender = "worker";
    else if (strcmp(base, "pagoda-scheduler") == 0)
        role = R_SCHEDULER, sender = "scheduler";
    else if (strcmp(base, "pagoda-router") == 0)
        role = R_ROUTER, sender = "router";
    else if (strcmp(base, "pagoda-gateway") == 0)
        role = R_GATEWAY, sender = "gateway";
    else
        return usage_error("started as '%s', not as one of pagoda's programs", base);
    snprintf(name, sizeof(name), "%s", sender);

    const char *run_dir = NULL, *model = NULL, *worker_id = NULL, *workers = NULL, *listen = NULL,
               *crash_once = NULL, *never_ready_if = NULL;
    int after_group_ready = 0;
    int ready_delay_ms = 0, never_ready = 0, crash_after_ms = -1, crash_code = 1, crash_signal = 0,
        ignore_term = 0, term_delay_ms = 0, hang_after_ms = -1, deposit_junk = 0, check = 0,
        check_fails = 0;
    int report_id[MAX_REPORTS], report_of[MAX_REPORTS], num_reports = 0;
    const char *delay_for = NULL;
    char args[3000] = "";
    size_t args_len = 0;

    for (int i = 1; i < argc; i++) {
        const struct flag *fl = NULL;
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            if (strcmp(argv[i], flags[k].name) == 0)
                fl = &flags[k];
        if (fl == NULL || !(fl->roles & role))
            return usage_error("unknown flag %s", argv[i]);
        const char *v = NULL;
        if (fl->has_value) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", argv[i]);
            v = argv[++i];
        }
        if (strcmp(fl->name, "--check") == 0) {
            check = 1;
            continue;
        }
        if (strcmp(fl->name, "--check-fails") == 0)
            check_fails = 1;
        int n = snprintf(args + args_len, sizeof(args) - args_len, "%s%s%s%s", args_len ? " " : "",
                         fl->name, v ? " " : "", v ? v : "");
        if (n > 0 && (size_t)n < sizeof(args) - args_len)
            args_len += (size_t)n;
        if (strcmp(fl->name, "--run-dir") == 0)
            run_dir = v;
        else if (strcmp(fl->name, "--model") == 0)
            model = v;
        else if (strcmp(fl->name, "--worker-id") == 0)
            worker_id = v;
        else if (strcmp(fl->name, "--workers") == 0)
            workers = v;
        else if (strcmp(fl->name, "--listen") == 0)
            listen = v;
        else if (strcmp(fl->name, "--ready-delay-ms") == 0)
            ready_delay_ms = atoi(v);
        else if (strcmp(fl->name, "--ready-delay-for") == 0)
            delay_for = v;
        else if (strcmp(fl->name, "--never-ready") == 0)
            never_ready = 1;
        else if (strcmp(fl->name, "--never-ready-if") == 0)
            never_ready_if = v;
        else if (strcmp(fl->name, "--crash-after-ms") == 0)
            crash_after_ms = atoi(v);
        else if (strcmp(fl->name, "--crash-code") == 0)
            crash_code = atoi(v);
        else if (strcmp(fl->name, "--crash-signal") == 0)
            crash_signal = atoi(v);
        else if (strcmp(fl->name, "--crash-once") == 0)
            crash_once = v;
        else if (strcmp(fl->name, "--crash-after-group-ready") == 0)
            after_group_ready = 1;
        else if (strcmp(fl->name, "--ignore-term") == 0)
            ignore_term = 1;
        else if (strcmp(fl->name, "--term-delay-ms") == 0)
            term_delay_ms = atoi(v);
        else if (strcmp(fl->name, "--hang-after-ms") == 0)
            hang_after_ms = atoi(v);
        else if (strcmp(fl->name, "--deposit-junk") == 0)
            deposit_junk = 1;
        else if (strcmp(fl->name, "--report-hung") == 0) {
            if (num_reports == MAX_REPORTS ||
                sscanf(v, "%d:%d", &report_id[num_reports], &report_of[num_reports]) != 2)
                return usage_error("bad --report-hung %s", v);
            num_reports++;
        }
    }
    if (run_dir == NULL)
        return usage_error("%s", "--run-dir is required");
    snprintf(events_path, sizeof(events_path), "%s/events.log", run_dir);
    if (role == R_WORKER) {
        if (worker_id == NULL)
            return usage_error("%s", "--worker-id is required");
        snprintf(name, sizeof(name), "worker-%s", worker_id);
    }
    if (delay_for != NULL) {
        const char *colon = strrchr(delay_for, ':');
        if (colon == NULL)
            return usage_error("bad --ready-delay-for %s", delay_for);
        if ((size_t)(colon - delay_for) == strlen(name) &&
            strncmp(delay_for, name, strlen(name)) == 0)
            ready_delay_ms = atoi(colon + 1);
    }
    if ((role & (R_KVPOOL | R_WORKER)) && model == NULL)
        return usage_error("%s", "--model is required");
    if (role == R_SCHEDULER && workers == NULL)
        return usage_error("%s", "--workers is required");
    if (role == R_ROUTER && listen == NULL)
        return usage_error("%s", "--listen is required");
    if (check) {
        event("check", args);
        return check_fails ? PAGODA_EXIT_CANNOT_RUN : 0;
    }

    if (ignore_term) {
        signal(SIGTERM, SIG_IGN);
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
    }
    /* Die with the supervisor, and do not outlive one that died before this line. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pid_t parent = getppid();
    char sup_path[4200];
    snprintf(sup_path, sizeof(sup_path), "%s/supervisor.pid", run_dir);
    FILE *sup_file = fopen(sup_path, "r");
    /* An engine of several runs in DIR/engine-I: its supervisor's pid is in DIR. */
    const char *last = strrchr(run_dir, '/');
    if (sup_file == NULL && last != NULL && strncmp(last, "/engine-", 8) == 0) {
        snprintf(sup_path, sizeof(sup_path), "%.*s/supervisor.pid", (int)(last - run_dir), run_dir);
        sup_file = fopen(sup_path, "r");
    }
    int sup_pid = -1;
    if (sup_file != NULL) {
        if (fscanf(sup_file, "%d", &sup_pid) != 1)
            sup_pid = -1;
        fclose(sup_file);
    }
    if (sup_pid != (int)parent)
        return usage_error("%s", "not started by the supervisor of this run directory");

    char pid_path[4200], pid_text[32];
    snprintf(pid_path, sizeof(pid_path), "%s/fake-%s.pid", run_dir, name);
    int fd = open(pid_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        int n = snprintf(pid_text, sizeof(pid_text), "%d\n", (int)getpid());
        if (write(fd, pid_text, (size_t)n) < 0)
            perror("supervisor_fake: pid file");
        close(fd);
    }
    if (never_ready_if != NULL && access(never_ready_if, F_OK) == 0)
        never_ready = 1;
    /* crash-once decides now, so that the decision belongs to this process alone. */
    int will_crash = crash_after_ms >= 0, will_hang = hang_after_ms >= 0;
    if ((will_crash || will_hang) && crash_once != NULL) {
        fd = open(crash_once, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        will_crash = will_crash && fd >= 0;
        will_hang = will_hang && fd >= 0;
        if (fd >= 0)
            close(fd);
    }
    struct wire_heartbeat *heartbeat = NULL;
    int hb_rc = wire_heartbeat_open(run_dir, name, &heartbeat);
    if (hb_rc != 0)
        fprintf(stderr, "supervisor_fake (%s): heartbeat: %s\n", name, pagoda_strerror(hb_rc));
    unsigned long long beat_at = 0;
    event("start", args);
    if (role == R_KVPOOL)
        keeper_round(deposit_junk);

    unsigned long long t0 = now_ms(), ready_at = 0;
    int ready = 0, reported = 0, group_ready = 0;
    for (;;) {
        if (getppid() != parent)
            _exit(0); /* the supervisor is gone */
        unsigned long long t = now_ms();
        if (heartbeat != NULL && t - beat_at >= wire_heartbeat_interval_ms(heartbeat)) {
            wire_heartbeat_send(heartbeat);
            beat_at = t;
        }
        if (will_hang && ready && t - ready_at >= (unsigned long long)hang_after_ms) {
            event("hang", NULL);
            while (getppid() == parent)
                sleep_ms(5);
            _exit(0);
        }
        if (term_received) {
            event("term", NULL);
            unsigned long long until = now_ms() + (unsigned long long)term_delay_ms;
            while (now_ms() < until && getppid() == parent)
                sleep_ms(5);
            event("exit", NULL);
            wire_heartbeat_close(heartbeat);
            return 0;
        }
        if (!never_ready && !ready && t - t0 >= (unsigned long long)ready_delay_ms) {
            /* The event first: the supervisor may start the next program as soon as it has
             * the message, and that one's start must come after this line. */
            event("ready", NULL);
            int rc = wire_control_ready(run_dir, sender);
            if (rc != 0)
                fprintf(stderr, "supervisor_fake (%s): ready: %s\n", name, pagoda_strerror(rc));
            ready = 1;
            ready_at = now_ms();
            continue;
        }
        if (will_crash && after_group_ready && ready && !group_ready) {
            char group_path[4200];
            snprintf(group_path, sizeof(group_path), "%s/ready", run_dir);
            if (access(group_path, F_OK) == 0) {
                group_ready = 1;
                ready_at = now_ms(); /* the crash's count starts now */
            }
            sleep_ms(5);
            continue;
        }
        if (will_crash && (ready || never_ready) &&
            now_ms() - (never_ready ? t0 : ready_at) >= (unsigned long long)crash_after_ms) {
            char detail[64];
            if (crash_signal > 0) {
                snprintf(detail, sizeof(detail), "signal %d", crash_signal);
                event("crash", detail);
                signal(crash_signal, SIG_DFL);
                kill(getpid(), crash_signal);
                sleep_ms(1000);
            }
            snprintf(detail, sizeof(detail), "code %d", crash_code);
            event("crash", detail);
            _exit(crash_code);
        }
        if (ready && !reported && num_reports > 0 && now_ms() - ready_at >= 100) {
            for (int i = 0; i < num_reports; i++) {
                Pagoda__Internal__Control ctl = PAGODA__INTERNAL__CONTROL__INIT;
                ctl.has_hung_worker_id = 1;
                ctl.hung_worker_id = (uint32_t)report_id[i];
                ctl.has_hung_worker_pid = 1;
                ctl.hung_worker_pid = read_pid(run_dir, report_of[i]);
                ctl.sender = (char *)sender;
                char detail[64];
                snprintf(detail, sizeof(detail), "%d %d", report_id[i], ctl.hung_worker_pid);
                event("hung-report", detail);
                int rc = wire_control_send(run_dir, &ctl);
                if (rc != 0)
                    fprintf(stderr, "supervisor_fake: hung report: %s\n", pagoda_strerror(rc));
            }
            reported = 1;
        }
        sleep_ms(5);
    }
}
