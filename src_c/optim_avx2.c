/* optim_avx2.c -- AVX2 versions of the optim.c kernels; compiled with -mavx2 -mfma.
 * Each vector loop is followed by the scalar reference for the tail. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "optim.h"

void mdl_sgd_avx2(int64_t lo, int64_t hi, float *param, const float *grad, float *buf,
                  const mdl_sgd_hp *hp)
{
    const __m256 lr = _mm256_set1_ps(hp->lr), mom = _mm256_set1_ps(hp->momentum);
    const __m256 omd = _mm256_set1_ps(hp->one_minus_dampening);
    const __m256 wd = _mm256_set1_ps(hp->weight_decay);
    const int decay = hp->weight_decay != 0.0f, use_buf = hp->momentum != 0.0f;
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 p = _mm256_loadu_ps(param + i);
        __m256 d = _mm256_loadu_ps(grad + i);
        if (decay) d = _mm256_fmadd_ps(wd, p, d);
        if (use_buf) {
            __m256 b = hp->first_step ? d
                                      : _mm256_fmadd_ps(mom, _mm256_loadu_ps(buf + i),
                                                        _mm256_mul_ps(omd, d));
            _mm256_storeu_ps(buf + i, b);
            d = hp->nesterov ? _mm256_fmadd_ps(mom, b, d) : b;
        }
        _mm256_storeu_ps(param + i, _mm256_fnmadd_ps(lr, d, p));
    }
    mdl_sgd_scalar(i, hi, param, grad, buf, hp);
}

void mdl_adam_avx2(int64_t lo, int64_t hi, float *param, const float *grad, float *exp_avg,
                   float *exp_avg_sq, const mdl_adam_hp *hp)
{
    const __m256 b1 = _mm256_set1_ps(hp->beta1), b2 = _mm256_set1_ps(hp->beta2);
    const __m256 omb1 = _mm256_set1_ps(hp->one_minus_beta1);
    const __m256 omb2 = _mm256_set1_ps(hp->one_minus_beta2);
    const __m256 step_size = _mm256_set1_ps(hp->step_size);
    const __m256 bc2_sqrt = _mm256_set1_ps(hp->bc2_sqrt), eps = _mm256_set1_ps(hp->eps);
    const __m256 wd = _mm256_set1_ps(hp->weight_decay), decay = _mm256_set1_ps(hp->decay);
    const int lerp_lo = hp->one_minus_beta1 < 0.5f, l2 = hp->weight_decay != 0.0f;
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 p = _mm256_mul_ps(_mm256_loadu_ps(param + i), decay);
        __m256 g = _mm256_loadu_ps(grad + i);
        if (l2) g = _mm256_fmadd_ps(wd, p, g);
        __m256 m = _mm256_loadu_ps(exp_avg + i);
        __m256 gm = _mm256_sub_ps(g, m);
        m = lerp_lo ? _mm256_fmadd_ps(omb1, gm, m) : _mm256_fnmadd_ps(gm, b1, g);
        __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(exp_avg_sq + i), b2,
                                   _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
        _mm256_storeu_ps(exp_avg + i, m);
        _mm256_storeu_ps(exp_avg_sq + i, v);
        _mm256_storeu_ps(param + i, _mm256_fnmadd_ps(step_size, _mm256_div_ps(m, denom), p));
    }
    mdl_adam_scalar(i, hi, param, grad, exp_avg, exp_avg_sq, hp);
}
#endif
