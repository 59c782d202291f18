/* optim_hp.h -- internal, shared by src_c/optim*.c and src_cuda/optim.cu: the optimizers'
 * hyper-parameters pre-computed once per call, and the update of one element (the
 * scalar reference, and the body of the CUDA kernels). */
#ifndef MDL_OPTIM_HP_H
#define MDL_OPTIM_HP_H
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#  define MDL_HOST_DEVICE __host__ __device__
#else
#  define MDL_HOST_DEVICE
#endif

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

static inline mdl_sgd_hp mdl_sgd_hyper(float lr, float momentum, float dampening,
                                       float weight_decay, int nesterov, int first_step)
{
    mdl_sgd_hp hp = {lr, momentum, (float)(1.0 - (double)dampening), weight_decay,
                     nesterov != 0, first_step != 0};
    return hp;
}

/* the bias corrections in double */
static inline mdl_adam_hp mdl_adam_hyper(int64_t step, float lr, float beta1, float beta2,
                                         float eps, float weight_decay, int decoupled)
{
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    mdl_adam_hp hp;
    hp.beta1 = beta1;
    hp.beta2 = beta2;
    hp.one_minus_beta1 = (float)(1.0 - (double)beta1);
    hp.one_minus_beta2 = (float)(1.0 - (double)beta2);
    hp.step_size = (float)((double)lr / bc1);
    hp.bc2_sqrt = (float)sqrt(bc2);
    hp.eps = eps;
    hp.weight_decay = decoupled ? 0.0f : weight_decay;
    hp.decay = decoupled ? (float)(1.0 - (double)lr * (double)weight_decay) : 1.0f;
    return hp;
}

/* param[i] -= lr * d, with d from grad, weight decay and the momentum buffer */
static inline MDL_HOST_DEVICE void mdl_sgd_element(int64_t i, float *param, const float *grad,
                                                   float *buf, const mdl_sgd_hp *hp)
{
    float d = grad[i];
    if (hp->weight_decay != 0.0f) d = d + hp->weight_decay * param[i];
    if (hp->momentum != 0.0f) {
        float b = hp->first_step ? d : hp->momentum * buf[i] + hp->one_minus_dampening * d;
        buf[i] = b;
        d = hp->nesterov ? d + hp->momentum * b : b;
    }
    param[i] = param[i] - hp->lr * d;
}

/* param[i], exp_avg[i], exp_avg_sq[i] updated in place */
static inline MDL_HOST_DEVICE void mdl_adam_element(int64_t i, float *param, const float *grad,
                                                    float *exp_avg, float *exp_avg_sq,
                                                    const mdl_adam_hp *hp)
{
    float p = param[i] * hp->decay;
    float g = grad[i];
    if (hp->weight_decay != 0.0f) g = g + hp->weight_decay * p;
    /* exp_avg = lerp(exp_avg, g, 1 - beta1), in the form PyTorch's lerp uses */
    float m = exp_avg[i];
    m = hp->one_minus_beta1 < 0.5f ? m + hp->one_minus_beta1 * (g - m) : g - (g - m) * hp->beta1;
    /* (1 - beta2) * g first, as PyTorch's addcmul: g * g overflows from |g| ~ 1.8e19 */
    float v = exp_avg_sq[i] * hp->beta2 + hp->one_minus_beta2 * g * g;
    float denom = sqrtf(v) / hp->bc2_sqrt + hp->eps;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - hp->step_size * (m / denom);
}
#endif
