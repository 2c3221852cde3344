// Launcher for route "chunk": checks the workspace, then launches either the prepare pass over every
// (chunk, head) and the recurrence over every (sequence, head, value slice), or both in one fused
// grid (kda_chunk_fused.cu), on the caller's stream.
#include "kda_chunk_launch.cuh"

namespace {

using namespace kdactl::chunk;

// Warps per recurrence CTA: more CTAs per head shorten nothing on the sequential chain but fill
// more SMs; fewer re-read the shared K-side factors less often. 4 warps once that gives half the SMs
// a CTA (measured at B1 T8192 H64, scripts/tune_chunk.py: 0.911 ms against 0.945 with 2 warps).
// When every CTA has an SM to itself it takes the deep pipeline; otherwise two or three share an SM
// and hide each other's latency.
RecurShape pick_recur(const kdactl_kda_args& a, int V, int sm_count) {
  const int warps = tuned({2 * recur_units(a, V, 4) >= sm_count ? 4 : 2, 4}, a.tuning).warps;
  return tuned({warps, recur_units(a, V, warps) <= sm_count ? 8 : 4}, a.tuning);
}

// Two kernels: the prepare pass over every (chunk, head), then the recurrence. Varlen CTAs that
// outnumber the SMs wait for one; the longest sequences' go first (measured at the serving varlen
// shape, 1152 CTAs: lengths in either order time alike). Fewer all start at once.
template <int K, int V>
int launch(const kdactl_kda_args& a, RecurShape rs, int sms, int optin, cudaStream_t stream) {
  if (int rc = launch_prepare<K, V>(a, stream)) return rc;
  Segments whole;
  whole.longest_first = a.cu_seqlens != nullptr && recur_units(a, V, rs.warps) > sms;
  return launch_pass<K, V, Pass::kWhole>(a, whole, a.batch, rs, optin, stream);
}

// The fused grid (kda_chunk_fused.cu) when the tuning code's KDACTL_TUNING_FUSED digit is 2, the two
// kernels when it is 1; auto takes the fused grid where it was measured faster (scripts/tune_chunk.py
// --shapes ab, csrc/PERF.md): fixed-length batches whose walks fill 2/3 of the SMs or more within one
// wave and run 128 chunks or more (B1 T8192 H64: 0.721 ms against 0.833, H48: 0.620 against 0.728,
// T2048 H64: 0.201 against 0.227). With fewer walks the producers do not keep up (H32, 64 walks: 0.573
// against 0.565), with fewer chunks the grid's start-up is not paid back (T1024 H64: 0.123 against
// 0.124), and with more walks than SMs the second wave's walks start only when the first's end (H96:
// 1.47 against 1.25).
bool take_fused(const kdactl_kda_args& a, int sms) {
  const int f = a.tuning % KDACTL_TUNING_AHEAD / KDACTL_TUNING_FUSED;
  if (f != 0) return f == 2;
  const int64_t walks = recur_units(a, a.value_dim, 4);
  return a.key_dim == 128 && a.cu_seqlens == nullptr && 3 * walks >= 2 * sms && walks <= sms &&
         a.seqlen >= 128 * C;
}

}  // namespace

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (head_error(a)) return 0;
  return (a.key_dim == 64 ? blocks_bytes<64, 64>(a) : blocks_bytes<128, 128>(a)) + fused_sync_bytes(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  int sms = 0, optin = 0;
  if (int rc = kdactl_launch_prologue(args, &sms, &optin)) return rc;
  const kdactl_kda_args& a = *args;
  if (int rc = head_error(a)) return rc;
  if (sms == 0) return 0;
  if (a.workspace == nullptr || a.workspace_bytes < kdactl_chunk_workspace_bytes(a)) return KDACTL_ERR_BAD_WORKSPACE;
  auto s = static_cast<cudaStream_t>(stream);
  if (take_fused(a, sms)) {
    const int rc = launch_fused(a, sms, optin, s);
    if (rc != KDACTL_ERR_UNSUPPORTED || a.tuning != KDACTL_TUNING_AUTO) return rc;  // else the two kernels
  }
  const RecurShape rs = pick_recur(a, a.value_dim, sms);
  return a.key_dim == 64 ? launch<64, 64>(a, rs, sms, optin, s) : launch<128, 128>(a, rs, sms, optin, s);
}
