#include "worker/worker_budget.h"
#include "common/error.h"
#include "common/log.h"
#include "model/model_budget.h"

#include <inttypes.h>
#include <time.h>

/* A signal cuts the sleep short, so that the caller sees its stop flag at once. */
static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int worker_budget_check(const struct worker_budget_request *r)
{
    const struct model_config *c = r->config;
    const int device = r->device;
    const uint64_t weights = model_budget_weight_bytes(c);
    const uint64_t acts = model_budget_activation_bytes(c, r->max_tokens, r->max_seqs);
    const uint64_t graphs = model_budget_graph_bytes(r->max_tokens, r->max_seqs);
    const uint64_t need = model_budget_worker_bytes(c, r->max_tokens, r->max_seqs);
    const double mib = 1024.0 * 1024.0;
    const int poll_ms = r->poll_ms > 0 ? r->poll_ms : 1;
    uint64_t free_bytes = 0, total_bytes = 0;
    for (int waited = 0;; waited += poll_ms) {
        int rc = r->mem_info(r->mem_info_ctx, &free_bytes, &total_bytes);
        if (rc != 0)
            return rc;
        if (need <= free_bytes) {
            log_info("GPU %d: %.0f MiB free of %.0f MiB beside the KV pool; the worker needs %.0f "
                     "MiB (weights %.0f, activations %.0f, decode graphs %.0f, reserve %.0f)",
                     device, (double)free_bytes / mib, (double)total_bytes / mib,
                     (double)need / mib, (double)weights / mib, (double)acts / mib,
                     (double)graphs / mib, (double)MODEL_BUDGET_RESERVE_BYTES / mib);
            return 0;
        }
        if (waited >= r->wait_ms || (r->stop != NULL && *r->stop))
            break;
        if (waited == 0)
            log_info("GPU %d: %.0f MiB free, %.0f MiB needed; waiting up to %d ms for memory that "
                     "a predecessor may still be releasing",
                     device, (double)free_bytes / mib, (double)need / mib, r->wait_ms);
        sleep_ms(poll_ms);
    }
    uint64_t short_by = need - free_bytes;
    return pagoda_error_set(
        PAGODA_EEXHAUSTED,
        "refusing to start: beside the KV pool (%.0f MiB) the worker needs %.0f MiB on GPU %d "
        "(weights %.0f, activations %.0f for %" PRId64 " tokens and %" PRId64
        " sequences a step, decode graphs %.0f, reserve %.0f) but %.0f MiB are free: short by "
        "%.0f MiB (%" PRIu64
        " bytes); give kvpool a --kv-bytes smaller by at least that, or the worker a smaller "
        "--max-batched-tokens or --max-seqs",
        (double)r->pool_bytes / mib, (double)need / mib, device, (double)weights / mib,
        (double)acts / mib, r->max_tokens, r->max_seqs, (double)graphs / mib,
        (double)MODEL_BUDGET_RESERVE_BYTES / mib, (double)free_bytes / mib, (double)short_by / mib,
        short_by);
}
