/* optim.h -- internal: kernels of optim.c / optim_avx2.c over the index range [lo, hi).
 * Hyper-parameters arrive checked and pre-computed by the dispatch in optim.c. */
#ifndef MDL_OPTIM_H
#define MDL_OPTIM_H
#include <stdint.h>
#include "optim_hp.h"


void mdl_sgd_scalar(int64_t lo, int64_t hi, float *param, const float *grad, float *buf,
                    const mdl_sgd_hp *hp);
void mdl_adam_scalar(int64_t lo, int64_t hi, float *param, const float *grad, float *exp_avg,
                     float *exp_avg_sq, const mdl_adam_hp *hp);

#if MDL_X86
void mdl_sgd_avx2(int64_t lo, int64_t hi, float *param, const float *grad, float *buf,
                  const mdl_sgd_hp *hp);
void mdl_adam_avx2(int64_t lo, int64_t hi, float *param, const float *grad, float *exp_avg,
                   float *exp_avg_sq, const mdl_adam_hp *hp);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_sgd_avx2 mdl_sgd_scalar
#  define mdl_adam_avx2 mdl_adam_scalar
#endif
#endif
