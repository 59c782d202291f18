/* gemm.h -- internal: SGEMM kernels shared by gemm.c, gemm_avx2.c, gemm_avx512.c,
 * gemm_image_avx512.c and the ops built on GEMM. */
#ifndef MDL_GEMM_H
#define MDL_GEMM_H
#include <stdint.h>
#include <stddef.h>
#include "common.h"

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void mdl_sgemm_scalar(int trans_a, int trans_b, int64_t i0, int64_t i1, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc);

/* Thread grid tm x tn (tm * tn == nt) of the blocked SIMD kernels, minimising the
 * largest per-thread tile count for an mt x ntl tile block; ties go to the split
 * over M when the block has at least as many row panels as column panels (each thread
 * packs and sweeps its own rows of A; AVX-512, 2 threads: 1000^3 1.20x, 2048^3 1.06x
 * against the split over N), else over N (the threads share one packed A block; 128 x
 * 4096 x 1152 split over M: 0.65x). */
static inline void mdl_gemm_grid(int nt, int64_t mt, int64_t ntl, int *tm, int *tn)
{
    int64_t best = -1;
    for (int d = 1; d <= nt; d++) {
        if (nt % d) continue;
        int64_t cost = ((mt + d - 1) / d) * ((ntl + nt / d - 1) / (nt / d));
        if (best < 0 || cost < best || (cost == best && mt >= ntl)) {
            best = cost;
            *tm = d;
            *tn = nt / d;
        }
    }
}

/* What the GEMM kernels do to each final element of C, row by row, while the tile
 * is still in registers: v = v + bias[row] (bias not NULL), v = max(v, 0) (relu),
 * then row_sum[row] += v and row_sumsq[row] += v * v over the row's elements
 * (row_sum not NULL; each tile row's sums shifted by its mean in float, then added in
 * double, mdl_add_shifted_sums).  Rows index C's rows. */
typedef struct mdl_epilogue {
    const float *bias;
    int relu;
    double *row_sum, *row_sumsq;
} mdl_epilogue;

#if MDL_X86
/* Packing buffers of the blocked AVX2 kernel, in floats (independent of the thread count). */
size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k);
/* Blocked AVX2+FMA SGEMM, threaded inside; ws is 64-byte aligned and holds
 * mdl_sgemm_avx2_workspace_floats(m, n, k) floats.  Needs m, n, k >= 1. */
void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws);
/* Single-threaded products with A packed once and reused (convolution):
 * mdl_sgemm_avx2_pack_a writes alpha * op(A) (m x k) into pa, which holds
 * mdl_sgemm_avx2_packed_a_floats(m, k) floats (64-byte aligned);
 * mdl_sgemm_avx2_packed then computes C (m x n) = pa @ op(B) + beta * C for op(B)
 * (k x n, row-major, ldb; transposed when trans_b) and applies ep (or NULL) to the
 * final values; bbuf holds
 * mdl_sgemm_avx2_packed_b_floats(k) floats, 64-byte aligned. */
size_t mdl_sgemm_avx2_packed_a_floats(int64_t m, int64_t k);
size_t mdl_sgemm_avx2_packed_b_floats(int64_t k);
void mdl_sgemm_avx2_pack_a(int trans_a, int64_t m, int64_t k, float alpha, const float *a,
                           int64_t lda, float *pa);
/* The same packing of a convolution's data-gradient weights: op(A) (c_in x c_out kk)
 * holds the kernels of w (c_out, c_in, kk taps) flipped, op(A)[ci][co kk + t] =
 * w[co][ci][kk - 1 - t] (with one tap, w transposed) */
void mdl_sgemm_avx2_pack_flipped_weights(int64_t c_in, int64_t c_out, int64_t kk,
                                         const float *w, float *pa);
void mdl_sgemm_avx2_packed(int trans_b, int64_t m, int64_t n, int64_t k, const float *pa,
                           const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                           const mdl_epilogue *ep, float *bbuf);
/* Its rows [i0, i1) of C only (i0 a multiple of 6, the micro-panels' rows), exactly as
 * the whole product computes them: threads may share one product's rows.  pa is A
 * packed (lda 0) or A itself (m x k, rows lda floats apart), with the same results:
 * the packing pays where a product's rows meet many columns, not one image's few. */
void mdl_sgemm_avx2_packed_rows(int trans_b, int64_t m, int64_t i0, int64_t i1, int64_t n,
                                int64_t k, const float *pa, int64_t lda, const float *b,
                                int64_t ldb, float beta, float *c, int64_t ldc,
                                const mdl_epilogue *ep, float *bbuf);
#define MDL_SGEMM_AVX2_MR 6
/* The same contract for the blocked AVX-512F SGEMM (gemm_avx512.c). */
size_t mdl_sgemm_avx512_workspace_floats(int64_t m, int64_t n, int64_t k);
void mdl_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc, float *ws);
/* Pixel j of an image's rows read in place, rows `cols` pixels apart in C and `ld`
 * floats apart in the image: its offset in the image. */
static inline int64_t mdl_rows_panel(int64_t j, int64_t cols, int64_t ld)
{
    return j / cols * ld + j % cols;
}
/* C (m x n) = pa @ B with B's rows read in place from an image: column j of B's row p
 * is the float at b + mdl_rows_panel(j, cols, ld) + off[p], with cols a multiple of
 * 16, or 8 (two rows per 16 columns), and n a multiple of 16 (the output pixels of
 * a padded image's phase planes).  pa packed by the same level's rows_pack_a. */
void mdl_sgemm_avx2_packed_image(int64_t m, int64_t k, const float *pa, const float *b,
                                 int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                 float beta, float *c, int64_t ldc, const mdl_epilogue *ep);
/* Its rows [i0, i1) only, A packed or not (lda), as mdl_sgemm_avx2_packed_rows */
void mdl_sgemm_avx2_packed_image_rows(int64_t m, int64_t i0, int64_t i1, int64_t k,
                                      const float *pa, int64_t lda, const float *b, int64_t cols,
                                      int64_t ld, int64_t n, const int64_t *off, float beta,
                                      float *c, int64_t ldc, const mdl_epilogue *ep);
/* The same with AVX-512F (gemm_image_avx512.c): mdl_sgemm_avx512_rows_pack_a packs a
 * (m x k, row-major, lda) into pa, which holds mdl_sgemm_avx512_rows_a_floats(m, k)
 * floats (64-byte aligned), for mdl_sgemm_avx512_packed_image. */
size_t mdl_sgemm_avx512_rows_a_floats(int64_t m, int64_t k);
void mdl_sgemm_avx512_rows_pack_a(int64_t m, int64_t k, const float *a, int64_t lda, float *pa);
void mdl_sgemm_avx512_packed_image(int64_t m, int64_t k, const float *pa, const float *b,
                                   int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                   float beta, float *c, int64_t ldc, const mdl_epilogue *ep);
/* The same over the rows sel[0..nsel) of K only (increasing; at least one), C
 * overwritten, no epilogue: a convolution's output pixels whose windows miss the
 * padding's taps skip them. */
void mdl_sgemm_avx512_packed_image_sel(int64_t m, int64_t k, const float *pa, const float *b,
                                       int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                       const int32_t *sel, int64_t nsel, float *c, int64_t ldc);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_sgemm_avx2_workspace_floats(m, n, k) ((void)(m), (void)(n), (void)(k), (size_t)0)
#  define mdl_sgemm_avx2(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws) \
    ((void)(ws), mdl_sgemm_scalar(ta, tb, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
#  define mdl_sgemm_avx512_workspace_floats(m, n, k) ((void)(m), (void)(n), (void)(k), (size_t)0)
#  define mdl_sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws) \
    ((void)(ws), mdl_sgemm_scalar(ta, tb, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
#endif
#endif
