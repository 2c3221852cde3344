// Planted faults and one product for the emulator's own tests (tests/test_emulator.py): each entry
// launches one small kernel and returns the launch's status, so that a test can see that the
// emulator reports what the GPU would (a deadlock, a misaligned cp.async, a __trap, lanes of a warp
// at different collectives, a poll nothing answers), lands a cp.async only at its wait, hands data over
// from a bar.arrive to the bar.sync it completes and from a flag's writer to its poller, and that its
// ldmatrix, mma and wgmma agree with a plain matrix product (a wgmma only at the wait that covers it).
#include "device.cuh"

namespace {

// Thread 0 waits at a barrier the others never reach (they wait at a second one).
__global__ void deadlock_kernel() {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    kdactl::sync_first<64>();
  }
}

// Warp 1 exits at once; warp 0 meets at two __syncthreads, which then expect its 32 threads only.
__global__ void early_exit_kernel(float* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[threadIdx.x] = 1.f;
  __syncthreads();
  out[32 + threadIdx.x] = out[threadIdx.x] + out[31 - threadIdx.x];
}

__global__ void misaligned_cp_async_kernel(const float* src) {
  __shared__ __align__(16) float dst[8];
  kdactl::cp_async16(dst, src + 1);  // 4 bytes past a 16-byte boundary
  kdactl::cp_async_wait_all();
}

// What a thread reads of a cp.async's destination before and after the wait that covers it.
__global__ void cp_async_order_kernel(const float* src, float* out) {
  __shared__ __align__(16) float dst[4];
  dst[0] = -1.f;
  kdactl::cp_async16(dst, src);
  kdactl::cp_async_commit();
  out[0] = dst[0];  // not yet waited for: still -1
  kdactl::cp_async_wait_all();
  out[1] = dst[0];
}

// A hand-over through named barrier 5 (bar.arrive on one side, bar.sync on the other), twice over:
// warp 0 writes, arrives and goes on; warp 1 waits, reads, then writes its own answer back (the
// second phase, which warp 0 waits for). Without warp 0's first arrive (`arrive` 0) warp 1 waits forever.
__global__ void arrive_kernel(float* out, int arrive) {
  __shared__ float box[2];
  if (threadIdx.x < 32) {
    box[0] = 3.f;
    if (arrive) kdactl::named_arrive(5, 64);
    kdactl::named_sync(6, 64);  // warp 1's answer is in
    out[threadIdx.x] = box[1];
  } else {
    kdactl::named_sync(5, 64);
    box[1] = box[0] + 1.f;
    kdactl::named_arrive(6, 64);
  }
}

// Warp 1 polls a flag in shared memory that warp 0 sets after it writes the box (no barrier between them),
// then reads the box; with `set` 0 the flag is never set and warp 1 polls for ever.
__global__ void poll_kernel(float* out, int set) {
  __shared__ float box;
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x < 32) {
    box = 5.f;
    kdactl::fence_cta();
    if (set && threadIdx.x == 0) static_cast<volatile int&>(flag) = 1;
  } else {
    while (static_cast<volatile int&>(flag) == 0) kdactl::spin_pause();
    kdactl::fence_cta();
    out[threadIdx.x - 32] = box;
  }
}

// Thread 0 writes element `at` of out (past its end when at is its length).
__global__ void write_at_kernel(float* out, int at) {
  if (threadIdx.x == 0) out[at] = 1.f;
}

__global__ void trap_kernel() {
  if (threadIdx.x == 5) __trap();
}

__global__ void divergent_kernel(float* out) {
  float x = threadIdx.x;
  if (threadIdx.x % 2) x = __shfl_xor_sync(0xffffffffu, x, 1);
  else x = __shfl_sync(0xffffffffu, x, 0);
  out[threadIdx.x] = x;
}

// D[16][8] = A[16][16] B[16][8] on bf16 operands staged in shared memory, A by ldmatrix, B by
// ldmatrix.trans (B stored [k][n]), as the kernels read theirs.
__global__ void mma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
  __shared__ __align__(16) __nv_bfloat16 sa[16][16], sb[16][8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) sa[i / 16][i % 16] = a[i];
  for (int i = lane; i < 128; i += 32) sb[i / 8][i % 8] = b[i];
  __syncwarp();
  uint32_t fa[4], fb[4];
  // matrices 0..3 of A: rows 0-7 cols 0-7, rows 8-15 cols 0-7, rows 0-7 cols 8-15, rows 8-15 cols 8-15
  kdactl::ldmatrix_x4(fa, &sa[(lane % 8) + 8 * ((lane / 8) % 2)][8 * (lane / 16)]);
  // B^T by transposing loads of B's two 8x8 halves (k 0-7, k 8-15); matrices 2, 3 repeat them
  kdactl::ldmatrix_x4_trans(fb, &sb[(lane % 8) + 8 * ((lane / 8) % 2)][0]);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  kdactl::mma_bf16(acc, fa, fb[0], fb[1]);
  const int g = lane / 4, t = lane % 4;
  d[g * 8 + 2 * t] = acc[0], d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2], d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// D[64][16] = A[64][16] B[16][16] on bf16 operands by the warpgroup MMA: A from registers (each
// thread's fragment read from global memory), B staged in dynamic shared memory as the kernels stage
// -W and Qg (K-major core matrices, tile_at's order: row n of B^T, 16-byte pieces of k). D as it is
// before the wait that covers the product (its zeros) and after.
__global__ void wgmma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* before, float* after) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* bt = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int th = threadIdx.x, r = 16 * (th / 32) + (th % 32) / 4, c = 2 * (th % 4);
  for (int i = th; i < 256; i += 128) {
    const int k = i / 16, n = i % 16;
    bt[((k / 8) * 16 + n) * 8 + k % 8] = b[i];
  }
  __syncthreads();
  kdactl::fence_proxy_async();
  auto pair = [&](int row, int col) {
    uint16_t lo, hi;
    memcpy(&lo, &a[row * 16 + col], 2);
    memcpy(&hi, &a[row * 16 + col + 1], 2);
    return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  };
  const uint32_t fa[4] = {pair(r, c), pair(r + 8, c), pair(r, c + 8), pair(r + 8, c + 8)};
  float d[2][4] = {};
  kdactl::wgmma_fence();
  kdactl::wgmma_n16(d, fa, kdactl::wgmma_desc(bt, 16 * 16, 128));
  kdactl::wgmma_commit();
  auto put = [&](float* out) {
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 4; ++i) out[(r + 8 * (i >> 1)) * 16 + 8 * j + c + (i & 1)] = d[j][i];
  };
  put(before);
  kdactl::wgmma_wait<0>();
  put(after);
}

}  // namespace

extern "C" int emu_control_deadlock() {
  deadlock_kernel<<<1, 64>>>();
  return (int)cudaGetLastError();
}
extern "C" int emu_control_early_exit(float* out) {
  early_exit_kernel<<<1, 64>>>(out);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_misaligned_cp_async(const float* src) {
  misaligned_cp_async_kernel<<<1, 32>>>(src);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_cp_async_order(const float* src, float* out) {
  cp_async_order_kernel<<<1, 32>>>(src, out);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_arrive(float* out, int arrive) {
  arrive_kernel<<<1, 64>>>(out, arrive);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_poll(float* out, int set) {
  poll_kernel<<<1, 64>>>(out, set);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_write_at(float* out, int at) {
  write_at_kernel<<<1, 32>>>(out, at);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_trap() {
  trap_kernel<<<2, 32>>>();
  return (int)cudaGetLastError();
}
extern "C" int emu_control_divergent(float* out) {
  divergent_kernel<<<1, 32>>>(out);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_too_much_smem() {
  trap_kernel<<<1, 32, 64 << 10>>>();  // 64 KB of dynamic shared memory, no attribute set
  return (int)cudaGetLastError();
}
extern "C" int emu_control_mma(const void* a, const void* b, float* d) {
  mma_kernel<<<1, 32>>>(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), d);
  return (int)cudaGetLastError();
}
extern "C" int emu_control_wgmma(const void* a, const void* b, float* before, float* after) {
  wgmma_kernel<<<1, 128, 512>>>(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), before, after);
  return (int)cudaGetLastError();
}
