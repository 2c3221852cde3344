// A CPU emulator of the CUDA the kernels use, so that tests run csrc's kernels on a machine without a
// GPU. tests/emu/build.py compiles a copy of csrc with the host C++ compiler, this header included
// first, tests/emu/ptx.cuh in csrc/ptx.cuh's place, launches (`k<<<g, b, s, st>>>(...)`) rewritten
// to emu::launch(k, g, b, s, st)(...) and __shared__ variables to statics.
//
// The model: a launch runs its blocks one after another; a block's threads are fibers on one OS
// thread, each running until it reaches a barrier (__syncthreads, a named barrier, a warp
// collective: __syncwarp, shuffles, votes, mma, ldmatrix), where it waits until every thread the
// barrier expects has arrived; the last to arrive performs a warp collective for all its lanes. A
// bar.arrive counts its thread in and runs on; a poll of a flag that finds it unset (spin_pause) lets
// the other threads run first. The threads a barrier releases run on in the schedule's
// order (runtime.cpp). So a kernel computes what the GPU would wherever its threads synchronize as CUDA
// requires. A cp.async lands only at the wait that covers it, so a missing wait or commit shows. Reported as the launch's error: a block whose
// threads cannot all reach their barriers (a deadlock), a misaligned cp.async or ldmatrix, a __trap,
// lanes of one warp at different collectives, a poll that no running thread will answer, and a launch
// the GPU would refuse (too much shared memory without the attribute, too many threads, a grid dimension
// too large). Dynamic shared memory
// starts as 0xff bytes (NaN in every float type), so reading it before writing shows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // device printf is the host's
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

namespace emu {

struct Thread {
  uint3 thread_idx, block_idx;
  int linear, warp, lane;
};
const Thread& self();
dim3 block_dim();
dim3 grid_dim();
void* dynamic_smem();
unsigned block_serial();  // counts the blocks run: state kept per thread outside the fibers starts afresh with each
[[noreturn]] void trap(const char* why);

// cp.async as the PTX ISA orders it: a copy is performed only once a cp.async.wait_group covers the
// group its thread committed it in, so a read before that wait (or of a copy never committed) sees
// what the memory held before.
void cp_async(void* dst, const void* src, int bytes);
void cp_async_commit();
void cp_async_wait(int newest_pending);

void syncthreads();
void named_barrier(int id, int threads);
void named_arrive(int id, int threads);  // bar.arrive: counted in without waiting
void yield_thread();  // the running thread goes to the back of the ready list (a poll that found nothing)

// One warp collective: each lane of `mask` passes `in`; the last lane to arrive calls `op` over the
// 32 lanes' LaneIO (only those in `mask` are meaningful) before any lane returns with its `out`.
struct LaneIO {
  uint32_t in[12];
  const void* ptr;
  uint32_t out[4];
};
using WarpOp = void (*)(LaneIO (&lanes)[32], unsigned mask, int arg);
void warp_collective(WarpOp op, int arg, unsigned mask, LaneIO& mine);

void shfl_op(LaneIO (&lanes)[32], unsigned mask, int arg);
void shfl_xor_op(LaneIO (&lanes)[32], unsigned mask, int arg);
void vote_op(LaneIO (&lanes)[32], unsigned mask, int arg);
void nop_op(LaneIO (&lanes)[32], unsigned mask, int arg);

template <typename T>
T shuffle(WarpOp op, unsigned mask, T var, int arg) {
  static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
  LaneIO io{};
  memcpy(io.in, &var, sizeof(T));
  io.in[2] = static_cast<uint32_t>(arg);  // per lane: a lane may read any other lane
  warp_collective(op, 0, mask, io);
  T r;
  memcpy(&r, io.out, sizeof(T));
  return r;
}

// Launch: run `kernel` over the grid with copies of `args` converted to its parameter types, as a
// CUDA launch copies them; the error (or cudaSuccess) goes to cudaGetLastError.
struct Body {
  virtual void run() = 0;
  virtual ~Body() = default;
};
void launch_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, Body& body);

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  template <typename... A>
  void operator()(A&&... args) const {
    struct Call : Body {
      void (*kernel)(P...);
      std::tuple<std::decay_t<P>...> params;
      Call(void (*k)(P...), A&&... a) : kernel(k), params(std::forward<A>(a)...) {}
      void run() override { std::apply(kernel, params); }
    } call(kernel, std::forward<A>(args)...);
    launch_grid(reinterpret_cast<const void*>(kernel), grid, block, smem, call);
  }
};
template <typename... P>
Launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
  return {kernel, grid, block, smem};
}

}  // namespace emu

#undef __launch_bounds__
#define __launch_bounds__(...)

#define threadIdx (::emu::self().thread_idx)
#define blockIdx (::emu::self().block_idx)
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())

inline void __syncthreads() { ::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::emu::LaneIO io{};
  ::emu::warp_collective(::emu::nop_op, 0, mask, io);
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::emu::shuffle(::emu::shfl_op, mask, var, src_lane | (width << 8));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::emu::shuffle(::emu::shfl_xor_op, mask, var, lane_mask | (width << 8));
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return ::emu::shuffle(::emu::vote_op, mask, pred ? 1u : 0u, 0); }
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
[[noreturn]] inline void __trap() { ::emu::trap("__trap()"); }

// Blocks run one at a time on one OS thread: an atomic is a plain read-modify-write.
inline unsigned atomicOr(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old | v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}

inline unsigned __float_as_uint(float x) {
  unsigned u;
  memcpy(&u, &x, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
inline int __float_as_int(float x) { return static_cast<int>(__float_as_uint(x)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
// CUDA's min and max, over any two arithmetic types (its device overloads cover the kernels' pairs).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  return b < a ? b : a;
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
