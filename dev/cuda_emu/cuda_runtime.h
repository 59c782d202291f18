/* cuda_runtime.h for dev/cuda_emu: a CPU emulation of the little of CUDA that
 * src_cuda/ uses, so that its kernels compile with g++ and run on a machine
 * without a GPU (slowly, one CUDA thread at a time).  A launch runs its blocks
 * one after the other; each CUDA thread of a block is a fiber (ucontext) that
 * the scheduler runs to its next barrier; __shared__ is static (one block at a
 * time); warp shuffles go through an exchange buffer between two warp
 * barriers.  Not emulated: anything of the real memory model, timing, limits. */
#pragma once
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <algorithm>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNoDevice = 100,
       cudaErrorInsufficientDriver = 35 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char *cudaGetErrorName(cudaError_t) { return "emu"; }
inline const char *cudaGetErrorString(cudaError_t) { return "emu"; }
inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
using std::max;
using std::min;

/* fibers: every CUDA thread of a block is a ucontext; the scheduler runs each to its next
 * barrier; a warp barrier (shuffle) releases at the next pass, a block barrier once
 * every thread of the block is there */
struct EmuFiber {
    ucontext_t ctx;
    char *stack;
    int state; /* 0 runnable, 1 at a warp barrier, 2 at the block barrier, 3 done */
    uint3 tid, bid;
};
inline uint3 threadIdx, blockIdx; /* the running fiber's */
inline dim3 blockDim, gridDim;
inline ucontext_t emu_sched;
inline EmuFiber *emu_cur;
inline std::function<void()> *emu_body;
inline double emu_xchg[1024];
inline char *emu_stacks[1024];
#define EMU_STACK (96 * 1024)

inline void emu_yield(int state)
{
    emu_cur->state = state;
    swapcontext(&emu_cur->ctx, &emu_sched);
}
inline void __syncthreads() { emu_yield(2); }
inline void emu_entry()
{
    (*emu_body)();
    emu_cur->state = 3;
}

template <class T>
T emu_shfl(T v, int src_lane)
{
    const int warp = threadIdx.x >> 5;
    memcpy(&emu_xchg[threadIdx.x], &v, sizeof(T));
    emu_yield(1);
    T r = v;
    if (src_lane >= 0 && src_lane < 32) memcpy(&r, &emu_xchg[warp * 32 + src_lane], sizeof(T));
    emu_yield(1);
    return r;
}
template <class T> T __shfl_down_sync(unsigned, T v, int off)
{
    int lane = threadIdx.x & 31;
    return emu_shfl(v, lane + off < 32 ? lane + off : lane);
}
template <class T> T __shfl_xor_sync(unsigned, T v, int m) { return emu_shfl(v, (int)(threadIdx.x & 31) ^ m); }
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }

template <class K, class... A>
void emu_launch(dim3 grid, dim3 block, size_t, cudaStream_t, K kernel, A... args)
{
    gridDim = grid;
    blockDim = block;
    const int nt = (int)(block.x * block.y * block.z);
    if (nt % 32 != 0 || nt > 1024 || nt < 1) abort();
    std::vector<EmuFiber> f(nt);
    std::function<void()> body = [&]() {
        EmuFiber *me = emu_cur;
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    me->bid = {x, y, z};
                    blockIdx = me->bid;
                    kernel(args...);
                    __syncthreads(); /* the block's end: shared memory is reused */
                }
    };
    emu_body = &body;
    for (int t = 0; t < nt; t++) {
        if (!emu_stacks[t]) emu_stacks[t] = (char *)malloc(EMU_STACK);
        getcontext(&f[t].ctx);
        f[t].ctx.uc_stack.ss_sp = emu_stacks[t];
        f[t].ctx.uc_stack.ss_size = EMU_STACK;
        f[t].ctx.uc_link = &emu_sched;
        makecontext(&f[t].ctx, emu_entry, 0);
        f[t].state = 0;
        f[t].tid = {(unsigned)t, 0, 0};
        f[t].bid = {0, 0, 0};
    }
    for (;;) {
        for (int t = 0; t < nt; t++) {
            if (f[t].state == 2 || f[t].state == 3) continue;
            emu_cur = &f[t];
            threadIdx = f[t].tid;
            blockIdx = f[t].bid;
            swapcontext(&emu_sched, &f[t].ctx);
        }
        int done = 0, at_block = 0;
        for (int t = 0; t < nt; t++) {
            done += f[t].state == 3;
            at_block += f[t].state == 2;
        }
        if (done == nt) break;
        if (at_block + done == nt) {
            if (done) abort(); /* a barrier some threads never reach */
            for (int t = 0; t < nt; t++) f[t].state = 0;
        }
    }
}
