/* pagoda-supervisor's setting up (supervisor_setup.c): what is made before the loop starts. The
 * run directory's files: created 0700, refused when someone else could change it, locked for
 * the supervisor's life, every file written without following a link (supervisor.c's file
 * comment says why). The group's plan: each engine's directory and links' addresses, and each
 * program's name and command line, in start order. The running group is supervisor.c. */
#include "common/error.h"
#include "common/log.h"
#include "deploy/supervisor_impl.h"
#include "wire/address.h"
#include "wire/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- files ------------------------------------------------------------------------------- */

/* mkdir -p, with mode 0700 for the directories it creates. */
static int make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return pagoda_error_set(PAGODA_ERANGE, "path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return pagoda_error_set(pagoda_from_errno(errno), "cannot create %s: %s", buf,
                                    strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return pagoda_error_set(PAGODA_EIO, "%s is not a directory", path);
    return 0;
}

/* Opens a file of the run directory for writing (flags: O_CREAT, O_APPEND, O_TRUNC, O_EXCL)
 * without following a symbolic link and without blocking on a FIFO, and checks that it is a
 * regular file. Returns the descriptor (O_CLOEXEC) or a PAGODA_E* code naming path. */
int sup_open_run_file(const char *path, int flags)
{
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | flags, 0644);
    if (fd < 0) {
        int err = errno;
        if (err == ELOOP)
            return pagoda_error_set(
                PAGODA_EPERM, "%s is a symbolic link: pagoda does not write through one", path);
        return pagoda_error_set(pagoda_from_errno(err), "cannot open %s: %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return pagoda_error_set(PAGODA_EPERM, "%s is not a regular file", path);
    }
    /* Regular files ignore O_NONBLOCK; clear it anyway, as children inherit log descriptors. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* Writes text to path through a temporary file and a rename, so that a reader sees the whole
 * file or none. The temporary file is created anew (O_EXCL: never through a link); the rename
 * replaces path itself, whatever it was. */
int sup_write_file_atomic(const char *path, const char *text)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return pagoda_error_set(PAGODA_ERANGE, "path too long: %s", path);
    if (unlink(tmp) != 0 && errno != ENOENT)
        return pagoda_error_set(pagoda_from_errno(errno), "cannot remove %s: %s", tmp,
                                strerror(errno));
    int fd = sup_open_run_file(tmp, O_CREAT | O_EXCL);
    if (fd < 0)
        return fd;
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int err = n < 0 ? errno : 0;
    if (close(fd) != 0 && err == 0)
        err = errno;
    if (err == 0 && (size_t)n != len)
        err = EIO;
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
    if (err != 0) {
        unlink(tmp);
        return pagoda_error_set(pagoda_from_errno(err), "cannot write %s: %s", path, strerror(err));
    }
    return 0;
}

void sup_remove_file(const char *path)
{
    if (unlink(path) != 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", path, strerror(errno));
}

/* Refuses a run directory that someone else could change under the group: dir (an absolute
 * path without links) must be a directory of this user that nobody else may write to, and every
 * directory above it must belong to root or to this user and, when others may write to it,
 * have the sticky bit (as /tmp has: nobody else can rename or remove what is ours in it). */
static int check_run_dir(const char *dir)
{
    uid_t me = geteuid();
    struct stat st;
    if (lstat(dir, &st) != 0)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return pagoda_error_set(PAGODA_EINVAL, "%s is not a directory", dir);
    if (st.st_uid != me)
        return pagoda_error_set(PAGODA_EPERM,
                                "run directory %s belongs to uid %u, not to this user (uid %u): "
                                "refusing it, since its owner could have prepared it",
                                dir, (unsigned)st.st_uid, (unsigned)me);
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return pagoda_error_set(PAGODA_EPERM,
                                "run directory %s is writable by others (mode %04o): refusing "
                                "it (chmod go-w it, or choose another)",
                                dir, (unsigned)(st.st_mode & 07777));
    char up[PATH_MAX];
    snprintf(up, sizeof(up), "%s", dir);
    for (;;) {
        char *slash = strrchr(up, '/');
        if (slash == NULL)
            break;
        if (slash == up)
            slash[1] = '\0'; /* "/" */
        else
            *slash = '\0';
        if (lstat(up, &st) != 0)
            return pagoda_error_set(pagoda_from_errno(errno), "%s: %s", up, strerror(errno));
        if (st.st_uid != 0 && st.st_uid != me)
            return pagoda_error_set(PAGODA_EPERM,
                                    "%s, above run directory %s, belongs to uid %u: refusing "
                                    "a run directory that another user can replace",
                                    up, dir, (unsigned)st.st_uid);
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
            return pagoda_error_set(PAGODA_EPERM,
                                    "%s, above run directory %s, is writable by others without "
                                    "the sticky bit (mode %04o): refusing a run directory that "
                                    "another user can replace",
                                    up, dir, (unsigned)(st.st_mode & 07777));
        if (strcmp(up, "/") == 0)
            break;
    }
    return 0;
}

/* Takes DIR/lock for the supervisor's life (the descriptor stays open, O_CLOEXEC so that no
 * child holds it) and writes this pid in it. PAGODA_EBUSY, naming the holder's pid, when
 * another supervisor has it. */
static int lock_run_dir(struct supervisor *sup)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/lock", sup->run_dir) >= (int)sizeof(path))
        return pagoda_error_set(PAGODA_ERANGE, "path too long: %s/lock", sup->run_dir);
    int fd = sup_open_run_file(path, O_CREAT);
    if (fd < 0)
        return fd;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char text[32] = "";
        int other = -1;
        int rfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (rfd >= 0) {
            ssize_t n = read(rfd, text, sizeof(text) - 1);
            text[n > 0 ? n : 0] = '\0';
            close(rfd);
            other = atoi(text);
        }
        close(fd);
        if (err == EWOULDBLOCK)
            return pagoda_error_set(PAGODA_EBUSY,
                                    "a pagoda-supervisor is already running (pid %d) in %s; "
                                    "this one starts nothing",
                                    other, sup->run_dir);
        return pagoda_error_set(pagoda_from_errno(err), "cannot lock %s: %s", path, strerror(err));
    }
    char text[32];
    int len = snprintf(text, sizeof(text), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, text, (size_t)len) != len)
        log_warn("cannot write the pid to %s: %s", path, strerror(errno));
    sup->lock_fd = fd;
    return 0;
}

/* Refuses to start when a file the group writes in DIR is there as something else than a
 * regular file (a symbolic link, above all: a write through it would land elsewhere). */
static int check_run_files(struct supervisor *sup)
{
    char names[SUP_MAX_CHILDREN + 8][64];
    int n = 0;
    const char *fixed[] = {
        "lock",      "supervisor.pid", "supervisor.pid.tmp", "ready",
        "ready.tmp", "supervisor.log", "router-pins.json",   "router-pins.json.tmp"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        snprintf(names[n++], sizeof(names[0]), "%s", fixed[i]);
    for (int i = 0; i < sup->num_children; i++)
        snprintf(names[n++], sizeof(names[0]), "%s.log", sup->children[i].name);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof(path), "%s/%s", sup->run_dir, names[i]) >= (int)sizeof(path))
            return pagoda_error_set(PAGODA_ERANGE, "path too long: %s/%s", sup->run_dir, names[i]);
        if (lstat(path, &st) != 0)
            continue;
        if (S_ISLNK(st.st_mode))
            return pagoda_error_set(PAGODA_EPERM,
                                    "%s is a symbolic link: pagoda does not write through one "
                                    "(remove it)",
                                    path);
        if (!S_ISREG(st.st_mode))
            return pagoda_error_set(PAGODA_EPERM, "%s is not a regular file (remove it)", path);
    }
    return 0;
}

/* ---- the children's command lines -------------------------------------------------------- */

/* Adds "flag ADDRESS" to c->argv at n for c's engine's link l, when that link's address was
 * configured (the programs' defaults are the run directory's ipc:// paths): the address the
 * link listens on, or with dial the one its peers dial. Returns the new n. */
static int add_link_flag(struct supervisor *sup, struct child *c, int n, enum link l,
                         const char *flag, int dial)
{
    if (sup->opts.link_listen[l] == NULL || c->engine < 0)
        return n;
    c->argv[n++] = (char *)flag;
    c->argv[n++] = dial ? sup->dial_addr[c->engine][l] : sup->listen_addr[c->engine][l];
    return n;
}

/* Fills c->argv: the program, the flags every program takes, its role's flags, the extras. */
static void child_build_argv(struct supervisor *sup, struct child *c)
{
    const struct sup_opts *o = &sup->opts;
    int n = 0;
    c->argv[n++] = sup->program[c->role];
    c->argv[n++] = "--run-dir";
    c->argv[n++] = c->engine >= 0 ? sup->engine_dir[c->engine] : sup->run_dir;
    c->argv[n++] = "--log-level";
    c->argv[n++] = (char *)o->log_level;
    switch (c->role) {
    case ROLE_KVPOOL:
        c->argv[n++] = "--model";
        c->argv[n++] = (char *)o->model;
        if (o->block_size != NULL) {
            c->argv[n++] = "--block-size";
            c->argv[n++] = (char *)o->block_size;
        }
        if (o->kv_blocks != NULL) {
            c->argv[n++] = "--kv-blocks";
            c->argv[n++] = (char *)o->kv_blocks;
        } else if (o->kv_bytes != NULL) {
            c->argv[n++] = "--kv-bytes";
            c->argv[n++] = (char *)o->kv_bytes;
        }
        /* The CUDA backend's pool is on the GPU; cpu and null workers use the shared one. */
        if (strcmp(o->backend, "cuda") == 0) {
            c->argv[n++] = "--backend";
            c->argv[n++] = "cuda";
        }
        if (c->tp_rank >= 0) {
            c->argv[n++] = "--tp-rank";
            c->argv[n++] = c->tp_rank_text;
            c->argv[n++] = "--tp-size";
            c->argv[n++] = sup->tp_size_text;
            if (o->num_devices > 0) {
                c->argv[n++] = "--device";
                c->argv[n++] = (char *)o->devices[c->tp_rank];
            }
        }
        /* Ranks above 0 serve their own pool on DIR/kvpool-rR.ipc (local to the ranks). */
        if (c->tp_rank <= 0)
            n = add_link_flag(sup, c, n, LINK_KVPOOL, "--listen", 0);
        break;
    case ROLE_WORKER:
        c->argv[n++] = "--model";
        c->argv[n++] = (char *)o->model;
        c->argv[n++] = "--worker-id";
        c->argv[n++] = c->worker_id_text;
        c->argv[n++] = "--backend";
        c->argv[n++] = (char *)o->backend;
        if (c->tp_rank >= 0) {
            c->argv[n++] = "--tp-rank";
            c->argv[n++] = c->tp_rank_text;
            c->argv[n++] = "--tp-size";
            c->argv[n++] = sup->tp_size_text;
            c->argv[n++] = "--tp-group";
            c->argv[n++] = c->tp_group;
        }
        if (c->tp_rank <= 0) /* ranks above 0 find their kvpool at DIR/kvpool-rR.ipc */
            n = add_link_flag(sup, c, n, LINK_KVPOOL, "--kvpool", 1);
        n = add_link_flag(sup, c, n, LINK_WORKER, "--scheduler", 1);
        break;
    case ROLE_SCHEDULER:
        c->argv[n++] = "--workers";
        c->argv[n++] = sup->workers_text;
        n = add_link_flag(sup, c, n, LINK_KVPOOL, "--kvpool", 1);
        n = add_link_flag(sup, c, n, LINK_SCHEDULER, "--listen", 0);
        n = add_link_flag(sup, c, n, LINK_WORKER, "--worker-listen", 0);
        break;
    case ROLE_ROUTER:
        c->argv[n++] = "--listen";
        c->argv[n++] = (char *)o->listen;
        c->argv[n++] = "--model"; /* its tokenizer, when it has one */
        c->argv[n++] = (char *)o->model;
        /* Its engines, in order. One engine on the run directory's default address keeps the
         * router's own default (the command line of a one-engine group is as it always was). */
        if (o->role == SUP_ROLE_ROUTER) {
            for (int i = 0; i < o->num_schedulers; i++) {
                c->argv[n++] = "--scheduler";
                c->argv[n++] = (char *)o->schedulers[i];
            }
        } else if (o->engines > 1 || o->link_listen[LINK_SCHEDULER] != NULL) {
            for (int e = 0; e < o->engines; e++) {
                c->argv[n++] = "--scheduler";
                c->argv[n++] = sup->dial_addr[e][LINK_SCHEDULER];
            }
        }
        if (o->routing != NULL) {
            c->argv[n++] = "--routing";
            c->argv[n++] = (char *)o->routing;
        }
        break;
    case ROLE_GATEWAY:
        c->argv[n++] = "--router";
        c->argv[n++] = sup->listen_dial;
        c->argv[n++] = "--listen";
        c->argv[n++] = (char *)o->http_listen;
        c->argv[n++] = "--model-name"; /* the model folder's name; --gateway-arg overrides */
        c->argv[n++] = (char *)sup->model_name;
        break;
    default:
        break;
    }
    for (int i = 0; i < o->num_extra[c->role]; i++)
        c->argv[n++] = (char *)o->extra[c->role][i];
    c->argv[n] = NULL;
}

/* ---- setting up -------------------------------------------------------------------------- */

/* Appends a child of role to the start order: of engine (-1 for the router and the gateway),
 * worker_id (-1 unless a worker), tp_rank (-1 unless a rank of a tensor-parallel engine's
 * kvpool or worker). sup_parse_opts bounded their number by SUP_MAX_CHILDREN. */
static void add_child(struct supervisor *sup, enum role role, int engine, int worker_id,
                      int tp_rank)
{
    struct child *c = &sup->children[sup->num_children++];
    c->sup = sup;
    c->role = role;
    c->engine = engine;
    c->worker_id = worker_id;
    c->tp_rank = tp_rank;
    char base[32];
    if (role == ROLE_WORKER) {
        snprintf(c->worker_id_text, sizeof(c->worker_id_text), "%d", worker_id);
        snprintf(base, sizeof(base), "worker-%d", worker_id);
    } else {
        snprintf(base, sizeof(base), "%s", role_names[role]);
    }
    if (tp_rank >= 0) {
        snprintf(c->tp_rank_text, sizeof(c->tp_rank_text), "%d", tp_rank);
        if (tp_rank > 0) {
            size_t len = strlen(base);
            snprintf(base + len, sizeof(base) - len, "-r%d", tp_rank);
        }
        /* DIR/tp-group: the engine's directory is bounded (SUP_MAX_RUN_DIR) well below this. */
        size_t dl = strlen(sup->engine_dir[engine]);
        if (role == ROLE_WORKER && dl + sizeof(SUP_TP_GROUP_FILE) + 1 < sizeof(c->tp_group)) {
            memcpy(c->tp_group, sup->engine_dir[engine], dl);
            c->tp_group[dl] = '/';
            memcpy(c->tp_group + dl + 1, SUP_TP_GROUP_FILE, sizeof(SUP_TP_GROUP_FILE));
        }
    }
    if (engine >= 0 && sup->opts.engines > 1)
        snprintf(c->name, sizeof(c->name), "engine-%d/%s", engine, base);
    else
        snprintf(c->name, sizeof(c->name), "%s", base);
    child_build_argv(sup, c);
    keeper_init(&c->keeper, c->name);
}

/* Engine e's run directory (DIR itself when it is the only one; DIR/engine-E, created and
 * checked like DIR, otherwise) and its links' addresses: the configured ones, PORT+E with
 * several engines, or the run directory's ipc:// paths. */
static int prepare_engine(struct supervisor *sup, int e)
{
    const struct sup_opts *o = &sup->opts;
    char *dir = sup->engine_dir[e];
    if (o->engines == 1) {
        snprintf(dir, PATH_MAX, "%s", sup->run_dir);
    } else {
        if (snprintf(dir, PATH_MAX, "%s/engine-%d", sup->run_dir, e) >= PATH_MAX)
            return pagoda_error_set(PAGODA_ERANGE, "path too long: %s/engine-%d", sup->run_dir, e);
        int rc = make_dirs(dir);
        if (rc != 0 || (rc = check_run_dir(dir)) != 0)
            return rc;
    }
    static const char *const ipc_names[LINK_COUNT] = {"kvpool.ipc", "worker-0.ipc",
                                                      "scheduler.ipc"};
    for (int l = 0; l < LINK_COUNT; l++) {
        char *listen = sup->listen_addr[e][l];
        const char *given = o->link_listen[l];
        int rc = 0;
        if (given == NULL)
            rc = wire_ipc_url(listen, SUP_MAX_URL_BYTES, dir, ipc_names[l]);
        else if (o->engines == 1)
            snprintf(listen, SUP_MAX_URL_BYTES, "%s", given); /* checked: WIRE_ADDRESS_MAX */
        else
            rc = wire_address_offset_port(listen, SUP_MAX_URL_BYTES, given, e);
        if (rc != 0)
            return rc;
        if ((rc = wire_address_dial_form(sup->dial_addr[e][l], SUP_MAX_URL_BYTES, listen)) != 0)
            return rc;
    }
    return 0;
}

/* An ipc:// address to listen at must name a socket in a directory that is there (the run
 * directory exists by now): checked before anything starts, where the program that listens
 * found it after the engines had started, with NNG's "Entry not found". */
static int check_ipc_dir(const char *run_dir, const char *flag, const char *address)
{
    if (address == NULL || strncmp(address, "ipc://", 6) != 0)
        return 0;
    size_t n = strlen(run_dir);
    if (strncmp(address + 6, run_dir, n) == 0 && address[6 + n] == '/')
        return 0; /* in the run directory: made by the supervisor (an engine's directory, later) */
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", address + 6);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    int failed = stat(dir, &st) != 0, missing = failed && errno == ENOENT;
    if (failed || !S_ISDIR(st.st_mode))
        return pagoda_error_set(PAGODA_EINVAL, "%s %s: %s is not a directory%s", flag, address, dir,
                                missing ? " (it does not exist)" : "");
    return 0;
}

/* Resolves the run directory and the programs and prepares each child. */
int sup_prepare(struct supervisor *sup)
{
    const struct sup_opts *o = &sup->opts;
    /* Refuse a path that is too long before creating it, when its length is plain to see (no
     * "." or ".." in it); realpath's answer is checked again below in any case. */
    char cwd[PATH_MAX] = "";
    if (o->run_dir[0] != '/' && getcwd(cwd, sizeof(cwd)) == NULL)
        cwd[0] = '\0';
    size_t plain_len = strlen(o->run_dir) + (cwd[0] ? strlen(cwd) + 1 : 0);
    if (plain_len > SUP_MAX_RUN_DIR && strstr(o->run_dir, "/.") == NULL && o->run_dir[0] != '.')
        return pagoda_error_set(PAGODA_ERANGE,
                                "run directory %s is longer than %d bytes: its ipc:// "
                                "addresses would not fit a Unix socket path",
                                o->run_dir, SUP_MAX_RUN_DIR);
    int rc = make_dirs(o->run_dir);
    if (rc != 0)
        return rc;
    if (realpath(o->run_dir, sup->run_dir) == NULL)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: %s", o->run_dir, strerror(errno));
    if (strlen(sup->run_dir) > SUP_MAX_RUN_DIR)
        return pagoda_error_set(PAGODA_ERANGE,
                                "run directory %s is longer than %d bytes: its ipc:// "
                                "addresses would not fit a Unix socket path",
                                sup->run_dir, SUP_MAX_RUN_DIR);
    /* Nothing in DIR is touched before it is known to be ours and this supervisor its only
     * one. */
    if ((rc = check_run_dir(sup->run_dir)) != 0 || (rc = lock_run_dir(sup)) != 0)
        return rc;
    snprintf(sup->pid_path, sizeof(sup->pid_path), "%s/supervisor.pid", sup->run_dir);
    snprintf(sup->ready_path, sizeof(sup->ready_path), "%s/ready", sup->run_dir);
    if ((rc = check_ipc_dir(sup->run_dir, "--listen", o->listen)) != 0)
        return rc;
    for (int l = 0; l < LINK_COUNT; l++)
        if ((rc = check_ipc_dir(sup->run_dir, sup_link_flags[l], o->link_listen[l])) != 0)
            return rc;

    char bin_dir[PATH_MAX];
    if (realpath(o->bin_dir, bin_dir) == NULL)
        return pagoda_error_set(pagoda_from_errno(errno), "--bin-dir %s: %s", o->bin_dir,
                                strerror(errno));
    for (int r = 0; r < ROLE_COUNT; r++) {
        if (r == ROLE_GATEWAY && o->http_listen == NULL)
            continue; /* not started: need not be there */
        if ((o->role == SUP_ROLE_ENGINE && (r == ROLE_ROUTER || r == ROLE_GATEWAY)) ||
            (o->role == SUP_ROLE_ROUTER && r != ROLE_ROUTER && r != ROLE_GATEWAY))
            continue;
        char *path = sup->program[r];
        if (snprintf(path, PATH_MAX, "%s/pagoda-%s", bin_dir, role_names[r]) >= PATH_MAX)
            return pagoda_error_set(PAGODA_ERANGE, "--bin-dir %s is too long", o->bin_dir);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, X_OK) != 0)
            return pagoda_error_set(PAGODA_ENOENT, "%s is not an executable file", path);
    }

    snprintf(sup->workers_text, sizeof(sup->workers_text), "%d", o->workers);
    {
        size_t len = strlen(o->model);
        while (len > 1 && o->model[len - 1] == '/')
            len--;
        size_t start = len;
        while (start > 0 && o->model[start - 1] != '/')
            start--;
        snprintf(sup->model_name, sizeof(sup->model_name), "%.*s", (int)(len - start),
                 o->model + start);
    }
    if ((rc = wire_address_dial_form(sup->listen_dial, sizeof(sup->listen_dial), o->listen)) != 0)
        return rc;
    if (o->role != SUP_ROLE_ROUTER)
        for (int e = 0; e < o->engines; e++)
            if ((rc = prepare_engine(sup, e)) != 0)
                return rc;
    sup->num_children = 0;
    snprintf(sup->tp_size_text, sizeof(sup->tp_size_text), "%d", o->tensor_parallel);
    if (o->role != SUP_ROLE_ROUTER) {
        int tp = o->tensor_parallel;
        for (int e = 0; e < o->engines; e++) {
            for (int r = 0; r < tp; r++)
                add_child(sup, ROLE_KVPOOL, e, -1, tp > 1 ? r : -1);
            /* A tensor-parallel worker's ranks are contiguous, rank 0 last: the start spawns
             * them together and waits for rank 0 (start_next). */
            for (int w = 0; w < o->workers; w++) {
                for (int r = 1; r < tp; r++)
                    add_child(sup, ROLE_WORKER, e, w, r);
                add_child(sup, ROLE_WORKER, e, w, tp > 1 ? 0 : -1);
            }
            add_child(sup, ROLE_SCHEDULER, e, -1, -1);
        }
    }
    if (o->role != SUP_ROLE_ENGINE) {
        add_child(sup, ROLE_ROUTER, -1, -1, -1);
        if (o->http_listen != NULL)
            add_child(sup, ROLE_GATEWAY, -1, -1, -1);
    }
    return check_run_files(sup);
}
