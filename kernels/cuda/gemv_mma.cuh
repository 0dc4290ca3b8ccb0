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

#include "kernels/cuda/common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

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

/* The end of a tile of features n0 .. n0 + 15: the warps' partial sums part[v][t][j][lane]
 * (laid out [WARPS][TILES][4][32], each warp's accumulators) added in warp order (a fixed order:
 * deterministic results) and stored in y, f32 or bf16, for the features below out and the input
 * rows below rows. Thread `thread` of `threads` (the tile's warps) takes every threads-th sum. */
template <int TILES, int WARPS, bool F32>
__device__ __forceinline__ void gemv_tile_store(const float *part, int thread, int threads,
                                                int64_t n0, int32_t rows, int32_t out, void *y)
{
    for (int idx = thread; idx < TILES * 4 * 32; idx += threads) {
        const int t = idx >> 7, j = (idx >> 5) & 3, l = idx & 31;
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < WARPS; v++)
            sum += part[((v * TILES + t) * 4 + j) * 32 + l];
        const int64_t feature = n0 + (l >> 2) + (j >= 2 ? 8 : 0);
        const int tok = t * 8 + 2 * (l & 3) + (j & 1);
        if (feature < out && tok < rows) {
            if (F32)
                static_cast<float *>(y)[(int64_t)tok * out + feature] = sum;
            else
                static_cast<uint16_t *>(y)[(int64_t)tok * out + feature] = float_to_bf16_bits(sum);
        }
    }
}

#endif
