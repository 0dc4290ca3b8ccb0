/* The tensor-core step of the small-M linears (kernels/cuda/linear.cu, linear_stream.cu): one
 * chunk of 32 reduction columns of 16 weight rows (the M of an m16n8k16 product) against 8 * TILES
 * input rows (its N, 8 a tile). Lane (g = lane / 4, c = lane % 4) holds 16 bytes of weight rows g
 * and g + 8 and of input rows 8t + g, all at columns 8c .. 8c + 7 of the chunk, and feeds them to
 * two m16n8k16 products as the A (weights) and B (inputs) fragments. The fragments' reduction
 * index is a permutation of the chunk's 32 columns, the same for A and B, so the products sum the
 * right pairs without any shuffle. Accumulator j of lane (g, c) in tile t is feature g (+8 for
 * j >= 2) and input row 8t + 2c (+1 for odd j). Private to kernels/cuda. */
#ifndef PAGODA_KERNELS_CUDA_GEMV_MMA_CUH
#define PAGODA_KERNELS_CUDA_GEMV_MMA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk: weights wa (row g) and wb (row g + 8), inputs xv[t] (row 8t + g). Columns 8c,
 * 8c + 1 | 8c + 2, 8c + 3 go to the first product's k = 2c, 2c + 1 | 2c + 8, 2c + 9, columns
 * 8c + 4 .. 8c + 7 to the second's likewise. */
template <int TILES>
__device__ __forceinline__ void chunk_mma(float acc[TILES][4], uint4 wa, uint4 wb,
                                          const uint4 xv[TILES])
{
#pragma unroll
    for (int t = 0; t < TILES; t++) {
        mma_bf16(acc[t], wa.x, wb.x, wa.y, wb.y, xv[t].x, xv[t].y);
        mma_bf16(acc[t], wa.z, wb.z, wa.w, wb.w, xv[t].z, xv[t].w);
    }
}

#endif
