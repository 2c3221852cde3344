// Launcher for route "chunk": checks the workspace, launches the prepare pass over every (chunk, head)
// and then the recurrence over every (sequence, head, value slice), both on the caller's stream.
#include "kda_chunk.cuh"

namespace {

using namespace kdactl::chunk;

constexpr int kStages = 3;

template <int K, int V>
uint64_t workspace_bytes(const kdactl_kda_args& a) {
  return static_cast<uint64_t>(num_slots(a)) * a.heads * Block<K, V>::kBytes;
}

// Warps per recurrence CTA (16 value columns each): more CTAs per head shorten nothing on the
// sequential chain but fill more SMs; fewer re-read the shared K-side factors less often.
int pick_warps(const kdactl_kda_args& a, int V, int sm_count) {
  if (a.tuning == 1 || a.tuning == 2 || a.tuning == 4 || a.tuning == 8) return a.tuning;
  const int64_t ctas_at_4 = a.batch * a.heads * (V / 64 > 0 ? V / 64 : 1);
  return ctas_at_4 >= sm_count ? 4 : 2;
}

template <typename Kernel>
int set_smem(Kernel kernel, size_t bytes) {
  return (int)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int K, int V, int WARPS>
int launch_recur(const kdactl_kda_args& a, cudaStream_t stream) {
  if (V % (16 * WARPS) != 0) return KDACTL_ERR_UNSUPPORTED;
  auto kernel = kda_chunk_recur<K, V, WARPS, kStages>;
  const size_t smem = kStages * sizeof(RecurStage<K, 16 * WARPS>) + WARPS * C * 24 * sizeof(bf16);
  if (int rc = set_smem(kernel, smem)) return rc;
  const dim3 grid(V / (16 * WARPS), a.heads, static_cast<unsigned>(a.batch));
  kernel<<<grid, WARPS * 32, smem, stream>>>(a, static_cast<const unsigned char*>(a.workspace));
  return kdactl_launch_status();
}

template <int K, int V>
int launch(const kdactl_kda_args& a, int warps, cudaStream_t stream) {
  if (a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a)) return KDACTL_ERR_BAD_ARGUMENT;
  auto prepare = a.g_is_bf16 ? kda_chunk_prepare<K, V, true> : kda_chunk_prepare<K, V, false>;
  const size_t smem = sizeof(PrepSmem<K, V>);
  if (int rc = set_smem(prepare, smem)) return rc;
  const int64_t slots = num_slots(a);
  if (slots > 0x7fffffff) return KDACTL_ERR_UNSUPPORTED;
  prepare<<<dim3(static_cast<unsigned>(slots), a.heads), 32, smem, stream>>>(a, static_cast<unsigned char*>(a.workspace));
  if (int rc = kdactl_launch_status()) return rc;
  switch (warps) {
    case 1: return launch_recur<K, V, 1>(a, stream);
    case 2: return launch_recur<K, V, 2>(a, stream);
    case 8: return launch_recur<K, V, 8>(a, stream);
    default: return launch_recur<K, V, 4>(a, stream);
  }
}

bool supported(const kdactl_kda_args& a) { return a.key_dim == a.value_dim && (a.key_dim == 64 || a.key_dim == 128); }

}  // namespace

uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a) {
  if (!supported(a)) return 0;
  return a.key_dim == 64 ? workspace_bytes<64, 64>(a) : workspace_bytes<128, 128>(a);
}

extern "C" int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream) {
  if (args == nullptr) return KDACTL_ERR_BAD_ARGUMENT;
  const kdactl_kda_args& a = *args;
  if (a.batch < 0 || a.batch > 65535 || a.heads <= 0 || a.heads > 65535 || a.seqlen < 0) return KDACTL_ERR_BAD_ARGUMENT;
  if (!supported(a)) return KDACTL_ERR_UNSUPPORTED;
  if (a.batch == 0) return 0;
  int rc = kdactl_check_device();
  if (rc != 0) return rc;
  int dev = 0, sms = 0;
  KDACTL_TRY(cudaGetDevice(&dev));
  KDACTL_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  auto s = static_cast<cudaStream_t>(stream);
  const int warps = pick_warps(a, a.value_dim, sms);
  return a.key_dim == 64 ? launch<64, 64>(a, warps, s) : launch<128, 128>(a, warps, s);
}
