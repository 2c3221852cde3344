// Route "small_bh": few (sequence, head) pairs and long sequences. The chunk route's recurrence is
// one chain of T / 16 steps per (sequence, head, value slice) and leaves most SMs idle there; this
// route cuts every sequence into segments of `segment_chunks` chunks (kdactl/kda/routes.py plans
// them) and runs the chain on all segments at once:
//   1. the chunk route's prepare pass over every (chunk, head);
//   2. kReduce: per segment, its end state from a zero start, E, and its state map M (S_end = M S_start
//      + E) as the end states of the identity's columns;
//   3. stitch: per (sequence, head, 8 value columns), the start states S_{p+1} = M_p S_p + E_p in fp32,
//      a short sequential pass over the segments;
//   4. kReplay: every segment again from its start state, writing o and the final state.
// Fixed-length layout only (segments are cut at fixed chunk indices), K == V.
#include "kda_chunk_launch.cuh"

namespace {

using namespace kdactl::chunk;
using kdactl::cp_async16;
using kdactl::cp_async_commit;

constexpr int kStitchCols = 8;  // value columns per stitch CTA

int64_t segment_count(const kdactl_kda_args& a) {
  const int64_t chunks = (a.seqlen + C - 1) / C;
  return (chunks + a.segment_chunks - 1) / a.segment_chunks;
}

// Workspace: the prepared blocks, then E [N][P][H][K][V] and M^T [N][P][H][K][K] in fp32.
template <int K, int V>
uint64_t workspace_bytes(const kdactl_kda_args& a) {
  const uint64_t states = static_cast<uint64_t>(a.batch) * segment_count(a) * a.heads;
  return blocks_bytes<K>(a) + states * (K * V + K * K) * sizeof(float);
}

template <int K, int V>
Segments segments_of(const kdactl_kda_args& a) {
  Segments sg;
  sg.chunks = a.segment_chunks;
  sg.count = static_cast<int>(segment_count(a));
  unsigned char* base = static_cast<unsigned char*>(a.workspace) + blocks_bytes<K>(a);
  sg.ends = reinterpret_cast<float*>(base);
  sg.maps = sg.ends + static_cast<int64_t>(a.batch) * sg.count * a.heads * K * V;
  return sg;
}

// One CTA per (sequence, head, kStitchCols value columns), thread k owns row k of the start state.
// M^T_p is staged in shared memory, the next one in flight while this one is used when BUFS == 2.
template <int K, int V, int BUFS>
__global__ void __launch_bounds__(K) kda_small_bh_stitch(const kdactl_kda_args a, const Segments sg) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  extern __shared__ __align__(16) float stitch_smem[];
  float* maps = stitch_smem;          // [BUFS][K][K]: M^T, so that thread k reads column k (no conflicts)
  float* start = maps + BUFS * K * K;  // [K][kStitchCols]: S_p, this CTA's columns
  const int k = threadIdx.x, col0 = blockIdx.x * kStitchCols, h = blockIdx.y, H = a.heads;
  const int64_t n = blockIdx.z;
  const int P = sg.count;
  auto seg = [&](int p) { return (n * P + p) * H + h; };
  auto load_map = [&](int p, int buf) {
    const float* src = sg.maps + seg(p) * K * K;
    for (int i = k; i < K * K / 4; i += K) cp_async16(maps + buf * K * K + 4 * i, src + 4 * i);
    cp_async_commit();
  };
  auto row = [&](int p) { return sg.ends + seg(p) * K * V + k * V + col0; };

  {  // S_1 = E_0, which stays where it is
    const float4 lo = *reinterpret_cast<const float4*>(row(0)), hi = *reinterpret_cast<const float4*>(row(0) + 4);
    *reinterpret_cast<float4*>(start + k * kStitchCols) = lo;
    *reinterpret_cast<float4*>(start + k * kStitchCols + 4) = hi;
  }
  if (P <= 2) return;
  load_map(1, 0);
  for (int p = 1; p <= P - 2; ++p) {
    const int buf = (p - 1) % BUFS;
    const float4 e_lo = *reinterpret_cast<const float4*>(row(p)), e_hi = *reinterpret_cast<const float4*>(row(p) + 4);
    if (BUFS == 2 && p + 1 <= P - 2) {
      load_map(p + 1, p % BUFS);
      kdactl::cp_async_wait<1>();
    } else {
      kdactl::cp_async_wait_all();
    }
    __syncthreads();  // M^T_p and S_p are in
    float acc[kStitchCols] = {};  // E_p joins after the product, so that its load overlaps it
    const float* mt = maps + buf * K * K;
#pragma unroll 8
    for (int j = 0; j < K; ++j) {
      const float m = mt[j * K + k];
      const float4 lo = *reinterpret_cast<const float4*>(start + j * kStitchCols);
      const float4 hi = *reinterpret_cast<const float4*>(start + j * kStitchCols + 4);
      acc[0] = fmaf(m, lo.x, acc[0]), acc[1] = fmaf(m, lo.y, acc[1]);
      acc[2] = fmaf(m, lo.z, acc[2]), acc[3] = fmaf(m, lo.w, acc[3]);
      acc[4] = fmaf(m, hi.x, acc[4]), acc[5] = fmaf(m, hi.y, acc[5]);
      acc[6] = fmaf(m, hi.z, acc[6]), acc[7] = fmaf(m, hi.w, acc[7]);
    }
    __syncthreads();  // everyone is done with S_p and this buffer
    const float4 lo = make_float4(acc[0] + e_lo.x, acc[1] + e_lo.y, acc[2] + e_lo.z, acc[3] + e_lo.w);
    const float4 hi = make_float4(acc[4] + e_hi.x, acc[5] + e_hi.y, acc[6] + e_hi.z, acc[7] + e_hi.w);
    *reinterpret_cast<float4*>(start + k * kStitchCols) = lo;
    *reinterpret_cast<float4*>(start + k * kStitchCols + 4) = hi;
    *reinterpret_cast<float4*>(row(p)) = lo;  // S_{p+1}, where segment p + 1's replay reads it
    *reinterpret_cast<float4*>(row(p) + 4) = hi;
    if (BUFS == 1 && p + 1 <= P - 2) load_map(p + 1, 0);
  }
#endif
}

template <int K, int V>
int launch_stitch(const kdactl_kda_args& a, const Segments& sg, int optin, cudaStream_t stream) {
  const dim3 grid(V / kStitchCols, a.heads, static_cast<unsigned>(a.batch));
  auto bytes = [](int bufs) { return (static_cast<size_t>(bufs) * K * K + K * kStitchCols) * sizeof(float); };
  const bool two = bytes(2) <= static_cast<size_t>(optin);
  auto kernel = two ? kda_small_bh_stitch<K, V, 2> : kda_small_bh_stitch<K, V, 1>;
  const size_t smem = bytes(two ? 2 : 1);
  if (smem > static_cast<size_t>(optin)) return KDACTL_ERR_UNSUPPORTED;
  if (int rc = set_smem(kernel, smem)) return rc;
  kernel<<<grid, K, smem, stream>>>(a, sg);
  return kdactl_launch_status();
}

// The recurrence shape the plan (kdactl.kda.routes.small_bh_plan) counts on: KDACTL_SMALL_BH_CTAS_PER_SM
// of these CTAs share an SM (at K = 128, 77 KB of shared memory each plus the 1 KB the hardware
// reserves per CTA, in the 228 KB of an sm_90 / sm_100 SM), and one more would not fit. 4 warps a
// CTA, each loading the K-side factors for 64 values: with the plan cut for 2-warp CTAs, 4 warps
// already took B1 T65536 H8 1.294 ms against 1.414 and B1 T1048576 H1 2.887 against 3.063 (docs/routes/small_bh.md).
constexpr RecurShape kPlanned = {4, 4};
constexpr size_t kPlannedCtaBytes = recur_smem<128, kPlanned.warps, kPlanned.stages>() + 1024;
static_assert(KDACTL_SMALL_BH_CTAS_PER_SM * kPlannedCtaBytes <= 228 * 1024 &&
                  (KDACTL_SMALL_BH_CTAS_PER_SM + 1) * kPlannedCtaBytes > 228 * 1024,
              "the small_bh recurrence no longer fits exactly KDACTL_SMALL_BH_CTAS_PER_SM CTAs in an SM");

template <int K, int V>
int launch(const kdactl_kda_args& a, int optin, cudaStream_t stream) {
  if (a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a)) return KDACTL_ERR_BAD_WORKSPACE;
  const Segments sg = segments_of<K, V>(a);
  if (2 * a.batch * sg.count > KDACTL_MAX_GRID_DIM) return KDACTL_ERR_BAD_SEGMENT_CHUNKS;  // the reduction's grid z
  const RecurShape rs = tuned(kPlanned, a);
  if (rs.warps != kPlanned.warps || rs.stages != kPlanned.stages) return KDACTL_ERR_BAD_TUNING;  // the one built
  constexpr int W = kPlanned.warps, S = kPlanned.stages;
  if (int rc = launch_prepare(a, stream)) return rc;
  if (int rc = launch_recur<K, V, W, S, Pass::kReduce>(a, sg, 2 * a.batch * sg.count, optin, stream)) return rc;
  if (int rc = launch_stitch<K, V>(a, sg, optin, stream)) return rc;
  return launch_recur<K, V, W, S, Pass::kReplay>(a, sg, a.batch * sg.count, optin, stream);
}

// 0 when this route has a kernel for `a`, else the code naming the argument that stops it.
int argument_error(const kdactl_kda_args& a) {
  if (int rc = head_error(a)) return rc;
  if (a.varlen) return KDACTL_ERR_BAD_CU_SEQLENS;
  return a.segment_chunks > 0 ? 0 : KDACTL_ERR_BAD_SEGMENT_CHUNKS;
}

}  // namespace

uint64_t kdactl_small_bh_workspace_bytes(const kdactl_kda_args& a) {
  if (argument_error(a)) return 0;
  return a.key_dim == 64 ? workspace_bytes<64, 64>(a) : workspace_bytes<128, 128>(a);
}

extern "C" int kdactl_kda_small_bh(const kdactl_kda_args* args, void* stream) {
  int sms = 0, optin = 0;
  if (int rc = kdactl_launch_prologue(args, &sms, &optin)) return rc;
  const kdactl_kda_args& a = *args;
  if (int rc = argument_error(a)) return rc;
  if (sms == 0) return 0;
  if (segment_count(a) < 1) return KDACTL_ERR_BAD_SEQLEN;  // T = 0: the plan never sends it here
  auto s = static_cast<cudaStream_t>(stream);
  return a.key_dim == 64 ? launch<64, 64>(a, optin, s) : launch<128, 128>(a, optin, s);
}
