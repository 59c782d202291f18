/* gemm_blocked.h -- the drivers of the SIMD SGEMMs, shared by gemm_avx2.c and
 * gemm_avx512.c, which include it after defining their tile and block sizes and
 * their pack_a, pack_b and kernel:
 *
 *   MR, NR         rows and columns of a micro-tile
 *   SHORT_K, SHORT_MR
 *                  for K of at most SHORT_K, tiles of at most SHORT_MR rows (below)
 *   KC_MAX         K block (an A micro-panel MR x KC_MAX floats stays in L1)
 *   NG             B micro-panels per column group (NG x NR x KC_MAX floats, in L2)
 *   MC_PANELS, B_PANEL_OUTER
 *                  A micro-panels per row group inside a column group, and which
 *                  of the two micro-panels the inner loop holds still (see below)
 *   MB_MAX, NC_MAX rows of A, columns of B packed per step
 *   ROWS_SPLIT_BLOCK, ROWS_SPLIT_B_MAX, COLS_SPLIT_M, COLS_SPLIT_IN_PLACE_M,
 *   SHARED_IN_PLACE_M, SHARED_IN_PLACE_UNALIGNED_M
 *                  when each driver takes a shape, and when B is read in place
 *   LAZY_B, LAZY_NG
 *                  when no two threads share columns, B is packed a column group of
 *                  LAZY_NG micro-panels at a time: always (LAZY_B 1), or only when K
 *                  is not short and all the rows are one row group (LAZY_B 0; then no
 *                  A micro-panel is read again for the extra column groups)
 *   B_ALIGN        floats in a vector: B read in place by the shared-blocks driver
 *                  needs its rows aligned to it
 *   pack_a(trans_a, a, lda, i0, p0, rows, kc, alpha, dst)   an A micro-panel
 *   pack_b(trans_b, b, ldb, j0, p0, cols, kc, dst)           a B micro-panel
 *   kernel(rows, kc, a, a_ld, b, b_ld, c, ldc, cols, beta)   a C tile, A packed
 *                  (a_ld == 0) or in place (row stride a_ld), B packed (b_ld == 0)
 *                  or in place (row stride b_ld)
 *   kernel_run(rows, kc, a, a_ld, b, b_ld, b_step, np, c, ldc, beta)
 *                  np full-width tiles side by side, B micro-panel q at b + q * b_step
 *   kernel_next(rows, kc, a, a_ld, b, b_ld, c, ldc, beta)
 *                  a full-width tile, B in place, that prefetches the next micro-panel
 *                  (b + NR) into L2
 *
 * C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major.  Three drivers, chosen from
 * the shape (and, for the columns split over a large op(B) below, whether op(B) is
 * transposed); the workspace's size from the shape alone (that case needs none).
 * When a K block of all of op(B) fits in L2 and all of op(B) is
 * small, A is read in place when op(A) is not transposed and alpha is 1 (else
 * packed), and:
 *
 * columns split (cols_split), when C has at most COLS_SPLIT_M rows: each thread
 * takes its own column panels and all the rows, reading op(B) in place (not
 * transposed, at most COLS_SPLIT_IN_PLACE_M rows) or packing its own panels.  No
 * barrier.  Also, op(B) read in place, for C of at most COLS_SPLIT_IN_PLACE_M rows
 * and K of one block however large op(B) is: each B micro-panel then meets every
 * row once and is not needed again, so it need not stay in L2 (2 threads, against the
 * shared blocks: AVX-512 27 x 48128 x 16 with op(A) transposed 1.07-1.09x, 16 x 48128 x
 * 27 1.05-1.07x, 16 x 12288 x 144 1.12x, 16 x 20000 x 384 1.4x; AVX2, which packed B
 * there, 12 x 48128 x 27 2.1x, 8 x 20000 x 100 1.7x, 12 x 20000 x 300 2.0x on 1 thread).
 *
 * rows split (rows_split), otherwise: op(B) is packed whole up front by all the
 * threads together; then each thread takes its own A micro-panels and sweeps all
 * of N with each.  One barrier.
 *
 * shared blocks (blocked_sgemm), otherwise, BLIS-style:
 *
 *   for jc over N in blocks of nc            B panel  (kc x nc) shared
 *     for pc over K in blocks of kc
 *       for ic over M in blocks of mb        A block  (mb x kc) shared
 *         pack B (when ic == 0; not when it is read in place: C of at most
 *           SHARED_IN_PLACE_M rows, B's rows aligned, or of at most
 *           SHARED_IN_PLACE_UNALIGNED_M rows, B anywhere; nor when each thread has
 *           columns, or rows, of its own: then a group at a time below, each
 *           thread its own copy when it has all the columns) and A, cooperatively;
 *           barrier (none when nothing packed is shared)
 *         each thread: its rows x its columns of the block, in column groups
 *           of NG micro-panels (L2; packed just before use, for each ic, when the
 *           columns are the thread's alone) and row groups of MC_PANELS; inside,
 *           one A micro-panel (L1) meets each B micro-panel in turn, or, with
 *           B_PANEL_OUTER, one B micro-panel (L1) each A micro-panel (the AVX2
 *           tile loads more of B than of A per step)
 *         barrier (with nothing packed shared, only between blocks of rows)
 *
 * Packed A holds alpha * op(A) in micro-panels of MR rows (p-major, rows padded
 * with zeros); packed B holds op(B) in micro-panels of NR columns (p-major,
 * columns padded with zeros).  The first K block applies beta (beta == 0 stores
 * without reading C), later ones add, so every element of C is summed in the
 * same order whatever the thread count. */
#ifndef MDL_GEMM_BLOCKED_H
#define MDL_GEMM_BLOCKED_H

/* A micro-panels of C's rows in cols_split: MR rows each, or tile_rows(k) for K of
 * at most SHORT_K with op(B) packed a chunk at a time */
#define COLS_SPLIT_PANELS ((COLS_SPLIT_M + MR - 1) / MR)
#define COLS_SPLIT_SHORT_PANELS ((COLS_SPLIT_M + SHORT_MR - 1) / SHORT_MR)

typedef struct blocking {
    int64_t kc, mb, nc; /* block sizes (mb multiple of MR, nc multiple of NR) */
} blocking;

/* Rows of C's tiles, at most.  With few steps of K, a tile's stores of C decide its
 * speed; when C's rows lie a multiple of 4 KiB apart (a convolution's columns, N = a
 * chunk of images x H x W) every row of a tile falls in the same L1 set, and more rows
 * than its ways evict each other's lines before the stores reach them: a tile of at
 * most SHORT_MR rows (the ways) then writes C at full speed. */
static int64_t tile_rows(int64_t k) { return k <= SHORT_K ? SHORT_MR : MR; }

/* Blocks of nearly equal size no larger than the maxima. */
static blocking plan_blocks(int64_t m, int64_t n, int64_t k)
{
    blocking bl;
    bl.kc = ceil_div(k, ceil_div(k, KC_MAX));
    bl.mb = round_up(ceil_div(m, ceil_div(m, MB_MAX)), MR);
    bl.nc = round_up(ceil_div(n, ceil_div(n, NC_MAX)), NR);
    return bl;
}

/* Which driver a shape takes (from the shape alone, so that the workspace does not
 * depend on the thread count). */
enum { SHARED_BLOCKS, ROWS_SPLIT, COLS_SPLIT };

static int plan_driver(int64_t m, int64_t n, int64_t k, const blocking *bl)
{
    const int64_t nw = round_up(n, NR);
    if (bl->kc * nw > ROWS_SPLIT_BLOCK || k * nw > ROWS_SPLIT_B_MAX) return SHARED_BLOCKS;
    return m <= COLS_SPLIT_M ? COLS_SPLIT : ROWS_SPLIT;
}

/* C = A @ B^T (op(A) not transposed, op(B) transposed: rows of both along K, as in a
 * convolution's weight gradient) with fewer rows than columns and K long is computed
 * as T = B @ A^T, then C = T^T: the rows split then reads B, the large operand, in
 * place and packs the small A, where the product as given would transpose all of B
 * into micro-panels that meet few rows of A each (2 threads, AVX-512: 32 x 800 x 2304
 * and 64 x 576 x 3264 1.2-1.27x).  T (n x m) goes first in the workspace.  The shape
 * alone decides, as the workspace's size takes no transpositions. */
#define SWAP_K_MIN 256

static int swap_shape(int64_t m, int64_t n, int64_t k)
{
    /* A^T's micro-panels of NR columns, padded by at most an eighth of one */
    if (m >= n || k < SWAP_K_MIN || round_up(m, NR) - m > NR / 8) return 0;
    const blocking bl = plan_blocks(n, m, k);
    return plan_driver(n, m, k, &bl) == ROWS_SPLIT;
}

/* Short K (a tile's stores decide its speed) with C's rows starting inside a line, all at
 * the same offset (ldc a multiple of 16 floats): C's columns up to the first line
 * boundary go first, a product of their own, so that the rest stores whole lines.  The
 * number of those columns, or 0. */
#define HEAD_MIN_N (16 * NR)

static int64_t head_columns(const float *c, int64_t ldc, int64_t n, int64_t k)
{
    const uintptr_t off = (uintptr_t)c % 64;
    if (k > SHORT_K || n < HEAD_MIN_N || ldc % 16 || off == 0 || off % 4) return 0;
    return (int64_t)(64 - off) / 4;
}

static size_t one_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    blocking bl = plan_blocks(m, n, k);
    size_t f;
    if (plan_driver(m, n, k, &bl) != SHARED_BLOCKS)
        f = (size_t)(k * round_up(n, NR));
    else /* B panel first: its size is a multiple of NR floats, so A stays aligned */
        f = (size_t)(bl.kc * bl.nc + ceil_div(bl.mb, tile_rows(k)) * MR * bl.kc);
    if (swap_shape(m, n, k)) { /* T, a multiple of 16 floats, then the swapped product's */
        const size_t s = (size_t)round_up(m * n, 16) + one_workspace_floats(n, m, k);
        if (s > f) f = s;
    }
    return f;
}

/* The blocked drivers' workspace: one product's, or either part's of head_columns's
 * split, whichever the address of C asks for */
static size_t blocked_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    size_t f = one_workspace_floats(m, n, k);
    if (k <= SHORT_K && n >= HEAD_MIN_N)
        for (int64_t h = 1; h < 16; h++) {
            const size_t head = one_workspace_floats(m, h, k);
            const size_t rest = one_workspace_floats(m, n - h, k);
            if (head > f) f = head;
            if (rest > f) f = rest;
        }
    return f;
}

/* `panels` micro-panels of op(B)'s columns from j0 (ncols columns left there), K rows
 * [p0, p0 + kc), at dst + q * NR * kc.  Not transposed, whole panels PACK_B_CHUNK at
 * a time, row by row: each row of B gives a run of PACK_B_CHUNK * NR floats.  One
 * panel at a time, a leading dimension of a multiple of 1 KiB puts every row's
 * NR floats in the same L1 set, which holds 8 of the kc lines and evicts the next
 * line's prefetch (27 x 1024, ldb 1024: 4.9 us against 3.0 in chunks of 4 panels
 * and 2.3 at ldb 1040). */
#define PACK_B_CHUNK 4
static void pack_b_panels(int trans_b, const float *b, int64_t ldb, int64_t j0, int64_t p0,
                          int64_t panels, int64_t ncols, int64_t kc, float *restrict dst)
{
    const int64_t whole = trans_b ? 0 : min64(panels, ncols / NR);
    for (int64_t q0 = 0; q0 < whole; q0 += PACK_B_CHUNK) {
        const int64_t q1 = min64(q0 + PACK_B_CHUNK, whole);
        for (int64_t p = 0; p < kc; p++) {
            const float *src = b + (p0 + p) * ldb + j0;
            for (int64_t q = q0; q < q1; q++)
                memcpy(dst + q * NR * kc + p * NR, src + q * NR, NR * sizeof(float));
        }
    }
    for (int64_t q = whole; q < panels; q++)
        pack_b(trans_b, b, ldb, j0 + q * NR, p0, (int)min64(ncols - q * NR, NR), kc,
               dst + q * NR * kc);
}

/* ---- drivers ------------------------------------------------------------------ */

/* How cols_split reads op(B): packed whole into the workspace, in place, or (K of at
 * most SHORT_K) packed PACK_B_CHUNK micro-panels at a time into a buffer of the
 * thread's, with tiles of tile_rows(k) rows */
enum { COLS_B_PACKED, COLS_B_IN_PLACE, COLS_B_CHUNKS };

_Static_assert(COLS_SPLIT_SHORT_PANELS * SHORT_K <= COLS_SPLIT_PANELS * KC_MAX,
               "cols_split's A panels for short K fit its buffer");

/* Columns split: each thread takes its own column panels of C and all its rows
 * (at most COLS_SPLIT_PANELS A micro-panels, packed per K block unless read in
 * place) and, K block by K block, reads op(B) in place or packs its own panels,
 * PACK_B_CHUNK at a time; each B micro-panel meets every A micro-panel while it is
 * in L1.  Every element of B is read by one thread and there is no barrier (2
 * threads, 16 x 1024 x 27, against each thread's own rows: AVX-512 with B in place
 * 1.12x, AVX2 packing 1.63x). */
static void cols_split(int b_mode, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                       float beta, float *c, int64_t ldc, int64_t kc, float *bpack)
{
    const int64_t npan = ceil_div(n, NR);
    const int64_t mpan = ceil_div(m, b_mode == COLS_B_CHUNKS ? tile_rows(k) : MR);
    const int in_place = b_mode == COLS_B_IN_PLACE;
    /* with a single fork and join, two threads pay from about 128K multiply-adds */
    int nt = mdl_threads_for((double)m * n * k / 2.0);
    if (nt > npan) nt = (int)npan;
    const int a_in = !trans_a && alpha == 1.0f;
    const int64_t a_ld = a_in ? lda : 0;

#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        /* A micro-panel pr at apanel + pr * MR * kb */
        float apanel[COLS_SPLIT_PANELS * MR * KC_MAX] __attribute__((aligned(64)));
        float bchunk[PACK_B_CHUNK * NR * SHORT_K] __attribute__((aligned(64)));
        const float *ap[COLS_SPLIT_SHORT_PANELS];
        /* rows spread evenly over the panels: panel pr is rows [i0[pr], i0[pr + 1]) */
        int64_t i0[COLS_SPLIT_SHORT_PANELS + 1];
        for (int64_t pr = 0; pr <= mpan; pr++) i0[pr] = pr * m / mpan;
        const int64_t q0 = npan * t / T, q1 = npan * (t + 1) / T;
        for (int64_t pc = 0; pc < k; pc += kc) {
            const int64_t kb = min64(k - pc, kc);
            const float beta_eff = pc == 0 ? beta : 1.0f;
            for (int64_t pr = 0; pr < mpan; pr++) {
                if (!a_in)
                    pack_a(trans_a, a, lda, i0[pr], pc, (int)(i0[pr + 1] - i0[pr]), kb, alpha,
                           apanel + pr * MR * kb);
                ap[pr] = a_in ? a + i0[pr] * lda + pc : apanel + pr * MR * kb;
            }
            for (int64_t qc = q0; qc < q1; qc += PACK_B_CHUNK) {
                const int64_t qc1 = min64(qc + PACK_B_CHUNK, q1);
                if (in_place) { /* B micro-panel q at b + pc * ldb + q * NR, row stride ldb;
                                 * the first row panel's tile fetches my next one */
                    for (int64_t q = qc; q < qc1; q++)
                        for (int64_t pr = 0; pr < mpan; pr++) {
                            const int rows = (int)(i0[pr + 1] - i0[pr]);
                            const float *bq = b + pc * ldb + q * NR;
                            float *cq = c + i0[pr] * ldc + q * NR;
                            if (pr == 0 && q + 1 < q1 && (q + 1) * NR <= n)
                                kernel_next(rows, kb, ap[pr], a_ld, bq, ldb, cq, ldc, beta_eff);
                            else
                                kernel(rows, kb, ap[pr], a_ld, bq, ldb, cq, ldc,
                                       (int)min64(n - q * NR, NR), beta_eff);
                        }
                    continue;
                }
                /* B packed, micro-panel q at bq + (q - qc) * NR * kb; each A micro-panel
                 * against the chunk's panels in turn, full-width ones in one run (27 x 48128
                 * x 16, op(A) transposed, 2 threads: 1.04-1.09x) */
                float *const bq = b_mode == COLS_B_CHUNKS ? bchunk
                                : bpack + pc * npan * NR + qc * NR * kb;
                pack_b_panels(trans_b, b, ldb, qc * NR, pc, qc1 - qc, n - qc * NR, kb, bq);
                const int64_t full = min64(qc1, n / NR) - qc;
                for (int64_t pr = 0; pr < mpan; pr++) {
                    const int rows = (int)(i0[pr + 1] - i0[pr]);
                    float *const cr = c + i0[pr] * ldc + qc * NR;
                    if (full > 0)
                        kernel_run(rows, kb, ap[pr], a_ld, bq, 0, NR * kb, full, cr, ldc, beta_eff);
                    if (full < qc1 - qc)
                        kernel(rows, kb, ap[pr], a_ld, bq + (qc1 - qc - 1) * NR * kb, 0,
                               cr + (qc1 - qc - 1) * NR, ldc, (int)(n - (qc1 - 1) * NR), beta_eff);
                }
            }
        }
    }
}

/* Rows split: op(B) is packed whole (every K block, one after the other, kc x nw
 * each) by all threads together; then each thread takes its own row panels of C
 * and, K block by K block, packs one A micro-panel at a time into its own buffer
 * and sweeps all of N with it.  One barrier, against two per K block in the
 * shared-blocks driver: for thin problems, whose work between barriers is short. */
static void rows_split(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc, int64_t kc, float *bpack)
{
    const int64_t npan = ceil_div(n, NR), nkb = ceil_div(k, kc);
    /* with a single fork and join, two threads pay from about 128K multiply-adds */
    int nt = mdl_threads_for((double)m * n * k / 2.0);
    if (nt > m) nt = (int)m;
    /* row panels: a multiple of the thread count, rows spread evenly over them (panel
     * pr is rows [pr * m / mpan, (pr + 1) * m / mpan)) */
    const int64_t mpan = round_up(ceil_div(m, tile_rows(k)), nt);
    /* A read in place: each micro-panel of A meets only ceil(n / NR) micro-panels of
     * B, too few to repay packing it (256 x 64 x 2304: 1.13x) */
    const int a_in = !trans_a && alpha == 1.0f;
    const int64_t a_ld = a_in ? lda : 0;

#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        const int64_t nch = ceil_div(npan, PACK_B_CHUNK);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < nkb * nch; i++) {
            const int64_t pc = i / nch * kc, q = i % nch * PACK_B_CHUNK, kb = min64(k - pc, kc);
            pack_b_panels(trans_b, b, ldb, q * NR, pc, min64(npan - q, PACK_B_CHUNK), n - q * NR,
                          kb, bpack + pc * npan * NR + q * NR * kb);
        }
        float apanel[MR * KC_MAX] __attribute__((aligned(64)));
        const int64_t r0 = mpan * t / T, r1 = mpan * (t + 1) / T;
        for (int64_t pc = 0; pc < k; pc += kc) {
            const int64_t kb = min64(k - pc, kc);
            const float beta_eff = pc == 0 ? beta : 1.0f;
            for (int64_t pr = r0; pr < r1; pr++) {
                const int64_t i0 = pr * m / mpan;
                const int rows = (int)((pr + 1) * m / mpan - i0);
                if (!a_in) pack_a(trans_a, a, lda, i0, pc, rows, kb, alpha, apanel);
                const float *ap = a_in ? a + i0 * lda + pc : apanel;
                float *crow = c + i0 * ldc;
                const float *bk = bpack + pc * npan * NR;
                if (n / NR) /* the full-width tiles in one run, then the last one's edge */
                    kernel_run(rows, kb, ap, a_ld, bk, 0, NR * kb, n / NR, crow, ldc, beta_eff);
                if (n % NR)
                    kernel(rows, kb, ap, a_ld, bk + n / NR * NR * kb, 0, crow + n / NR * NR, ldc,
                           (int)(n % NR), beta_eff);
            }
        }
    }
}

static void blocked_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc, float *ws)
{
    const int64_t head = head_columns(c, ldc, n, k);
    if (head) { /* see head_columns */
        blocked_sgemm(trans_a, trans_b, m, head, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
        blocked_sgemm(trans_a, trans_b, m, n - head, k, alpha, a, lda,
                      trans_b ? b + head * ldb : b + head, ldb, beta, c + head, ldc, ws);
        return;
    }
    if (!trans_a && trans_b && swap_shape(m, n, k)) { /* see swap_shape */
        float *const t = ws;
        blocked_sgemm(0, 1, n, m, k, alpha, b, ldb, a, lda, 0.0f, t, m, ws + round_up(m * n, 16));
        /* C = T^T + beta C, 16 rows of T (16 lines, in L1) against every row of C */
        const int64_t nb = ceil_div(n, 16);
        const int nt = mdl_threads_for((double)m * n);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t jb = 0; jb < nb; jb++)
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = jb * 16; j < min64(jb * 16 + 16, n); j++) {
                    float *cij = c + i * ldc + j;
                    *cij = beta == 0.0f ? t[j * m + i] : t[j * m + i] + beta * *cij;
                }
        return;
    }
    const blocking bl = plan_blocks(m, n, k);
    const int driver = plan_driver(m, n, k, &bl);
    if (driver == COLS_SPLIT) {
        cols_split(!trans_b && m <= COLS_SPLIT_IN_PLACE_M ? COLS_B_IN_PLACE : COLS_B_PACKED,
                   trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bl.kc, ws);
        return;
    }
    if (driver == ROWS_SPLIT) {
        rows_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, bl.kc, ws);
        return;
    }
    if (!trans_b && m <= COLS_SPLIT_IN_PLACE_M && k <= KC_MAX) { /* see the top */
        /* short K with tiles taller than SHORT_MR: B packed a chunk at a time, and tiles of
         * SHORT_MR rows (27 x 48128 x 16 with op(A) transposed, 2 threads, 1.14-1.16x) */
        const int chunks = k <= SHORT_K && ceil_div(m, ceil_div(m, MR)) > SHORT_MR;
        cols_split(chunks ? COLS_B_CHUNKS : COLS_B_IN_PLACE, trans_a, trans_b, m, n, k, alpha, a,
                   lda, b, ldb, beta, c, ldc, bl.kc, ws);
        return;
    }
    float *const bpack = ws;
    float *const apack = ws + bl.kc * bl.nc;
    const int b_aligned = (uintptr_t)b % (4 * B_ALIGN) == 0 && ldb % B_ALIGN == 0;
    const int b_in_place = !trans_b && (m <= SHARED_IN_PLACE_UNALIGNED_M ||
                                        (m <= SHARED_IN_PLACE_M && b_aligned));
    const int64_t mt = ceil_div(min64(bl.mb, m), tile_rows(k));
    const int64_t ntl = ceil_div(min64(bl.nc, n), NR);
    /* one thread below ~0.5M multiply-adds; never more threads than tiles */
    int nt = mdl_threads_for((double)m * n * k / 8.0);
    if (nt > mt * ntl) nt = (int)(mt * ntl);

#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        int tm = 1, tn = 1;
        mdl_gemm_grid(T, mt, ntl, &tm, &tn);
        const int ti = t / tn, tj = t % tn;
        /* when no other thread shares my columns, B is packed a column group at a
         * time, just before its kernels, into the start of my share of the B buffer,
         * where it stays in L2 (128 x 4096 x 1152: 1.07x).  When no other thread shares
         * my rows, I pack each of B's column groups myself, in the same way, into NG
         * micro-panels of the B buffer of my own: every thread then packs all of B, but
         * nothing is shared save the lines of C's rows, and no thread waits for another
         * within a block of rows (shared, each thread packed half of B over lines that
         * the other core had just read, an invalidation each, then waited for it: 2
         * threads, 1024^3 1.1x).  Not for short K, whose column groups may be larger. */
        const int own_b = tn == 1 && tm > 1 && !b_in_place && k > SHORT_K && T * NG * NR <= bl.nc;
        const int one_row_group = k > SHORT_K && ceil_div(min64(m, bl.mb), MR) <= MC_PANELS;
        const int lazy_b = (tm == 1 && !b_in_place && (LAZY_B || one_row_group)) || own_b;

        for (int64_t jc = 0; jc < n; jc += bl.nc) {
            const int64_t nb = min64(n - jc, bl.nc);
            const int64_t npan = ceil_div(nb, NR);
            const int64_t c0 = npan * tj / tn, c1 = npan * (tj + 1) / tn;
            float *const bgroup = bpack + (own_b ? t * NG : c0) * NR * min64(k, bl.kc);
            for (int64_t pc = 0; pc < k; pc += bl.kc) {
                const int64_t kb = min64(k - pc, bl.kc);
                const float beta_eff = pc == 0 ? beta : 1.0f;
                for (int64_t ic = 0; ic < m; ic += bl.mb) {
                    const int64_t mbk = min64(m - ic, bl.mb);
                    /* rows spread evenly over the panels (16 rows: 8 + 8, not 14 + 2): a
                     * tile of few rows does few FMAs per load of B */
                    const int64_t mpan = ceil_div(mbk, tile_rows(k)), h = ceil_div(mbk, mpan);
                    const int64_t r0 = mpan * ti / tm, r1 = mpan * (ti + 1) / tm;

                    /* pack: my column panels are shared with the tm threads of my
                     * grid column, my row panels with the tn threads of my row */
                    if (ic == 0 && !b_in_place && !lazy_b) {
                        int64_t lo = c0 + (c1 - c0) * ti / tm, hi = c0 + (c1 - c0) * (ti + 1) / tm;
                        pack_b_panels(trans_b, b, ldb, jc + lo * NR, pc, hi - lo, nb - lo * NR, kb,
                                      bpack + lo * NR * kb);
                    }
                    {
                        int64_t lo = r0 + (r1 - r0) * tj / tn, hi = r0 + (r1 - r0) * (tj + 1) / tn;
                        for (int64_t q = lo; q < hi; q++)
                            pack_a(trans_a, a, lda, ic + q * h, pc, (int)min64(mbk - q * h, h),
                                   kb, alpha, apack + q * MR * bl.kc);
                    }
                    if (!own_b) {
#pragma omp barrier
                    }
                    /* my rows [r0, r1) x columns [c0, c1): column groups of NG
                     * micro-panels (L2), in each, row groups of MC_PANELS A
                     * micro-panels; in those, one A micro-panel (L1) against each B
                     * micro-panel in turn, or with B_PANEL_OUTER one B micro-panel
                     * (L1) against each A micro-panel (L2) */
                    /* short K: my share of the block in one column group when its B
                     * micro-panels fit in 128 KiB, so that an A micro-panel meets them all
                     * in one run and C is written a row panel's full width at a time
                     * (144 x 12288 x 16 with op(A) transposed, 2 threads: 1.07-1.14x; K = 32,
                     * 200-256 KiB of B, lost 11-16% in the machine's slow phases) */
                    const int64_t ng = kb <= SHORT_K && (c1 - c0) * NR * kb <= 32 * 1024
                                           ? c1 - c0 : lazy_b ? LAZY_NG : NG;
                    for (int64_t cg = c0; cg < c1; cg += ng) {
                        const int64_t cg1 = min64(cg + ng, c1);
                        if (lazy_b)
                            pack_b_panels(trans_b, b, ldb, jc + cg * NR, pc, cg1 - cg,
                                          nb - cg * NR, kb, bgroup);
                        /* the group's B micro-panel q at bg + (q - cg) * b_step, row
                         * stride b_ld (0: packed) */
                        const float *const bg = b_in_place ? b + pc * ldb + jc + cg * NR
                                              : lazy_b ? bgroup : bpack + cg * NR * kb;
                        const int64_t b_ld = b_in_place ? ldb : 0;
                        const int64_t b_step = b_in_place ? NR : NR * kb;
                        /* without B_PANEL_OUTER, an A micro-panel meets the group's
                         * full-width B micro-panels [cg, cf) in one run (144 x 12288 x 16,
                         * op(A) transposed, 2 threads: 1.01-1.03x) */
                        int64_t cf = cg;
                        if (!B_PANEL_OUTER && nb / NR > cg) cf = min64(cg1, nb / NR);
                        for (int64_t rg = r0; rg < r1; rg += MC_PANELS) {
                            const int64_t rg1 = min64(rg + MC_PANELS, r1);
                            const int64_t outer = B_PANEL_OUTER ? cg1 - cg : rg1 - rg;
                            const int64_t inner = B_PANEL_OUTER ? rg1 - rg : cg1 - cf;
                            for (int64_t o = 0; o < outer; o++) {
                                if (cf > cg) {
                                    const int64_t pr = rg + o;
                                    kernel_run((int)min64(mbk - pr * h, h), kb,
                                               apack + pr * MR * bl.kc, 0, bg, b_ld, b_step, cf - cg,
                                               c + (ic + pr * h) * ldc + jc + cg * NR, ldc,
                                               beta_eff);
                                }
                                for (int64_t in = 0; in < inner; in++) {
                                    const int64_t q = B_PANEL_OUTER ? cg + o : cf + in;
                                    const int64_t pr = rg + (B_PANEL_OUTER ? in : o);
                                    kernel((int)min64(mbk - pr * h, h), kb, apack + pr * MR * bl.kc,
                                           0, bg + (q - cg) * b_step, b_ld,
                                           c + (ic + pr * h) * ldc + jc + q * NR, ldc,
                                           (int)min64(nb - q * NR, NR), beta_eff);
                                }
                            }
                        }
                    }
                    /* with own_b: a block of rows of another size splits its panels
                     * between the threads differently, so a thread may pack the A
                     * micro-panels another is still reading (A micro-panel q stays at
                     * apack + q * MR * kc from one K block to the next) */
                    if (!own_b || m > bl.mb) {
#pragma omp barrier
                    }
                }
            }
        }
    }
}

#endif
