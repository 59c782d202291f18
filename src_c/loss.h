/* loss.h -- internal: kernels of loss.c / loss_avx2.c over the row range [lo, hi). */
#ifndef MDL_LOSS_H
#define MDL_LOSS_H
#include <stdint.h>

/* Softmax cross-entropy of rows [lo, hi) of logits (n, classes) whose labels
 * are already checked.  Returns the sum of the row losses lse - z[label] in
 * double; writes dlogits rows = (softmax - onehot) * inv_n when dlogits is
 * not NULL (overwritten). */
double mdl_softmax_xent_rows_scalar(int64_t lo, int64_t hi, int64_t classes, const float *logits,
                                    const int64_t *labels, double inv_n, float *dlogits);

#if MDL_X86
double mdl_softmax_xent_rows_avx2(int64_t lo, int64_t hi, int64_t classes, const float *logits,
                                  const int64_t *labels, double inv_n, float *dlogits);
#else /* mdl_use_avx2() is never true off x86; this name only keeps the dispatch compiling */
#  define mdl_softmax_xent_rows_avx2 mdl_softmax_xent_rows_scalar
#endif
#endif
