/* The runtime pins (made by the admin API, or file pins it replaced) kept in the run dir,
 * RUN_DIR/router-pins.json, so that a router the supervisor restarts (kill -9, a crash) serves
 * them again: without it they were lost with the process, and the scheduler, which releases
 * whatever pins the new router's first Policy does not name, dropped them too. The file has the
 * tenants file's "pins" form: {"pins": [{"name", "token_ids", "tenants"}]}.
 *
 * It is written after every change of the tenancy (tenancy_changed), on libuv's threadpool, one
 * write at a time (a change during a write is written after it, from the pins as they are then):
 * into a temporary file, flushed to the disk, then renamed over the old one, so that a router
 * killed mid-write leaves the old file whole. An admin call that changed the pins is answered
 * once the write that holds its version is over (router_admin.c), so that a pin the admin was
 * told about survives a kill -9 right after the answer. A failed write is logged and the call
 * answered PAGODA_EIO saying so; the change stays in force in this process.
 *
 * It is read at start, on the loop before the router serves anyone (as the tenants file is):
 * each pin is checked as the admin API checks one; a pin the tenants file also has is the file's
 * (as on a reload); tenants the file no longer has are left out, and a pin left with no reader is
 * dropped; a pin that fails a check is dropped with a warning naming it; a file that cannot be
 * read or parsed is ignored with an error naming it (the router serves the tenants file's pins);
 * at most ROUTER_MAX_PINS entries are read. So a pin of the tenants file that the admin API
 * replaced or unpinned is the file's again after a restart, as after a reload. The supervisor
 * removes the file when it starts a group (deploy/supervisor.c): the runtime pins live as long as
 * the group; what must outlive it belongs in the tenants file. (A router run without the
 * supervisor keeps its run dir's file until it is removed.) */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PINS_FILE_NAME "router-pins.json"
/* ROUTER_MAX_PINNED_TOKENS ids of up to 11 characters, names and punctuation. */
#define PINS_FILE_MAX_BYTES (32u << 20)

/* One write: a copy of the runtime pins at policy version `version`, written by the thread. It
 * outlives the router when the router closes first (r is then NULL). */
struct pins_save_job {
    uv_work_t work;
    struct router *r;
    char *path;
    uint64_t version;
    struct router_pin *pins;
    uint32_t num_pins;
    int rc;
    char detail[512];
};

static void save_job_free(struct pins_save_job *job)
{
    for (uint32_t i = 0; job->pins != NULL && i < job->num_pins; i++)
        router_pin_fini(&job->pins[i]);
    free(job->pins);
    free(job->path);
    free(job);
}

/* Threadpool: writes the job's pins to path.tmp, flushes it to the disk and renames it over
 * path. Names are [A-Za-z0-9_.-] (router_name_ok): nothing to escape. */
static void save_work(uv_work_t *w)
{
    struct pins_save_job *job = w->data;
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", job->path);
    /* A new file (not one a link in the run dir points at, nor one another name shares). */
    if (unlink(tmp) != 0 && errno != ENOENT) {
        job->rc = PAGODA_EIO;
        snprintf(job->detail, sizeof(job->detail), "%.300s: cannot remove it: %s", tmp,
                 strerror(errno));
        return;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        job->rc = PAGODA_EIO;
        snprintf(job->detail, sizeof(job->detail), "%.300s: cannot create it: %s", tmp,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    fputs("{\"pins\": [", f);
    for (uint32_t i = 0; i < job->num_pins; i++) {
        const struct router_pin *p = &job->pins[i];
        fprintf(f, "%s\n {\"name\": \"%s\", \"tenants\": [", i ? "," : "", p->name);
        for (uint32_t k = 0; k < p->num_tenants; k++)
            fprintf(f, "%s\"%s\"", k ? ", " : "", p->tenants[k]);
        fputs("], \"token_ids\": [", f);
        for (uint32_t k = 0; k < p->num_tokens; k++)
            fprintf(f, "%s%d", k ? "," : "", (int)p->token_ids[k]);
        fputs("]}", f);
    }
    fputs("]}\n", f);
    int failed = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int err = errno;
    failed |= fclose(f) != 0;
    if (!failed && rename(tmp, job->path) != 0) {
        failed = 1;
        err = errno;
    }
    if (failed) {
        job->rc = PAGODA_EIO;
        snprintf(job->detail, sizeof(job->detail), "%.300s: cannot write it: %s", job->path,
                 strerror(err));
        unlink(tmp);
    }
}

static int start_save(struct router *r);

/* The write of pins_wanted_version could not be queued (logged): the calls waiting for it are
 * answered with that. */
static void save_not_started(struct router *r)
{
    r->pins_saved_version = r->pins_failed_version = r->pins_wanted_version;
    snprintf(r->pins_failed_detail, sizeof(r->pins_failed_detail),
             "%.300s: the write could not be started", r->pins_path);
}

/* Loop: a write is over (or was cancelled because the router closed). */
static void after_save(uv_work_t *w, int status)
{
    struct pins_save_job *job = w->data;
    struct router *r = job->r;
    if (r == NULL) {
        save_job_free(job);
        return;
    }
    r->pins_save = NULL;
    if (status != 0 && job->rc == 0) {
        job->rc = PAGODA_EIO;
        snprintf(job->detail, sizeof(job->detail), "%.300s: the write was cancelled", job->path);
    }
    if (job->rc != 0)
        log_error("the runtime pins were not saved (a router restarted now would not have the "
                  "ones changed since the last save): %s",
                  job->detail);
    r->pins_failed_version = job->rc != 0 ? job->version : 0;
    snprintf(r->pins_failed_detail, sizeof(r->pins_failed_detail), "%s", job->detail);
    r->pins_saved_version = job->version;
    save_job_free(job);
    if (r->pins_wanted_version > r->pins_saved_version && start_save(r) != 0)
        save_not_started(r);
    admin_on_pins_saved(r);
}

/* Copies the runtime pins and queues their write. */
static int start_save(struct router *r)
{
    struct pins_save_job *job = calloc(1, sizeof(*job));
    int rc = PAGODA_ENOMEM;
    if (job == NULL || (job->path = strdup(r->pins_path)) == NULL ||
        (job->pins = calloc(r->num_pins ? r->num_pins : 1, sizeof(*job->pins))) == NULL)
        goto fail;
    for (uint32_t i = 0; i < r->num_pins; i++) {
        if (r->pins[i].from_file)
            continue;
        const struct router_pin *p = &r->pins[i].pin;
        if ((rc = router_pin_copy(p->name, p->token_ids, p->num_tokens,
                                  (const char *const *)p->tenants, p->num_tenants,
                                  &job->pins[job->num_pins])) != 0)
            goto fail;
        job->num_pins++;
    }
    job->r = r;
    job->version = r->pins_wanted_version;
    job->work.data = job;
    int uv = uv_queue_work(r->loop, &job->work, save_work, after_save);
    if (uv != 0) {
        rc = PAGODA_EIO;
        log_error("the runtime pins were not saved: cannot queue the write: %s", uv_strerror(uv));
        goto fail_logged;
    }
    r->pins_save = job;
    return 0;
fail:
    log_error("the runtime pins were not saved: %s", pagoda_strerror(rc));
fail_logged:
    if (job != NULL)
        save_job_free(job);
    return rc;
}

void pins_file_changed(struct router *r)
{
    r->pins_wanted_version = r->policy_version;
    if (r->pins_path == NULL) {
        r->pins_saved_version = r->policy_version;
        return;
    }
    if (r->pins_save == NULL && start_save(r) != 0)
        save_not_started(r);
}

/* One pin of the file, checked as the admin API's are, its tenants that are gone left out. */
static void restore_pin(struct router *r, uint32_t i, const json_t *obj)
{
    char what[128];
    snprintf(what, sizeof(what), "%s: pins[%u]", r->pins_path, i);
    const json_t *name = json_object_get(obj, "name");
    const json_t *ids = json_object_get(obj, "token_ids");
    const json_t *names = json_object_get(obj, "tenants");
    if (!json_is_string(name) || !json_is_array(ids) || !json_is_array(names) ||
        json_array_size(ids) > ROUTER_PIN_MAX_TOKENS ||
        json_array_size(names) > ROUTER_MAX_TENANTS) {
        log_warn("%s: not a pin (name, token_ids, tenants): dropped", what);
        return;
    }
    const char *pin_name = json_string_value(name);
    if (!router_name_ok(pin_name)) { /* checked before it is logged */
        log_warn("%s: the name is not a pin name: dropped", what);
        return;
    }
    const struct pin_state *configured = tenancy_find_pin(r, pin_name);
    if (configured != NULL && configured->from_file) {
        log_info("%s: \"%.64s\" is the tenants file's pin now", what, pin_name);
        return;
    }
    size_t n = json_array_size(ids), nt = json_array_size(names), kept = 0;
    int32_t *tokens = malloc((n ? n : 1) * sizeof(int32_t));
    const char **readers = calloc(nt ? nt : 1, sizeof(char *));
    struct router_pin pin;
    int changed = 0, rc = PAGODA_ENOMEM;
    memset(&pin, 0, sizeof(pin));
    if (tokens == NULL || readers == NULL)
        goto out;
    rc = PAGODA_EFORMAT;
    for (size_t k = 0; k < n; k++) {
        const json_t *v = json_array_get(ids, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            pagoda_error_set(rc, "%s.token_ids[%zu] is not a token id", what, k);
            goto out;
        }
        tokens[k] = (int32_t)json_integer_value(v);
    }
    for (size_t k = 0; k < nt; k++) {
        const char *t = json_string_value(json_array_get(names, k));
        if (t == NULL || !router_name_ok(t)) {
            pagoda_error_set(rc, "%s.tenants[%zu] is not a tenant name", what, k);
            goto out;
        }
        if (router_tenants_find(r->tenants, t) == NULL)
            log_warn("%s: tenant \"%.64s\" is gone, so it no longer reads pin \"%.64s\"", what, t,
                     pin_name);
        else
            readers[kept++] = t;
    }
    if (kept == 0 && nt > 0) {
        log_warn("%s: pin \"%.64s\" has no reader left: dropped", what, pin_name);
        rc = 0;
        goto out;
    }
    if ((rc = router_pin_make(r->tenants, what, pin_name, tokens, n, readers, kept, &pin)) != 0 ||
        (rc = tenancy_set_pin(r, &pin, &changed)) != 0)
        goto out;
    log_info("restored runtime pin \"%s\" (%u tokens) from %s", pin_name, (unsigned)n,
             r->pins_path);
out:
    if (rc != 0)
        log_warn("%s: dropped: %s", what,
                 rc == PAGODA_ENOMEM ? pagoda_strerror(rc) : pagoda_error_detail());
    router_pin_fini(&pin);
    free(tokens);
    free(readers);
}

int pins_file_open(struct router *r)
{
    r->pins_saved_version = r->pins_wanted_version = r->policy_version;
    if (r->cfg.run_dir == NULL)
        return 0;
    size_t len = strlen(r->cfg.run_dir) + sizeof("/" PINS_FILE_NAME);
    if ((r->pins_path = malloc(len)) == NULL)
        return PAGODA_ENOMEM;
    snprintf(r->pins_path, len, "%s/%s", r->cfg.run_dir, PINS_FILE_NAME);
    if (r->tenants == NULL) /* no tenants file: no admin key, no runtime pin */
        return 0;
    char *buf = NULL;
    int rc =
        router_read_file(r->pins_path, PINS_FILE_MAX_BYTES, "the runtime pins file", &buf, &len);
    if (rc == PAGODA_ENOENT)
        return 0;
    if (rc != 0) {
        log_error("runtime pins not restored: %s", pagoda_error_detail());
        return 0;
    }
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    const json_t *pins = json_object_get(root, "pins");
    if (root == NULL)
        log_error("runtime pins not restored: %s:%d:%d: %s", r->pins_path, jerr.line, jerr.column,
                  jerr.text);
    else if (!json_is_array(pins))
        log_error("runtime pins not restored: %s has no \"pins\" array", r->pins_path);
    if (!json_is_array(pins)) {
        json_decref(root);
        return 0;
    }
    if (json_array_size(pins) > ROUTER_MAX_PINS)
        log_error("%s: %zu pins, more than the limit of %u: the first %u are restored",
                  r->pins_path, json_array_size(pins), ROUTER_MAX_PINS, ROUTER_MAX_PINS);
    for (size_t i = 0; i < json_array_size(pins) && i < ROUTER_MAX_PINS; i++)
        restore_pin(r, (uint32_t)i, json_array_get(pins, i));
    json_decref(root);
    return 0;
}

void pins_file_close(struct router *r)
{
    if (r->pins_save != NULL) {
        r->pins_save->r = NULL; /* after_save frees it */
        uv_cancel((uv_req_t *)&r->pins_save->work);
        r->pins_save = NULL;
    }
    free(r->pins_path);
    r->pins_path = NULL;
}
