// A measurement, not a route (tools/ahead_probe.py builds and times it): the lead "Prepare ahead, then beside
// the walk" (docs/routes/small_bh.md, open leads). Route small_bh's passes on its own segments, with the
// prepare split in two so that part of it runs while the walk does:
//   1. kda_ahead_prepare, the prepare at full occupancy (one warp a CTA, prepare_chunk unchanged) over the
//      first `ahead` chunks of every segment and the last kTail of every segment but the last (the next
//      segment's warm start reads their bounds, and walks them);
//   2. kda_ahead_walk, one CTA an SM per (sequence, segment, head): two walk warpgroups (route small_bh's
//      kReduce, `recur` unchanged, one a value slice) and 4 prepare warps that prepare the segment's other
//      chunks into the workspace while the walks start on the chunks prepared ahead. A walk reads every
//      block from the workspace as kReduce does; before it loads one of the CTA's own chunks it waits for
//      the warp that prepares it to count it done (a flag in shared memory, no barrier: the prepare warps
//      never wait, so they run as far ahead as they can). setmaxnreg moves registers from the prepare
//      warpgroup to the walks (kWalkRegs).
// A segment that does not start warm within kTail chunks sets the flag in the workspace's last word (where
// small_bh keeps its all_warm answer, unused here) and returns: the probe does not stitch, and its caller
// refuses such a call. The o and final state of a call that starts every segment warm are small_bh's at the
// same segments, bit for bit: the same prepare, the same walk, the same warm starts.
// Scope: fixed-length batches, K = V = 128, bf16 q, k, v and g, no state pool, no checkpoints, segments of
// more than kTail chunks.
#include "kda_small_bh.cuh"

namespace kdactl {
namespace chunk {
namespace ahead {

using small_bh::segments_of;
using small_bh::workspace_bytes;

constexpr int K = 128, V = 128;
constexpr int kWalkWarps = small_bh::kPlanned.warps, kStages = small_bh::kPlanned.stages;  // kReduce's CTA
constexpr int kWalks = V / (16 * kWalkWarps);  // walk warpgroups: each value slice of a (segment, head)
constexpr int kWalkThreads = kWalkWarps * 32;
constexpr int kPrepWarps = 4;  // one warpgroup
constexpr int kThreads = kWalks * kWalkThreads + kPrepWarps * 32;
constexpr int kTail = kWarmLoads;  // warm_start_at reads this many bounds back at once
// setmaxnreg moves registers only within what the CTA got at launch: ptxas' count for kThreads threads, one
// CTA an SM (65536 / 384, down to a multiple of 8). An inc that asks for more than the decs gave back waits for
// ever. The walks need 184 not to spill here (kReduce's kernel alone takes 186), the prepare 128 (it gets the rest).
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kWalkRegs = 184, kPrepRegs = 136;
static_assert(kWalks * kWalkRegs + kPrepRegs <= (kWalks + 1) * kLaunchRegs && kWalkWarps * 32 == 128 &&
                  kPrepWarps * 32 == 128, "two walk warpgroups and a prepare warpgroup in what the CTA got at launch");
using In = __nv_bfloat16;
using GT = __nv_bfloat16;
using Prep = PrepSmem<K, GT, In>;
constexpr size_t kWalkSmem = recur_smem<K, kWalkWarps, kStages>();
static_assert(kWalkSmem % 128 == 0, "each walk's ring on whole lines");

struct Smem {
  alignas(128) unsigned char walk[kWalks][kWalkSmem];
  Prep prep[kPrepWarps];
  int done[kPrepWarps];  // chunks prepare warp w has prepared (its chunks in order: begin + w, + 4, ...)
  int64_t own_begin, own_end;  // the CTA's own chunks (own_chunks), kept here: the walks have no register to spare
};

// A segment's chunks that its CTA prepares itself: [begin, end), the rest prepared ahead.
struct OwnChunks {
  int64_t begin, end;
};
__host__ __device__ inline OwnChunks own_chunks(int64_t seg_chunks, int count, int ahead, int p, int64_t nchunks) {
  const int64_t first = p * seg_chunks, last = p + 1 < count ? (p + 1) * seg_chunks - kTail : nchunks;
  const int64_t begin = first + ahead < nchunks ? first + ahead : nchunks;
  return {begin, last > begin ? last : begin};
}

// Chunks prepared ahead in each segment but the last (`ahead` from its start and its kTail last ones)
// and in the last one (its first `ahead`, or all of it).
__host__ __device__ inline int64_t ahead_chunks(int64_t seg_chunks, int count, int ahead, int64_t nchunks) {
  const int64_t last_len = nchunks - (count - 1) * seg_chunks;
  return (count - 1) * static_cast<int64_t>(ahead + kTail) + (ahead < last_len ? ahead : last_len);
}

// One chunk prepared ahead a CTA, heads fastest (as the library's prepare); CTA 0 first clears the flag.
__global__ void __launch_bounds__(32) kda_ahead_prepare(const kdactl_kda_args a, unsigned char* ws, int ahead,
                                                        int64_t per_seq, unsigned* cold) {
#if !defined(KDACTL_WGMMA)
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (blockIdx.x == 0 && threadIdx.x == 0) *cold = 0u;
  const int H = a.heads, h = static_cast<int>(blockIdx.x % H);
  const int64_t r = blockIdx.x / H, n = per_seq ? r / per_seq : 0, j = per_seq ? r % per_seq : 0;
  if (per_seq == 0 || n >= a.batch) return;  // (the one CTA of a call with nothing ahead)
  const int64_t S = a.segment_chunks, per_seg = ahead + kTail;
  int64_t bos, eos;
  sequence_bounds(a, n, bos, eos);
  const int64_t nchunks = (eos - bos + C - 1) / C;
  const int count = static_cast<int>((nchunks + S - 1) / S);
  const int64_t full = (count - 1) * per_seg;  // ahead chunks of the segments before the last
  const int64_t p = j < full ? j / per_seg : count - 1, o = j < full ? j % per_seg : j - full;
  const int64_t c = p * S + (o < ahead || p == count - 1 ? o : S - kTail + (o - ahead));
  const int64_t row0 = bos + c * C, at = (bos / C + n + c) * H + h;
  prepare_chunk<K, GT, In, true>(a, ws + at * Block<K>::kBytes, chunk_bounds<K>(a, ws) + at, h, row0,
                                 static_cast<int>(eos - row0 < C ? eos - row0 : C),
                                 *reinterpret_cast<Prep*>(smem_raw));
#endif
}

// A walk warpgroup's seat in the CTA (kda_chunk.cuh, recur): its threads numbered from 0, named barrier
// 1 + its index, and before it loads chunk c of the CTA's own, a wait until the prepare warp of chunk c
// has counted it.
struct AheadSeat {
  static constexpr bool kWhole = false;
  const Smem* sm;
  __device__ __forceinline__ unsigned tid() const { return threadIdx.x % kWalkThreads; }
  __device__ __forceinline__ void sync(int threads) const { named_sync(1 + threadIdx.x / kWalkThreads, threads); }
  __device__ __forceinline__ void before_load(int64_t c) const {
    const int64_t begin = sm->own_begin;
    if (c < begin || c >= sm->own_end) return;
    const int64_t i = c - begin;
    const volatile int* done = sm->done;
    while (done[i % kPrepWarps] <= i / kPrepWarps) spin_pause();
    fence_cta();  // the block's reads after the count that published it
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    kda_ahead_walk(const kdactl_kda_args a, unsigned char* ws, const Segments sg, int ahead, unsigned* cold) {
#if !defined(KDACTL_WGMMA)
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int p = blockIdx.x, h = blockIdx.y, H = a.heads;
  const int64_t n = blockIdx.z;
  int64_t bos, eos;
  sequence_bounds(a, n, bos, eos);
  const int64_t nchunks = (eos - bos + C - 1) / C, slot0 = bos / C + n;
  // Every thread asks (the same bounds, the same answer): no segment walks from a start it cannot vouch for.
  if (p > 0 && warm_start_at<kTail>(sg, slot0, h, H, p * sg.chunks) < 0) {
    if (threadIdx.x == 0) atomicOr(cold, 1u);
    return;
  }
  if (threadIdx.x < kPrepWarps) sm.done[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    const OwnChunks own = own_chunks(sg.chunks, sg.count, ahead, p, nchunks);
    sm.own_begin = own.begin, sm.own_end = own.end;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp >= kWalks * kWalkWarps) {
    setmaxnreg_dec<kPrepRegs>();
    const int w = warp - kWalks * kWalkWarps;
    int prepared = 0;
    for (int64_t c = sm.own_begin + w, end = sm.own_end; c < end; c += kPrepWarps) {
      const int64_t row0 = bos + c * C, at = (slot0 + c) * H + h;
      prepare_chunk<K, GT, In, true>(a, ws + at * Block<K>::kBytes, chunk_bounds<K>(a, ws) + at, h, row0,
                                     static_cast<int>(eos - row0 < C ? eos - row0 : C), sm.prep[w]);
      fence_gpu();  // this lane's block and bound in L2 before the count (the walks read them there)
      __syncwarp();
      if ((threadIdx.x & 31) == 0) static_cast<volatile int*>(sm.done)[w] = ++prepared;
    }
    return;
  }
  setmaxnreg_inc<kWalkRegs>();
  const int walk = warp / kWalkWarps;
  const int64_t unit = n * sg.count + p;  // kReduce's E slot of this unit is z = 2 unit (sg.all_warm is null)
  recur<K, V, kWalkWarps, kStages, Pass::kReduce, false, false>(a, ws, sg, sm.walk[walk], walk, h, 2 * unit,
                                                                 AheadSeat{&sm});
#endif
}

int g_ahead = 0;  // kdactl_ahead_probe_chunks'

}  // namespace ahead
}  // namespace chunk
}  // namespace kdactl

// How many chunks at the start of each segment the ahead kernel prepares (the rest, but for each segment's
// last kTail, its CTA's prepare warps); at most the segment's chunks less kTail.
extern "C" void kdactl_ahead_probe_chunks(int ahead) { kdactl::chunk::ahead::g_ahead = ahead; }

// kdactl's launcher signature (kdactl_kda_args, stream), with route small_bh's workspace: the workspace's last
// word is nonzero after a call where a segment did not start warm. KDACTL_ERR_UNSUPPORTED outside the scope.
extern "C" int kdactl_ahead_probe(const kdactl_kda_args* args, void* stream) {
  using namespace kdactl::chunk;
  using namespace kdactl::chunk::ahead;
  const kdactl_kda_args& a = *args;
  if (a.varlen || a.key_dim != K || a.value_dim != V || a.qkv_fp16 || a.g_dtype != KDACTL_DTYPE_BF16 ||
      a.checkpoints || a.state_indices || a.segment_chunks <= kTail || a.seqlen <= 0 || a.batch <= 0 ||
      a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a))
    return KDACTL_ERR_UNSUPPORTED;
  Segments sg = segments_of<K, V>(a);
  sg.all_warm = nullptr;  // the walk's grid is kReduce's with M slots, whose E slots alone run here
  const int64_t S = a.segment_chunks, nchunks = (a.seqlen + C - 1) / C;
  const int ahead = static_cast<int>(g_ahead < 0 ? 0 : g_ahead > S - kTail ? S - kTail : g_ahead);
  unsigned char* ws = static_cast<unsigned char*>(a.workspace);
  auto* cold = reinterpret_cast<unsigned*>(ws + workspace_bytes<K, V>(a) - sizeof(unsigned));
  const int64_t per_seq = ahead_chunks(S, sg.count, ahead, nchunks);
  const int64_t ctas = per_seq * a.batch * a.heads;
  if (ctas > 0x7fffffff) return KDACTL_ERR_UNSUPPORTED;
  auto s = static_cast<cudaStream_t>(stream);
  KDACTL_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kda_ahead_prepare),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(Prep))));
  kda_ahead_prepare<<<static_cast<unsigned>(ctas > 0 ? ctas : 1), 32, sizeof(Prep), s>>>(a, ws, ahead, per_seq, cold);
  if (int rc = kdactl_launch_status()) return rc;
  const int smem = static_cast<int>(sizeof(Smem));
  KDACTL_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kda_ahead_walk),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(sg.count), a.heads, static_cast<unsigned>(a.batch));
  kda_ahead_walk<<<grid, kThreads, smem, s>>>(a, ws, sg, ahead, cold);
  return kdactl_launch_status();
}
