// Route "chunk"'s prepare pass, launched (kda_chunk_launch.cuh declares launch_prepare_as): included
// by the four kda_chunk_prepare_*.cu, one per K and element type of q and k.
#pragma once
#include "kda_chunk_launch.cuh"

namespace kdactl {
namespace chunk {

template <int K, typename In>
int launch_prepare_as(const kdactl_kda_args& a, cudaStream_t stream) {
  const int64_t ctas = num_slots(a) * a.heads;
  if (ctas > 0x7fffffff) return KDACTL_ERR_UNSUPPORTED;
  int rc = 0;
  with_g_type(a, [&](auto g_type) {
    using GT = decltype(g_type);
    auto prepare = a.segment_chunks > 0 ? kda_chunk_prepare<K, GT, In, true> : kda_chunk_prepare<K, GT, In, false>;
    const size_t smem = sizeof(PrepSmem<K, GT, In>);
    rc = set_smem(prepare, smem);
    if (rc == 0) {
      prepare<<<static_cast<unsigned>(ctas), 32, smem, stream>>>(a, static_cast<unsigned char*>(a.workspace));
      rc = kdactl_launch_status();
    }
  });
  return rc;
}

}  // namespace chunk
}  // namespace kdactl
