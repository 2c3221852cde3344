// Device self-test: proves the library runs and computes right on this GPU before any KDA kernel.
// Each thread mixes its index (integer ALU), sums across its warp (shuffles) and reads its
// neighbour through shared memory; Python (kdactl.jit.selftest) recomputes every value.
#include "common.cuh"

namespace {

__host__ __device__ inline uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock) selftest_kernel(uint32_t* out, int n, uint32_t seed) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();  // compiled for the wrong arch: fail loudly
#else
  __shared__ uint32_t tile[kBlock];
  const int i = blockIdx.x * kBlock + threadIdx.x;
  const uint32_t x = mix(static_cast<uint32_t>(i) ^ seed);
  uint32_t warp_sum = x;
  for (int off = 16; off > 0; off >>= 1) warp_sum += __shfl_xor_sync(0xffffffffU, warp_sum, off);
  tile[threadIdx.x] = x;
  __syncthreads();
  const uint32_t neighbour = tile[(threadIdx.x + 1) % kBlock];
  if (i < n) out[i] = x + 3U * warp_sum + (neighbour ^ 0x9e3779b9U);
#endif
}

}  // namespace

extern "C" int kdactl_selftest(uint32_t* out, int n, uint32_t seed, void* stream) {
  if (out == nullptr) return KDACTL_ERR_BAD_OUT;
  if (n <= 0) return KDACTL_ERR_BAD_COUNT;
  const int rc = kdactl_check_device();
  if (rc != 0) return rc;
  const int blocks = (n + kBlock - 1) / kBlock;
  selftest_kernel<<<blocks, kBlock, 0, static_cast<cudaStream_t>(stream)>>>(out, n, seed);
  return kdactl_launch_status();
}
