/* gemm_dot.h -- the SGEMM driver for small C and long K with both operands' rows along
 * K, shared by gemm_avx2.c and gemm_avx512.c, which include it (after gemm_blocked.h)
 * once they define
 *
 *   DOT_R          rows of A and of B^T in a tile (3 or 4)
 *   dot_tile(RM, RN, kc, a, lda, b, ldb, part, n)
 *                  part[r * n + q] = the dot product of a's row r and b's row q over
 *                  kc floats, r < RM, q < RN (compile-time constants up to DOT_R)
 *
 * and gives them sgemm() and sgemm_workspace_floats(), which take this driver or
 * gemm_blocked.h's.
 *
 * C (m x n) = alpha * A @ B^T + beta * C with A's rows (m x k) and B^T's rows (n x k)
 * both contiguous in k (op(A) not transposed, op(B) transposed: a convolution's weight
 * gradient, C = dy @ col^T), C small and K long.  The blocked drivers pack both
 * operands every K block and compute a few tiles per pair of barriers; here every
 * element of C is a dot product read in place.  K is cut into chunks (from the shape
 * alone; both operands' rows of a chunk stay in L2), each chunk and block of DOT_R
 * rows is one work item (handed out a chunk's items at a time when there are at least
 * two chunks a thread), a tile of DOT_R x DOT_R dot products keeps a vector of lanes
 * of each and adds them up at the chunk's end into the workspace; then the chunks'
 * partial sums are added in chunk order into C.  Every element is summed in the same
 * order whatever the thread count and wherever the operands lie (the tiles align their
 * loads to B^T's rows and rotate their lanes back; dot_a_rows copies a work item's rows
 * of A where they lie otherwise). */
#ifndef MDL_GEMM_DOT_H
#define MDL_GEMM_DOT_H

#define DOT_L2_FLOATS (192 * 1024) /* a chunk's rows of A and B^T: 768 KiB */
#define DOT_KC_MAX 4096

/* Of the shapes below, those that the blocked driver computes faster swapped, as (B @
 * A^T)^T (swap_shape): B^T with at least four times A's rows and beyond half of L2 (at
 * least 256K floats).  The rows split then loads each element of B once, a broadcast
 * from memory, where the dot products' 4 x 4 tiles load B's rows m / 4 times from L2
 * (2 threads, Intel Xeon, against the dot products: 32 x 288 x 6400 1.6-1.8x, 32 x 150
 * x 6400 1.27x, 28 x 288 x 1024 1.15x; outside these bounds 32 x 100 x 6400 1.18x but
 * 32 x 100 x 16384 0.85x, 32 x 75 x 12288 0.84x, 28 x 288 x 512 0.79x, bench/NOTES.md). */
static int dot_swapped(int64_t m, int64_t n, int64_t k)
{
    return n >= 4 * m && n * k >= 256 * 1024 && swap_shape(m, n, k);
}

/* Where the dot products beat packing (2 threads, against the blocked drivers, AVX-512):
 * C with at most 32 (m + n) elements (16 x 144 x 2000: 1.5x, 64 x 64 x 2000: 1.1x, 128 x
 * 128 x 1000: 1.0x), m + n at most 320 so that a chunk of K is long against the sums at
 * its end (32 x 800 x 2304: 0.87x), K at least 256, but not those above.  On AVX2:
 * 1.8-2.6x in that range, bench/NOTES.md. */
static int dot_shape(int64_t m, int64_t n, int64_t k)
{
    return m + n <= 320 && m * n <= 32 * (m + n) && k >= 256 && !dot_swapped(m, n, k);
}

/* K chunk length: a multiple of 64 floats, 256 to DOT_KC_MAX */
static int64_t dot_chunk(int64_t m, int64_t n)
{
    int64_t kc = DOT_L2_FLOATS / (m + n) / 64 * 64;
    return kc < 256 ? 256 : kc > DOT_KC_MAX ? DOT_KC_MAX : kc;
}

static size_t dot_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    return (size_t)(ceil_div(k, dot_chunk(m, n)) * m * n);
}

/* rows [i0, i0 + rm) of A against all of B^T over K [p0, p0 + kc), into part (m x n) */
static void dot_rows(int64_t rm, int64_t n, int64_t kc, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float *part)
{
#define DOT_CASE(R, Q)                                                        \
    case (R - 1) * DOT_R + Q - 1: dot_tile(R, Q, kc, a, lda, bq, ldb, pq, n); break;
#if DOT_R == 4
#  define DOT_ROW(R) DOT_CASE(R, 1) DOT_CASE(R, 2) DOT_CASE(R, 3) DOT_CASE(R, 4)
#  define DOT_ROWS DOT_ROW(1) DOT_ROW(2) DOT_ROW(3) DOT_ROW(4)
#else
#  define DOT_ROW(R) DOT_CASE(R, 1) DOT_CASE(R, 2) DOT_CASE(R, 3)
#  define DOT_ROWS DOT_ROW(1) DOT_ROW(2) DOT_ROW(3)
#endif
    for (int64_t q0 = 0; q0 < n; q0 += DOT_R) {
        const float *bq = b + q0 * ldb;
        float *pq = part + q0;
        switch ((rm - 1) * DOT_R + min64(n - q0, DOT_R) - 1) {
        DOT_ROWS
        }
    }
#undef DOT_ROWS
#undef DOT_ROW
#undef DOT_CASE
}

/* A work item's rows of A copied to lie as its rows of B^T do (into buf, DOT_A_LD floats
 * apart), when B^T's rows lie alike (ldb a multiple of 16) and A's do not lie as they
 * do: the tiles align their loads to B^T's rows, and A's then load whole lines too
 * (the same values, so the same sums).  Returns the rows to read, at *ld apart. */
#define DOT_A_LD (DOT_KC_MAX + 16)

static const float *dot_a_rows(const float *a, int64_t lda, int64_t rm, int64_t kc,
                               const float *b, int64_t ldb, float *buf, int64_t *ld)
{
    const uintptr_t phase = (uintptr_t)b / sizeof(float) % 16;
    *ld = lda;
    if (ldb % 16 || ((uintptr_t)a / sizeof(float) % 16 == phase && (lda % 16 == 0 || rm == 1)))
        return a;
    float *dst = buf + phase;
    for (int64_t r = 0; r < rm; r++)
        memcpy(dst + r * DOT_A_LD, a + r * lda, (size_t)kc * sizeof(float));
    *ld = DOT_A_LD;
    return dst;
}

static void dot_sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float beta, float *c, int64_t ldc, float *ws)
{
    const int64_t kc = dot_chunk(m, n), nch = ceil_div(k, kc), rb = ceil_div(m, DOT_R);
    int nt = mdl_threads_for((double)m * n * k);
    if (nt > nch * rb) nt = (int)(nch * rb);
    /* with chunks enough for two a thread, whole chunks handed out: a chunk's rows of B^T
     * then come from L3 into one thread's L2, not into each thread's */
    const int64_t piece = nch >= 2 * nt ? rb : 1;

#pragma omp parallel num_threads(nt)
    {
        float abuf[DOT_R * DOT_A_LD] __attribute__((aligned(64)));
#pragma omp for schedule(dynamic, piece)
        for (int64_t item = 0; item < nch * rb; item++) {
            const int64_t ch = item / rb, i0 = item % rb * DOT_R, p0 = ch * kc;
            const int64_t rm = min64(m - i0, DOT_R), kb = min64(k - p0, kc);
            int64_t ld;
            const float *ai = dot_a_rows(a + i0 * lda + p0, lda, rm, kb, b + p0, ldb, abuf, &ld);
            dot_rows(rm, n, kb, ai, ld, b + p0, ldb, ws + ch * m * n + i0 * n);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float s = 0.0f;
                for (int64_t ch = 0; ch < nch; ch++) s += ws[(ch * m + i) * n + j];
                float *cij = c + i * ldc + j;
                *cij = beta == 0.0f ? alpha * s : alpha * s + beta * *cij;
            }
    }
}

/* The workspace of either driver, and the SGEMM that picks one */
static size_t sgemm_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    size_t f = blocked_workspace_floats(m, n, k);
    if (m > 0 && n > 0 && k > 0 && dot_shape(m, n, k)) {
        const size_t d = dot_workspace_floats(m, n, k);
        if (d > f) f = d;
    }
    return f;
}

static void sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                  float *c, int64_t ldc, float *ws)
{
    if (!trans_a && trans_b && dot_shape(m, n, k))
        dot_sgemm(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
    else
        blocked_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
}

#endif
