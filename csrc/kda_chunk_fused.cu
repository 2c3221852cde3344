// Launcher of route "chunk"'s fused kernel (kda_chunk_fused.cuh), apart from kda_chunk.cu so that the
// two compile in parallel.
#include "kda_chunk_fused.cuh"
#include "kda_chunk_launch.cuh"

namespace kdactl {
namespace chunk {
namespace {

// 4 walk warps, a 2-stage ring (the factors come from L2, just written), and as many producers as
// the shared memory then holds (6). Side by side at B1 T8192 H64 (scripts/tune_chunk.py, csrc/PERF.md):
// 0.726 ms, against 0.89 with 4 stages and 4 producers, 0.74-0.77 with 7 producers or 3-4 stages.
// K = 64 takes 4 producers: with 6 (10 warps, 168 registers a thread) its walk spilled 156 bytes.
constexpr int kWarps = 4, kStages = 2;
template <int K>
constexpr int kProducers = K == 64 ? 4 : 6;
// Producers claim no job more than `ahead` chunks past the slowest started walk, which keeps the factors
// not yet read in L2 (1.3 MB a chunk at H64) and leaves the walks more issue slots. It pays where the
// SMs without a walk hold many producers: at B1 T8192 H48 and H56 (96 and 112 walks) 24 chunks took
// 0.620 and 0.667 ms against 0.664 and 0.710 unpaced; with 128 walks it costs (H64: 0.728 against
// 0.721, T2048 H64: 0.214 against 0.201), and 8 or 16 chunks starve the walks (H64: 1.61, 0.85).
// At least kAheadMin: a walk waiting on chunk c has counted itself past c - 3 only, with 2 stages.
constexpr int kAheadMin = 4;
int auto_ahead(int64_t walks, int sms) { return walks + sms / 8 <= sms ? 24 : 0; }

// Grid: one CTA per walk, and producer-only CTAs up to one wave's worth when the walks are fewer.
template <int K, int V>
int launch_as(const kdactl_kda_args& a, int sms, int optin, cudaStream_t stream) {
  const int64_t units = recur_units(a, V, kWarps);
  int rc = 0;
  with_types(a, [&](auto g_type, auto in_type) {
    using GT = decltype(g_type);
    using In = decltype(in_type);
    auto kernel = kda_chunk_fused<K, V, GT, In, kWarps, kStages, kProducers<K>>;
    constexpr size_t smem = fused_smem<K, V, GT, In, kWarps, kStages, kProducers<K>>();
    constexpr int threads = (kWarps + kProducers<K>) * 32;
    if (smem > static_cast<size_t>(optin)) { rc = KDACTL_ERR_UNSUPPORTED; return; }
    if ((rc = set_smem(kernel, smem))) return;
    int per_sm = 0;
    if ((rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem))) return;
    const int64_t wave = static_cast<int64_t>(per_sm) * sms, grid = units > wave ? units : wave;
    if (grid > 0x7fffffff) { rc = KDACTL_ERR_UNSUPPORTED; return; }
    unsigned char* ws = static_cast<unsigned char*>(a.workspace);
    unsigned char* sync = ws + blocks_bytes<K, V>(a);
    int* done = reinterpret_cast<int*>(sync + 16);
    const int asked = a.tuning / KDACTL_TUNING_AHEAD > 0 ? a.tuning / KDACTL_TUNING_AHEAD : auto_ahead(units, sms);
    // Varlen walks end at their own chunk counts, which the count of started walks cannot tell apart.
    const int ahead = a.cu_seqlens || asked == 0 ? 0 : asked < kAheadMin ? kAheadMin : asked;
    const FusedSync fs{reinterpret_cast<unsigned long long*>(sync), reinterpret_cast<int*>(sync + 8), done,
                       done + num_slots(a) * a.heads, ahead};
    if ((rc = cudaMemsetAsync(sync, 0, fused_sync_bytes(a), stream))) return;
    Segments whole;
    whole.longest_first = a.cu_seqlens != nullptr && units > wave;
    kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(a, ws, fs, whole, units);
    rc = kdactl_launch_status();
  });
  return rc;
}

}  // namespace

int launch_fused(const kdactl_kda_args& a, int sms, int optin, cudaStream_t stream) {
  return a.key_dim == 64 ? launch_as<64, 64>(a, sms, optin, stream) : launch_as<128, 128>(a, sms, optin, stream);
}

}  // namespace chunk
}  // namespace kdactl
