/* gemm.cuh -- internal: the tiled SGEMM that every GEMM-shaped kernel runs on
 * (plain SGEMM, linear, and convolution as implicit GEMM).
 *
 * A "problem" P says what C (M, N) = sum over k of A(i, k) * B(k, j) means:
 *
 *     int M, N, K;      sizes, each below MDL_GEMM_LIMIT (checked by the callers)
 *     int kchunk;       split-K: grid slice z sums k in [z * kchunk, min(K, (z+1) * kchunk))
 *     static constexpr bool A_K_FAST;   consecutive k of A are adjacent in memory
 *     static constexpr bool B_K_FAST;   consecutive k of B are adjacent in memory
 *     __device__ float a(int i, int k) const;              i < M, k < K
 *     using BFixed = ...;  __device__ BFixed b_fixed(int f) const;
 *     __device__ float b(const BFixed &, int v, int slot, const Shared &, bool &read) const;
 *     __device__ float b_stage(float v, bool read, int slot, const Shared &) const;
 *     __device__ void store(int i, int j, float acc, int z) const;   i < M, j < N
 *     static constexpr bool ROW_STATS;  with it, store() returns the value it stored and
 *     __device__ void row_stats(int t, int i, double sum, double sumsq) const;
 *                       gets the sum and the sum of squares of those values in row i of
 *                       the block's tile, t = the tile's column (blockIdx.x % tiles_n)
 *     struct Shared;  __device__ void setup(Shared &, int j0) const;
 *                     __device__ void slice(Shared &, int kt, int buf) const;
 *
 * a() and b() gather an element (an im2col entry, zero in the padding, for the
 * convolutions), store() is the epilogue (alpha/beta, bias, accumulate, or a
 * split-K partial).  Each thread reads B at one k per slice (B_K_FAST) or at one
 * column j throughout (otherwise): b_fixed(f) is computed once for that fixed
 * index f, and b() gets it with the index that varies, v (j < N with B_K_FAST,
 * else a k of the block's range), and v's slot in the problem's tables in shared
 * memory (Shared): setup() fills those of the block's columns j0.. (every thread
 * calls it, a barrier follows), slice() those of the slice at kt into buffer buf
 * (0 or 1 in turn), before the barrier that precedes their reads.  A slot is the
 * column in the tile with B_K_FAST, else the row in the slice plus MDL_GEMM_BK * buf.
 * b() sets `read` where it read memory (not a zero of the padding); what it
 * returned passes through b_stage() (a map of the values read, say) when it is
 * staged in shared memory, after the slice before it was multiplied: whatever
 * uses a loaded value waits for the load, and here that wait is hidden.
 *
 * With ROW_STATS, each thread adds up what it stored of each of its rows, the threads
 * of a row add their sums in a fixed tree of warp shuffles (the TX threads of a row lie
 * in one warp), and the first gives row_stats() the tile's: a per-channel statistic of
 * a convolution's output, taken while the tile is in registers (BatchNorm's, fused).
 * In double, as on the CPU: a variance from float sums lost up to a fifth of itself
 * where the mean was a thousand times the spread.
 *
 * The kernel tiles C in BM x BN blocks, steps through k in
 * slices of BK staged in shared memory (the next slice is fetched into registers
 * while the current one is multiplied), and each thread keeps a TM x TN block of
 * C in registers, as two-by-two groups of 4 rows and 4 columns spread over the
 * tile so that the float4 reads of shared memory are free of bank conflicts. */
#ifndef MDL_CUDA_GEMM_CUH
#define MDL_CUDA_GEMM_CUH

#include "common.cuh"

/* Every GEMM dimension (and every image index the convolutions compute) stays below this. */
#define MDL_GEMM_LIMIT ((int64_t)1 << 30)
/* The k of a slice (every tile shape); its multiples are where split-K slices begin. */
#define MDL_GEMM_BK 8
/* The widest tile's columns (the tables of setup() hold as many). */
#define MDL_GEMM_BN_MAX 128

namespace mdl {

template <int BM, int BN, int BK, int TM, int TN, class P>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
gemm_tiled(const P p, int tiles_n)
{
    /* C (M, N): block b computes the tile (b / tiles_n, b % tiles_n) of BM x BN, k slice blockIdx.y */
    constexpr int TX = BN / TN, TY = BM / TM, THREADS = TX * TY;
    constexpr int LA = BM * BK / THREADS, LB = BK * BN / THREADS;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "thread blocks are groups of 4 x 4");
    static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0, "even tile loads");
    static_assert(THREADS % BK == 0 && THREADS % BN == 0, "a thread's k in a slice (B_K_FAST) "
                  "or its column (otherwise) is the same for all its elements");
    static_assert(BK == MDL_GEMM_BK && BN <= MDL_GEMM_BN_MAX, "the tables' sizes");
    __shared__ __align__(16) float As[BK][BM + 4]; /* +4: no bank conflicts on the k-fast stores */
    __shared__ __align__(16) float Bs[BK][BN + 4];
    __shared__ typename P::Shared tables;

    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int i0 = (int)(blockIdx.x / (unsigned)tiles_n) * BM;
    const int j0 = (int)(blockIdx.x % (unsigned)tiles_n) * BN;
    const int k_begin = (int)blockIdx.y * p.kchunk;
    const int k_end = min(p.K, k_begin + p.kchunk);

    /* element e of this thread's share of a tile: (row or column in the tile, k in the slice) */
    auto a_pos = [&](int e, int &ii, int &kk) {
        const int idx = tid + e * THREADS;
        if constexpr (P::A_K_FAST) { kk = idx % BK; ii = idx / BK; } else { ii = idx % BM; kk = idx / BM; }
    };
    auto b_pos = [&](int e, int &jj, int &kk) {
        const int idx = tid + e * THREADS;
        if constexpr (P::B_K_FAST) { kk = idx % BK; jj = idx / BK; } else { jj = idx % BN; kk = idx / BN; }
    };
    /* B's fixed index: the column, once (the k of a slice, B_K_FAST: in fetch) */
    typename P::BFixed b_col{};
    if constexpr (!P::B_K_FAST) b_col = p.b_fixed(j0 + tid % BN);

    float ra[LA], rb[LB];
    unsigned rb_read = 0; /* bit e: b() read rb[e] */
    auto fetch = [&](int kt, int buf) {
#pragma unroll
        for (int e = 0; e < LA; e++) {
            int ii, kk;
            a_pos(e, ii, kk);
            const int gi = i0 + ii, gk = kt + kk;
            ra[e] = (gi < p.M && gk < k_end) ? p.a(gi, gk) : 0.0f;
        }
        typename P::BFixed b_row{};
        if constexpr (P::B_K_FAST) b_row = p.b_fixed(kt + tid % BK);
        rb_read = 0;
#pragma unroll
        for (int e = 0; e < LB; e++) {
            int jj, kk;
            b_pos(e, jj, kk);
            const int gj = j0 + jj, gk = kt + kk;
            bool read = false;
            const bool in = gj < p.N && gk < k_end;
            if constexpr (P::B_K_FAST)
                rb[e] = in ? p.b(b_row, gj, jj, tables, read) : 0.0f;
            else
                rb[e] = in ? p.b(b_col, gk, kk + BK * buf, tables, read) : 0.0f;
            rb_read |= (unsigned)read << e;
        }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;

    p.setup(tables, j0);
    p.slice(tables, k_begin, 0);
    __syncthreads();
    if (k_begin < k_end) fetch(k_begin, 0);
    for (int kt = k_begin, buf = 0; kt < k_end; kt += BK, buf ^= 1) {
#pragma unroll
        for (int e = 0; e < LA; e++) {
            int ii, kk;
            a_pos(e, ii, kk);
            As[kk][ii] = ra[e];
        }
#pragma unroll
        for (int e = 0; e < LB; e++) {
            int jj, kk;
            b_pos(e, jj, kk);
            const int slot = P::B_K_FAST ? jj : kk + BK * buf;
            Bs[kk][jj] = p.b_stage(rb[e], (rb_read >> e) & 1u, slot, tables);
        }
        /* the buffer's last reads, by fetch(kt - BK), were two barriers ago */
        if (kt + BK < k_end) p.slice(tables, kt + BK, buf ^ 1);
        __syncthreads();
        if (kt + BK < k_end) fetch(kt + BK, buf ^ 1); /* in flight while this slice is multiplied */
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            float av[TM], bv[TN];
#pragma unroll
            for (int g = 0; g < TM / 4; g++) {
                const float4 t = *reinterpret_cast<const float4 *>(&As[kk][g * 4 * TY + ty * 4]);
                av[4 * g] = t.x; av[4 * g + 1] = t.y; av[4 * g + 2] = t.z; av[4 * g + 3] = t.w;
            }
#pragma unroll
            for (int g = 0; g < TN / 4; g++) {
                const float4 t = *reinterpret_cast<const float4 *>(&Bs[kk][g * 4 * TX + tx * 4]);
                bv[4 * g] = t.x; bv[4 * g + 1] = t.y; bv[4 * g + 2] = t.z; bv[4 * g + 3] = t.w;
            }
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads(); /* before the next slice overwrites As and Bs */
    }

    /* the row of C of this thread's row i */
    auto row = [&](int i) { return i0 + (i / 4) * 4 * TY + ty * 4 + i % 4; };
    double rs[TM], rq[TM]; /* ROW_STATS: this thread's sums of what it stored, by row */
#pragma unroll
    for (int i = 0; i < TM; i++) {
        rs[i] = rq[i] = 0.0;
        const int gi = row(i);
        if (gi >= p.M) continue;
#pragma unroll
        for (int j = 0; j < TN; j++) {
            const int gj = j0 + (j / 4) * 4 * TX + tx * 4 + j % 4;
            if (gj >= p.N) continue;
            if constexpr (P::ROW_STATS) {
                const double v = p.store(gi, gj, acc[i][j], (int)blockIdx.y);
                rs[i] += v;
                rq[i] = fma(v, v, rq[i]);
            } else {
                p.store(gi, gj, acc[i][j], (int)blockIdx.y);
            }
        }
    }
    if constexpr (P::ROW_STATS) {
        static_assert(32 % TX == 0, "a row's threads lie in one warp");
#pragma unroll
        for (int i = 0; i < TM; i++) {
#pragma unroll
            for (int off = TX / 2; off > 0; off >>= 1) {
                rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], off);
                rq[i] += __shfl_xor_sync(0xffffffffu, rq[i], off);
            }
            if (tx == 0 && row(i) < p.M)
                p.row_stats((int)(blockIdx.x % (unsigned)tiles_n), row(i), rs[i], rq[i]);
        }
    }
}

/* The members of a problem that keeps no tables. */
#define MDL_GEMM_NO_TABLES                                                     \
    struct Shared {};                                                          \
    __device__ void setup(Shared &, int) const {}                              \
    __device__ void slice(Shared &, int, int) const {}                         \
    __device__ float b_stage(float v, bool, int, const Shared &) const { return v; }

/* The tile shapes, chosen on the host from the problem size. */
enum gemm_cfg { GEMM_M32 = 0, GEMM_64 = 1, GEMM_128 = 2, GEMM_M16 = 3 };

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* M <= 16 or 32 (few output channels, small batches): 16 or 32 x 128 tiles; enough
 * 128 x 128 tiles to fill the GPU twice over: those; otherwise 64 x 64. */
static inline gemm_cfg gemm_pick(int64_t M, int64_t N)
{
    if (M <= 16) return GEMM_M16;
    if (M <= 32) return GEMM_M32;
    if (cdiv(M, 128) * cdiv(N, 128) >= 256) return GEMM_128;
    return GEMM_64;
}

/* A tile's rows and columns for each shape (gemm_launch's template arguments) */
static inline int64_t gemm_bm(gemm_cfg cfg)
{
    return cfg == GEMM_M16 ? 16 : cfg == GEMM_M32 ? 32 : cfg == GEMM_128 ? 128 : 64;
}
static inline int64_t gemm_bn(gemm_cfg cfg) { return cfg == GEMM_64 ? 64 : 128; }

/* The tiles' columns along N (the t of row_stats: 0 <= t < this) */
static inline int64_t gemm_tiles_n(int64_t M, int64_t N)
{
    return cdiv(N, gemm_bn(gemm_pick(M, N)));
}

static inline int64_t gemm_tiles(gemm_cfg cfg, int64_t M, int64_t N)
{
    return cdiv(M, gemm_bm(cfg)) * cdiv(N, gemm_bn(cfg));
}

/* Split-K for a GEMM with few output tiles and a long k (convolution weight
 * gradients): the number of slices and the k of each, a pure function of the
 * sizes.  splits == 1 means no split (kchunk = K). */
static inline void gemm_splitk_plan(int64_t M, int64_t N, int64_t K, int *splits, int *kchunk)
{
    const int64_t tiles = gemm_tiles(gemm_pick(M, N), M, N);
    int64_t s = cdiv(256, tiles);       /* about 256 blocks in all */
    if (s > K / 512) s = K / 512;       /* at least 512 k per slice */
    if (s > 64) s = 64;
    if (s < 2) {
        *splits = 1;
        *kchunk = (int)K;
        return;
    }
    int64_t chunk = cdiv(cdiv(K, s), MDL_GEMM_BK) * MDL_GEMM_BK; /* whole slices */
    *splits = (int)cdiv(K, chunk);
    *kchunk = (int)chunk;
}

/* Whether the tiles of an M x N GEMM fit the grid's x dimension (< 2^31). */
static inline bool gemm_grid_ok(int64_t M, int64_t N)
{
    return gemm_tiles(gemm_pick(M, N), M, N) <= 2147483647LL;
}

template <int BM, int BN, int TM, int TN, class P>
static void gemm_launch_cfg(const P &p, int splits, cudaStream_t stream)
{
    const int64_t tiles_n = cdiv(p.N, BN), tiles = cdiv(p.M, BM) * tiles_n;
    dim3 grid((unsigned)tiles, (unsigned)splits);
    constexpr int threads = (BM / TM) * (BN / TN);
    gemm_tiled<BM, BN, MDL_GEMM_BK, TM, TN, P><<<grid, threads, 0, stream>>>(p, (int)tiles_n);
}

/* Launch P (M, N >= 1) with `splits` k slices of p.kchunk.  The caller checked
 * M, N, K < MDL_GEMM_LIMIT and gemm_grid_ok(M, N). */
template <class P>
static void gemm_launch(const P &p, int splits, cudaStream_t stream)
{
    switch (gemm_pick(p.M, p.N)) {
    case GEMM_M16: gemm_launch_cfg<16, 128, 4, 4>(p, splits, stream); break;
    case GEMM_M32: gemm_launch_cfg<32, 128, 4, 8>(p, splits, stream); break;
    case GEMM_128: gemm_launch_cfg<128, 128, 8, 8>(p, splits, stream); break;
    default: gemm_launch_cfg<64, 64, 4, 4>(p, splits, stream); break;
    }
}

/* The plain row-major GEMM of mdl_cuda_sgemm, with an optional bias added to
 * every row of C (linear's forward): C = alpha op(A) op(B) [+ col_bias] [+ beta C]. */
template <bool TA, bool TB>
struct PlainGemm {
    static constexpr bool A_K_FAST = !TA, B_K_FAST = TB, ROW_STATS = false;
    int M, N, K, kchunk;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc;
    float alpha, beta;
    const float *col_bias; /* N values or NULL */

    __device__ float a(int i, int k) const { return TA ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k]; }
    /* B[j * ldb + k] (TB) or B[k * ldb + j]: the varying index times ldb either way */
    MDL_GEMM_NO_TABLES
    using BFixed = int;
    __device__ int b_fixed(int f) const { return f; }
    __device__ float b(int f, int v, int, const Shared &, bool &) const
    {
        return B[(int64_t)v * ldb + f];
    }
    __device__ void store(int i, int j, float acc, int) const
    {
        float *c = C + (int64_t)i * ldc + j;
        float v = K > 0 ? alpha * acc : 0.0f;
        if (col_bias) v += col_bias[j];
        if (beta != 0.0f) v += beta * *c; /* beta == 0 never reads C */
        *c = v;
    }
};

} /* namespace mdl */

/* gemm.cu: the plain GEMM with the checks already made (m, n, k < MDL_GEMM_LIMIT,
 * m, n >= 1, pointers valid), for linear.cu. */
void mdl_cuda_gemm_run(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc, const float *col_bias, cudaStream_t stream);

#endif /* MDL_CUDA_GEMM_CUH */
