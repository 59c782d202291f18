/* conv.c -- 2-D convolution (cross-correlation, NCHW, zero padding), forward
 * and the three gradients.
 *
 * Two versions, chosen at run time:
 *  - the scalar reference: direct loops over the definition, the test
 *    oracle and the portable fallback;
 *  - the fast path (AVX2 selected), one image at a time: the threads take whole
 *    images, and each image is one GEMM against weights packed once per call
 *    (an implicit GEMM).  With output rows a multiple of 16 wide (or 8 wide, in
 *    pairs) the micro-kernel reads B's rows in place from the image's phase
 *    planes (a zero-padded copy, split by the stride so that the pixels a tap
 *    reads for an output row are contiguous), in tiles of 8 channels x 48 pixels
 *    where the CPU has AVX-512F (6 x 16 with AVX2); otherwise the image's column
 *    matrix (K, P) is built in a per-thread buffer (none for a 1x1 kernel with
 *    stride 1 and no padding; images under GROUP_COLUMNS pixels go several to a
 *    GEMM, their column matrices side by side); small images with stride 1 go
 *    16 at a time with the batch innermost, over the taps inside the image only
 *    (batched_path), where the CPU has AVX-512F.  Winograd (winograd_avx512.c,
 *    winograd8_avx2.c, winograd_avx2.c) replaces the GEMM where use_winograd says.
 *    Forward: y[b] = W @ col(x[b]), with bias and ReLU applied by the GEMM's
 *    epilogue while each tile is in registers, and the channel sums taken by it
 *    or, on the in-place path, from each image's output while it is in the cache.
 *    The fused forward and weight gradient read x through a per-channel map
 *    (mdl_affine: a BatchNorm's normalisation and ReLU) as they copy each image
 *    into its phase planes, or into a per-thread copy of the image on the other
 *    paths.  Backward-data with
 *    stride 1 is the forward convolution of dy with the flipped, transposed
 *    weights; with a stride, one GEMM per phase of the input pixels with dy read
 *    in place (data_phases_of), where the phases' rows allow; otherwise (or with
 *    very few input channels) col = W^T @ dy for a chunk of B images side by side
 *    (N = B * P, B chosen so the chunk's buffers stay near CHUNK_FLOATS), then
 *    col2im.  Backward-weights: each thread adds
 *    dy[b] @ col(x[b])^T over its images into its own partial dw (with rows a
 *    multiple of 8 wide, as dot products over the phase planes; by Winograd where
 *    the forward takes winograd_avx512.c or winograd8_avx2.c); the partials are added
 *    in thread order.  Outputs of at most 16 pixels on the batched path's shapes go
 *    by taps instead (batch_weights): one SGEMM per tap over the whole batch.  With
 *    many channels, Winograd's sums over the input channels (forward, data gradient)
 *    or over the tiles (weight gradient) are SGEMMs, one per transform point, over
 *    the tiles of a chunk of images (winograd_sums, weights_winograd_sums).
 * Shapes below: K = c_in * kh * kw, P = h_out * w_out.
 * dx, dw and db are overwritten (accumulate 0) or added to (1). */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "conv.h"
#include "checks.h"
#include "gemm.h"
#include "pool.h"

/* ---- shape checks and workspace layout -------------------------------------------- */

/* the shape check: mdl_conv2d_check_shape in checks.h */
#define CHUNK_FLOATS (2 << 20)            /* target size of a chunk's column + output buffers */
#define DIRECT_DATA_MIN_C_IN 8            /* see transposed_shape */
/* MDL_CONV_AUTO, where neither channel Winograd applies: winograd_avx2.c's F(2x2, 3x3)
 * from this many input and output channels and output rows at least this wide
 * (measured in bench/NOTES.md: below, its transforms cost more than the
 * multiplications it saves; its F(2x2, 5x5) never won) */
#define WINOGRAD_MIN_C 64
#define WINOGRAD_MIN_WO 16
/* MDL_CONV_AUTO: Winograd for a call of at least this many 4x4 output tiles (all its
 * images'): transforming the weights (and the weight gradient back) costs the same
 * for one image as for a batch, and with few tiles the GEMM's products are cheaper
 * (AMD Zen 3, AVX2, 2 threads, against the GEMM: 512 -> 512 at 4x4, forward, 1 tile
 * 5.4x the GEMM's time, 8 tiles 1.9x, 16 tiles 1.01x, 32 0.63x; 128 -> 128 at 8x8,
 * 4 tiles 1.26x, 16 tiles 0.91x; 64 -> 64, 4 tiles 1.32x).  The weight gradient of more
 * than 256 x 256 channels, whose partial sums in double (36 c_in c_out of them) leave
 * the cache, from more (512 -> 512: 32 tiles 1.30x, 64 tiles 0.90x; 256 -> 256: 8 tiles
 * 0.89x, 16 tiles 0.67x) (bench/NOTES.md) */
#define WINOGRAD_MIN_TILES 16
#define WINOGRAD_GRAD_BIG_CC (256 * 256)
#define WINOGRAD_GRAD_BIG_MIN_TILES 64
/* winograd_avx512.c and winograd8_avx2.c, which sum over the channels (or the weight
 * gradient's tiles) in registers per chunk of a few tiles, up to c_in * c_out = 128 *
 * 256 for the forward and the data gradient, 256 * 256 for them with outputs at least
 * WINOGRAD_WIDE_MIN_WO wide, and 128 * 128 for the weight gradient: beyond, the
 * transformed weights (36 c_in c_out floats for 3x3, 9 MiB at 256 * 256), or the threads'
 * partial dU in double, no longer stay in the cache, and the same transforms go
 * around one SGEMM per transform point over the tiles of up to WINO_SUMS_BYTES of V
 * and M (winograd_sums, weights_winograd_sums).  Measured (bench/NOTES.md): the sums
 * by SGEMMs against the batched GEMM at 4x4, 512 -> 512, 1.45-1.7x in all three
 * directions; against the GEMM or the dot products, 256 -> 256 at 8x8 dw 2.8-3.0x; and
 * against the register sums at 8x8, 256 -> 256 0.92-0.96x and 128 -> 256 0.6-0.8x (so
 * the limits stay), at 16x16, 256 -> 256 1.06-1.15x; 128 x 128 dw 0.93x.  Those are AMD's
 * Zen 4, whose L3 feeds a core fast.  On an Intel Xeon (2 MiB of L2 a core, about 26
 * GB/s from L3 over its mesh) the forward and data gradient stream U from L3 too slowly:
 * on Intel's CPUs with AVX-512 (the Xeons since Skylake; the desktop ones without it
 * reach their L3 over a ring, likely faster for a core, and keep Zen 4's limits,
 * unmeasured) they sum in registers while U fits in WINOGRAD_INTEL_L2_EIGHTHS / 8 of
 * the L2, the sums by SGEMMs measuring 0.86x at 64 x 128 channels (U 1.1 MiB), even at
 * 96 x 96 (1.3 MiB), 1.15x at 96 x 128 (1.7 MiB), 1.2-1.5x at 128 x 128, 2.6-3.4x at
 * 256 x 256 (8x8 and 16x16; 5x5 the same by U's size); its weight gradient keeps the
 * limit above. */
#define WINOGRAD_CHANNELS_MAX_CC (128 * 256)
#define WINOGRAD_CHANNELS_WIDE_MAX_CC (256 * 256)
#define WINOGRAD_WIDE_MIN_WO 8
#define WINOGRAD_CHANNELS_GRAD_MAX_CC (128 * 128)
#define WINOGRAD_INTEL_L2_EIGHTHS 5
/* AMD's Zen 5 (family 1Ah; 512-bit FMAs at full width, 1 MiB of L2 a core) keeps the
 * limits of Zen 4 but the wider one: 256 x 256 channels at 8x8 by the SGEMMs measured
 * 1.48-1.57x the register sums forward and 1.25-1.40x backward, where 128 x 256 (U 4.5
 * MiB) measured 0.95x and 0.92x, so a limit by U's size (Intel's) fits it less well
 * (bench/NOTES.md). */
#define WINOGRAD_AMD_NOT_WIDE_FAMILY 0x1a
#define WINO_SUMS_BYTES (16 << 20) /* 32 MiB measured 0-5% faster at 512 x 512 channels */
/* At the AVX-512 level, channels in multiples of 8 but not of 16 take winograd8_avx2.c
 * (AVX2 vectors) for the weight gradient (1.1-2.1x the GEMM), and for the forward and the
 * data gradient from WINOGRAD8_MIN_CC channel pairs, or 16 input channels, up to
 * WINOGRAD8_MAX_CC (1.1-2.4x): with one vector of input channels and fewer outputs (8 -> 8,
 * 8 -> 24) 0.78-0.98x, and from 120 x 120 at 16x16 0.81-0.84x (bench/NOTES.md) */
#define WINOGRAD8_MIN_CC 256
#define WINOGRAD8_MAX_CC (64 * 128)

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }
/* floats rounded up to a multiple of 16 (64 bytes) */
#define FLOATS(n) (((size_t)(n) + 15) & ~(size_t)15)

static int conv_algo = -1; /* -1: not yet read from MINIDL_CONV */
static int sums_mode = MDL_WINOGRAD_SUMS_AUTO; /* mdl_set_winograd_sums */

mdl_status mdl_set_conv_algo(mdl_conv_algo algo)
{
    if (algo != MDL_CONV_AUTO && algo != MDL_CONV_GEMM && algo != MDL_CONV_WINOGRAD)
        return mdl_error(MDL_ERR_ARG, "mdl_set_conv_algo: unknown algorithm %d", (int)algo);
    __atomic_store_n(&conv_algo, (int)algo, __ATOMIC_RELAXED);
    return MDL_OK;
}

mdl_status mdl_set_winograd_sums(mdl_winograd_sums mode)
{
    if (mode != MDL_WINOGRAD_SUMS_AUTO && mode != MDL_WINOGRAD_SUMS_REGISTERS &&
        mode != MDL_WINOGRAD_SUMS_SGEMM)
        return mdl_error(MDL_ERR_ARG, "mdl_set_winograd_sums: unknown mode %d", (int)mode);
    __atomic_store_n(&sums_mode, (int)mode, __ATOMIC_RELAXED);
    return MDL_OK;
}

mdl_conv_algo mdl_get_conv_algo(void)
{
    int a = __atomic_load_n(&conv_algo, __ATOMIC_RELAXED);
    if (a < 0) {
        const char *env = getenv("MINIDL_CONV");
        a = !env ? MDL_CONV_AUTO : strcmp(env, "gemm") == 0 ? MDL_CONV_GEMM
            : strcmp(env, "winograd") == 0 ? MDL_CONV_WINOGRAD : MDL_CONV_AUTO;
        __atomic_store_n(&conv_algo, a, __ATOMIC_RELAXED);
    }
    return (mdl_conv_algo)a;
}

/* Winograd's scratch for shape s, for either version that applies on this CPU (0 where
 * none does; their files are compiled for AVX2 and AVX-512, so nothing of them runs on a
 * CPU without), and whether to use it */
#if MDL_X86
static int winograd_cpu(mdl_simd level) { return mdl_cpu_simd() >= level; }
#endif

static size_t winograd_fixed(const mdl_conv2d_shape *s)
{
    size_t f = 0;
#if MDL_X86
    if (winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd_applies(s)) f = mdl_winograd_fixed_floats(s);
    if (winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s))
        f = max_size(f, mdl_winograd8_fixed_floats(s));
    if (winograd_cpu(MDL_SIMD_AVX512) && mdl_winograd_avx512_applies(s))
        f = max_size(f, mdl_winograd_avx512_fixed_floats(s));
#endif
    (void)s;
    return f;
}

static size_t winograd_thread(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    size_t f = 0;
#if MDL_X86
    if (winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd_applies(s))
        f = mdl_winograd_thread_floats(s, ho, wo);
    if (winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s))
        f = max_size(f, mdl_winograd8_thread_floats(s, ho, wo));
    if (winograd_cpu(MDL_SIMD_AVX512) && mdl_winograd_avx512_applies(s))
        f = max_size(f, mdl_winograd_avx512_thread_floats(s, ho, wo));
#endif
    (void)s, (void)ho, (void)wo;
    return f;
}

/* The shared part of the per-image path for shape s (K = c_in * kh * kw): the
 * packed weights (for the GEMM or for Winograd), then the row offsets of B read in
 * place (int64, padded_offsets) */
static size_t weights_floats(const mdl_conv2d_shape *s, int64_t K)
{
    return max_size(max_size(FLOATS(mdl_sgemm_avx2_packed_a_floats(s->c_out, K)),
                             FLOATS(mdl_sgemm_avx512_rows_a_floats(s->c_out, K))),
                    winograd_fixed(s));
}
#define TABLE_FLOATS(K) FLOATS(2 * (size_t)(K))

/* Output rows a multiple of 16 wide, or 8 wide in pairs: the GEMM reads B's 16-pixel
 * rows in place from the image's phase planes (no column matrix, no packing); not for
 * a pointwise kernel, whose column matrix is the image itself */
static int rows_in_place(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    const int pointwise = s->kh == 1 && s->kw == 1 && s->stride_h == 1 && s->stride_w == 1 &&
                          s->pad_h == 0 && s->pad_w == 0;
    return !pointwise && (wo % 16 == 0 || (wo == 8 && ho % 2 == 0));
}

/* The phase planes of an image (phase_image): with strides (sh, sw), plane (r, q)
 * holds the zero-padded image's pixels (sh * y + r, sw * x + q), so that the pixels a
 * kernel tap reads for one output row are contiguous.  Only the planes some tap reads
 * exist (r < min(sh, kh), q < min(sw, kw)); with stride 1 the one plane is the padded
 * image. */
typedef struct phases {
    int64_t nr, nq;      /* planes: nr x nq */
    int64_t rows, cols;  /* of a plane: ceil(padded size / stride) */
} phases;

static phases phases_of(const mdl_conv2d_shape *s)
{
    phases f;
    f.nr = s->stride_h < s->kh ? s->stride_h : s->kh;
    f.nq = s->stride_w < s->kw ? s->stride_w : s->kw;
    f.rows = (s->h + 2 * s->pad_h + s->stride_h - 1) / s->stride_h;
    f.cols = (s->w + 2 * s->pad_w + s->stride_w - 1) / s->stride_w;
    return f;
}
/* floats of the phase planes of one image */
static size_t phase_floats(const mdl_conv2d_shape *s)
{
    const phases f = phases_of(s);
    return FLOATS(s->c_in * f.nr * f.nq * f.rows * f.cols);
}

/* the weight gradient as dot products over phase planes (mdl_conv_weights_dot_avx2),
 * of enough images at a time that the accumulators sum about 512 pixels */
#define DOT_IMAGES(P) ((P) >= 512 ? 1 : (512 + (P) - 1) / (P))
/* the im2col paths (forward and weight gradient) of small images: enough images side by
 * side in one column matrix that the GEMM has about GROUP_COLUMNS columns (one image
 * of 2x2 or 4x4 gave the GEMM 4 or 16, and the weight gradient a pass over its whole
 * partial dw per image); not for a pointwise kernel, which reads the image in place */
#define GROUP_COLUMNS 32
/* A 1x1 kernel (stride 1, no padding) reads each image in place as its own column
 * matrix, one product per image; with fewer output pixels than this, such products
 * are a few columns wide and the images' copies side by side in groups pay (AMD Zen 3,
 * 2 threads, batch 64-128, forward, data and weight gradients: 256 -> 256 at 1x1
 * 1.9-2.2x, 512 -> 512 at 2x2 3.0x, 128 -> 128 at 2x2 1.3-1.7x; at 4x4 0.5-0.8x) */
#define POINTWISE_MIN_P 8
/* per_image's split of an image's output rows among the threads, from this many
 * micro-panels of rows a thread */
#define SPLIT_ROWS_MIN_PANELS 4
static int64_t im2col_group(int64_t P, int pointwise)
{
    return pointwise || P >= GROUP_COLUMNS ? 1 : (GROUP_COLUMNS + P - 1) / P;
}
/* The weight gradient's groups: where the partial dw, which each group's product reads
 * and writes whole, is large (from WEIGHTS_GROUP_MIN_FLOATS), WEIGHTS_GROUP_COLUMNS
 * columns (512 -> 512 channels at 4x4: 1.05x against 32, 64 no better) */
#define WEIGHTS_GROUP_COLUMNS 128
#define WEIGHTS_GROUP_MIN_FLOATS (256 * 1024)
/* The weight gradient's split among the threads (weights_per_image): by dw's columns,
 * in whole units of WEIGHTS_COLUMN_UNIT (a multiple of the AVX2 dot kernel's 3 rows and
 * of the SGEMM's 16-column panels), up to WEIGHTS_COLUMNS_MAX_IMAGES images a thread;
 * by images, each thread into a partial dw, with more.  AMD Zen 3, 2 threads, 3x3
 * kernels, columns against images: 512 -> 512 at 4x4, 2-8 images 1.5-2.7x, 16 images
 * 0.89x; 128 -> 128 at 8x8 1.5x at 2 images, even at 8-16; resnet20's strided layers
 * at 128 images 0.54-0.89x. */
#define WEIGHTS_COLUMN_UNIT 48
#define WEIGHTS_COLUMNS_MAX_IMAGES 4
static int64_t weights_group(const mdl_conv2d_shape *s, int64_t P, int pointwise)
{
    const int64_t group = im2col_group(P, pointwise);
    if (group == 1 || s->c_out * s->c_in * s->kh * s->kw < WEIGHTS_GROUP_MIN_FLOATS) return group;
    return (WEIGHTS_GROUP_COLUMNS + P - 1) / P;
}
/* The weight gradient's dot products need DOT_MIN_PIXELS output pixels in the call:
 * with fewer (one or two 8x8 images) each is a few vectors long, its horizontal sum as
 * costly, and the GEMM over the column matrix is faster (AMD Zen 3, 2 threads, 3x3,
 * 256 and 512 channels: one 8x8 image 1.7x, two 1.3-1.4x, four 1.0-1.15x). */
#define DOT_MIN_PIXELS 256
static int weights_dot(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    return wo % 8 == 0 && (s->kh > 1 || s->kw > 1) && s->n * ho * wo >= DOT_MIN_PIXELS;
}

/* Tiny images that every output pixel's window covers whole, with fewer pixels than the
 * kernel has taps (2x2 under 3x3 with padding 1: five of the column matrix's nine rows
 * per pixel are padding), are convolved as one SGEMM over the batch with the weights
 * spread into the dense (c_out ho wo) x (c_in h w) matrix of the linear map from an
 * image to its output (dense_weights): y (n, c_out ho wo) = x (n, c_in h w) @ W^T,
 * dx = dy @ W, and dw gathered from dy^T @ x.  An output pixel then costs c_in h w
 * multiply-adds instead of c_in kh kw, and the products run on the whole batch, the
 * weights read once, instead of a few images at a time against weights streamed from
 * memory for each group (512 -> 512 channels at 2x2, batch 128: 84 GFLOP/s forward).
 * Every entry of W is a weight (no entry is a structural zero that would turn an
 * infinite input into NaN where the convolution does not read it).  From
 * DENSE_MIN_IMAGES images: with fewer, spreading the weights costs more than it saves.
 * Not under MDL_CONV_WINOGRAD, which asks for Winograd where it applies. */
#define DENSE_MIN_IMAGES 16
#define DENSE_MAX_FLOATS ((int64_t)1 << 24)
static int dense_path(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    /* the window of output (0, 0) reaches the last pixel, the last output's the first */
    const int covered = s->h + s->pad_h <= s->kh && (ho - 1) * s->stride_h <= s->pad_h &&
                        s->w + s->pad_w <= s->kw && (wo - 1) * s->stride_w <= s->pad_w;
    const int64_t rows = s->c_out * ho * wo, cols = s->c_in * s->h * s->w;
    return covered && s->h * s->w < s->kh * s->kw && s->n >= DENSE_MIN_IMAGES &&
           rows <= DENSE_MAX_FLOATS / cols;
}

/* Small images, stride 1, where the CPU has AVX-512F (batched_path): BATCH_IMAGES
 * images at a time with the batch innermost (batch_planes: (c_in, h, w, BATCH_IMAGES)),
 * so that the product's columns are output pixels x images; the output pixels go in
 * classes whose windows hold the same taps inside the image (the image's corners,
 * edges and middle under 3x3), one product per class over those taps only
 * (mdl_sgemm_avx512_packed_image_sel).  The padding's taps are skipped (at 4x4 under
 * 3x3, 44 of the 144 of an image's column matrix; at 8x8, 92 of 576), and the weights
 * stream from memory once per 16 images instead of once per image or two.  Forward
 * and data gradient, batch 128, 2 threads, against the per-image paths: 512 -> 512 at
 * 4x4 1.59x / 1.58x, 256 -> 256 at 8x8 1.19x / 1.22x, 16 -> 16 at 4x4 3.9x, at 8x8 even;
 * 8 -> 16 at 8x8 0.86x, hence BATCH_MIN_WEIGHTS.  32 images at a time: 0.96x.  Winograd,
 * where it applies, is faster still and is taken first. */
#define BATCH_IMAGES 16
#define BATCH_MAX_P 64
#define BATCH_MIN_WEIGHTS (16 * 16 * 9)
/* the weight gradient by taps (batch_weights) for outputs of at most 16 pixels: at 8x8
 * its SGEMMs are one row of the output (7 or 8 pixels) long and 0.88-1.09x */
#define BATCH_W_MAX_P 16
static int batched_path(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    return s->stride_h == 1 && s->stride_w == 1 && s->pad_h < s->kh && s->pad_w < s->kw &&
           (s->kh > 1 || s->kw > 1) && ho * wo <= BATCH_MAX_P && s->n >= BATCH_IMAGES &&
           s->c_out * s->c_in * s->kh * s->kw >= BATCH_MIN_WEIGHTS;
}

/* The output pixels whose window holds tap (i, j) inside the image (stride 1): rows
 * [r[0], r[1]) x columns [r[2], r[3]), in *runs runs of contiguous columns in the batch
 * planes (one when they and the input pixels under the tap are whole rows, else one
 * per row); returns the pixels of a run (0: no output holds the tap) */
static int64_t tap_rect(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t i, int64_t j,
                        int64_t r[4], int64_t *runs)
{
    r[0] = s->pad_h > i ? s->pad_h - i : 0;
    r[1] = s->h + s->pad_h - i < ho ? s->h + s->pad_h - i : ho;
    r[2] = s->pad_w > j ? s->pad_w - j : 0;
    r[3] = s->w + s->pad_w - j < wo ? s->w + s->pad_w - j : wo;
    if (r[0] >= r[1] || r[2] >= r[3]) return *runs = 0;
    const int whole = r[3] - r[2] == wo && wo == s->w;
    *runs = whole ? 1 : r[1] - r[0];
    return whole ? (r[1] - r[0]) * wo : r[3] - r[2];
}

/* Images per chunk of the weight gradient by taps, and its workspace: the chunk's x and
 * dy with the batch innermost, the tap-major dw (kh kw, c_out, c_in), and the largest of
 * its SGEMMs' workspaces */
static int64_t batch_w_images(const mdl_conv2d_shape *s, int64_t P)
{
    const int64_t per = s->c_in * s->h * s->w + s->c_out * P, nb = CHUNK_FLOATS / per;
    return nb < 1 ? 1 : nb > s->n ? s->n : nb;
}
static size_t batch_w_bytes(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    const int64_t nb = batch_w_images(s, ho * wo);
    size_t gemm = 0;
    int64_t r[4], runs;
    /* a whole chunk's SGEMMs and the last, shorter one's (the size is not monotonic) */
    for (int64_t c = nb, pass = 0; pass < 2; pass++, c = s->n % nb ? s->n % nb : nb)
        for (int64_t i = 0; i < s->kh; i++)
            for (int64_t j = 0; j < s->kw; j++) {
                const int64_t len = tap_rect(s, ho, wo, i, j, r, &runs) * c;
                if (len) gemm = max_size(gemm, mdl_sgemm_workspace_size(s->c_out, s->c_in, len));
            }
    return (FLOATS(s->c_in * s->h * s->w * nb) + FLOATS(s->c_out * ho * wo * nb) +
            FLOATS(s->c_out * s->c_in * s->kh * s->kw)) * sizeof(float) + gemm;
}

/* its buffers per thread where the CPU could take it: a unit's planes and output,
 * and a class's K rows (int32) */
static size_t batch_thread(const mdl_conv2d_shape *s, int64_t K, int64_t ho, int64_t wo)
{
#if MDL_X86
    if (winograd_cpu(MDL_SIMD_AVX512) && batched_path(s, ho, wo))
        return FLOATS(s->c_in * s->h * s->w * BATCH_IMAGES) +
               FLOATS(s->c_out * ho * wo * BATCH_IMAGES) + FLOATS(K);
#endif
    (void)s, (void)K, (void)ho, (void)wo;
    return 0;
}

/* Whether the channel Winograd sums over the input channels (the forward and the data
 * gradient; wo: the output's width), or over the tiles (the weight gradient, grad), by
 * SGEMMs over the tiles of a chunk of images (winograd_sums, weights_winograd_sums)
 * instead of in registers (mdl_set_winograd_sums).  Tiles per image (4x4 outputs each),
 * images per chunk (V and M, or dM, within WINO_SUMS_BYTES), and the shared
 * workspace: the chunk's V and M (dM), the largest of the SGEMMs' workspaces, and for
 * the weight gradient dU in float. */
static int wino_by_sgemm(const mdl_conv2d_shape *s, int64_t wo, int grad)
{
    const int mode = __atomic_load_n(&sums_mode, __ATOMIC_RELAXED);
    if (mode != MDL_WINOGRAD_SUMS_AUTO) return mode == MDL_WINOGRAD_SUMS_SGEMM;
    const int64_t cc = s->c_in * s->c_out;
    if (grad) return cc > WINOGRAD_CHANNELS_GRAD_MAX_CC;
    const int avx512 = mdl_cpu_simd() >= MDL_SIMD_AVX512;
    if (mdl_cpu_intel() && avx512)
        return mdl_winograd_points(s) * cc * (int64_t)sizeof(float) >
               mdl_l2_bytes() / 8 * WINOGRAD_INTEL_L2_EIGHTHS;
    const int wide = wo >= WINOGRAD_WIDE_MIN_WO &&
                     !(avx512 && mdl_cpu_amd_family() >= WINOGRAD_AMD_NOT_WIDE_FAMILY);
    return cc > (wide ? WINOGRAD_CHANNELS_WIDE_MAX_CC : WINOGRAD_CHANNELS_MAX_CC);
}
static int64_t wino_tiles(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    const int64_t m = MDL_WINOGRAD_M;
    return ((ho + m - 1) / m) * ((wo + m - 1) / m);
}
static int64_t wino_sums_images(const mdl_conv2d_shape *s, int64_t tiles)
{
    int64_t nb = WINO_SUMS_BYTES / (mdl_winograd_points(s) * tiles * (s->c_in + s->c_out) *
                                    (int64_t)sizeof(float));
    if (nb < 1 || s->n < 1) return 1;
    const int64_t chunks = (s->n + nb - 1) / nb;
    return (s->n + chunks - 1) / chunks; /* chunks of equal size, but for the last */
}
/* The shared buffers of the sums by SGEMMs, as offsets in floats from their start: a
 * chunk's V, its M (dM), dU in float (grad only), then the SGEMMs' workspace, gbytes */
typedef struct sums_layout {
    int64_t tiles, images; /* tiles per image, images per chunk */
    size_t m, du, gws, gbytes;
} sums_layout;

static sums_layout wino_sums_layout(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int grad)
{
    sums_layout L;
    L.tiles = wino_tiles(s, ho, wo);
    L.images = wino_sums_images(s, L.tiles);
    const int64_t rows = L.images * L.tiles;
    const int64_t last = (s->n % L.images ? s->n % L.images : L.images) * L.tiles;
    const int64_t xi = mdl_winograd_points(s);
    L.m = FLOATS(xi * rows * s->c_in);
    L.du = L.m + FLOATS(xi * rows * s->c_out);
    L.gws = L.du + (grad ? FLOATS(xi * s->c_in * s->c_out) : 0);
    L.gbytes = 0;
    for (int64_t c = rows, pass = 0; pass < 2; pass++, c = last)
        L.gbytes = max_size(L.gbytes, grad ? mdl_sgemm_workspace_size(s->c_in, s->c_out, c)
                                           : mdl_sgemm_workspace_size(c, s->c_out, s->c_in));
    return L;
}

/* The shared floats of the sums by SGEMMs for shape s with outputs ho x wo, forward or
 * weight gradient (grad), where the CPU could take them (0 elsewhere); per: raised to
 * each thread's floats */
static size_t wino_sums_need(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int grad,
                             size_t *per)
{
#if MDL_X86
    const int w8 = winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s);
    const int w16 = winograd_cpu(MDL_SIMD_AVX512) && mdl_winograd_avx512_applies(s);
    if ((w8 || w16) && wino_by_sgemm(s, wo, grad)) {
        *per = max_size(*per, (w16 ? mdl_winograd_avx512_tiles_floats
                                   : mdl_winograd8_tiles_floats)(s, ho, wo));
        const sums_layout L = wino_sums_layout(s, ho, wo, grad);
        return L.gws + L.gbytes / sizeof(float); /* gbytes: whole floats */
    }
#endif
    (void)s, (void)ho, (void)wo, (void)grad, (void)per;
    return 0;
}

/* The per-image path's algorithm: the GEMM, or Winograd F(2x2) with tiles in AVX2
 * vectors (winograd_avx2.c), or F(4x4, 3x3) / F(4x4, 5x5) with channels in AVX-512
 * vectors (winograd_avx512.c) or in AVX2 vectors (winograd8_avx2.c: at the AVX2 level,
 * and at the AVX-512 level for channels in multiples of 8 but not of 16);
 * the channel ones are taken before the other where the CPU and the shape allow it.
 * grad: for the weight gradient (its own channel limit). */
enum { GEMM = 0, WINO_TILES, WINO_CHANNELS, WINO_CHANNELS8, WINO_SUMS, WINO_SUMS8 };
static int wino_sums_algo(int wino) { return wino == WINO_SUMS || wino == WINO_SUMS8; }
static int use_winograd(const mdl_conv2d_shape *s, int64_t wo, int grad)
{
#if MDL_X86
    mdl_conv_algo a = mdl_get_conv_algo();
    if (a == MDL_CONV_GEMM) return GEMM;
    const int64_t cc = s->c_in * s->c_out;
    if (a == MDL_CONV_AUTO) {
        const int64_t ho = (s->h + 2 * s->pad_h - s->kh) / s->stride_h + 1;
        if (s->n * wino_tiles(s, ho, wo) <
            (grad && cc > WINOGRAD_GRAD_BIG_CC ? WINOGRAD_GRAD_BIG_MIN_TILES : WINOGRAD_MIN_TILES))
            return GEMM;
    }
    const int sums = wino_by_sgemm(s, wo, grad);
    if (mdl_use_avx512() && mdl_winograd_avx512_applies(s)) return sums ? WINO_SUMS : WINO_CHANNELS;
    if (mdl_use_avx2() && mdl_winograd8_applies(s) &&
        (!mdl_use_avx512() || grad ||
         (cc <= WINOGRAD8_MAX_CC && (s->c_in >= 16 || cc >= WINOGRAD8_MIN_CC))))
        return sums ? WINO_SUMS8 : WINO_CHANNELS8;
    return mdl_winograd_applies(s) &&
                   (a == MDL_CONV_WINOGRAD || (s->kh == 3 && s->c_in >= WINOGRAD_MIN_C &&
                                               s->c_out >= WINOGRAD_MIN_C && wo >= WINOGRAD_MIN_WO))
               ? WINO_TILES
               : GEMM;
#else
    (void)s, (void)wo, (void)grad;
    return 0;
#endif
}

typedef struct conv_geom {
    int64_t ho, wo;      /* output size */
    int64_t K, P;        /* rows and columns of the column matrix */
    int pointwise;       /* 1x1 kernel, stride 1, no padding: no im2col */
    int64_t B;           /* images per chunk (1 when pointwise) */
    size_t col_floats;   /* column matrix of a chunk, rounded up to 64 bytes */
    size_t out_floats;   /* (c_out, B * P) buffer of a chunk, rounded up to 64 bytes */
    size_t gemm_bytes;   /* the SGEMM workspace of the chunked backward-data */
    size_t chunk;        /* bytes of the chunked backward-data (buffers + SGEMM workspace) */
    int direct_data;     /* backward-data runs as a forward convolution of dy (stride 1) */
    int phase_data;      /* backward-data by phases (strided; data_phases_of) */
    size_t fixed;        /* bytes of the per-image path shared by the threads */
    size_t per_thread;   /* bytes of the per-image path for each thread */
    int dense;           /* tiny images: one SGEMM with the dense weights (dense_path) */
    size_t dense_bytes;  /* its workspace */
    size_t batch_w_bytes; /* the weight gradient by taps' workspace (batch_weights), or 0 */
    size_t pool_floats;  /* the pooled forward's buffer for a call's outputs, the thread's last */
    size_t need;         /* the whole workspace for one thread, with MDL_WS_SLACK */
} conv_geom;

/* Thread t's buffer for the pooled forward's outputs: the last pool_floats of its
 * scratch, which follows the workspace's fixed part per_thread bytes apart */
static float *pool_buffer(const conv_geom *g, float *ws, int t)
{
    return ws + (g->fixed + (size_t)(t + 1) * g->per_thread) / sizeof(float) - g->pool_floats;
}


/* the per-image channel sums of the forward, (n, 2, c_out) doubles, in floats */
#define SUMS_FLOATS(s) FLOATS(4 * (size_t)((s)->n * (s)->c_out))

/* With stride 1 and pad <= k - 1, the data gradient is a forward convolution:
 * dx = conv(dy, w') with w'[ci, co, i, j] = w[co, ci, kh-1-i, kw-1-j] and padding
 * k - 1 - pad, whose output is exactly (h, w).  *t gets that shape; 0 when the
 * stride or padding do not allow it, or when c_in, the rows of that product, is
 * too small to fill the micro-kernel (a network's first layer). */
static int transposed_shape(const mdl_conv2d_shape *s, const conv_geom *g, mdl_conv2d_shape *t)
{
    if (s->stride_h != 1 || s->stride_w != 1 || s->pad_h > s->kh - 1 || s->pad_w > s->kw - 1 ||
        s->c_in < DIRECT_DATA_MIN_C_IN)
        return 0;
    *t = (mdl_conv2d_shape){.n = s->n, .c_in = s->c_out, .h = g->ho, .w = g->wo,
                            .c_out = s->c_in, .kh = s->kh, .kw = s->kw, .stride_h = 1,
                            .stride_w = 1, .pad_h = s->kh - 1 - s->pad_h,
                            .pad_w = s->kw - 1 - s->pad_w};
    return 1;
}

/* The data gradient of a strided convolution by phases.  The input pixels (ih, iw)
 * with (ih + pad_h) % sh == a and (iw + pad_w) % sw == b form phase (a, b), a plane of
 * rows[a] x cols[b] pixels, the first at (first_h[a], first_w[b]); each gets
 * contributions from the taps (a + sh t, b + sw u) only, from dy at
 * ((ih + pad_h) / sh - t, (iw + pad_w) / sw - u).  So each phase's gradient is a
 * stride-1 correlation of dy with those taps: one GEMM of c_in rows, K = c_out x taps,
 * whose B rows the micro-kernel reads in place from dy padded with pt rows above and
 * pl columns to the left (drows x dcols planes), as the forward reads the phase
 * planes.  The GEMMs do the forward's multiplications, against the column matrix and
 * col2im of the chunked path.  Phases without taps (a kernel smaller than the stride)
 * are zero.  It applies when every phase with taps has rows a multiple of 16 wide, or
 * 8 wide in pairs, and c_in fills the micro-kernel's rows. */
#define PHASE_MAX_STRIDE 4
typedef struct data_phases {
    int64_t sh, sw;
    int64_t rows[PHASE_MAX_STRIDE], first_h[PHASE_MAX_STRIDE], taps_h[PHASE_MAX_STRIDE];
    int64_t cols[PHASE_MAX_STRIDE], first_w[PHASE_MAX_STRIDE], taps_w[PHASE_MAX_STRIDE];
    int64_t pt, pl, drows, dcols;
} data_phases;

/* one dimension: pixel class a of `size` input pixels (padding pad, stride st, kernel k);
 * returns the end of the range of dy that the class reads */
static int64_t phase_dim(int64_t size, int64_t pad, int64_t st, int64_t k, int64_t a, int64_t *n,
                         int64_t *first, int64_t *taps)
{
    *first = ((a - pad) % st + st) % st;
    *n = *first < size ? (size - 1 - *first) / st + 1 : 0;
    *taps = a < k ? (k - 1 - a) / st + 1 : 0;
    return (*first + pad) / st + *n;
}

static int data_phases_of(const mdl_conv2d_shape *s, const conv_geom *g, data_phases *d)
{
    d->sh = s->stride_h;
    d->sw = s->stride_w;
    if ((d->sh == 1 && d->sw == 1) || d->sh > PHASE_MAX_STRIDE || d->sw > PHASE_MAX_STRIDE ||
        s->c_in < DIRECT_DATA_MIN_C_IN)
        return 0;
    int64_t end_h = g->ho, end_w = g->wo; /* dy's rows and columns a phase reads, at most */
    for (int64_t a = 0; a < d->sh; a++) {
        const int64_t e = phase_dim(s->h, s->pad_h, d->sh, s->kh, a, &d->rows[a], &d->first_h[a],
                                    &d->taps_h[a]);
        end_h = e > end_h ? e : end_h;
    }
    for (int64_t b = 0; b < d->sw; b++) {
        const int64_t e = phase_dim(s->w, s->pad_w, d->sw, s->kw, b, &d->cols[b], &d->first_w[b],
                                    &d->taps_w[b]);
        end_w = e > end_w ? e : end_w;
    }
    for (int64_t a = 0; a < d->sh; a++)
        for (int64_t b = 0; b < d->sw; b++)
            if (d->taps_h[a] && d->taps_w[b] && d->rows[a] && d->cols[b] &&
                !(d->cols[b] % 16 == 0 || (d->cols[b] == 8 && d->rows[a] % 2 == 0)))
                return 0;
    d->pt = (s->kh + d->sh - 1) / d->sh - 1;
    d->pl = (s->kw + d->sw - 1) / d->sw - 1;
    d->drows = end_h + d->pt;
    d->dcols = end_w + d->pl;
    return 1;
}

/* K of phase (a, b) and its pixels */
#define PHASE_K(s, d, a, b) ((s)->c_out * (d)->taps_h[a] * (d)->taps_w[b])
#define PHASE_P(d, a, b) ((d)->rows[a] * (d)->cols[b])

/* floats of the phase path: shared (every phase's packed weights, the weights of one
 * phase gathered, the offset tables) and per thread (dy padded, every phase's output) */
static size_t data_phases_fixed(const mdl_conv2d_shape *s, const data_phases *d)
{
    size_t f = FLOATS(s->c_in * s->c_out * s->kh * s->kw) + TABLE_FLOATS(s->c_out * s->kh * s->kw);
    for (int64_t a = 0; a < d->sh; a++)
        for (int64_t b = 0; b < d->sw; b++) {
            const int64_t K = PHASE_K(s, d, a, b);
            f += max_size(FLOATS(mdl_sgemm_avx2_packed_a_floats(s->c_in, K)),
                          FLOATS(mdl_sgemm_avx512_rows_a_floats(s->c_in, K)));
        }
    return f;
}

static size_t data_phases_thread(const mdl_conv2d_shape *s, const data_phases *d)
{
    return FLOATS(s->c_out * d->drows * d->dcols) + FLOATS(s->c_in * s->h * s->w);
}

static mdl_status geometry(const char *fn, const mdl_conv2d_shape *s, conv_geom *g)
{
    mdl_status st = mdl_conv2d_check_shape(fn, s, &g->ho, &g->wo);
    if (st != MDL_OK) return st;
    g->K = s->c_in * s->kh * s->kw;
    g->P = g->ho * g->wo;
    g->pointwise = s->kh == 1 && s->kw == 1 && s->stride_h == 1 && s->stride_w == 1 &&
                   s->pad_h == 0 && s->pad_w == 0 && (g->P >= POINTWISE_MIN_P || s->n == 1);
    mdl_conv2d_shape t;
    data_phases dp;
    g->direct_data = transposed_shape(s, g, &t);
    g->phase_data = !g->direct_data && data_phases_of(s, g, &dp);
    /* the chunked backward-data (strided or few input channels) */
    int64_t per_image = (g->K + s->c_out) * g->P, B = CHUNK_FLOATS / (per_image > 0 ? per_image : 1);
    g->B = g->pointwise ? 1 : B < 1 ? 1 : B > s->n ? (s->n > 0 ? s->n : 1) : B;
    const int64_t N = g->B * g->P;
    const int chunked = !g->direct_data && !g->phase_data && !g->pointwise;
    g->col_floats = chunked ? FLOATS(g->K * N) : 0;
    g->out_floats = chunked ? FLOATS(s->c_out * N) : 0;
    g->gemm_bytes = 0;
    /* the SGEMMs (col = W^T @ dy) of a whole chunk and of the last, shorter one (the
     * size is not monotonic) */
    for (int64_t nb = g->B, pass = 0; pass < 2 && !g->direct_data && !g->phase_data;
         pass++, nb = s->n % g->B ? s->n % g->B : g->B)
        g->gemm_bytes = max_size(g->gemm_bytes, mdl_sgemm_workspace_size(g->K, nb * g->P, s->c_out));
    g->chunk = (g->col_floats + g->out_floats) * sizeof(float) + g->gemm_bytes;
    /* the dense path: the dense weights (or their gradient), the input read through its
     * map, the output before a pooling, and the SGEMMs' workspace */
    g->dense = dense_path(s, g->ho, g->wo);
    g->dense_bytes = 0;
    if (g->dense) { /* sized whatever the algorithm setting, so that it may change */
        const int64_t n = s->n, rows = s->c_out * g->P, cols = s->c_in * s->h * s->w;
        const size_t gemm = max_size(mdl_sgemm_workspace_size(n, rows, cols),
                                     max_size(mdl_sgemm_workspace_size(n, cols, rows),
                                              mdl_sgemm_workspace_size(rows, cols, n)));
        g->dense_bytes =
            (FLOATS(rows * cols) + FLOATS(n * cols) + FLOATS(n * rows)) * sizeof(float) + gemm;
        g->chunk = max_size(g->chunk, g->dense_bytes);
        g->dense = mdl_get_conv_algo() != MDL_CONV_WINOGRAD;
    }
    g->batch_w_bytes = batched_path(s, g->ho, g->wo) && g->P <= BATCH_W_MAX_P
                           ? batch_w_bytes(s, g->ho, g->wo) : 0;
    g->chunk = max_size(g->chunk, g->batch_w_bytes);
    /* the per-image path, shared: forward: the channel sums, the packed weights (for
     * the GEMM or for Winograd) and the panel table; backward-data: the flipped
     * weights, then the same for the shape t */
    const int64_t Kt = s->c_out * s->kh * s->kw;
    size_t fixed_f = SUMS_FLOATS(s) + weights_floats(s, g->K) + TABLE_FLOATS(g->K);
    size_t fixed_d = g->direct_data ? FLOATS((size_t)(s->c_in * Kt)) + weights_floats(&t, Kt) +
                                      TABLE_FLOATS(Kt) : 0;
    /* per thread: the padded image (B read in place) or a column matrix (none for a
     * pointwise kernel), and a packed B panel; or Winograd's buffers */
    const int in_f = rows_in_place(s, g->ho, g->wo);
    const int in_d = g->direct_data && rows_in_place(&t, s->h, s->w);
    /* and, last, the image read through an input map (mdl_conv2d_forward_fused) for the
     * paths that read it other than through the phase planes */
    const size_t img = FLOATS(s->c_in * s->h * s->w);
    const int64_t gp = im2col_group(g->P, g->pointwise) * g->P; /* a group's columns */
    const int64_t gpt = im2col_group(s->h * s->w, g->pointwise) * s->h * s->w; /* t's */
    size_t per_f = max_size((in_f ? phase_floats(s)
                                  : FLOATS(g->pointwise ? 0 : g->K * gp) + img +
                                        (gp > g->P ? FLOATS(s->c_out * gp) : 0)) +
                                FLOATS(mdl_sgemm_avx2_packed_b_floats(g->K)),
                            winograd_thread(s, g->ho, g->wo) + img);
    per_f = max_size(per_f, batch_thread(s, g->K, g->ho, g->wo));
    size_t per_d = g->direct_data
                       ? max_size((in_d ? phase_floats(&t)
                                        : FLOATS(g->pointwise ? 0 : Kt * gpt) +
                                              (gpt > s->h * s->w ? FLOATS(s->c_in * gpt) : 0)) +
                                      FLOATS(mdl_sgemm_avx2_packed_b_floats(Kt)),
                                  max_size(winograd_thread(&t, s->h, s->w),
                                           batch_thread(&t, Kt, s->h, s->w)))
                       : 0;
    /* backward-weights, per thread: a partial dw, then the padded images and their
     * row offsets (dot products) or a group's column matrix, packed dy and a packed B
     * panel (and the group's dy side by side) */
    const int64_t wgp = weights_group(s, g->P, g->pointwise) * g->P;
    size_t per_w = FLOATS((size_t)(s->c_out * g->K)) +
                   (weights_dot(s, g->ho, g->wo)
                        ? DOT_IMAGES(g->P) * phase_floats(s) + TABLE_FLOATS(g->K)
                        : FLOATS(g->pointwise ? 0 : (size_t)(g->K * wgp)) +
                              FLOATS(mdl_sgemm_avx2_packed_a_floats(s->c_out, wgp)) +
                              FLOATS(mdl_sgemm_avx2_packed_b_floats(wgp)) +
                              (wgp > g->P ? FLOATS(s->c_out * wgp) : 0) + img);
    /* or Winograd's partial dU and buffers; and with the sums by SGEMMs, the shared
     * buffers after the fixed part and each thread's transposed image (and dy) */
    fixed_f += wino_sums_need(s, g->ho, g->wo, 0, &per_f);
    if (g->direct_data) fixed_d += wino_sums_need(&t, s->h, s->w, 0, &per_d);
    const size_t fixed_w = wino_sums_need(s, g->ho, g->wo, 1, &per_w);
#if MDL_X86
    if (!fixed_w && winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s))
        per_w = max_size(per_w, mdl_winograd8_grad_thread_floats(s, g->ho, g->wo));
    if (!fixed_w && winograd_cpu(MDL_SIMD_AVX512) && mdl_winograd_avx512_applies(s))
        per_w = max_size(per_w, mdl_winograd_avx512_grad_thread_floats(s, g->ho, g->wo));
    /* or both gradients at once (backward_winograd) */
    if (!fixed_w && g->direct_data && winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s))
        per_w = max_size(per_w, mdl_winograd8_backward_thread_floats(s, &t, g->ho, g->wo));
    if (!fixed_w && g->direct_data && winograd_cpu(MDL_SIMD_AVX512) &&
        mdl_winograd_avx512_applies(s))
        per_w = max_size(per_w, mdl_winograd_avx512_backward_thread_floats(s, &t, g->ho, g->wo));
#endif
    if (g->phase_data) {
        fixed_d = data_phases_fixed(s, &dp);
        per_d = data_phases_thread(s, &dp);
    }
    g->fixed = max_size(max_size(fixed_f, fixed_d), fixed_w) * sizeof(float);
    g->per_thread = max_size(per_f, max_size(per_d, per_w)) * sizeof(float);
    g->pool_floats = 0;
    g->need = max_size(g->chunk, g->fixed + g->per_thread) + MDL_WS_SLACK;
    return MDL_OK;
}

/* The pooling of the pooled forward (mdl_conv2d_forward_pooled) */
typedef struct pooling {
    mdl_pool_geom g;
    int avg, relu;
} pooling;

/* geometry, then the pooling's, whose input must be the convolution's output, and
 * per thread a buffer for the output of the images one call convolves (Winograd's or
 * im2col's group) */
static mdl_status pooled_geometry(const char *fn, const mdl_conv2d_shape *s,
                                  const mdl_pool2d_shape *pool, conv_geom *g, mdl_pool_geom *pg)
{
    mdl_status st = geometry(fn, s, g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR_FN(fn, pool);
    MDL_CHECK(pool->n == s->n && pool->c == s->c_out && pool->h == g->ho && pool->w == g->wo,
              "%s: the pooling's input (%lld, %lld, %lld, %lld) must be the convolution's "
              "output (%lld, %lld, %lld, %lld)", fn, (long long)pool->n, (long long)pool->c,
              (long long)pool->h, (long long)pool->w, (long long)s->n, (long long)s->c_out,
              (long long)g->ho, (long long)g->wo);
    if ((st = mdl_pool_geometry(fn, pool, pg)) != MDL_OK) return st;
    int64_t group = im2col_group(g->P, g->pointwise);
    if (batch_thread(s, g->K, g->ho, g->wo)) group = max_size(group, BATCH_IMAGES);
#if MDL_X86
    if (winograd_cpu(MDL_SIMD_AVX2) && mdl_winograd8_applies(s))
        group = max_size(group, mdl_winograd8_group(s, g->ho, g->wo, 0));
    if (winograd_cpu(MDL_SIMD_AVX512) && mdl_winograd_avx512_applies(s))
        group = max_size(group, mdl_winograd_avx512_group(s, g->ho, g->wo, 0));
#endif
    g->pool_floats = FLOATS(group * s->c_out * g->P);
    g->per_thread += g->pool_floats * sizeof(float);
    g->need = max_size(g->chunk, g->fixed + g->per_thread) + MDL_WS_SLACK;
    return MDL_OK;
}

/* Bytes for `threads` threads on the per-image path (at least the one-thread need). */
static size_t need_for(const conv_geom *g, int threads)
{
    return max_size(g->need, g->fixed + (size_t)threads * g->per_thread + MDL_WS_SLACK);
}

/* The fast path takes its scratch memory from the workspace (or allocates it);
 * the scalar path needs none but rejects a too-small workspace all the same,
 * so a call fails or succeeds alike on every CPU. */
static mdl_status take_workspace(const char *fn, const conv_geom *g, int fast, void *ws,
                                 size_t ws_bytes, void **owned, float **out, size_t *avail)
{
    *owned = NULL;
    *out = NULL;
    *avail = ws ? ws_bytes : need_for(g, mdl_num_threads());
    *avail = *avail > MDL_WS_SLACK ? *avail - MDL_WS_SLACK : 0; /* what alignment can cost */
    if (fast) return mdl_workspace(fn, ws, ws_bytes, ws ? g->need : *avail + MDL_WS_SLACK, owned, out);
    if (ws != NULL && ws_bytes < g->need)
        return mdl_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn,
                         ws_bytes, g->need);
    return MDL_OK;
}

mdl_status mdl_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    MDL_CHECK_PTR(h_out);
    MDL_CHECK_PTR(w_out);
    return mdl_conv2d_check_shape(__func__, s, h_out, w_out);
}

/* bytes for the current thread count (need_for); 0 for an invalid shape (the calls
 * then report the error) */
size_t mdl_conv2d_workspace_size(const mdl_conv2d_shape *s)
{
    conv_geom g;
    if (geometry(__func__, s, &g) != MDL_OK) return 0;
    return need_for(&g, mdl_num_threads());
}

size_t mdl_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s, const mdl_pool2d_shape *pool)
{
    conv_geom g;
    mdl_pool_geom pg;
    if (pooled_geometry(__func__, s, pool, &g, &pg) != MDL_OK) return 0;
    return need_for(&g, mdl_num_threads());
}

/* ---- scalar reference ----------------------------------------------------------- */

/* y (n, c_out, ho, wo) = bias[co] + sum over ci, i, j of
 *     in(x)[ci, oh*sh - ph + i, ow*sw - pw + j] * w[co, ci, i, j]
 * where in(x) is x read through the map in (mdl_affine_apply) */
static void forward_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *x,
                           const mdl_affine *in, const float *w, const float *bias, float *y)
{
    const int64_t c_in = s->c_in, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t planes = s->n * s->c_out;
    int nt = mdl_threads_for((double)planes * ho * wo * c_in * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t b = pl / s->c_out, co = pl % s->c_out;
        const float *xb = x + b * c_in * h * wd, *wc = w + co * c_in * kh * kw;
        float *yp = y + pl * ho * wo;
        for (int64_t oh = 0; oh < ho; oh++)
            for (int64_t ow = 0; ow < wo; ow++) {
                float acc = bias ? bias[co] : 0.0f;
                for (int64_t ci = 0; ci < c_in; ci++) {
                    const mdl_affine_ch f = mdl_affine_at(in, ci);
                    for (int64_t i = 0; i < kh; i++) {
                        int64_t ih = oh * s->stride_h - s->pad_h + i;
                        if (ih < 0 || ih >= h) continue;
                        for (int64_t j = 0; j < kw; j++) {
                            int64_t iw = ow * s->stride_w - s->pad_w + j;
                            if (iw < 0 || iw >= wd) continue;
                            acc += mdl_affine_apply(xb[(ci * h + ih) * wd + iw], f) *
                                   wc[(ci * kh + i) * kw + j];
                        }
                    }
                }
                yp[oh * wo + ow] = acc;
            }
    }
}

/* dx (n, c_in, h, w) = (or +=, accumulate) the transpose of forward_scalar applied to dy */
static void backward_data_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo,
                                 const float *dy, const float *w, float *dx, int accumulate)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t planes = s->n * c_in;
    int nt = mdl_threads_for((double)planes * ho * wo * c_out * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t b = pl / c_in, ci = pl % c_in;
        float *dxp = dx + pl * h * wd;
        for (int64_t k = 0; k < h * wd && !accumulate; k++) dxp[k] = 0.0f;
        for (int64_t co = 0; co < c_out; co++) {
            const float *dyp = dy + (b * c_out + co) * ho * wo;
            const float *wk = w + (co * c_in + ci) * kh * kw;
            for (int64_t oh = 0; oh < ho; oh++)
                for (int64_t ow = 0; ow < wo; ow++) {
                    float g = dyp[oh * wo + ow];
                    for (int64_t i = 0; i < kh; i++) {
                        int64_t ih = oh * s->stride_h - s->pad_h + i;
                        if (ih < 0 || ih >= h) continue;
                        for (int64_t j = 0; j < kw; j++) {
                            int64_t iw = ow * s->stride_w - s->pad_w + j;
                            if (iw < 0 || iw >= wd) continue;
                            dxp[ih * wd + iw] += g * wk[i * kw + j];
                        }
                    }
                }
        }
    }
}

/* dw (c_out, c_in, kh, kw) = or += sum over n, oh, ow of in(x)[n, ci, ih, iw] * dy[n, co, oh, ow] */
static void backward_weights_scalar(const mdl_conv2d_shape *s, int64_t ho, int64_t wo,
                                    const float *x, const mdl_affine *in, const float *dy,
                                    float *dw, int accumulate)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, h = s->h, wd = s->w, kh = s->kh, kw = s->kw;
    const int64_t pairs = c_out * c_in;
    int nt = mdl_threads_for((double)pairs * s->n * ho * wo * kh * kw);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pr = 0; pr < pairs; pr++) {
        int64_t co = pr / c_in, ci = pr % c_in;
        const mdl_affine_ch f = mdl_affine_at(in, ci);
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                int64_t oh0, oh1, ow0, ow1;
                mdl_conv_valid_range(h, ho, s->stride_h, s->pad_h, i, &oh0, &oh1);
                mdl_conv_valid_range(wd, wo, s->stride_w, s->pad_w, j, &ow0, &ow1);
                float acc = 0.0f;
                for (int64_t b = 0; b < s->n; b++) {
                    const float *xp = x + (b * c_in + ci) * h * wd;
                    const float *dyp = dy + (b * c_out + co) * ho * wo;
                    for (int64_t oh = oh0; oh < oh1; oh++)
                        for (int64_t ow = ow0; ow < ow1; ow++)
                            acc += mdl_affine_apply(xp[(oh * s->stride_h - s->pad_h + i) * wd +
                                                       ow * s->stride_w - s->pad_w + j], f) *
                                   dyp[oh * wo + ow];
                }
                float *d = dw + (pr * kh + i) * kw + j;
                *d = accumulate ? *d + acc : acc;
            }
    }
}

/* sum of p[0, count): the reference for the bias gradient */
float mdl_conv_sum_scalar(const float *p, int64_t count)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < count; i++) acc += p[i];
    return acc;
}

/* ---- fast path: im2col + SGEMM ---------------------------------------------------- */

/* The fast path runs only when AVX2 is selected, so it exists only on x86. */
/* dx[0, nb) = col2im of the column matrix (K, nb * P): the (image, input channel)
 * planes are split among the threads */
static void col2im(const mdl_conv2d_shape *s, const conv_geom *g, const float *col, int64_t nb,
                   float *dx, int accumulate)
{
#if MDL_X86
    const int64_t c_in = s->c_in, total = nb * c_in, ld = nb * g->P, image = c_in * s->h * s->w;
    int nt = mdl_threads_for((double)g->K * g->P * nb);
    if (nt > total) nt = (int)total;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        for (int64_t q = total * t / nt, end = total * (t + 1) / nt; q < end;) {
            int64_t b = q / c_in, c0 = q % c_in, c1 = c_in < c0 + end - q ? c_in : c0 + end - q;
            mdl_conv_col2im_avx2(s, g->ho, g->wo, col + b * g->P, ld, dx + b * image, c0, c1,
                                 accumulate);
            q += c1 - c0;
        }
    }
#endif
}

/* buf (c_out, nb * P) = t[0, nb) (nb, c_out, P) */
static void chunk_gather(const conv_geom *g, int64_t c_out, int64_t nb, const float *t, float *buf)
{
    const int64_t P = g->P, rows = nb * c_out;
    int nt = mdl_threads_for((double)rows * P);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t q = 0; q < rows; q++)
        memcpy(buf + (q % c_out) * nb * P + q / c_out * P, t + q * P, (size_t)P * sizeof(float));
}

/* ---- fast path: one image at a time (implicit GEMM) ------------------------------ */

/* off[k] = where row k = (ci, i, j) of the column matrix starts in the phase planes
 * (phase_image): pixel (oh, ow) of that row is at off[k] + oh * cols + ow */
static void padded_offsets(const mdl_conv2d_shape *s, int64_t *off)
{
    const phases f = phases_of(s);
    for (int64_t k = 0; k < s->c_in * s->kh * s->kw; k++) {
        const int64_t ci = k / (s->kh * s->kw), i = k / s->kw % s->kh, j = k % s->kw;
        const int64_t plane = (ci * f.nr + i % s->stride_h) * f.nq + j % s->stride_w;
        off[k] = (plane * f.rows + i / s->stride_h) * f.cols + j / s->stride_w;
    }
}

static void phase_image(const mdl_conv2d_shape *s, const float *x, const mdl_affine *in, float *xp)
{
#if MDL_X86
    const phases f = phases_of(s);
    mdl_conv_phase_image_avx2(s, f.nr, f.nq, f.rows, f.cols, x, in, xp);
#else
    (void)s, (void)x, (void)in, (void)xp;
#endif
}

/* Image b of x as a path other than the phase planes reads it: read through the
 * map in into tx, the last floats of the thread's share of the workspace (see
 * geometry), or x's own memory when in is NULL */
static const float *input_image(const mdl_conv2d_shape *s, const float *x, int64_t b,
                                const mdl_affine *in, float *thread_end)
{
    const int64_t image = s->c_in * s->h * s->w;
    if (!in) return x + b * image;
#if MDL_X86
    float *tx = thread_end - FLOATS(image);
    mdl_conv_affine_image_avx2(s->c_in, s->h * s->w, x + b * image, in, tx);
    return tx;
#else
    return NULL; /* the fast path runs only on x86 */
#endif
}

/* y (c_out, P) = out (c_out rows of stride ld) + beta * y + bias, then max(., 0) when
 * relu: the GEMM epilogue's arithmetic, for an image of a group */
static void spread(int64_t c_out, int64_t P, int64_t ld, const float *out, const float *bias,
                   int relu, float beta, float *y)
{
    for (int64_t co = 0; co < c_out; co++) {
        const float b = bias ? bias[co] : 0.0f;
        for (int64_t p = 0; p < P; p++) {
            float v = out[co * ld + p];
            if (beta != 0.0f) v += beta * y[co * P + p]; /* y is not read otherwise */
            if (bias) v += b;
            y[co * P + p] = relu && v < 0.0f ? 0.0f : v; /* NaN passes */
        }
    }
}

/* wf (c_in, c_out, kh, kw) = w's kernels flipped, the weights of the data gradient's
 * convolution (transposed_shape) for Winograd and the AVX-512 tiles (the AVX2 GEMM's
 * packing flips them itself), in blocks of 16 x 16 channel pairs over the threads
 * (pair by pair in w's order, every write was a cache line of its own) */
static void flip_weights(const mdl_conv2d_shape *s, const float *w, float *wf)
{
    const int64_t kk = s->kh * s->kw, c_out = s->c_out, c_in = s->c_in;
    const int nt = mdl_threads_for(4.0 * (double)(c_out * c_in * kk));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t cb = 0; cb < c_in; cb += 16)
        for (int64_t ob = 0; ob < c_out; ob += 16) {
            const int64_t c1 = cb + 16 < c_in ? cb + 16 : c_in;
            const int64_t o1 = ob + 16 < c_out ? ob + 16 : c_out;
            for (int64_t ci = cb; ci < c1; ci++)
                for (int64_t co = ob; co < o1; co++)
                    for (int64_t q = 0; q < kk; q++)
                        wf[(ci * c_out + co) * kk + kk - 1 - q] = w[(co * c_in + ci) * kk + q];
        }
}

/* per_image's AVX-512 tiles of 16 output channels, which read B's rows in place */
static int avx512_rows(const mdl_conv2d_shape *s, const conv_geom *g)
{
    return (rows_in_place(s, g->ho, g->wo) || batched_path(s, g->ho, g->wo)) && mdl_use_avx512();
}

/* The weights w (c_out, K) packed for per_image: for Winograd; for B's rows read in
 * place by AVX-512 tiles of 16 output channels (where the CPU has AVX-512F, the
 * condition per_image tests); or as the AVX2 GEMM's A operand */
static void pack_weights(const mdl_conv2d_shape *s, const conv_geom *g, int wino, const float *w,
                         float *pa)
{
    if (wino == WINO_CHANNELS || wino == WINO_SUMS)
        mdl_winograd_avx512_weights(s, w, pa);
    else if (wino == WINO_CHANNELS8 || wino == WINO_SUMS8)
        mdl_winograd8_weights(s, w, pa);
    else if (wino)
        mdl_winograd_weights(s, w, pa);
    else if (avx512_rows(s, g))
        mdl_sgemm_avx512_rows_pack_a(s->c_out, g->K, w, g->K, pa);
    else
        mdl_sgemm_avx2_pack_a(0, s->c_out, g->K, 1.0f, w, g->K, pa);
}

/* ---- the batched path (batched_path) ---- */

/* off[k] = where row k = (ci, i, j) of the column matrix starts in the batch planes,
 * relative to the output pixel's own position there */
static void batch_offsets(const mdl_conv2d_shape *s, int64_t *off)
{
    for (int64_t k = 0; k < s->c_in * s->kh * s->kw; k++) {
        const int64_t ci = k / (s->kh * s->kw), i = k / s->kw % s->kh, j = k % s->kw;
        off[k] = ((ci * s->h + i - s->pad_h) * s->w + j - s->pad_w) * BATCH_IMAGES;
    }
}

/* xb (c, hw, width) = the count images (count, c, hw) of x read through the map in,
 * the images from count to width zero; channels [c0, c1) */
static void batch_planes(int64_t c, int64_t hw, const float *x, int64_t count, int64_t width,
                         const mdl_affine *in, int64_t c0, int64_t c1, float *xb)
{
    for (int64_t ch = c0; ch < c1; ch++) {
        const mdl_affine_ch f = mdl_affine_at(in, ch);
        float *d = xb + ch * hw * width;
        for (int64_t q = 0; q < count; q++) {
            const float *src = x + (q * c + ch) * hw;
            for (int64_t p = 0; p < hw; p++)
                d[p * width + q] = in ? mdl_affine_apply(src[p], f) : src[p];
        }
        for (int64_t p = 0; p < hw; p++)
            for (int64_t q = count; q < width; q++) d[p * width + q] = 0.0f;
    }
}

/* The taps [*lo, *hi) of a kernel of k taps that output coordinate o's window holds
 * inside an image of `size` pixels (stride 1) */
static void inside_taps(int64_t k, int64_t size, int64_t pad, int64_t o, int64_t *lo, int64_t *hi)
{
    *lo = pad > o ? pad - o : 0;
    *hi = size + pad - o < k ? size + pad - o : k;
}

/* ob (c_out, P x BATCH_IMAGES) = pa @ the unit's columns, class by class (output pixels
 * [y0, y1) x [x0, x1) whose windows hold the same taps), over each class's taps; pixel
 * p's BATCH_IMAGES columns start at colpos[p] */
static void batch_unit(const mdl_conv2d_shape *s, const conv_geom *g, const float *pa,
                       const int64_t *off, const float *xb, int32_t *sel, float *ob,
                       int64_t *colpos)
{
    int64_t col = 0, y1, x1, ky0, ky1, kx0, kx1, lo, hi;
    for (int64_t y0 = 0; y0 < g->ho; y0 = y1) {
        inside_taps(s->kh, s->h, s->pad_h, y0, &ky0, &ky1);
        for (y1 = y0 + 1; y1 < g->ho; y1++) {
            inside_taps(s->kh, s->h, s->pad_h, y1, &lo, &hi);
            if (lo != ky0 || hi != ky1) break;
        }
        for (int64_t x0 = 0; x0 < g->wo; x0 = x1) {
            inside_taps(s->kw, s->w, s->pad_w, x0, &kx0, &kx1);
            for (x1 = x0 + 1; x1 < g->wo; x1++) {
                inside_taps(s->kw, s->w, s->pad_w, x1, &lo, &hi);
                if (lo != kx0 || hi != kx1) break;
            }
            int64_t nsel = 0;
            for (int64_t ci = 0; ci < s->c_in; ci++)
                for (int64_t i = ky0; i < ky1; i++)
                    for (int64_t j = kx0; j < kx1; j++)
                        sel[nsel++] = (int32_t)((ci * s->kh + i) * s->kw + j);
            const int64_t cw = (x1 - x0) * BATCH_IMAGES, n = (y1 - y0) * cw;
            for (int64_t oy = y0; oy < y1; oy++)
                for (int64_t ox = x0; ox < x1; ox++)
                    colpos[oy * g->wo + ox] = col + (oy - y0) * cw + (ox - x0) * BATCH_IMAGES;
            mdl_sgemm_avx512_packed_image_sel(s->c_out, g->K, pa,
                                              xb + (y0 * s->w + x0) * BATCH_IMAGES, cw,
                                              s->w * BATCH_IMAGES, n, off, sel, nsel, ob + col,
                                              g->P * BATCH_IMAGES);
            col += n;
        }
    }
}

/* y (c_out, P) = image q's columns of the unit's output (ob + q) + beta * y + bias,
 * then max(., 0) when relu (NaN passes) */
static void batch_spread(int64_t c_out, int64_t P, const int64_t *colpos, const float *ob,
                         const float *bias, int relu, float beta, float *y)
{
    for (int64_t co = 0; co < c_out; co++) {
        const float *o = ob + co * P * BATCH_IMAGES;
        float *yr = y + co * P;
        for (int64_t p = 0; p < P; p++) {
            float v = o[colpos[p]];
            if (beta != 0.0f) v += beta * yr[p];
            if (bias) v += bias[co];
            yr[p] = relu && v < 0.0f ? 0.0f : v;
        }
    }
}

/* The cache lines of bytes at p fetched for writing, ahead of a kernel that stores them
 * (an output in memory that no one has touched for a while: each store would otherwise
 * wait for its line) */
static void prefetch_out(const void *p, size_t bytes)
{
    for (size_t k = 0; k < bytes; k += 64) __builtin_prefetch((const char *)p + k, 1, 2);
}

/* An image's channel sums (sb: c_out sums, then c_out sums of squares) from its output */
static void image_sums(int64_t c_out, int64_t P, const float *y, double *sb)
{
    for (int64_t c = 0; c < 2 * c_out; c++) sb[c] = 0.0;
    mdl_conv_row_sums_avx2(c_out, P, y, sb, sb + c_out);
}

#if MDL_X86
/* What per_image's one-image paths share in a call */
typedef struct image_job {
    const mdl_conv2d_shape *s;
    const conv_geom *g;
    const float *x;
    const mdl_affine *in;
    const float *pa, *bias; /* pa: the weights packed, or as they are (lda K) */
    int64_t lda;
    const int64_t *off; /* the in-place tiles' offsets, rows wp floats apart */
    const pooling *pl;
    float *y;
    float beta;
    int64_t wp;
    int relu, in_place, avx512;
} image_job;

/* Rows [r0, r1) (whole micro-panels; all rows at the AVX-512 level) of image b's
 * output (c_out, P), to y or, before its pooling into y, to the thread's buffer end,
 * with those rows' channel sums to sb (not NULL): read in place from its padded copy
 * in col, the epilogue in the tiles and the sums after them, while the output is in
 * the cache (cheaper than a reduction per 16-pixel tile); else through the column
 * matrix in col (none for a pointwise kernel), either grouped, as an im2col group's
 * path gives the values (the product into obuf, then spread with the epilogue and
 * summed), or with the epilogue and the sums in the tiles. */
static void image_rows(const image_job *j, int64_t b, int64_t r0, int64_t r1, int grouped,
                       double *sb, float *col, float *obuf, float *bbuf, float *end)
{
    const mdl_conv2d_shape *s = j->s;
    const conv_geom *g = j->g;
    const int64_t c_out = s->c_out, K = g->K, P = g->P;
    float *out = j->pl ? end : j->y + b * c_out * P;
    const int sums_after = sb && (j->in_place || grouped);
    mdl_epilogue ep = {j->bias, j->relu, NULL, NULL};
    if (sb) {
        for (int64_t c = r0; c < r1; c++) sb[c] = sb[c_out + c] = 0.0;
        if (!sums_after) ep.row_sum = sb, ep.row_sumsq = sb + c_out;
    }
    const mdl_epilogue *e = j->bias || j->relu || ep.row_sum ? &ep : NULL;
    if (j->in_place) {
        phase_image(s, j->x + b * s->c_in * s->h * s->w, j->in, col);
        if (j->avx512)
            mdl_sgemm_avx512_packed_image(c_out, K, j->pa, col, g->wo, j->wp, P, j->off, j->beta,
                                          out, P, e);
        else
            mdl_sgemm_avx2_packed_image_rows(c_out, r0, r1, K, j->pa, j->lda, col, g->wo, j->wp,
                                             P, j->off, j->beta, out, P, e);
    } else {
        const float *src = input_image(s, j->x, b, j->in, end);
        if (!g->pointwise) {
            mdl_conv_im2col_avx2(s, g->ho, g->wo, src, col, P, 0, K);
            src = col;
        }
        if (grouped) {
            mdl_sgemm_avx2_packed_rows(0, c_out, r0, r1, P, K, j->pa, j->lda, src, P, 0.0f, obuf,
                                       P, NULL, bbuf);
            spread(r1 - r0, P, P, obuf + r0 * P, j->bias ? j->bias + r0 : NULL, j->relu, j->beta,
                   out + r0 * P);
        } else {
            mdl_sgemm_avx2_packed_rows(0, c_out, r0, r1, P, K, j->pa, j->lda, src, P, j->beta,
                                       out, P, e, bbuf);
        }
    }
    if (sums_after) mdl_conv_row_sums_avx2(r1 - r0, P, out + r0 * P, sb + r0, sb + c_out + r0);
    if (j->pl)
        mdl_pool_planes(&j->pl->g, j->pl->avg, j->pl->relu, r1 - r0, end + r0 * P,
                        j->y + (b * c_out + r0) * j->pl->g.ho * j->pl->g.wo);
}
#endif

/* Of nt threads, those whose buffers per_image's workspace holds */
static int split_threads(const conv_geom *g, size_t avail, int nt)
{
    const size_t fit = avail > g->fixed ? (avail - g->fixed) / g->per_thread : 1;
    return (size_t)nt > fit ? (int)fit : nt;
}

/* Whether per_image splits each image's rows among nr threads: fewer images than
 * threads on the AVX2 GEMM's paths, SPLIT_ROWS_MIN_PANELS micro-panels a thread */
static int splits_rows(const mdl_conv2d_shape *s, const conv_geom *g, int wino, int nr)
{
    const int64_t panels = (s->c_out + MDL_SGEMM_AVX2_MR - 1) / MDL_SGEMM_AVX2_MR;
    return s->n < nr && !wino && !avx512_rows(s, g) && panels >= SPLIT_ROWS_MIN_PANELS * nr;
}

/* y[b] (c_out, P) = pa @ col(in(x[b])) + beta * y[b] (beta 0 or 1) with the epilogue,
 * for every image b; pa is the packed weights (or, with w not NULL, the space for them:
 * where the threads split each image's rows, w is read as it is), in the map x is read
 * through (NULL: none).  The threads take whole images, each with its own column matrix (K, P)
 * (none for a pointwise kernel: x[b] is its own column matrix) and packed B panel,
 * so nothing is shared while they run and the result does not depend on the thread
 * count.  Per-image channel sums go to sums (n, 2, c_out) and are added up over the
 * images in order by the caller.  Small images on the im2col path go in groups
 * (im2col_group): their column matrices side by side, one GEMM into a buffer, then
 * each image's share spread to y with the epilogue.  With the pooling pl (not NULL),
 * each call's output goes to the thread's buffer and y gets its pooling. */
static void per_image(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                      const mdl_affine *in, int wino, const float *pa, const float *w,
                      const float *bias, int relu, double *sums, const pooling *pl, float beta,
                      float *y, float *ws, size_t avail, int nt)
{
#if MDL_X86
    const int64_t c_out = s->c_out, K = g->K, P = g->P;
    const int nr = split_threads(g, avail, nt); /* the threads the workspace holds */
    nt = nr < s->n ? nr : (int)s->n;
    if (nt < 1) nt = 1;
    float *thread_ws = ws + g->fixed / sizeof(float);
    /* per thread: the padded image (B read in place) or the column matrix (none
     * for a pointwise kernel), then a packed B panel; or Winograd's buffers */
    const int batched = !wino && mdl_use_avx512() && batched_path(s, g->ho, g->wo);
    const int in_place = !wino && !batched && rows_in_place(s, g->ho, g->wo);
    const int avx512 = in_place && mdl_use_avx512(); /* weights packed for it (pack_weights) */
    const int64_t igroup = in_place || wino || batched ? 1 : im2col_group(g->P, g->pointwise);
    const size_t col_floats = in_place  ? phase_floats(s)
                              : batched ? 0
                                        : FLOATS(g->pointwise ? 0 : K * P * igroup);
    const size_t out_floats = igroup > 1 ? FLOATS(c_out * P * igroup) : 0;
    int64_t *off = (int64_t *)(pa + weights_floats(s, K));
    const int64_t wp = phases_of(s).cols;
    if (in_place) padded_offsets(s, off);
    if (batched) batch_offsets(s, off);
    image_job job = {s, g, x, in, pa, bias, 0, off, pl, y, beta, wp, relu, in_place, avx512};
    const int channels = wino == WINO_CHANNELS || wino == WINO_CHANNELS8;
    const int64_t group = wino == WINO_CHANNELS    ? mdl_winograd_avx512_group(s, g->ho, g->wo, 0)
                          : wino == WINO_CHANNELS8 ? mdl_winograd8_group(s, g->ho, g->wo, 0)
                                                   : 1;
    /* work in units of images (a Winograd call's group, an im2col group, or one
     * image), handed out one at a time: a thread that the machine delays leaves its
     * units to the other (under a competing load: up to 1.3x).  An image's output
     * does not depend on its unit. */
    const int64_t unit = channels ? group : batched ? BATCH_IMAGES : igroup;
    const int64_t units = (s->n + unit - 1) / unit;
    /* Fewer images than threads on the AVX2 GEMM's paths (splits_rows): the threads
     * share each image's product by rows of its output instead, whole micro-panels
     * each, so that every value is computed as by one thread; the weights read as
     * they are where the caller gave them (w) */
    const int64_t panels = (c_out + MDL_SGEMM_AVX2_MR - 1) / MDL_SGEMM_AVX2_MR;
    if (splits_rows(s, g, wino, nr)) {
        if (w) job.pa = w, job.lda = K;
#pragma omp parallel num_threads(nr)
        {
            int t, T;
            MDL_THREAD_ID(t, T);
            float *col = thread_ws + t * (g->per_thread / sizeof(float));
            float *bbuf = col + col_floats + out_floats, *end = pool_buffer(g, ws, t);
            const int64_t r0 = panels * t / T * MDL_SGEMM_AVX2_MR;
            const int64_t r1 = t + 1 == T ? c_out : panels * (t + 1) / T * MDL_SGEMM_AVX2_MR;
            for (int64_t b = 0; b < s->n; b++)
                image_rows(&job, b, r0, r1, igroup > 1, sums ? sums + b * 2 * c_out : NULL, col,
                           col + col_floats, bbuf, end);
        }
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        (void)T;
        float *col = thread_ws + t * (g->per_thread / sizeof(float)), *obuf = col + col_floats;
        float *bbuf = obuf + out_floats, *end = pool_buffer(g, ws, t);
        /* the output of image b + q of a call (before pooling), and the call's pooling */
#define OUT2(b, q) (pl ? end + (q) * c_out * P : y + ((b) + (q)) * c_out * P)
#define OUT(b) OUT2(b, 0)
#define POOL(b, count)                                                                   \
    if (pl) mdl_pool_planes(&pl->g, pl->avg, pl->relu, (count) * c_out, end,            \
                            y + (b) * c_out * pl->g.ho * pl->g.wo)
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < units; u++) {
            const int64_t b = u * unit, count = s->n - b < unit ? s->n - b : unit;
            if (!pl) prefetch_out(OUT(b), (size_t)(count * c_out * P) * sizeof(float));
            if (channels) {
                (wino == WINO_CHANNELS ? mdl_winograd_avx512_images : mdl_winograd8_images)(
                    s, g->ho, g->wo, pa, count, x + b * s->c_in * s->h * s->w, in, bias, relu,
                    sums ? sums + b * 2 * c_out : NULL, beta != 0.0f, OUT(b), col);
                POOL(b, count);
                continue;
            }
            if (batched) {
                float *ob = col + FLOATS(s->c_in * s->h * s->w * BATCH_IMAGES);
                int32_t *sel = (int32_t *)(ob + FLOATS(c_out * P * BATCH_IMAGES));
                int64_t colpos[BATCH_MAX_P];
                batch_planes(s->c_in, s->h * s->w, x + b * s->c_in * s->h * s->w, count,
                             BATCH_IMAGES, in, 0, s->c_in, col);
                batch_unit(s, g, pa, off, col, sel, ob, colpos);
                for (int64_t q = 0; q < count; q++) {
                    batch_spread(c_out, P, colpos, ob + q, bias, relu, beta, OUT2(b, q));
                    if (sums) image_sums(c_out, P, OUT2(b, q), sums + (b + q) * 2 * c_out);
                }
                POOL(b, count);
                continue;
            }
            if (igroup > 1) {
                const int64_t gp = count * P;
                for (int64_t q = 0; q < count; q++)
                    mdl_conv_im2col_avx2(s, g->ho, g->wo, input_image(s, x, b + q, in, end),
                                         col + q * P, gp, 0, K);
                mdl_sgemm_avx2_packed(0, c_out, gp, K, pa, col, gp, 0.0f, obuf, gp, NULL, bbuf);
                for (int64_t q = 0; q < count; q++) {
                    spread(c_out, P, gp, obuf + q * P, bias, relu, beta, OUT2(b, q));
                    if (sums) image_sums(c_out, P, OUT2(b, q), sums + (b + q) * 2 * c_out);
                }
                POOL(b, count);
                continue;
            }
            double *sb = sums ? sums + b * 2 * c_out : NULL;
            if (!wino) {
                image_rows(&job, b, 0, c_out, 0, sb, col, obuf, bbuf, end);
                continue;
            }
            /* F(2x2) with tiles in vectors: the epilogue and the sums in it */
            mdl_epilogue ep = {bias, relu, sb, sb ? sb + c_out : NULL};
            for (int64_t c = 0; sb && c < 2 * c_out; c++) sb[c] = 0.0;
            mdl_winograd_image(s, g->ho, g->wo, pa, input_image(s, x, b, in, end),
                               bias || relu || sb ? &ep : NULL, OUT(b), col);
            POOL(b, 1);
        }
#undef OUT2
#undef OUT
#undef POOL
    }
#else
    (void)s, (void)g, (void)x, (void)in, (void)wino, (void)pa, (void)bias, (void)relu, (void)sums;
    (void)pl, (void)beta, (void)y;
    (void)ws, (void)avail, (void)nt;
#endif
}

#if MDL_X86
/* The threads of the weight gradient's per-image paths: as many as its work calls for,
 * at most one per image and as many as the workspace holds, at least one */
static int weights_threads(const mdl_conv2d_shape *s, const conv_geom *g, size_t avail)
{
    int nt = mdl_threads_for((double)s->n * s->c_out * g->K * g->P);
    if (nt > s->n) nt = (int)s->n;
    if ((size_t)nt > avail / g->per_thread) nt = (int)(avail / g->per_thread);
    return nt < 1 ? 1 : nt;
}

/* The data gradient of backward_winograd, which weights_winograd takes along: dx = or +=
 * (accumulate) the convolution t of dy with the flipped weights, transformed in ut */
typedef struct data_grad {
    mdl_conv2d_shape t;
    const float *ut;
    float *dx;
    int accumulate;
} data_grad;

/* dw by Winograd (winograd_avx512.c, or winograd8_avx2.c with avx512 0): each thread
 * adds its share of the images into its own partial dU (doubles, per_thread bytes
 * apart), then each sets a share of dw's channel pairs from the partials' sum in
 * thread order.  With d (not NULL), each group's data gradient too, dy transposed once
 * for both (the _backward_images of winograd_channels.h). */
static void weights_winograd(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                             const mdl_affine *in, const float *dy, float *dw, int accumulate,
                             float *ws, size_t stride, int nt, int avx512, const data_grad *d)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, pairs = c_in * c_out;
    const int64_t xi = mdl_winograd_points(s), image = c_in * s->h * s->w;
    const int64_t group = (avx512 ? mdl_winograd_avx512_group : mdl_winograd8_group)(s, g->ho,
                                                                                      g->wo, 1);
#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        double *du = (double *)(ws + t * stride); /* transform points x pairs */
        memset(du, 0, (size_t)(xi * pairs) * sizeof(double));
        const int64_t b1 = s->n * (t + 1) / T;
        for (int64_t b = s->n * t / T; b < b1; b += group) {
            const int64_t nb = b1 - b < group ? b1 - b : group;
            float *buf = (float *)(du + xi * pairs);
            if (d)
                (avx512 ? mdl_winograd_avx512_backward_images : mdl_winograd8_backward_images)(
                    s, &d->t, g->ho, g->wo, d->ut, nb, x + b * image, in, dy + b * c_out * g->P,
                    d->accumulate, d->dx + b * image, du, buf);
            else
                (avx512 ? mdl_winograd_avx512_grad_images : mdl_winograd8_grad_images)(
                    s, g->ho, g->wo, nb, x + b * image, in, dy + b * c_out * g->P, du, buf);
        }
#pragma omp barrier
        /* the channel pairs in whole vectors of output channels */
        const int64_t vl = avx512 ? 16 : 8, units = pairs / vl;
        (avx512 ? mdl_winograd_avx512_grad_finish : mdl_winograd8_grad_finish)(
            s, (const double *)ws, T, stride / 2, NULL, units * t / T * vl,
            units * (t + 1) / T * vl, dw, accumulate);
    }
}

/* Both gradients where the data gradient's convolution t and the weight gradient both
 * take the channel Winograd (WINO_CHANNELS, or WINO_CHANNELS8 for both) and dy's blocks
 * lie inside t's padded input (backward_applies): weights_winograd with the data
 * gradient along, the values those of the two calls.  The workspace: the flipped
 * weights and t's transformed ones (fixed), then per thread the partial dU and the
 * buffers.  0 where it does not apply or the workspace holds fewer threads than the
 * weight gradient alone would take. */
static int backward_winograd(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                             const mdl_affine *in, const float *dy, const float *w, float *dx,
                             int accumulate_dx, float *dw, int accumulate_dw, float *ws,
                             size_t avail)
{
    data_grad d = {.dx = dx, .accumulate = accumulate_dx};
    if (!dx || g->dense || !transposed_shape(s, g, &d.t)) return 0;
    const int wino = use_winograd(s, g->wo, 1);
    if (wino != use_winograd(&d.t, s->w, 0) || (wino != WINO_CHANNELS && wino != WINO_CHANNELS8))
        return 0;
    const int avx512 = wino == WINO_CHANNELS;
    if (!(avx512 ? mdl_winograd_avx512_backward_applies : mdl_winograd8_backward_applies)(
            s, &d.t, g->ho, g->wo))
        return 0;
    const int nt = weights_threads(s, g, avail);
    if (g->fixed + (size_t)nt * g->per_thread > avail) return 0;
    float *wf = ws, *ut = wf + FLOATS(s->c_in * s->c_out * s->kh * s->kw);
    flip_weights(s, w, wf);
    (avx512 ? mdl_winograd_avx512_weights : mdl_winograd8_weights)(&d.t, wf, ut);
    d.ut = ut;
    weights_winograd(s, g, x, in, dy, dw, accumulate_dw, ws + g->fixed / sizeof(float),
                     g->per_thread / sizeof(float), nt, avx512, &d);
    return 1;
}

/* Threads for the sums by SGEMMs: as many as the workspace holds after the fixed part */
static int sums_threads(const conv_geom *g, size_t avail, int nt)
{
    const size_t fit = (avail - g->fixed) / g->per_thread;
    return (size_t)nt > fit ? (fit ? (int)fit : 1) : nt < 1 ? 1 : nt;
}

/* V (and, with dy, dM) of images b .. b + nb - 1, a chunk starting at v and dm, each
 * thread a share of the images with its scratch after the workspace's fixed part */
static void sums_tiles(const mdl_conv2d_shape *s, const conv_geom *g, int64_t b, int64_t nb,
                       const float *x, const mdl_affine *in, const float *dy, float *v,
                       float *dm, float *ws, int nt, int avx512)
{
    const int64_t tiles = wino_tiles(s, g->ho, g->wo), xi = mdl_winograd_points(s);
    float *bufs = ws + g->fixed / sizeof(float);
    const size_t stride = g->per_thread / sizeof(float);
#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        const int64_t lo = b + nb * t / T, hi = b + nb * (t + 1) / T;
        (avx512 ? mdl_winograd_avx512_tiles_v : mdl_winograd8_tiles_v)(
            s, g->ho, g->wo, hi - lo, x + lo * s->c_in * s->h * s->w, in,
            v + (lo - b) * tiles * xi * s->c_in, bufs + t * stride);
        if (dy)
            (avx512 ? mdl_winograd_avx512_tiles_dm : mdl_winograd8_tiles_dm)(
                s, g->ho, g->wo, hi - lo, dy + lo * s->c_out * g->P,
                dm + (lo - b) * tiles * xi * s->c_out, bufs + t * stride);
    }
}

/* The chunk's SGEMMs, one per transform point over its `rows` tiles: the forward's M_xi
 * = V_xi @ U_xi (grad 0, b = U), or the weight gradient's dU_xi = V_xi^T @ dM_xi + beta
 * dU_xi (b = dM); gws: the SGEMMs' workspace */
static mdl_status sums_gemms(const mdl_conv2d_shape *s, int grad, int64_t rows, const float *v,
                             const float *b, float *c, float beta, float *gws, size_t gbytes)
{
    const int64_t c_in = s->c_in, c_out = s->c_out, cc = c_in * c_out;
    const int64_t np = mdl_winograd_points(s);
    mdl_status st = MDL_OK;
    for (int64_t xi = 0; xi < np && st == MDL_OK; xi++)
        st = grad ? mdl_sgemm(1, 0, c_in, c_out, rows, 1.0f, v + xi * c_in, np * c_in,
                              b + xi * c_out, np * c_out, beta, c + xi * cc, c_out, gws, gbytes)
                  : mdl_sgemm(0, 0, rows, c_out, c_in, 1.0f, v + xi * c_in, np * c_in,
                              b + xi * cc, c_out, 0.0f, c + xi * c_out, np * c_out, gws, gbytes);
    return st;
}

/* y by Winograd with the sums over the input channels as SGEMMs (many channels), per
 * chunk of images: the threads write V of their share of its images, then M_xi (tiles,
 * c_out) = V_xi (tiles, c_in) @ U_xi (c_in, c_out), one SGEMM per transform point, then
 * the threads apply the output transform and per_image's epilogue, and with the pooling
 * pl (not NULL; no sums) pool each image from their buffer (pooled_geometry's) into y.
 * shared: the chunk's V and M and the SGEMMs' workspace; each thread's scratch follows
 * the fixed part, per_thread bytes apart. */
static mdl_status winograd_sums(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                                const mdl_affine *in, const float *u, float *shared,
                                const float *bias, int relu, double *sums, const pooling *pl,
                                float beta, float *y, float *ws, size_t avail, int nt, int avx512)
{
    const int64_t c_out = s->c_out, P = g->P;
    const sums_layout L = wino_sums_layout(s, g->ho, g->wo, 0);
    const int64_t tiles = L.tiles, nbw = L.images, xi = mdl_winograd_points(s);
    float *v = shared, *m = shared + L.m, *gws = shared + L.gws;
    const size_t gbytes = L.gbytes;
    nt = sums_threads(g, avail, nt);
    mdl_status st = MDL_OK;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += nbw) {
        const int64_t nb = s->n - b < nbw ? s->n - b : nbw;
        sums_tiles(s, g, b, nb, x, in, NULL, v, NULL, ws, nt, avx512);
        if ((st = sums_gemms(s, 0, nb * tiles, v, u, m, 0.0f, gws, gbytes)) != MDL_OK) break;
#pragma omp parallel num_threads(nt)
        {
            int t, T;
            MDL_THREAD_ID(t, T);
            const int64_t lo = b + nb * t / T, hi = b + nb * (t + 1) / T;
            if (pl) { /* an image at a time into the thread's buffer, then its pooling */
                float *out = pool_buffer(g, ws, t);
                for (int64_t i = lo; i < hi; i++) {
                    (avx512 ? mdl_winograd_avx512_tiles_y : mdl_winograd8_tiles_y)(
                        s, g->ho, g->wo, 1, m + (i - b) * tiles * xi * c_out, bias, relu, NULL,
                        0, out);
                    mdl_pool_planes(&pl->g, pl->avg, pl->relu, c_out, out,
                                    y + i * c_out * pl->g.ho * pl->g.wo);
                }
            } else
                (avx512 ? mdl_winograd_avx512_tiles_y : mdl_winograd8_tiles_y)(
                    s, g->ho, g->wo, hi - lo, m + (lo - b) * tiles * xi * c_out, bias, relu,
                    sums ? sums + lo * 2 * c_out : NULL, beta != 0.0f, y + lo * c_out * P);
        }
    }
    return st;
}

/* dw by Winograd with dU summed by SGEMMs (many channels), per chunk of images: the
 * threads write V and dM of their share of its images, then dU_xi (c_in, c_out) = or +=
 * V_xi^T @ dM_xi over the chunk's tiles, one SGEMM per transform point; at the end dw =
 * G^T dU G per channel pair.  The shared buffers (V, dM, dU, the SGEMMs' workspace) at
 * ws, each thread's scratch after the fixed part. */
static mdl_status weights_winograd_sums(const mdl_conv2d_shape *s, const conv_geom *g,
                                        const float *x, const mdl_affine *in, const float *dy,
                                        float *dw, int accumulate, float *ws, size_t avail,
                                        int nt, int avx512)
{
    const int64_t cc = s->c_in * s->c_out;
    const sums_layout L = wino_sums_layout(s, g->ho, g->wo, 1);
    const int64_t tiles = L.tiles, nbw = L.images;
    float *v = ws, *dm = ws + L.m, *du = ws + L.du, *gws = ws + L.gws;
    const size_t gbytes = L.gbytes;
    nt = sums_threads(g, avail, nt);
    mdl_status st = MDL_OK;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += nbw) {
        const int64_t nb = s->n - b < nbw ? s->n - b : nbw;
        sums_tiles(s, g, b, nb, x, in, dy, v, dm, ws, nt, avx512);
        st = sums_gemms(s, 1, nb * tiles, v, dm, du, b ? 1.0f : 0.0f, gws, gbytes);
    }
    if (st != MDL_OK) return st;
    const int64_t vl = avx512 ? 16 : 8, units = cc / vl;
#pragma omp parallel num_threads(mdl_threads_for((double)cc * mdl_winograd_points(s) * 8))
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        (avx512 ? mdl_winograd_avx512_grad_finish : mdl_winograd8_grad_finish)(
            s, NULL, 0, 0, du, units * t / T * vl, units * (t + 1) / T * vl, dw, accumulate);
    }
    return MDL_OK;
}
#endif

#if MDL_X86
/* Images [b0, b1) of the weight gradient into columns [k0, k1) of c (rows ldc floats
 * apart): c = (c +, add) the sum of their dy[b] (c_out, P) @ col(x[b])^T, through
 * buf, this thread's buffers (up to end).  Rows a multiple of 8 wide (not a 1x1
 * kernel; from DOT_MIN_PIXELS): dot products over the phase planes of a few images at
 * a time (mdl_conv_weights_dot_avx2); otherwise dy[b] packed as the A operand and the
 * column matrix's rows [k0, k1) read transposed as B.  Each value is the same whatever
 * [k0, k1) holds it. */
static void weights_images(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                           const mdl_affine *in, const float *dy, int64_t b0, int64_t b1,
                           int64_t k0, int64_t k1, int add, float *c, int64_t ldc, float *buf,
                           float *end)
{
    const int64_t c_out = s->c_out, K = g->K, P = g->P, image = s->c_in * s->h * s->w;
    const int dot = weights_dot(s, g->ho, g->wo), avx512 = mdl_use_avx512();
    const int64_t igroup = dot ? 1 : weights_group(s, g->P, g->pointwise), nk = k1 - k0;
    /* the im2col + GEMM buffers, or the padded images and their row offsets */
    float *col = buf, *pa = col + FLOATS(g->pointwise ? 0 : K * P * igroup);
    float *bbuf = pa + FLOATS(mdl_sgemm_avx2_packed_a_floats(c_out, P * igroup));
    float *dyg = bbuf + FLOATS(mdl_sgemm_avx2_packed_b_floats(P * igroup)); /* a group's dy */
    float *xp = col;
    const int64_t group = DOT_IMAGES(P);
    int64_t *off = (int64_t *)(xp + group * phase_floats(s));
    if (dot) padded_offsets(s, off);
    for (int64_t b = b0; b < b1; b++) {
        const float beta = b > b0 || add ? 1.0f : 0.0f;
        if (dot) {
            const int64_t nb = b1 - b < group ? b1 - b : group;
            for (int64_t q = 0; q < nb; q++)
                phase_image(s, x + (b + q) * image, in, xp + q * phase_floats(s));
            (avx512 ? mdl_conv_weights_dot_avx512 : mdl_conv_weights_dot_avx2)(
                c_out, nk, g->ho, g->wo, phases_of(s).cols, nb, phase_floats(s),
                dy + b * c_out * P, xp, off + k0, beta == 0.0f, c, ldc);
            b += nb - 1;
            continue;
        }
        if (igroup > 1) { /* the group's column matrices and dy side by side */
            const int64_t nb = b1 - b < igroup ? b1 - b : igroup, gp = nb * P;
            for (int64_t q = 0; q < nb; q++)
                mdl_conv_im2col_avx2(s, g->ho, g->wo, input_image(s, x, b + q, in, end),
                                     col + q * P, gp, k0, k1);
            chunk_gather(g, c_out, nb, dy + b * c_out * P, dyg); /* one thread here */
            mdl_sgemm_avx2_pack_a(0, c_out, gp, 1.0f, dyg, gp, pa);
            mdl_sgemm_avx2_packed(1, c_out, nk, gp, pa, col, gp, beta, c, ldc, NULL, bbuf);
            b += nb - 1;
            continue;
        }
        const float *src = input_image(s, x, b, in, end);
        if (g->pointwise) { /* the image is its own column matrix */
            src += k0 * P;
        } else {
            mdl_conv_im2col_avx2(s, g->ho, g->wo, src, col, P, k0, k1);
            src = col;
        }
        mdl_sgemm_avx2_pack_a(0, c_out, P, 1.0f, dy + b * c_out * P, P, pa);
        mdl_sgemm_avx2_packed(1, c_out, nk, P, pa, src, P, beta, c, ldc, NULL, bbuf);
    }
}
#endif

/* dw (c_out, K) = or += sum over images of dy[b] (c_out, P) @ col(x[b])^T
 * (weights_images).  With more than WEIGHTS_COLUMNS_MAX_IMAGES images a thread: each
 * thread sums its share of the images into its own partial dw, then the partials are
 * added to dw in thread order.  With fewer (or one thread): each thread takes all the
 * images for a share of dw's columns, in dw itself, and each value is the same on any
 * number of threads.  Or by Winograd, where the forward uses winograd_avx512.c. */
static void weights_per_image(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                              const mdl_affine *in, const float *dy, float *dw, int accumulate,
                              float *ws, size_t avail)
{
#if MDL_X86
    const int64_t c_out = s->c_out, K = g->K;
    const size_t stride = g->per_thread / sizeof(float);
    const int wino = use_winograd(s, g->wo, 1);
    if (wino == WINO_CHANNELS || wino == WINO_CHANNELS8) {
        weights_winograd(s, g, x, in, dy, dw, accumulate, ws, stride, weights_threads(s, g, avail),
                         wino == WINO_CHANNELS, NULL);
        return;
    }
    int nt = mdl_threads_for((double)s->n * c_out * K * g->P);
    const int by_images = nt > 1 && s->n > WEIGHTS_COLUMNS_MAX_IMAGES * nt;
    if ((size_t)nt > avail / g->per_thread) nt = (int)(avail / g->per_thread);
    /* by columns: in whole units of WEIGHTS_COLUMN_UNIT */
    const int64_t units = (K + WEIGHTS_COLUMN_UNIT - 1) / WEIGHTS_COLUMN_UNIT;
    if (!by_images && nt > units) nt = (int)units;
    if (nt < 1) nt = 1;
#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        /* this thread's partial dw (by images), then weights_images' buffers */
        float *part = ws + t * stride, *buf = part + FLOATS(c_out * K), *end = ws + (t + 1) * stride;
        if (!by_images || T == 1) {
            const int64_t k0 = min64(K, units * t / T * WEIGHTS_COLUMN_UNIT),
                          k1 = min64(K, units * (t + 1) / T * WEIGHTS_COLUMN_UNIT);
            if (k0 < k1)
                weights_images(s, g, x, in, dy, 0, s->n, k0, k1, accumulate, dw + k0, K, buf,
                               end);
        } else {
            const int64_t b0 = s->n * t / T, b1 = s->n * (t + 1) / T;
            weights_images(s, g, x, in, dy, b0, b1, 0, K, 0, part, K, buf, end);
#pragma omp barrier
            /* dw = (dw +) part_0 + part_1 + ..., each thread a share of the elements */
            const int64_t total = c_out * K, lo = total * t / T, hi = total * (t + 1) / T;
            for (int64_t e = lo; e < hi; e++) {
                float acc = accumulate ? dw[e] : 0.0f;
                for (int u = 0; u < T; u++) acc += ws[u * stride + e];
                dw[e] = acc;
            }
        }
    }
#else
    (void)s, (void)g, (void)x, (void)in, (void)dy, (void)dw, (void)accumulate, (void)ws;
    (void)avail;
#endif
}

/* channel_sum[c] and channel_sumsq[c] = the per-image sums (n, 2, c_out) added
 * over the images in order (either output may be NULL) */
static void add_image_sums(int64_t n, int64_t c_out, const double *sums, double *channel_sum,
                           double *channel_sumsq)
{
    for (int64_t c = 0; c < c_out; c++) {
        double a = 0.0, q = 0.0;
        for (int64_t b = 0; b < n; b++) {
            a += sums[b * 2 * c_out + c];
            q += sums[b * 2 * c_out + c_out + c];
        }
        if (channel_sum) channel_sum[c] = a;
        if (channel_sumsq) channel_sumsq[c] = q;
    }
}

/* The scalar and dense paths' epilogue: max(y, 0) (NaN passes, as in the SIMD kernels)
 * and the channel sums in float64, each channel's over the images and pixels in order,
 * swept in memory order (a channel's planes lie c_out P floats apart) */
static void epilogue_scalar(const mdl_conv2d_shape *s, int64_t P, int relu, double *channel_sum,
                            double *channel_sumsq, float *y)
{
    const int64_t c_out = s->c_out, all = s->n * c_out * P;
    if (relu)
        for (int64_t i = 0; i < all; i++) y[i] = y[i] < 0.0f ? 0.0f : y[i];
    if (!channel_sum && !channel_sumsq) return;
    for (int64_t c = 0; c < c_out; c++) {
        if (channel_sum) channel_sum[c] = 0.0;
        if (channel_sumsq) channel_sumsq[c] = 0.0;
    }
    for (int64_t b = 0; b < s->n; b++)
        for (int64_t c = 0; c < c_out; c++) {
            const float *yp = y + (b * c_out + c) * P;
            double a = channel_sum ? channel_sum[c] : 0.0;
            double q = channel_sumsq ? channel_sumsq[c] : 0.0;
            for (int64_t p = 0; p < P; p++) {
                a += yp[p];
                q += (double)yp[p] * yp[p];
            }
            if (channel_sum) channel_sum[c] = a;
            if (channel_sumsq) channel_sumsq[c] = q;
        }
}

/* ---- tiny images: one SGEMM with the dense weights (dense_path) ------------------------ */

/* The tap of w linking input pixel pi to output pixel po (on the dense path, every
 * pair has one) */
static int64_t dense_tap(const mdl_conv2d_shape *s, int64_t wo, int64_t po, int64_t pi)
{
    return (pi / s->w - po / wo * s->stride_h + s->pad_h) * s->kw +
           pi % s->w - po % wo * s->stride_w + s->pad_w;
}

/* wd (c_out ho wo, c_in h w): row (co, po), column (ci, pi) holds w[co, ci, tap] */
static void dense_weights(const mdl_conv2d_shape *s, const conv_geom *g, const float *w, float *wd)
{
    const int64_t hw = s->h * s->w, cols = s->c_in * hw, kk = s->kh * s->kw;
    const int nt = mdl_threads_for((double)s->c_out * g->P * cols);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t co = 0; co < s->c_out; co++)
        for (int64_t po = 0; po < g->P; po++) {
            int64_t tap[hw]; /* hw < kh kw */
            for (int64_t pi = 0; pi < hw; pi++) tap[pi] = dense_tap(s, g->wo, po, pi);
            float *row = wd + (co * g->P + po) * cols;
            const float *wc = w + co * s->c_in * kk;
            for (int64_t ci = 0; ci < s->c_in; ci++, row += hw, wc += kk)
                for (int64_t pi = 0; pi < hw; pi++) row[pi] = wc[tap[pi]];
        }
}

/* x read through the map in, into xm; x itself without a map */
static const float *dense_input(const mdl_conv2d_shape *s, const float *x, const mdl_affine *in,
                                float *xm)
{
    if (!in) return x;
    const int64_t hw = s->h * s->w;
    for (int64_t r = 0; r < s->n * s->c_in; r++) {
        const mdl_affine_ch f = mdl_affine_at(in, r % s->c_in);
        for (int64_t p = 0; p < hw; p++) xm[r * hw + p] = mdl_affine_apply(x[r * hw + p], f);
    }
    return xm;
}

/* The workspace of the dense path: the dense weights, the mapped input, the output
 * before pooling, the SGEMMs' workspace */
typedef struct dense_ws {
    float *wd, *xm, *out;
    void *gemm;
    size_t gemm_bytes;
} dense_ws;

static dense_ws dense_layout(const mdl_conv2d_shape *s, const conv_geom *g, float *ws)
{
    const int64_t rows = s->c_out * g->P, cols = s->c_in * s->h * s->w;
    dense_ws d;
    d.wd = ws;
    d.xm = d.wd + FLOATS(rows * cols);
    d.out = d.xm + FLOATS(s->n * cols);
    d.gemm = d.out + FLOATS(s->n * rows);
    d.gemm_bytes = g->dense_bytes - (size_t)((float *)d.gemm - ws) * sizeof(float);
    return d;
}

static mdl_status dense_forward(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                                const mdl_affine *in, const float *w, const float *bias, int relu,
                                double *channel_sum, double *channel_sumsq, const pooling *pl,
                                float *y, float *ws)
{
    const int64_t rows = s->c_out * g->P, cols = s->c_in * s->h * s->w;
    const dense_ws d = dense_layout(s, g, ws);
    dense_weights(s, g, w, d.wd);
    const float *xa = dense_input(s, x, in, d.xm);
    float *o = pl ? d.out : y;
    if (bias)
        for (int64_t r = 0; r < s->n * s->c_out; r++)
            for (int64_t p = 0; p < g->P; p++) o[r * g->P + p] = bias[r % s->c_out];
    mdl_status st = mdl_sgemm(0, 1, s->n, rows, cols, 1.0f, xa, cols, d.wd, cols,
                              bias ? 1.0f : 0.0f, o, rows, d.gemm, d.gemm_bytes);
    if (st != MDL_OK) return st;
    if (relu || channel_sum || channel_sumsq)
        epilogue_scalar(s, g->P, relu, channel_sum, channel_sumsq, o);
    if (pl) mdl_pool_planes(&pl->g, pl->avg, pl->relu, s->n * s->c_out, o, y);
    return MDL_OK;
}

static mdl_status dense_backward_data(const mdl_conv2d_shape *s, const conv_geom *g,
                                      const float *dy, const float *w, float *dx, int accumulate,
                                      float *ws)
{
    const int64_t rows = s->c_out * g->P, cols = s->c_in * s->h * s->w;
    const dense_ws d = dense_layout(s, g, ws);
    dense_weights(s, g, w, d.wd);
    return mdl_sgemm(0, 0, s->n, cols, rows, 1.0f, dy, rows, d.wd, cols, accumulate ? 1.0f : 0.0f,
                     dx, cols, d.gemm, d.gemm_bytes);
}

/* dW = dy^T @ in(x) (c_out ho wo, c_in h w), then dw (c_out, c_in, kh, kw) = or += the
 * sum of dW over the pixel pairs of each tap */
static mdl_status dense_backward_weights(const mdl_conv2d_shape *s, const conv_geom *g,
                                         const float *x, const mdl_affine *in, const float *dy,
                                         float *dw, int accumulate, float *ws)
{
    const int64_t hw = s->h * s->w, rows = s->c_out * g->P, cols = s->c_in * hw, kk = s->kh * s->kw;
    const dense_ws d = dense_layout(s, g, ws);
    mdl_status st = mdl_sgemm(1, 0, rows, cols, s->n, 1.0f, dy, rows, dense_input(s, x, in, d.xm),
                              cols, 0.0f, d.wd, cols, d.gemm, d.gemm_bytes);
    if (st != MDL_OK) return st;
#pragma omp parallel for schedule(static) num_threads(mdl_threads_for((double)rows * cols))
    for (int64_t co = 0; co < s->c_out; co++) {
        float *dwc = dw + co * s->c_in * kk;
        if (!accumulate) memset(dwc, 0, (size_t)(s->c_in * kk) * sizeof(float));
        for (int64_t po = 0; po < g->P; po++) {
            int64_t tap[hw];
            for (int64_t pi = 0; pi < hw; pi++) tap[pi] = dense_tap(s, g->wo, po, pi);
            const float *row = d.wd + (co * g->P + po) * cols;
            float *dc = dwc;
            for (int64_t ci = 0; ci < s->c_in; ci++, row += hw, dc += kk)
                for (int64_t pi = 0; pi < hw; pi++) dc[tap[pi]] += row[pi];
        }
    }
    return MDL_OK;
}

/* dw on the batched path's shapes, by taps: for each chunk of images, x (through its
 * map) and dy with the batch innermost; tap (i, j)'s gradient is dy's columns of the
 * output pixels whose window holds the tap inside the image @ x's columns under it,
 * transposed: one SGEMM (c_out x c_in, K = pixels x images) per run of columns (the
 * rectangle's rows, or all of it when it spans whole rows), added up in the tap-major
 * dwt, then moved into dw.  No padding is multiplied, and each SGEMM has a long K. */
static mdl_status batch_weights(const mdl_conv2d_shape *s, const conv_geom *g, const float *x,
                                const mdl_affine *in, const float *dy, float *dw, int accumulate,
                                float *ws)
{
    const int64_t hw = s->h * s->w, P = g->P, kk = s->kh * s->kw, cc = s->c_out * s->c_in;
    const int64_t nbw = batch_w_images(s, P);
    float *xb = ws, *dyb = xb + FLOATS(s->c_in * hw * nbw), *dwt = dyb + FLOATS(s->c_out * P * nbw);
    float *gws = dwt + FLOATS(cc * kk);
    const size_t gbytes = g->batch_w_bytes - (size_t)(gws - ws) * sizeof(float);
    const int nt = mdl_threads_for((double)(s->c_in * hw + s->c_out * P) * nbw);
    mdl_status st = MDL_OK;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += nbw) {
        const int64_t nb = s->n - b < nbw ? s->n - b : nbw;
#pragma omp parallel num_threads(nt)
        {
            int t, T;
            MDL_THREAD_ID(t, T);
            batch_planes(s->c_in, hw, x + b * s->c_in * hw, nb, nb, in, s->c_in * t / T,
                         s->c_in * (t + 1) / T, xb);
            batch_planes(s->c_out, P, dy + b * s->c_out * P, nb, nb, NULL, s->c_out * t / T,
                         s->c_out * (t + 1) / T, dyb);
        }
        for (int64_t i = 0; i < s->kh && st == MDL_OK; i++)
            for (int64_t j = 0; j < s->kw && st == MDL_OK; j++) {
                int64_t r[4], runs;
                const int64_t len = tap_rect(s, g->ho, g->wo, i, j, r, &runs) * nb;
                float *c = dwt + (i * s->kw + j) * cc;
                if (!len) { /* no output's window holds the tap */
                    if (b == 0) memset(c, 0, (size_t)cc * sizeof(float));
                    continue;
                }
                for (int64_t y = r[0]; y < r[0] + runs && st == MDL_OK; y++)
                    st = mdl_sgemm(0, 1, s->c_out, s->c_in, len, 1.0f,
                                   dyb + (y * g->wo + r[2]) * nb, P * nb,
                                   xb + ((y + i - s->pad_h) * s->w + r[2] + j - s->pad_w) * nb,
                                   hw * nb, b == 0 && y == r[0] ? 0.0f : 1.0f, c, s->c_in, gws,
                                   gbytes);
            }
    }
    if (st != MDL_OK) return st;
#pragma omp parallel for schedule(static) num_threads(mdl_threads_for((double)cc * kk))
    for (int64_t co = 0; co < s->c_out; co++)
        for (int64_t ci = 0; ci < s->c_in; ci++) {
            float *d = dw + (co * s->c_in + ci) * kk;
            for (int64_t q = 0; q < kk; q++)
                d[q] = (accumulate ? d[q] : 0.0f) + dwt[q * cc + co * s->c_in + ci];
        }
    return MDL_OK;
}

/* ---- public entry points ------------------------------------------------------------ */

/* y (n, c_out, ho, wo) = conv(in(x) (n, c_in, h, w), w (c_out, c_in, kh, kw)) + bias (c_out
 * or NULL), then the epilogue: max(y, 0) when relu, and the channel sums of the final y;
 * with a pooling (pool not NULL, then no sums), y is the pooling of that */
static mdl_status forward(const char *fn, const mdl_conv2d_shape *s, const float *x,
                          const mdl_affine *in, const float *w, const float *bias, int relu,
                          double *channel_sum, double *channel_sumsq, const mdl_pool2d_shape *pool,
                          int pool_avg, int pool_relu, float *y, void *workspace,
                          size_t workspace_bytes)
{
    conv_geom g;
    pooling pl = {.avg = pool_avg, .relu = pool_relu};
    mdl_status st = pool ? pooled_geometry(fn, s, pool, &g, &pl.g) : geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, w);
    MDL_CHECK_PTR_FN(fn, y);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    size_t avail;
    st = take_workspace(fn, &g, fast, workspace, workspace_bytes, &owned, &ws, &avail);
    if (st != MDL_OK) return st;
    if (!fast) {
        float *out = y;
        if (pool && !(out = mdl_alloc((size_t)(s->n * s->c_out * g.P) * sizeof(float))))
            return mdl_error(MDL_ERR_ALLOC, "%s: no memory for the convolution's output", fn);
        forward_scalar(s, g.ho, g.wo, x, in, w, bias, out);
        if (relu || channel_sum || channel_sumsq)
            epilogue_scalar(s, g.P, relu, channel_sum, channel_sumsq, out);
        if (pool) {
            mdl_pool_planes(&pl.g, pool_avg, pool_relu, s->n * s->c_out, out, y);
            mdl_free(out);
        }
        return MDL_OK;
    }
    if (g.dense) {
        st = dense_forward(s, &g, x, in, w, bias, relu, channel_sum, channel_sumsq,
                           pool ? &pl : NULL, y, ws);
        mdl_workspace_done(owned);
        return st;
    }
    /* the per-image channel sums (n, 2, c_out), then the packed weights */
    double *sums = (double *)ws;
    float *pa = ws + SUMS_FLOATS(s);
    const int want_sums = channel_sum || channel_sumsq;
    int wino = use_winograd(s, g.wo, 0);
    const int nt = mdl_threads_for((double)s->n * s->c_out * g.K * g.P);
    /* where each image's rows are shared by the threads, the weights read as they are
     * (one pass over them, where packing took two: 41% of one image's call at 512
     * channels and 4x4) */
    const int unpacked = splits_rows(s, &g, wino, split_threads(&g, avail, nt));
    if (!unpacked) pack_weights(s, &g, wino, w, pa);
#if MDL_X86
    if (wino_sums_algo(wino))
        st = winograd_sums(s, &g, x, in, pa, pa + weights_floats(s, g.K) + TABLE_FLOATS(g.K),
                           bias, relu, want_sums ? sums : NULL, pool ? &pl : NULL, 0.0f, y, ws,
                           avail, nt, wino == WINO_SUMS);
    else
#endif
        per_image(s, &g, x, in, wino, pa, unpacked ? w : NULL, bias, relu,
                  want_sums ? sums : NULL, pool ? &pl : NULL, 0.0f, y, ws, avail, nt);
    if (want_sums && st == MDL_OK) add_image_sums(s->n, s->c_out, sums, channel_sum, channel_sumsq);
    mdl_workspace_done(owned);
    return st;
}

mdl_status mdl_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w,
                              const float *bias, float *y, void *workspace, size_t workspace_bytes)
{
    return forward(__func__, s, x, NULL, w, bias, 0, NULL, NULL, NULL, 0, 0, y, workspace,
                   workspace_bytes);
}

mdl_status mdl_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x, const float *w,
                                 const float *bias, int relu, double *channel_sum,
                                 double *channel_sumsq, float *y, void *workspace,
                                 size_t workspace_bytes)
{
    return forward(__func__, s, x, NULL, w, bias, relu, channel_sum, channel_sumsq, NULL, 0, 0, y,
                   workspace, workspace_bytes);
}

mdl_status mdl_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                    const mdl_affine *in, const float *w, const float *bias,
                                    int relu, double *channel_sum, double *channel_sumsq,
                                    float *y, void *workspace, size_t workspace_bytes)
{
    return forward(__func__, s, x, in, w, bias, relu, channel_sum, channel_sumsq, NULL, 0, 0, y,
                   workspace, workspace_bytes);
}

mdl_status mdl_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x, const float *w,
                                     const float *bias, int relu, const mdl_pool2d_shape *pool,
                                     mdl_pool_kind pool_kind, int pool_relu, float *y,
                                     void *workspace, size_t workspace_bytes)
{
    const char *fn = __func__;
    MDL_CHECK(pool_kind == MDL_POOL_MAX || pool_kind == MDL_POOL_AVG,
              "%s: pool_kind must be MDL_POOL_MAX or MDL_POOL_AVG, got %d", fn, (int)pool_kind);
    MDL_CHECK_PTR(pool);
    return forward(fn, s, x, NULL, w, bias, relu, NULL, NULL, pool, pool_kind == MDL_POOL_AVG,
                   pool_relu, y, workspace, workspace_bytes);
}

/* dx by phases (data_phases_of): the threads take whole images; each pads its image
 * of dy, runs every phase's GEMM into its buffer, then interleaves the phases into
 * dx (overwritten, or added to: accumulate). */
static void backward_data_phases(const mdl_conv2d_shape *s, const conv_geom *g, const float *dy,
                                 const float *w, float *dx, int accumulate, float *ws,
                                 size_t avail)
{
#if MDL_X86
    data_phases d;
    data_phases_of(s, g, &d);
    const int64_t c_in = s->c_in, c_out = s->c_out, kh = s->kh, kw = s->kw;
    const int64_t dplane = d.drows * d.dcols, image = c_in * s->h * s->w;
    const int avx512 = mdl_use_avx512();
    /* shared: each phase's weights (c_in, K) gathered, then packed; the offset tables */
    float *dense = ws, *pa[PHASE_MAX_STRIDE][PHASE_MAX_STRIDE];
    int64_t *table = (int64_t *)(dense + FLOATS(c_in * c_out * kh * kw));
    int64_t *off[PHASE_MAX_STRIDE][PHASE_MAX_STRIDE], at[PHASE_MAX_STRIDE][PHASE_MAX_STRIDE];
    float *next = (float *)table + TABLE_FLOATS(c_out * kh * kw);
    int64_t *tnext = table, out = 0; /* at: where each phase's output starts in a buffer */
    for (int64_t a = 0; a < d.sh; a++)
        for (int64_t b = 0; b < d.sw; b++) {
            const int64_t th = d.taps_h[a], tw = d.taps_w[b], K = PHASE_K(s, &d, a, b);
            at[a][b] = out;
            out += c_in * PHASE_P(&d, a, b);
            off[a][b] = tnext;
            pa[a][b] = next;
            for (int64_t k = 0; k < K; k++) { /* k = (co, t, u): tap (a + sh t, b + sw u) */
                const int64_t co = k / (th * tw), t = k / tw % th, u = k % tw;
                tnext[k] = co * dplane + (d.pt - t) * d.dcols + d.pl - u;
                for (int64_t ci = 0; ci < c_in; ci++)
                    dense[ci * K + k] = w[((co * c_in + ci) * kh + a + d.sh * t) * kw + b + d.sw * u];
            }
            tnext += K;
            if (K == 0) continue;
            if (avx512) mdl_sgemm_avx512_rows_pack_a(c_in, K, dense, K, next);
            else mdl_sgemm_avx2_pack_a(0, c_in, K, 1.0f, dense, K, next);
            next += max_size(FLOATS(mdl_sgemm_avx2_packed_a_floats(c_in, K)),
                             FLOATS(mdl_sgemm_avx512_rows_a_floats(c_in, K)));
        }
    /* dy padded: its planes are the interior of drows x dcols ones (a stride-1 shape's
     * phase plane, which phase_image fills) */
    const mdl_conv2d_shape pad = {.n = 1, .c_in = c_out, .h = g->ho, .w = g->wo, .c_out = 1,
                                  .kh = 1, .kw = 1, .stride_h = 1, .stride_w = 1,
                                  .pad_h = d.pt, .pad_w = d.pl};
    const size_t fit = avail > g->fixed ? (avail - g->fixed) / g->per_thread : 1;
    int nt = mdl_threads_for((double)s->n * c_in * c_out * kh * kw * g->P);
    if (nt > s->n) nt = (int)s->n;
    if ((size_t)nt > fit) nt = (int)fit;
    if (nt < 1) nt = 1;
#pragma omp parallel num_threads(nt)
    {
        int t, T;
        MDL_THREAD_ID(t, T);
        (void)T;
        float *dyp = ws + g->fixed / sizeof(float) + t * (g->per_thread / sizeof(float));
        float *buf = dyp + FLOATS(c_out * dplane);
        for (int64_t a = 0; a < d.sh; a++) /* phases without taps stay zero */
            for (int64_t b = 0; b < d.sw; b++)
                if (!d.taps_h[a] || !d.taps_w[b])
                    memset(buf + at[a][b], 0, (size_t)(c_in * PHASE_P(&d, a, b)) * sizeof(float));
        /* images handed out one at a time (see per_image) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t n = 0; n < s->n; n++) {
            const float *dyn = dy + n * c_out * g->P; /* padded, or as it is if it needs none */
            if (dplane != g->P) {
                mdl_conv_phase_image_avx2(&pad, 1, 1, d.drows, d.dcols, dyn, NULL, dyp);
                dyn = dyp;
            }
            for (int64_t a = 0; a < d.sh; a++)
                for (int64_t b = 0; b < d.sw; b++) {
                    const int64_t K = PHASE_K(s, &d, a, b), cols = d.cols[b], P = PHASE_P(&d, a, b);
                    if (K == 0) continue;
                    /* the phase's first pixel reads dy's padded plane from here */
                    const float *base = dyn + (d.first_h[a] + s->pad_h) / d.sh * d.dcols +
                                        (d.first_w[b] + s->pad_w) / d.sw;
                    (avx512 ? mdl_sgemm_avx512_packed_image : mdl_sgemm_avx2_packed_image)(
                        c_in, K, pa[a][b], base, cols, d.dcols, P, off[a][b], 0.0f,
                        buf + at[a][b], P, NULL);
                }
            float *dxn = dx + n * image;
            for (int64_t ci = 0; ci < c_in; ci++)
                for (int64_t ih = 0; ih < s->h; ih++) {
                    const int64_t a = (ih + s->pad_h) % d.sh, y = (ih - d.first_h[a]) / d.sh;
                    const float *row[PHASE_MAX_STRIDE]; /* column j + sw x is row[j][x] */
                    for (int64_t j = 0; j < d.sw && j < s->w; j++) {
                        const int64_t b = (j + s->pad_w) % d.sw;
                        row[j] = buf + at[a][b] + (ci * d.rows[a] + y) * d.cols[b];
                    }
                    mdl_conv_interleave_row_avx2(d.sw, row, s->w, dxn + (ci * s->h + ih) * s->w,
                                                 accumulate);
                }
        }
    }
#else
    (void)s, (void)g, (void)dy, (void)w, (void)dx, (void)accumulate, (void)ws, (void)avail;
#endif
}

/* dx (n, c_in, h, w) = (or +=, accumulate) conv_transpose(dy (n, c_out, ho, wo), w) */
static mdl_status backward_data(const char *fn, const mdl_conv2d_shape *s, const float *dy,
                                const float *w, float *dx, int accumulate, void *workspace,
                                size_t workspace_bytes)
{
    conv_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR_FN(fn, dy);
    MDL_CHECK_PTR_FN(fn, w);
    MDL_CHECK_PTR_FN(fn, dx);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    size_t avail;
    st = take_workspace(fn, &g, fast, workspace, workspace_bytes, &owned, &ws, &avail);
    if (st != MDL_OK) return st;
    if (!fast) {
        backward_data_scalar(s, g.ho, g.wo, dy, w, dx, accumulate);
        return MDL_OK;
    }
    if (g.dense) {
        st = dense_backward_data(s, &g, dy, w, dx, accumulate, ws);
        mdl_workspace_done(owned);
        return st;
    }
    const float beta = accumulate ? 1.0f : 0.0f;
    const int64_t c_out = s->c_out, K = g.K, P = g.P, image = s->c_in * s->h * s->w;
    mdl_conv2d_shape t;
    if (transposed_shape(s, &g, &t)) { /* dx = conv(dy, flipped w), one image at a time */
        conv_geom gt;
        geometry(fn, &t, &gt);
        gt.fixed = g.fixed; /* the workspace layout is this op's, sized for both */
        gt.per_thread = g.per_thread;
        const int64_t Kt = gt.K;
        float *wf = ws, *pa = wf + FLOATS(s->c_in * Kt);
        int wino = use_winograd(&t, s->w, 0);
        if (accumulate && wino == WINO_TILES) wino = GEMM; /* F(2x2) overwrites */
        if (!wino && !avx512_rows(&t, &gt)) { /* flipped as they are packed */
            mdl_sgemm_avx2_pack_flipped_weights(s->c_in, s->c_out, s->kh * s->kw, w, pa);
        } else {
            flip_weights(s, w, wf);
            pack_weights(&t, &gt, wino, wf, pa);
        }
        const int nt = mdl_threads_for((double)s->n * s->c_in * Kt * gt.P);
#if MDL_X86
        if (wino_sums_algo(wino))
            st = winograd_sums(&t, &gt, dy, NULL, pa,
                               pa + weights_floats(&t, Kt) + TABLE_FLOATS(Kt), NULL, 0, NULL,
                               NULL, beta, dx, ws, avail, nt, wino == WINO_SUMS);
        else
#endif
            per_image(&t, &gt, dy, NULL, wino, pa, NULL, NULL, 0, NULL, NULL, beta, dx, ws, avail,
                      nt);
        mdl_workspace_done(owned);
        return st;
    }
    if (g.phase_data) {
        backward_data_phases(s, &g, dy, w, dx, accumulate, ws, avail);
        mdl_workspace_done(owned);
        return MDL_OK;
    }
    float *colbuf = ws, *outbuf = ws + g.col_floats, *gemm_ws = outbuf + g.out_floats;
    for (int64_t b = 0; b < s->n && st == MDL_OK; b += g.B) {
        const int64_t nb = s->n - b < g.B ? s->n - b : g.B;
        const float *dyb = dy + b * c_out * P;
        if (g.pointwise) { /* dx = W^T @ dy directly */
            st = mdl_sgemm(1, 0, K, P, c_out, 1.0f, w, K, dyb, P, beta, dx + b * image, P,
                           gemm_ws, g.gemm_bytes);
            continue;
        }
        chunk_gather(&g, c_out, nb, dyb, outbuf);
        st = mdl_sgemm(1, 0, K, nb * P, c_out, 1.0f, w, K, outbuf, nb * P, 0.0f, colbuf, nb * P,
                       gemm_ws, g.gemm_bytes);
        if (st == MDL_OK) col2im(s, &g, colbuf, nb, dx + b * image, accumulate);
    }
    mdl_workspace_done(owned);
    return st;
}

mdl_status mdl_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy, const float *w,
                                    float *dx, void *workspace, size_t workspace_bytes)
{
    return backward_data(__func__, s, dy, w, dx, 0, workspace, workspace_bytes);
}

mdl_status mdl_conv2d_backward_data_fused(const mdl_conv2d_shape *s, const float *dy,
                                          const float *w, float *dx, int accumulate,
                                          void *workspace, size_t workspace_bytes)
{
    return backward_data(__func__, s, dy, w, dx, accumulate, workspace, workspace_bytes);
}

/* dw (c_out, c_in, kh, kw) = or += sum over images of dy[b] (c_out, P) @ col[b]^T (P, K),
 * col[b] the column matrix of image b read through the map in; with dx (not NULL), the
 * data gradient first (backward_data), or both at once where backward_winograd applies */
static mdl_status backward_weights(const char *fn, const mdl_conv2d_shape *s, const float *x,
                                   const mdl_affine *in, const float *dy, float *dw,
                                   int accumulate, void *workspace, size_t workspace_bytes,
                                   const float *w, float *dx, int accumulate_dx)
{
    conv_geom g;
    mdl_status st = geometry(fn, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, in, "in");
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, dy);
    MDL_CHECK_PTR_FN(fn, dw);
    if (dx) MDL_CHECK_PTR_FN(fn, w);
    int fast = mdl_use_avx2();
    void *owned;
    float *ws;
    size_t avail;
    st = take_workspace(fn, &g, fast, workspace, workspace_bytes, &owned, &ws, &avail);
    if (st != MDL_OK) return st;
#if MDL_X86
    if (fast && dx &&
        backward_winograd(s, &g, x, in, dy, w, dx, accumulate_dx, dw, accumulate, ws, avail)) {
        mdl_workspace_done(owned);
        return MDL_OK;
    }
#endif
    /* the data gradient alone, in the workspace taken above (its need is part of g's) */
    if (dx && (st = backward_data(fn, s, dy, w, dx, accumulate_dx, owned ? (void *)ws : workspace,
                                  owned ? avail + MDL_WS_SLACK : workspace_bytes)) != MDL_OK) {
        mdl_workspace_done(owned);
        return st;
    }
    if (!fast) {
        backward_weights_scalar(s, g.ho, g.wo, x, in, dy, dw, accumulate != 0);
        return MDL_OK;
    }
    const int wino = use_winograd(s, g.wo, 1);
    if (g.dense)
        st = dense_backward_weights(s, &g, x, in, dy, dw, accumulate, ws);
#if MDL_X86
    else if (wino_sums_algo(wino))
        st = weights_winograd_sums(s, &g, x, in, dy, dw, accumulate, ws, avail,
                                   mdl_threads_for((double)s->n * s->c_out * g.K * g.P),
                                   wino == WINO_SUMS);
#endif
    else if (g.batch_w_bytes && wino == GEMM)
        st = batch_weights(s, &g, x, in, dy, dw, accumulate, ws);
    else
        weights_per_image(s, &g, x, in, dy, dw, accumulate, ws, avail);
    mdl_workspace_done(owned);
    return st;
}

mdl_status mdl_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x, const float *dy,
                                       float *dw, int accumulate, void *workspace,
                                       size_t workspace_bytes)
{
    return backward_weights(__func__, s, x, NULL, dy, dw, accumulate, workspace, workspace_bytes,
                            NULL, NULL, 0);
}

mdl_status mdl_conv2d_backward_weights_fused(const mdl_conv2d_shape *s, const float *x,
                                             const mdl_affine *in, const float *dy, float *dw,
                                             int accumulate, void *workspace,
                                             size_t workspace_bytes)
{
    return backward_weights(__func__, s, x, in, dy, dw, accumulate, workspace, workspace_bytes,
                            NULL, NULL, 0);
}

mdl_status mdl_conv2d_backward(const mdl_conv2d_shape *s, const float *x, const mdl_affine *in,
                               const float *dy, const float *w, float *dx, int accumulate_dx,
                               float *dw, int accumulate_dw, void *workspace,
                               size_t workspace_bytes)
{
    return backward_weights(__func__, s, x, in, dy, dw, accumulate_dw, workspace,
                            workspace_bytes, w, dx, accumulate_dx);
}

/* db (c_out) = or += sum of dy (n, c_out, ho, wo) over n, ho, wo */
mdl_status mdl_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy, float *db,
                                    int accumulate)
{
    conv_geom g;
    mdl_status st = geometry(__func__, s, &g);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(db);
    const int64_t c_out = s->c_out, P = g.P;
    int avx2 = mdl_use_avx2();
    int nt = mdl_threads_for((double)s->n * c_out * P);
    if (nt > c_out) nt = (int)c_out;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t co = 0; co < c_out; co++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < s->n; b++) {
            const float *p = dy + (b * c_out + co) * P;
            acc += avx2 ? mdl_conv_sum_avx2(p, P) : mdl_conv_sum_scalar(p, P);
        }
        db[co] = accumulate ? db[co] + acc : acc;
    }
    return MDL_OK;
}
