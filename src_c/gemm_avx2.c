/* gemm_avx2.c -- blocked AVX2+FMA SGEMM (compiled with -mavx2 -mfma).
 *
 * C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major, in the BLIS style:
 *
 *   for jc over N in blocks of nc            B panel  (kc x nc) shared, ~L3
 *     for pc over K in blocks of kc
 *       for ic over M in blocks of mb        A block  (mb x kc) shared
 *         pack B (when ic == 0) and A, cooperatively; barrier
 *         each thread: its rows x its columns of the block, in L2-sized row
 *           groups (MC rows), B micro-panels (kc x 16, L1) inside, 6x16 tiles
 *         barrier
 *
 * Packed A holds alpha * op(A) in micro-panels of MR = 6 rows (p-major, rows
 * padded with zeros); packed B holds op(B) in micro-panels of NR = 16 columns
 * (p-major, columns padded with zeros).  Transposes are handled while packing.
 * The micro-kernel keeps a 6x16 tile of C in 12 ymm accumulators; tiles with
 * fewer rows use the same kernel specialised for that row count, tiles with
 * fewer columns go through a small temporary.  The first K block applies
 * beta (beta == 0 stores without reading C), later ones add.
 *
 * Threads: one parallel region per call.  The threads form a tm x tn grid
 * over the tiles of each block (tm * tn = threads), chosen per call so that
 * small-M problems split over N and large ones over whichever balances
 * better.  The packed buffers are shared, so the workspace does not depend on
 * the thread count. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include <string.h>
#include "gemm.h"
#include "simd_avx2.h"

#define MR 6
#define NR 16
#define KC_MAX 320   /* B micro-panel kc x 16 floats: <= 20 KiB, stays in L1 */
#define MC 144       /* rows of A a thread sweeps per B micro-panel: 6 x 24, ~180 KiB in L2 */
#define MB_MAX 1536  /* rows of A packed per step */
#define NC_MAX 4096  /* columns of B packed per step */

typedef struct blocking {
    int64_t kc, mb, nc; /* block sizes (mb multiple of MR, nc multiple of NR) */
} blocking;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/* Blocks of nearly equal size no larger than the maxima. */
static blocking plan_blocks(int64_t m, int64_t n, int64_t k)
{
    blocking bl;
    bl.kc = ceil_div(k, ceil_div(k, KC_MAX));
    bl.mb = round_up(ceil_div(m, ceil_div(m, MB_MAX)), MR);
    bl.nc = round_up(ceil_div(n, ceil_div(n, NC_MAX)), NR);
    return bl;
}

size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    blocking bl = plan_blocks(m, n, k);
    /* B panel first: its size is a multiple of 16 floats, so A stays 64-byte aligned */
    return (size_t)(bl.kc * bl.nc + bl.mb * bl.kc);
}

/* ---- packing ------------------------------------------------------------------ */


/* One A micro-panel: dst[p * MR + r] = alpha * op(A)[i0 + r][p0 + p] for
 * r < rows (zero for rows <= r < MR), p < kc. */
static void pack_a(int trans_a, const float *a, int64_t lda, int64_t i0, int64_t p0,
                   int rows, int64_t kc, float alpha, float *restrict dst)
{
    if (trans_a) { /* op(A)[i][p] = a[p * lda + i]: MR contiguous floats per p */
        for (int64_t p = 0; p < kc; p++) {
            const float *src = a + (p0 + p) * lda + i0;
            float *d = dst + p * MR;
            int r = 0;
            for (; r < rows; r++) d[r] = alpha * src[r];
            for (; r < MR; r++) d[r] = 0.0f;
        }
        return;
    }
    /* op(A)[i][p] = a[i * lda + p]: rows are contiguous in p; transpose 8 p at a time */
    const float *src[MR];
    for (int r = 0; r < MR; r++) src[r] = a + (i0 + (r < rows ? r : 0)) * lda + p0;
    const __m256 va = _mm256_set1_ps(alpha), zero = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 v[8];
        for (int r = 0; r < MR; r++)
            v[r] = r < rows ? _mm256_mul_ps(va, _mm256_loadu_ps(src[r] + p)) : zero;
        v[6] = v[7] = zero;
        mdl_transpose8_ps(v);
        float *d = dst + p * MR;
        /* each column is 6 floats: 8-wide stores overlap the next column, which
         * is written afterwards; the last one must not run past this panel */
        for (int q = 0; q < 7; q++) _mm256_storeu_ps(d + q * MR, v[q]);
        _mm_storeu_ps(d + 7 * MR, _mm256_castps256_ps128(v[7]));
        _mm_storel_pi((__m64 *)(d + 7 * MR + 4), _mm256_extractf128_ps(v[7], 1));
    }
    for (; p < kc; p++) {
        float *d = dst + p * MR;
        int r = 0;
        for (; r < rows; r++) d[r] = alpha * src[r][p];
        for (; r < MR; r++) d[r] = 0.0f;
    }
}

/* One B micro-panel: dst[p * NR + j] = op(B)[p0 + p][j0 + j] for j < cols
 * (zero for cols <= j < NR), p < kc. */
static void pack_b(int trans_b, const float *b, int64_t ldb, int64_t j0, int64_t p0,
                   int cols, int64_t kc, float *restrict dst)
{
    if (!trans_b) { /* op(B)[p][j] = b[p * ldb + j]: NR contiguous floats per p */
        const float *src = b + p0 * ldb + j0;
        if (cols == NR) {
            for (int64_t p = 0; p < kc; p++) {
                _mm256_store_ps(dst + p * NR, _mm256_loadu_ps(src + p * ldb));
                _mm256_store_ps(dst + p * NR + 8, _mm256_loadu_ps(src + p * ldb + 8));
            }
        } else {
            for (int64_t p = 0; p < kc; p++) {
                int j = 0;
                for (; j < cols; j++) dst[p * NR + j] = src[p * ldb + j];
                for (; j < NR; j++) dst[p * NR + j] = 0.0f;
            }
        }
        return;
    }
    /* op(B)[p][j] = b[j * ldb + p]: columns of op(B) are contiguous in p */
    const float *src[NR];
    for (int j = 0; j < NR; j++) src[j] = b + (j0 + (j < cols ? j : 0)) * ldb + p0;
    const __m256 zero = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h < 2; h++) {
            __m256 v[8];
            for (int j = 0; j < 8; j++)
                v[j] = h * 8 + j < cols ? _mm256_loadu_ps(src[h * 8 + j] + p) : zero;
            mdl_transpose8_ps(v);
            for (int q = 0; q < 8; q++) _mm256_store_ps(dst + (p + q) * NR + h * 8, v[q]);
        }
    }
    for (; p < kc; p++) {
        int j = 0;
        for (; j < cols; j++) dst[p * NR + j] = src[j][p];
        for (; j < NR; j++) dst[p * NR + j] = 0.0f;
    }
}

/* ---- micro-kernel ------------------------------------------------------------- */

/* C tile (rows x cols, rows == ROWS <= MR, cols <= NR) = packed A micro-panel
 * @ packed B micro-panel + beta * C (beta == 0: C is not read), then, when ep is
 * not NULL, the epilogue on the final values of rows row0.. (see mdl_epilogue).
 * The accumulators are named variables (not an array) so that they stay in
 * registers; rows >= ROWS fold away at compile time.  Tiles with fewer columns
 * go through a small temporary. */
#define ROW_FMA(r)                                                   \
    if (ROWS > r) {                                                  \
        __m256 av = _mm256_broadcast_ss(a + p * MR + r);             \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                  \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                  \
    }
#define ROW_FINISH(r)                                                                   \
    if (ROWS > r) {                                                                     \
        float *cr = cp + r * ldp;                                                       \
        if (beta != 0.0f) {                                                             \
            c##r##0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), c##r##0);                \
            c##r##1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), c##r##1);            \
        }                                                                               \
        if (ep) epilogue_row(ep, row0 + r, &c##r##0, &c##r##1, m0, m1);                 \
        _mm256_storeu_ps(cr, c##r##0);                                                  \
        _mm256_storeu_ps(cr + 8, c##r##1);                                              \
    }

/* One row of a tile, v0 | v1 (16 columns; m0 | m1 mark the valid ones): + bias,
 * max(0, .), then the row's sum and sum of squares added to the epilogue's sums. */
static inline __attribute__((always_inline)) void
epilogue_row(const mdl_epilogue *ep, int64_t row, __m256 *v0, __m256 *v1, __m256 m0, __m256 m1)
{
    if (ep->bias) {
        const __m256 b = _mm256_set1_ps(ep->bias[row]);
        *v0 = _mm256_add_ps(*v0, b);
        *v1 = _mm256_add_ps(*v1, b);
    }
    if (ep->relu) {
        *v0 = _mm256_max_ps(*v0, _mm256_setzero_ps());
        *v1 = _mm256_max_ps(*v1, _mm256_setzero_ps());
    }
    if (ep->row_sum) {
        __m256 a0 = _mm256_and_ps(*v0, m0), a1 = _mm256_and_ps(*v1, m1);
        ep->row_sum[row] += mdl_hsum_ps(_mm256_add_ps(a0, a1));
        ep->row_sumsq[row] += mdl_hsum_ps(_mm256_fmadd_ps(a0, a0, _mm256_mul_ps(a1, a1)));
    }
}

/* B is a packed panel b (row p at b + p * NR), or, when off is not NULL, rows read
 * in place: row p is the 8 floats at b + off[p] then the 8 at b + off[p] + half
 * (any alignment). */
static inline __attribute__((always_inline)) void
kernel_rows(const int ROWS, int64_t kc, const float *restrict a, const float *restrict b,
            const int64_t *restrict off, int64_t half, float *c, int64_t ldc, int cols,
            float beta, const mdl_epilogue *ep, int64_t row0)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    if (off) {
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            const float *bp = b + off[p];
            __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + half);
            ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4) ROW_FMA(5)
        }
    } else {
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            __m256 b0 = _mm256_load_ps(b + p * NR), b1 = _mm256_load_ps(b + p * NR + 8);
            ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4) ROW_FMA(5)
        }
    }
    const __m256 vb = _mm256_set1_ps(beta);
    float tmp[MR * NR];
    float *cp = c;
    int64_t ldp = ldc;
    __m256 m0 = _mm256_castsi256_ps(mdl_lane_mask(0, 8)), m1 = m0;
    if (cols < NR) {
        cp = tmp;
        ldp = NR;
        m0 = _mm256_castsi256_ps(mdl_lane_mask(0, cols));
        m1 = _mm256_castsi256_ps(mdl_lane_mask(0, cols - 8));
        if (beta != 0.0f)
            for (int r = 0; r < ROWS; r++) memcpy(tmp + r * NR, c + r * ldc, (size_t)cols * 4);
    }
    ROW_FINISH(0) ROW_FINISH(1) ROW_FINISH(2) ROW_FINISH(3) ROW_FINISH(4) ROW_FINISH(5)
    if (cols < NR)
        for (int r = 0; r < ROWS; r++) memcpy(c + r * ldc, tmp + r * NR, (size_t)cols * 4);
}

static void kernel_at(int rows, int64_t kc, const float *a, const float *b, const int64_t *off,
                      int64_t half, float *c, int64_t ldc, int cols, float beta,
                      const mdl_epilogue *ep, int64_t row0)
{
    switch (rows) {
    case 6: kernel_rows(6, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    case 5: kernel_rows(5, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    case 4: kernel_rows(4, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    case 3: kernel_rows(3, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    case 2: kernel_rows(2, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    default: kernel_rows(1, kc, a, b, off, half, c, ldc, cols, beta, ep, row0); break;
    }
}

static void kernel(int rows, int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                   int cols, float beta, const mdl_epilogue *ep, int64_t row0)
{
    kernel_at(rows, kc, a, b, NULL, 0, c, ldc, cols, beta, ep, row0);
}

/* ---- driver ------------------------------------------------------------------- */

void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws)
{
    const blocking bl = plan_blocks(m, n, k);
    float *const bpack = ws;
    float *const apack = ws + bl.kc * bl.nc;
    /* one thread below ~0.5M multiply-adds; never more threads than tiles */
    int nt = mdl_threads_for((double)m * n * k / 8.0);
    int64_t tiles = ceil_div(bl.mb < m ? bl.mb : m, MR) * ceil_div(bl.nc < n ? bl.nc : n, NR);
    if (nt > tiles) nt = (int)tiles;

#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        int tm = 1, tn = 1;
        mdl_gemm_grid(T, ceil_div(bl.mb < m ? bl.mb : m, MR), ceil_div(bl.nc < n ? bl.nc : n, NR),
                    &tm, &tn);
        const int ti = t / tn, tj = t % tn;

        for (int64_t jc = 0; jc < n; jc += bl.nc) {
            const int64_t nb = n - jc < bl.nc ? n - jc : bl.nc;
            const int64_t npan = ceil_div(nb, NR);
            const int64_t c0 = npan * tj / tn, c1 = npan * (tj + 1) / tn;
            for (int64_t pc = 0; pc < k; pc += bl.kc) {
                const int64_t kb = k - pc < bl.kc ? k - pc : bl.kc;
                const float beta_eff = pc == 0 ? beta : 1.0f;
                for (int64_t ic = 0; ic < m; ic += bl.mb) {
                    const int64_t mbk = m - ic < bl.mb ? m - ic : bl.mb;
                    const int64_t mpan = ceil_div(mbk, MR);
                    const int64_t r0 = mpan * ti / tm, r1 = mpan * (ti + 1) / tm;

                    /* pack: my column panels are shared with the tm threads of my
                     * grid column, my row panels with the tn threads of my row */
                    if (ic == 0) {
                        int64_t lo = c0 + (c1 - c0) * ti / tm, hi = c0 + (c1 - c0) * (ti + 1) / tm;
                        for (int64_t q = lo; q < hi; q++) {
                            int64_t cols = nb - q * NR < NR ? nb - q * NR : NR;
                            pack_b(trans_b, b, ldb, jc + q * NR, pc, (int)cols, kb,
                                   bpack + q * NR * kb);
                        }
                    }
                    {
                        int64_t lo = r0 + (r1 - r0) * tj / tn, hi = r0 + (r1 - r0) * (tj + 1) / tn;
                        for (int64_t q = lo; q < hi; q++) {
                            int64_t rows = mbk - q * MR < MR ? mbk - q * MR : MR;
                            pack_a(trans_a, a, lda, ic + q * MR, pc, (int)rows, kb, alpha,
                                   apack + q * MR * kb);
                        }
                    }
#pragma omp barrier
                    /* compute my rows [r0, r1) x columns [c0, c1) of the block */
                    for (int64_t rg = r0; rg < r1; rg += MC / MR) {
                        const int64_t rg1 = rg + MC / MR < r1 ? rg + MC / MR : r1;
                        for (int64_t q = c0; q < c1; q++) {
                            const int64_t cols = nb - q * NR < NR ? nb - q * NR : NR;
                            const float *bp = bpack + q * NR * kb;
                            for (int64_t pr = rg; pr < rg1; pr++) {
                                const int64_t rows = mbk - pr * MR < MR ? mbk - pr * MR : MR;
                                kernel((int)rows, kb, apack + pr * MR * kb, bp,
                                       c + (ic + pr * MR) * ldc + jc + q * NR, ldc, (int)cols,
                                       beta_eff, NULL, 0);
                            }
                        }
                    }
#pragma omp barrier
                }
            }
        }
    }
}

/* ---- pre-packed A, one thread (for callers that reuse A over many products) ---- */

size_t mdl_sgemm_avx2_packed_a_floats(int64_t m, int64_t k)
{
    return (size_t)(round_up(m, MR) * k);
}

/* K block pc (of plan_blocks' kc) starts at pa + pc * round_up(m, MR); in it, row
 * panel q at + q * MR * kb, packed as pack_a does. */
void mdl_sgemm_avx2_pack_a(int trans_a, int64_t m, int64_t k, float alpha, const float *a,
                           int64_t lda, float *pa)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = k - pc < kc ? k - pc : kc;
        for (int64_t q = 0; q * MR < m; q++) {
            int64_t rows = m - q * MR < MR ? m - q * MR : MR;
            pack_a(trans_a, a, lda, q * MR, pc, (int)rows, kb, alpha, pa + pc * mp + q * MR * kb);
        }
    }
}

/* Columns of B that mdl_sgemm_avx2_packed packs at a time: a kc x PACKED_NC block
 * (at most 400 KiB) stays in L2 while each row tile of A, in L1, passes over all of it.
 * With one 16-column panel at a time, A (the weights) streamed from L3 once per panel:
 * a 512 x 2304 A ran at 0.8x when its images went 8 to a product instead of one. */
#define PACKED_NC 320

size_t mdl_sgemm_avx2_packed_b_floats(int64_t k)
{
    return (size_t)(plan_blocks(1, 1, k).kc * PACKED_NC);
}

void mdl_sgemm_avx2_packed(int trans_b, int64_t m, int64_t n, int64_t k, const float *pa,
                           const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                           const mdl_epilogue *ep, float *bbuf)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = k - pc < kc ? k - pc : kc;
        const float beta_eff = pc == 0 ? beta : 1.0f;
        const mdl_epilogue *last = pc + kb == k ? ep : NULL;
        for (int64_t jc = 0; jc < n; jc += PACKED_NC) {
            const int64_t nc = n - jc < PACKED_NC ? n - jc : PACKED_NC;
            for (int64_t j = 0; j < nc; j += NR)
                pack_b(trans_b, b, ldb, jc + j, pc, nc - j < NR ? (int)(nc - j) : NR, kb,
                       bbuf + j * kb);
            /* each row's tiles in column order, as before the blocking: the same sums */
            for (int64_t i = 0; i < m; i += MR) {
                const int rows = m - i < MR ? (int)(m - i) : MR;
                for (int64_t j = 0; j < nc; j += NR)
                    kernel(rows, kb, pa + pc * mp + i * kb, bbuf + j * kb, c + i * ldc + jc + j,
                           ldc, nc - j < NR ? (int)(nc - j) : NR, beta_eff, last, i);
            }
        }
    }
}

void mdl_sgemm_avx2_packed_rows(int64_t m, int64_t k, const float *pa, const float *b,
                                const int64_t *off, int64_t half, float beta, float *c,
                                int64_t ldc, const mdl_epilogue *ep)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = k - pc < kc ? k - pc : kc;
        const float beta_eff = pc == 0 ? beta : 1.0f;
        const mdl_epilogue *last = pc + kb == k ? ep : NULL;
        for (int64_t i = 0; i < m; i += MR) {
            const int rows = m - i < MR ? (int)(m - i) : MR;
            kernel_at(rows, kb, pa + pc * mp + i * kb, b, off + pc, half, c + i * ldc, ldc, NR,
                      beta_eff, last, i);
        }
    }
}
#endif
