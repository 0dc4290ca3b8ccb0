#include "deploy/control.h"
#include "common/error.h"
#include "common/parse.h"

#include <stdint.h>
#include <string.h>

const char *const role_names[ROLE_COUNT] = {"kvpool", "worker", "scheduler", "router", "gateway"};

/* Whether text is a decimal number as "%d" writes one that is not negative: digits only, no
 * sign, space or leading zero (strtoll, under parse_i64, would take "+1", " 1" and "01"). */
static int canonical_number(const char *text)
{
    if (text[0] < '0' || text[0] > '9' || (text[0] == '0' && text[1] != '\0'))
        return 0;
    for (const char *p = text; *p != '\0'; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

int control_parse_sender(const char *sender, int max_workers, enum role *role, int *worker_id)
{
    *worker_id = -1;
    if (sender == NULL || max_workers < 1)
        return PAGODA_EINVAL;
    for (int r = 0; r < ROLE_COUNT; r++) {
        if (strcmp(sender, role_names[r]) == 0) {
            *role = (enum role)r;
            return 0;
        }
    }
    int64_t v;
    if (strncmp(sender, "worker-", 7) == 0 && canonical_number(sender + 7) &&
        parse_i64("sender", sender + 7, 0, max_workers - 1, &v) == 0) {
        *role = ROLE_WORKER;
        *worker_id = (int)v;
        return 0;
    }
    return PAGODA_EINVAL;
}
