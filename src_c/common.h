/* common.h -- internal helpers shared by the kernel files (not installed). */
#ifndef MDL_COMMON_H
#define MDL_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "minidl.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#  define MDL_X86 1
#else
#  define MDL_X86 0
#endif

/* Record `status` with a printf-style message for mdl_last_error() and
 * return it.  Use as: return mdl_error(MDL_ERR_ARG, "n must be >= 0, got %lld", n); */
mdl_status mdl_error(mdl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Argument checks: return MDL_ERR_ARG with a message from the enclosing function. */
#define MDL_CHECK(cond, ...)                                   \
    do {                                                       \
        if (!(cond)) return mdl_error(MDL_ERR_ARG, __VA_ARGS__); \
    } while (0)
#define MDL_CHECK_PTR(p) MDL_CHECK((p) != NULL, "%s: %s must not be NULL", __func__, #p)
#define MDL_CHECK_NONNEG(v) \
    MDL_CHECK((v) >= 0, "%s: %s must be >= 0, got %lld", __func__, #v, (long long)(v))
#define MDL_CHECK_POS(v) \
    MDL_CHECK((v) >= 1, "%s: %s must be >= 1, got %lld", __func__, #v, (long long)(v))

/* True when the AVX2+FMA kernels are selected (the AVX2 and the AVX-512 levels). */
int mdl_use_avx2(void);
/* True when the AVX-512 level is selected (the SGEMM has an AVX-512 version). */
int mdl_use_avx512(void);
/* Threads to use for a region doing `work` scalar operations: 1 below the
 * mdl_set_min_parallel_work threshold, else the configured count. */
int mdl_threads_for(double work);
int mdl_num_threads(void);
/* The core's L2 cache in bytes (1 MiB where the system does not say) */
int64_t mdl_l2_bytes(void);
/* Whether the CPU is Intel's (some measured choices differ between its cores and AMD's) */
int mdl_cpu_intel(void);
/* AMD's CPU family (CPUID leaf 1, with the extended family: 0x19 Zen 3 and 4, 0x1a Zen 5),
 * 0 on other CPUs */
int mdl_cpu_amd_family(void);
/* Whether the AVX-512 SGEMM reads op(B) in place for thin C (mdl_set_sgemm_b's mode, or
 * for MDL_SGEMM_B_AUTO whether the CPU is not Intel's) */
int mdl_sgemm_b_in_place(void);

/* This thread's number t and the team's size T inside a parallel region (0 and 1
 * without OpenMP) */
#ifdef _OPENMP
#  include <omp.h>
#  define MDL_THREAD_ID(t, T) ((t) = omp_get_thread_num(), (T) = omp_get_num_threads())
#else
#  define MDL_THREAD_ID(t, T) ((t) = 0, (T) = 1)
#endif

/* A BatchNorm's channel sums from n values shifted by about their mean, k: s1 = sum
 * (x - k) and s2 = sum (x - k)^2, added up in float over a few values (x - k exact for x
 * near k, and the squares the size of the spread), are added to the raw sums in double:
 * sum += s1 + n k, sumsq += s2 + 2 k s1 + n k^2.  The variance sumsq / count - mean^2
 * then loses nothing to the float sums, where sums of x and x^2 in float cancelled in
 * it, a fifth of it lost at a mean 1000 times the standard deviation; the errors of s1
 * enter both terms alike and cancel. */
static inline void mdl_add_shifted_sums(double k, double n, double s1, double s2, double *sum,
                                        double *sumsq)
{
    *sum += s1 + n * k;
    *sumsq += s2 + k * (2.0 * s1 + n * k);
}

/* The size of the pieces that split count units about four to a thread, for loops
 * that hand their work out one piece at a time (schedule(dynamic)): a thread that
 * the machine delays leaves its pieces to the others. */
static inline int64_t mdl_dynamic_chunk(int64_t count, int nt)
{
    const int64_t chunk = (count + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);
    return chunk < 1 ? 1 : chunk;
}

/* The length of the ranges that split count items over nt threads: a multiple of nt
 * ranges, up to four per thread but none shorter than 64K items where that leaves
 * more than one per thread (each range restarts the hardware prefetcher's streams),
 * rounded up to a multiple of 16 (64 bytes of floats). */
static inline int64_t mdl_range_step(int64_t count, int nt)
{
    int64_t k = count / 65536;
    k = k < 4 * nt ? k / nt * nt : 4 * (int64_t)nt;
    if (k < nt) k = nt;
    const int64_t step = (count + k - 1) / k;
    return step <= 16 ? 16 : (step + 15) & ~(int64_t)15;
}

/* Run `body` for ranges [lo, hi) that cover [0, count), handed out one at a time to
 * the threads (mdl_range_step long): a thread that the machine delays leaves its
 * ranges to the others.  `work` (scalar operations in all) decides how many threads
 * (mdl_threads_for); on one, no OpenMP region, which costs about 0.3 us even for one
 * thread (libgomp makes a futex call per region). */
#define MDL_RANGES_LOOP_(count, step, body)                                    \
    for (int64_t lo = 0; lo < (count); lo += (step)) {                         \
        const int64_t hi = (count) - lo < (step) ? (count) : lo + (step);      \
        body;                                                                  \
    }
#define MDL_PARALLEL_RANGES(count, work, body)                                 \
    do {                                                                       \
        const int mdl_nt_ = mdl_threads_for(work);                             \
        const int64_t mdl_step_ = mdl_range_step((count), mdl_nt_);            \
        if (mdl_nt_ == 1) {                                                    \
            MDL_RANGES_LOOP_(count, mdl_step_, body)                           \
        } else {                                                               \
            _Pragma("omp parallel for schedule(dynamic, 1) num_threads(mdl_nt_)") \
            MDL_RANGES_LOOP_(count, mdl_step_, body)                           \
        }                                                                      \
    } while (0)

/* Scratch memory: if `ws` is NULL, take `need` bytes of the library's own workspace
 * (runtime.c) into *owned, which the caller gives back with mdl_workspace_done;
 * otherwise check that ws_bytes >= need (*owned NULL).  The returned pointer is aligned
 * to 64 bytes.  `need` must come from the op's *_workspace_size function, which
 * includes MDL_WS_SLACK. */
#define MDL_WS_SLACK 64
mdl_status mdl_workspace(const char *fn, void *ws, size_t ws_bytes, size_t need,
                         void **owned, float **out);
void mdl_workspace_done(void *owned); /* NULL: nothing */
void *mdl_alloc(size_t bytes); /* 64-byte aligned, NULL on failure */
void mdl_free(void *p);

/* An operand's per-channel map (mdl_affine) for channel ch as plain numbers: the
 * identity for a NULL map or NULL scale and shift */
typedef struct mdl_affine_ch {
    float s, t;
    int relu;
} mdl_affine_ch;

static inline mdl_affine_ch mdl_affine_at(const mdl_affine *f, int64_t ch)
{
    mdl_affine_ch r = {1.0f, 0.0f, 0};
    if (f) {
        if (f->scale) r.s = f->scale[ch], r.t = f->shift[ch];
        r.relu = f->relu != 0;
    }
    return r;
}

/* max(x * s + t, 0) (the max when relu), the ReLU as mdl_relu_forward's: NaN passes */
static inline float mdl_affine_apply(float x, mdl_affine_ch f)
{
    const float v = fmaf(x, f.s, f.t);
    return f.relu && v < 0.0f ? 0.0f : v;
}

#endif /* MDL_COMMON_H */
