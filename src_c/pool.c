/* pool.c -- 2-D max and average pooling and global average pooling, forward
 * and backward, with PyTorch's semantics.  Scalar references here; AVX2
 * versions in pool_avx2.c.  Every kernel works on one (n, c) plane; the
 * public functions check the shape and split the planes over threads. */
#include "common.h"
#include "pool.h"
#include "checks.h"
#include "act.h"

#include <string.h>

/* ---- scalar references ---------------------------------------------------- */

/* y[oh][ow0:ow1] = max over each window */
void mdl_max_pool_cols_scalar(const mdl_pool_geom *g, const float *x, float *y, int64_t oh,
                              int64_t ow0, int64_t ow1)
{
    int64_t hs, he, ws, we, span;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
    for (int64_t ow = ow0; ow < ow1; ow++) {
        mdl_pool_span(ow, g->sw, g->pw, g->kw, g->w, &ws, &we, &span);
        mdl_pool_argmax(x, g->w, hs, he, ws, we, &y[oh * g->wo + ow]);
    }
}

/* dx[argmax of window (oh, ow)] += dy[oh][ow] for ow in [ow0, ow1) */
void mdl_max_pool_back_cols_scalar(const mdl_pool_geom *g, const float *x, const float *dy,
                                   float *dx, int64_t oh, int64_t ow0, int64_t ow1)
{
    int64_t hs, he, ws, we, span;
    float m;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
    for (int64_t ow = ow0; ow < ow1; ow++) {
        mdl_pool_span(ow, g->sw, g->pw, g->kw, g->w, &ws, &we, &span);
        dx[mdl_pool_argmax(x, g->w, hs, he, ws, we, &m)] += dy[oh * g->wo + ow];
    }
}

void mdl_max_pool_tap_cols_scalar(const mdl_pool_geom *g, const float *x, float *y,
                                  uint8_t *tap, int64_t oh, int64_t ow0, int64_t ow1)
{
    int64_t hs, he, ws, we, span;
    const int64_t r0 = oh * g->sh - g->ph;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
    for (int64_t ow = ow0; ow < ow1; ow++) {
        mdl_pool_span(ow, g->sw, g->pw, g->kw, g->w, &ws, &we, &span);
        const int64_t best = mdl_pool_argmax(x, g->w, hs, he, ws, we, &y[oh * g->wo + ow]);
        tap[ow] = (uint8_t)((best / g->w - r0) * g->kw + best % g->w - (ow * g->sw - g->pw));
    }
}

/* y[oh][ow0:ow1] = sum over the in-bounds part of each window / padded window size */
void mdl_avg_pool_cols_scalar(const mdl_pool_geom *g, const float *x, float *y, int64_t oh,
                              int64_t ow0, int64_t ow1)
{
    int64_t hs, he, ws, we, hspan, wspan;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
    for (int64_t ow = ow0; ow < ow1; ow++) {
        mdl_pool_span(ow, g->sw, g->pw, g->kw, g->w, &ws, &we, &wspan);
        float sum = 0.0f;
        for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) sum += x[ih * g->w + iw];
        y[oh * g->wo + ow] = sum / (float)(hspan * wspan);
    }
}

/* dx[window (oh, ow)] += dy[oh][ow] / padded window size for ow in [ow0, ow1) */
void mdl_avg_pool_back_cols_scalar(const mdl_pool_geom *g, const float *dy, float *dx, int64_t oh,
                                   int64_t ow0, int64_t ow1)
{
    int64_t hs, he, ws, we, hspan, wspan;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
    for (int64_t ow = ow0; ow < ow1; ow++) {
        mdl_pool_span(ow, g->sw, g->pw, g->kw, g->w, &ws, &we, &wspan);
        float grad = dy[oh * g->wo + ow] / (float)(hspan * wspan);
        for (int64_t ih = hs; ih < he; ih++)
            for (int64_t iw = ws; iw < we; iw++) dx[ih * g->w + iw] += grad;
    }
}

void mdl_max_pool_plane_scalar(const mdl_pool_geom *g, const float *x, float *y)
{
    for (int64_t oh = 0; oh < g->ho; oh++) mdl_max_pool_cols_scalar(g, x, y, oh, 0, g->wo);
}

void mdl_max_pool_back_plane_scalar(const mdl_pool_geom *g, const float *x, const float *dy,
                                    float *dx)
{
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
    for (int64_t oh = 0; oh < g->ho; oh++) mdl_max_pool_back_cols_scalar(g, x, dy, dx, oh, 0, g->wo);
}

void mdl_max_pool_tap_plane_scalar(const mdl_pool_geom *g, const float *x, float *y,
                                   uint8_t *tap)
{
    for (int64_t oh = 0; oh < g->ho; oh++)
        mdl_max_pool_tap_cols_scalar(g, x, y, tap + oh * g->wo, oh, 0, g->wo);
}

void mdl_avg_pool_plane_scalar(const mdl_pool_geom *g, const float *x, float *y)
{
    for (int64_t oh = 0; oh < g->ho; oh++) mdl_avg_pool_cols_scalar(g, x, y, oh, 0, g->wo);
}

void mdl_avg_pool_back_plane_scalar(const mdl_pool_geom *g, const float *dy, float *dx)
{
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
    for (int64_t oh = 0; oh < g->ho; oh++) mdl_avg_pool_back_cols_scalar(g, dy, dx, oh, 0, g->wo);
}

void mdl_avg_pool_back_planes_scalar(const mdl_pool_geom *g, int64_t planes, const float *dy,
                                     float *dx)
{
    for (int64_t p = 0; p < planes; p++)
        mdl_avg_pool_back_plane_scalar(g, dy + p * g->ho * g->wo, dx + p * g->h * g->w);
}

/* mean of x[hw], summed in double */
float mdl_global_avg_scalar(int64_t hw, const float *x)
{
    double sum = 0.0;
    for (int64_t i = 0; i < hw; i++) sum += x[i];
    return (float)(sum / (double)hw);
}

/* dx[hw] = dy / hw */
void mdl_global_avg_back_scalar(int64_t hw, float dy, float *dx)
{
    float v = dy / (float)hw;
    for (int64_t i = 0; i < hw; i++) dx[i] = v;
}

/* ---- shapes and checks ---------------------------------------------------- */

#define LIMIT ((int64_t)1 << 31)

/* mdl_pool2d_check_shape (checks.h), then the geometry of the kernels */
mdl_status mdl_pool_geometry(const char *fn, const mdl_pool2d_shape *s, mdl_pool_geom *g)
{
    int64_t ho = 0, wo = 0;
    mdl_status st = mdl_pool2d_check_shape(fn, s, &ho, &wo);
    if (st != MDL_OK) return st;
    g->h = s->h;
    g->w = s->w;
    g->kh = s->kh;
    g->kw = s->kw;
    g->sh = s->stride_h;
    g->sw = s->stride_w;
    g->ph = s->pad_h;
    g->pw = s->pad_w;
    g->ho = ho;
    g->wo = wo;
    /* interior: ow * sw - pw >= 0 and ow * sw - pw + kw <= w */
    int64_t lo = (g->pw + g->sw - 1) / g->sw;
    int64_t hi = g->w + g->pw - g->kw >= 0 ? (g->w + g->pw - g->kw) / g->sw + 1 : 0;
    g->ow_lo = lo < wo ? lo : wo;
    g->ow_hi = hi < wo ? hi : wo;
    g->vec_ok = g->h * g->w < LIMIT && g->sw < ((int64_t)1 << 24);
    return MDL_OK;
}

mdl_status mdl_pool2d_output_size(const mdl_pool2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    const char *fn = "mdl_pool2d_output_size";
    MDL_CHECK_PTR(h_out);
    MDL_CHECK_PTR(w_out);
    mdl_pool_geom g;
    mdl_status st = mdl_pool_geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    *h_out = g.ho;
    *w_out = g.wo;
    return MDL_OK;
}

/* ---- dispatch ------------------------------------------------------------- */

/* the max pooling of one plane by the fastest kernel the CPU and the shape allow */
typedef void (*plane_fn)(const mdl_pool_geom *g, const float *x, float *y);
static plane_fn max_plane_kernel(const mdl_pool_geom *g)
{
    if (!mdl_use_avx2() || !g->vec_ok) return mdl_max_pool_plane_scalar;
    return mdl_use_avx512() && mdl_max_pool_avx512_applies(g) ? mdl_max_pool_plane_avx512
                                                               : mdl_max_pool_plane_avx2;
}

/* the same for max pooling with taps */
typedef void (*tap_plane_fn)(const mdl_pool_geom *g, const float *x, float *y, uint8_t *tap);
static tap_plane_fn max_tap_plane_kernel(const mdl_pool_geom *g)
{
    if (!mdl_use_avx2() || !g->vec_ok) return mdl_max_pool_tap_plane_scalar;
    return mdl_use_avx512() && mdl_max_pool_avx512_applies(g) ? mdl_max_pool_tap_plane_avx512
                                                               : mdl_max_pool_tap_plane_avx2;
}

/* Planes whose windows tile whole rows (no padding above or below, as many kernel rows
 * as stride rows, and the plane's height a multiple of them) pool the same as a plane
 * of several of them stacked: the kernels take stacks of about STACK_FLOATS elements
 * instead of one small plane at a time (512 planes of 2x2 under 2x2 / 2: 1.8-3x; with
 * rows of 1-4 outputs, pool_avx2.c's tiled2_plane then fills its vectors across the
 * planes).  stacked: planes per stack; stack_geom: a stack's geometry. */
#define STACK_FLOATS 4096
static int64_t stacked(const mdl_pool_geom *g)
{
    if (g->ph != 0 || g->kh != g->sh || g->h != g->ho * g->kh) return 1;
    const int64_t m = STACK_FLOATS / (g->h * g->w);
    return m > 1 ? m : 1;
}
static mdl_pool_geom stack_geom(const mdl_pool_geom *g, int64_t count)
{
    mdl_pool_geom st = *g;
    st.h = g->h * count;
    st.ho = g->ho * count;
    return st;
}

void mdl_pool_planes(const mdl_pool_geom *g, int avg, int relu, int64_t planes, const float *x,
                     float *y)
{
    const int avx2 = mdl_use_avx2() && g->vec_ok;
    const plane_fn pool = avg ? (avx2 ? mdl_avg_pool_plane_avx2 : mdl_avg_pool_plane_scalar)
                              : max_plane_kernel(g);
    const int64_t hw = g->h * g->w, ohw = g->ho * g->wo, m = stacked(g);
    for (int64_t p = 0; p < planes; p += m) {
        const mdl_pool_geom st = stack_geom(g, planes - p < m ? planes - p : m);
        pool(&st, x + p * hw, y + p * ohw);
    }
    if (relu) (avx2 ? mdl_relu_forward_avx2 : mdl_relu_forward_scalar)(0, planes * ohw, y, y);
}

/* Run `body` for every plane p in [0, count), in runs of planes handed out one at a
 * time to the threads (mdl_dynamic_chunk). */
#define PLANES(count, work, body)                                             \
    do {                                                                      \
        int nt = mdl_threads_for(work);                                       \
        const int64_t chunk = mdl_dynamic_chunk(count, nt);                   \
        _Pragma("omp parallel for schedule(dynamic, chunk) num_threads(nt)")  \
        for (int64_t p = 0; p < (count); p++) { body; }                       \
    } while (0)

/* Run `body` for runs of planes [p, p + len) that together are [0, count), handed out
 * one at a time to the threads (mdl_dynamic_chunk). */
#define PLANE_RUNS(count, work, body)                                         \
    do {                                                                      \
        int nt = mdl_threads_for(work);                                       \
        const int64_t chunk = mdl_dynamic_chunk(count, nt);                   \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nt)")      \
        for (int64_t p = 0; p < (count); p += chunk) {                        \
            const int64_t len = (count) - p < chunk ? (count) - p : chunk;     \
            body;                                                             \
        }                                                                     \
    } while (0)

#define CHECK_PTRS2(a, b) \
    MDL_CHECK((a) != NULL && (b) != NULL, "%s: " #a " and " #b " must not be NULL", fn)

#define MAX_TAPS 256 /* a tap is one byte */

static mdl_status check_taps(const char *fn, const mdl_pool_geom *g)
{
    MDL_CHECK(g->kh * g->kw <= MAX_TAPS, "%s: the tap of a window of %lld x %lld elements does "
              "not fit a byte (at most %d)", fn, (long long)g->kh, (long long)g->kw, MAX_TAPS);
    return MDL_OK;
}

/* y = max(y, 0) over count outputs as mdl_relu_forward, and MDL_POOL_NO_TAP where y is
 * not above 0 (the ReLU passes no gradient there) */
static void relu_taps(float *y, uint8_t *tap, int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        const int pass = y[i] > 0.0f;
        y[i] = y[i] < 0.0f ? 0.0f : y[i];
        tap[i] = pass ? tap[i] : MDL_POOL_NO_TAP;
    }
}

/* Max pooling, forward or backward (back), of x read through the map `in` (NULL: x
 * itself): with a map, each thread reads its planes through it into a plane of its own
 * and pools that.  A forward with tap (not NULL) also records each maximum's tap, and
 * with relu applies a ReLU to its outputs (relu_taps). */
static mdl_status max_pool(const char *fn, int back, const mdl_pool2d_shape *s, const float *x,
                           const mdl_affine *in, const float *dy, float *out, uint8_t *tap,
                           int relu)
{
    mdl_pool_geom g;
    mdl_status st = mdl_pool_geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    if (back) {
        CHECK_PTRS2(x, dy);
        MDL_CHECK((out) != NULL, "%s: dx must not be NULL", fn);
    } else {
        MDL_CHECK((x) != NULL && (out) != NULL, "%s: x and y must not be NULL", fn);
    }
    if (tap && (st = check_taps(fn, &g)) != MDL_OK) return st;
    MDL_CHECK(!relu || g.kh * g.kw < MAX_TAPS, "%s: a window of %lld x %lld elements leaves "
              "no tap free for MDL_POOL_NO_TAP (at most %d elements)", fn, (long long)g.kh,
              (long long)g.kw, MAX_TAPS - 1);
    const int64_t planes = s->n * s->c, hw = g.h * g.w, ohw = g.ho * g.wo;
    const int avx2 = mdl_use_avx2() && g.vec_ok;
    const plane_fn max_plane = max_plane_kernel(&g);
    const tap_plane_fn max_tap_plane = max_tap_plane_kernel(&g);
    int nt = mdl_threads_for((double)planes * ((double)ohw * (double)(g.kh * g.kw) +
                                               (back ? (double)hw : 0.0)));
    /* stacks of m planes (stacked), the last one shorter */
    const int64_t m = stacked(&g), stacks = (planes + m - 1) / m;
    const mdl_pool_geom whole = stack_geom(&g, m), last = stack_geom(&g, planes - (stacks - 1) * m);
    float *planebuf = NULL;
    if (in) {
        planebuf = mdl_alloc((size_t)nt * (size_t)(m * hw) * sizeof(float));
        if (!planebuf) return mdl_error(MDL_ERR_ALLOC, "%s: no memory for %d planes of %lld "
                                        "floats", fn, nt, (long long)(m * hw));
    }
    const int64_t chunk = mdl_dynamic_chunk(stacks, nt);
#pragma omp parallel num_threads(nt)
    {
        float *mine = NULL;
        if (planebuf) {
#ifdef _OPENMP
            mine = planebuf + (size_t)omp_get_thread_num() * (size_t)(m * hw);
#else
            mine = planebuf;
#endif
        }
#pragma omp for schedule(dynamic, chunk)
        for (int64_t q = 0; q < stacks; q++) {
            const int64_t p = q * m;
            const mdl_pool_geom *gq = q == stacks - 1 ? &last : &whole;
            const float *xp = x + p * hw;
            if (mine) {
                for (int64_t j = 0; j < gq->h / g.h; j++) {
                    const mdl_affine_ch f = mdl_affine_at(in, (p + j) % s->c);
                    if (avx2) mdl_affine_row_avx2(xp + j * hw, hw, f, mine + j * hw);
                    else mdl_affine_row_scalar(xp + j * hw, hw, f, mine + j * hw);
                }
                xp = mine;
            }
            if (tap) {
                max_tap_plane(gq, xp, out + p * ohw, tap + p * ohw);
                if (relu) relu_taps(out + p * ohw, tap + p * ohw, gq->h / g.h * ohw);
            } else if (!back) {
                max_plane(gq, xp, out + p * ohw);
            } else if (avx2) {
                mdl_max_pool_back_plane_avx2(gq, xp, dy + p * ohw, out + p * hw);
            } else {
                mdl_max_pool_back_plane_scalar(gq, xp, dy + p * ohw, out + p * hw);
            }
        }
    }
    mdl_free(planebuf);
    return MDL_OK;
}

mdl_status mdl_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
{
    return max_pool(__func__, 0, s, x, NULL, NULL, y, NULL, 0);
}

mdl_status mdl_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x, const float *dy,
                                   float *dx)
{
    return max_pool(__func__, 1, s, x, NULL, dy, dx, NULL, 0);
}

mdl_status mdl_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                        const mdl_affine *in, float *y)
{
    return max_pool(__func__, 0, s, x, in, NULL, y, NULL, 0);
}

mdl_status mdl_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                         const mdl_affine *in, const float *dy, float *dx)
{
    return max_pool(__func__, 1, s, x, in, dy, dx, NULL, 0);
}

mdl_status mdl_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                         const mdl_affine *in, float *y, uint8_t *tap)
{
    const char *fn = __func__;
    MDL_CHECK(tap != NULL, "%s: tap must not be NULL", fn);
    return max_pool(fn, 0, s, x, in, NULL, y, tap, 0);
}

mdl_status mdl_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s, const float *x,
                                              const mdl_affine *in, float *y, uint8_t *tap)
{
    const char *fn = __func__;
    MDL_CHECK(tap != NULL, "%s: tap must not be NULL", fn);
    return max_pool(fn, 0, s, x, in, NULL, y, tap, 1);
}

/* dx of one plane from the taps: each window's dy added at its tap, windows in order
 * (the scatter order of mdl_max_pool_back_plane_scalar, so the sums are the same);
 * to_row / to_col: a tap's offsets in its window.  MDL_POOL_NO_TAP (in windows of fewer
 * than 256 elements) adds nothing.  0, or 1 for a tap outside the window's in-bounds
 * part. */
static int max_pool_back_taps(const mdl_pool_geom *g, const uint8_t *tap, const float *dy,
                              float *dx, const int64_t *to_row, const int64_t *to_col)
{
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
    const int64_t taps = g->kh * g->kw;
    for (int64_t oh = 0; oh < g->ho; oh++) {
        const int64_t r0 = oh * g->sh - g->ph;
        for (int64_t ow = 0; ow < g->wo; ow++) {
            const int64_t t = tap[oh * g->wo + ow];
            if (t == MDL_POOL_NO_TAP && taps < MAX_TAPS) continue;
            if (t >= taps) return 1;
            const int64_t r = r0 + to_row[t], c = ow * g->sw - g->pw + to_col[t];
            if (r < 0 || r >= g->h || c < 0 || c >= g->w) return 1;
            dx[r * g->w + c] += dy[oh * g->wo + ow];
        }
    }
    return 0;
}

mdl_status mdl_max_pool2d_backward_argmax(const mdl_pool2d_shape *s, const uint8_t *tap,
                                          const float *dy, float *dx)
{
    const char *fn = __func__;
    mdl_pool_geom g;
    mdl_status st = mdl_pool_geometry(fn, s, &g);
    if (st != MDL_OK || (st = check_taps(fn, &g)) != MDL_OK) return st;
    MDL_CHECK(tap != NULL && dy != NULL && dx != NULL, "%s: tap, dy and dx must not be NULL", fn);
    int64_t to_row[MAX_TAPS], to_col[MAX_TAPS];
    for (int64_t t = 0; t < g.kh * g.kw; t++) to_row[t] = t / g.kw, to_col[t] = t % g.kw;
    const int64_t planes = s->n * s->c, hw = g.h * g.w, ohw = g.ho * g.wo;
    const int64_t m = stacked(&g), stacks = (planes + m - 1) / m;
    const mdl_pool_geom whole = stack_geom(&g, m), last = stack_geom(&g, planes - (stacks - 1) * m);
    const int k3s2 = mdl_use_avx2() && g.vec_ok && mdl_max_pool_back_taps_k3s2_applies(&g);
    int bad = 0, nt = mdl_threads_for((double)planes * (double)(ohw + hw));
    const int64_t chunk = mdl_dynamic_chunk(stacks, nt);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nt) reduction(| : bad)
    for (int64_t q = 0; q < stacks; q++)
        bad |= k3s2 ? mdl_max_pool_back_taps_k3s2_avx2(&whole, tap + q * ohw, dy + q * ohw,
                                                       dx + q * hw)
                    : max_pool_back_taps(q == stacks - 1 ? &last : &whole, tap + q * m * ohw,
                                         dy + q * m * ohw, dx + q * m * hw, to_row, to_col);
    MDL_CHECK(!bad, "%s: a tap lies outside its window's part inside the input: the taps must "
              "come from mdl_max_pool2d_forward_argmax with the same shape", fn);
    return MDL_OK;
}

mdl_status mdl_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
{
    const char *fn = __func__;
    mdl_pool_geom g;
    mdl_status st = mdl_pool_geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(x, y);
    int64_t planes = s->n * s->c, in = g.h * g.w, out = g.ho * g.wo;
    int avx2 = mdl_use_avx2() && g.vec_ok;
    PLANES(planes, (double)planes * (double)out * (double)(g.kh * g.kw),
           if (avx2) mdl_avg_pool_plane_avx2(&g, x + p * in, y + p * out);
           else mdl_avg_pool_plane_scalar(&g, x + p * in, y + p * out));
    return MDL_OK;
}

/* The average pool's backward; with x (not NULL), each run of planes then masked as
 * mdl_relu_backward(x, dx) while it is in the cache */
static mdl_status avg_pool_backward(const char *fn, const mdl_pool2d_shape *s, const float *x,
                                    const float *dy, float *dx)
{
    mdl_pool_geom g;
    mdl_status st = mdl_pool_geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(dy, dx);
    int64_t planes = s->n * s->c, in = g.h * g.w, out = g.ho * g.wo;
    int avx2 = mdl_use_avx2() && g.vec_ok, relu_avx2 = mdl_use_avx2();
    PLANE_RUNS(planes, (double)planes * ((double)out * (double)(g.kh * g.kw) + (double)in),
               (avx2 ? mdl_avg_pool_back_planes_avx2 : mdl_avg_pool_back_planes_scalar)(
                   &g, len, dy + p * out, dx + p * in);
               if (x) (relu_avx2 ? mdl_relu_backward_avx2 : mdl_relu_backward_scalar)(
                   p * in, (p + len) * in, x, dx, dx));
    return MDL_OK;
}

mdl_status mdl_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy, float *dx)
{
    return avg_pool_backward(__func__, s, NULL, dy, dx);
}

mdl_status mdl_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                        const float *dy, float *dx)
{
    const char *fn = __func__;
    MDL_CHECK(x != NULL, "%s: x must not be NULL", fn);
    return avg_pool_backward(fn, s, x, dy, dx);
}

static mdl_status global_check(const char *fn, int64_t n, int64_t c, int64_t h, int64_t w)
{
    MDL_CHECK(n >= 1, "%s: n must be >= 1, got %lld", fn, (long long)n);
    MDL_CHECK(c >= 1, "%s: c must be >= 1, got %lld", fn, (long long)c);
    MDL_CHECK(h >= 1, "%s: h must be >= 1, got %lld", fn, (long long)h);
    MDL_CHECK(w >= 1, "%s: w must be >= 1, got %lld", fn, (long long)w);
    MDL_CHECK(h <= INT64_MAX / w && n <= INT64_MAX / c && n * c <= INT64_MAX / (h * w),
              "%s: n * c * h * w overflows int64 (%lld, %lld, %lld, %lld)", fn, (long long)n,
              (long long)c, (long long)h, (long long)w);
    return MDL_OK;
}

mdl_status mdl_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w,
                                         const float *x, float *y)
{
    const char *fn = __func__;
    mdl_status st = global_check(fn, n, c, h, w);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(x, y);
    int64_t planes = n * c, hw = h * w;
    int avx2 = mdl_use_avx2();
    PLANES(planes, (double)planes * (double)hw,
           y[p] = avx2 ? mdl_global_avg_avx2(hw, x + p * hw) : mdl_global_avg_scalar(hw, x + p * hw));
    return MDL_OK;
}

mdl_status mdl_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w,
                                          const float *dy, float *dx)
{
    const char *fn = __func__;
    mdl_status st = global_check(fn, n, c, h, w);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(dy, dx);
    int64_t planes = n * c, hw = h * w;
    int avx2 = mdl_use_avx2();
    PLANES(planes, (double)planes * (double)hw,
           if (avx2) mdl_global_avg_back_avx2(hw, dy[p], dx + p * hw);
           else mdl_global_avg_back_scalar(hw, dy[p], dx + p * hw));
    return MDL_OK;
}
