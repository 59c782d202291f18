/* test_cuda_capi.c -- uses the CUDA kernels only through minidl_cuda.h and
 * libminidl_cuda, with no CUDA header or toolkit: the header compiles as C,
 * the library loads and answers with or without a GPU, and bad arguments come
 * back as a status and a message before anything touches the device (so this
 * runs on machines without a GPU; tests/test_cuda_kernels.py checks the
 * numbers where there is one).  Exit status 0 = pass. */
#include <stdio.h>
#include <string.h>
#include <minidl_cuda.h>

static int failures;

#define EXPECT(cond, ...)                                  \
    do {                                                   \
        if (!(cond)) {                                     \
            failures++;                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);    \
            printf(__VA_ARGS__);                           \
            printf("\n");                                  \
        }                                                  \
    } while (0)

/* st is `want` and the message names `word` */
static void expect_error(mdl_status st, mdl_status want, const char *word, int line)
{
    if (st != want || strstr(mdl_cuda_last_error(), word) == NULL) {
        failures++;
        printf("FAIL line %d: status %d (want %d), message \"%s\" (want \"%s\" in it)\n", line,
               (int)st, (int)want, mdl_cuda_last_error(), word);
    }
}
#define EXPECT_ERROR(call, want, word) expect_error((call), (want), (word), __LINE__)

int main(void)
{
    int n = -1;
    EXPECT(mdl_cuda_device_count(&n) == MDL_OK && n >= 0, "device_count: %d, %s", n,
           mdl_cuda_last_error());
    printf("CUDA devices: %d%s%s\n", n, n ? "" : " -- ", n ? "" : mdl_cuda_last_error());

    /* a fake device address: every call below fails its checks before using it */
    float *p = (float *)(uintptr_t)4096;
    EXPECT_ERROR(mdl_cuda_device_count(NULL), MDL_ERR_ARG, "n must not be NULL");
    EXPECT_ERROR(mdl_cuda_relu_forward(-1, p, p, NULL), MDL_ERR_ARG, "count must be >= 0");
    EXPECT_ERROR(mdl_cuda_relu_forward(10, NULL, p, NULL), MDL_ERR_ARG, "x must not be NULL");
    EXPECT(mdl_cuda_relu_forward(0, NULL, NULL, NULL) == MDL_OK, "count 0 is a no-op");
    EXPECT_ERROR(mdl_cuda_sgemm(0, 0, 4, 4, 4, 1.0f, p, 3, p, 4, 0.0f, p, 4, NULL, 0, NULL),
                 MDL_ERR_ARG, "lda must be >= 4");
    EXPECT_ERROR(mdl_cuda_dropout_forward(8, 1.0f, 1, p, p, NULL), MDL_ERR_ARG, "p must be in [0, 1)");

    mdl_conv2d_shape cs = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1};
    int64_t ho = 0, wo = 0;
    EXPECT(mdl_cuda_conv2d_output_size(&cs, &ho, &wo) == MDL_OK && ho == 8 && wo == 8,
           "conv output %lld x %lld", (long long)ho, (long long)wo);
    mdl_conv2d_shape bad = cs;
    bad.kh = 20;
    EXPECT_ERROR(mdl_cuda_conv2d_forward(&bad, p, p, NULL, p, NULL, 0, NULL), MDL_ERR_ARG,
                 "kernel size can't be greater");
    /* many images, few channels: the weight gradient splits n*h*w and needs a workspace */
    mdl_conv2d_shape big = {256, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1};
    size_t need = mdl_cuda_conv2d_workspace_size(&big);
    EXPECT(need > 0, "split-K workspace for %s", "a long reduction");
    EXPECT_ERROR(mdl_cuda_conv2d_backward_weights(&big, p, p, p, 0, p, need - 1, NULL),
                 MDL_ERR_WORKSPACE, "workspace has");
    EXPECT_ERROR(mdl_cuda_conv2d_backward_data_fused(&big, p, p, p, 1, p, need - 1, NULL),
                 MDL_ERR_WORKSPACE, "workspace has");
    EXPECT_ERROR(mdl_cuda_conv2d_backward_data_fused(&cs, p, p, NULL, 1, NULL, 0, NULL),
                 MDL_ERR_ARG, "mdl_cuda_conv2d_backward_data_fused: dx must not be NULL");
    /* the forward's channel sums take each output tile's in the workspace: a pair of
     * doubles a channel for cs's one tile of 128 columns, from an 8-byte boundary */
    const size_t sums = mdl_cuda_conv2d_workspace_size(&cs);
    EXPECT(sums == 2 * 4 * sizeof(double) + sizeof(double), "the channel sums' workspace: %zu bytes",
           sums);
    EXPECT_ERROR(mdl_cuda_conv2d_forward_ex(&cs, p, p, NULL, 0, (double *)p, NULL, p, p,
                                            sums - 1, NULL),
                 MDL_ERR_WORKSPACE, "workspace has");
    /* a tap's offset in an image, c_in*h*w, is a 32-bit int in the kernels */
    mdl_conv2d_shape huge_image = {1, 16384, 256, 256, 4, 1, 1, 1, 1, 0, 0};
    EXPECT_ERROR(mdl_cuda_conv2d_forward(&huge_image, p, p, NULL, p, NULL, 0, NULL),
                 MDL_ERR_UNSUPPORTED, "c_in*h*w = 1073741824");
    /* ... and so is r * w for a kernel row r, with r up to the padded height */
    mdl_conv2d_shape tall_pad = {1, 1, 1, 1 << 20, 1, 4097, 1, 1, 1 << 20, 2048, 0};
    EXPECT_ERROR(mdl_cuda_conv2d_forward(&tall_pad, p, p, NULL, p, NULL, 0, NULL),
                 MDL_ERR_UNSUPPORTED, "padded h * w, must be below 2^30");
    EXPECT_ERROR(mdl_cuda_conv2d_forward(&cs, NULL, p, NULL, p, NULL, 0, NULL), MDL_ERR_ARG,
                 "mdl_cuda_conv2d_forward: x must not be NULL");
    /* the CPU's limits on an SGEMM's operands: 2^60 elements, leading dimensions included */
    EXPECT_ERROR(mdl_cuda_sgemm(0, 0, 0, (int64_t)1 << 62, (int64_t)1 << 62, 1.0f, p,
                                (int64_t)1 << 62, p, (int64_t)1 << 62, 0.0f, p, (int64_t)1 << 62,
                                NULL, 0, NULL), MDL_ERR_ARG, "shape too large");
    EXPECT_ERROR(mdl_cuda_sgemm(0, 0, 2, 1, 1, 1.0f, p, (int64_t)1 << 62, p, 1, 0.0f, p, 1, NULL,
                                0, NULL), MDL_ERR_ARG, "no operand may span 2^60 elements");

    mdl_pool2d_shape ps = {1, 1, 5, 5, 3, 3, 2, 2, 0, 0, 1};
    EXPECT(mdl_cuda_pool2d_output_size(&ps, &ho, &wo) == MDL_OK && ho == 2 && wo == 2,
           "ceil-mode pool output %lld x %lld", (long long)ho, (long long)wo);
    ps.pad_h = 2;
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward(&ps, p, p, NULL), MDL_ERR_ARG, "pad_h must be in");
    EXPECT_ERROR(mdl_cuda_batch_norm_forward_train(1, 4, 1, p, p, p, 1e-5f, 0.1f, NULL, NULL, p,
                                                   p, p, NULL),
                 MDL_ERR_ARG, "more than 1 value per channel");
    EXPECT_ERROR(mdl_cuda_softmax_cross_entropy(0, 10, p, (const int64_t *)p, p, p, NULL),
                 MDL_ERR_ARG, "n must be >= 1");
    EXPECT_ERROR(mdl_cuda_sgd_step(4, p, p, NULL, 0.1f, 0.9f, 0.0f, 0.0f, 0, 0, NULL), MDL_ERR_ARG,
                 "momentum_buf must not be NULL");
    EXPECT_ERROR(mdl_cuda_adam_step(4, p, p, p, p, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, NULL),
                 MDL_ERR_ARG, "step must be >= 1");
    EXPECT_ERROR(mdl_cuda_linear_backward_weights(2, 3, 4, p, p, p, NULL, 2, NULL, 0, NULL),
                 MDL_ERR_ARG, "accumulate must be 0 or 1");

    /* the fused kernels: mdl_affine is a host struct holding device pointers */
    mdl_affine half = {p, NULL, 1};
    EXPECT_ERROR(mdl_cuda_conv2d_forward_fused(&cs, p, &half, p, NULL, 1, NULL, NULL, p, NULL, 0,
                                               NULL),
                 MDL_ERR_ARG, "in->scale and in->shift must both be given");
    mdl_affine relu_only = {NULL, NULL, 1};
    EXPECT_ERROR(mdl_cuda_conv2d_backward_weights_fused(&big, p, &relu_only, p, p, 0, p, need - 1,
                                                        NULL),
                 MDL_ERR_WORKSPACE, "workspace has");
    ps.pad_h = 0;
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_fused(&ps, p, &half, p, NULL), MDL_ERR_ARG,
                 "in->scale and in->shift must both be given");
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_fused(&ps, p, &relu_only, p, NULL, NULL),
                 MDL_ERR_ARG, "dx must not be NULL");
    ps.pad_h = 2;
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_fused(&ps, p, NULL, p, p, NULL), MDL_ERR_ARG,
                 "pad_h must be in");

    /* max pooling that records its taps: a tap is a byte, so windows of at most 256 elements */
    uint8_t *t = (uint8_t *)(uintptr_t)4096;
    mdl_pool2d_shape wide = {1, 1, 17, 17, 17, 17, 1, 1, 0, 0, 0};
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_argmax(&wide, p, NULL, p, t, NULL), MDL_ERR_ARG,
                 "window of 17 x 17 elements does not fit a byte");
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_argmax(&wide, t, p, p, NULL), MDL_ERR_ARG,
                 "window of 17 x 17 elements does not fit a byte");
    wide.kh = wide.kw = 16; /* 256 taps pass; the next check fails */
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_argmax(&wide, NULL, NULL, p, t, NULL), MDL_ERR_ARG,
                 "mdl_cuda_max_pool2d_forward_argmax: x and y must not be NULL");
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_argmax(&wide, t, p, NULL, NULL), MDL_ERR_ARG,
                 "mdl_cuda_max_pool2d_backward_argmax: tap, dy and dx must not be NULL");
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_argmax(&ps, t, p, p, NULL), MDL_ERR_ARG,
                 "pad_h must be in");
    ps.pad_h = 0;
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_argmax(&ps, p, NULL, p, NULL, NULL), MDL_ERR_ARG,
                 "mdl_cuda_max_pool2d_forward_argmax: tap must not be NULL");
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_argmax(&ps, p, &half, p, t, NULL), MDL_ERR_ARG,
                 "in->scale and in->shift must both be given");
    EXPECT_ERROR(mdl_cuda_max_pool2d_backward_argmax(&ps, NULL, p, p, NULL), MDL_ERR_ARG,
                 "mdl_cuda_max_pool2d_backward_argmax: tap, dy and dx must not be NULL");
    EXPECT_ERROR(mdl_cuda_max_pool2d_forward_argmax(NULL, p, NULL, p, t, NULL), MDL_ERR_ARG,
                 "s must not be NULL");
    EXPECT_ERROR(mdl_cuda_affine_add(2, 3, 4, p, &half, NULL, NULL, 1, p, NULL), MDL_ERR_ARG,
                 "fa->scale and fa->shift");
    EXPECT(mdl_cuda_affine_add(0, 3, 4, NULL, NULL, NULL, NULL, 0, NULL, NULL) == MDL_OK,
           "affine_add of n = 0 is a no-op");
    EXPECT_ERROR(mdl_cuda_batch_norm_stats(4, 1, (const double *)p, (const double *)p, p, p, 1e-5f,
                                           0.1f, NULL, NULL, p, p, p, p, NULL),
                 MDL_ERR_ARG, "count > 1");
    EXPECT_ERROR(mdl_cuda_batch_norm_relu_backward(2, 4, 3, p, p, p, p, p, NULL, p, p, p, p, 0,
                                                   NULL),
                 MDL_ERR_ARG, "scale must not be NULL");
    EXPECT_ERROR(mdl_cuda_batch_norm_add_relu_backward(2, 4, 3, p, p, &relu_only, p, p, p, p, p,
                                                       NULL, p, p, 0, NULL),
                 MDL_ERR_ARG, "db must not be NULL");

    if (failures) {
        printf("%d failure(s)\n", failures);
        return 1;
    }
    printf("test_cuda_capi: all passed\n");
    return 0;
}
