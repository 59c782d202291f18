/* winograd_channels.h -- Winograd F(4x4, 3x3) and F(4x4, 5x5) with channels in the
 * vectors, written once for both vector widths: winograd_avx512.c (16 channels to a zmm)
 * and winograd8_avx2.c (8 to a ymm) define, then include this:
 *
 *   VL              floats in a vector; vf, vi its float and int vector types
 *   ACC             vectors of outputs the products keep in registers (24 of AVX-512's
 *                   32 registers, 12 of AVX2's 16); CB_MAX the most vectors of output
 *                   channels per block (4, 2)
 *   WINO_NAME(x)    the exported name of x
 *   v_add v_sub v_mul v_fmadd v_fnmadd v_max v_set1 v_zero v_loadu v_storeu
 *                   the vector operations
 *   v_lane_index(stride), v_gather(p, index)   lane l: l * stride; p[index lane l]
 *   v_load_first(p, n)   the first n floats at p, zeros after (nothing past them read)
 *   v_transpose(v)       v[i] becomes column i of the VL x VL matrix of rows v[0 .. VL)
 *   v_tile_transpose(o), v_tile_rows(o, k, rows)   a 4x4 tile's 16 outputs o[4 r + c]
 *                   (VL channels each) to channel k's 4 rows of 4 floats
 *   v_add_to_doubles(d, v)   the VL doubles at d += v
 *   v_add_shifted(sum, sumsq, k, s, q, n)   the VL doubles at sum and sumsq += the
 *                   sums of n values from their sums shifted by k (mdl_add_shifted_sums
 *                   in vectors: lane by lane it cost resnet20's 16-channel forward 10%)
 *
 * The method is described in winograd_avx512.c. */
#ifndef MDL_WINOGRAD_CHANNELS_H
#define MDL_WINOGRAD_CHANNELS_H

#define FL(n) (((size_t)(n) + 15) & ~(size_t)15) /* floats, rounded up to 64 bytes */
#define XI_MAX 64                                  /* transform points, at most 8 x 8 */
#define CHUNK_BYTES (256 << 10)                    /* V and M of a chunk of tiles */
/* The weight gradient's chunk (V and dM) for c_in c_out = cc and xi transform points:
 * each chunk adds its products to the thread's partial dU in double (xi cc of them), so
 * longer chunks read and write it less often, while a chunk should stay in L2.  Measured
 * (bench/NOTES.md): with AVX-512 vectors from 32 x 32 channels, 512 KiB where the
 * partial dU fits the core's L2 (each chunk's pass over it stays there), else the L2
 * (at most 2 MiB, measured no better, so that a large L2 does not grow the workspace);
 * with AVX2 vectors, and fewer channels, 512 KiB from 64 x 128, else the forward's chunk */
static int64_t grad_chunk_bytes(int64_t cc, int64_t xi)
{
    const int64_t l2 = mdl_l2_bytes();
    if (VL == 16 && cc >= 32 * 32) {
        if (xi * cc * (int64_t)sizeof(double) < l2) return 512 << 10;
        return l2 < (2 << 20) ? l2 : 2 << 20;
    }
    return cc >= 64 * 128 ? 512 << 10 : CHUNK_BYTES;
}

typedef struct wino_geom {
    int64_t m;          /* outputs per tile side: 4 */
    int64_t a, xi;      /* transform points per side (6 for 3x3, 8 for 5x5), in all a^2 */
    int64_t th, tw, T;  /* tile rows and columns of an image, tiles per image */
    int64_t hp, wp;     /* rows and columns of a transposed image: m th + r - 1, m tw + r - 1 */
    int64_t group;      /* images per call */
    int64_t chunk;      /* tiles per chunk at most */
} wino_geom;

/* the forward's geometry, or the weight gradient's (grad: larger chunks where they pay) */
static wino_geom geom(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int grad)
{
    wino_geom g;
    g.m = MDL_WINOGRAD_M;
    g.a = mdl_winograd_alpha(s);
    g.xi = mdl_winograd_points(s);
    g.th = (ho + g.m - 1) / g.m;
    g.tw = (wo + g.m - 1) / g.m;
    g.T = g.th * g.tw;
    g.hp = g.m * g.th + s->kh - 1;
    g.wp = g.m * g.tw + s->kw - 1;
    const int64_t c = (grad ? grad_chunk_bytes(s->c_in * s->c_out, g.xi) : CHUNK_BYTES) /
                      (g.xi * (int64_t)sizeof(float) * (s->c_in + s->c_out));
    g.chunk = c < 1 ? 1 : c;
    g.group = g.T >= g.chunk ? 1 : g.chunk / g.T;
    if (g.group > s->n && s->n > 0) g.group = s->n;
    if (g.chunk > g.group * g.T) g.chunk = g.group * g.T;
    return g;
}

int WINO_NAME(applies)(const mdl_conv2d_shape *s)
{
    return (s->kh == 3 || s->kh == 5) && s->kw == s->kh && s->stride_h == 1 &&
           s->stride_w == 1 && s->pad_h < s->kh && s->pad_w < s->kw && s->c_in % VL == 0 &&
           s->c_out % VL == 0;
}

size_t WINO_NAME(fixed_floats)(const mdl_conv2d_shape *s)
{
    return FL(mdl_winograd_points(s) * s->c_in * s->c_out);
}

int64_t WINO_NAME(group)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int grad)
{
    return geom(s, ho, wo, grad).group;
}

static size_t thread_floats(const wino_geom g, const mdl_conv2d_shape *s)
{
    return FL(g.group * g.hp * g.wp * s->c_in) + FL(g.xi * g.chunk * s->c_in) +
           FL(g.xi * g.chunk * s->c_out);
}

size_t WINO_NAME(thread_floats)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    return thread_floats(geom(s, ho, wo, 0), s);
}

/* G for F(4x4, 3x3) (6 x 3, Lavin and Gray's) and F(4x4, 5x5) (8 x 5: the points 0, 1,
 * -1, 2, -2, 1/2, -1/2 and infinity, scaled to go with the B^T of bt8) */
static const double G3[8][5] = {{1.0 / 4, 0, 0},
                                {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                {0, 0, 1}};
static const double G5[8][5] = {{1, 0, 0, 0, 0},
                                {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
                                {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
                                {1.0 / 90, 1.0 / 45, 2.0 / 45, 4.0 / 45, 8.0 / 45},
                                {1.0 / 90, -1.0 / 45, 2.0 / 45, -4.0 / 45, 8.0 / 45},
                                {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45},
                                {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45},
                                {0, 0, 0, 0, 1}};

/* U_xi[ci][co] = (G g G^T)[xi] for the filter g = w[co][ci], VL output channels to a
 * vector (gathered from w) */
void WINO_NAME(weights)(const mdl_conv2d_shape *s, const float *w, float *u)
{
    const int64_t c_in = s->c_in, c_out = s->c_out;
    const int r = (int)s->kh, na = (int)mdl_winograd_alpha(s);
    const double (*G)[5] = r == 3 ? G3 : G5;
    float gf[8][5];
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 5; k++) gf[i][k] = (float)G[i][k];
    const vi lanes = v_lane_index((int)(c_in * r * r));
    const int nt = mdl_threads_for((double)c_out * c_in * 400);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t ci = 0; ci < c_in; ci++)
        for (int64_t co = 0; co < c_out; co += VL) {
            const float *g0 = w + (co * c_in + ci) * r * r;
            vf g[25], t[8][5]; /* the filters, then G g */
            for (int q = 0; q < r * r; q++) g[q] = v_gather(g0 + q, lanes);
            for (int i = 0; i < na; i++)
                for (int j = 0; j < r; j++) {
                    vf acc = v_zero();
                    for (int k = 0; k < r; k++)
                        acc = v_fmadd(v_set1(gf[i][k]), g[k * r + j], acc);
                    t[i][j] = acc;
                }
            for (int i = 0; i < na; i++)
                for (int j = 0; j < na; j++) {
                    vf acc = v_zero();
                    for (int k = 0; k < r; k++)
                        acc = v_fmadd(t[i][k], v_set1(gf[j][k]), acc);
                    v_storeu(u + ((i * na + j) * c_in + ci) * c_out + co, acc);
                }
        }
}

/* v[i] = the nc floats at x + (cb + i) * plane (lanes past nc 0) read through the map
 * `in` for channel cb + i (NULL: as they are), i < VL */
static inline __attribute__((always_inline)) void
load_channels(const float *x, int64_t plane, int64_t cb, int64_t nc, const mdl_affine *in,
              vf v[VL])
{
    for (int i = 0; i < VL; i++) {
        v[i] = v_load_first(x + (cb + i) * plane, nc);
        if (in) { /* mdl_affine_apply; lanes past nc are not stored */
            const mdl_affine_ch f = mdl_affine_at(in, cb + i);
            v[i] = v_fmadd(v[i], v_set1(f.s), v_set1(f.t));
            if (f.relu) v[i] = v_max(v_zero(), v[i]); /* NaN passes */
        }
    }
}

/* xt (rows, cols, c_in) = the image x (c_in, h, w) read through the map `in` (NULL: as
 * it is), shifted by (ph, pw) and zero around.  Each transposition takes VL pixels of a
 * row, or, in images VL / k pixels wide, k whole rows. */
static void transpose_image(int64_t c_in, int64_t h, int64_t w, int64_t ph, int64_t pw,
                            int64_t rows, int64_t cols, const float *x, const mdl_affine *in,
                            float *xt)
{
    const int64_t row = cols * c_in, plane = h * w;
    const int64_t k = w < VL && VL % w == 0 ? VL / w : 1; /* rows per transposition */
    for (int64_t r = 0; r < rows; r++) {
        float *dst = xt + r * row;
        const int64_t ih = r - ph;
        if (ih < 0 || ih >= h) {
            memset(dst, 0, (size_t)row * sizeof(float));
            continue;
        }
        memset(dst, 0, (size_t)(pw * c_in) * sizeof(float));
        memset(dst + (pw + w) * c_in, 0, (size_t)((cols - pw - w) * c_in) * sizeof(float));
    }
    const int64_t ih1 = h < rows - ph ? h : rows - ph; /* the rows of x that xt holds */
    for (int64_t ih = 0; ih < ih1;) {
        float *dst = xt + (ih + ph) * row + pw * c_in;
        vf v[VL];
        if (k > 1 && ih + k <= ih1) {
            for (int64_t cb = 0; cb < c_in; cb += VL) {
                load_channels(x + ih * w, plane, cb, VL, in, v);
                v_transpose(v);
                for (int64_t j = 0; j < VL; j++)
                    v_storeu(dst + (j / w) * row + (j % w) * c_in + cb, v[j]);
            }
            ih += k;
            continue;
        }
        for (int64_t c0 = 0; c0 < w; c0 += VL) {
            const int64_t nc = w - c0 < VL ? w - c0 : VL;
            for (int64_t cb = 0; cb < c_in; cb += VL) {
                load_channels(x + ih * w + c0, plane, cb, nc, in, v);
                v_transpose(v);
                for (int64_t j = 0; j < nc; j++) v_storeu(dst + (c0 + j) * c_in + cb, v[j]);
            }
        }
        ih++;
    }
}

/* t = B^T d for 6 vectors */
static inline __attribute__((always_inline)) void bt6(const vf d[6], vf t[6])
{
    const vf c2 = v_set1(2.0f), c4 = v_set1(4.0f);
    const vf m5 = v_set1(-5.0f);
    const vf p = v_add(d[3], d[4]), q = v_sub(d[4], d[3]);
    const vf r = v_add(d[1], d[2]), sd = v_sub(d[1], d[2]);
    const vf u = v_sub(d[4], d[2]), v = v_sub(d[3], d[1]);
    t[0] = v_fmadd(c4, d[0], v_fmadd(m5, d[2], d[4]));
    t[1] = v_fnmadd(c4, r, p);
    t[2] = v_fmadd(c4, sd, q);
    t[3] = v_fmadd(c2, v, u);
    t[4] = v_fnmadd(c2, v, u);
    t[5] = v_fmadd(c4, d[1], v_fmadd(m5, d[3], d[5]));
}

/* t = B^T d for 8 vectors (the points 0, 1, -1, 2, -2, 1/2, -1/2, infinity; the B^T of
 * F(6x6, 3x3), which has the same points) */
static inline __attribute__((always_inline)) void bt8(const vf d[8], vf t[8])
{
    const vf c21 = v_set1(21.0f / 4), c17 = v_set1(-17.0f / 4), c54 = v_set1(-5.0f / 4);
    const vf c52 = v_set1(-5.0f / 2), half = v_set1(0.5f);
    const vf q = v_set1(0.25f), four = v_set1(4.0f), m5 = v_set1(-5.0f);
    t[0] = v_fmadd(c21, v_sub(d[4], d[2]), v_sub(d[0], d[6]));
    t[7] = v_fmadd(c21, v_sub(d[3], d[5]), v_sub(d[7], d[1]));
    const vf a1 = v_fmadd(c17, d[4], v_add(d[2], d[6]));
    const vf b1 = v_fmadd(c17, d[3], v_add(d[1], d[5]));
    t[1] = v_add(a1, b1);
    t[2] = v_sub(a1, b1);
    const vf a2 = v_fmadd(c54, d[4], v_fmadd(q, d[2], d[6]));
    const vf b2 = v_fmadd(half, d[1], v_fmadd(c52, d[3], v_add(d[5], d[5])));
    t[3] = v_add(a2, b2);
    t[4] = v_sub(a2, b2);
    const vf a3 = v_fmadd(m5, d[4], v_fmadd(four, d[2], d[6]));
    const vf b3 = v_fmadd(half, d[5], v_fmadd(c52, d[3], v_add(d[1], d[1])));
    t[5] = v_add(a3, b3);
    t[6] = v_sub(a3, b3);
}

/* o = A^T m: the 4 outputs from the 6 points of F(4x4, 3x3) */
static inline __attribute__((always_inline)) void at6(const vf m[6], vf o[4])
{
    const vf a = v_add(m[1], m[2]), b = v_sub(m[1], m[2]);
    const vf c = v_add(m[3], m[4]), d = v_sub(m[3], m[4]);
    o[0] = v_add(v_add(m[0], a), c);
    o[1] = v_fmadd(v_set1(2.0f), d, b);
    o[2] = v_fmadd(v_set1(4.0f), c, a);
    o[3] = v_add(v_fmadd(v_set1(8.0f), d, b), m[5]);
}

/* o = A^T m: the 4 outputs from the 8 points of F(4x4, 5x5) */
static inline __attribute__((always_inline)) void at8(const vf m[8], vf o[4])
{
    const vf s1 = v_add(m[1], m[2]), d1 = v_sub(m[1], m[2]);
    const vf s2 = v_add(m[3], m[4]), d2 = v_sub(m[3], m[4]);
    const vf s3 = v_add(m[5], m[6]), d3 = v_sub(m[5], m[6]);
    o[0] = v_add(v_add(m[0], s1), v_add(s2, s3));
    o[1] = v_fmadd(v_set1(0.5f), d3, v_fmadd(v_set1(2.0f), d2, d1));
    o[2] = v_fmadd(v_set1(0.25f), s3, v_fmadd(v_set1(4.0f), s2, s1));
    o[3] = v_add(v_fmadd(v_set1(0.125f), d3, v_fmadd(v_set1(8.0f), d2, d1)), m[7]);
}

/* V_xi[t] = (B^T d B)[xi] for the tile whose A x A block starts at d (in a transposed
 * image, pixels c_in floats apart, rows wp pixels apart); v = V_0[t], the tile's A^2
 * points c_in floats apart (V is tile-major: the stores are contiguous) */
static inline __attribute__((always_inline)) void
input_tile(const int A, int64_t c_in, int64_t wp, const float *d, float *v)
{
    for (int64_t cb = 0; cb < c_in; cb += VL) {
        vf e[8][8];
        for (int a = 0; a < A; a++) {
            vf row[8];
            for (int b = 0; b < A; b++) row[b] = v_loadu(d + (a * wp + b) * c_in + cb);
            if (A == 6) bt6(row, e[a]);
            else bt8(row, e[a]);
        }
        for (int j = 0; j < A; j++) {
            vf col[8], out[8];
            for (int a = 0; a < A; a++) col[a] = e[a][j];
            if (A == 6) bt6(col, out);
            else bt8(col, out);
            for (int i = 0; i < A; i++) v_storeu(v + (i * A + j) * c_in + cb, out[i]);
        }
    }
}

/* The products of both directions as blocks of TB x CB vectors of outputs held in
 * registers, rank-1 updates over k < K:
 *     out[j][VL c ..] = (or +=) sum over k of a(k, j) * b[k][VL c ..]
 * forward (GRAD 0): rows j are tiles, k input channels, a(k, j) = v[j][k], b = U_xi, and
 * out = M_xi stored as floats to m; weight gradient (GRAD 1): rows j are input channels,
 * k tiles, a(k, j) = v[k][j], b = dM_xi, and out = dU_xi added to the doubles du.  Rows
 * of v vs floats apart, of b bs, of out os. */
static inline __attribute__((always_inline)) void
block(const int GRAD, const int CB, const int TB, int64_t K, int64_t vs, int64_t bs, int64_t os,
      const float *v, const float *b, float *m, double *du)
{
    vf acc[ACC], w[4]; /* TB * CB <= ACC, CB <= 4 */
#pragma GCC unroll 24
    for (int j = 0; j < TB * CB; j++) acc[j] = v_zero();
    for (int64_t k = 0; k < K; k++) {
#pragma GCC unroll 4
        for (int c = 0; c < CB; c++) w[c] = v_loadu(b + k * bs + VL * c);
#pragma GCC unroll 24
        for (int j = 0; j < TB; j++) {
            const vf x = v_set1(GRAD ? v[k * vs + j] : v[j * vs + k]);
#pragma GCC unroll 4
            for (int c = 0; c < CB; c++) acc[j * CB + c] = v_fmadd(x, w[c], acc[j * CB + c]);
        }
    }
#pragma GCC unroll 24
    for (int j = 0; j < TB; j++)
#pragma GCC unroll 4
        for (int c = 0; c < CB; c++) {
            const vf r = acc[j * CB + c];
            if (!GRAD) {
                v_storeu(m + j * os + VL * c, r);
                continue;
            }
            v_add_to_doubles(du + j * os + VL * c, r);
        }
}

/* The np products of n tiles (block's GRAD, v, b, m and du), the rows in blocks of ACC / CB,
 * the rest in blocks of 16, 8, 4, 2 and 1.  The forward's rows (tiles) are vs floats
 * apart, each broadcast needing an index register of its own: at most 12 rows, past
 * which gcc spilled the indices and reloaded one for every FMA (AVX-512, 16 output
 * channels: 24 rows measured 1.03-1.1x slower) */
static inline __attribute__((always_inline)) void
products_cb(const int GRAD, const int CB, int64_t np, int64_t n, int64_t c_in, int64_t c_out,
            const float *v, const float *b, float *m, double *du)
{
    const int TBM = GRAD || ACC / CB <= 12 ? ACC / CB : 12;
    const int64_t rows = GRAD ? c_in : n, K = GRAD ? n : c_in;
    /* V, M and dM tile-major (a tile's np points together), U and dU point-major */
    const int64_t vs = np * c_in, bs = GRAD ? np * c_out : c_out, os = GRAD ? c_out : np * c_out;
    for (int64_t xi = 0; xi < np; xi++) {
        const float *vx = v + xi * c_in, *bx = b + (GRAD ? xi * c_out : xi * c_in * c_out);
        float *mx = GRAD ? NULL : m + xi * c_out;
        double *dx = GRAD ? du + xi * c_in * c_out : NULL;
        for (int64_t co = 0; co < c_out; co += VL * CB) {
            int64_t j = 0;
#define BLOCK(TB)                                                                           \
    block(GRAD, CB, TB, K, vs, bs, os, vx + (GRAD ? j : j * vs), bx + co,                   \
          GRAD ? NULL : mx + j * os + co, GRAD ? dx + j * os + co : NULL)
            for (; j + TBM <= rows; j += TBM) BLOCK(TBM);
#define TAIL(TB)                                                                            \
    if (TB < TBM && rows - j >= TB) {                                                       \
        BLOCK(TB < TBM ? TB : 1);                                                           \
        j += TB;                                                                            \
    }
            TAIL(16) TAIL(8) TAIL(4) TAIL(2) TAIL(1)
#undef TAIL
#undef BLOCK
        }
    }
}

static void products(int grad, int64_t np, int64_t n, int64_t c_in, int64_t c_out,
                     const float *v, const float *b, float *m, double *du)
{
    const int cb = CB_MAX >= 4 && c_out % (4 * VL) == 0 ? 4 : c_out % (2 * VL) == 0 ? 2 : 1;
#define CASE(G, CB) \
    if (grad == G && cb == CB) products_cb(G, CB, np, n, c_in, c_out, v, b, m, du);
    CASE(0, 4) CASE(0, 2) CASE(0, 1) CASE(1, 4) CASE(1, 2) CASE(1, 1)
#undef CASE
}

/* o[4 r + c] = output (r, c) of one tile, VL channels from co, from m = M_0[t] (its A^2
 * points c_out floats apart): Y = A^T M A, then bias, ReLU and the channel sums
 * (sums[0 .. c_out) and sumsq = sums + c_out, of the nr x nc outputs inside the image) */
static inline __attribute__((always_inline)) void
tile_outputs(const int A, int64_t c_out, int64_t co, const float *m, const float *bias,
             int relu, double *sums, int64_t nr, int64_t nc, vf *o)
{
    const vf zero = v_zero();
    vf f[4][8];
    for (int j = 0; j < A; j++) {
        vf col[8], rm[4];
        for (int i = 0; i < A; i++) col[i] = v_loadu(m + (i * A + j) * c_out + co);
        if (A == 6) at6(col, rm);
        else at8(col, rm);
        for (int r = 0; r < 4; r++) f[r][j] = rm[r];
    }
    for (int r = 0; r < 4; r++) {
        if (A == 6) at6(f[r], o + 4 * r);
        else at8(f[r], o + 4 * r);
    }
    if (bias) {
        const vf b = v_loadu(bias + co);
        for (int p = 0; p < 16; p++) o[p] = v_add(o[p], b);
    }
    if (relu)
        for (int p = 0; p < 16; p++) o[p] = v_max(zero, o[p]); /* NaN passes */
    if (sums) { /* shifted by the tile's mean (mdl_add_shifted_sums) */
        vf s = zero, q = zero, k = zero;
        for (int p = 0; p < 16; p++)
            if (p / 4 < nr && p % 4 < nc) k = v_add(k, o[p]);
        k = v_mul(k, v_set1(1.0f / (float)(nr * nc)));
        for (int p = 0; p < 16; p++)
            if (p / 4 < nr && p % 4 < nc) {
                const vf d = v_sub(o[p], k);
                s = v_add(s, d);
                q = v_fmadd(d, d, q);
            }
        v_add_shifted(sums + co, sums + c_out + co, k, s, q, (double)(nr * nc));
    }
}

/* The 4 x 4 outputs of one tile (tile_outputs) written to y (the tile's top-left output
 * of channel 0, planes P floats apart, rows wo apart), or added to it (accumulate: no
 * epilogue then) */
static inline __attribute__((always_inline)) void
output_tile(const int A, int64_t c_out, const float *m, const float *bias, int relu,
            double *sums, int accumulate, int64_t nr, int64_t nc, int64_t P, int64_t wo, float *y)
{
    for (int64_t co = 0; co < c_out; co += VL) {
        vf o[16];
        tile_outputs(A, c_out, co, m, bias, relu, sums, nr, nc, o);
        const __m128i cols = _mm_cmpgt_epi32(_mm_set1_epi32((int)nc), _mm_setr_epi32(0, 1, 2, 3));
        v_tile_transpose(o);
        for (int k = 0; k < VL; k++) {
            __m128 rows[4];
            v_tile_rows(o, k, rows);
            float *yk = y + (co + k) * P;
            for (int r = 0; r < nr; r++) {
                __m128 z = rows[r];
                if (nc == 4) {
                    if (accumulate) z = _mm_add_ps(z, _mm_loadu_ps(yk + r * wo));
                    _mm_storeu_ps(yk + r * wo, z);
                } else {
                    if (accumulate) z = _mm_add_ps(z, _mm_maskload_ps(yk + r * wo, cols));
                    _mm_maskstore_ps(yk + r * wo, cols, z);
                }
            }
        }
    }
}

/* SPAN / 4 whole tiles side by side (M of the first at m, of the next A^2 c_out floats
 * on), as output_tile: each VL / SPAN rows of their outputs are transposed at once, so
 * that a channel's VL outputs there go to y in one vector store (SPAN < VL: the tiles
 * are a whole row of tiles of an image SPAN wide, whose rows follow one another).
 * Tile by tile, a line of y took 4-float stores from several tiles, and at 32 x 32
 * outputs the VL planes are 4 KiB apart, in the same L1 sets: 1.11-1.16x there
 * (bench/NOTES.md) */
static inline __attribute__((always_inline)) void
output_tile_row(const int A, const int SPAN, int64_t c_out, const float *m, const float *bias,
                int relu, double *sums, int accumulate, int64_t P, int64_t wo, float *y)
{
    const int K = VL / SPAN; /* K rows per vector */
    for (int64_t co = 0; co < c_out; co += VL) {
        vf o[4 * VL]; /* tile g's outputs at o + 16 g */
        for (int g = 0; g < SPAN / 4; g++)
            tile_outputs(A, c_out, co, m + g * A * A * c_out, bias, relu, sums, 4, 4, o + g * 16);
        for (int r0 = 0; r0 < 4; r0 += K) {
            vf w[VL];
            for (int j = 0; j < VL; j++) {
                const int r = r0 + j / SPAN, c = j % SPAN;
                w[j] = o[c / 4 * 16 + 4 * r + c % 4];
            }
            v_transpose(w);
            for (int k = 0; k < VL; k++) {
                float *d = y + (co + k) * P + r0 * wo;
                v_storeu(d, accumulate ? v_add(w[k], v_loadu(d)) : w[k]);
            }
        }
    }
}

/* xt (images, hp, wp, c_in) = the images x transposed and padded (transpose_image) */
static void transpose_images(const mdl_conv2d_shape *s, const wino_geom *g, int64_t images,
                             const float *x, const mdl_affine *in, float *xt)
{
    for (int64_t b = 0; b < images; b++)
        transpose_image(s->c_in, s->h, s->w, s->pad_h, s->pad_w, g->hp, g->wp,
                        x + b * s->c_in * s->h * s->w, in, xt + b * g->hp * g->wp * s->c_in);
}

/* V of the chunk of n tiles q0 .. q0 + n - 1 (image-major) of the transposed images xt */
static void input_tiles(int64_t c_in, const wino_geom *g, const float *xt, int64_t q0, int64_t n,
                        float *v)
{
    for (int64_t t = 0; t < n; t++) {
        const int64_t q = q0 + t, b = q / g->T, ty = q % g->T / g->tw, tx = q % g->tw;
        const float *d = xt + (b * g->hp * g->wp + (ty * g->wp + tx) * g->m) * c_in;
        if (g->a == 6) input_tile(6, c_in, g->wp, d, v + t * g->xi * c_in);
        else input_tile(8, c_in, g->wp, d, v + t * g->xi * c_in);
    }
}

/* y (images, c_out, ho, wo) from M of the n tiles q0 .. q0 + n - 1 (image-major, tile q0
 * at m), with output_tile's epilogue (sums: (images, 2, c_out)) */
static void output_tiles(int64_t c_out, const wino_geom *g, int64_t ho, int64_t wo, int64_t q0,
                         int64_t n, const float *m, const float *bias, int relu, double *sums,
                         int accumulate, float *y)
{
    const int64_t P = ho * wo;
    /* outputs per row of output_tile_row's groups: VL, or an image's whole rows when VL is
     * a multiple of its width, a multiple of 4, itself a multiple of the rows per vector
     * (0: tile by tile) */
    int64_t span = wo >= VL ? VL : wo;
    if (VL % span || span % 4 || 4 % (VL / span)) span = 0;
    for (int64_t t = 0; t < n; t++) {
        const int64_t q = q0 + t, b = q / g->T, oh = q % g->T / g->tw * g->m;
        const int64_t ow = q % g->tw * g->m;
        const int64_t nr = ho - oh < g->m ? ho - oh : g->m, nc = wo - ow < g->m ? wo - ow : g->m;
        float *yt = y + b * c_out * P + oh * wo + ow;
        double *st = sums ? sums + b * 2 * c_out : NULL;
        const float *mt = m + t * g->xi * c_out;
        if (nr == 4 && span && ow % span == 0 && ow + span <= wo && t + span / 4 <= n) {
#define ROW(A, SPAN)                                                       \
    if ((SPAN) % 4 == 0 && 4 % (VL / (SPAN)) == 0 && g->a == (A) && span == (SPAN)) \
        output_tile_row(A, SPAN, c_out, mt, bias, relu, st, accumulate, P, wo, yt);
            ROW(6, VL) ROW(6, VL / 2) ROW(6, VL / 4) ROW(8, VL) ROW(8, VL / 2) ROW(8, VL / 4)
#undef ROW
            t += span / 4 - 1;
        } else if (g->a == 6)
            output_tile(6, c_out, mt, bias, relu, st, accumulate, nr, nc, P, wo, yt);
        else
            output_tile(8, c_out, mt, bias, relu, st, accumulate, nr, nc, P, wo, yt);
    }
}

/* The convolution of `images` images already transposed (xt), chunk by chunk of tiles
 * through v and m (as _images) */
static void convolve_tiles(const mdl_conv2d_shape *s, const wino_geom *g, int64_t ho,
                           int64_t wo, const float *u, int64_t images, const float *xt,
                           const float *bias, int relu, double *sums, int accumulate, float *y,
                           float *v, float *m)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, total = images * g->T;
    if (sums) memset(sums, 0, (size_t)(images * 2 * c_out) * sizeof(double));
    const int64_t chunks = (total + g->chunk - 1) / g->chunk;
    for (int64_t k = 0; k < chunks; k++) {
        const int64_t q0 = total * k / chunks, n = total * (k + 1) / chunks - q0;
        input_tiles(c_in, g, xt, q0, n, v);
        products(0, g->xi, n, c_in, c_out, v, u, m, NULL);
        output_tiles(c_out, g, ho, wo, q0, n, m, bias, relu, sums, accumulate, y);
    }
}

void WINO_NAME(images)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *u,
                                int64_t images, const float *x, const mdl_affine *in,
                                const float *bias, int relu, double *sums, int accumulate,
                                float *y, float *buf)
{
    const wino_geom g = geom(s, ho, wo, 0);
    float *xt = buf, *v = xt + FL(g.group * g.hp * g.wp * s->c_in);
    transpose_images(s, &g, images, x, in, xt);
    convolve_tiles(s, &g, ho, wo, u, images, xt, bias, relu, sums, accumulate, y, v,
                   v + FL(g.xi * g.chunk * s->c_in));
}

void WINO_NAME(tiles_y)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,
                        const float *m, const float *bias, int relu, double *sums,
                        int accumulate, float *y)
{
    const wino_geom g = geom(s, ho, wo, 0);
    if (sums) memset(sums, 0, (size_t)(images * 2 * s->c_out) * sizeof(double));
    output_tiles(s->c_out, &g, ho, wo, 0, images * g.T, m, bias, relu, sums, accumulate, y);
}

/* ---- the weight gradient ----------------------------------------------------------- */
/* The adjoint of the forward: with dM = A dY A^T per tile (dY its m x m block of dy, zero
 * outside the output), dU_xi (c_in, c_out) = sum over tiles of V_xi^T dM_xi, and dw =
 * G^T dU G per channel pair.  Per chunk of tiles: V as in the forward, dM from dy
 * transposed to (rows, columns, c_out), and the products with the tiles as the reduction,
 * register-blocked as 24 vectors of dU (input channels x output channels) over the
 * chunk's tiles, then added to the thread's partial dU in double (a float one lost up to
 * 2e-5 of the largest dw over a batch of 100 on one thread). */

size_t WINO_NAME(grad_thread_floats)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    const wino_geom g = geom(s, ho, wo, 1);
    return FL(2 * g.xi * s->c_in * s->c_out) + thread_floats(g, s) +
           FL(g.group * g.m * g.th * g.m * g.tw * s->c_out);
}

/* t = A e for the 4 vectors e: the 6 points of F(4x4, 3x3) (A = (A^T)^T: 6 x 4) */
static inline __attribute__((always_inline)) void a6(const vf e[4], vf t[6])
{
    const vf ev = v_add(e[0], e[2]), od = v_add(e[1], e[3]);
    const vf ev4 = v_fmadd(v_set1(4.0f), e[2], e[0]);
    const vf od2 = v_fmadd(v_set1(8.0f), e[3], v_add(e[1], e[1]));
    t[0] = e[0];
    t[1] = v_add(ev, od);
    t[2] = v_sub(ev, od);
    t[3] = v_add(ev4, od2);
    t[4] = v_sub(ev4, od2);
    t[5] = e[3];
}

/* the same for the 8 points of F(4x4, 5x5) */
static inline __attribute__((always_inline)) void a8(const vf e[4], vf t[8])
{
    const vf ev = v_add(e[0], e[2]), od = v_add(e[1], e[3]);
    const vf ev4 = v_fmadd(v_set1(4.0f), e[2], e[0]);
    const vf od2 = v_fmadd(v_set1(8.0f), e[3], v_add(e[1], e[1]));
    const vf ev_ = v_fmadd(v_set1(0.25f), e[2], e[0]);
    const vf od_ = v_fmadd(v_set1(0.125f), e[3], v_fmadd(v_set1(0.5f), e[1], v_zero()));
    t[0] = e[0];
    t[1] = v_add(ev, od);
    t[2] = v_sub(ev, od);
    t[3] = v_add(ev4, od2);
    t[4] = v_sub(ev4, od2);
    t[5] = v_add(ev_, od_);
    t[6] = v_sub(ev_, od_);
    t[7] = e[3];
}

/* dM_xi[t] = (A dY A^T)[xi] for the tile whose 4 x 4 block of dy starts at d (a
 * transposed dy, pixels c_out floats apart, rows cols pixels apart); dm = dM_0[t], the
 * tile's A^2 points c_out floats apart */
static inline __attribute__((always_inline)) void
grad_tile(const int A, int64_t c_out, int64_t cols, const float *d, float *dm)
{
    for (int64_t cb = 0; cb < c_out; cb += VL) {
        vf e[4][8];
        for (int r = 0; r < 4; r++) {
            vf row[4];
            for (int c = 0; c < 4; c++) row[c] = v_loadu(d + (r * cols + c) * c_out + cb);
            if (A == 6) a6(row, e[r]);
            else a8(row, e[r]);
        }
        for (int j = 0; j < A; j++) {
            vf col[4], out[8];
            for (int r = 0; r < 4; r++) col[r] = e[r][j];
            if (A == 6) a6(col, out);
            else a8(col, out);
            for (int i = 0; i < A; i++) v_storeu(dm + (i * A + j) * c_out + cb, out[i]);
        }
    }
}

/* du += dU of `images` images already transposed: x in xt, dy in dyt (images
 * dyt_image floats apart, rows of cols pixels, dy's first pixel at dyt_origin), chunk by
 * chunk of tiles through v and dm (as _grad_images) */
static void grad_tiles(const mdl_conv2d_shape *s, const wino_geom *g, int64_t images,
                       const float *xt, const float *dyt, int64_t dyt_image, int64_t cols,
                       int64_t dyt_origin, double *du, float *v, float *dm)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, total = images * g->T;
    const int64_t chunks = (total + g->chunk - 1) / g->chunk;
    for (int64_t k = 0; k < chunks; k++) {
        const int64_t q0 = total * k / chunks, n = total * (k + 1) / chunks - q0;
        input_tiles(c_in, g, xt, q0, n, v);
        for (int64_t t = 0; t < n; t++) {
            const int64_t q = q0 + t, b = q / g->T, ty = q % g->T / g->tw, tx = q % g->tw;
            const float *d = dyt + b * dyt_image + dyt_origin + (ty * cols + tx) * g->m * c_out;
            if (g->a == 6) grad_tile(6, c_out, cols, d, dm + t * g->xi * c_out);
            else grad_tile(8, c_out, cols, d, dm + t * g->xi * c_out);
        }
        products(1, g->xi, n, c_in, c_out, v, dm, NULL, du);
    }
}

void WINO_NAME(grad_images)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo,
                                     int64_t images, const float *x, const mdl_affine *in,
                                     const float *dy, double *du, float *buf)
{
    const wino_geom g = geom(s, ho, wo, 1);
    const int64_t c_in = s->c_in, c_out = s->c_out, P = ho * wo;
    const int64_t rows = g.m * g.th, cols = g.m * g.tw, dyt_image = rows * cols * c_out;
    float *xt = buf, *v = xt + FL(g.group * g.hp * g.wp * c_in);
    float *dm = v + FL(g.xi * g.chunk * c_in);
    float *dyt = dm + FL(g.xi * g.chunk * c_out);
    transpose_images(s, &g, images, x, in, xt);
    for (int64_t b = 0; b < images; b++)
        transpose_image(c_out, ho, wo, 0, 0, rows, cols, dy + b * c_out * P, NULL,
                        dyt + b * dyt_image);
    grad_tiles(s, &g, images, xt, dyt, dyt_image, cols, 0, du, v, dm);
}

/* ---- both gradients at once ---------------------------------------------------------- */
/* The data gradient is the convolution t of dy (its input, padded by t's padding) with
 * the flipped weights; the weight gradient reads dy's 4 x 4 blocks, zero past its end.
 * In one pass per group, dy is transposed once, padded for t, and the weight gradient
 * reads its blocks there, offset by t's padding: that needs every block inside the
 * padded image (backward_applies).  The groups are the weight gradient's and so are its
 * chunks of tiles (its sums are added in the same order as by _grad_images), and a tile
 * of the data gradient does not depend on its chunk: the values are the two calls'. */
static size_t max_floats(size_t a, size_t b) { return a > b ? a : b; }

int WINO_NAME(backward_applies)(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t,
                                int64_t ho, int64_t wo)
{
    const wino_geom gd = geom(t, s->h, s->w, 0), gw = geom(s, ho, wo, 1);
    return gw.m * gw.th + t->pad_h <= gd.hp && gw.m * gw.tw + t->pad_w <= gd.wp;
}

size_t WINO_NAME(backward_thread_floats)(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t,
                                         int64_t ho, int64_t wo)
{
    const wino_geom gd = geom(t, s->h, s->w, 0), gw = geom(s, ho, wo, 1);
    const int64_t c_in = s->c_in, c_out = s->c_out;
    return FL(2 * gw.xi * c_in * c_out) + FL(gw.group * gd.hp * gd.wp * c_out) +
           FL(gw.group * gw.hp * gw.wp * c_in) +
           max_floats(FL(gd.xi * gd.chunk * c_out), FL(gw.xi * gw.chunk * c_in)) +
           max_floats(FL(gd.xi * gd.chunk * c_in), FL(gw.xi * gw.chunk * c_out));
}

void WINO_NAME(backward_images)(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t,
                                int64_t ho, int64_t wo, const float *ut, int64_t images,
                                const float *x, const mdl_affine *in, const float *dy,
                                int accumulate, float *dx, double *du, float *buf)
{
    const wino_geom gd = geom(t, s->h, s->w, 0), gw = geom(s, ho, wo, 1);
    const int64_t c_in = s->c_in, c_out = s->c_out, dyt_image = gd.hp * gd.wp * c_out;
    float *dyt = buf, *xt = dyt + FL(gw.group * dyt_image);
    float *v = xt + FL(gw.group * gw.hp * gw.wp * c_in);
    float *m = v + max_floats(FL(gd.xi * gd.chunk * c_out), FL(gw.xi * gw.chunk * c_in));
    transpose_images(t, &gd, images, dy, NULL, dyt);
    convolve_tiles(t, &gd, s->h, s->w, ut, images, dyt, NULL, 0, NULL, accumulate, dx, v, m);
    transpose_images(s, &gw, images, x, in, xt);
    grad_tiles(s, &gw, images, xt, dyt, dyt_image, gd.wp, (t->pad_h * gd.wp + t->pad_w) * c_out,
               du, v, m);
}

/* For many channels the sums go to SGEMMs instead (conv.c), one per transform point,
 * over the input channels (forward) or the tiles (weight gradient): V, M and dM of every
 * tile of `images` images, tile-major as above (tile t of image b at row b T + t).
 * tiles_v writes V of images x (read through in) and tiles_dm dM of their dy, each with
 * tiles_floats of scratch; tiles_y applies the output transform and the epilogue of
 * images (bias, relu, sums, accumulate) to M. */
size_t WINO_NAME(tiles_floats)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    const wino_geom g = geom(s, ho, wo, 1);
    return FL(g.hp * g.wp * s->c_in) + FL(g.m * g.th * g.m * g.tw * s->c_out);
}

void WINO_NAME(tiles_v)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,
                        const float *x, const mdl_affine *in, float *v, float *buf)
{
    const wino_geom g = geom(s, ho, wo, 1);
    for (int64_t b = 0; b < images; b++) {
        transpose_images(s, &g, 1, x + b * s->c_in * s->h * s->w, in, buf);
        input_tiles(s->c_in, &g, buf, 0, g.T, v + b * g.T * g.xi * s->c_in);
    }
}

void WINO_NAME(tiles_dm)(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,
                         const float *dy, float *dm, float *buf)
{
    const wino_geom g = geom(s, ho, wo, 1);
    const int64_t c_out = s->c_out, rows = g.m * g.th, cols = g.m * g.tw;
    for (int64_t b = 0; b < images; b++) {
        transpose_image(c_out, ho, wo, 0, 0, rows, cols, dy + b * c_out * ho * wo, NULL, buf);
        for (int64_t t = 0; t < g.T; t++) {
            const float *d = buf + (t / g.tw * cols + t % g.tw) * g.m * c_out;
            float *dmt = dm + (b * g.T + t) * g.xi * c_out;
            if (g.a == 6) grad_tile(6, c_out, cols, d, dmt);
            else grad_tile(8, c_out, cols, d, dmt);
        }
    }
}

void WINO_NAME(grad_finish)(const mdl_conv2d_shape *s, const double *parts, int nparts,
                                     size_t part_stride, const float *single, int64_t lo,
                                     int64_t hi, float *dw, int accumulate)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, r = s->kh, rr = r * r;
    const int64_t na = mdl_winograd_alpha(s);
    const double (*G)[5] = r == 3 ? G3 : G5;
    /* VL output channels of one input channel at a time, in double lanes */
    for (int64_t e = lo; e < hi; e += VL) { /* e = ci * c_out + co */
        const int64_t ci = e / c_out, co = e % c_out;
        double du[XI_MAX][VL], t[8][5][VL]; /* dU summed over the parts, then dU G */
        for (int xi = 0; xi < na * na; xi++) {
            const int64_t at = (xi * c_in + ci) * c_out + co;
            for (int l = 0; l < VL; l++) du[xi][l] = single ? single[at + l] : 0.0;
            for (int p = 0; p < nparts; p++)
                for (int l = 0; l < VL; l++) du[xi][l] += parts[at + p * part_stride + l];
        }
        for (int i = 0; i < na; i++)
            for (int c = 0; c < r; c++) {
                for (int l = 0; l < VL; l++) t[i][c][l] = 0.0;
                for (int j = 0; j < na; j++)
                    for (int l = 0; l < VL; l++) t[i][c][l] += du[i * na + j][l] * G[j][c];
            }
        for (int k = 0; k < r; k++)
            for (int c = 0; c < r; c++) {
                double acc[VL];
                for (int l = 0; l < VL; l++) acc[l] = 0.0;
                for (int i = 0; i < na; i++)
                    for (int l = 0; l < VL; l++) acc[l] += G[i][k] * t[i][c][l];
                for (int l = 0; l < VL; l++) {
                    float *d = dw + ((co + l) * c_in + ci) * rr + k * r + c;
                    *d = accumulate ? *d + (float)acc[l] : (float)acc[l];
                }
            }
    }
}

#endif
