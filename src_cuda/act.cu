/* act.cu -- elementwise ops: ReLU, add, the per-channel affine add, dropout (as
 * src_c/act.c).  All overwrite their output; grid-stride loops over int64 counts
 * (32-bit indices for the affine add where they fit).  Dropout uses
 * the CPU's counter-based hash of (seed, i), so its mask and output are bit
 * for bit those of mdl_dropout_forward. */
#include "common.cuh"
#include "../src_c/checks.h"

namespace {

/* ---- the hash of src_c/act.h, on host and device ------------------------------------ */

__host__ __device__ __forceinline__ uint32_t fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}
__host__ __device__ __forceinline__ uint32_t dropout_key(uint64_t seed, int64_t i)
{
    return fmix32((uint32_t)(seed >> 32) ^ fmix32((uint32_t)((uint64_t)i >> 32) + 0x9e3779b9u))
           ^ (uint32_t)seed;
}
__host__ __device__ __forceinline__ uint32_t dropout_hash(uint64_t seed, int64_t i)
{
    uint32_t k = dropout_key(seed, i);
    return fmix32(fmix32((uint32_t)i ^ k) + k);
}

#define GRID_STRIDE(i, count)                                                    \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (count); \
         i += (int64_t)gridDim.x * blockDim.x)

/* y[count] = max(x, 0); NaN stays NaN */
__global__ void relu_fwd(int64_t count, const float *x, float *y)
{
    GRID_STRIDE(i, count) { const float v = x[i]; y[i] = v < 0.0f ? 0.0f : v; }
}

/* dx[count] = x > 0 ? dy : 0 */
__global__ void relu_bwd(int64_t count, const float *x, const float *dy, float *dx)
{
    GRID_STRIDE(i, count) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

/* y[count] = a + b */
__global__ void add_kernel(int64_t count, const float *a, const float *b, float *y)
{
    GRID_STRIDE(i, count) y[i] = a[i] + b[i];
}

/* y (n, c, hw) = act(fa(a) + fb(b)), b NULL: act(fa(a)); total = n*c*hw.  I is the index
 * type: 32 bits when total < 2^31 (i + the grid's stride cannot wrap), for a cheaper
 * channel division. */
template <class I>
__global__ void affine_add_kernel(I total, I c, I hw, const float *a, mdl_affine_arg fa,
                                  const float *b, mdl_affine_arg fb, int relu, float *y)
{
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < total;
         i += (I)gridDim.x * blockDim.x) {
        const I ch = i / hw % c;
        float v = fa(a[i], ch);
        if (b) v += fb(b[i], ch);
        y[i] = relu && v < 0.0f ? 0.0f : v; /* NaN passes, as in relu_fwd */
    }
}

/* y[count] = keep(seed, i) ? x * scale : 0 */
__global__ void dropout_kernel(int64_t count, uint32_t threshold, float scale, uint64_t seed,
                               const float *x, float *y)
{
    GRID_STRIDE(i, count) y[i] = (dropout_hash(seed, i) >> 8) >= threshold ? x[i] * scale : 0.0f;
}

} /* namespace */

mdl_status mdl_cuda_relu_forward(int64_t count, const float *x, float *y, mdl_cuda_stream stream)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(y);
    relu_fwd<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, x, y);
    return mdl_cuda_launched(__func__);
}

mdl_status mdl_cuda_relu_backward(int64_t count, const float *x, const float *dy, float *dx,
                                  mdl_cuda_stream stream)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(dx);
    relu_bwd<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, x, dy, dx);
    return mdl_cuda_launched(__func__);
}

mdl_status mdl_cuda_add(int64_t count, const float *a, const float *b, float *y,
                        mdl_cuda_stream stream)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(a);
    MDL_CHECK_PTR(b);
    MDL_CHECK_PTR(y);
    add_kernel<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, a, b, y);
    return mdl_cuda_launched(__func__);
}

mdl_status mdl_cuda_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                               const mdl_affine *fa, const float *b, const mdl_affine *fb,
                               int relu, float *y, mdl_cuda_stream stream)
{
    MDL_CHECK(n >= 0 && c >= 1 && hw >= 0, "%s: need n >= 0, c >= 1, hw >= 0, got n = %lld, "
              "c = %lld, hw = %lld", __func__, (long long)n, (long long)c, (long long)hw);
    MDL_CHECK_AFFINE(__func__, fa, "fa");
    MDL_CHECK_AFFINE(__func__, fb, "fb");
    if (n == 0 || hw == 0) return MDL_OK;
    MDL_CHECK_PTR(a);
    MDL_CHECK_PTR(y);
    MDL_CHECK(n <= INT64_MAX / c / hw, "%s: n * c * hw overflows int64 (n = %lld, c = %lld, "
              "hw = %lld)", __func__, (long long)n, (long long)c, (long long)hw);
    const int64_t total = n * c * hw;
    const mdl_affine_arg ma = mdl_affine_of(fa), mb = mdl_affine_of(fb);
    const unsigned blocks = mdl_ew_blocks(total);
    if (total < ((int64_t)1 << 31))
        affine_add_kernel<uint32_t><<<blocks, MDL_EW_THREADS, 0, stream>>>(
            (uint32_t)total, (uint32_t)c, (uint32_t)hw, a, ma, b, mb, relu != 0, y);
    else
        affine_add_kernel<int64_t><<<blocks, MDL_EW_THREADS, 0, stream>>>(
            total, c, hw, a, ma, b, mb, relu != 0, y);
    return mdl_cuda_launched(__func__);
}

static mdl_status dropout(const char *fn, int64_t count, float p, uint64_t seed, const float *x,
                          float *y, cudaStream_t stream)
{
    MDL_CHECK(count >= 0, "%s: count must be >= 0, got %lld", fn, (long long)count);
    MDL_CHECK(p >= 0.0f && p < 1.0f, "%s: p must be in [0, 1), got %g", fn, (double)p);
    if (count == 0) return MDL_OK;
    MDL_CHECK(x != NULL && y != NULL, "%s: input and output must not be NULL", fn);
    /* keep iff 24-bit hash >= ceil(p * 2^24), as src_c/act.c */
    uint32_t threshold = (uint32_t)((double)p * 16777216.0);
    if ((double)threshold < (double)p * 16777216.0) threshold++;
    float scale = 1.0f / (1.0f - p);
    dropout_kernel<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, threshold, scale,
                                                                        seed, x, y);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_dropout_forward(int64_t count, float p, uint64_t seed, const float *x, float *y,
                                    mdl_cuda_stream stream)
{
    return dropout("mdl_cuda_dropout_forward", count, p, seed, x, y, stream);
}

/* The mask and scale are the forward's, so the backward is the same map applied to dy. */
mdl_status mdl_cuda_dropout_backward(int64_t count, float p, uint64_t seed, const float *dy,
                                     float *dx, mdl_cuda_stream stream)
{
    return dropout("mdl_cuda_dropout_backward", count, p, seed, dy, dx, stream);
}
