/* loss.c -- placeholder: not implemented yet. */
#include "common.h"

mdl_status mdl_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits, const int64_t *labels, float *loss, float *dlogits)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_softmax_cross_entropy: not implemented");
}
