/* act.h -- internal: kernels of act.c / act_avx2.c over the index range [lo, hi). */
#ifndef MDL_ACT_H
#define MDL_ACT_H
#include <stdint.h>
#include "common.h"

/* Counter-based hash for dropout: a pure function of (seed, i), so masks are
 * reproducible, independent of threading, and need no storage. */
static inline uint32_t mdl_fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}
/* Key for the block of indices sharing i >> 32. */
static inline uint32_t mdl_dropout_key(uint64_t seed, int64_t i)
{
    return mdl_fmix32((uint32_t)(seed >> 32) ^ mdl_fmix32((uint32_t)((uint64_t)i >> 32) + 0x9e3779b9u))
           ^ (uint32_t)seed;
}
static inline uint32_t mdl_dropout_hash(uint64_t seed, int64_t i)
{
    uint32_t k = mdl_dropout_key(seed, i);
    return mdl_fmix32(mdl_fmix32((uint32_t)i ^ k) + k);
}

void mdl_relu_forward_scalar(int64_t lo, int64_t hi, const float *x, float *y);
void mdl_relu_backward_scalar(int64_t lo, int64_t hi, const float *x, const float *dy, float *dx);
void mdl_add_scalar(int64_t lo, int64_t hi, const float *a, const float *b, float *y);
void mdl_dropout_scalar(int64_t lo, int64_t hi, uint32_t threshold, float scale, uint64_t seed,
                        const float *x, float *y);
/* d[0, n) = src[0, n) read through one channel's map g (d may equal src) */
void mdl_affine_row_scalar(const float *src, int64_t n, mdl_affine_ch g, float *d);
/* rows [r0, r1) of (n * c, hw), row r of channel r % c: y = act(fa(a) + fb(b)) from
 * column j0 on (b NULL: act(fa(a))) */
void mdl_affine_add_scalar(int64_t r0, int64_t r1, int64_t j0, int64_t c, int64_t hw,
                           const float *a, const mdl_affine *fa, const float *b,
                           const mdl_affine *fb, int relu, float *y);

#if MDL_X86
void mdl_relu_forward_avx2(int64_t lo, int64_t hi, const float *x, float *y);
void mdl_relu_backward_avx2(int64_t lo, int64_t hi, const float *x, const float *dy, float *dx);
void mdl_add_avx2(int64_t lo, int64_t hi, const float *a, const float *b, float *y);
void mdl_dropout_avx2(int64_t lo, int64_t hi, uint32_t threshold, float scale, uint64_t seed,
                      const float *x, float *y);
void mdl_affine_row_avx2(const float *src, int64_t n, mdl_affine_ch g, float *d);
void mdl_affine_add_avx2(int64_t r0, int64_t r1, int64_t c, int64_t hw, const float *a,
                         const mdl_affine *fa, const float *b, const mdl_affine *fb, int relu,
                         float *y);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_relu_forward_avx2 mdl_relu_forward_scalar
#  define mdl_relu_backward_avx2 mdl_relu_backward_scalar
#  define mdl_add_avx2 mdl_add_scalar
#  define mdl_dropout_avx2 mdl_dropout_scalar
#  define mdl_affine_row_avx2 mdl_affine_row_scalar
#  define mdl_affine_add_avx2(r0, r1, c, hw, a, fa, b, fb, relu, y) \
          mdl_affine_add_scalar(r0, r1, 0, c, hw, a, fa, b, fb, relu, y)
#endif
#endif
