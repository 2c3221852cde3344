// The kernels' inline PTX, every instruction of it in this one file: cp.async staging, the named
// barrier, warp-level tensor-core MMA (mma.sync, which every SPEC target from sm_80 on runs),
// ldmatrix, and the MUFU approximations. tests/emu/ptx.cuh gives the same functions for the CPU
// emulator (tests/emu), which builds csrc with that file in this one's place; a primitive added here
// needs its emulated twin there.
#pragma once
#include <stdint.h>

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
