/* Benchmark: pagoda's cpu_linear against OpenBLAS sgemm on the shapes of the CPU forward pass.
 * Decides whether OpenBLAS earns its place (see bench/RESULTS.md). Not a test.
 * Build and run: bench/run_cpu_linear.sh */
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void)
{
    const long shapes[][2] = {{256, 688}, {256, 512}, {4096, 4096}};
    const long rows[] = {1, 16, 64};
    printf("| in x out | rows | cpu_linear GFLOP/s | OpenBLAS GFLOP/s | OpenBLAS / cpu_linear | "
           "max rel diff |\n|---|---|---|---|---|---|\n");
    for (size_t s = 0; s < 3; s++) {
        long in = shapes[s][0], out = shapes[s][1];
        for (size_t r = 0; r < 3; r++) {
            long m = rows[r];
            float *x = malloc(sizeof(float) * m * in), *w = malloc(sizeof(float) * in * out);
            float *y1 = malloc(sizeof(float) * m * out), *y2 = malloc(sizeof(float) * m * out);
            for (long i = 0; i < m * in; i++)
                x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
            for (long i = 0; i < in * out; i++)
                w[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
            double flops = 2.0 * m * in * out, t_ours = 1e9, t_blas = 1e9;
            for (int rep = 0; rep < 5; rep++) {
                int iters = (int)(2e8 / flops) + 1;
                double t0 = now();
                for (int it = 0; it < iters; it++)
                    cpu_linear(x, w, NULL, y1, m, in, out);
                double t1 = now();
                for (int it = 0; it < iters; it++)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)out, (int)in,
                                1.0f, x, (int)in, w, (int)in, 0.0f, y2, (int)out);
                double t2 = now();
                if ((t1 - t0) / iters < t_ours)
                    t_ours = (t1 - t0) / iters;
                if ((t2 - t1) / iters < t_blas)
                    t_blas = (t2 - t1) / iters;
            }
            double diff = 0, ref = 0;
            for (long i = 0; i < m * out; i++) {
                double d = (double)y1[i] - y2[i];
                diff = d * d > diff ? d * d : diff;
                ref = (double)y2[i] * y2[i] > ref ? (double)y2[i] * y2[i] : ref;
            }
            printf("| %ld x %ld | %ld | %.1f | %.1f | %.2f | %.1e |\n", in, out, m,
                   flops / t_ours * 1e-9, flops / t_blas * 1e-9, t_ours / t_blas,
                   ref > 0 ? __builtin_sqrt(diff / ref) : 0.0);
            free(x), free(w), free(y1), free(y2);
        }
    }
    return 0;
}
