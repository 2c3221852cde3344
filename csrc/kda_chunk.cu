// Launcher for route "chunk": checks the workspace, then launches the prepare pass over every
// (chunk, head) and the recurrence over every (sequence, head, value slice) on the caller's stream.
#include "kda_chunk_launch.cuh"

namespace {

using namespace kdactl::chunk;

// The recurrence at one of the shapes chunk_builds names, its ring cut to 4 stages where the
// device's shared memory per block does not hold 8.
template <int K, int V, int WARPS>
int launch_ring(const kdactl_kda_args& a, const Segments& sg, int stages, int optin, cudaStream_t stream) {
  if constexpr (WARPS < 8) {
    if (stages == 8 && recur_smem<K, WARPS, 8>() <= static_cast<size_t>(optin))
      return launch_recur<K, V, WARPS, 8, Pass::kWhole>(a, sg, a.batch, optin, stream);
  }
  return launch_recur<K, V, WARPS, 4, Pass::kWhole>(a, sg, a.batch, optin, stream);
}

// The recurrence over whole sequences. Varlen CTAs that outnumber the SMs wait for one; the longest
// sequences' go first (measured at the serving varlen shape, 1152 CTAs: lengths in either order time
// alike). Fewer all start at once.
template <int K, int V>
int launch_whole(const kdactl_kda_args& a, Segments whole, RecurShape rs, int sms, int optin, cudaStream_t stream) {
  if (!chunk_builds(rs, V)) return KDACTL_ERR_BAD_TUNING;
  whole.longest_first = a.varlen && recur_units(a, V, rs.warps) > sms;
  switch (rs.warps) {
    case 2: return launch_ring<K, V, 2>(a, whole, rs.stages, optin, stream);
    case 4: return launch_ring<K, V, 4>(a, whole, rs.stages, optin, stream);
    default:
      if constexpr (V == 128) return launch_ring<K, V, 8>(a, whole, rs.stages, optin, stream);
      return KDACTL_ERR_BAD_TUNING;
  }
}

}  // namespace

int kdactl::chunk::launch_walks(const kdactl_kda_args& a, Segments whole, int sms, int optin, cudaStream_t stream) {
  const RecurShape rs = pick_recur(a, sms);
  return a.key_dim == 64 ? launch_whole<64, 64>(a, whole, rs, sms, optin, stream)
                         : launch_whole<128, 128>(a, whole, rs, sms, optin, stream);
}

int kdactl::chunk::launch_prepare(const kdactl_kda_args& a, cudaStream_t stream) {
  if (a.key_dim == 64) return a.qkv_fp16 ? launch_prepare_as<64, __half>(a, stream) : launch_prepare_as<64, bf16>(a, stream);
  return a.qkv_fp16 ? launch_prepare_as<128, __half>(a, stream) : launch_prepare_as<128, bf16>(a, stream);
}

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (head_error(a)) return 0;
  return a.key_dim == 64 ? blocks_bytes<64>(a) : blocks_bytes<128>(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  int sms = 0, optin = 0;
  if (int rc = kdactl_launch_prologue(args, &sms, &optin)) return rc;
  const kdactl_kda_args& a = *args;
  if (int rc = head_error(a)) return rc;
  if (sms == 0) return 0;
  if (a.workspace == nullptr || a.workspace_bytes < kdactl_chunk_workspace_bytes(a)) return KDACTL_ERR_BAD_WORKSPACE;
  if (!chunk_builds(pick_recur(a, sms), a.value_dim)) return KDACTL_ERR_BAD_TUNING;
  auto s = static_cast<cudaStream_t>(stream);
  if (int rc = launch_prepare(a, s)) return rc;  // (two kernels: the prepare pass, then the walks)
  return launch_walks(a, Segments{}, sms, optin, s);
}
