/* common.cuh -- internal helpers shared by the CUDA kernel files (not installed):
 * errors and argument checks (as src_c/common.h), launch checks, grid sizes,
 * and deterministic warp/block reductions. */
#ifndef MDL_CUDA_COMMON_CUH
#define MDL_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <type_traits>
#include "minidl_cuda.h"

/* Record `status` with a printf-style message for mdl_cuda_last_error() and return it. */
mdl_status mdl_cuda_error(mdl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* After a launch: the status of cudaGetLastError(), with a message naming `fn`. */
mdl_status mdl_cuda_launched(const char *fn);

/* Argument checks: return MDL_ERR_ARG with a message from the enclosing function. */
#define MDL_CHECK(cond, ...)                                        \
    do {                                                            \
        if (!(cond)) return mdl_cuda_error(MDL_ERR_ARG, __VA_ARGS__); \
    } while (0)
#define MDL_CHECK_PTR(p) MDL_CHECK((p) != NULL, "%s: %s must not be NULL", __func__, #p)
#define MDL_CHECK_NONNEG(v) \
    MDL_CHECK((v) >= 0, "%s: %s must be >= 0, got %lld", __func__, #v, (long long)(v))
#define MDL_CHECK_POS(v) \
    MDL_CHECK((v) >= 1, "%s: %s must be >= 1, got %lld", __func__, #v, (long long)(v))

/* Elementwise kernels: 256 threads, a grid-stride loop over at most this many blocks. */
#define MDL_EW_THREADS 256
static inline unsigned mdl_ew_blocks(int64_t count)
{
    int64_t b = (count + MDL_EW_THREADS - 1) / MDL_EW_THREADS;
    return (unsigned)(b < 8192 ? (b < 1 ? 1 : b) : 8192);
}

/* ---- the per-channel affine maps of mdl_affine ------------------------------------ */

/* An mdl_affine (a host struct) as a kernel argument, by value: x -> max(x * scale[ch] +
 * shift[ch], 0), the multiply-add one fmaf, the max only with relu (NaN passes, as in
 * mdl_relu_forward and src_c's mdl_affine_apply), scale NULL (shift NULL too): x itself. */
struct mdl_affine_arg {
    const float *scale, *shift;
    int relu;

    __device__ __forceinline__ float operator()(float v, int64_t ch) const
    {
        if (scale) v = fmaf(v, scale[ch], shift[ch]);
        return relu && v < 0.0f ? 0.0f : v;
    }
};

/* The kernel argument of `a` (NULL: the identity). */
static inline mdl_affine_arg mdl_affine_of(const mdl_affine *a)
{
    mdl_affine_arg r = {NULL, NULL, 0};
    if (a) r = {a->scale, a->shift, a->relu != 0};
    return r;
}

/* The map parameter of a kernel compiled with (FUSED) or without one: the plain
 * kernels hold an empty placeholder instead, last, so that their parameters keep the
 * layout (and the code) they have without it. */
struct mdl_no_affine {};
template <bool FUSED>
using mdl_input_map = std::conditional_t<FUSED, mdl_affine_arg, mdl_no_affine>;

/* ---- deterministic reductions: a fixed tree, the same on every run -------------- */

template <class T>
__device__ __forceinline__ T mdl_warp_sum(T v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v; /* complete in lane 0 */
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024); the result
 * is returned to every thread.  `scratch` holds 32 T in shared memory; the call
 * synchronises the block, so every thread must reach it. */
template <class T>
__device__ T mdl_block_sum(T v, T *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = mdl_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T t = lane < warps ? scratch[lane] : T(0);
        t = mdl_warp_sum(t);
        if (lane == 0) scratch[0] = t;
    }
    __syncthreads();
    return scratch[0];
}

/* ---- one block per channel of an (n, c, hw) tensor ---------------------------------- */

/* Threads of the per-channel kernels (BatchNorm, channel and bias sums). */
#define MDL_CHANNEL_THREADS 1024

/* The values of channel ch of an (n, c, hw) tensor that this thread visits: q = i * hw + j
 * over [0, n*hw) at q = threadIdx.x, + blockDim.x, ...  For every G of them in turn it
 * first calls load(offset of (i, ch, j)) for all G, so that their reads are in flight
 * together, then use(offset, what load returned) for each in order: the thread sees its
 * values in the order of q whatever G is, and a use may write the values it loaded (in
 * place).  The channel sums take G = 8 (measured 7% faster on an H200; BatchNorm's
 * training kernel was not, and its registers reach the 64 a thread of 1024 threads). */
template <int G = 4, class L, class U>
__device__ __forceinline__ void mdl_for_channel(int64_t n, int64_t c, int64_t hw, int64_t ch,
                                                L load, U use)
{
    const int64_t step_i = blockDim.x / hw, step_j = blockDim.x % hw;
    int64_t i = threadIdx.x / hw, j = threadIdx.x % hw;
    while (i < n) {
        int64_t o[G];
        decltype(load(int64_t(0))) v[G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            o[g] = i < n ? (i * c + ch) * hw + j : -1;
            i += step_i;
            j += step_j;
            if (j >= hw) {
                j -= hw;
                i++;
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++)
            if (o[g] >= 0) v[g] = load(o[g]);
#pragma unroll
        for (int g = 0; g < G; g++)
            if (o[g] >= 0) use(o[g], v[g]);
    }
}

#endif /* MDL_CUDA_COMMON_CUH */
