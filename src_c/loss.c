/* loss.c -- softmax cross-entropy with integer labels, mean over the batch.
 * Scalar reference here; AVX2 version in loss_avx2.c.
 *
 * Per row z (classes): m = max z, s = sum exp(z - m), lse = m + log s,
 * loss_row = lse - z[label]; dlogits row = (exp(z - m) / s - onehot) / n.
 * Subtracting the row maximum keeps every exp() in [0, 1], so large logits
 * neither overflow nor lose the small terms.  NaN in a row makes that row's
 * loss and gradient NaN; +inf gives NaN (inf - inf), as in PyTorch. */
#include <math.h>
#include "common.h"
#include "loss.h"

/* ---- scalar reference ----------------------------------------------------- */

/* rows [lo, hi) of logits (n, classes) -> sum of row losses; dlogits (n, classes) = */
double mdl_softmax_xent_rows_scalar(int64_t lo, int64_t hi, int64_t classes, const float *logits,
                                    const int64_t *labels, double inv_n, float *dlogits)
{
    double total = 0.0;
    for (int64_t i = lo; i < hi; i++) {
        const float *z = logits + i * classes;
        const float z_label = z[labels[i]]; /* before dlogits, which may be logits, is written */
        float m = z[0];
        for (int64_t j = 1; j < classes; j++)
            if (z[j] > m) m = z[j];
        double s = 0.0;
        if (dlogits) {
            float *d = dlogits + i * classes;
            for (int64_t j = 0; j < classes; j++) {
                d[j] = expf(z[j] - m);
                s += d[j];
            }
        } else {
            for (int64_t j = 0; j < classes; j++) s += expf(z[j] - m);
        }
        int64_t label = labels[i];
        total += (double)m + log(s) - (double)z_label;
        if (dlogits) {
            float *d = dlogits + i * classes;
            double inv_sn = inv_n / s;
            double e_label = d[label];
            float scale = (float)inv_sn;
            for (int64_t j = 0; j < classes; j++) d[j] *= scale;
            /* (e - s) / (s n) in double: no cancellation against a rounded softmax */
            d[label] = (float)((e_label - s) * inv_sn);
        }
    }
    return total;
}

/* ---- dispatch ------------------------------------------------------------- */

/* Per-thread partial sums are added in thread order, so the loss does not
 * depend on scheduling.  More threads than slots would not pay anyway. */
#define MAX_SLOTS 256

mdl_status mdl_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits,
                                     const int64_t *labels, float *loss, float *dlogits)
{
    MDL_CHECK_POS(n);
    MDL_CHECK_POS(classes);
    MDL_CHECK(classes <= INT64_MAX / n, "%s: n * classes overflows (n = %lld, classes = %lld)",
              __func__, (long long)n, (long long)classes);
    MDL_CHECK_PTR(logits);
    MDL_CHECK_PTR(labels);
    MDL_CHECK_PTR(loss);
    for (int64_t i = 0; i < n; i++)
        MDL_CHECK(labels[i] >= 0 && labels[i] < classes,
                  "%s: labels[%lld] = %lld is out of range [0, %lld)", __func__, (long long)i,
                  (long long)labels[i], (long long)classes);

    double inv_n = 1.0 / (double)n;
    int avx2 = mdl_use_avx2();
    int nt = mdl_threads_for((double)n * (double)classes * 16.0); /* an exp is ~16 operations */
    if (nt > MAX_SLOTS) nt = MAX_SLOTS;
    if (nt > n) nt = (int)n;
    double part[MAX_SLOTS];
    #pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        part[t] = avx2
            ? mdl_softmax_xent_rows_avx2(lo, hi, classes, logits, labels, inv_n, dlogits)
            : mdl_softmax_xent_rows_scalar(lo, hi, classes, logits, labels, inv_n, dlogits);
    }
    double total = 0.0;
    for (int t = 0; t < nt; t++) total += part[t];
    *loss = (float)(total * inv_n);
    return MDL_OK;
}
