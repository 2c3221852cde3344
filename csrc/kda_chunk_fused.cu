// Launcher of route "chunk"'s fused kernel (kda_chunk_fused.cuh), apart from kda_chunk.cu so that the
// two compile in parallel.
#include "kda_chunk_fused.cuh"
#include "kda_chunk_launch.cuh"

namespace kdactl {
namespace chunk {
namespace {

// Walks of 4 warps (one per 64-value slice) or 8 (all 128 values: one walk per head, the K-side
// factors loaded once for both slices), a 2-stage ring (the factors come from L2, just written), and
// room for as many producers as the shared memory then holds, at most 8 (12 warps keep 168 registers
// a thread, 16 get 128); the policy (fused_producers) says how many run beside a walk, and when the
// launcher takes the grid at all (fused_walk_warps: only when a tuning code asks, since the two
// kernels got faster). Side by side at B1 T8192 H64 with 4-warp walks
// (tools/tune_chunk.py, docs/routes/chunk.md): 2 stages 0.726 ms, against 0.89 with 4 stages and 4
// producers, 0.74 with 3. K = 64 takes 4: with 6 (10 warps, 168 registers) its walk spilled 156 bytes.
constexpr int kStages = 2, kProducersMax = 8;
constexpr size_t kSmemOptin = 227 * 1024;  // sm_90 and sm_100; smaller parts get no fused grid
constexpr size_t kStaticSmem = 1024;       // the walk's own __shared__ (longest_first), with room to spare
template <int K, int WARPS, typename GT, typename In>
constexpr int producers() {
  if (K == 64) return 4;
  const size_t fit = (kSmemOptin - kStaticSmem - recur_smem<K, WARPS, kStages>()) / sizeof(PrepSmem<K, GT, In>);
  return fit < kProducersMax ? static_cast<int>(fit) : kProducersMax;
}
// Grid: one CTA per walk, and producer-only CTAs up to one wave's worth when the walks are fewer.
template <int K, int V, int WARPS>
int launch_as(const kdactl_kda_args& a, int sms, int optin, cudaStream_t stream) {
  const int64_t units = recur_units(a, V, WARPS);
  int rc = 0;
  with_types(a, [&](auto g_type, auto in_type) {
    using GT = decltype(g_type);
    using In = decltype(in_type);
    constexpr int PROD = producers<K, WARPS, GT, In>();
    auto kernel = kda_chunk_fused<K, V, GT, In, WARPS, kStages, PROD>;
    constexpr size_t smem = fused_smem<K, GT, In, WARPS, kStages, PROD>();
    constexpr int threads = (WARPS + PROD) * 32;
    if (smem > static_cast<size_t>(optin)) { rc = KDACTL_ERR_UNSUPPORTED; return; }
    if ((rc = set_smem(kernel, smem))) return;
    int per_sm = 0;
    if ((rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem))) return;
    const int64_t wave = static_cast<int64_t>(per_sm) * sms, grid = units > wave ? units : wave;
    if (grid > 0x7fffffff) { rc = KDACTL_ERR_UNSUPPORTED; return; }
    unsigned char* ws = static_cast<unsigned char*>(a.workspace);
    unsigned char* sync = ws + blocks_bytes<K>(a);
    int* done = reinterpret_cast<int*>(sync + 16);
    const FusedSync fs{reinterpret_cast<unsigned long long*>(sync), reinterpret_cast<int*>(sync + 8), done,
                       done + num_slots(a) * a.heads, fused_ahead(a)};
    if ((rc = cudaMemsetAsync(sync, 0, fused_sync_bytes(a), stream))) return;
    Segments whole;
    whole.longest_first = a.varlen && units > wave;
    kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(a, ws, fs, whole, units,
                                                                   fused_producers(a, WARPS, PROD));
    rc = kdactl_launch_status();
  });
  return rc;
}

}  // namespace

int launch_fused(const kdactl_kda_args& a, int walk_warps, int sms, int optin, cudaStream_t stream) {
  if (a.key_dim == 64) return walk_warps == 4 ? launch_as<64, 64, 4>(a, sms, optin, stream) : KDACTL_ERR_BAD_TUNING;
  return walk_warps == 8 ? launch_as<128, 128, 8>(a, sms, optin, stream) : launch_as<128, 128, 4>(a, sms, optin, stream);
}

}  // namespace chunk
}  // namespace kdactl
