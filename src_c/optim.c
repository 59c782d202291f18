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
    for (int64_t i = lo; i < hi; i++) mdl_sgd_element(i, param, grad, buf, hp);
}

/* param, exp_avg, exp_avg_sq [count] updated in place */
void mdl_adam_scalar(int64_t lo, int64_t hi, float *param, const float *grad, float *exp_avg,
                     float *exp_avg_sq, const mdl_adam_hp *hp)
{
    for (int64_t i = lo; i < hi; i++) mdl_adam_element(i, param, grad, exp_avg, exp_avg_sq, hp);
}

/* ---- dispatch ------------------------------------------------------------- */

mdl_status mdl_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf,
                        float lr, float momentum, float dampening, float weight_decay,
                        int nesterov, int first_step)
{
    mdl_status st = mdl_sgd_check_args(__func__, count, param, grad, momentum_buf, lr, momentum,
                                       dampening, weight_decay, nesterov);
    if (st != MDL_OK || count == 0) return st;

    mdl_sgd_hp hp = mdl_sgd_hyper(lr, momentum, dampening, weight_decay, nesterov, first_step);
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

    mdl_adam_hp hp = mdl_adam_hyper(step, lr, beta1, beta2, eps, weight_decay, decoupled);
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count * 4.0,
                        if (avx2) mdl_adam_avx2(lo, hi, param, grad, exp_avg, exp_avg_sq, &hp);
                        else mdl_adam_scalar(lo, hi, param, grad, exp_avg, exp_avg_sq, &hp));
    return MDL_OK;
}
