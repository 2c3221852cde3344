// Launcher for route "chunk": checks the workspace, launches the prepare pass over every (chunk, head)
// and then the recurrence over every (sequence, head, value slice), both on the caller's stream.
#include "kda_chunk_launch.cuh"

namespace {

using namespace kdactl::chunk;

// Warps per recurrence CTA: more CTAs per head shorten nothing on the sequential chain but fill
// more SMs; fewer re-read the shared K-side factors less often. 4 warps once that gives half the SMs
// a CTA (measured at B1 T8192 H64, scripts/tune_chunk.py: 0.911 ms against 0.945 with 2 warps).
// When every CTA has an SM to itself it takes the deep pipeline; otherwise two or three share an SM
// and hide each other's latency.
// Recurrence CTAs at `warps` per CTA: one per sequence, head and slice of 16 * warps values.
int64_t recur_ctas(const kdactl_kda_args& a, int V, int warps) {
  return a.batch * a.heads * (V / (16 * warps) > 0 ? V / (16 * warps) : 1);
}

RecurShape pick_recur(const kdactl_kda_args& a, int V, int sm_count) {
  const int warps = tuned({2 * recur_ctas(a, V, 4) >= sm_count ? 4 : 2, 4}, a.tuning).warps;
  return tuned({warps, recur_ctas(a, V, warps) <= sm_count ? 8 : 4}, a.tuning);
}

// Varlen CTAs that outnumber the SMs wait for one; the longest sequences' go first (measured at the
// serving varlen shape, 1152 CTAs: lengths in either order time alike). Fewer all start at once.
template <int K, int V>
int launch(const kdactl_kda_args& a, RecurShape rs, int sms, int optin, cudaStream_t stream) {
  if (a.workspace == nullptr || a.workspace_bytes < blocks_bytes<K, V>(a)) return KDACTL_ERR_BAD_WORKSPACE;
  if (int rc = launch_prepare<K, V>(a, stream)) return rc;
  Segments whole;
  whole.longest_first = a.cu_seqlens != nullptr && recur_ctas(a, V, rs.warps) > sms;
  return launch_pass<K, V, Pass::kWhole>(a, whole, a.batch, rs, optin, stream);
}

}  // namespace

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (head_error(a)) return 0;
  return a.key_dim == 64 ? blocks_bytes<64, 64>(a) : blocks_bytes<128, 128>(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  int sms = 0, optin = 0;
  if (int rc = kdactl_launch_prologue(args, &sms, &optin)) return rc;
  const kdactl_kda_args& a = *args;
  if (int rc = head_error(a)) return rc;
  if (sms == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const RecurShape rs = pick_recur(a, a.value_dim, sms);
  return a.key_dim == 64 ? launch<64, 64>(a, rs, sms, optin, s) : launch<128, 128>(a, rs, sms, optin, s);
}
