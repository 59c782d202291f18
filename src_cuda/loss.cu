/* loss.cu -- softmax cross-entropy with integer labels, mean over the batch (as
 * src_c/loss.c): per row z, m = max z, s = sum exp(z - m), loss_row = m + log s -
 * z[label], dlogits row = (exp(z - m) / s - onehot) / n.
 *
 * One block: warp w takes rows w, w + 32, ... (a row's exps summed in double by
 * its lanes, then a shuffle tree), adds its row losses in row order, and the
 * warps' totals are added in warp order, so the loss is the same on every run
 * without a second kernel or scratch memory.  The labels are in device memory
 * and cannot be checked on the host: an out-of-range label makes its row's loss
 * (so the mean) and its dlogits row NaN. */
#include <math.h>
#include "common.cuh"

#define XENT_THREADS 1024

namespace {

__device__ __forceinline__ float warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* logits, dlogits (n, classes); labels (n); *loss = mean of the row losses */
__global__ void __launch_bounds__(XENT_THREADS)
softmax_xent(int64_t n, int64_t classes, const float *logits, const int64_t *labels,
             float *loss, float *dlogits)
{
    __shared__ double part[XENT_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const double inv_n = 1.0 / (double)n;
    double total = 0.0; /* this warp's rows, in order (lane 0's copy counts) */
    for (int64_t r = warp; r < n; r += warps) {
        const float *z = logits + r * classes;
        /* the row maximum; a NaN anywhere makes s, and so the row, NaN below */
        float m = -INFINITY;
        for (int64_t j = lane; j < classes; j += 32) m = fmaxf(m, z[j]);
        m = warp_max(m);
        double s = 0.0;
        for (int64_t j = lane; j < classes; j += 32) s += (double)expf(z[j] - m);
        s = mdl_warp_sum(s);
        s = __shfl_sync(0xffffffffu, s, 0);
        const int64_t label = labels[r];
        const bool ok = label >= 0 && label < classes;
        const double zl = ok ? (double)z[label] : (double)NAN;
        total += (double)m + log(s) - zl;
        if (dlogits) {
            float *d = dlogits + r * classes;
            const double inv_sn = inv_n / s;
            const float scale = (float)inv_sn;
            for (int64_t j = lane; j < classes; j += 32) {
                const float e = expf(z[j] - m);
                /* (e - s) / (s n) in double for the label: no cancellation against a rounded softmax */
                d[j] = !ok ? NAN : j == label ? (float)(((double)e - s) * inv_sn) : e * scale;
            }
        }
    }
    if (lane == 0) part[warp] = total;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < warps; w++) t += part[w];
        *loss = (float)(t * inv_n);
    }
}

} /* namespace */

mdl_status mdl_cuda_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits,
                                          const int64_t *labels, float *loss, float *dlogits,
                                          mdl_cuda_stream stream)
{
    MDL_CHECK_POS(n);
    MDL_CHECK_POS(classes);
    MDL_CHECK(classes <= INT64_MAX / n, "%s: n * classes overflows (n = %lld, classes = %lld)",
              __func__, (long long)n, (long long)classes);
    MDL_CHECK_PTR(logits);
    MDL_CHECK_PTR(labels);
    MDL_CHECK_PTR(loss);
    softmax_xent<<<1, XENT_THREADS, 0, stream>>>(n, classes, logits, labels, loss, dlogits);
    return mdl_cuda_launched(__func__);
}
