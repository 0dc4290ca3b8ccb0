/* Tests of deploy/: the restart policy by itself, and pagoda-supervisor driving stand-ins.
 *
 * Each supervisor test makes a temporary directory with bin/ (supervisor_fake linked as
 * pagoda-kvpool, -worker, -scheduler and -router) and runs the supervisor on run/ (which it
 * creates). The fakes append what they do to run/events.log (see supervisor_fake.c), which is
 * how a test sees start order, restarts and the drain; the supervisor's own stderr goes to
 * supervisor.out. Every wait is bounded, a test's teardown kills a supervisor still running
 * (the fakes exit when it goes) and removes the directory.
 *
 * Run one test by name: test_supervisor NAME. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/exit_status.h"
#include "deploy/restart_policy.h"
#include "tests/unit/proc_fds.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SUPERVISOR_PATH
#error "SUPERVISOR_PATH must name the pagoda-supervisor executable"
#endif
#ifndef SUPERVISOR_FAKE_PATH
#error "SUPERVISOR_FAKE_PATH must name the supervisor_fake executable"
#endif

#define URL "tcp://127.0.0.1:17450"
#define MAX_EVENTS 512

/* ---- the restart policy ------------------------------------------------------------------ */

static void test_policy_backoff_doubles_and_gives_up(void **state)
{
    (void)state;
    struct restart_policy p = restart_policy_default();
    struct restart_state s = {0};
    uint64_t delay = 0;
    const uint64_t expected[] = {100, 200, 400, 800};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(restart_policy_exit(&p, &s, 50, &delay), 0);
        assert_int_equal(delay, expected[i]);
    }
    /* The fifth exit in a row within 2 s of its start gives up. */
    assert_int_equal(restart_policy_exit(&p, &s, 1999, &delay), PAGODA_EEXHAUSTED);
}

static void test_policy_slow_exits_restart_forever_at_the_cap(void **state)
{
    (void)state;
    struct restart_policy p = restart_policy_default();
    struct restart_state s = {0};
    uint64_t delay = 0;
    const uint64_t expected[] = {100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000};
    for (int i = 0; i < 9; i++) {
        assert_int_equal(restart_policy_exit(&p, &s, 2000, &delay), 0);
        assert_int_equal(delay, expected[i]);
    }
    /* Four fast exits, one slow one, four fast ones: never five in a row. */
    s = (struct restart_state){0};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++)
            assert_int_equal(restart_policy_exit(&p, &s, 10, &delay), 0);
        assert_int_equal(restart_policy_exit(&p, &s, 2500, &delay), 0);
    }
}

static void test_policy_stable_run_resets_the_delay(void **state)
{
    (void)state;
    struct restart_policy p = restart_policy_default();
    struct restart_state s = {0};
    uint64_t delay = 0;
    for (int i = 0; i < 8; i++)
        assert_int_equal(restart_policy_exit(&p, &s, 5000, &delay), 0);
    assert_int_equal(delay, 5000);
    assert_int_equal(restart_policy_exit(&p, &s, 29999, &delay), 0);
    assert_int_equal(delay, 5000);
    assert_int_equal(restart_policy_exit(&p, &s, 30000, &delay), 0);
    assert_int_equal(delay, 100);
    assert_int_equal(restart_policy_exit(&p, &s, 30000, &delay), 0);
    assert_int_equal(delay, 100);
}

/* ---- the fixture ------------------------------------------------------------------------- */

struct fx {
    char root[64];
    char run[128];
    char bin[128];
    char out[128];
    pid_t sup;    /* the supervisor, 0 once reaped */
    int sup_exit; /* its exit status, or 128 + signal */
    unsigned long long sup_started_ms;
};

struct ev {
    unsigned long long ms;
    char what[16];
    char name[32];
    int pid;
    char rest[1024];
};

/* The events of the current test, loaded by load_events (one buffer: tests run one at a time). */
static struct ev events[MAX_EVENTS];

static unsigned long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000ull + (unsigned long long)ts.tv_nsec / 1000000ull;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    snprintf(f->root, sizeof(f->root), "/tmp/pagoda-sup-XXXXXX");
    if (mkdtemp(f->root) == NULL) {
        free(f);
        return -1;
    }
    snprintf(f->run, sizeof(f->run), "%s/run", f->root);
    snprintf(f->bin, sizeof(f->bin), "%s/bin", f->root);
    snprintf(f->out, sizeof(f->out), "%s/supervisor.out", f->root);
    if (mkdir(f->bin, 0755) != 0)
        return -1;
    const char *progs[] = {"kvpool", "worker", "scheduler", "router", "gateway"};
    for (int i = 0; i < 5; i++) {
        char link[256];
        snprintf(link, sizeof(link), "%s/pagoda-%s", f->bin, progs[i]);
        if (symlink(SUPERVISOR_FAKE_PATH, link) != 0)
            return -1;
    }
    *state = f;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (f->sup > 0) {
        kill(f->sup, SIGKILL);
        waitpid(f->sup, NULL, 0);
        sleep_ms(100); /* the fakes notice and exit */
    }
    nftw(f->root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

/* Starts a supervisor with the common flags and extra (NULL-terminated), its output in out.
 * Returns its pid. */
static pid_t spawn_sup(struct fx *f, const char *out, const char *const *extra)
{
    const char *argv[96];
    int n = 0;
    const char *common[] = {SUPERVISOR_PATH,
                            "--run-dir",
                            f->run,
                            "--bin-dir",
                            f->bin,
                            "--model",
                            "/nonexistent-model",
                            "--listen",
                            URL,
                            "--kv-blocks",
                            "64",
                            "--block-size",
                            "16",
                            "--ready-timeout-ms",
                            "5000",
                            "--stop-timeout-ms",
                            "3000",
                            NULL};
    for (int i = 0; common[i] != NULL; i++)
        argv[n++] = common[i];
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 95; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(SUPERVISOR_PATH, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Starts the fixture's supervisor with the common flags and extra (NULL-terminated). */
static void start_sup(struct fx *f, const char *const *extra)
{
    f->sup_started_ms = now_ms();
    f->sup = spawn_sup(f, f->out, extra);
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return NULL;
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    if (buf != NULL) {
        len = fread(buf, 1, cap - 1, fp);
        buf[len] = '\0';
    }
    fclose(fp);
    return buf;
}

/* Under the sanitizer build a leak or an error makes the supervisor exit 1 too, which a test
 * that expects a failed start could take for the failure it wants: look at the output. */
static void assert_no_sanitizer_report(const char *out)
{
    char *text = read_text(out);
    if (text != NULL && (strstr(text, "Sanitizer") || strstr(text, "runtime error"))) {
        print_error("%s\n", text);
        free(text);
        fail_msg("the supervisor's output has a sanitizer report");
    }
    free(text);
}

/* Waits up to timeout_ms for the supervisor to exit. Returns 1 when it has (its status in
 * f->sup_exit), 0 when it still runs. */
static int wait_sup(struct fx *f, int timeout_ms)
{
    unsigned long long deadline = now_ms() + (unsigned long long)timeout_ms;
    for (;;) {
        int status;
        pid_t r = waitpid(f->sup, &status, WNOHANG);
        if (r == f->sup) {
            f->sup = 0;
            f->sup_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            assert_no_sanitizer_report(f->out);
            return 1;
        }
        if (now_ms() >= deadline)
            return 0;
        sleep_ms(10);
    }
}

static int file_exists(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* Loads run/events.log into evs (at most MAX_EVENTS). Returns the count. */
static int load_events(const struct fx *f, struct ev *evs)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/events.log", f->run);
    char *text = read_text(path);
    if (text == NULL)
        return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line != NULL && n < MAX_EVENTS;
         line = strtok(NULL, "\n")) {
        struct ev *e = &evs[n];
        int off = 0;
        if (sscanf(line, "%llu %15s %31s %d %n", &e->ms, e->what, e->name, &e->pid, &off) < 4)
            continue;
        snprintf(e->rest, sizeof(e->rest), "%s", line + off);
        n++;
    }
    free(text);
    return n;
}

/* The index of the nth (from 0) event `what` of `name`, or -1. */
static int find_ev(const struct ev *evs, int n, const char *what, const char *name, int nth)
{
    for (int i = 0; i < n; i++)
        if (strcmp(evs[i].what, what) == 0 && strcmp(evs[i].name, name) == 0 && nth-- == 0)
            return i;
    return -1;
}

static int count_ev(const struct ev *evs, int n, const char *what, const char *name)
{
    int k = 0;
    while (find_ev(evs, n, what, name, k) >= 0)
        k++;
    return k;
}

/* Waits until `what` of `name` has happened at least `count` times. */
static int wait_ev(const struct fx *f, struct ev *evs, const char *what, const char *name,
                   int count, int timeout_ms)
{
    unsigned long long deadline = now_ms() + (unsigned long long)timeout_ms;
    for (;;) {
        int n = load_events(f, evs);
        if (count_ev(evs, n, what, name) >= count)
            return 1;
        if (now_ms() >= deadline)
            return 0;
        sleep_ms(20);
    }
}

static int wait_ready_file(const struct fx *f, int timeout_ms)
{
    unsigned long long deadline = now_ms() + (unsigned long long)timeout_ms;
    while (!file_exists(f->run, "ready")) {
        if (now_ms() >= deadline || waitpid(f->sup, NULL, WNOHANG) != 0)
            return 0;
        sleep_ms(20);
    }
    return 1;
}

/* Waits until the supervisor's output has needle (its log lines trail the files it writes). */
static int wait_output(const struct fx *f, const char *needle, int timeout_ms)
{
    unsigned long long deadline = now_ms() + (unsigned long long)timeout_ms;
    for (;;) {
        char *text = read_text(f->out);
        int found = text != NULL && strstr(text, needle) != NULL;
        free(text);
        if (found)
            return 1;
        if (now_ms() >= deadline)
            return 0;
        sleep_ms(20);
    }
}

static void assert_output_has(const struct fx *f, const char *needle)
{
    char *text = read_text(f->out);
    assert_non_null(text);
    if (strstr(text, needle) == NULL) {
        print_error("supervisor output lacks '%s':\n%s\n", needle, text);
        free(text);
        fail();
    }
    free(text);
}

/* Sends SIGTERM and expects a clean exit 0 with the pid and ready files gone. */
static void stop_sup(struct fx *f)
{
    assert_int_equal(kill(f->sup, SIGTERM), 0);
    assert_true(wait_sup(f, 10000));
    assert_int_equal(f->sup_exit, 0);
    assert_false(file_exists(f->run, "supervisor.pid"));
    assert_false(file_exists(f->run, "ready"));
}

/* ---- starting ---------------------------------------------------------------------------- */

static void test_start_order_and_arguments(void **state)
{
    struct fx *f = *state;
    /* Each fake takes 150 ms to be ready: a supervisor that did not wait would start the next
     * program before the previous one's ready line. */
    const char *extra[] = {"--workers",
                           "2",
                           "--allow-multi-worker",
                           "--kvpool-arg",
                           "--ready-delay-ms",
                           "--kvpool-arg",
                           "150",
                           "--worker-arg",
                           "--ready-delay-ms",
                           "--worker-arg",
                           "150",
                           "--scheduler-arg",
                           "--ready-delay-ms",
                           "--scheduler-arg",
                           "150",
                           "--router-arg",
                           "--ready-delay-ms",
                           "--router-arg",
                           "150",
                           "--http-listen",
                           "127.0.0.1:0",
                           NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));

    char path[256];
    snprintf(path, sizeof(path), "%s/ready", f->run);
    char *text = read_text(path);
    assert_non_null(text);
    assert_string_equal(text, URL "\n");
    free(text);
    snprintf(path, sizeof(path), "%s/supervisor.pid", f->run);
    text = read_text(path);
    assert_non_null(text);
    assert_int_equal(atoi(text), f->sup);
    free(text);

    struct ev *evs = events;
    int n = load_events(f, evs);
    const char *order[] = {"kvpool", "worker-0", "worker-1", "scheduler", "router", "gateway"};
    int prev_ready = -1;
    for (int i = 0; i < 6; i++) {
        int s = find_ev(evs, n, "start", order[i], 0);
        int r = find_ev(evs, n, "ready", order[i], 0);
        assert_true(s >= 0);
        assert_true(r > s);
        if (s <= prev_ready)
            fail_msg("%s started before %s was ready", order[i], order[i - 1]);
        prev_ready = r;
        assert_int_equal(count_ev(evs, n, "start", order[i]), 1);
    }
    /* What each program was told (the fakes refuse flags their program does not take). */
    assert_non_null(strstr(evs[find_ev(evs, n, "start", "kvpool", 0)].rest,
                           "--model /nonexistent-model --block-size 16 --kv-blocks 64"));
    assert_non_null(strstr(evs[find_ev(evs, n, "start", "worker-1", 0)].rest,
                           "--model /nonexistent-model --worker-id 1 --backend cpu"));
    assert_non_null(strstr(evs[find_ev(evs, n, "start", "scheduler", 0)].rest, "--workers 2"));
    assert_non_null(strstr(evs[find_ev(evs, n, "start", "router", 0)].rest, "--listen " URL));
    assert_non_null(
        strstr(evs[find_ev(evs, n, "start", "router", 0)].rest, "--model /nonexistent-model"));
    assert_non_null(strstr(evs[find_ev(evs, n, "start", "gateway", 0)].rest,
                           "--router " URL " --listen 127.0.0.1:0 --model-name nonexistent-model"));
    assert_non_null(strstr(evs[0].rest, "--run-dir /"));
    /* The router's check ran first, once, with the router's own arguments. */
    int check = find_ev(evs, n, "check", "router", 0);
    assert_true(check >= 0 && check < find_ev(evs, n, "start", "kvpool", 0));
    assert_int_equal(count_ev(evs, n, "check", "router"), 1);
    assert_string_equal(evs[check].rest, evs[find_ev(evs, n, "start", "router", 0)].rest);

    /* Each program's output goes to its own log. */
    snprintf(path, sizeof(path), "%s/worker-1.log", f->run);
    text = read_text(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "starting worker-1"));
    free(text);
    assert_true(wait_output(f, "clients connect to " URL, 5000));
    stop_sup(f);
}

/* A FIFO in place of a program's log, with no reader (opening it for writing would wait for one):
 * the supervisor does not block on it; it refuses the run directory at once, naming the file
 * (the run directory's files are regular files of ours, or nothing starts). */
static void test_log_fifo_does_not_block_the_loop(void **state)
{
    struct fx *f = *state;
    char path[256];
    assert_int_equal(mkdir(f->run, 0700), 0);
    snprintf(path, sizeof(path), "%s/worker-0.log", f->run);
    assert_int_equal(mkfifo(path, 0600), 0);
    start_sup(f, NULL);
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "worker-0.log");
    assert_output_has(f, "not a regular file");
    assert_false(file_exists(f->run, "events.log"));
}

static void test_never_ready_fails_the_start(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--ready-timeout-ms", "500", "--worker-arg", "--never-ready", NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 8000));
    unsigned long long took = now_ms() - f->sup_started_ms;
    assert_int_equal(f->sup_exit, 1);
    assert_true(took >= 500);
    assert_true(took < 5000);
    assert_output_has(f, "worker-0");
    assert_output_has(f, "did not become ready within 500 ms");

    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 0);
    assert_int_equal(count_ev(evs, n, "start", "router"), 0);
    /* What was started is stopped, the worker before the kvpool. */
    int worker_exit = find_ev(evs, n, "exit", "worker-0", 0);
    int kvpool_term = find_ev(evs, n, "term", "kvpool", 0);
    assert_true(worker_exit >= 0);
    assert_true(kvpool_term > worker_exit);
    assert_true(find_ev(evs, n, "exit", "kvpool", 0) > kvpool_term);
    assert_false(file_exists(f->run, "supervisor.pid"));
    assert_false(file_exists(f->run, "ready"));
}

static void test_exit_before_ready_fails_the_start(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--worker-arg",
                           "--never-ready",
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "100",
                           "--worker-arg",
                           "--crash-code",
                           "--worker-arg",
                           "3",
                           NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 8000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "worker-0");
    assert_output_has(f, "exited before it was ready: exit status 3");
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1); /* not restarted */
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 0);
    assert_true(find_ev(evs, n, "exit", "kvpool", 0) >= 0);
}

/* The router's check (pagoda-router --check) says it cannot run as configured (a broken tenants
 * file or tokenizer file): the start fails at once, before the kvpool, the workers and the
 * scheduler, which would load the model first, are started. */
static void test_router_check_fails_the_start(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--router-arg", "--check-fails", NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 8000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "the router cannot run as configured (its check");
    assert_output_has(f, "nothing was started");
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "check", "router"), 1);
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 0);
    assert_int_equal(count_ev(evs, n, "start", "router"), 0);
}

static void test_bad_command_lines(void **state)
{
    struct fx *f = *state;
    const char *no_model[] = {SUPERVISOR_PATH, "--run-dir", f->run, "--bin-dir", f->bin, NULL};
    const char *too_many[] = {"--workers", "65", NULL};
    const char *both_kv[] = {"--kv-bytes", "1000000", NULL};
    const char *unknown[] = {"--bogus", NULL};

    /* Usage errors: status 2, nothing started. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(f->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execv(SUPERVISOR_PATH, (char *const *)no_model);
        _exit(127);
    }
    f->sup = pid;
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 2);
    assert_output_has(f, "--model");

    const char *const *cases[] = {too_many, both_kv, unknown};
    const char *needles[] = {"--workers", "exclude each other", "--bogus"};
    for (int i = 0; i < 3; i++) {
        start_sup(f, cases[i]);
        assert_true(wait_sup(f, 5000));
        assert_int_equal(f->sup_exit, 2);
        assert_output_has(f, needles[i]);
    }

    /* A run directory whose ipc:// addresses would not fit: refused, and not created. */
    char long_dir[160];
    snprintf(long_dir, sizeof(long_dir), "%s/%090d", f->root, 0);
    const char *long_run[] = {SUPERVISOR_PATH, "--run-dir", long_dir, "--bin-dir",
                              f->bin,          "--model",   "m",      NULL};
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(f->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execv(SUPERVISOR_PATH, (char *const *)long_run);
        _exit(127);
    }
    f->sup = pid;
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "would not fit a Unix socket path");
    assert_int_equal(access(long_dir, F_OK), -1);

    /* A program missing from --bin-dir: status 1 before anything starts. */
    char link[256];
    snprintf(link, sizeof(link), "%s/pagoda-router", f->bin);
    assert_int_equal(unlink(link), 0);
    start_sup(f, NULL);
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "pagoda-router is not an executable file");
    assert_false(file_exists(f->run, "events.log"));
}

/* Several workers mean nothing yet (the scheduler drives one): refused before anything starts,
 * rather than by the scheduler once the workers run. */
static void test_workers_above_one_are_refused_at_once(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--workers", "2", NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 2);
    assert_output_has(f, "--workers 2: a group runs 1 worker for now");
    assert_output_has(f, "nothing was started");
    assert_false(file_exists(f->run, "events.log"));
    assert_false(file_exists(f->run, "supervisor.pid"));
}

/* ---- the run directory ------------------------------------------------------------------- */

/* Waits up to timeout_ms for pid (a child of this process) to exit. Returns its exit status,
 * 128 + its signal, or -1 when it still runs (it is then killed). */
static int wait_pid(pid_t pid, int timeout_ms)
{
    unsigned long long deadline = now_ms() + (unsigned long long)timeout_ms;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_ms() >= deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        sleep_ms(10);
    }
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void assert_file_is(const char *path, const char *want)
{
    char *text = read_text(path);
    assert_non_null(text);
    assert_string_equal(text, want);
    free(text);
}

/* A run directory prepared by another user could hold links to that user's choice of files:
 * refused, and nothing is started or written in it. */
static void test_run_dir_of_another_user_is_refused(void **state)
{
    struct fx *f = *state;
    assert_int_equal(mkdir(f->run, 0700), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(f->run, 65534, 65534), 0);
        start_sup(f, NULL);
    } else {
        /* Without root no directory can be given away: "/" is root's. */
        const char *extra[] = {"--run-dir", "/", NULL};
        start_sup(f, extra);
    }
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, geteuid() == 0 ? "belongs to uid 65534" : "belongs to uid 0");
    assert_output_has(f, "refusing it");
    assert_false(file_exists(f->run, "events.log"));
    assert_false(file_exists(f->run, "lock"));
    assert_false(file_exists(f->run, "supervisor.pid"));
}

static void test_run_dir_writable_by_others_is_refused(void **state)
{
    struct fx *f = *state;
    assert_int_equal(mkdir(f->run, 0700), 0);
    assert_int_equal(chmod(f->run, 0777), 0);
    start_sup(f, NULL);
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "is writable by others (mode 0777)");
    assert_false(file_exists(f->run, "events.log"));
    assert_false(file_exists(f->run, "lock"));

    /* A private run directory in a directory that others may write to without the sticky bit
     * (they could rename it away and put theirs in its place): refused too. */
    char open_dir[160], run[200];
    snprintf(open_dir, sizeof(open_dir), "%s/open", f->root);
    snprintf(run, sizeof(run), "%s/run", open_dir);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    assert_int_equal(mkdir(run, 0700), 0);
    const char *extra[] = {"--run-dir", run, NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 5000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "is writable by others without the sticky bit");
    assert_false(file_exists(run, "events.log"));
}

/* Files of the group that are symbolic links are not written through: refused at the start,
 * and a log replaced by a link while the group runs is not opened on the next restart. */
static void test_symlinks_in_the_run_dir_are_not_followed(void **state)
{
    struct fx *f = *state;
    char target[160], link[200];
    snprintf(target, sizeof(target), "%s/precious", f->root);
    write_text(target, "precious\n");
    assert_int_equal(mkdir(f->run, 0700), 0);

    const char *names[] = {"kvpool.log", "supervisor.pid.tmp", "ready.tmp", "lock"};
    for (int i = 0; i < 4; i++) {
        snprintf(link, sizeof(link), "%s/%s", f->run, names[i]);
        unlink(link); /* the lock file an earlier round left */
        assert_int_equal(symlink(target, link), 0);
        start_sup(f, NULL);
        assert_true(wait_sup(f, 5000));
        assert_int_equal(f->sup_exit, 1);
        assert_output_has(f, names[i]);
        assert_output_has(f, "is a symbolic link");
        assert_file_is(target, "precious\n");
        assert_false(file_exists(f->run, "events.log"));
        assert_int_equal(unlink(link), 0);
    }

    /* The same at a restart: worker-0's log becomes a link while the group runs. */
    start_sup(f, NULL);
    assert_true(wait_ready_file(f, 10000));
    snprintf(link, sizeof(link), "%s/worker-0.log", f->run);
    assert_int_equal(unlink(link), 0);
    assert_int_equal(symlink(target, link), 0);
    struct ev *evs = events;
    int n = load_events(f, evs);
    int worker = find_ev(evs, n, "start", "worker-0", 0);
    assert_true(worker >= 0);
    assert_int_equal(kill(evs[worker].pid, SIGKILL), 0);
    assert_true(wait_ev(f, evs, "ready", "worker-0", 2, 10000));
    assert_file_is(target, "precious\n");
    assert_output_has(f, "worker-0.log is a symbolic link");
    stop_sup(f);
}

/* Two supervisors on one run directory: the second exits at once with status 3, naming the
 * first, and the first's group keeps running untouched. */
static void test_second_supervisor_on_the_same_dir_is_refused(void **state)
{
    struct fx *f = *state;
    start_sup(f, NULL);
    assert_true(wait_ready_file(f, 10000));
    char out2[160];
    snprintf(out2, sizeof(out2), "%s/second.out", f->root);
    pid_t second = spawn_sup(f, out2, NULL);
    assert_int_equal(wait_pid(second, 5000), 3);
    char *text = read_text(out2);
    assert_non_null(text);
    char want[64];
    snprintf(want, sizeof(want), "already running (pid %d)", (int)f->sup);
    if (strstr(text, want) == NULL) {
        print_error("%s\n", text);
        free(text);
        fail_msg("the second supervisor's output lacks '%s'", want);
    }
    free(text);

    assert_int_equal(waitpid(f->sup, NULL, WNOHANG), 0); /* the first still runs */
    assert_true(file_exists(f->run, "ready"));
    assert_true(file_exists(f->run, "control.ipc"));
    char path[256];
    snprintf(path, sizeof(path), "%s/supervisor.pid", f->run);
    text = read_text(path);
    assert_non_null(text);
    assert_int_equal(atoi(text), f->sup);
    free(text);
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    stop_sup(f);
}

/* ---- restarts ---------------------------------------------------------------------------- */

static void test_crash_once_is_restarted(void **state)
{
    struct fx *f = *state;
    char marker[160];
    snprintf(marker, sizeof(marker), "%s/crashed", f->root);
    const char *extra[] = {"--worker-arg",
                           "--crash-once",
                           "--worker-arg",
                           marker,
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "200",
                           "--worker-arg",
                           "--crash-signal",
                           "--worker-arg",
                           "9",
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "ready", "worker-0", 2, 10000));
    assert_true(wait_ready_file(f, 10000));
    sleep_ms(300);
    assert_int_equal(waitpid(f->sup, NULL, WNOHANG), 0); /* still supervising */

    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 2);
    assert_int_equal(count_ev(evs, n, "crash", "worker-0"), 1);
    int first = find_ev(evs, n, "start", "worker-0", 0);
    int second = find_ev(evs, n, "start", "worker-0", 1);
    assert_int_not_equal(evs[first].pid, evs[second].pid);
    /* The back-off: at least 100 ms between the crash and the new start. */
    int crash = find_ev(evs, n, "crash", "worker-0", 0);
    assert_true(evs[second].ms >= evs[crash].ms + 100);
    /* Nobody else was restarted. */
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 1);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    assert_output_has(f, "killed by signal 9");
    assert_output_has(f, "restarting it in 100 ms");
    stop_sup(f);
}

/* A program restarted while the group runs that never gets ready (stuck in its start) is killed
 * after --ready-timeout-ms and started again, the rest of the group going on: before, nothing
 * replaced it (a worker sends no heartbeat before it is ready, and its scheduler's reports were
 * ignored), and the group answered healthy while it could not serve. */
static void stuck_start(struct fx *f, const char *heartbeat_ms, int starts)
{
    char marker[160];
    snprintf(marker, sizeof(marker), "%s/crashed", f->root);
    const char *extra[] = {"--ready-timeout-ms",
                           "800",
                           "--worker-arg",
                           "--crash-once",
                           "--worker-arg",
                           marker,
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "300",
                           "--worker-arg",
                           "--never-ready-if",
                           "--worker-arg",
                           marker,
                           heartbeat_ms != NULL ? "--heartbeat-ms" : NULL,
                           heartbeat_ms,
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ready_file(f, 10000));
    /* the first worker crashes 300 ms after it was ready; each restart stalls and is killed:
     * more kills than max_fast_exits, each within fast_exit_ms of its start, and the group goes
     * on (the supervisor's kills are not the program's crashes) */
    assert_true(wait_ev(f, evs, "start", "worker-0", starts, 20000));
    assert_int_equal(waitpid(f->sup, NULL, WNOHANG), 0); /* still supervising */
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "ready", "worker-0"), 1);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 1);
    int second = find_ev(evs, n, "start", "worker-0", 1);
    int third = find_ev(evs, n, "start", "worker-0", 2);
    assert_true(evs[third].ms >= evs[second].ms + 800);
    /* checked every 500 ms at most, whatever --heartbeat-ms (the kill, then the back-off) */
    assert_true(evs[third].ms < evs[second].ms + 800 + 2500);
    assert_output_has(f, "is not ready");
    assert_output_has(f, "after its restart (--ready-timeout-ms 800): stuck in its start");
    stop_sup(f);
}

static void test_restart_stuck_in_its_start_is_killed(void **state)
{
    stuck_start(*state, NULL, 7);
}

/* With heartbeats of 30 s: a stuck start is killed as soon after --ready-timeout-ms (it was
 * checked only every --heartbeat-ms, up to an hour later). */
static void test_restart_stuck_in_its_start_is_killed_with_slow_heartbeats(void **state)
{
    stuck_start(*state, "30000", 3);
}

/* The same with --heartbeat-ms 0 (no heartbeats watched): the check of starts runs all the same
 * (it ran in the heartbeats' timer, and not at all without them). */
static void test_restart_stuck_in_its_start_is_killed_without_heartbeats(void **state)
{
    stuck_start(*state, "0", 3);
}

static void test_restart_during_the_start_delays_ready(void **state)
{
    struct fx *f = *state;
    /* worker-0 crashes as soon as it is ready (after the 20 ms its ready message takes), while
     * the scheduler and the router start (50 ms each); its replacement comes 100 ms later and
     * takes 150 ms to be ready. The group is ready only once the replacement is. */
    char marker[160];
    snprintf(marker, sizeof(marker), "%s/crashed", f->root);
    const char *extra[] = {"--worker-arg",
                           "--crash-once",
                           "--worker-arg",
                           marker,
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "0",
                           "--worker-arg",
                           "--ready-delay-ms",
                           "--worker-arg",
                           "150",
                           "--scheduler-arg",
                           "--ready-delay-ms",
                           "--scheduler-arg",
                           "50",
                           "--router-arg",
                           "--ready-delay-ms",
                           "--router-arg",
                           "50",
                           NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    assert_true(wait_output(f, "the group is ready (", 5000));
    char *text = read_text(f->out);
    assert_non_null(text);
    const char *again = strstr(text, "worker-0 (pid");
    again = again ? strstr(again, "is ready again") : NULL;
    const char *group = strstr(text, "the group is ready (");
    if (again == NULL || group == NULL || group < again) {
        print_error("%s\n", text);
        free(text);
        fail_msg("the group was declared ready before the restarted worker-0 was");
    }
    free(text);
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 2);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    stop_sup(f);
}

static void test_ready_is_credited_to_the_process_that_sent_it(void **state)
{
    struct fx *f = *state;
    /* worker-0 crashes as soon as it is ready and its replacement is ready while worker-1
     * (600 ms to be ready) is still awaited. Both say "worker": the supervisor tells them apart
     * by the sending process and starts the scheduler only after worker-1. */
    char marker[160];
    snprintf(marker, sizeof(marker), "%s/crashed", f->root);
    const char *extra[] = {"--workers",
                           "2",
                           "--allow-multi-worker",
                           "--worker-arg",
                           "--crash-once",
                           "--worker-arg",
                           marker,
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "0",
                           "--worker-arg",
                           "--ready-delay-ms",
                           "--worker-arg",
                           "50",
                           "--worker-arg",
                           "--ready-delay-for",
                           "--worker-arg",
                           "worker-1:600",
                           NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    struct ev *evs = events;
    int n = load_events(f, evs);
    int again = find_ev(evs, n, "ready", "worker-0", 1);
    int w1 = find_ev(evs, n, "ready", "worker-1", 0);
    int sched = find_ev(evs, n, "start", "scheduler", 0);
    assert_true(again >= 0);
    assert_true(w1 > again); /* the case this test is about */
    if (sched < w1)
        fail_msg("the scheduler started before worker-1 was ready");
    stop_sup(f);
}

static void test_crash_loop_stops_the_group(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "50",
                           "--worker-arg",
                           "--crash-code",
                           "--worker-arg",
                           "7",
                           NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 12000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "worker-0 exited 5 times in a row");
    assert_output_has(f, "exit status 7");

    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 5);
    /* Starts are spaced by the doubling back-off. */
    const unsigned long long backoff[] = {100, 200, 400, 800};
    for (int i = 0; i < 4; i++) {
        const struct ev *a = &evs[find_ev(evs, n, "start", "worker-0", i)];
        const struct ev *b = &evs[find_ev(evs, n, "start", "worker-0", i + 1)];
        if (b->ms < a->ms + backoff[i])
            fail_msg("restart %d came %llu ms after the start before it, under the %llu ms "
                     "back-off",
                     i + 1, b->ms - a->ms, backoff[i]);
    }
    /* The rest of the group was drained. */
    assert_true(find_ev(evs, n, "exit", "router", 0) >= 0);
    assert_true(find_ev(evs, n, "exit", "scheduler", 0) >= 0);
    assert_true(find_ev(evs, n, "exit", "kvpool", 0) > find_ev(evs, n, "exit", "scheduler", 0));
    assert_false(file_exists(f->run, "supervisor.pid"));
    assert_false(file_exists(f->run, "ready"));
}

/* A worker that exits with PAGODA_EXIT_CANNOT_RUN while the group starts (a GPU worker
 * whose weights do not fit beside the pool) is not restarted: the group stops at once, saying
 * why. */
static void test_cannot_run_exit_stops_the_group(void **state)
{
    struct fx *f = *state;
    char code[16];
    snprintf(code, sizeof(code), "%d", PAGODA_EXIT_CANNOT_RUN);
    const char *extra[] = {"--worker-arg",
                           "--never-ready",
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "300",
                           "--worker-arg",
                           "--crash-code",
                           "--worker-arg",
                           code,
                           NULL};
    start_sup(f, extra);
    assert_true(wait_sup(f, 12000));
    assert_int_equal(f->sup_exit, 1);
    assert_output_has(f, "worker-0 (pid");
    assert_output_has(f, "cannot run as configured");
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1);
    assert_true(find_ev(evs, n, "exit", "kvpool", 0) > find_ev(evs, n, "exit", "scheduler", 0));
    assert_false(file_exists(f->run, "supervisor.pid"));
}

/* The same status from a worker of a group that already serves (a restarted GPU worker that
 * found its predecessor's memory not yet released) is restarted like any exit. */
static void test_cannot_run_exit_after_start_is_restarted(void **state)
{
    struct fx *f = *state;
    char code[16], marker[160];
    snprintf(code, sizeof(code), "%d", PAGODA_EXIT_CANNOT_RUN);
    snprintf(marker, sizeof(marker), "%s/crashed", f->root);
    const char *extra[] = {"--worker-arg",
                           "--crash-once",
                           "--worker-arg",
                           marker,
                           "--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "200",
                           "--worker-arg",
                           "--crash-code",
                           "--worker-arg",
                           code,
                           "--worker-arg",
                           "--crash-after-group-ready",
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "ready", "worker-0", 2, 10000));
    assert_int_equal(waitpid(f->sup, NULL, WNOHANG), 0); /* still supervising */
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 2);
}

/* Such exits, again and again once the group has served (a router whose tenants file was
 * broken since), are not a crash loop: the program is tried again without end while the rest of
 * the group goes on (five quick exits of another status stop the group). */
static void test_cannot_run_exits_after_start_do_not_stop_the_group(void **state)
{
    struct fx *f = *state;
    char code[16];
    snprintf(code, sizeof(code), "%d", PAGODA_EXIT_CANNOT_RUN);
    const char *extra[] = {"--worker-arg",
                           "--crash-after-ms",
                           "--worker-arg",
                           "150",
                           "--worker-arg",
                           "--crash-code",
                           "--worker-arg",
                           code,
                           "--worker-arg",
                           "--crash-after-group-ready",
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "start", "worker-0", 7, 20000));
    assert_int_equal(waitpid(f->sup, NULL, WNOHANG), 0); /* still supervising */
    assert_output_has(f, "cannot run as configured");
    assert_output_has(f, "the group goes on without it");
}

static void test_hung_report_kills_that_worker(void **state)
{
    struct fx *f = *state;
    /* First a report naming worker 1 with worker 0's pid (stale or wrong: nothing dies), then
     * the right one for worker 0. */
    const char *extra[] = {"--workers",
                           "2",
                           "--allow-multi-worker",
                           "--scheduler-arg",
                           "--report-hung",
                           "--scheduler-arg",
                           "1:0",
                           "--scheduler-arg",
                           "--report-hung",
                           "--scheduler-arg",
                           "0:0",
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "ready", "worker-0", 2, 10000));
    sleep_ms(300);
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "hung-report", "scheduler"), 2);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 2);
    assert_int_equal(count_ev(evs, n, "start", "worker-1"), 1);
    int first_pid = evs[find_ev(evs, n, "start", "worker-0", 0)].pid;
    int second_pid = evs[find_ev(evs, n, "start", "worker-0", 1)].pid;
    assert_int_not_equal(first_pid, second_pid);
    assert_int_equal(kill(first_pid, 0), -1);
    assert_int_equal(errno, ESRCH);
    /* It was killed: it wrote no term or exit line. */
    assert_int_equal(count_ev(evs, n, "term", "worker-0"), 0);
    assert_output_has(f, "hung: killing it with SIGKILL");
    assert_output_has(f, "which is not its current process");
    assert_output_has(f, "(killed as hung)");
    stop_sup(f);
}

/* --engines 2: each engine's kvpool, worker and scheduler run in run/engine-I, the router is
 * given both schedulers in order, and a hung report from engine 1's scheduler kills engine 1's
 * worker (each engine numbers its own workers): each engine's worker 0 is restarted once, by its
 * own scheduler's report, and nothing else is. */
static void test_engines_each_supervised(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {
        "--engines",       "2",   "--routing", "round-robin", "--scheduler-arg", "--report-hung",
        "--scheduler-arg", "0:0", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    char top[sizeof(f->run)];
    snprintf(top, sizeof(top), "%s", f->run);
    struct ev *evs = events;
    for (int e = 0; e < 2; e++) {
        assert_true(snprintf(f->run, sizeof(f->run), "%s/engine-%d", top, e) < (int)sizeof(f->run));
        assert_true(wait_ev(f, evs, "ready", "worker-0", 2, 10000));
        int n = load_events(f, evs);
        assert_int_equal(count_ev(evs, n, "hung-report", "scheduler"), 1);
        assert_int_equal(count_ev(evs, n, "start", "worker-0"), 2);
        assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
        assert_int_equal(count_ev(evs, n, "start", "scheduler"), 1);
        char dir_flag[200];
        snprintf(dir_flag, sizeof(dir_flag), "--run-dir %s", f->run);
        assert_non_null(strstr(evs[find_ev(evs, n, "start", "kvpool", 0)].rest, dir_flag));
    }
    snprintf(f->run, sizeof(f->run), "%s", top);
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    char want[PATH_MAX * 2 + 128];
    char real_top[PATH_MAX];
    assert_non_null(realpath(top, real_top));
    assert_true(snprintf(want, sizeof(want),
                         "--scheduler ipc://%s/engine-0/scheduler.ipc --scheduler "
                         "ipc://%s/engine-1/scheduler.ipc --routing round-robin",
                         real_top, real_top) < (int)sizeof(want));
    const char *router_args = evs[find_ev(evs, n, "start", "router", 0)].rest;
    if (strstr(router_args, want) == NULL)
        fail_msg("the router's arguments '%s' lack '%s'", router_args, want);
    assert_output_has(f, "reports engine-0/worker-0");
    assert_output_has(f, "reports engine-1/worker-0");
    assert_output_has(f, "restarting engine-1/worker-0");
    stop_sup(f);
}

/* ---- liveness ---------------------------------------------------------------------------- */

/* The pid a fake wrote in run/fake-NAME.pid, or -1. */
static int fake_pid(const struct fx *f, const char *name)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/fake-%s.pid", f->run, name);
    char *text = read_text(path);
    int pid = text != NULL ? atoi(text) : -1;
    free(text);
    return pid > 0 ? pid : -1;
}

/* The keeper (deploy/keeper.h): what a kvpool deposits on its keeper link (a memfd holding a
 * counter, in the fake) is held by the supervisor and offered to the next kvpool after a kill -9,
 * twice: the counter the third kvpool is offered (2) says the same memory went through both
 * restarts, the supervisor its only holder in between. A message too large, sent before the
 * deposit, is logged and ignored; a refusal lets go of what is held. The supervisor holds as many
 * descriptors after the restarts as before them; the stop lets go of the pool. */
static void test_kvpool_pool_is_kept_across_restarts(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--kvpool-arg", "--deposit-junk", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    assert_true(wait_output(f, "deposited its pool's 1 descriptor(s)", 5000));
    sleep_ms(500); /* every program's heartbeat pipe connected */
    int fds_before = proc_fds(f->sup);
    assert_true(fds_before > 0);
    struct ev *evs = events;
    for (int round = 1; round <= 2; round++) {
        int pid = fake_pid(f, "kvpool");
        assert_true(pid > 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_true(wait_ev(f, evs, "deposit", "kvpool", round + 1, 10000));
    }
    /* The last deposit taken (at ready): the supervisor holds what it held before. */
    assert_true(wait_ev(f, evs, "ready", "kvpool", 3, 10000));
    sleep_ms(500);
    assert_int_equal(proc_fds(f->sup), fds_before);
    int n = load_events(f, evs);
    const char *offers[] = {"none", "1", "2"}, *deposits[] = {"1", "2", "3"};
    for (int i = 0; i < 3; i++) {
        int offer = find_ev(evs, n, "offer", "kvpool", i);
        int deposit = find_ev(evs, n, "deposit", "kvpool", i);
        assert_true(offer >= 0 && deposit >= 0);
        assert_string_equal(evs[offer].rest, offers[i]);
        assert_string_equal(evs[deposit].rest, deposits[i]);
    }
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1);
    assert_output_has(f, "offering kvpool the pool its predecessor deposited (1 descriptor(s))");
    assert_output_has(f, "does not fit");
    assert_output_has(f, "kvpool refused the pool it was offered: letting go of it");
    stop_sup(f);
    assert_output_has(f, "letting go of kvpool's pool (1 descriptor(s))");
}

/* A program whose loop stops (SIGSTOP: no heartbeat, no answer to anything) is killed with
 * SIGKILL after --heartbeat-ms x --heartbeat-misses and restarted; the others, whose
 * heartbeats keep coming, are left alone. */
static void test_stopped_program_is_killed_and_restarted(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--heartbeat-ms", "100", "--heartbeat-misses", "5", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    int router = fake_pid(f, "router");
    assert_true(router > 0);
    assert_int_equal(kill(router, SIGSTOP), 0);

    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "ready", "router", 2, 10000));
    assert_true(wait_output(f, "sent no heartbeat for", 5000));
    assert_int_equal(kill(router, 0), -1);
    assert_int_equal(errno, ESRCH);
    assert_output_has(f, "sent no heartbeat for");
    assert_output_has(f, "(--heartbeat-ms 100 x --heartbeat-misses 5)");
    assert_output_has(f, "(killed as hung)");
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "router"), 2);
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1);
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 1);
    assert_int_not_equal(evs[find_ev(evs, n, "start", "router", 1)].pid, router);
    stop_sup(f);
}

/* The supervisor itself stopped for longer than the heartbeat limit (a frozen cgroup, SIGSTOP):
 * when it runs again its late liveness check must not take the heartbeats that queued meanwhile
 * for silence: no program is killed. And a stopped worker is left to the scheduler's step
 * watchdog (a worker's loop runs long steps), so heartbeats never kill it. */
static void test_stopped_supervisor_kills_nobody(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--heartbeat-ms", "100", "--heartbeat-misses", "5", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    assert_int_equal(kill(f->sup, SIGSTOP), 0);
    sleep_ms(1500);
    assert_int_equal(kill(f->sup, SIGCONT), 0);
    int worker = fake_pid(f, "worker-0");
    assert_true(worker > 0);
    assert_int_equal(kill(worker, SIGSTOP), 0);
    sleep_ms(1500);
    assert_int_equal(kill(worker, 0), 0); /* still there */
    assert_int_equal(kill(worker, SIGCONT), 0);
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1);
    assert_int_equal(count_ev(evs, n, "start", "scheduler"), 1);
    assert_output_has(f, "ms late (this supervisor was stopped?)");
    stop_sup(f);
    char *text = read_text(f->out);
    assert_non_null(text);
    assert_null(strstr(text, "sent no heartbeat for"));
    free(text);
}

/* The supervisor's own hiccups (its loop stopped 1.4 s at a time, as swapping or a starved CPU
 * would, with --heartbeat-ms 1000 --heartbeat-misses 2): the time it did not run is nobody's
 * silence, so the healthy programs live on, and a router that hangs meanwhile is killed all the
 * same. Before, a late tick restarted every count (each hiccup, and the hung router lived on), or
 * was late only past two heartbeat periods (and the healthy programs were killed). */
static void test_supervisor_hiccups_do_not_hide_a_hung_program(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--heartbeat-ms", "1000", "--heartbeat-misses", "2", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    int router = fake_pid(f, "router");
    assert_true(router > 0);
    assert_int_equal(kill(router, SIGSTOP), 0);
    int killed = 0;
    for (int i = 0; i < 10 && !killed; i++) {
        sleep_ms(700);
        assert_int_equal(kill(f->sup, SIGSTOP), 0);
        sleep_ms(1400);
        assert_int_equal(kill(f->sup, SIGCONT), 0);
        char *text = read_text(f->out);
        killed = text != NULL && strstr(text, "router (pid") != NULL &&
                 strstr(text, "sent no heartbeat for") != NULL;
        free(text);
    }
    if (!killed)
        kill(router, SIGCONT);
    assert_true(killed);
    assert_output_has(f, "is not counted as any program's silence");
    char *text = read_text(f->out);
    assert_non_null(text);
    int kills = 0;
    for (const char *p = text; (p = strstr(p, "sent no heartbeat for")) != NULL; p++)
        kills++;
    free(text);
    assert_int_equal(kills, 1); /* the hung router's alone */
    stop_sup(f);
}

/* The same for a program that is running but whose loop no longer turns (the fake stops its
 * loop, heartbeats included, and ignores SIGTERM). */
static void test_hung_loop_is_killed_and_restarted(void **state)
{
    struct fx *f = *state;
    char marker[160];
    snprintf(marker, sizeof(marker), "%s/hung", f->root);
    const char *extra[] = {"--heartbeat-ms",
                           "100",
                           "--heartbeat-misses",
                           "5",
                           "--scheduler-arg",
                           "--hang-after-ms",
                           "--scheduler-arg",
                           "200",
                           "--scheduler-arg",
                           "--crash-once",
                           "--scheduler-arg",
                           marker,
                           NULL};
    start_sup(f, extra);
    struct ev *evs = events;
    assert_true(wait_ev(f, evs, "ready", "scheduler", 2, 10000));
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "hang", "scheduler"), 1);
    int hung = evs[find_ev(evs, n, "hang", "scheduler", 0)].pid;
    assert_true(wait_output(f, "sent no heartbeat for", 5000));
    assert_output_has(f, "scheduler (pid");
    assert_int_equal(kill(hung, 0), -1);
    assert_int_equal(count_ev(evs, n, "start", "kvpool"), 1);
    stop_sup(f);
}

/* --heartbeat-ms 0: no liveness check; a stopped program is left as it is. */
static void test_heartbeat_off_leaves_a_stopped_program(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--heartbeat-ms", "0", "--heartbeat-misses", "1", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    int router = fake_pid(f, "router");
    assert_true(router > 0);
    assert_int_equal(kill(router, SIGSTOP), 0);
    sleep_ms(1000);
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    assert_int_equal(kill(router, 0), 0);
    kill(router, SIGCONT);
    stop_sup(f);
}

/* ---- stopping ---------------------------------------------------------------------------- */

static void test_sigterm_drains_in_order(void **state)
{
    struct fx *f = *state;
    /* The router takes 300 ms to drain; nothing else may be stopped before it has exited. */
    const char *extra[] = {
        "--workers", "2", "--allow-multi-worker", "--router-arg", "--term-delay-ms", "--router-arg",
        "300",       NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    stop_sup(f);
    assert_false(file_exists(f->run, "control.ipc"));

    struct ev *evs = events;
    int n = load_events(f, evs);
    int router_term = find_ev(evs, n, "term", "router", 0);
    int router_exit = find_ev(evs, n, "exit", "router", 0);
    int sched_term = find_ev(evs, n, "term", "scheduler", 0);
    int sched_exit = find_ev(evs, n, "exit", "scheduler", 0);
    int kv_term = find_ev(evs, n, "term", "kvpool", 0);
    int kv_exit = find_ev(evs, n, "exit", "kvpool", 0);
    assert_true(router_term >= 0);
    assert_true(evs[router_exit].ms >= evs[router_term].ms + 300);
    assert_true(sched_term > router_exit);
    assert_true(sched_exit > sched_term);
    const char *workers[] = {"worker-0", "worker-1"};
    for (int i = 0; i < 2; i++) {
        int t = find_ev(evs, n, "term", workers[i], 0);
        int e = find_ev(evs, n, "exit", workers[i], 0);
        assert_true(t > sched_exit);
        assert_true(e > t);
        assert_true(kv_term > e);
    }
    assert_true(kv_exit > kv_term);
    /* Nothing was restarted while stopping. */
    assert_int_equal(count_ev(evs, n, "start", "router"), 1);
    assert_int_equal(count_ev(evs, n, "start", "worker-0"), 1);
}

static void test_stuck_program_is_killed_after_the_stop_timeout(void **state)
{
    struct fx *f = *state;
    const char *extra[] = {"--stop-timeout-ms", "300", "--router-arg", "--ignore-term", NULL};
    start_sup(f, extra);
    assert_true(wait_ready_file(f, 10000));
    unsigned long long t0 = now_ms();
    stop_sup(f);
    /* SIGKILL after 300 ms, not the supervisor's last resort of abandoning it after 5 s. */
    unsigned long long took = now_ms() - t0;
    assert_true(took >= 300);
    assert_true(took < 4000);
    struct ev *evs = events;
    int n = load_events(f, evs);
    assert_int_equal(count_ev(evs, n, "exit", "router"), 0);
    assert_true(find_ev(evs, n, "exit", "scheduler", 0) >= 0);
    assert_true(find_ev(evs, n, "exit", "kvpool", 0) >= 0);
    assert_output_has(f, "router");
    assert_output_has(f, "did not stop within 300 ms: SIGKILL");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_backoff_doubles_and_gives_up),
        cmocka_unit_test(test_policy_slow_exits_restart_forever_at_the_cap),
        cmocka_unit_test(test_policy_stable_run_resets_the_delay),
        cmocka_unit_test_setup_teardown(test_start_order_and_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_never_ready_fails_the_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exit_before_ready_fails_the_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_router_check_fails_the_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_command_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_above_one_are_refused_at_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_run_dir_of_another_user_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_dir_writable_by_others_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_symlinks_in_the_run_dir_are_not_followed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_second_supervisor_on_the_same_dir_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_crash_once_is_restarted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_stuck_in_its_start_is_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_restart_stuck_in_its_start_is_killed_with_slow_heartbeats, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_restart_stuck_in_its_start_is_killed_without_heartbeats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_during_the_start_delays_ready, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ready_is_credited_to_the_process_that_sent_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_crash_loop_stops_the_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cannot_run_exit_stops_the_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cannot_run_exits_after_start_do_not_stop_the_group,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_cannot_run_exit_after_start_is_restarted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hung_report_kills_that_worker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engines_each_supervised, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_fifo_does_not_block_the_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_program_is_killed_and_restarted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_hung_loop_is_killed_and_restarted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_supervisor_kills_nobody, setup, teardown),
        cmocka_unit_test_setup_teardown(test_supervisor_hiccups_do_not_hide_a_hung_program, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_heartbeat_off_leaves_a_stopped_program, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_kvpool_pool_is_kept_across_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_drains_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stuck_program_is_killed_after_the_stop_timeout, setup,
                                        teardown),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
