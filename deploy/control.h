/* Who sent a Control message: the supervisor's roles and the sender names its programs use
 * (Control.sender), read without sockets so that tests/fuzz can drive it (supervisor.c's
 * on_control is the only other user). */
#ifndef PAGODA_DEPLOY_CONTROL_H
#define PAGODA_DEPLOY_CONTROL_H

enum role { ROLE_KVPOOL, ROLE_WORKER, ROLE_SCHEDULER, ROLE_ROUTER, ROLE_GATEWAY, ROLE_COUNT };

/* The sender names of Control{ready}, which are also the suffixes of the program names. */
extern const char *const role_names[ROLE_COUNT];

/* Reads a sender name: a role's name ("kvpool", "scheduler", "router", "worker": *worker_id
 * -1) or "worker-N", N in [0, max_workers) as "%d" writes it (no sign, space or leading zero):
 * *role ROLE_WORKER, *worker_id N. Returns 0, or PAGODA_EINVAL for NULL or anything else
 * (*worker_id is then -1 and *role untouched). */
int control_parse_sender(const char *sender, int max_workers, enum role *role, int *worker_id);

#endif
