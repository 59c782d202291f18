/* optim.c -- optimizer steps (SGD with momentum, Adam, AdamW), in place, with
 * PyTorch's torch.optim update rules.  Scalar references here; AVX2 versions
 * in optim_avx2.c.  Every array is updated in place; element i depends only on
 * element i of the inputs, so the range is split evenly over the threads. */
#include <math.h>
#include "common.h"
#include "optim.h"
#include "checks.h"

/* ---- scalar references ---------------------------------------------------- */

/* param[count] -= lr * d, with d from grad, weight decay and the momentum buffer */
void mdl_sgd_scalar(int64_t lo, int64_t hi, float *param, const float *grad, float *buf,
                    const mdl_sgd_hp *hp)
{
    for (int64_t i = lo; i < hi; i++) {
        float d = grad[i];
        if (hp->weight_decay != 0.0f) d = d + hp->weight_decay * param[i];
        if (hp->momentum != 0.0f) {
            float b = hp->first_step ? d : hp->momentum * buf[i] + hp->one_minus_dampening * d;
            buf[i] = b;
            d = hp->nesterov ? d + hp->momentum * b : b;
        }
        param[i] = param[i] - hp->lr * d;
    }
}

/* param, exp_avg, exp_avg_sq [count] updated in place */
void mdl_adam_scalar(int64_t lo, int64_t hi, float *param, const float *grad, float *exp_avg,
                     float *exp_avg_sq, const mdl_adam_hp *hp)
{
    for (int64_t i = lo; i < hi; i++) {
        float p = param[i] * hp->decay;
        float g = grad[i];
        if (hp->weight_decay != 0.0f) g = g + hp->weight_decay * p;
        /* exp_avg = lerp(exp_avg, g, 1 - beta1), in the form PyTorch's lerp uses */
        float m = exp_avg[i];
        m = hp->one_minus_beta1 < 0.5f ? m + hp->one_minus_beta1 * (g - m)
                                       : g - (g - m) * hp->beta1;
        float v = exp_avg_sq[i] * hp->beta2 + hp->one_minus_beta2 * (g * g);
        float denom = sqrtf(v) / hp->bc2_sqrt + hp->eps;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        param[i] = p - hp->step_size * (m / denom);
    }
}

/* ---- dispatch ------------------------------------------------------------- */

mdl_status mdl_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf,
                        float lr, float momentum, float dampening, float weight_decay,
                        int nesterov, int first_step)
{
    mdl_status st = mdl_sgd_check_args(__func__, count, param, grad, momentum_buf, lr, momentum,
                                       dampening, weight_decay, nesterov);
    if (st != MDL_OK || count == 0) return st;

    mdl_sgd_hp hp = {lr, momentum, (float)(1.0 - (double)dampening), weight_decay,
                     nesterov != 0, first_step != 0};
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count * 4.0,
                        if (avx2) mdl_sgd_avx2(lo, hi, param, grad, momentum_buf, &hp);
                        else mdl_sgd_scalar(lo, hi, param, grad, momentum_buf, &hp));
    return MDL_OK;
}

mdl_status mdl_adam_step(int64_t count, float *param, const float *grad, float *exp_avg,
                         float *exp_avg_sq, int64_t step, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int decoupled)
{
    mdl_status st = mdl_adam_check_args(__func__, count, param, grad, exp_avg, exp_avg_sq, step,
                                        lr, beta1, beta2, eps, weight_decay);
    if (st != MDL_OK || count == 0) return st;

    /* bias corrections once per call, in double */
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
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count * 4.0,
                        if (avx2) mdl_adam_avx2(lo, hi, param, grad, exp_avg, exp_avg_sq, &hp);
                        else mdl_adam_scalar(lo, hi, param, grad, exp_avg, exp_avg_sq, &hp));
    return MDL_OK;
}
