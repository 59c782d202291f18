/* optim.h -- internal: kernels of optim.c / optim_avx2.c over the index range [lo, hi).
 * Hyper-parameters arrive checked and pre-computed by the dispatch in optim.c. */
#ifndef MDL_OPTIM_H
#define MDL_OPTIM_H
#include <stdint.h>

typedef struct mdl_sgd_hp {
    float lr, momentum, one_minus_dampening, weight_decay;
    int nesterov, first_step;
} mdl_sgd_hp;

typedef struct mdl_adam_hp {
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size;      /* lr / (1 - beta1^step) */
    float bc2_sqrt;       /* sqrt(1 - beta2^step) */
    float eps;
    float weight_decay;   /* Adam: added to the gradient as weight_decay * param; 0 for AdamW */
    float decay;          /* AdamW: param *= decay (1 - lr * weight_decay); 1 for Adam */
} mdl_adam_hp;

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
