/* runtime.c -- status strings, per-thread error messages, thread count, SIMD dispatch. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#  include <sched.h>
#endif
#include "common.h"
#if MDL_X86 && defined(__GNUC__)
#  include <cpuid.h>
#endif

#define MDL_STR2(x) #x
#define MDL_STR(x) MDL_STR2(x)

static _Thread_local char last_error[512];

const char *mdl_version(void)
{
    return MDL_STR(MDL_VERSION_MAJOR) "." MDL_STR(MDL_VERSION_MINOR) "." MDL_STR(MDL_VERSION_PATCH);
}

const char *mdl_status_string(mdl_status status)
{
    switch (status) {
    case MDL_OK: return "ok";
    case MDL_ERR_ARG: return "invalid argument";
    case MDL_ERR_WORKSPACE: return "workspace too small";
    case MDL_ERR_ALLOC: return "out of memory";
    case MDL_ERR_UNSUPPORTED: return "unsupported";
    case MDL_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

const char *mdl_last_error(void) { return last_error; }

mdl_status mdl_error(mdl_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- threads ------------------------------------------------------------ */

static int requested_threads; /* 0: not yet decided */

/* More threads than this is a mistake, not a setting: OpenMP's runtime keeps some of
 * its per-thread state on the stack and crashes with many thousands */
#define MAX_THREADS 4096

static int default_threads(void)
{
    const char *env = getenv("MINIDL_NUM_THREADS");
    if (env && *env) {
        char *end;
        long n = strtol(env, &end, 10);
        if (*end == '\0' && n >= 1 && n <= MAX_THREADS) return (int)n;
    }
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n;
    }
#endif
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

mdl_status mdl_set_num_threads(int n)
{
    if (n < 0 || n > MAX_THREADS)
        return mdl_error(MDL_ERR_ARG, "mdl_set_num_threads: n must be in [0, %d], got %d",
                         MAX_THREADS, n);
    __atomic_store_n(&requested_threads, n == 0 ? default_threads() : n, __ATOMIC_RELAXED);
    return MDL_OK;
}

int mdl_num_threads(void)
{
    int n = __atomic_load_n(&requested_threads, __ATOMIC_RELAXED);
    if (n == 0) {
        n = default_threads();
        __atomic_store_n(&requested_threads, n, __ATOMIC_RELAXED);
    }
#ifndef _OPENMP
    n = 1;
#endif
    return n;
}

int mdl_get_num_threads(void) { return mdl_num_threads(); }

static int64_t min_parallel_work = 65536;

mdl_status mdl_set_min_parallel_work(int64_t work)
{
    if (work < 0)
        return mdl_error(MDL_ERR_ARG, "mdl_set_min_parallel_work: work must be >= 0, got %lld",
                         (long long)work);
    __atomic_store_n(&min_parallel_work, work, __ATOMIC_RELAXED);
    return MDL_OK;
}

int mdl_threads_for(double work)
{
    return work < (double)__atomic_load_n(&min_parallel_work, __ATOMIC_RELAXED) ? 1 : mdl_num_threads();
}

/* The core's L2 in bytes, as the C library reports it (glibc: from CPUID), 1 MiB
 * where it does not or reports something implausible */
int64_t mdl_l2_bytes(void)
{
    static int64_t l2 = 0; /* 0: not yet read; every thread reads the same value */
    int64_t v = __atomic_load_n(&l2, __ATOMIC_RELAXED);
    if (v) return v;
    v = 1 << 20;
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long r = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (r >= (128 << 10) && r <= (64 << 20)) v = r;
#endif
    __atomic_store_n(&l2, v, __ATOMIC_RELAXED);
    return v;
}

int mdl_cpu_intel(void)
{
    static int intel = -1; /* -1: not yet read; every thread reads the same value */
    int v = __atomic_load_n(&intel, __ATOMIC_RELAXED);
    if (v < 0) {
#if MDL_X86 && defined(__GNUC__)
        __builtin_cpu_init();
        v = __builtin_cpu_is("intel") != 0;
#else
        v = 0;
#endif
        __atomic_store_n(&intel, v, __ATOMIC_RELAXED);
    }
    return v;
}

int mdl_cpu_amd_family(void)
{
    static int family = -1; /* -1: not yet read; every thread reads the same value */
    int v = __atomic_load_n(&family, __ATOMIC_RELAXED);
    if (v < 0) {
        v = 0;
#if MDL_X86 && defined(__GNUC__)
        unsigned a, b, c, d;
        __builtin_cpu_init();
        if (__builtin_cpu_is("amd") && __get_cpuid(1, &a, &b, &c, &d))
            v = (int)((a >> 8) & 0xf) + ((((a >> 8) & 0xf) == 0xf) ? (int)((a >> 20) & 0xff) : 0);
#endif
        __atomic_store_n(&family, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* ---- the SGEMM's op(B) for thin C (mdl_set_sgemm_b) ------------------------- */

static int sgemm_b = MDL_SGEMM_B_AUTO;

mdl_status mdl_set_sgemm_b(mdl_sgemm_b mode)
{
    if (mode != MDL_SGEMM_B_AUTO && mode != MDL_SGEMM_B_IN_PLACE && mode != MDL_SGEMM_B_PACKED)
        return mdl_error(MDL_ERR_ARG, "mdl_set_sgemm_b: unknown mode %d", (int)mode);
    __atomic_store_n(&sgemm_b, (int)mode, __ATOMIC_RELAXED);
    return MDL_OK;
}

int mdl_sgemm_b_in_place(void)
{
    const int mode = __atomic_load_n(&sgemm_b, __ATOMIC_RELAXED);
    if (mode != MDL_SGEMM_B_AUTO) return mode == MDL_SGEMM_B_IN_PLACE;
    return !mdl_cpu_intel();
}

/* ---- SIMD dispatch --------------------------------------------------------- */

static int simd_level = -1; /* -1: not yet decided */

mdl_simd mdl_cpu_simd(void)
{
#if MDL_X86 && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_supports("avx512f") ? MDL_SIMD_AVX512 : MDL_SIMD_AVX2;
#endif
    return MDL_SIMD_SCALAR;
}

mdl_status mdl_set_simd(mdl_simd level)
{
    if (level != MDL_SIMD_SCALAR && level != MDL_SIMD_AVX2 && level != MDL_SIMD_AVX512)
        return mdl_error(MDL_ERR_ARG, "mdl_set_simd: unknown level %d", (int)level);
    if (level > mdl_cpu_simd())
        return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_set_simd: this CPU (or build) lacks %s",
                         level == MDL_SIMD_AVX512 ? "AVX-512F" : "AVX2+FMA");
    __atomic_store_n(&simd_level, (int)level, __ATOMIC_RELAXED);
    return MDL_OK;
}

mdl_simd mdl_get_simd(void)
{
    int level = __atomic_load_n(&simd_level, __ATOMIC_RELAXED);
    if (level < 0) {
        level = (int)mdl_cpu_simd();
        /* MINIDL_SIMD lowers the level; a level the CPU lacks (or an unknown name) is ignored */
        const char *env = getenv("MINIDL_SIMD");
        if (env && strcmp(env, "scalar") == 0) level = MDL_SIMD_SCALAR;
        else if (env && strcmp(env, "avx2") == 0 && level >= MDL_SIMD_AVX2) level = MDL_SIMD_AVX2;
        __atomic_store_n(&simd_level, level, __ATOMIC_RELAXED);
    }
    return (mdl_simd)level;
}

int mdl_use_avx2(void) { return mdl_get_simd() >= MDL_SIMD_AVX2; }
int mdl_use_avx512(void) { return mdl_get_simd() >= MDL_SIMD_AVX512; }

/* ---- memory --------------------------------------------------------------- */

void *mdl_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

void mdl_free(void *p) { free(p); }

/* The library's own workspace, kept from call to call (mdl_set_keep_workspace): one
 * block, the one a call gave back last, taken by the next call that it is large enough
 * for.  glibc's malloc maps blocks beyond 32 MiB afresh for every request and unmaps them
 * when freed, so a kernel allocating its own would have the kernel zero every page it
 * touches on each call (VGG's 512 -> 512 convolution at 4x4, batch 128, a 79 MB
 * workspace: the forward 37 ms a call against 25).  A block is a 64-byte header holding
 * its size, then the workspace.  Taken and given back by atomic exchanges: calls from
 * several threads at once each have a block of their own. */
#define BLOCK_HEADER 64
static char *kept_block = NULL;
static int keep_workspace = 1;

static char *take_block(size_t need)
{
    char *b = __atomic_exchange_n(&kept_block, NULL, __ATOMIC_ACQ_REL);
    if (b && *(size_t *)b >= need) return b;
    free(b);
    if (!(b = mdl_alloc(BLOCK_HEADER + need))) return NULL;
    *(size_t *)b = need;
    return b;
}

void mdl_workspace_done(void *owned)
{
    if (owned && __atomic_load_n(&keep_workspace, __ATOMIC_RELAXED))
        owned = __atomic_exchange_n(&kept_block, (char *)owned, __ATOMIC_ACQ_REL);
    free(owned);
}

void mdl_set_keep_workspace(int keep)
{
    __atomic_store_n(&keep_workspace, keep != 0, __ATOMIC_RELAXED);
    if (!keep) free(__atomic_exchange_n(&kept_block, NULL, __ATOMIC_ACQ_REL));
}

int mdl_get_keep_workspace(void) { return __atomic_load_n(&keep_workspace, __ATOMIC_RELAXED); }

mdl_status mdl_workspace(const char *fn, void *ws, size_t ws_bytes, size_t need,
                         void **owned, float **out)
{
    *owned = NULL;
    if (ws == NULL) {
        char *b = take_block(need);
        if (!b) return mdl_error(MDL_ERR_ALLOC, "%s: cannot allocate %zu bytes of workspace", fn, need);
        *owned = b;
        ws = b + BLOCK_HEADER;
        ws_bytes = need;
    } else if (ws_bytes < need) {
        return mdl_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn, ws_bytes, need);
    }
    uintptr_t p = ((uintptr_t)ws + 63) & ~(uintptr_t)63;
    *out = (float *)p;
    return MDL_OK;
}
