/* pool.cu -- 2-D max and average pooling and global average pooling, forward
 * and backward, with PyTorch's semantics (as src_c/pool.c: same output sizes,
 * window spans, -inf start and NaN rule, first maximum on ties, avg divisor
 * counting the padding).  One thread per output element in the forwards; the
 * backwards are gathers, one thread per input element summing the windows
 * that contain it in row-major window order (the CPU's order: no atomics, and
 * max pooling's gradient is bit for bit the scalar reference's).  The fused max
 * pooling reads x through a per-channel affine map and ReLU (mdl_affine), applied
 * to real pixels only as each window is read (padding never wins either way); a
 * template flag keeps it out of the plain kernels.  The argmax variants record
 * each window's winner as a tap, ky * kw + kx from the window's unclipped
 * top-left corner, in a byte (windows of at most 256 elements); their backward
 * gathers dy by those taps and reads no x. */
#include <math.h>
#include "common.cuh"
#include "../src_c/checks.h"

namespace {

struct pool_geom {
    int64_t planes;                 /* n * c */
    int h, w, kh, kw, sh, sw, ph, pw, ho, wo;
    int c;                          /* channels: plane p is channel p % c */
};

/* The window of output row (or column) o: [lo, hi) clipped to the input; span is
 * the unclipped extent limited to the padded input (the avg-pool divisor factor). */
__device__ __forceinline__ void span(int o, int stride, int pad, int k, int size, int &lo,
                                     int &hi, int &sp)
{
    const int start = o * stride - pad;
    const int end = min(start + k, size + pad);
    sp = end - start;
    lo = max(start, 0);
    hi = min(end, size);
}

/* The window's maximum and its flat index in the plane (PyTorch's CPU rule); FUSED:
 * of in(x) for channel ch. */
template <bool FUSED>
__device__ __forceinline__ int window_argmax(const float *x, int w, int hs, int he, int ws, int we,
                                             const mdl_input_map<FUSED> &in, int64_t ch,
                                             float &max)
{
    int best = hs * w + ws;
    float m = -INFINITY;
    for (int ih = hs; ih < he; ih++)
        for (int iw = ws; iw < we; iw++) {
            float v = x[ih * w + iw];
            if constexpr (FUSED) v = in(v, ch);
            if (v > m || isnan(v)) {
                m = v;
                best = ih * w + iw;
            }
        }
    max = m;
    return best;
}

/* The output rows (or columns) whose windows contain input index i: [lo, hi].
 * Window o covers [o*stride - pad, o*stride - pad + k) clipped to the input. */
__device__ __forceinline__ void containing(int i, int stride, int pad, int k, int n_out, int &lo,
                                           int &hi)
{
    const int a = i + pad - k; /* o*stride > a */
    lo = a < 0 ? 0 : a / stride + 1;
    hi = min((i + pad) / stride, n_out - 1);
}

/* y (planes, ho, wo) = max over each window of x (planes, h, w); FUSED: of in(x).  tap
 * (not NULL): each maximum's tap, ky * kw + kx from the window's unclipped top-left
 * corner (oh*sh - ph, ow*sw - pw).  relu: y = max(y, 0) as relu_fwd, and the tap
 * MDL_POOL_NO_TAP where the maximum is not above 0 (no gradient passes) */
template <bool FUSED>
__global__ void max_pool_fwd(pool_geom g, const float *x, float *y, uint8_t *tap,
                             mdl_input_map<FUSED> in, bool relu)
{
    const int64_t total = g.planes * g.ho * g.wo;
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pl = o / ((int64_t)g.ho * g.wo);
        const int q = (int)(o - pl * g.ho * g.wo), oh = q / g.wo, ow = q - oh * g.wo;
        int hs, he, ws, we, sp;
        span(oh, g.sh, g.ph, g.kh, g.h, hs, he, sp);
        span(ow, g.sw, g.pw, g.kw, g.w, ws, we, sp);
        float m;
        const int best = window_argmax<FUSED>(x + pl * g.h * g.w, g.w, hs, he, ws, we, in,
                                              pl % g.c, m);
        y[o] = relu && m < 0.0f ? 0.0f : m;
        if (tap) {
            const int bh = best / g.w, bw = best - bh * g.w;
            tap[o] = relu && !(m > 0.0f)
                         ? (uint8_t)MDL_POOL_NO_TAP
                         : (uint8_t)((bh - (oh * g.sh - g.ph)) * g.kw + bw - (ow * g.sw - g.pw));
        }
    }
}

/* dx (planes, h, w) = sum of dy over the windows whose first maximum is this element;
 * FUSED: the maxima of in(x) */
template <bool FUSED>
__global__ void max_pool_bwd(pool_geom g, const float *x, const float *dy, float *dx,
                             mdl_input_map<FUSED> in)
{
    const int64_t total = g.planes * g.h * g.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pl = i / ((int64_t)g.h * g.w);
        const int q = (int)(i - pl * g.h * g.w), ih = q / g.w, iw = q - ih * g.w;
        const float *xp = x + pl * g.h * g.w;
        const float *dyp = dy + pl * g.ho * g.wo;
        const int64_t ch = pl % g.c;
        int oh0, oh1, ow0, ow1;
        containing(ih, g.sh, g.ph, g.kh, g.ho, oh0, oh1);
        containing(iw, g.sw, g.pw, g.kw, g.wo, ow0, ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++) {
            int hs, he, sp;
            span(oh, g.sh, g.ph, g.kh, g.h, hs, he, sp);
            for (int ow = ow0; ow <= ow1; ow++) {
                int ws, we;
                span(ow, g.sw, g.pw, g.kw, g.w, ws, we, sp);
                float m;
                if (window_argmax<FUSED>(xp, g.w, hs, he, ws, we, in, ch, m) == q)
                    acc += dyp[oh * g.wo + ow];
            }
        }
        dx[i] = acc;
    }
}

/* dx (planes, h, w) = sum of dy over the windows whose tap (max_pool_fwd) is this
 * element, in row-major window order; a tap that names no element of the plane (a
 * padding position, or >= kh * kw: MDL_POOL_NO_TAP) matches no thread and is dropped */
__global__ void max_pool_bwd_tap(pool_geom g, const uint8_t *tap, const float *dy, float *dx)
{
    const int64_t total = g.planes * g.h * g.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pl = i / ((int64_t)g.h * g.w);
        const int q = (int)(i - pl * g.h * g.w), ih = q / g.w, iw = q - ih * g.w;
        const uint8_t *tp = tap + pl * g.ho * g.wo;
        const float *dyp = dy + pl * g.ho * g.wo;
        int oh0, oh1, ow0, ow1;
        containing(ih, g.sh, g.ph, g.kh, g.ho, oh0, oh1);
        containing(iw, g.sw, g.pw, g.kw, g.wo, ow0, ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++) {
            /* this element's tap in window (oh, ow) is t0 - ow * sw */
            const int t0 = (ih - (oh * g.sh - g.ph)) * g.kw + iw + g.pw;
            for (int ow = ow0; ow <= ow1; ow++)
                if (tp[oh * g.wo + ow] == t0 - ow * g.sw) acc += dyp[oh * g.wo + ow];
        }
        dx[i] = acc;
    }
}

/* y (planes, ho, wo) = sum over the in-bounds part of each window / padded window size */
__global__ void avg_pool_fwd(pool_geom g, const float *x, float *y)
{
    const int64_t total = g.planes * g.ho * g.wo;
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pl = o / ((int64_t)g.ho * g.wo);
        const int q = (int)(o - pl * g.ho * g.wo), oh = q / g.wo, ow = q - oh * g.wo;
        int hs, he, ws, we, hspan, wspan;
        span(oh, g.sh, g.ph, g.kh, g.h, hs, he, hspan);
        span(ow, g.sw, g.pw, g.kw, g.w, ws, we, wspan);
        const float *xp = x + pl * g.h * g.w;
        float sum = 0.0f;
        for (int ih = hs; ih < he; ih++)
            for (int iw = ws; iw < we; iw++) sum += xp[ih * g.w + iw];
        y[o] = sum / (float)((int64_t)hspan * wspan);
    }
}

/* dx (planes, h, w) = sum over the windows containing this element of dy / padded window
 * size; relu_x (not NULL): 0 where relu_x is not above 0 (relu_bwd's mask) */
__global__ void avg_pool_bwd(pool_geom g, const float *dy, float *dx, const float *relu_x)
{
    const int64_t total = g.planes * g.h * g.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pl = i / ((int64_t)g.h * g.w);
        const int q = (int)(i - pl * g.h * g.w), ih = q / g.w, iw = q - ih * g.w;
        const float *dyp = dy + pl * g.ho * g.wo;
        int oh0, oh1, ow0, ow1;
        containing(ih, g.sh, g.ph, g.kh, g.ho, oh0, oh1);
        containing(iw, g.sw, g.pw, g.kw, g.wo, ow0, ow1);
        float acc = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++) {
            int lo, hi, hspan;
            span(oh, g.sh, g.ph, g.kh, g.h, lo, hi, hspan);
            for (int ow = ow0; ow <= ow1; ow++) {
                int wspan;
                span(ow, g.sw, g.pw, g.kw, g.w, lo, hi, wspan);
                acc += dyp[oh * g.wo + ow] / (float)((int64_t)hspan * wspan);
            }
        }
        dx[i] = relu_x && !(relu_x[i] > 0.0f) ? 0.0f : acc;
    }
}

/* y (planes) = mean of x (planes, hw), a warp per plane, summed in double */
__global__ void global_avg_fwd(int64_t planes, int64_t hw, const float *x, float *y)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t pl = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); pl < planes;
         pl += warps) {
        const float *xp = x + pl * hw;
        double s = 0.0;
        for (int64_t i = lane; i < hw; i += 32) s += xp[i];
        s = mdl_warp_sum(s);
        if (lane == 0) y[pl] = (float)(s / (double)hw);
    }
}

/* dx (planes, hw) = dy (planes) / hw */
__global__ void global_avg_bwd(int64_t planes, int64_t hw, const float *dy, float *dx)
{
    const int64_t total = planes * hw;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = dy[i / hw] / (float)hw;
}

} /* namespace */

/* ---- shapes and checks (src_c/pool.c) ------------------------------------------- */

/* mdl_pool2d_check_shape (src_c/checks.h), then the limits of the kernels */
static mdl_status geometry(const char *fn, const mdl_pool2d_shape *s, pool_geom *g)
{
    int64_t ho, wo;
    mdl_status st = mdl_pool2d_check_shape(fn, s, &ho, &wo);
    if (st != MDL_OK) return st;
    /* the kernels index a plane and its windows with 32-bit ints */
    if (s->h * s->w >= ((int64_t)1 << 30) || s->h + 2 * s->pad_h + s->kh + s->stride_h >= ((int64_t)1 << 30) ||
        s->w + 2 * s->pad_w + s->kw + s->stride_w >= ((int64_t)1 << 30) || ho * wo >= ((int64_t)1 << 30) ||
        s->n > INT64_MAX / s->c / (s->h * s->w))
        return mdl_cuda_error(MDL_ERR_UNSUPPORTED,
                              "%s: planes too large for the CUDA kernels: h * w = %lld, h_out * w_out "
                              "= %lld (each must be below 2^30)", fn, (long long)(s->h * s->w),
                              (long long)(ho * wo));
    *g = {s->n * s->c, (int)s->h, (int)s->w, (int)s->kh, (int)s->kw, (int)s->stride_h,
          (int)s->stride_w, (int)s->pad_h, (int)s->pad_w, (int)ho, (int)wo, (int)s->c};
    return MDL_OK;
}

mdl_status mdl_cuda_pool2d_output_size(const mdl_pool2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    const char *fn = "mdl_cuda_pool2d_output_size";
    MDL_CHECK_PTR(h_out);
    MDL_CHECK_PTR(w_out);
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    *h_out = g.ho;
    *w_out = g.wo;
    return MDL_OK;
}

#define CHECK_PTRS2(a, b) \
    MDL_CHECK((a) != NULL && (b) != NULL, "%s: " #a " and " #b " must not be NULL", fn)

#define MAX_TAPS 256 /* a tap is one byte */
/* kh * kw taps fit a byte */
#define CHECK_TAPS(kh, kw)                                                                    \
    MDL_CHECK((int64_t)(kh) * (kw) <= MAX_TAPS,                                                        \
              "%s: the tap of a window of %lld x %lld elements does not fit a byte (at most %d)", \
              fn, (long long)(kh), (long long)(kw), MAX_TAPS)

/* in: the map x is read through (NULL: x as it is); tap: where the maxima's taps go
 * (NULL: not recorded) */
static mdl_status max_forward(const char *fn, const mdl_pool2d_shape *s, const float *x,
                              const mdl_affine *in, float *y, uint8_t *tap, bool relu,
                              mdl_cuda_stream stream)
{
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    CHECK_PTRS2(x, y);
    if (tap) CHECK_TAPS(g.kh, g.kw);
    MDL_CHECK(!relu || (int64_t)g.kh * g.kw < MAX_TAPS, "%s: a window of %lld x %lld elements "
              "leaves no tap free for MDL_POOL_NO_TAP (at most %d elements)", fn,
              (long long)g.kh, (long long)g.kw, MAX_TAPS - 1);
    const unsigned blocks = mdl_ew_blocks(g.planes * g.ho * g.wo);
    if (in && (in->scale || in->relu)) /* otherwise the identity: plain */
        max_pool_fwd<true><<<blocks, MDL_EW_THREADS, 0, stream>>>(g, x, y, tap, mdl_affine_of(in),
                                                                 relu);
    else
        max_pool_fwd<false><<<blocks, MDL_EW_THREADS, 0, stream>>>(g, x, y, tap, mdl_no_affine{},
                                                                  relu);
    return mdl_cuda_launched(fn);
}

/* in: the map x is read through (NULL: x as it is) */
static mdl_status max_backward(const char *fn, const mdl_pool2d_shape *s, const float *x,
                               const mdl_affine *in, const float *dy, float *dx,
                               mdl_cuda_stream stream)
{
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    CHECK_PTRS2(x, dy);
    MDL_CHECK_PTR_FN(fn, dx);
    const unsigned blocks = mdl_ew_blocks(g.planes * g.h * g.w);
    if (in && (in->scale || in->relu))
        max_pool_bwd<true><<<blocks, MDL_EW_THREADS, 0, stream>>>(g, x, dy, dx,
                                                                 mdl_affine_of(in));
    else
        max_pool_bwd<false><<<blocks, MDL_EW_THREADS, 0, stream>>>(g, x, dy, dx, mdl_no_affine{});
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y,
                                       mdl_cuda_stream stream)
{
    return max_forward(__func__, s, x, NULL, y, NULL, false, stream);
}

mdl_status mdl_cuda_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x,
                                        const float *dy, float *dx, mdl_cuda_stream stream)
{
    return max_backward(__func__, s, x, NULL, dy, dx, stream);
}

mdl_status mdl_cuda_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                             const mdl_affine *in, float *y,
                                             mdl_cuda_stream stream)
{
    return max_forward(__func__, s, x, in, y, NULL, false, stream);
}

mdl_status mdl_cuda_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                              const mdl_affine *in, const float *dy, float *dx,
                                              mdl_cuda_stream stream)
{
    return max_backward(__func__, s, x, in, dy, dx, stream);
}

mdl_status mdl_cuda_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                              const mdl_affine *in, float *y, uint8_t *tap,
                                              mdl_cuda_stream stream)
{
    const char *fn = __func__;
    MDL_CHECK_PTR_FN(fn, tap);
    return max_forward(fn, s, x, in, y, tap, false, stream);
}

mdl_status mdl_cuda_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s, const float *x,
                                                   const mdl_affine *in, float *y, uint8_t *tap,
                                                   mdl_cuda_stream stream)
{
    const char *fn = __func__;
    MDL_CHECK_PTR_FN(fn, tap);
    return max_forward(fn, s, x, in, y, tap, true, stream);
}

mdl_status mdl_cuda_max_pool2d_backward_argmax(const mdl_pool2d_shape *s, const uint8_t *tap,
                                               const float *dy, float *dx,
                                               mdl_cuda_stream stream)
{
    const char *fn = __func__;
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    CHECK_TAPS(g.kh, g.kw);
    MDL_CHECK(tap != NULL && dy != NULL && dx != NULL, "%s: tap, dy and dx must not be NULL", fn);
    max_pool_bwd_tap<<<mdl_ew_blocks(g.planes * g.h * g.w), MDL_EW_THREADS, 0, stream>>>(g, tap,
                                                                                       dy, dx);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y,
                                       mdl_cuda_stream stream)
{
    const char *fn = __func__;
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(x, y);
    avg_pool_fwd<<<mdl_ew_blocks(g.planes * g.ho * g.wo), MDL_EW_THREADS, 0, stream>>>(g, x, y);
    return mdl_cuda_launched(fn);
}

static mdl_status avg_backward(const char *fn, const mdl_pool2d_shape *s, const float *x,
                               const float *dy, float *dx, mdl_cuda_stream stream)
{
    pool_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(dy, dx);
    avg_pool_bwd<<<mdl_ew_blocks(g.planes * g.h * g.w), MDL_EW_THREADS, 0, stream>>>(g, dy, dx,
                                                                                    x);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy, float *dx,
                                        mdl_cuda_stream stream)
{
    return avg_backward(__func__, s, NULL, dy, dx, stream);
}

mdl_status mdl_cuda_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                             const float *dy, float *dx, mdl_cuda_stream stream)
{
    const char *fn = __func__;
    MDL_CHECK(x != NULL, "%s: x must not be NULL", fn);
    return avg_backward(fn, s, x, dy, dx, stream);
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

mdl_status mdl_cuda_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w,
                                              const float *x, float *y, mdl_cuda_stream stream)
{
    const char *fn = __func__;
    mdl_status st = global_check(fn, n, c, h, w);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(x, y);
    const int64_t planes = n * c;
    /* 8 warps (planes) per block */
    int64_t blocks = (planes + 7) / 8;
    global_avg_fwd<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, stream>>>(planes, h * w, x, y);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w,
                                               const float *dy, float *dx, mdl_cuda_stream stream)
{
    const char *fn = __func__;
    mdl_status st = global_check(fn, n, c, h, w);
    if (st != MDL_OK) return st;
    CHECK_PTRS2(dy, dx);
    global_avg_bwd<<<mdl_ew_blocks(n * c * h * w), MDL_EW_THREADS, 0, stream>>>(n * c, h * w, dy, dx);
    return mdl_cuda_launched(fn);
}
