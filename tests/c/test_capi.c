/* test_capi.c -- uses minidl only through its public header and library:
 * runs a GEMM and a convolution (forward and backward) on both kernel
 * versions and checks them against plain loops, max pooling with taps against
 * max pooling that recomputes them, the loss computed in place, then checks that bad
 * arguments come back as a status and a message.  Exit status 0 = pass. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <minidl.h>

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

static float frand(unsigned *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((*state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static double max_rel_err(const float *got, const double *want, size_t n)
{
    double err = 0, scale = 1e-3;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (d > err || d != d) err = d != d ? INFINITY : d;
        if (fabs(want[i]) > scale) scale = fabs(want[i]);
    }
    return err / scale;
}

static void test_gemm(const char *level)
{
    enum { M = 37, N = 53, K = 71 };
    static float a[K * M], b[N * K], c[M * N];
    static double want[M * N];
    unsigned s = 1;
    for (int i = 0; i < K * M; i++) a[i] = frand(&s);
    for (int i = 0; i < N * K; i++) b[i] = frand(&s);
    for (int i = 0; i < M * N; i++) c[i] = frand(&s);
    /* C = 0.5 * A^T B^T + 2 C, A stored k x m, B stored n x k */
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int p = 0; p < K; p++) acc += (double)a[p * M + i] * b[j * K + p];
            want[i * N + j] = 0.5 * acc + 2.0 * c[i * N + j];
        }
    mdl_status st = mdl_sgemm(1, 1, M, N, K, 0.5f, a, M, b, K, 2.0f, c, N, NULL, 0);
    EXPECT(st == MDL_OK, "[%s] mdl_sgemm: %s", level, mdl_last_error());
    double err = max_rel_err(c, want, M * N);
    EXPECT(err < 1e-5, "[%s] gemm relative error %g", level, err);
}

static void test_conv(const char *level)
{
    const mdl_conv2d_shape s = {.n = 2, .c_in = 3, .h = 9, .w = 8, .c_out = 5, .kh = 3, .kw = 2,
                                .stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 1};
    int64_t ho = 0, wo = 0;
    mdl_status st = mdl_conv2d_output_size(&s, &ho, &wo);
    EXPECT(st == MDL_OK && ho == 5 && wo == 9, "[%s] output size %lldx%lld", level,
           (long long)ho, (long long)wo);
    if (st != MDL_OK) return;
    size_t nx = 2 * 3 * 9 * 8, nw = 5 * 3 * 3 * 2, ny = (size_t)(2 * 5 * ho * wo);
    float *x = malloc(nx * sizeof *x), *w = malloc(nw * sizeof *w), *bias = malloc(5 * sizeof *bias);
    float *y = malloc(ny * sizeof *y), *dy = malloc(ny * sizeof *dy), *dx = malloc(nx * sizeof *dx);
    float *dw = malloc(nw * sizeof *dw), *db = malloc(5 * sizeof *db);
    double *ry = calloc(ny, sizeof *ry), *rdx = calloc(nx, sizeof *rdx);
    double *rdw = calloc(nw, sizeof *rdw), *rdb = calloc(5, sizeof *rdb);
    unsigned r = 7;
    for (size_t i = 0; i < nx; i++) x[i] = frand(&r);
    for (size_t i = 0; i < nw; i++) w[i] = frand(&r);
    for (size_t i = 0; i < ny; i++) dy[i] = frand(&r);
    for (int i = 0; i < 5; i++) bias[i] = frand(&r);
    /* plain loops: forward, and the three gradients, at once */
    for (int n = 0; n < 2; n++)
        for (int co = 0; co < 5; co++)
            for (int oh = 0; oh < ho; oh++)
                for (int ow = 0; ow < wo; ow++) {
                    size_t yi = ((size_t)(n * 5 + co) * ho + oh) * wo + ow;
                    double acc = bias[co];
                    rdb[co] += dy[yi];
                    for (int ci = 0; ci < 3; ci++)
                        for (int i = 0; i < 3; i++)
                            for (int j = 0; j < 2; j++) {
                                int ih = oh * 2 - 1 + i, iw = ow - 1 + j;
                                if (ih < 0 || ih >= 9 || iw < 0 || iw >= 8) continue;
                                size_t xi = ((size_t)(n * 3 + ci) * 9 + ih) * 8 + iw;
                                size_t wi = ((size_t)(co * 3 + ci) * 3 + i) * 2 + j;
                                acc += (double)x[xi] * w[wi];
                                rdx[xi] += (double)dy[yi] * w[wi];
                                rdw[wi] += (double)dy[yi] * x[xi];
                            }
                    ry[yi] = acc;
                }
    size_t ws_bytes = mdl_conv2d_workspace_size(&s);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    st = mdl_conv2d_forward(&s, x, w, bias, y, ws, ws_bytes);
    EXPECT(st == MDL_OK, "[%s] conv forward: %s", level, mdl_last_error());
    EXPECT(max_rel_err(y, ry, ny) < 1e-5, "[%s] conv forward error %g", level, max_rel_err(y, ry, ny));
    /* the convolution and its pooling in one call: the two calls' values, bit for bit */
    const mdl_pool2d_shape ps = {.n = 2, .c = 5, .h = ho, .w = wo, .kh = 2, .kw = 3,
                                 .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1,
                                 .ceil_mode = 1};
    int64_t pho = 0, pwo = 0;
    mdl_pool2d_output_size(&ps, &pho, &pwo);
    const size_t np_ = (size_t)(2 * 5 * pho * pwo);
    float *py = malloc(np_ * sizeof *py), *py2 = malloc(np_ * sizeof *py2);
    mdl_max_pool2d_forward(&ps, y, py2);
    size_t pws_bytes = mdl_conv2d_pooled_workspace_size(&s, &ps);
    void *pws = malloc(pws_bytes ? pws_bytes : 1);
    st = mdl_conv2d_forward_pooled(&s, x, w, bias, 0, &ps, MDL_POOL_MAX, 0, py, pws, pws_bytes);
    EXPECT(st == MDL_OK && memcmp(py, py2, np_ * sizeof *py) == 0, "[%s] conv pooled: %s", level,
           st == MDL_OK ? "values differ" : mdl_last_error());
    free(pws); free(py); free(py2);
    st = mdl_conv2d_backward_data(&s, dy, w, dx, ws, ws_bytes);
    EXPECT(st == MDL_OK, "[%s] conv backward data: %s", level, mdl_last_error());
    EXPECT(max_rel_err(dx, rdx, nx) < 1e-5, "[%s] conv dx error %g", level, max_rel_err(dx, rdx, nx));
    st = mdl_conv2d_backward_weights(&s, x, dy, dw, 0, NULL, 0); /* NULL: the call allocates */
    EXPECT(st == MDL_OK, "[%s] conv backward weights: %s", level, mdl_last_error());
    EXPECT(max_rel_err(dw, rdw, nw) < 1e-5, "[%s] conv dw error %g", level, max_rel_err(dw, rdw, nw));
    /* again in the workspace that call left, then with none kept: the same values */
    float *dw3 = malloc(nw * sizeof *dw3);
    for (int round = 0; round < 3; round++) {
        mdl_set_keep_workspace(round < 2);
        st = mdl_conv2d_backward_weights(&s, x, dy, dw3, 0, NULL, 0);
        EXPECT(st == MDL_OK && memcmp(dw, dw3, nw * sizeof *dw) == 0, "[%s] conv dw again: %s",
               level, st == MDL_OK ? "values differ" : mdl_last_error());
    }
    free(dw3);
    mdl_set_keep_workspace(1);
    EXPECT(mdl_get_keep_workspace() == 1, "[%s] mdl_get_keep_workspace", level);
    /* both gradients in one call: the two calls' values, bit for bit */
    float *dx2 = malloc(nx * sizeof *dx2), *dw2 = malloc(nw * sizeof *dw2);
    st = mdl_conv2d_backward(&s, x, NULL, dy, w, dx2, 0, dw2, 0, ws, ws_bytes);
    EXPECT(st == MDL_OK && memcmp(dx, dx2, nx * sizeof *dx) == 0 &&
           memcmp(dw, dw2, nw * sizeof *dw) == 0, "[%s] conv backward, both: %s", level,
           st == MDL_OK ? "values differ" : mdl_last_error());
    free(dx2); free(dw2);
    st = mdl_conv2d_backward_bias(&s, dy, db, 0);
    EXPECT(st == MDL_OK, "[%s] conv backward bias: %s", level, mdl_last_error());
    EXPECT(max_rel_err(db, rdb, 5) < 1e-5, "[%s] conv db error %g", level, max_rel_err(db, rdb, 5));
    free(ws); free(x); free(w); free(bias); free(y); free(dy); free(dx); free(dw); free(db);
    free(ry); free(rdx); free(rdw); free(rdb);
}

/* Max pooling with taps: the same maxima as mdl_max_pool2d_forward, and from the taps
 * the same dx as mdl_max_pool2d_backward, with a ReLU after the pool too; the average
 * pool's backward with a ReLU's mask; a tap outside its window is an error. */
static void test_pool_taps(const char *level)
{
    const mdl_pool2d_shape s = {.n = 2, .c = 3, .h = 9, .w = 20, .kh = 3, .kw = 3, .stride_h = 2,
                                .stride_w = 2, .pad_h = 1, .pad_w = 1, .ceil_mode = 1};
    int64_t ho = 0, wo = 0;
    mdl_pool2d_output_size(&s, &ho, &wo);
    const size_t nx = 2 * 3 * 9 * 20, ny = (size_t)(2 * 3 * ho * wo);
    float *x = malloc(nx * sizeof *x), *y = malloc(ny * sizeof *y), *y2 = malloc(ny * sizeof *y2);
    float *dy = malloc(ny * sizeof *dy), *dx = malloc(nx * sizeof *dx), *dx2 = malloc(nx * sizeof *dx2);
    uint8_t *tap = malloc(ny);
    unsigned seed = 7;
    for (size_t i = 0; i < nx; i++) x[i] = frand(&seed);
    for (size_t i = 0; i < ny; i++) dy[i] = frand(&seed);
    mdl_status st = mdl_max_pool2d_forward_argmax(&s, x, NULL, y, tap);
    EXPECT(st == MDL_OK, "[%s] max pool taps: %s", level, mdl_last_error());
    mdl_max_pool2d_forward(&s, x, y2);
    EXPECT(memcmp(y, y2, ny * sizeof *y) == 0, "[%s] max pool taps: maxima differ", level);
    st = mdl_max_pool2d_backward_argmax(&s, tap, dy, dx);
    EXPECT(st == MDL_OK, "[%s] max pool backward from taps: %s", level, mdl_last_error());
    mdl_max_pool2d_backward(&s, x, dy, dx2);
    EXPECT(memcmp(dx, dx2, nx * sizeof *dx) == 0, "[%s] max pool taps: dx differs", level);
    /* with the ReLU after the pool: y = max(y, 0), and no gradient where y is 0 */
    for (size_t i = 0; i < nx; i++) x[i] -= 0.8f;
    st = mdl_max_pool2d_forward_argmax_relu(&s, x, NULL, y, tap);
    EXPECT(st == MDL_OK, "[%s] max pool taps with relu: %s", level, mdl_last_error());
    mdl_max_pool2d_forward(&s, x, y2);
    size_t none = 0;
    for (size_t i = 0; i < ny; i++) {
        EXPECT(y[i] == (y2[i] < 0.0f ? 0.0f : y2[i]), "[%s] relu taps: y[%zu]", level, i);
        EXPECT((tap[i] == MDL_POOL_NO_TAP) == !(y2[i] > 0.0f), "[%s] relu taps: tap[%zu]",
               level, i);
        none += tap[i] == MDL_POOL_NO_TAP;
        dy[i] = y[i] > 0.0f ? dy[i] : 0.0f; /* the ReLU's backward, for the reference */
    }
    EXPECT(none > 0 && none < ny, "[%s] relu taps: %zu of %zu outputs without a tap", level,
           none, ny);
    st = mdl_max_pool2d_backward_argmax(&s, tap, dy, dx);
    EXPECT(st == MDL_OK, "[%s] backward from relu taps: %s", level, mdl_last_error());
    mdl_max_pool2d_backward(&s, x, dy, dx2);
    EXPECT(memcmp(dx, dx2, nx * sizeof *dx) == 0, "[%s] relu taps: dx differs", level);
    /* the average pool's backward with the mask of a ReLU before it (x its output) */
    for (size_t i = 0; i < nx; i++) x[i] = x[i] < 0.0f ? 0.0f : x[i];
    st = mdl_avg_pool2d_backward_relu(&s, x, dy, dx);
    EXPECT(st == MDL_OK, "[%s] avg pool backward with relu: %s", level, mdl_last_error());
    mdl_avg_pool2d_backward(&s, dy, dx2);
    for (size_t i = 0; i < nx; i++)
        EXPECT(dx[i] == (x[i] > 0.0f ? dx2[i] : 0.0f), "[%s] avg pool relu: dx[%zu]", level, i);
    tap[0] = 0; /* the first window's top-left tap lies in the padding */
    st = mdl_max_pool2d_backward_argmax(&s, tap, dy, dx);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "outside its window"),
           "[%s] tap in the padding: '%s'", level, mdl_last_error());
    free(x); free(y); free(y2); free(dy); free(dx); free(dx2); free(tap);
}

/* the loss and its gradient with dlogits == logits equal those with separate arrays */
static void test_xent_in_place(const char *level)
{
    enum { N = 5, CL = 11 };
    float z[N * CL], d[N * CL], loss, loss_in_place;
    int64_t labels[N] = {0, 10, 3, 7, 3};
    unsigned s = 3;
    for (int i = 0; i < N * CL; i++) z[i] = 4.0f * frand(&s);
    mdl_status st = mdl_softmax_cross_entropy(N, CL, z, labels, &loss, d);
    EXPECT(st == MDL_OK, "[%s] softmax_cross_entropy: %s", level, mdl_last_error());
    st = mdl_softmax_cross_entropy(N, CL, z, labels, &loss_in_place, z);
    EXPECT(st == MDL_OK && loss_in_place == loss && memcmp(z, d, sizeof d) == 0,
           "[%s] softmax_cross_entropy in place: loss %g against %g", level,
           (double)loss_in_place, (double)loss);
}

static void test_errors(void)
{
    float a[4] = {0}, c[4];
    mdl_status st = mdl_sgemm(0, 0, 2, 2, 2, 1.0f, a, 1, a, 2, 0.0f, c, 2, NULL, 0);
    EXPECT(st == MDL_ERR_ARG, "lda too small: status %d", (int)st);
    EXPECT(strstr(mdl_last_error(), "lda") != NULL, "message names lda: '%s'", mdl_last_error());
    st = mdl_sgemm(0, 0, 2, 2, 2, 1.0f, NULL, 2, a, 2, 0.0f, c, 2, NULL, 0);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "NULL"), "NULL a: '%s'", mdl_last_error());
    st = mdl_sgemm(0, 0, 2, 2, 2, 0.0f, NULL, 2, NULL, 2, 0.0f, c, 2, NULL, 0);
    EXPECT(st == MDL_OK && c[0] == 0.0f && c[3] == 0.0f, "alpha 0 reads neither A nor B: '%s'",
           mdl_last_error());
    const mdl_conv2d_shape bad = {.n = 1, .c_in = 1, .h = 4, .w = 4, .c_out = 1, .kh = 3, .kw = 3,
                                  .stride_h = 0, .stride_w = 1};
    int64_t ho, wo;
    st = mdl_conv2d_output_size(&bad, &ho, &wo);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "stride"), "stride 0: '%s'", mdl_last_error());
    char small_ws[8];
    const mdl_conv2d_shape ok = {.n = 1, .c_in = 2, .h = 6, .w = 6, .c_out = 2, .kh = 3, .kw = 3,
                                 .stride_h = 1, .stride_w = 1};
    float x[72], w[36], y[32];
    memset(x, 0, sizeof x);
    memset(w, 0, sizeof w);
    if (mdl_conv2d_workspace_size(&ok) > sizeof small_ws) {
        st = mdl_conv2d_forward(&ok, x, w, NULL, y, small_ws, sizeof small_ws);
        EXPECT(st == MDL_ERR_WORKSPACE, "small workspace: status %d", (int)st);
    }
    st = mdl_conv2d_forward(&ok, NULL, w, NULL, y, NULL, 0);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "mdl_conv2d_forward: x must not be NULL"),
           "NULL x: '%s'", mdl_last_error());
    /* sizes whose products overflow, or that no memory holds, are errors, not wrapped */
    const int64_t big = (int64_t)1 << 40, huge = INT64_MAX;
    EXPECT(mdl_sgemm_workspace_size(1, (int64_t)1 << 62, 8) == SIZE_MAX, "sgemm workspace of 2^65");
    st = mdl_sgemm(0, 0, 2, huge, 2, 1.0f, a, 2, a, huge, 0.0f, c, huge, NULL, 0);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "shape too large"), "sgemm n = 2^63 - 1: '%s'",
           mdl_last_error());
    st = mdl_sgemm(0, 0, 2, 2, 2, 1.0f, a, (int64_t)1 << 60, a, 2, 0.0f, c, 2, NULL, 0);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "shape too large"), "sgemm lda = 2^60: '%s'",
           mdl_last_error());
    st = mdl_linear_forward((int64_t)1 << 61, 1, 4, a, a, a, c, NULL, 0); /* bias: filled first */
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "mdl_linear_forward: shape too large"),
           "linear n = 2^61: '%s'", mdl_last_error());
    st = mdl_affine_add(big, big, 1, a, NULL, NULL, NULL, 0, c);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "overflows"), "affine_add 2^80: '%s'",
           mdl_last_error());
    const mdl_pool2d_shape wide = {.n = 2147483647, .c = 2147483647, .h = 2147483647,
                                   .w = 2147483647, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
    st = mdl_pool2d_output_size(&wide, &ho, &wo);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "shape too large"), "pool 2^124: '%s'",
           mdl_last_error());
    const double sums[1] = {1.0};
    float one[1] = {1.0f}, out[4];
    st = mdl_batch_norm_stats(1, 2, sums, sums, one, one, INFINITY, 0.1f, NULL, NULL, out,
                              out + 1, out + 2, out + 3);
    EXPECT(st == MDL_ERR_ARG && strstr(mdl_last_error(), "finite eps"), "eps inf: '%s'",
           mdl_last_error());
    EXPECT(strcmp(mdl_status_string(MDL_OK), "ok") == 0, "status string");
    EXPECT(mdl_set_simd((mdl_simd)7) == MDL_ERR_ARG, "bad simd level");
    EXPECT(mdl_set_num_threads(-1) == MDL_ERR_ARG, "negative thread count");
    EXPECT(mdl_set_num_threads(4097) == MDL_ERR_ARG, "thread count over 4096");
    EXPECT(mdl_set_sgemm_b((mdl_sgemm_b)3) == MDL_ERR_ARG, "bad sgemm b mode");
    EXPECT(mdl_set_sgemm_b(MDL_SGEMM_B_AUTO) == MDL_OK, "sgemm b auto");
    EXPECT(mdl_set_winograd_sums((mdl_winograd_sums)3) == MDL_ERR_ARG, "bad winograd sums mode");
    EXPECT(mdl_set_winograd_sums(MDL_WINOGRAD_SUMS_AUTO) == MDL_OK, "winograd sums auto");
}

int main(void)
{
    const char *names[] = {"scalar", "avx2", "avx512"};
    printf("minidl %s, cpu simd %s, %d threads\n", mdl_version(), names[mdl_cpu_simd()],
           mdl_get_num_threads());
    for (int level = MDL_SIMD_SCALAR; level <= (int)mdl_cpu_simd(); level++) {
        if (mdl_set_simd((mdl_simd)level) != MDL_OK) return 2;
        test_gemm(names[level]);
        test_conv(names[level]);
        test_pool_taps(names[level]);
        test_xent_in_place(names[level]);
    }
    test_errors();
    printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
