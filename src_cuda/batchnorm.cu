/* batchnorm.cu -- BatchNorm over x (n, c, hw): statistics per channel over the
 * m = n * hw values of that channel (as src_c/batchnorm.c).
 *
 * Training and backward run one block per channel: the block sums its channel
 * in double (each thread a strided share, then a fixed-order tree), thread 0
 * turns the sums into statistics and coefficients with the CPU's formulas
 * (src_c/batchnorm.h), and the block then writes y or dx.  The training sums are
 * shifted by the channel's first value K (d = x - K), so one pass gives
 *     mean = K + sum(d) / m,   var = sum(d^2) / m - (sum(d) / m)^2.
 * Inference is elementwise.
 *
 * The fused path: batch_norm_stats turns float64 channel sums (of a fused
 * convolution) into the statistics and the map scale, shift, one thread per
 * channel; batch_norm_relu_backward is the backward with dy masked by
 * x * scale + shift > 0 (the ReLU after the BatchNorm) wherever it is read;
 * batch_norm_add_relu_backward is the backward of max(BatchNorm(x) + fb(b), 0)
 * with x - mean reconstructed from the sum s before the ReLU, one block per
 * channel as above. */
#include <math.h>
#include "common.cuh"
#include "../src_c/checks.h"

#define BN_THREADS MDL_CHANNEL_THREADS

namespace {

/* src_c/batchnorm.h: mdl_bn_finish_train */
__device__ void finish_train(int64_t m, double k, double sd, double sd2, float gamma, float beta,
                             float eps, float momentum, float *rm, float *rv, float *save_mean,
                             float *save_invstd, float *mf, float *scale, float *shift)
{
    double dm = sd / (double)m;
    double mean = k + dm;
    double var = sd2 / (double)m - dm * dm;
    if (var < 0.0) var = 0.0; /* rounding only; NaN stays NaN */
    double invstd = 1.0 / sqrt(var + (double)eps);
    float meanf = (float)mean;
    *save_mean = meanf;
    *save_invstd = (float)invstd;
    if (rm) {
        double mom = (double)momentum;
        double unbiased = var * (double)m / (double)(m - 1);
        *rm = (float)((1.0 - mom) * (double)*rm + mom * mean);
        *rv = (float)((1.0 - mom) * (double)*rv + mom * unbiased);
    }
    double s = invstd * (double)gamma;
    *mf = meanf;
    *scale = (float)s;
    *shift = (float)((double)beta - (mean - (double)meanf) * s);
}

/* src_c/batchnorm.h: mdl_bn_finish_backward */
__device__ void finish_backward(int64_t m, double sdy, double sdyd, float gamma, float invstd,
                                float *dgamma, float *dbeta, int accumulate, float *a, float *b,
                                float *c0)
{
    double is = (double)invstd;
    double dg = sdyd * is;
    if (accumulate) {
        *dgamma = (float)((double)*dgamma + dg);
        *dbeta = (float)((double)*dbeta + sdy);
    } else {
        *dgamma = (float)dg;
        *dbeta = (float)sdy;
    }
    double ga = (double)gamma * is;
    *a = (float)ga;
    *b = (float)(-ga * is * dg / (double)m);
    *c0 = (float)(-ga * sdy / (double)m);
}

/* A value and its x, read together (the backward's loads). */
struct gx {
    float g, x;
};

/* channel blockIdx.x of x, y (n, c, hw): statistics (saved, running ones updated), then y */
__global__ void __launch_bounds__(BN_THREADS)
bn_train(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma, const float *beta,
         float eps, float momentum, float *rm, float *rv, float *y, float *save_mean,
         float *save_invstd)
{
    __shared__ double scratch[32];
    __shared__ float coef[3];
    const int64_t ch = blockIdx.x;
    const double k = (double)x[ch * hw]; /* image 0, channel ch, first value */
    double sd = 0.0, sd2 = 0.0;
    auto ld = [&](int64_t o) { return x[o]; };
    mdl_for_channel(n, c, hw, ch, ld, [&](int64_t, float v) {
        const double d = (double)v - k;
        sd += d;
        sd2 += d * d;
    });
    sd = mdl_block_sum(sd, scratch);
    sd2 = mdl_block_sum(sd2, scratch);
    if (threadIdx.x == 0) {
        float mf, scale, shift;
        finish_train(n * hw, k, sd, sd2, gamma[ch], beta[ch], eps, momentum, rm ? rm + ch : NULL,
                     rv ? rv + ch : NULL, save_mean + ch, save_invstd + ch, &mf, &scale, &shift);
        coef[0] = mf;
        coef[1] = scale;
        coef[2] = shift;
    }
    __syncthreads();
    const float mf = coef[0], scale = coef[1], shift = coef[2];
    mdl_for_channel(n, c, hw, ch, ld, [&](int64_t o, float v) { y[o] = (v - mf) * scale + shift; });
}

/* x, y (n, c, hw): y = (x - rm) * gamma / sqrt(rv + eps) + beta, elementwise */
__global__ void bn_infer(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma,
                         const float *beta, const float *rm, const float *rv, float eps, float *y)
{
    const int64_t total = n * c * hw;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ch = (i / hw) % c;
        const float scale = (float)((double)gamma[ch] / sqrt((double)rv[ch] + (double)eps));
        y[i] = (x[i] - rm[ch]) * scale + beta[ch];
    }
}

/* the statistics of mdl_batch_norm_stats from sum and sumsq over count, a thread per
 * channel (grid-stride over c): finish_train with the shift K = 0, as src_c does, then
 * the map x * scale + shift of y = (x - mean_f) * scale + shift_train */
__global__ void bn_stats(int64_t c, int64_t count, const double *sum, const double *sumsq,
                         const float *gamma, const float *beta, float eps, float momentum,
                         float *rm, float *rv, float *save_mean, float *save_invstd,
                         float *scale, float *shift)
{
    for (int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; ch < c;
         ch += (int64_t)gridDim.x * blockDim.x) {
        float mf, s, t;
        finish_train(count, 0.0, sum[ch], sumsq[ch], gamma[ch], beta[ch], eps, momentum,
                     rm ? rm + ch : NULL, rv ? rv + ch : NULL, save_mean + ch, save_invstd + ch,
                     &mf, &s, &t);
        scale[ch] = s;
        shift[ch] = (float)((double)t - (double)mf * (double)s);
    }
}

/* channel blockIdx.x of x, dy, dx (n, c, hw): sums, dgamma/dbeta (= or +=), then dx.
 * RELU: dy counts only where fmaf(x, mscale[ch], mshift[ch]) > 0. */
template <bool RELU>
__global__ void __launch_bounds__(BN_THREADS)
bn_backward(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma,
            const float *dy, const float *mean, const float *invstd, const float *mscale,
            const float *mshift, float *dx, float *dgamma, float *dbeta, int accumulate)
{
    __shared__ double scratch[32];
    __shared__ float coef[3];
    const int64_t ch = blockIdx.x;
    const float mu = mean[ch];
    float ms = 0.0f, mt = 0.0f;
    if constexpr (RELU) {
        ms = mscale[ch];
        mt = mshift[ch];
    }
    auto ld = [&](int64_t o) {
        const float xv = x[o], d = dy[o];
        if constexpr (RELU) return gx{fmaf(xv, ms, mt) > 0.0f ? d : 0.0f, xv};
        else return gx{d, xv};
    };
    double sdy = 0.0, sdyd = 0.0;
    mdl_for_channel(n, c, hw, ch, ld, [&](int64_t, gx v) {
        sdy += v.g;
        sdyd += (double)v.g * (double)(v.x - mu);
    });
    sdy = mdl_block_sum(sdy, scratch);
    sdyd = mdl_block_sum(sdyd, scratch);
    if (threadIdx.x == 0) {
        float a, b, c0;
        finish_backward(n * hw, sdy, sdyd, gamma[ch], invstd[ch], dgamma + ch, dbeta + ch,
                        accumulate, &a, &b, &c0);
        coef[0] = a;
        coef[1] = b;
        coef[2] = c0;
    }
    __syncthreads();
    const float a = coef[0], b = coef[1], c0 = coef[2];
    mdl_for_channel(n, c, hw, ch, ld,
                    [&](int64_t o, gx v) { dx[o] = v.g * a + (v.x - mu) * b + c0; });
}

/* channel blockIdx.x of s, b, dy, dx, db (n, c, hw), x not stored (src_c/batchnorm.c:
 * mdl_bn_add_relu_backward_scalar): e = s - fb(b) - beta is (x - mean) * gamma * invstd and
 * g = dy where s > 0; db = g, the sums of g and g * e, dgamma/dbeta (= or +=) from them with
 * r = 1 / (gamma * invstd), then dx = g * a + e * (b' * r) + c0.  db may be dy: each thread
 * reads and writes only its own values. */
__global__ void __launch_bounds__(BN_THREADS)
bn_add_relu_backward(int64_t n, int64_t c, int64_t hw, const float *s, const float *b,
                     mdl_affine_arg fb, const float *gamma, const float *beta, const float *dy,
                     const float *invstd, float *dx, float *db, float *dgamma, float *dbeta,
                     int accumulate)
{
    __shared__ double scratch[32];
    __shared__ float coef[3];
    const int64_t ch = blockIdx.x;
    const float bt = beta[ch];
    auto ld = [&](int64_t o) { /* g and e */
        const float sv = s[o], d = dy[o];
        return gx{sv > 0.0f ? d : 0.0f, sv - fb(b[o], ch) - bt};
    };
    double sg = 0.0, sge = 0.0;
    mdl_for_channel(n, c, hw, ch, ld, [&](int64_t o, gx v) {
        db[o] = v.g;
        sg += v.g;
        sge += (double)v.g * (double)v.x;
    });
    sg = mdl_block_sum(sg, scratch);
    sge = mdl_block_sum(sge, scratch);
    if (threadIdx.x == 0) {
        const double r = 1.0 / ((double)gamma[ch] * (double)invstd[ch]);
        float a, bc, c0;
        finish_backward(n * hw, sg, sge * r, gamma[ch], invstd[ch], dgamma + ch, dbeta + ch,
                        accumulate, &a, &bc, &c0);
        coef[0] = a;
        coef[1] = (float)((double)bc * r);
        coef[2] = c0;
    }
    __syncthreads();
    const float a = coef[0], be = coef[1], c0 = coef[2];
    mdl_for_channel(n, c, hw, ch, ld, [&](int64_t o, gx v) { dx[o] = v.g * a + v.x * be + c0; });
}

} /* namespace */

/* ---- checks and launches (src_c/batchnorm.c) ------------------------------------ */

/* mdl_bn_check_shape (src_c/checks.h), then the limit of the kernels */
static mdl_status check_shape(const char *fn, int64_t n, int64_t c, int64_t hw)
{
    mdl_status st = mdl_bn_check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    if (c > 2147483647LL)
        return mdl_cuda_error(MDL_ERR_UNSUPPORTED, "%s: c must be below 2^31 (a block per "
                              "channel), got %lld", fn, (long long)c);
    return MDL_OK;
}

mdl_status mdl_cuda_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float *x,
                                             const float *gamma, const float *beta, float eps,
                                             float momentum, float *running_mean,
                                             float *running_var, float *y, float *save_mean,
                                             float *save_invstd, mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_forward_train";
    mdl_status st = check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_train_args(fn, n, hw, x, gamma, beta, eps, momentum, running_mean,
                                 running_var, y, save_mean, save_invstd);
    if (st != MDL_OK) return st;
    bn_train<<<(unsigned)c, BN_THREADS, 0, stream>>>(n, c, hw, x, gamma, beta, eps, momentum,
                                                     running_mean, running_var, y, save_mean,
                                                     save_invstd);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float *x,
                                             const float *gamma, const float *beta,
                                             const float *running_mean,
                                             const float *running_var, float eps, float *y,
                                             mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_forward_infer";
    mdl_status st = check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_infer_args(fn, x, gamma, beta, running_mean, running_var, eps, y);
    if (st != MDL_OK) return st;
    bn_infer<<<mdl_ew_blocks(n * c * hw), MDL_EW_THREADS, 0, stream>>>(
        n, c, hw, x, gamma, beta, running_mean, running_var, eps, y);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                        const float *gamma, const float *dy,
                                        const float *save_mean, const float *save_invstd,
                                        float *dx, float *dgamma, float *dbeta, int accumulate,
                                        mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_backward";
    mdl_status st = check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_backward_args(fn, x, gamma, dy, save_mean, save_invstd, dx, dgamma,
                                    dbeta);
    if (st != MDL_OK) return st;
    bn_backward<false><<<(unsigned)c, BN_THREADS, 0, stream>>>(n, c, hw, x, gamma, dy, save_mean,
                                                               save_invstd, nullptr, nullptr, dx,
                                                               dgamma, dbeta, accumulate);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                     const double *channel_sumsq, const float *gamma,
                                     const float *beta, float eps, float momentum,
                                     float *running_mean, float *running_var, float *save_mean,
                                     float *save_invstd, float *scale, float *shift,
                                     mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_stats";
    MDL_CHECK(c >= 1 && count >= 2, "%s: need c >= 1 channels and count > 1 values per "
              "channel, got c = %lld, count = %lld", fn, (long long)c, (long long)count);
    MDL_CHECK((running_mean == NULL) == (running_var == NULL),
              "%s: running_mean and running_var must be given together", fn);
    MDL_CHECK_PTR_FN(fn, channel_sum);
    MDL_CHECK_PTR_FN(fn, channel_sumsq);
    MDL_CHECK_PTR_FN(fn, gamma);
    MDL_CHECK_PTR_FN(fn, beta);
    MDL_CHECK_PTR_FN(fn, save_mean);
    MDL_CHECK_PTR_FN(fn, save_invstd);
    MDL_CHECK_PTR_FN(fn, scale);
    MDL_CHECK_PTR_FN(fn, shift);
    MDL_CHECK(eps >= 0.0f && isfinite(eps) && momentum >= 0.0f && momentum <= 1.0f,
              "%s: need a finite eps >= 0 and 0 <= momentum <= 1, got eps = %g, momentum = %g",
              fn, (double)eps, (double)momentum);
    bn_stats<<<mdl_ew_blocks(c), MDL_EW_THREADS, 0, stream>>>(
        c, count, channel_sum, channel_sumsq, gamma, beta, eps, momentum, running_mean,
        running_var, save_mean, save_invstd, scale, shift);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                             const float *gamma, const float *dy,
                                             const float *save_mean, const float *save_invstd,
                                             const float *scale, const float *shift, float *dx,
                                             float *dgamma, float *dbeta, int accumulate,
                                             mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_relu_backward";
    MDL_CHECK_PTR_FN(fn, scale);
    MDL_CHECK_PTR_FN(fn, shift);
    mdl_status st = check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_backward_args(fn, x, gamma, dy, save_mean, save_invstd, dx, dgamma,
                                    dbeta);
    if (st != MDL_OK) return st;
    bn_backward<true><<<(unsigned)c, BN_THREADS, 0, stream>>>(n, c, hw, x, gamma, dy, save_mean,
                                                              save_invstd, scale, shift, dx,
                                                              dgamma, dbeta, accumulate);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, const float *s,
                                                 const float *b, const mdl_affine *fb,
                                                 const float *gamma, const float *beta,
                                                 const float *dy, const float *save_invstd,
                                                 float *dx, float *db, float *dgamma,
                                                 float *dbeta, int accumulate,
                                                 mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_batch_norm_add_relu_backward";
    mdl_status st = check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, fb, "fb");
    MDL_CHECK_PTR_FN(fn, s);
    MDL_CHECK_PTR_FN(fn, b);
    MDL_CHECK_PTR_FN(fn, beta);
    MDL_CHECK_PTR_FN(fn, db);
    MDL_CHECK_PTR_FN(fn, save_invstd);
    /* the shared check; no mean here, save_invstd stands in for it (checked above) */
    st = mdl_bn_check_backward_args(fn, s, gamma, dy, save_invstd, save_invstd, dx, dgamma,
                                    dbeta);
    if (st != MDL_OK) return st;
    /* gamma * save_invstd (device memory) is not checked: see minidl_cuda.h */
    bn_add_relu_backward<<<(unsigned)c, BN_THREADS, 0, stream>>>(
        n, c, hw, s, b, mdl_affine_of(fb), gamma, beta, dy, save_invstd, dx, db, dgamma, dbeta,
        accumulate);
    return mdl_cuda_launched(fn);
}
