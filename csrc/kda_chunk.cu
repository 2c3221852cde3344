// Launcher for route "chunk": checks the workspace, then launches either the prepare pass over every
// (chunk, head) and the recurrence over every (sequence, head, value slice), or both in one fused
// grid (kda_chunk_fused.cu), on the caller's stream.
#include "kda_chunk_launch.cuh"

namespace {

using namespace kdactl::chunk;

// Two kernels: the prepare pass over every (chunk, head), then the recurrence. Varlen CTAs that
// outnumber the SMs wait for one; the longest sequences' go first (measured at the serving varlen
// shape, 1152 CTAs: lengths in either order time alike). Fewer all start at once.
template <int K, int V>
int launch(const kdactl_kda_args& a, RecurShape rs, int sms, int optin, cudaStream_t stream) {
  if (int rc = launch_prepare<K>(a, stream)) return rc;
  Segments whole;
  whole.longest_first = a.varlen && recur_units(a, V, rs.warps) > sms;
  return launch_pass<K, V, Pass::kWhole>(a, whole, a.batch, rs, optin, stream);
}

}  // namespace

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (head_error(a)) return 0;
  return (a.key_dim == 64 ? blocks_bytes<64>(a) : blocks_bytes<128>(a)) + fused_sync_bytes(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  int sms = 0, optin = 0;
  if (int rc = kdactl_launch_prologue(args, &sms, &optin)) return rc;
  const kdactl_kda_args& a = *args;
  if (int rc = head_error(a)) return rc;
  if (sms == 0) return 0;
  if (a.workspace == nullptr || a.workspace_bytes < kdactl_chunk_workspace_bytes(a)) return KDACTL_ERR_BAD_WORKSPACE;
  auto s = static_cast<cudaStream_t>(stream);
  if (const int walk_warps = fused_walk_warps(a)) return launch_fused(a, walk_warps, sms, optin, s);
  const RecurShape rs = pick_recur(a, sms);
  return a.key_dim == 64 ? launch<64, 64>(a, rs, sms, optin, s) : launch<128, 128>(a, rs, sms, optin, s);
}
