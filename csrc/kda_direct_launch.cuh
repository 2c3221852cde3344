// Route "direct"'s launches at one key dim, defined apart from its launcher (kda_direct.cu) so that
// each K compiles in a translation unit of its own (kda_direct_k64.cu, kda_direct_k128.cu).
#pragma once
#include "kda_direct.cuh"

namespace kdactl {
namespace direct {

template <int K, int kCols>
int launch_cols(const kdactl_kda_args& a, cudaStream_t stream) {
  const int cta_cols = kWarps * kCols;
  if (a.value_dim % cta_cols != 0) return KDACTL_ERR_BAD_VALUE_DIM;
  const dim3 grid(a.value_dim / cta_cols, a.heads, static_cast<unsigned>(a.batch));
  with_types(a, [&](auto g_type, auto in_type) {
    kda_direct_kernel<K, kCols, decltype(g_type), decltype(in_type)><<<grid, kWarps * 32, 0, stream>>>(a);
  });
  return kdactl_launch_status();
}

template <int K>
int launch_k(const kdactl_kda_args& a, int cols, cudaStream_t stream) {
  switch (cols) {
    case 2: return launch_cols<K, 2>(a, stream);
    case 4: return launch_cols<K, 4>(a, stream);
    default: return launch_cols<K, 8>(a, stream);
  }
}

}  // namespace direct
}  // namespace kdactl
