// Route "small_bh": few (sequence, head) pairs and long sequences. The chunk route's recurrence is
// one chain of T / 16 steps per (sequence, head, value slice) and leaves most SMs idle there; this
// route cuts every sequence into segments of `segment_chunks` chunks (kdactl/kda/routes.py plans
// them) and runs the chain on all segments at once:
//   1. the chunk route's prepare pass over every (chunk, head), with a bound on each chunk's state map;
//   2. kReduce: a segment whose start is known (segment 0, from the initial state; or one whose
//      preceding chunks provably forget their history, warm_start in kda_chunk.cuh, from a zero state a
//      few chunks early) is walked whole, writing o and its end state. Of any other, its end state from
//      a zero start, E, and its state map M (S_end = M S_start + E) as the end states of the identity's
//      columns, where the next segment is stitched from them;
//   3. stitch: per (sequence, head, 8 value columns), the start states S_{p+1} = M_p S_p + E_p in fp32,
//      a short sequential pass over the segments (a known segment's E is its end state already);
//   4. kReplay: each stitched segment from its start state, writing o and the final state.
// Where kReduce's grid (E and M slots) fits one wave, a known segment whose middle starts warm too is
// walked in two halves at once by its E and M slots (Segments::halves), since it needs no M.
// Where every segment starts known (strongly decaying gates), kReduce alone runs the recurrence: one
// pass over T / segments chunks and the few each warm start walks first. A sequence of at most
// KDACTL_SMALL_BH_MAX_UNSTITCHED segments is never stitched (two reduction walks, a stitch and a replay
// cost more than one walk of its length). In a fixed layout a kernel then decides on the device: kReduce
// where every segment starts warm, else route chunk's walk of whole sequences. In a varlen batch kReduce
// walks each known segment of such a sequence on through the ones after it that do not start known.
// Fixed and varlen layouts (varlen: the units of kda_small_bh_units, so that a batch is balanced by its
// tokens, not by its sequences), state pools (their start states kept apart first), K == V.
#include "kda_small_bh.cuh"

namespace {

using namespace kdactl::chunk;
using namespace kdactl::small_bh;
using kdactl::cp_async16;
using kdactl::cp_async_commit;

constexpr int kStitchCols = 8;  // value columns per stitch CTA

// Fixed layouts of at most KDACTL_SMALL_BH_MAX_UNSTITCHED segments: whether every segment of every
// (sequence, head) starts warm, into *sg.all_warm, by one CTA. Then kReduce walks the segments at once;
// otherwise route chunk's walk of whole sequences runs instead (one walk per sequence and head, on its
// CTA shape, which a cold start would otherwise leave to one of small_bh's CTAs: 13-27 % slower, H100).
constexpr int kWarmThreads = 256;
__global__ void __launch_bounds__(kWarmThreads) kda_small_bh_all_warm(const kdactl_kda_args a, const Segments sg) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  __shared__ unsigned cold;
  if (threadIdx.x == 0) cold = 0u;
  __syncthreads();
  const int64_t starts = a.batch * a.heads * (sg.count - 1);  // every segment's after the first
  for (int64_t i = threadIdx.x; i < starts; i += kWarmThreads) {
    const int64_t n = i / (a.heads * (sg.count - 1));
    const int h = static_cast<int>(i / (sg.count - 1) % a.heads), p = static_cast<int>(i % (sg.count - 1)) + 1;
    int64_t bos, eos;
    kdactl::sequence_bounds(a, n, bos, eos);
    if (warm_start(sg, bos / C + n, h, a.heads, p) < 0) {
      atomicOr(&cold, 1u);
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *sg.all_warm = cold ? 0u : 1u;
#endif
}

// A state pool's start states into sg.starts, one CTA per (sequence, head) (a sequence without a slot
// starts from zero and is never read there).
template <int K, int V>
__global__ void __launch_bounds__(256) kda_small_bh_keep_starts(const kdactl_kda_args a, const Segments sg) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  const int64_t n = blockIdx.x, h = blockIdx.y, slot = kdactl::state_slot(a, n);
  if (slot < 0 || a.initial_state == nullptr) return;
  const float4* src = reinterpret_cast<const float4*>(a.initial_state + (slot * a.heads + h) * K * V);
  float4* dst = reinterpret_cast<float4*>(sg.starts + (n * a.heads + h) * K * V);
  for (int i = threadIdx.x; i < K * V / 4; i += blockDim.x) dst[i] = src[i];
#endif
}

// Varlen: the unit table, by one CTA. Sequence m gets max(1, ceil(chunks_m / segment_chunks)) units
// (an empty one too: its unit writes its final state), numbered by a scan over the sequences.
constexpr int kTableThreads = 256;
__global__ void __launch_bounds__(kTableThreads) kda_small_bh_units(const kdactl_kda_args a, const Segments sg,
                                                                    int64_t units) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  __shared__ int scan[kTableThreads];
  __shared__ int carry;
  const int t = threadIdx.x;
  if (t == 0) carry = 0;
  for (int64_t base = 0; base < a.batch; base += kTableThreads) {
    const int64_t m = base + t;
    int count = 0;
    if (m < a.batch) {
      int64_t bos, eos;
      kdactl::sequence_bounds(a, m, bos, eos);
      const int64_t chunks = (eos - bos + C - 1) / C;
      count = chunks > sg.chunks ? static_cast<int>((chunks + sg.chunks - 1) / sg.chunks) : 1;
    }
    __syncthreads();  // the last round's carry is in, and its scan read
    scan[t] = count;
    __syncthreads();
    for (int offset = 1; offset < kTableThreads; offset <<= 1) {  // inclusive scan
      const int x = t >= offset ? scan[t - offset] : 0;
      __syncthreads();
      scan[t] += x;
      __syncthreads();
    }
    const int first = carry + scan[t] - count;
    if (m < a.batch) {
      sg.seq_unit0[m] = first;
      for (int i = 0; i < count; ++i) sg.unit_seq[first + i] = static_cast<int>(m);
    }
    __syncthreads();  // everyone has read carry
    if (t == kTableThreads - 1) carry += scan[t];
  }
  __syncthreads();
  for (int64_t z = carry + t; z < units; z += kTableThreads) sg.unit_seq[z] = -1;
  if (t == 0) sg.seq_unit0[a.batch] = carry;
#endif
}

// One CTA per (sequence, head, kStitchCols value columns): thread k of group 0 owns row k of the start
// state, and each step's sum over K is split among SPLIT groups of K threads (group i takes the rows j of
// M^T in its share; groups 1.. hand their partial sums to group 0 through shared memory). With the next
// M^T in flight (BUFS == 2) a step waited on one warp an SM scheduler and its FMA chains: split 4 ways,
// B1 T32768 H8's 16 segments took 39.8 us where they took 52.2 (H100). With one buffer the loads are
// what a step waits on, and three unsplit CTAs an SM hide them better than two split ones.
// M^T_p is staged in shared memory, the next one in flight while this one is used when BUFS == 2.
// Step p makes S_{p+1}, only for a replay that reads it (segment p + 1 does not start warm): from M_p
// and E_p, or E_p itself when segment p started warm (its reduction ran from there to an absolute end).
__host__ __device__ constexpr int stitch_split(int bufs) { return bufs == 2 ? 4 : 1; }
template <int K, int V, int BUFS>
__global__ void __launch_bounds__(K * stitch_split(BUFS))
    kda_small_bh_stitch(const kdactl_kda_args a, const unsigned char* ws, const Segments sg) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  constexpr int kSplit = stitch_split(BUFS), kThreads = K * kSplit, kSpan = K / kSplit;
  extern __shared__ __align__(16) float stitch_smem[];
  float* maps = stitch_smem;          // [BUFS][K][K]: M^T, so that thread k reads column k (no conflicts)
  float* start = maps + BUFS * K * K;  // [K][kStitchCols]: S_p, this CTA's columns
  float* part = start + K * kStitchCols;  // [kSplit - 1][K][kStitchCols]: groups 1..'s partial sums
  unsigned* warm = reinterpret_cast<unsigned*>(part + (kSplit - 1) * K * kStitchCols);  // bit p: starts warm
  const int tid = threadIdx.x, k = tid % K, group = tid / K;
  const int col0 = blockIdx.x * kStitchCols, h = blockIdx.y, H = a.heads;
  const int64_t n = blockIdx.z;
  const int64_t unit0 = sg.seq_unit0 ? sg.seq_unit0[n] : n * sg.count;  // this sequence's segment 0
  const int P = sg.seq_unit0 ? sg.seq_unit0[n + 1] - static_cast<int>(unit0) : sg.count;
  if (P <= KDACTL_SMALL_BH_MAX_UNSTITCHED) return;  // walked on in kReduce (and S_1 = E_0 is where a replay reads it)
  auto seg = [&](int p) { return (unit0 + p) * H + h; };
  auto load_map = [&](int p, int buf) {
    const float* src = sg.maps + seg(p) * K * K;
    for (int i = tid; i < K * K / 4; i += kThreads) cp_async16(maps + buf * K * K + 4 * i, src + 4 * i);
    cp_async_commit();
  };
  auto row = [&](int p) { return sg.ends + seg(p) * K * V + k * V + col0; };
  auto load_start = [&](int p) {  // S_{p+1} = E_p, by group 0
    if (group != 0) return;
    *reinterpret_cast<float4*>(start + k * kStitchCols) = *reinterpret_cast<const float4*>(row(p));
    *reinterpret_cast<float4*>(start + k * kStitchCols + 4) = *reinterpret_cast<const float4*>(row(p) + 4);
  };

  int64_t bos, eos;
  kdactl::sequence_bounds(a, n, bos, eos);
  for (int i = tid; i < (P + 31) / 32; i += kThreads) warm[i] = 0u;
  __syncthreads();
  for (int p = tid; p < P; p += kThreads)
    if (warm_start(sg, bos / C + n, h, H, p) >= 0) atomicOr(&warm[p / 32], 1u << (p % 32));
  __syncthreads();
  auto is_warm = [&](int p) { return (warm[p / 32] >> (p % 32)) & 1u; };
  auto mapped = [&](int p) { return !is_warm(p + 1) && !is_warm(p); };  // step p needs M_p
  auto next_mapped = [&](int p) {
    while (p <= P - 2 && !mapped(p)) ++p;
    return p;
  };

  if (!is_warm(1)) load_start(0);  // S_1 = E_0, which step 1 reads only where segment 1 does not start warm
  int buf = 0;
  if (next_mapped(1) <= P - 2) load_map(next_mapped(1), 0);
  for (int p = 1; p <= P - 2; ++p) {
    if (is_warm(p + 1)) continue;  // no replay reads S_{p+1}
    if (is_warm(p)) {  // S_{p+1} = E_p, absolute: it stays where it is
      load_start(p);
      continue;
    }
    float4 e_lo{}, e_hi{};  // E_p joins after the product, so that its load overlaps it
    if (group == 0) e_lo = *reinterpret_cast<const float4*>(row(p)), e_hi = *reinterpret_cast<const float4*>(row(p) + 4);
    const int next = next_mapped(p + 1);
    if (BUFS == 2 && next <= P - 2) {
      load_map(next, buf ^ 1);
      kdactl::cp_async_wait<1>();
    } else {
      kdactl::cp_async_wait_all();
    }
    __syncthreads();  // M^T_p and S_p are in
    float acc[kStitchCols] = {};
    const float* mt = maps + buf * K * K;
#pragma unroll 8
    for (int jj = 0; jj < kSpan; ++jj) {
      const int j = group * kSpan + jj;
      const float m = mt[j * K + k];
      const float4 lo = *reinterpret_cast<const float4*>(start + j * kStitchCols);
      const float4 hi = *reinterpret_cast<const float4*>(start + j * kStitchCols + 4);
      acc[0] = fmaf(m, lo.x, acc[0]), acc[1] = fmaf(m, lo.y, acc[1]);
      acc[2] = fmaf(m, lo.z, acc[2]), acc[3] = fmaf(m, lo.w, acc[3]);
      acc[4] = fmaf(m, hi.x, acc[4]), acc[5] = fmaf(m, hi.y, acc[5]);
      acc[6] = fmaf(m, hi.z, acc[6]), acc[7] = fmaf(m, hi.w, acc[7]);
    }
    if (group > 0) {
      float* mine = part + ((group - 1) * K + k) * kStitchCols;
      *reinterpret_cast<float4*>(mine) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(mine + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();  // the partial sums are in, and everyone is done with S_p and this buffer
    if (group == 0) {
#pragma unroll
      for (int i = 0; i < kSplit - 1; ++i) {
        const float* theirs = part + (i * K + k) * kStitchCols;
#pragma unroll
        for (int c = 0; c < kStitchCols; ++c) acc[c] += theirs[c];
      }
      const float4 lo = make_float4(acc[0] + e_lo.x, acc[1] + e_lo.y, acc[2] + e_lo.z, acc[3] + e_lo.w);
      const float4 hi = make_float4(acc[4] + e_hi.x, acc[5] + e_hi.y, acc[6] + e_hi.z, acc[7] + e_hi.w);
      *reinterpret_cast<float4*>(start + k * kStitchCols) = lo;
      *reinterpret_cast<float4*>(start + k * kStitchCols + 4) = hi;
      *reinterpret_cast<float4*>(row(p)) = lo;  // S_{p+1}, where segment p + 1's replay reads it
      *reinterpret_cast<float4*>(row(p) + 4) = hi;
    }
    if (BUFS == 1 && next <= P - 2) load_map(next, 0);
    if (BUFS == 2) buf ^= 1;
  }
#endif
}

// Two M^T buffers (148 KB at K = 128: one CTA an SM) only where the grid fits the SMs once; past that,
// one buffer lets three CTAs share an SM and hide each other's loads in one wave, where two buffers took
// two (B1 H12: 192 CTAs on 132 SMs), also where every segment starts warm and each CTA only returns.
template <int K, int V>
int launch_stitch(const kdactl_kda_args& a, const Segments& sg, int sms, int optin, cudaStream_t stream) {
  const dim3 grid(V / kStitchCols, a.heads, static_cast<unsigned>(a.batch));
  const size_t warm_bits = (sg.count + 31) / 32 * sizeof(unsigned);
  auto bytes = [&](int bufs) {  // M^T buffers, the start state and the partial sums
    return (static_cast<size_t>(bufs) * K * K + stitch_split(bufs) * K * kStitchCols) * sizeof(float) + warm_bits;
  };
  const bool one_wave = static_cast<int64_t>(grid.x) * grid.y * grid.z <= sms;
  const bool two = one_wave && bytes(2) <= static_cast<size_t>(optin);
  const int bufs = two ? 2 : 1;
  auto kernel = two ? kda_small_bh_stitch<K, V, 2> : kda_small_bh_stitch<K, V, 1>;
  const size_t smem = bytes(bufs);
  if (smem > static_cast<size_t>(optin)) return KDACTL_ERR_UNSUPPORTED;
  if (int rc = set_smem(kernel, smem)) return rc;
  kernel<<<grid, K * stitch_split(bufs), smem, stream>>>(a, static_cast<const unsigned char*>(a.workspace), sg);
  return kdactl_launch_status();
}

template <int K, int V>
int launch(const kdactl_kda_args& a, int sms, int optin, cudaStream_t stream) {
  if (a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a)) return KDACTL_ERR_BAD_WORKSPACE;
  const Segments sg = segments_of<K, V>(a);
  const int64_t units = unit_count(a);
  if (2 * units > KDACTL_MAX_GRID_DIM) return KDACTL_ERR_BAD_SEGMENT_CHUNKS;  // the reduction's grid z
  const RecurShape rs = tuned(kPlanned, a);
  if (rs.warps != kPlanned.warps || rs.stages != kPlanned.stages) return KDACTL_ERR_BAD_TUNING;  // the one built
  constexpr int W = kPlanned.warps, S = kPlanned.stages;
  if (int rc = launch_prepare(a, stream)) return rc;
  if (sg.starts) {
    kda_small_bh_keep_starts<K, V><<<dim3(static_cast<unsigned>(a.batch), a.heads), 256, 0, stream>>>(a, sg);
    if (int rc = kdactl_launch_status()) return rc;
  }
  if (sg.unit_seq) {
    kda_small_bh_units<<<1, kTableThreads, 0, stream>>>(a, sg, units);
    if (int rc = kdactl_launch_status()) return rc;
  }
  if (sg.all_warm) {  // nothing stitched: the segments at once where all start warm, else whole walks
    kda_small_bh_all_warm<<<1, kWarmThreads, 0, stream>>>(a, sg);
    if (int rc = kdactl_launch_status()) return rc;
    if (int rc = launch_recur<K, V, W, S, Pass::kReduce>(a, sg, units, optin, stream)) return rc;
    Segments whole;
    whole.all_warm = sg.all_warm;
    return launch_walks(a, whole, sms, optin, stream);
  }
  Segments reduce = sg;  // a known segment's M slot walks its second half where the grid is one wave
  reduce.halves = reduce_in_halves<V>(a, units, sms);
  if (int rc = launch_recur<K, V, W, S, Pass::kReduce>(a, reduce, 2 * units, optin, stream)) return rc;
  if (int rc = launch_stitch<K, V>(a, sg, sms, optin, stream)) return rc;
  return launch_recur<K, V, W, S, Pass::kReplay>(a, sg, units, optin, stream);
}

// 0 when this route has a kernel for `a`, else the code naming the argument that stops it.
int argument_error(const kdactl_kda_args& a) {
  if (int rc = head_error(a)) return rc;
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
  if (unit_count(a) < 1) return KDACTL_ERR_BAD_SEQLEN;  // T = 0: the plan never sends it here
  auto s = static_cast<cudaStream_t>(stream);
  return a.key_dim == 64 ? launch<64, 64>(a, sms, optin, s) : launch<128, 128>(a, sms, optin, s);
}
