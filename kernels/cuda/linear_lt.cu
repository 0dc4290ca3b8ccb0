/* Linear layers through cuBLASLt (kernels/cuda/linear_lt.h): a plan per shape, kept in an
 * open-addressing table that doubles when half full. */
#include "kernels/cuda/linear_lt.h"

#include "common/error.h"

#include <cublasLt.h>
#include <stdlib.h>

namespace
{

struct key {
    int64_t rows, in, out, ldy;
    int32_t y_f32, align; /* align: the least alignment of x, w and y in bytes, at most 256 */
};

struct plan {
    key k;
    int used;
    int none; /* the heuristic found no algorithm: PAGODA_EUNSUPPORTED at once next time */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lw, lx, ly;
    cublasLtMatmulAlgo_t algo;
};

bool key_eq(const key &a, const key &b)
{
    return a.rows == b.rows && a.in == b.in && a.out == b.out && a.ldy == b.ldy &&
           a.y_f32 == b.y_f32 && a.align == b.align;
}

uint64_t key_hash(const key &k)
{
    uint64_t h = 1469598103934665603ull;
    const int64_t f[6] = {k.rows, k.in, k.out, k.ldy, k.y_f32, k.align};
    for (int i = 0; i < 6; i++) {
        h ^= (uint64_t)f[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

int32_t alignment(const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    int32_t al = 256;
    while (al > 1 && a % (uintptr_t)al != 0)
        al /= 2;
    return al;
}

int lt_fail(cublasStatus_t st, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "cuBLASLt %s: status %d", what, (int)st);
}

void plan_release(plan *p)
{
    if (p->op != NULL)
        cublasLtMatmulDescDestroy(p->op);
    if (p->lw != NULL)
        cublasLtMatrixLayoutDestroy(p->lw);
    if (p->lx != NULL)
        cublasLtMatrixLayoutDestroy(p->lx);
    if (p->ly != NULL)
        cublasLtMatrixLayoutDestroy(p->ly);
}

} // namespace

struct cuda_lt {
    cublasLtHandle_t handle;
    void *workspace;
    size_t workspace_bytes;
    plan *slots;
    size_t cap, count; /* cap a power of two */
};

int cuda_lt_new(void *workspace, size_t workspace_bytes, struct cuda_lt **out)
{
    *out = NULL;
    cuda_lt *lt = static_cast<cuda_lt *>(calloc(1, sizeof(*lt)));
    if (lt == NULL)
        return PAGODA_ENOMEM;
    lt->cap = 64;
    lt->slots = static_cast<plan *>(calloc(lt->cap, sizeof(plan)));
    if (lt->slots == NULL) {
        free(lt);
        return PAGODA_ENOMEM;
    }
    const cublasStatus_t st = cublasLtCreate(&lt->handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(lt->slots);
        free(lt);
        return lt_fail(st, "create");
    }
    lt->workspace = workspace;
    lt->workspace_bytes = workspace_bytes;
    *out = lt;
    return 0;
}

void cuda_lt_free(struct cuda_lt *lt)
{
    if (lt == NULL)
        return;
    for (size_t i = 0; i < lt->cap; i++)
        if (lt->slots[i].used)
            plan_release(&lt->slots[i]);
    free(lt->slots);
    cublasLtDestroy(lt->handle);
    free(lt);
}

size_t cuda_lt_plans(const struct cuda_lt *lt)
{
    return lt->count;
}

namespace
{

plan *find(cuda_lt *lt, const key &k)
{
    for (size_t i = key_hash(k) & (lt->cap - 1);; i = (i + 1) & (lt->cap - 1))
        if (!lt->slots[i].used || key_eq(lt->slots[i].k, k))
            return &lt->slots[i];
}

int grow(cuda_lt *lt)
{
    plan *old = lt->slots;
    const size_t old_cap = lt->cap;
    plan *slots = static_cast<plan *>(calloc(2 * old_cap, sizeof(plan)));
    if (slots == NULL)
        return PAGODA_ENOMEM;
    lt->slots = slots;
    lt->cap = 2 * old_cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].used)
            *find(lt, old[i].k) = old[i];
    free(old);
    return 0;
}

/* Fills p (k set) with the descriptors and the heuristic's first algorithm. */
int make_plan(cuda_lt *lt, plan *p)
{
    const key &k = p->k;
    cublasStatus_t st = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const cudaDataType yt = k.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    /* Column-major as cuBLAS sees it: w is in x out (transposed by the op), x in x rows, y out x
     * rows with leading dimension ldy. */
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->lw, CUDA_R_16BF, (uint64_t)k.in, (uint64_t)k.out, k.in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st =
            cublasLtMatrixLayoutCreate(&p->lx, CUDA_R_16BF, (uint64_t)k.in, (uint64_t)k.rows, k.in);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutCreate(&p->ly, yt, (uint64_t)k.out, (uint64_t)k.rows, k.ldy);
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(st, "descriptors");
    cublasLtMatmulPreference_t pref = NULL;
    st = cublasLtMatmulPreferenceCreate(&pref);
    const size_t ws = lt->workspace_bytes;
    const uint32_t al = (uint32_t)k.align;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof(al));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt->handle, p->op, p->lw, p->lx, p->ly, p->ly, pref, 1,
                                            &h, &found);
    if (pref != NULL)
        cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found < 1)) {
        p->none = 1;
        return 0;
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return lt_fail(st, "heuristic");
    p->algo = h.algo;
    return 0;
}

} // namespace

int cuda_lt_linear(struct cuda_lt *lt, const uint16_t *x, const uint16_t *w, void *y, int y_f32,
                   int64_t rows, int64_t in, int64_t out, int64_t ldy, cudaStream_t s)
{
    if (lt == NULL || x == NULL || w == NULL || y == NULL || rows < 1 || in < 1 || out < 1 ||
        ldy < out || rows > INT32_MAX || in > INT32_MAX || ldy > INT32_MAX)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_lt_linear: rows %lld, in %lld, out %lld, ldy %lld",
                                (long long)rows, (long long)in, (long long)out, (long long)ldy);
    key k = {rows, in, out, ldy, y_f32 ? 1 : 0, 256};
    const int32_t ax = alignment(x), aw = alignment(w), ay = alignment(y);
    k.align = ax < aw ? ax : aw;
    k.align = ay < k.align ? ay : k.align;
    plan *p = find(lt, k);
    if (!p->used) {
        if (2 * (lt->count + 1) > lt->cap) {
            int rc = grow(lt);
            if (rc != 0)
                return rc;
            p = find(lt, k);
        }
        plan fresh = {};
        fresh.k = k;
        int rc = make_plan(lt, &fresh);
        if (rc != 0) {
            plan_release(&fresh);
            return rc;
        }
        fresh.used = 1;
        *p = fresh;
        lt->count++;
    }
    if (p->none)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuBLASLt has no algorithm for %lld x %lld -> %lld (ldy %lld)",
                                (long long)rows, (long long)in, (long long)out, (long long)ldy);
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st =
        cublasLtMatmul(lt->handle, p->op, &one, w, p->lw, x, p->lx, &zero, y, p->ly, y, p->ly,
                       &p->algo, lt->workspace, lt->workspace_bytes, s);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : lt_fail(st, "matmul");
}
