/* conv.c -- 2-D convolution (cross-correlation, NCHW, zero padding), forward
 * and the three gradients.
 *
 * Two versions, chosen at run time:
 *  - the scalar reference: direct loops over the definition, the test
 *    oracle and the portable fallback;
 *  - the fast path (AVX2 selected): for a chunk of B images at a time, im2col
 *    into one column matrix (K, B * P) in the workspace and one SGEMM with
 *    N = B * P, so that small images and few channels still make a GEMM large
 *    enough to run near the kernel's speed; outputs and output gradients pass
 *    through a (c_out, B * P) buffer.  B is chosen so the chunk's buffers stay
 *    near CHUNK_FLOATS.  A 1x1 kernel with stride 1 and no padding skips
 *    im2col and runs per image: x itself is the column matrix.
 * Shapes below: K = c_in * kh * kw, P = h_out * w_out.
 * dx is overwritten; dw and db are overwritten (accumulate 0) or added to (1). */
#include <string.h>
#include "common.h"
#include "conv.h"
#include "checks.h"

/* ---- shape checks and workspace layout -------------------------------------------- */

/* the shape check: mdl_conv2d_check_shape in checks.h */
#define CHUNK_FLOATS (2 << 20)            /* target size of a chunk's column + output buffers */

typedef struct conv_geom {
    int64_t ho, wo;      /* output size */
    int64_t K, P;        /* rows and columns of the column matrix */
    int pointwise;       /* 1x1 kernel, stride 1, no padding: no im2col */
    int64_t B;           /* images per chunk (1 when pointwise) */
    size_t col_floats;   /* column matrix of a chunk, rounded up to 64 bytes */
    size_t out_floats;   /* (c_out, B * P) buffer of a chunk, rounded up to 64 bytes */
    size_t gemm_bytes;   /* the largest SGEMM workspace of the three ops */
    size_t need;         /* the whole workspace, with MDL_WS_SLACK */
} conv_geom;

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static mdl_status geometry(const char *fn, const mdl_conv2d_shape *s, conv_geom *g)
{
    mdl_status st = mdl_conv2d_check_shape(fn, s, &g->ho, &g->wo);
    if (st != MDL_OK) return st;
    g->K = s->c_in * s->kh * s->kw;
    g->P = g->ho * g->wo;
    g->pointwise = s->kh == 1 && s->kw == 1 && s->stride_h == 1 && s->stride_w == 1 &&
                   s->pad_h == 0 && s->pad_w == 0;
    int64_t per_image = (g->K + s->c_out) * g->P, B = CHUNK_FLOATS / (per_image > 0 ? per_image : 1);
    g->B = g->pointwise ? 1 : B < 1 ? 1 : B > s->n ? (s->n > 0 ? s->n : 1) : B;
    const int64_t N = g->B * g->P;
    g->col_floats = g->pointwise ? 0 : ((size_t)(g->K * N) + 15) & ~(size_t)15;
    g->out_floats = g->pointwise ? 0 : ((size_t)(s->c_out * N) + 15) & ~(size_t)15;
    g->gemm_bytes = 0;
    /* the SGEMMs of a whole chunk and of the last, shorter one (the size is not monotonic) */
    for (int64_t nb = g->B, pass = 0; pass < 2; pass++, nb = s->n % g->B ? s->n % g->B : g->B) {
        size_t fwd = mdl_sgemm_workspace_size(s->c_out, nb * g->P, g->K);   /* y = W @ col */
        size_t bwd_data = mdl_sgemm_workspace_size(g->K, nb * g->P, s->c_out); /* col = W^T @ dy */
        size_t bwd_w = mdl_sgemm_workspace_size(s->c_out, g->K, nb * g->P);  /* dw = dy @ col^T */
        g->gemm_bytes = max_size(g->gemm_bytes, max_size(fwd, max_size(bwd_data, bwd_w)));
    }
    g->need = (g->col_floats + g->out_floats) * sizeof(float) + g->gemm_bytes + MDL_WS_SLACK;
    return MDL_OK;
}

/* The fast path takes its scratch memory from the workspace (or allocates it);
 * the scalar path needs none but rejects a too-small workspace all the same,
 * so a call fails or succeeds alike on every CPU. */
static mdl_status take_workspace(const char *fn, const conv_geom *g, int fast, void *ws,
                                 size_t ws_bytes, void **owned, float **out)
{
    *owned = NULL;
    *out = NULL;
    if (fast) return mdl_workspace(fn, ws, ws_bytes, g->need, owned, out);
    if (ws != NULL && ws_bytes < g->need)
        return mdl_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn,
                         ws_bytes, g->need);
    return MDL_OK;
}

mdl_status mdl_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    MDL_CHECK_PTR(h_out);
    MDL_CHECK_PTR(w_out);
    return mdl_conv2d_check_shape(__func__, s, h_out, w_out);
}

/* bytes of: the column matrix of one image + the largest SGEMM workspace + slack;
 * 0 for an invalid shape (the calls then report the error) */
size_t mdl_conv2d_workspace_size(const mdl_conv2d_shape *s)
{
    conv_geom g;
    if (geometry(__func__, s, &g) != MDL_OK) return 0;
    return g.need;
}

/* ---- scalar reference ----------------------------------------------------------- */

/* y (n, c_out, ho, wo) = bias[co] + sum over ci, i, j of
 *     x[ci, oh*sh - ph + i, ow*sw - pw + j] * w[co, ci, i, j] */
static void forward_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *x,
                           const float *w, const float *bias, float *y)
{
    const int64_t c_in = s->c_in, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t planes = s->n * s->c_out;
    int nt = mdl_threads_for((double)planes * ho * wo * c_in * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t b = pl / s->c_out, co = pl % s->c_out;
        const float *xb = x + b * c_in * h * wd, *wc = w + co * c_in * kh * kw;
        float *yp = y + pl * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++)
            for (int64_t ow = 0; ow < wo; ow++) {
                float acc = bias ? bias[co] : 0.0f;
                for (int64_t ci = 0; ci < c_in; ci++)
                    for (int64_t i = 0; i < kh; i++) {
                        int64_t ih = oh * s->stride_h - s->pad_h + i;
                        if (ih < 0 || ih >= h) continue;
                        for (int64_t j = 0; j < kw; j++) {
                            int64_t iw = ow * s->stride_w - s->pad_w + j;
                            if (iw < 0 || iw >= wd) continue;
                            acc += xb[(ci * h + ih) * wd + iw] * wc[(ci * kh + i) * kw + j];
                        }
                    }
                yp[oh * wo + ow] = acc;
            }
    }
}

/* dx (n, c_in, h, w) = the transpose of forward_scalar applied to dy, overwritten */
static void backward_data_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo,
                                 const float *dy, const float *w, float *dx)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t planes = s->n * c_in;
    int nt = mdl_threads_for((double)planes * ho * wo * c_out * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t b = pl / c_in, ci = pl % c_in;
        float *dxp = dx + pl * h * wd;
        for (int64_t k = 0; k < h * wd; k++) dxp[k] = 0.0f;
        for (int64_t co = 0; co < c_out; co++) {
            const float *dyp = dy + (b * c_out + co) * ho * wo;
            const float *wk = w + (co * c_in + ci) * kh * kw;
            for (int64_t oh = 0; oh < ho; oh++)
                for (int64_t ow = 0; ow < wo; ow++) {
                    float g = dyp[oh * wo + ow];
                    for (int64_t i = 0; i < kh; i++) {
                        int64_t ih = oh * s->stride_h - s->pad_h + i;
                        if (ih < 0 || ih >= h) continue;
                        for (int64_t j = 0; j < kw; j++) {
                            int64_t iw = ow * s->stride_w - s->pad_w + j;
                            if (iw < 0 || iw >= wd) continue;
                            dxp[ih * wd + iw] += g * wk[i * kw + j];
                        }
                    }
                }
        }
    }
}

/* dw (c_out, c_in, kh, kw) = or += sum over n, oh, ow of x[n, ci, ih, iw] * dy[n, co, oh, ow] */
static void backward_weights_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo,
                                    const float *x, const float *dy, float *dw, int accumulate)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t pairs = c_out * c_in;
    int nt = mdl_threads_for((double)pairs * s->n * ho * wo * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pr = 0; pr < pairs; pr++) {
        int64_t co = pr / c_in, ci = pr % c_in;
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                int64_t oh0, oh1, ow0, ow1;
                mdl_conv_valid_range(h, ho, s->stride_h, s->pad_h, i, &oh0, &oh1);
                mdl_conv_valid_range(wd, wo, s->stride_w, s->pad_w, j, &ow0, &ow1);
                float acc = 0.0f;
                for (int64_t b = 0; b < s->n; b++) {
                    const float *xp = x + (b * c_in + ci) * h * wd;
                    const float *dyp = dy + (b * c_out + co) * ho * wo;
                    for (int64_t oh = oh0; oh < oh1; oh++)
                        for (int64_t ow = ow0; ow < ow1; ow++)
                            acc += xp[(oh * s->stride_h - s->pad_h + i) * wd +
                                      ow * s->stride_w - s->pad_w + j] * dyp[oh * wo + ow];
                }
                float *d = dw + (pr * kh + i) * kw + j;
                *d = accumulate ? *d + acc : acc;
            }
    }
}

/* sum of p[0, count): the reference for the bias gradient */
float mdl_conv_sum_scalar(const float *p, int64_t count)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < count; i++) acc += p[i];
    return acc;
}

/* ---- fast path: im2col + SGEMM ---------------------------------------------------- */

/* The fast path runs only when AVX2 is selected, so it exists only on x86. */
/* col (K, nb * P) = the column matrices of images x[0, nb) side by side: the rows
 * (image, kernel row) are split among the threads */
static void im2col(const mdl_conv2d_shape *s, const conv_geom *g, const float *x, int64_t nb,
                   float *col)
{
#if MDL_X86
    const int64_t rows = g->K, total = nb * rows, ld = nb * g->P, image = s->c_in * s->h * s->w;
    int nt = mdl_threads_for((double)total * g->P);
    if (nt > total) nt = (int)total;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        for (int64_t q = total * t / nt, end = total * (t + 1) / nt; q < end;) {
            int64_t b = q / rows, r0 = q % rows, r1 = rows < r0 + end - q ? rows : r0 + end - q;
            mdl_conv_im2col_avx2(s, g->ho, g->wo, x + b * image, col + b * g->P, ld, r0, r1);
            q += r1 - r0;
        }
    }
#endif
}

/* dx[0, nb) = col2im of the column matrix (K, nb * P): the (image, input channel)
 * planes are split among the threads */
static void col2im(const mdl_conv2d_shape *s, const conv_geom *g, const float *col, int64_t nb,
                   float *dx)
{
#if MDL_X86
    const int64_t c_in = s->c_in, total = nb * c_in, ld = nb * g->P, image = c_in * s->h * s->w;
    int nt = mdl_threads_for((double)g->K * g->P * nb);
    if (nt > total) nt = (int)total;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        for (int64_t q = total * t / nt, end = total * (t + 1) / nt; q < end;) {
            int64_t b = q / c_in, c0 = q % c_in, c1 = c_in < c0 + end - q ? c_in : c0 + end - q;
            mdl_conv_col2im_avx2(s, g->ho, g->wo, col + b * g->P, ld, dx + b * image, c0, c1);
            q += c1 - c0;
        }
    }
#endif
}

/* buf (c_out, nb * P) <-> t[0, nb) (nb, c_out, P); to_buf copies t into buf, else
 * buf into t, adding bias[co] (when not NULL) */
static void chunk_copy(const conv_geom *g, int64_t c_out, int64_t nb, float *buf, float *t,
                       const float *bias, int to_buf)
{
    const int64_t P = g->P, rows = nb * c_out;
    int nt = mdl_threads_for((double)rows * P);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < rows; q++) {
        int64_t b = q / c_out, co = q % c_out;
        float *bp = buf + co * nb * P + b * P, *tp = t + q * P;
        if (to_buf) {
            memcpy(bp, tp, (size_t)P * sizeof(float));
        } else {
            const float add = bias ? bias[co] : 0.0f;
            for (int64_t p = 0; p < P; p++) tp[p] = bp[p] + add;
        }
    }
}

/* ---- public entry points ------------------------------------------------------------ */

/* y (n, c_out, ho, wo) = conv(x (n, c_in, h, w), w (c_out, c_in, kh, kw)) + bias (c_out or NULL) */
mdl_status mdl_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w,
                              const float *bias, float *y, void *workspace, size_t workspace_bytes)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(w);
    MDL_CHECK_PTR(y);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    st = take_workspace(__func__, &g, fast, workspace, workspace_bytes, &owned, &ws);
    if (st != MDL_OK) return st;
    if (!fast) {
        forward_scalar(s, g.ho, g.wo, x, w, bias, y);
        return MDL_OK;
    }
    const int64_t c_out = s->c_out, K = g.K, P = g.P, image = s->c_in * s->h * s->w;
    float *colbuf = ws, *outbuf = ws + g.col_floats, *gemm_ws = outbuf + g.out_floats;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += g.B) {
        const int64_t nb = s->n - b < g.B ? s->n - b : g.B;
        float *yb = y + b * c_out * P;
        if (g.pointwise) { /* x itself is the column matrix; start rows at the bias */
            if (bias)
                for (int64_t co = 0; co < c_out; co++)
                    for (int64_t p = 0; p < P; p++) yb[co * P + p] = bias[co];
            st = mdl_sgemm(0, 0, c_out, P, K, 1.0f, w, K, x + b * image, P, bias ? 1.0f : 0.0f,
                           yb, P, gemm_ws, g.gemm_bytes);
            continue;
        }
        im2col(s, &g, x + b * image, nb, colbuf);
        st = mdl_sgemm(0, 0, c_out, nb * P, K, 1.0f, w, K, colbuf, nb * P, 0.0f, outbuf, nb * P,
                       gemm_ws, g.gemm_bytes);
        if (st == MDL_OK) chunk_copy(&g, c_out, nb, outbuf, yb, bias, 0);
    }
    mdl_free(owned);
    return st;
}

/* dx (n, c_in, h, w) = conv_transpose(dy (n, c_out, ho, wo), w), overwritten */
mdl_status mdl_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy, const float *w,
                                    float *dx, void *workspace, size_t workspace_bytes)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(w);
    MDL_CHECK_PTR(dx);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    st = take_workspace(__func__, &g, fast, workspace, workspace_bytes, &owned, &ws);
    if (st != MDL_OK) return st;
    if (!fast) {
        backward_data_scalar(s, g.ho, g.wo, dy, w, dx);
        return MDL_OK;
    }
    const int64_t c_out = s->c_out, K = g.K, P = g.P, image = s->c_in * s->h * s->w;
    float *colbuf = ws, *outbuf = ws + g.col_floats, *gemm_ws = outbuf + g.out_floats;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += g.B) {
        const int64_t nb = s->n - b < g.B ? s->n - b : g.B;
        const float *dyb = dy + b * c_out * P;
        if (g.pointwise) { /* dx = W^T @ dy directly */
            st = mdl_sgemm(1, 0, K, P, c_out, 1.0f, w, K, dyb, P, 0.0f, dx + b * image, P,
                           gemm_ws, g.gemm_bytes);
            continue;
        }
        chunk_copy(&g, c_out, nb, outbuf, (float *)dyb, NULL, 1);
        st = mdl_sgemm(1, 0, K, nb * P, c_out, 1.0f, w, K, outbuf, nb * P, 0.0f, colbuf, nb * P,
                       gemm_ws, g.gemm_bytes);
        if (st == MDL_OK) col2im(s, &g, colbuf, nb, dx + b * image);
    }
    mdl_free(owned);
    return st;
}

/* dw (c_out, c_in, kh, kw) = or += sum over images of dy[b] (c_out, P) @ col[b]^T (P, K) */
mdl_status mdl_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x, const float *dy,
                                       float *dw, int accumulate, void *workspace,
                                       size_t workspace_bytes)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(dw);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    st = take_workspace(__func__, &g, fast, workspace, workspace_bytes, &owned, &ws);
    if (st != MDL_OK) return st;
    if (!fast) {
        backward_weights_scalar(s, g.ho, g.wo, x, dy, dw, accumulate != 0);
        return MDL_OK;
    }
    const int64_t c_out = s->c_out, K = g.K, P = g.P, image = s->c_in * s->h * s->w;
    float *colbuf = ws, *outbuf = ws + g.col_floats, *gemm_ws = outbuf + g.out_floats;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += g.B) {
        const int64_t nb = s->n - b < g.B ? s->n - b : g.B;
        const float beta = (b > 0 || accumulate) ? 1.0f : 0.0f;
        if (g.pointwise) {
            st = mdl_sgemm(0, 1, c_out, K, P, 1.0f, dy + b * c_out * P, P, x + b * image, P,
                           beta, dw, K, gemm_ws, g.gemm_bytes);
            continue;
        }
        im2col(s, &g, x + b * image, nb, colbuf);
        chunk_copy(&g, c_out, nb, outbuf, (float *)(dy + b * c_out * P), NULL, 1);
        st = mdl_sgemm(0, 1, c_out, K, nb * P, 1.0f, outbuf, nb * P, colbuf, nb * P, beta, dw, K,
                       gemm_ws, g.gemm_bytes);
    }
    mdl_free(owned);
    return st;
}

/* db (c_out) = or += sum of dy (n, c_out, ho, wo) over n, ho, wo */
mdl_status mdl_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy, float *db,
                                    int accumulate)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(db);
    const int64_t c_out = s->c_out, P = g.P;
    int avx2 = mdl_use_avx2();
    int nt = mdl_threads_for((double)s->n * c_out * P);
    if (nt > c_out) nt = (int)c_out;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t co = 0; co < c_out; co++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < s->n; b++) {
            const float *p = dy + (b * c_out + co) * P;
            acc += avx2 ? mdl_conv_sum_avx2(p, P) : mdl_conv_sum_scalar(p, P);
        }
        db[co] = accumulate ? db[co] + acc : acc;
    }
    return MDL_OK;
}
