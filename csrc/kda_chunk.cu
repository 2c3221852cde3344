// Launcher for route "chunk": checks the workspace, launches the prepare pass over every (chunk, head)
// and then the recurrence over every (sequence, head, value slice), both on the caller's stream.
#include "kda_chunk.cuh"

namespace {

using namespace kdactl::chunk;

template <int K, int V>
uint64_t workspace_bytes(const kdactl_kda_args& a) {
  return static_cast<uint64_t>(num_slots(a)) * a.heads * Block<K, V>::kBytes;
}

struct RecurShape {
  int warps;   // 16 value columns each
  int stages;  // chunks in flight: the recurrence is bound by the latency of its loads
};

// Warps per recurrence CTA: more CTAs per head shorten nothing on the sequential chain but fill
// more SMs; fewer re-read the shared K-side factors less often. When every CTA has an SM to itself
// it takes the deep pipeline; otherwise two or three share an SM and hide each other's latency.
// tuning (benchmarks): 10 * stages + warps, e.g. 84; or warps alone.
RecurShape pick_recur(const kdactl_kda_args& a, int V, int sm_count) {
  const int tw = a.tuning % 10, ts = a.tuning / 10;
  const bool forced_w = tw == 1 || tw == 2 || tw == 4 || tw == 8;
  const int64_t ctas_at_4 = a.batch * a.heads * (V / 64 > 0 ? V / 64 : 1);
  const int warps = forced_w ? tw : ctas_at_4 >= sm_count ? 4 : 2;
  const int64_t ctas = a.batch * a.heads * (V / (16 * warps) > 0 ? V / (16 * warps) : 1);
  const int stages = (ts == 4 || ts == 8) ? ts : ctas <= sm_count ? 8 : 4;
  return {warps, stages};
}

template <typename Kernel>
int set_smem(Kernel kernel, size_t bytes) {
  return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int K, int WARPS, int STAGES>
constexpr size_t recur_smem() {
  return STAGES * sizeof(RecurStage<K, 16 * WARPS>) + WARPS * C * 24 * sizeof(bf16);
}

template <int K, int V, int WARPS, int STAGES>
int launch_recur(const kdactl_kda_args& a, cudaStream_t stream) {
  if (V % (16 * WARPS) != 0) return KDACTL_ERR_UNSUPPORTED;
  auto kernel = kda_chunk_recur<K, V, WARPS, STAGES>;
  const size_t smem = recur_smem<K, WARPS, STAGES>();
  if (int rc = set_smem(kernel, smem)) return rc;
  const dim3 grid(V / (16 * WARPS), a.heads, static_cast<unsigned>(a.batch));
  kernel<<<grid, WARPS * 32, smem, stream>>>(a, static_cast<const unsigned char*>(a.workspace));
  return kdactl_launch_status();
}

// The deep ring where the device's shared memory per block allows it (227 KB on sm_90 and sm_100,
// 163 KB on sm_80, 99 KB on sm_86/89/120), else the 4-stage one.
template <int K, int V, int WARPS>
int launch_stages(const kdactl_kda_args& a, int stages, int smem_optin, cudaStream_t stream) {
  if (stages == 8 && recur_smem<K, WARPS, 8>() <= static_cast<size_t>(smem_optin))
    return launch_recur<K, V, WARPS, 8>(a, stream);
  if (recur_smem<K, WARPS, 4>() > static_cast<size_t>(smem_optin)) return KDACTL_ERR_UNSUPPORTED;
  return launch_recur<K, V, WARPS, 4>(a, stream);
}

template <int K, int V>
int launch(const kdactl_kda_args& a, RecurShape rs, int smem_optin, cudaStream_t stream) {
  if (a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a)) return KDACTL_ERR_BAD_ARGUMENT;
  auto prepare = a.g_is_bf16 ? kda_chunk_prepare<K, V, true> : kda_chunk_prepare<K, V, false>;
  const size_t smem = a.g_is_bf16 ? sizeof(PrepSmem<K, V, true>) : sizeof(PrepSmem<K, V, false>);
  if (int rc = set_smem(prepare, smem)) return rc;
  const int64_t slots = num_slots(a);
  if (slots > 0x7fffffff) return KDACTL_ERR_UNSUPPORTED;
  prepare<<<dim3(static_cast<unsigned>(slots), a.heads), 32, smem, stream>>>(a, static_cast<unsigned char*>(a.workspace));
  if (int rc = kdactl_launch_status()) return rc;
  switch (rs.warps) {
    case 1: return launch_stages<K, V, 1>(a, rs.stages, smem_optin, stream);
    case 2: return launch_stages<K, V, 2>(a, rs.stages, smem_optin, stream);
    case 8: return launch_stages<K, V, 8>(a, rs.stages, smem_optin, stream);
    default: return launch_stages<K, V, 4>(a, rs.stages, smem_optin, stream);
  }
}

bool supported(const kdactl_kda_args& a) { return a.key_dim == a.value_dim && (a.key_dim == 64 || a.key_dim == 128); }

}  // namespace

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (!supported(a)) return 0;
  return a.key_dim == 64 ? workspace_bytes<64, 64>(a) : workspace_bytes<128, 128>(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  int sms = 0;
  if (int rc = kdactl_launch_prologue(args, &sms)) return rc;
  const kdactl_kda_args& a = *args;
  if (!supported(a)) return KDACTL_ERR_UNSUPPORTED;
  if (sms == 0) return 0;
  int dev = 0, smem_optin = 0;
  KDACTL_TRY(cudaGetDevice(&dev));
  KDACTL_TRY(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  auto s = static_cast<cudaStream_t>(stream);
  const RecurShape rs = pick_recur(a, a.value_dim, sms);
  return a.key_dim == 64 ? launch<64, 64>(a, rs, smem_optin, s) : launch<128, 128>(a, rs, smem_optin, s);
}
