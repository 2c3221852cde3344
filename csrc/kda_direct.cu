// Launcher for route "direct": validates what Python cannot see, picks the column split, launches
// on the caller's stream. Its kernels compile apart, one file per K (kda_direct_k64.cu, kda_direct_k128.cu).
#include "kda_direct.cuh"

namespace {

// Columns per warp: fewer columns mean a shorter chain per token, more warps mean more instruction
// slots competing. Take the fewest columns that still leave at most one warp per SM sub-partition.
int pick_columns(const kdactl_kda_args& a, int sm_count) {
  const int64_t columns = a.batch * a.heads * static_cast<int64_t>(a.value_dim);
  for (int cols : {2, 4}) {
    if (columns / cols <= 4LL * sm_count) return cols;
  }
  return 8;
}

}  // namespace

uint64_t kdactl_direct_workspace_bytes(const kdactl_kda_args&) { return 0; }  // the state stays on chip

extern "C" int kdactl_kda_direct(const kdactl_kda_args* args, void* stream) {
  int sms = 0;
  if (int rc = kdactl_launch_prologue(args, &sms)) return rc;
  const kdactl_kda_args& a = *args;
  if (a.value_dim > 128 || a.value_dim % 16 != 0) return KDACTL_ERR_BAD_VALUE_DIM;
  if (a.tuning_warps != 0 || a.tuning_stages != 0) return KDACTL_ERR_BAD_TUNING;  // the chunked routes' only
  if (sms == 0) return 0;
  const int cols = pick_columns(a, sms);
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.key_dim) {
    case 64: return kdactl::direct::launch_k<64>(a, cols, s);
    case 128: return kdactl::direct::launch_k<128>(a, cols, s);
    default: return KDACTL_ERR_BAD_KEY_DIM;
  }
}
