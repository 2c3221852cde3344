// Route "chunk", fused: the prepare pass and the recurrence in one grid, so that the recurrence
// starts at once and runs beside the prepare (which alone is throughput-bound, while the walk is a
// latency chain that leaves most issue slots idle), and reads each chunk's factors back from L2
// soon after they were written instead of after the whole pass.
//
// CTA b < units walks one (sequence, head, value slice) on its first WARPS warps, as kda_chunk_recur
// does, and up to PROD warps after them prepare chunks meanwhile (kda_chunk_policy.h says how many);
// the CTAs past `units` (filling the SMs the walks leave idle) only prepare, on all PROD warps and on
// as many walk warps as the walk's shared memory holds. One counter hands out the jobs in chunk-major
// order (chunk c of every sequence and head before chunk c + 1), so the walks find their next chunks
// prepared.
//
// Nothing waits on another CTA being scheduled, whatever the grid's residency: a walk waits only on
// jobs already handed to producer warps that are running, and a producer (FusedSync::ahead) only on
// walks that have started, to pass a chunk whose jobs were all handed out before its own.
#pragma once
#include "kda_chunk.cuh"

namespace kdactl {
namespace chunk {

// Chunks of the longest sequence: the chunk indices that have jobs. Every lane of the warp calls it.
__device__ __forceinline__ int64_t max_chunks(const kdactl_kda_args& a) {
  if (!a.varlen) return (a.seqlen + C - 1) / C;
  int64_t m = 0;
  for (int64_t n = threadIdx.x & 31; n < a.batch; n += 32) {
    int64_t bos, eos;
    sequence_bounds(a, n, bos, eos);
    m = max(m, (eos - bos + C - 1) / C);
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) m = max(m, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, m, mask)));
  return m;
}

// One producer warp: prepare jobs until none are left, flagging each block done. (Publishing them in
// chunk order instead, a count per (n, h), made producers wait on each other: 2.3x slower at B1
// T8192 H64.) Each warp claims its next job while it prepares this one, so the claim costs no wait.
template <int K, typename GT, typename In>
__device__ __forceinline__ void produce(const kdactl_kda_args& a, unsigned char* ws, const FusedSync& fs,
                                        PrepSmem<K, GT, In>& sm) {
  const int lane = threadIdx.x & 31;
  const int64_t per_chunk = a.batch * a.heads;
  const unsigned long long jobs = static_cast<unsigned long long>(max_chunks(a) * per_chunk);
  unsigned long long next = 0;
  if (lane == 0) next = atomicAdd(fs.next_job, 1ull);
  for (;;) {
    const unsigned long long j = __shfl_sync(0xffffffffu, next, 0);
    if (j >= jobs) return;
    if (lane == 0) next = atomicAdd(fs.next_job, 1ull);
    const int64_t c = static_cast<int64_t>(j / per_chunk), nh = static_cast<int64_t>(j % per_chunk);
    if (fs.ahead > 0 && c >= fs.ahead && lane == 0) {  // keep the unread factors few enough to stay in L2
      while (ld_acquire(fs.consumed + c - fs.ahead) < ld_acquire(fs.started)) __nanosleep(500);
    }
    __syncwarp();
    const int64_t n = nh / a.heads;
    int64_t bos, eos;
    sequence_bounds(a, n, bos, eos);
    const int64_t row0 = bos + c * C;
    if (row0 >= eos) continue;  // sequence n has fewer chunks
    const int64_t slot = bos / C + n + c;
    const int h = static_cast<int>(nh % a.heads);
    prepare_chunk<K, GT, In>(a, ws, slot, h, row0, static_cast<int>(eos - row0 < C ? eos - row0 : C), sm);
    __syncwarp();  // every lane's stores, before lane 0's release
    if (lane == 0) {
      __threadfence();
      st_release(fs.done + slot * a.heads + h, 1);
    }
    __syncwarp();  // the next job's staging overwrites what this one's stores read
  }
}

template <int K, typename GT, typename In, int WARPS, int STAGES, int PROD>
constexpr size_t fused_smem() {
  static_assert(sizeof(PrepSmem<K, GT, In>) % 16 == 0 && recur_smem<K, WARPS, STAGES>() % 16 == 0,
                "16-byte aligned producer stages");
  return recur_smem<K, WARPS, STAGES>() + PROD * sizeof(PrepSmem<K, GT, In>);
}

// CTA b < units: a walk on warps 0 .. WARPS - 1 and `producers` (at most PROD) producers after them;
// the other CTAs: PROD producers, and as many of the walk warps as the walk's shared memory holds.
template <int K, int V, typename GT, typename In, int WARPS, int STAGES, int PROD>
__global__ void __launch_bounds__((WARPS + PROD) * 32)
    kda_chunk_fused(const kdactl_kda_args a, unsigned char* ws, const FusedSync fs, const Segments sg, int64_t units,
                    int producers) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using Sm = PrepSmem<K, GT, In>;
  constexpr int kWalkless = recur_smem<K, WARPS, STAGES>() / sizeof(Sm);  // producers in the walk's place
  const int warp = threadIdx.x >> 5;
  Sm* prod = reinterpret_cast<Sm*>(smem_raw + recur_smem<K, WARPS, STAGES>());
  if (blockIdx.x < units) {
    if (warp >= WARPS + producers) return;
    if (warp >= WARPS) return produce<K, GT, In>(a, ws, fs, prod[warp - WARPS]);
    constexpr int kSlices = V / (16 * WARPS);
    const int64_t b = blockIdx.x;
    recur<K, V, WARPS, STAGES, Pass::kWhole>(a, ws, sg, smem_raw, static_cast<int>(b % kSlices),
                                             static_cast<int>(b / kSlices % a.heads), b / kSlices / a.heads, &fs);
  } else if (warp >= WARPS) {
    produce<K, GT, In>(a, ws, fs, prod[warp - WARPS]);
  } else if (warp < kWalkless) {
    produce<K, GT, In>(a, ws, fs, reinterpret_cast<Sm*>(smem_raw)[warp]);
  }
#endif
}

}  // namespace chunk
}  // namespace kdactl
