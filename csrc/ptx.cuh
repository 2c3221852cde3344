// The kernels' inline PTX, every instruction of it in this one file: cp.async staging, the named
// barrier, warp-level tensor-core MMA (mma.sync, which every SPEC target from sm_80 on runs), sm_90a's
// warpgroup MMA (wgmma), ldmatrix, and the MUFU approximations. tests/emu/ptx.cuh gives the same functions for the CPU
// emulator (tests/emu), which builds csrc with that file in this one's place; a primitive added here
// needs its emulated twin there.
#pragma once
#include <stdint.h>

#include <type_traits>

namespace kdactl {

// ---- cp.async: 16-byte global -> shared copies that bypass registers --------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// Copies `bytes` (0 or 16) and zero-fills the rest: padding rows past a sequence's end read nothing.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, int bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// A barrier over the first THREADS threads of the CTA only (id 1; __syncthreads is id 0 over all).
template <int THREADS>
__device__ __forceinline__ void sync_first() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
}

// Named barrier `id` (1-15) over `threads` threads: bar.sync waits for them all; bar.arrive counts this
// thread in and goes on (a producer's "ready" or a consumer's "done" that the other side waits for).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A hand-over by a flag in shared memory between warps of one CTA that share no barrier (tools/ahead_probe.cu):
// the writer orders its earlier global writes before the flag at the GPU's scope (fence_gpu: the reader's
// cp.async.cg reads L2, past the SM's L1), the reader its later reads after the flag (fence_cta), and a
// reader that finds the flag unset pauses before it looks again (the emulator runs other threads there).
__device__ __forceinline__ void fence_gpu() { __threadfence(); }
__device__ __forceinline__ void fence_cta() { __threadfence_block(); }
__device__ __forceinline__ void spin_pause() { __nanosleep(64); }

// ---- Tensor cores (device.cuh names the fragment layouts) ---------------------------------------
// D += A B with fp32 accumulators; SHAPE names the shape and the operand types.
#define KDACTL_MMA(SHAPE)                                                                                 \
  asm volatile("mma.sync.aligned." SHAPE " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"       \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  KDACTL_MMA("m16n8k8.row.col.f32.tf32.tf32.f32");
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  KDACTL_MMA("m16n8k16.row.col.f32.bf16.bf16.f32");
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  KDACTL_MMA("m16n8k16.row.col.f32.f16.f16.f32");
}
// Four 8x8 bf16 matrices; lanes 8j..8j+7 give the row addresses of matrix j (16 bytes each).
// Plain: lane gets (row g, cols 2t, 2t+1) of each. Transposed: (rows 2t, 2t+1, col g).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

// ---- Warpgroup MMA (sm_90a only): D += A B with A from registers, B from shared memory ---------------
// KDACTL_WGMMA is defined where the device code is compiled for sm_90a (every other target takes the
// mma.sync path) and by the emulator's twin, which performs each product at the wait that covers it.
// Operand B is described by a shared-memory descriptor of the no-swizzle ("interleaved") layout: 8 x 8
// core matrices of 16-byte rows, each 128 contiguous bytes; `k_stride` is the byte distance between
// core matrices along the product's K dimension (the descriptor's LBO), `n_stride` along N (SBO). The
// A fragment of each warp's 16 rows, and D's per n8 block, are mma.sync m16n8k16's (device.cuh).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KDACTL_WGMMA 1
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t k_stride, uint32_t n_stride) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((addr >> 4) & 0x3fffu) | static_cast<uint64_t>((k_stride >> 4) & 0x3fffu) << 16 |
         static_cast<uint64_t>((n_stride >> 4) & 0x3fffu) << 32;
}
// Makes this thread's completed shared-memory writes (cp.async's too) visible to the tensor cores, which
// read wgmma's operands through the async proxy; a barrier after it extends that to the CTA's writes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders this thread's register writes before the warpgroup's next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving a register's reads or writes across the asynchronous products.
template <typename T, int N>
__device__ __forceinline__ void wgmma_hold(T (&r)[N][4]) {
  static_assert(sizeof(T) == 4, "fp32 accumulators or packed 16-bit operands");
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (std::is_same<T, float>::value) asm volatile("" : "+f"(r[i][e])::"memory");
      else asm volatile("" : "+r"(r[i][e])::"memory");
    }
}
// m64n16k16, bf16 operands, B K-major: d[n8 block][4].
__device__ __forceinline__ void wgmma_n16(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#define KDACTL_D8(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]), "+f"(d[i + 1][0]), \
                     "+f"(d[i + 1][1]), "+f"(d[i + 1][2]), "+f"(d[i + 1][3])
// m64n64k16 and m64n128k16, bf16 operands, B MN-major (N contiguous: tnspB = 1): d[n8 block][4].
__device__ __forceinline__ void wgmma_n64_tb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
      "%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : KDACTL_D8(0), KDACTL_D8(2), KDACTL_D8(4), KDACTL_D8(6)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_n128_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
      "%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,"
      "%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : KDACTL_D8(0), KDACTL_D8(2), KDACTL_D8(4), KDACTL_D8(6), KDACTL_D8(8), KDACTL_D8(10), KDACTL_D8(12),
        KDACTL_D8(14)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#undef KDACTL_D8

// A warpgroup's registers a thread, moved between the warpgroups of a CTA: `dec` gives some back to the
// CTA's pool, `inc` takes some from it (waiting until they are there). N: a multiple of 8 in 24..256,
// the same in every warp of the warpgroup (tools/ahead_probe.cu).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

// ---- Fast transcendentals: one MUFU op each ----------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;
// 2^x as ex2.approx (relative error ~2^-22), flushing denormal results to zero, which only drops terms
// already below 1e-38 of their neighbours; exp2f would add its denormal handling.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// e^x as 2^(x log2(e)): rounding x log2(e) adds |x| 2^-24 to the relative error, below 2^-19 for |x| <= 8.
__device__ __forceinline__ float ex(float x) { return ex2(x * kLog2e); }
// 1 / x as rcp.approx (relative error ~2^-23); rcp(inf) = 0.
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kdactl
