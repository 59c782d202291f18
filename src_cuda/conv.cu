/* conv.cu -- 2-D convolution (cross-correlation, NCHW, zero padding), forward
 * and the three gradients, as implicit GEMMs on the tiled kernel of gemm.cuh:
 * the im2col matrix is never stored, its elements are gathered as the tiles
 * load (zero in the padding).  Shapes: K = c_in*kh*kw, P = h_out*w_out.
 *   forward           y (c_out, n*P)     = w (c_out, K) @ col (K, n*P)          + bias,
 *                     ReLU in the store; channel sums (forward_ex): each tile's in the
 *                     epilogue into the workspace, then a block per channel adds them up
 *                     (without a workspace, a block per channel reads y)
 *   backward_data     dx (c_in, n*h*w)   = w^T gathered (c_in, c_out*kh*kw) @ dy gathered
 *                     (the transposed convolution as a gather: no scatter, no atomics; each
 *                     dx element is one GEMM output, stored once, so += is a read in the store)
 *   backward_weights  dw (c_out, K)      = dy (c_out, n*P) @ col^T (n*P, K), split over n*P
 *                     into slices whose partial sums the workspace holds, added in order
 *   backward_bias     db (c_out)         = sum of dy over n and P, a block per channel
 * The fused forward and weight gradient read x through a per-channel affine map and
 * ReLU (mdl_affine), applied in the gather of col to real pixels only (the padding
 * stays 0); a template flag keeps it out of the plain kernels.
 * dx, dw and db are overwritten (accumulate 0) or added to (1); the plain backward_data
 * overwrites.
 * Argument checks as in src_c/conv.c (the shape check is shared: src_c/checks.h). */
#include "fastdiv.cuh"
#include "gemm.cuh"
#include "../src_c/checks.h"

/* ---- shape checks ------------------------------------------------------------------ */

namespace {

struct conv_geom {
    int n, c_in, h, w, c_out, kh, kw, sh, sw, ph, pw, ho, wo;
    int K, P; /* c_in*kh*kw, ho*wo */
    /* dividing by P, wo, kh*kw, kw, h*w, w, sh, sw */
    mdl_fastdiv by_P, by_wo, by_khw, by_kw, by_hw, by_w, by_sh, by_sw;
};

/* mdl_conv2d_check_shape (src_c/checks.h), then the limits of the CUDA kernels: every
 * GEMM dimension, every padded extent and an image's c_in*h*w (a tap's offset) below
 * 2^30, so that 32-bit index arithmetic is exact. */
mdl_status geometry(const char *fn, const mdl_conv2d_shape *s, conv_geom *g)
{
    int64_t ho, wo;
    mdl_status st = mdl_conv2d_check_shape(fn, s, &ho, &wo);
    if (st != MDL_OK) return st;
    const int64_t L = MDL_GEMM_LIMIT, K = s->c_in * s->kh * s->kw, P = ho * wo;
    const int64_t Kt = s->c_out * s->kh * s->kw; /* backward_data's k */
    if (s->h + 2 * s->pad_h >= L || s->w + 2 * s->pad_w >= L || K >= L || Kt >= L ||
        s->c_in >= L || s->c_out >= L || s->n * P >= L || s->n * s->h * s->w >= L ||
        s->c_in * s->h * s->w >= L || (s->h + 2 * s->pad_h) * s->w >= L ||
        !mdl::gemm_grid_ok(s->c_out, s->n * P) || !mdl::gemm_grid_ok(s->c_in, s->n * s->h * s->w) ||
        !mdl::gemm_grid_ok(s->c_out, K))
        return mdl_cuda_error(MDL_ERR_UNSUPPORTED,
                              "%s: shape too large for the CUDA kernels: c_in*kh*kw = %lld, "
                              "c_out*kh*kw = %lld, n*h_out*w_out = %lld, n*h*w = %lld, "
                              "c_in*h*w = %lld, padded h, w = %lld, %lld (each, and padded "
                              "h * w, must be below 2^30, and the products' grids within "
                              "CUDA's limits)", fn, (long long)K, (long long)Kt, (long long)(s->n * P),
                              (long long)(s->n * s->h * s->w), (long long)(s->c_in * s->h * s->w),
                              (long long)(s->h + 2 * s->pad_h), (long long)(s->w + 2 * s->pad_w));
    *g = {(int)s->n, (int)s->c_in, (int)s->h, (int)s->w, (int)s->c_out, (int)s->kh, (int)s->kw,
          (int)s->stride_h, (int)s->stride_w, (int)s->pad_h, (int)s->pad_w, (int)ho, (int)wo,
          (int)K, (int)P};
    g->by_P = mdl_fastdiv(g->P);
    g->by_wo = mdl_fastdiv(g->wo);
    g->by_khw = mdl_fastdiv(g->kh * g->kw);
    g->by_kw = mdl_fastdiv(g->kw);
    g->by_hw = mdl_fastdiv(g->h * g->w);
    g->by_w = mdl_fastdiv(g->w);
    g->by_sh = mdl_fastdiv(g->sh);
    g->by_sw = mdl_fastdiv(g->sw);
    return MDL_OK;
}

/* ---- the three GEMM problems (see gemm.cuh for the interface) ---------------------- */

/* An element of the im2col matrix is x at an output pixel (img, oh, ow) and a tap
 * (ci, r, s): x[img, ci, oh*sh - ph + r, ow*sw - pw + s], zero in the padding.  The
 * forward and the weight gradient fix the pixel for a thread (b_fixed) and read the
 * taps from tables in shared memory, where FUSED also keeps each tap's channel's map. */
struct pixel {
    int64_t at; /* x's index of (img, 0, ih0, iw0), the tap (0, 0, 0) */
    int ih0, iw0; /* oh*sh - ph, ow*sw - pw */
};

__device__ __forceinline__ pixel pixel_of(const conv_geom &g, int j)
{
    const int img = g.by_P.div(j), p = j - img * g.P, oh = g.by_wo.div(p), ow = p - oh * g.wo;
    const int ih0 = oh * g.sh - g.ph, iw0 = ow * g.sw - g.pw;
    return {(int64_t)img * g.c_in * g.h * g.w + (int64_t)ih0 * g.w + iw0, ih0, iw0};
}

/* Tap tables: off = ci*h*w + r*w + s, and the map's scale and shift of channel ci */
struct __align__(16) tap {
    int off, r, s;
};
struct __align__(8) affine_of_tap {
    float scale, shift;
};

template <bool FUSED, int N>
struct taps {
    tap tap_[N];
    std::conditional_t<FUSED, affine_of_tap[N], char> map;

    /* slot's tap k = (ci, r, s) of the K = c_in*kh*kw */
    __device__ void set(const conv_geom &g, const mdl_input_map<FUSED> &in, int slot, int k)
    {
        const int khw = g.kh * g.kw, ci = g.by_khw.div(k), rs = k - ci * khw;
        const int r = g.by_kw.div(rs), s = rs - r * g.kw;
        tap_[slot] = {ci * g.h * g.w + r * g.w + s, r, s};
        if constexpr (FUSED)
            map[slot] = {in.scale ? in.scale[ci] : 1.0f, in.scale ? in.shift[ci] : 0.0f};
    }
    /* x at pixel q and the tap of slot (read: a real pixel), 0 in the padding */
    __device__ float gather(const conv_geom &g, const float *x, const pixel &q, int slot,
                            bool &read) const
    {
        const tap t = tap_[slot];
        read = (unsigned)(q.ih0 + t.r) < (unsigned)g.h && (unsigned)(q.iw0 + t.s) < (unsigned)g.w;
        return read ? x[q.at + t.off] : 0.0f;
    }
    /* FUSED: what gather() read, through the map; the padding stays 0 */
    __device__ float stage(const mdl_input_map<FUSED> &in, float v, bool read, int slot) const
    {
        if constexpr (FUSED) {
            if (!read) return 0.0f;
            if (in.scale) v = fmaf(v, map[slot].scale, map[slot].shift);
            if (in.relu && v < 0.0f) v = 0.0f; /* NaN passes, as mdl_affine_arg */
        }
        return v;
    }
};

/* y (n, c_out, P) = w (c_out, K) @ col (K, n*P) + bias: i = co, k = (ci, r, s), j = (img, oh, ow);
 * FUSED: col gathers in(x).  A thread's column (pixel) is fixed, each slice's taps a table.
 * STATS: each tile's sums of y and y^2 by channel in double, for tile column t at
 * part_sum[co * tiles_n + t] and part_sq[...] (conv_stats_reduce adds them up). */
template <bool FUSED, bool STATS>
struct ConvForward {
    static constexpr bool A_K_FAST = true, B_K_FAST = false, ROW_STATS = STATS;
    int M, N, K, kchunk;
    conv_geom g;
    const float *x, *w, *bias;
    float *y;
    int relu;
    mdl_input_map<FUSED> in;
    double *part_sum, *part_sq;
    int tiles_n;

    using Shared = taps<FUSED, 2 * MDL_GEMM_BK>;
    using BFixed = pixel;
    __device__ void setup(Shared &, int) const {}
    __device__ void slice(Shared &t, int kt, int buf) const
    {
        const int r = threadIdx.x, k = kt + r;
        if (r < MDL_GEMM_BK && k < K) t.set(g, in, buf * MDL_GEMM_BK + r, k);
    }
    __device__ pixel b_fixed(int j) const { return pixel_of(g, j); }
    __device__ float a(int i, int k) const { return w[(int64_t)i * K + k]; }
    __device__ float b(const pixel &q, int, int slot, const Shared &t, bool &read) const
    {
        return t.gather(g, x, q, slot, read);
    }
    __device__ float b_stage(float v, bool read, int slot, const Shared &t) const
    {
        return t.stage(in, v, read, slot);
    }
    __device__ float store(int i, int j, float acc, int) const
    {
        const int img = g.by_P.div(j), p = j - img * g.P;
        float v = bias ? acc + bias[i] : acc;
        if (relu && v < 0.0f) v = 0.0f; /* NaN passes, as on the CPU */
        y[((int64_t)img * g.c_out + i) * g.P + p] = v;
        return v;
    }
    __device__ void row_stats(int t, int i, double sum, double sumsq) const
    {
        part_sum[(int64_t)i * tiles_n + t] = sum;
        part_sq[(int64_t)i * tiles_n + t] = sumsq;
    }
};

/* dx (n, c_in, h*w) = (or +=, accumulate) sum over (co, r, s) of w[co, ci, r, s] *
 * dy[img, co, oh, ow] where ih = oh*sh - ph + r, iw = ow*sw - pw + s: i = ci, k = (co, r, s),
 * j = (img, ih, iw).  Launched without a K split, so each element is stored exactly once. */
struct ConvBackwardData {
    static constexpr bool A_K_FAST = true, B_K_FAST = false, ROW_STATS = false;
    int M, N, K, kchunk;
    conv_geom g;
    const float *dy, *w;
    float *dx;
    int accumulate;

    MDL_GEMM_NO_TABLES
    using BFixed = int;
    __device__ int b_fixed(int j) const { return j; }
    __device__ float a(int i, int k) const
    {
        const int khw = g.kh * g.kw, co = g.by_khw.div(k), rs = k - co * khw;
        return w[((int64_t)co * g.c_in + i) * khw + rs];
    }
    __device__ float b(int j, int k, int, const Shared &, bool &) const
    {
        const int khw = g.kh * g.kw, co = g.by_khw.div(k), rs = k - co * khw;
        const int r = g.by_kw.div(rs), s = rs - r * g.kw;
        const int hw = g.h * g.w, img = g.by_hw.div(j), q = j - img * hw;
        const int ih = g.by_w.div(q), iw = q - ih * g.w;
        const int th = ih + g.ph - r, tw = iw + g.pw - s; /* = oh*sh, ow*sw if this tap is used */
        if (th < 0 || tw < 0) return 0.0f;
        const int oh = g.by_sh.div(th), ow = g.by_sw.div(tw);
        if (oh * g.sh != th || ow * g.sw != tw || oh >= g.ho || ow >= g.wo) return 0.0f;
        return dy[(((int64_t)img * g.c_out + co) * g.ho + oh) * g.wo + ow];
    }
    __device__ void store(int i, int j, float acc, int) const
    {
        const int hw = g.h * g.w, img = g.by_hw.div(j), q = j - img * hw;
        const int64_t at = ((int64_t)img * g.c_in + i) * hw + q;
        dx[at] = accumulate ? dx[at] + acc : acc;
    }
};

/* dw (c_out, K) = dy (c_out, n*P) @ col^T (n*P, K): i = co, k = (img, oh, ow), j = (ci, r, s).
 * With part != NULL, slice z writes its partial sums to part[z] (c_out, K).  FUSED: col
 * gathers in(x).  A thread's k in a slice (pixel) is fixed, the block's columns' taps a table. */
template <bool FUSED>
struct ConvBackwardWeights {
    static constexpr bool A_K_FAST = true, B_K_FAST = true, ROW_STATS = false;
    int M, N, K, kchunk;
    conv_geom g;
    const float *x, *dy;
    float *dw, *part;
    int accumulate;
    mdl_input_map<FUSED> in;

    using Shared = taps<FUSED, MDL_GEMM_BN_MAX>;
    using BFixed = pixel;
    __device__ void setup(Shared &t, int j0) const
    {
        for (int c = threadIdx.x; c < MDL_GEMM_BN_MAX && j0 + c < N; c += blockDim.x)
            t.set(g, in, c, j0 + c);
    }
    __device__ void slice(Shared &, int, int) const {}
    __device__ pixel b_fixed(int k) const { return pixel_of(g, k); }
    __device__ float a(int i, int k) const
    {
        const int img = g.by_P.div(k), p = k - img * g.P;
        return dy[((int64_t)img * g.c_out + i) * g.P + p];
    }
    __device__ float b(const pixel &q, int, int slot, const Shared &t, bool &read) const
    {
        return t.gather(g, x, q, slot, read);
    }
    __device__ float b_stage(float v, bool read, int slot, const Shared &t) const
    {
        return t.stage(in, v, read, slot);
    }
    __device__ void store(int i, int j, float acc, int z) const
    {
        const int64_t at = (int64_t)i * N + j;
        if (part) {
            part[(int64_t)z * M * N + at] = acc;
        } else {
            dw[at] = accumulate ? dw[at] + acc : acc;
        }
    }
};

/* dw[count] = or += the sum of the `splits` partial arrays part[z][count], z in order */
__global__ void conv_splitk_reduce(int64_t count, int splits, const float *part, float *dw,
                                   int accumulate)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < splits; z++) s += part[(int64_t)z * count + i];
        dw[i] = accumulate ? dw[i] + s : s;
    }
}

/* db (c_out) = or += sum of dy (n, c_out, P) over n and P: block co, a fixed-order tree */
__global__ void __launch_bounds__(MDL_CHANNEL_THREADS)
conv_bias_grad(int n, int c_out, int P, const float *dy, float *db, int accumulate)
{
    __shared__ float scratch[32];
    const int co = blockIdx.x;
    float acc = 0.0f;
    mdl_for_channel(n, c_out, P, co, [&](int64_t o) { return dy[o]; },
                    [&](int64_t, float v) { acc += v; });
    acc = mdl_block_sum(acc, scratch);
    if (threadIdx.x == 0) db[co] = accumulate ? db[co] + acc : acc;
}

/* sum[co] and sumsq[co] (either may be NULL) = the sums of y (n, c_out, P) over n
 * and P in double: block co, a fixed-order tree */
__global__ void __launch_bounds__(MDL_CHANNEL_THREADS)
conv_channel_sums(int n, int c_out, int P, const float *y, double *sum, double *sumsq)
{
    __shared__ double scratch[32];
    const int co = blockIdx.x;
    double a = 0.0, q2 = 0.0;
    mdl_for_channel<8>(n, c_out, P, co, [&](int64_t o) { return y[o]; }, [&](int64_t, float f) {
        const double v = f;
        a += v;
        q2 += v * v;
    });
    a = mdl_block_sum(a, scratch);
    q2 = mdl_block_sum(q2, scratch);
    if (threadIdx.x == 0) {
        if (sum) sum[co] = a;
        if (sumsq) sumsq[co] = q2;
    }
}

/* sum[co] and sumsq[co] (either may be NULL) = the sums of channel co's `tiles` partial
 * sums (ConvForward with STATS: part_sum[co * tiles + t], part_sq likewise) in double:
 * block co, a fixed-order tree */
__global__ void __launch_bounds__(MDL_CHANNEL_THREADS)
conv_stats_reduce(int tiles, const double *part_sum, const double *part_sq, double *sum,
                  double *sumsq)
{
    __shared__ double scratch[32];
    const int64_t co = blockIdx.x;
    double a = 0.0, q2 = 0.0;
    for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
        a += part_sum[co * tiles + t];
        q2 += part_sq[co * tiles + t];
    }
    a = mdl_block_sum(a, scratch);
    q2 = mdl_block_sum(q2, scratch);
    if (threadIdx.x == 0) {
        if (sum) sum[co] = a;
        if (sumsq) sumsq[co] = q2;
    }
}

} /* namespace */

/* ---- public entry points -------------------------------------------------------------- */

static size_t weights_workspace(const conv_geom &g, int *splits, int *kchunk)
{
    mdl::gemm_splitk_plan(g.c_out, g.K, (int64_t)g.n * g.P, splits, kchunk);
    return *splits > 1 ? (size_t)*splits * (size_t)g.c_out * (size_t)g.K * sizeof(float) : 0;
}

mdl_status mdl_cuda_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    MDL_CHECK_PTR(h_out);
    MDL_CHECK_PTR(w_out);
    return mdl_conv2d_check_shape(__func__, s, h_out, w_out);
}

/* The forward's per-tile channel statistics: two doubles a channel and tile column, from
 * the workspace's first multiple of 8 bytes */
static size_t stats_workspace(const conv_geom &g)
{
    return 2 * (size_t)mdl::gemm_tiles_n(g.c_out, (int64_t)g.n * g.P) * (size_t)g.c_out *
               sizeof(double) + sizeof(double);
}

static size_t workspace_bytes_for(const conv_geom &g)
{
    int splits, kchunk;
    const size_t w = weights_workspace(g, &splits, &kchunk), st = stats_workspace(g);
    return w > st ? w : st;
}

size_t mdl_cuda_conv2d_workspace_size(const mdl_conv2d_shape *s)
{
    conv_geom g;
    if (geometry(__func__, s, &g) != MDL_OK) return 0;
    return workspace_bytes_for(g);
}

/* A given workspace must hold mdl_cuda_conv2d_workspace_size bytes, for every op alike. */
static mdl_status check_workspace(const char *fn, const conv_geom &g, const void *ws, size_t bytes)
{
    size_t need = workspace_bytes_for(g);
    if (ws != NULL && bytes < need)
        return mdl_cuda_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn,
                              bytes, need);
    MDL_CHECK(((uintptr_t)ws & 3) == 0, "%s: workspace must be 4-byte aligned, got %p", fn, ws);
    return MDL_OK;
}

/* The forward's kernel, with the tiles' channel statistics (part_sum != NULL) or without */
template <bool FUSED>
static void launch_forward(const conv_geom &g, const float *x, mdl_input_map<FUSED> in,
                           const float *w, const float *bias, int relu, float *y, double *part_sum,
                           double *part_sq, int tiles_n, cudaStream_t stream)
{
    if (part_sum) {
        ConvForward<FUSED, true> p = {g.c_out, g.n * g.P, g.K, g.K, g, x, w, bias, y, relu != 0,
                                      in, part_sum, part_sq, tiles_n};
        mdl::gemm_launch(p, 1, stream);
    } else {
        ConvForward<FUSED, false> p = {g.c_out, g.n * g.P, g.K, g.K, g, x, w, bias, y,
                                       relu != 0, in, NULL, NULL, 0};
        mdl::gemm_launch(p, 1, stream);
    }
}

/* in: the map x is read through (NULL: x as it is) */
static mdl_status forward(const char *fn, const mdl_conv2d_shape *s, const float *x,
                          const mdl_affine *in, const float *w, const float *bias, int relu,
                          double *channel_sum, double *channel_sumsq, float *y, void *workspace,
                          size_t workspace_bytes, mdl_cuda_stream stream)
{
    conv_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, w);
    MDL_CHECK_PTR_FN(fn, y);
    if ((st = check_workspace(fn, g, workspace, workspace_bytes)) != MDL_OK) return st;
    /* the channel sums: in the kernel's epilogue, each tile's into the workspace, then
     * added up (conv_stats_reduce); without a workspace, a pass over y */
    const bool stats = channel_sum || channel_sumsq, in_epilogue = stats && workspace;
    const int tiles_n = (int)mdl::gemm_tiles_n(g.c_out, (int64_t)g.n * g.P);
    double *const part_sum =
        in_epilogue ? (double *)(((uintptr_t)workspace + 7) & ~(uintptr_t)7) : NULL;
    double *const part_sq = in_epilogue ? part_sum + (int64_t)tiles_n * g.c_out : NULL;
    if (in && (in->scale || in->relu)) /* otherwise the identity: the plain kernel */
        launch_forward<true>(g, x, mdl_affine_of(in), w, bias, relu, y, part_sum, part_sq,
                             tiles_n, stream);
    else
        launch_forward<false>(g, x, {}, w, bias, relu, y, part_sum, part_sq, tiles_n, stream);
    if (in_epilogue)
        conv_stats_reduce<<<(unsigned)g.c_out, MDL_CHANNEL_THREADS, 0, stream>>>(
            tiles_n, part_sum, part_sq, channel_sum, channel_sumsq);
    else if (stats)
        conv_channel_sums<<<(unsigned)g.c_out, MDL_CHANNEL_THREADS, 0, stream>>>(
            g.n, g.c_out, g.P, y, channel_sum, channel_sumsq);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w,
                                   const float *bias, float *y, void *workspace,
                                   size_t workspace_bytes, mdl_cuda_stream stream)
{
    return forward(__func__, s, x, NULL, w, bias, 0, NULL, NULL, y, workspace, workspace_bytes,
                   stream);
}

mdl_status mdl_cuda_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x, const float *w,
                                      const float *bias, int relu, double *channel_sum,
                                      double *channel_sumsq, float *y, void *workspace,
                                      size_t workspace_bytes, mdl_cuda_stream stream)
{
    return forward(__func__, s, x, NULL, w, bias, relu, channel_sum, channel_sumsq, y, workspace,
                   workspace_bytes, stream);
}

mdl_status mdl_cuda_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                         const mdl_affine *in, const float *w, const float *bias,
                                         int relu, double *channel_sum, double *channel_sumsq,
                                         float *y, void *workspace, size_t workspace_bytes,
                                         mdl_cuda_stream stream)
{
    return forward(__func__, s, x, in, w, bias, relu, channel_sum, channel_sumsq, y, workspace,
                   workspace_bytes, stream);
}

/* The pooled forward (mdl_conv2d_forward_pooled's contract): the convolution into the
 * workspace, then the pooling from there into y, then the ReLU.  Its checks and their
 * messages are the C core's. */
static mdl_status pooled_geometry(const char *fn, const mdl_conv2d_shape *s,
                                  const mdl_pool2d_shape *pool, size_t *bytes, int64_t *pooled)
{
    int64_t ho, wo, pho, pwo;
    mdl_status st = mdl_conv2d_check_shape(fn, s, &ho, &wo);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR_FN(fn, pool);
    MDL_CHECK(pool->n == s->n && pool->c == s->c_out && pool->h == ho && pool->w == wo,
              "%s: the pooling's input (%lld, %lld, %lld, %lld) must be the convolution's "
              "output (%lld, %lld, %lld, %lld)", fn, (long long)pool->n, (long long)pool->c,
              (long long)pool->h, (long long)pool->w, (long long)s->n, (long long)s->c_out,
              (long long)ho, (long long)wo);
    if ((st = mdl_pool2d_check_shape(fn, pool, &pho, &pwo)) != MDL_OK) return st;
    *bytes = (size_t)(s->n * s->c_out * ho * wo) * sizeof(float);
    *pooled = s->n * s->c_out * pho * pwo;
    return MDL_OK;
}

size_t mdl_cuda_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s,
                                             const mdl_pool2d_shape *pool)
{
    size_t bytes;
    int64_t pooled;
    return pooled_geometry(__func__, s, pool, &bytes, &pooled) == MDL_OK ? bytes : 0;
}

mdl_status mdl_cuda_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x,
                                          const float *w, const float *bias, int relu,
                                          const mdl_pool2d_shape *pool, mdl_pool_kind pool_kind,
                                          int pool_relu, float *y, void *workspace,
                                          size_t workspace_bytes, mdl_cuda_stream stream)
{
    const char *fn = __func__;
    MDL_CHECK(pool_kind == MDL_POOL_MAX || pool_kind == MDL_POOL_AVG,
              "%s: pool_kind must be MDL_POOL_MAX or MDL_POOL_AVG, got %d", fn, (int)pool_kind);
    MDL_CHECK_PTR(pool);
    size_t need;
    int64_t pooled;
    mdl_status st = pooled_geometry(fn, s, pool, &need, &pooled);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(w);
    MDL_CHECK_PTR(y);
    if (workspace == NULL || workspace_bytes < need)
        return mdl_cuda_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn,
                              workspace ? workspace_bytes : (size_t)0, need);
    float *out = (float *)workspace;
    if ((st = forward(fn, s, x, NULL, w, bias, relu, NULL, NULL, out, NULL, 0, stream)) != MDL_OK)
        return st;
    st = pool_kind == MDL_POOL_MAX ? mdl_cuda_max_pool2d_forward(pool, out, y, stream)
                                   : mdl_cuda_avg_pool2d_forward(pool, out, y, stream);
    if (st != MDL_OK || !pool_relu) return st;
    return mdl_cuda_relu_forward(pooled, y, y, stream);
}

/* dx = (or +=, accumulate) conv_transpose(dy, w) */
static mdl_status backward_data(const char *fn, const mdl_conv2d_shape *s, const float *dy,
                                const float *w, float *dx, int accumulate, void *workspace,
                                size_t workspace_bytes, mdl_cuda_stream stream)
{
    conv_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR_FN(fn, dy);
    MDL_CHECK_PTR_FN(fn, w);
    MDL_CHECK_PTR_FN(fn, dx);
    if ((st = check_workspace(fn, g, workspace, workspace_bytes)) != MDL_OK) return st;
    const int kt = g.c_out * g.kh * g.kw;
    ConvBackwardData p = {g.c_in, g.n * g.h * g.w, kt, kt, g, dy, w, dx, accumulate != 0};
    mdl::gemm_launch(p, 1, stream); /* one k slice: the store sees the whole sum */
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy,
                                         const float *w, float *dx, void *workspace,
                                         size_t workspace_bytes, mdl_cuda_stream stream)
{
    return backward_data(__func__, s, dy, w, dx, 0, workspace, workspace_bytes, stream);
}

mdl_status mdl_cuda_conv2d_backward_data_fused(const mdl_conv2d_shape *s, const float *dy,
                                               const float *w, float *dx, int accumulate,
                                               void *workspace, size_t workspace_bytes,
                                               mdl_cuda_stream stream)
{
    return backward_data(__func__, s, dy, w, dx, accumulate, workspace, workspace_bytes, stream);
}

/* in: the map x is read through (NULL: x as it is) */
static mdl_status backward_weights(const char *fn, const mdl_conv2d_shape *s, const float *x,
                                   const mdl_affine *in, const float *dy, float *dw,
                                   int accumulate, void *workspace, size_t workspace_bytes,
                                   mdl_cuda_stream stream)
{
    conv_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, dy);
    MDL_CHECK_PTR_FN(fn, dw);
    if ((st = check_workspace(fn, g, workspace, workspace_bytes)) != MDL_OK) return st;
    int splits, kchunk;
    const int kr = g.n * g.P;
    weights_workspace(g, &splits, &kchunk);
    if (workspace == NULL) { /* no room for partial sums: one pass over all of n*P */
        splits = 1;
        kchunk = kr;
    }
    float *part = splits > 1 ? (float *)workspace : NULL;
    if (in && (in->scale || in->relu)) {
        ConvBackwardWeights<true> p = {g.c_out, g.K, kr, kchunk, g, x, dy, dw, part,
                                       accumulate != 0, mdl_affine_of(in)};
        mdl::gemm_launch(p, splits, stream);
    } else {
        ConvBackwardWeights<false> p = {g.c_out, g.K, kr, kchunk, g, x, dy, dw, part,
                                        accumulate != 0, {}};
        mdl::gemm_launch(p, splits, stream);
    }
    if (splits > 1) {
        const int64_t count = (int64_t)g.c_out * g.K;
        conv_splitk_reduce<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(
            count, splits, (const float *)workspace, dw, accumulate != 0);
    }
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x,
                                            const float *dy, float *dw, int accumulate,
                                            void *workspace, size_t workspace_bytes,
                                            mdl_cuda_stream stream)
{
    return backward_weights(__func__, s, x, NULL, dy, dw, accumulate, workspace, workspace_bytes,
                            stream);
}

mdl_status mdl_cuda_conv2d_backward_weights_fused(const mdl_conv2d_shape *s, const float *x,
                                                  const mdl_affine *in, const float *dy,
                                                  float *dw, int accumulate, void *workspace,
                                                  size_t workspace_bytes, mdl_cuda_stream stream)
{
    return backward_weights(__func__, s, x, in, dy, dw, accumulate, workspace, workspace_bytes,
                            stream);
}

/* Both gradients in one call (mdl_conv2d_backward's contract): the two kernels in turn
 * on the stream */
mdl_status mdl_cuda_conv2d_backward(const mdl_conv2d_shape *s, const float *x,
                                    const mdl_affine *in, const float *dy, const float *w,
                                    float *dx, int accumulate_dx, float *dw, int accumulate_dw,
                                    void *workspace, size_t workspace_bytes,
                                    mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_conv2d_backward";
    /* the weight gradient's own arguments checked before the data gradient is launched,
     * so that a call rejected has changed nothing (its other checks are the data
     * gradient's) */
    MDL_CHECK_AFFINE(fn, in, "in");
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, dw);
    mdl_status st = MDL_OK;
    if (dx)
        st = backward_data(fn, s, dy, w, dx, accumulate_dx, workspace, workspace_bytes, stream);
    if (st != MDL_OK) return st;
    return backward_weights(fn, s, x, in, dy, dw, accumulate_dw, workspace, workspace_bytes,
                            stream);
}

mdl_status mdl_cuda_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy, float *db,
                                         int accumulate, mdl_cuda_stream stream)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(db);
    conv_bias_grad<<<g.c_out, MDL_CHANNEL_THREADS, 0, stream>>>(g.n, g.c_out, g.P, dy, db,
                                                                accumulate != 0);
    return mdl_cuda_launched(__func__);
}
