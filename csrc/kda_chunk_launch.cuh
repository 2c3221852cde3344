// Launch helpers shared by the routes built on the chunked kernels: "chunk" (kda_chunk.cu) and
// "small_bh" (kda_small_bh.cu).
#pragma once
#include "kda_chunk.cuh"
#include "kda_chunk_policy.h"

namespace kdactl {
namespace chunk {

// The prepared factors of every (chunk slot, head).
template <int K>
uint64_t blocks_bytes(const kdactl_kda_args& a) {
  return static_cast<uint64_t>(num_slots(a)) * a.heads * Block<K>::kBytes;
}

// Route small_bh's chunk_bounds, to a whole 128-byte line (what follows them starts one).
inline uint64_t bounds_bytes(const kdactl_kda_args& a) {
  return (static_cast<uint64_t>(num_slots(a)) * a.heads * sizeof(float) + 127) / 128 * 128;
}

// 0 when the chunked kernels are built for these head dims (K == V in {64, 128}), else the code
// naming the one that is not.
inline int head_error(const kdactl_kda_args& a) {
  if (a.key_dim != 64 && a.key_dim != 128) return KDACTL_ERR_BAD_KEY_DIM;
  return a.value_dim == a.key_dim ? 0 : KDACTL_ERR_BAD_VALUE_DIM;
}

template <typename Kernel>
int set_smem(Kernel kernel, size_t bytes) {
  return kdactl_set_smem_once(reinterpret_cast<const void*>(kernel), static_cast<int>(bytes));
}

// The prepare pass over every (chunk slot, head), for K and q/k's element type In (bf16 or fp16):
// each of the four is compiled in a translation unit of its own (kda_chunk_prepare_*.cu), apart
// from the recurrences, so that no one file dominates the build.
template <int K, typename In>
int launch_prepare_as(const kdactl_kda_args& a, cudaStream_t stream);

// The one of the four for these arguments (defined in kda_chunk.cu: a prepare file that saw the call
// of all four would compile all four).
int launch_prepare(const kdactl_kda_args& a, cudaStream_t stream);

// Route chunk's recurrence over whole sequences, at the shape pick_recur gives (defined in kda_chunk.cu:
// route small_bh launches it too, where its segments do not all start warm).
int launch_walks(const kdactl_kda_args& a, Segments whole, int sms, int optin, cudaStream_t stream);

// The recurrence over `units` (sequences, or segment slots) per head, where the device's shared
// memory per block holds its ring: 227 KB on sm_90 and sm_100, 163 KB on sm_80, 99 KB on sm_86/89/120.
template <int K, int V, int WARPS, int STAGES, Pass PASS>
int launch_recur(const kdactl_kda_args& a, const Segments& sg, int64_t units, int smem_optin, cudaStream_t stream) {
  static_assert(V % (16 * WARPS) == 0, "16 value columns a warp");
  if (units > KDACTL_MAX_GRID_DIM) return KDACTL_ERR_UNSUPPORTED;
  auto kernel = a.qkv_fp16 ? kda_chunk_recur<K, V, WARPS, STAGES, PASS, true, false>
                           : kda_chunk_recur<K, V, WARPS, STAGES, PASS, false, false>;
  if constexpr (PASS == Pass::kReduce) {
    if (sg.halves) {
      kernel = a.qkv_fp16 ? kda_chunk_recur<K, V, WARPS, STAGES, PASS, true, true>
                          : kda_chunk_recur<K, V, WARPS, STAGES, PASS, false, true>;
    }
  }
  const size_t smem = recur_smem<K, WARPS, STAGES>();
  if (smem > static_cast<size_t>(smem_optin)) return KDACTL_ERR_UNSUPPORTED;
  if (int rc = set_smem(kernel, smem)) return rc;
  const dim3 grid(V / (16 * WARPS), a.heads, static_cast<unsigned>(units));
  kernel<<<grid, WARPS * 32, smem, stream>>>(a, static_cast<const unsigned char*>(a.workspace), sg);
  return kdactl_launch_status();
}

}  // namespace chunk
}  // namespace kdactl
