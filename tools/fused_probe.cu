// A measurement, not a route (tools/fused_probe.py builds and times it): route small_bh's two passes,
// the prepare and the recurrence, in one kernel, so that the prepared blocks go from the prepare warps
// to the walk through shared memory instead of through the workspace (49 KB a (chunk, head) of DRAM
// traffic for the two passes at K = V = 128, against 20 KB for q, k, v, g in and o out).
//
// One CTA per (sequence, segment, head), one to an SM: 4 prepare warps (prepare_chunk, unchanged:
// warp w fills ring stage w with the chunks c = w mod 4, and the chunk's v) and 8 walk warps (two
// warpgroups of 64 value rows: chunk_wgmma, unchanged), handing stages over through named barriers
// (full: the prepare warp's 32 threads arrive, the walk's 256 wait; empty: the other way round).
// A segment after the first starts from the decay bound as small_bh's warm_start_at does, over at most
// 4 chunks: the 4 prepare warps first prepare the 4 chunks before the segment, with their bounds. A
// segment that does not start warm within them sets *cold and returns (no stitching here): the probe
// covers strongly decaying gates (the lower-bound gate at FlashKDA's draw), and its caller checks it.
// Scope: fixed-length batches, K = V = 128, bf16 q, k, v and g, no state pool, no checkpoints.
// Variants (-D, tools/fused_probe.py's FUSED_PROBE_VARIANTS): PROBE_PREP_WARPS (4: the prepare warps and
// ring stages), PROBE_PREFETCH (each prepare warp's next inputs into L2 first), PROBE_TRACE (cycles a
// chunk in each of prepare_chunk's phases, into the workspace), and two that time parts of the kernel
// and give wrong results: PROBE_SAME_INPUTS, PROBE_NO_WALK (below).
#include "kda_chunk.cuh"

#include <type_traits>

namespace kdactl {
namespace chunk {
namespace probe {

constexpr int K = 128, V = 128;
#ifndef PROBE_PREP_WARPS
#define PROBE_PREP_WARPS 4
#endif
constexpr int kPrepWarps = PROBE_PREP_WARPS;  // prepare warp w fills stage w
constexpr int kStages = kPrepWarps;           // the stage of chunk c is c mod kStages
constexpr int kWalkWarps = 8;   // 16 value rows each
constexpr int kWalkThreads = kWalkWarps * 32;
constexpr int kThreads = kWalkThreads + kPrepWarps * 32;
constexpr int kBarThreads = kWalkThreads + 32;  // a stage's barrier: the walk and one prepare warp
constexpr int kFull = 2, kEmpty = kFull + kStages;  // named barrier ids (0: __syncthreads; 1: sync_first)
static_assert((kStages & (kStages - 1)) == 0, "a power of two: c & (kStages - 1)");
using In = __nv_bfloat16;
using GT = __nv_bfloat16;
using St = RecurStage<K, V>;
using Prep = PrepSmem<K, GT, In>;
struct alignas(16) PrepSlot {
  Prep sm;
};

struct Smem {
  St stage[kStages];
  uint16_t o_tile[kWalkWarps][C][24];  // o's bits, a warp's 16 values x 16 tokens
  PrepSlot prep[kPrepWarps];
  float bound[kPrepWarps];  // log2 of the bounds of the chunks before the segment (warp w: first - 1 - w)
};
static_assert(sizeof(St) % 128 == 0, "stages on whole lines");

__global__ void __launch_bounds__(kThreads, 1) kda_fused_probe(const kdactl_kda_args a, unsigned* cold) {
#if !defined(KDACTL_WGMMA)
  __trap();  // host pass, or a device pass without sm_90a's warpgroup MMA
#else
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int p = blockIdx.x, h = blockIdx.y, H = a.heads;
  const int64_t n = blockIdx.z, bos = n * a.seqlen, eos = bos + a.seqlen;
  const int64_t nchunks = (a.seqlen + C - 1) / C;
  const int segments = static_cast<int>((nchunks + a.segment_chunks - 1) / a.segment_chunks);
  const int64_t first = static_cast<int64_t>(p) * a.segment_chunks;
  const int64_t c_end = min(nchunks, first + a.segment_chunks);
  const int w = warp - kWalkWarps;  // >= 0: a prepare warp

  // Chunk c into its stage, by prepare warp w: v's rows (zero past the end) and the prepared block.
  // Timing-only variants (tools/fused_probe.py --raw), whose results are wrong: PROBE_SAME_INPUTS reads
  // 4 chunks' inputs over and over (in L2: the prepare without DRAM), PROBE_NO_WALK skips the walk's products.
#if defined(PROBE_TRACE)
  // Cycles a prepare warp spends in each of prepare_chunk's phases, then waiting for a free stage, summed
  // over its chunks into the workspace (after the cold flag: kPrepPhases + 1 sums, then the chunk count).
  unsigned long long cycles[kPrepPhases + 1] = {}, chunks = 0;
  long long last = 0;
  auto trace = [&](int phase) {
    const long long now = clock64();
    cycles[phase] += now - last;
    last = now;
  };
#else
  NoTrace trace;
#endif
  auto produce = [&](int64_t c_out, auto bounded) {
#if defined(PROBE_TRACE)
    last = clock64();
    ++chunks;
#endif
    St& st = sm.stage[c_out & (kStages - 1)];
#if defined(PROBE_SAME_INPUTS)
    const int64_t c = first + (c_out & (kStages - 1)) < c_end ? first + (c_out & (kStages - 1)) : first;
#else
    const int64_t c = c_out;
#endif
    const uint16_t* v = static_cast<const uint16_t*>(a.v);
#pragma unroll
    for (int it = 0; it < C * (V / 8) / 32; ++it) {
      const int i = lane + 32 * it, r = i / (V / 8), col = (i % (V / 8)) * 8;
      const int64_t row = bos + c * C + r;
      const bool in = row < eos;
      cp_async16_zfill(&st.v[r][col], v + ((in ? row : bos) * H + h) * V + col, in ? 16 : 0);
    }
    cp_async_commit();
    const int64_t row0 = bos + c * C;
    prepare_chunk<K, GT, In, decltype(bounded)::value>(a, reinterpret_cast<unsigned char*>(&st), &sm.bound[w], h, row0,
                                                       static_cast<int>(eos - row0 < C ? eos - row0 : C), sm.prep[w].sm,
                                                       trace);
    cp_async_wait_all();
    fence_proxy_async();  // the stage's generic writes, for the tensor cores' reads
    __syncwarp();
  };

  // The chunks before the segment, with their bounds, then its start: warm_start_at's walk back.
  if (w >= 0 && p > 0 && first - 1 - w >= 0) produce(first - 1 - w, std::true_type{});
  __syncthreads();
  int64_t c0 = 0;  // the first chunk walked
  if (p > 0) {
    c0 = -1;
    float log2_bound = 0.f;
    for (int j = 0; j < kPrepWarps; ++j) {
      const int64_t c = first - 1 - j;
      if (c <= 0) {
        c0 = 0;
        break;
      }
      log2_bound += sm.bound[j];
      if (log2_bound <= kDropLog2) {
        c0 = c;
        break;
      }
    }
  }
  if (c0 < 0) {  // every thread read the same bounds: the whole CTA returns
    if (threadIdx.x == 0) atomicOr(cold, 1u);
    return;
  }

  if (w >= 0) {
    const int64_t mine = first - 1 - w;  // a chunk before the segment, walked from c0 on
    if (p > 0 && mine >= c0 && mine >= 0) named_arrive(kFull + (mine & (kStages - 1)), kBarThreads);
    for (int64_t c = first + ((w - first) & (kStages - 1)); c < c_end; c += kStages) {
#if defined(PROBE_TRACE)
      const long long wait0 = clock64();
#endif
      if (c - kStages >= c0) named_sync(kEmpty + w, kBarThreads);  // the walk is done with chunk c - kStages
#if defined(PROBE_TRACE)
      cycles[kPrepPhases] += clock64() - wait0;
#endif
#if defined(PROBE_PREFETCH)
      if (c + kStages < c_end) {  // the inputs of this warp's next chunk, into L2 while this one is prepared
        const int r = lane & (C - 1), part = lane >> 4;  // 16 rows x 2 lines of 128 bytes, 4 tensors
        const int64_t row = bos + (c + kStages) * C + r;
        if (row < eos) {
          const char* rows[4] = {reinterpret_cast<const char*>(static_cast<const In*>(a.q) + qk_row(a, row, h) * K),
                                 reinterpret_cast<const char*>(static_cast<const In*>(a.k) + qk_row(a, row, h) * K),
                                 reinterpret_cast<const char*>(static_cast<const GT*>(a.g) + (row * H + h) * K),
                                 reinterpret_cast<const char*>(static_cast<const In*>(a.v) + (row * H + h) * V)};
#pragma unroll
          for (int i = 0; i < 4; ++i) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rows[i] + 128 * part));
        }
      }
#endif
      produce(c, std::false_type{});
      named_arrive(kFull + w, kBarThreads);
    }
#if defined(PROBE_TRACE)
    if (lane == 0) {
      unsigned long long* out = reinterpret_cast<unsigned long long*>(cold) + 8;
      for (int i = 0; i <= kPrepPhases; ++i) atomicAdd(out + i, cycles[i]);
      atomicAdd(out + kPrepPhases + 1, chunks);
    }
#endif
    return;
  }

  // The walk: recur's, with S^T's rows warp * 16 + (g, g + 8) of the whole V.
  const int vw = warp * 16, vcol = vw + g;
  auto at = [&](int key, int col) { return state_offset(a.state_v_first, key, col, K, V); };
  const float* s0 = a.initial_state && c0 == 0 ? a.initial_state + (n * H + h) * K * V : nullptr;
  float s[K / 8][4];
#pragma unroll
  for (int j = 0; j < K / 8; ++j) {
    const int key = 8 * j + 2 * t;
    s[j][0] = s0 ? s0[at(key, vcol)] : 0.f;
    s[j][1] = s0 ? s0[at(key + 1, vcol)] : 0.f;
    s[j][2] = s0 ? s0[at(key, vcol + 8)] : 0.f;
    s[j][3] = s0 ? s0[at(key + 1, vcol + 8)] : 0.f;
  }
  uint16_t* o = static_cast<uint16_t*>(a.o);
  const int lr = (lane >> 4) * 8 + (lane & 7), lc = ((lane >> 3) & 1) * 8;
  for (int64_t c = c0; c < c_end; ++c) {
    const int stage = static_cast<int>(c & (kStages - 1));
    named_sync(kFull + stage, kBarThreads);
    const St& st = sm.stage[stage];
    uint32_t as[K / 16][4];
    state_operands<K>(s, as);
    float out[2][4] = {};
    const bool emit = c >= first;
#if defined(PROBE_NO_WALK)
    if (false)
#endif
    if (emit) chunk_wgmma<K, true, false>(st, s, as, out, &st.v[lr][vw + lc], t);
    else chunk_wgmma<K, false, false>(st, s, as, out, &st.v[lr][vw + lc], t);
    if (c + kStages < c_end) named_arrive(kEmpty + stage, kBarThreads);  // its prepare warp may refill it
    if (emit) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          sm.o_tile[warp][8 * nt + 2 * t + (i & 1)][g + (i >> 1) * 8] = o_bits(out[nt][i], false);
      __syncwarp();
      const int tok = lane >> 1, half = lane & 1;
      const int64_t row = bos + c * C + tok;
      if (row < eos)
        *reinterpret_cast<uint4*>(o + (row * H + h) * V + vw + half * 8) =
            *reinterpret_cast<const uint4*>(&sm.o_tile[warp][tok][half * 8]);
    }
  }
  if (p == segments - 1 && a.final_state) {
    float* sf = a.final_state + (n * H + h) * K * V;
#pragma unroll
    for (int j = 0; j < K / 8; ++j) {
      const int key = 8 * j + 2 * t;
      sf[at(key, vcol)] = s[j][0];
      sf[at(key + 1, vcol)] = s[j][1];
      sf[at(key, vcol + 8)] = s[j][2];
      sf[at(key + 1, vcol + 8)] = s[j][3];
    }
  }
#endif
}

}  // namespace probe
}  // namespace chunk
}  // namespace kdactl

// kdactl's launcher signature (kdactl_kda_args, stream). The workspace's first word is the cold flag,
// which the caller zeroes and reads; KDACTL_ERR_UNSUPPORTED outside the probe's scope.
extern "C" int kdactl_fused_probe(const kdactl_kda_args* args, void* stream) {
  using namespace kdactl::chunk::probe;
  const kdactl_kda_args& a = *args;
  if (a.varlen || a.key_dim != K || a.value_dim != V || a.qkv_fp16 || a.g_dtype != KDACTL_DTYPE_BF16 ||
      a.checkpoints || a.state_indices || a.segment_chunks <= 0 || a.seqlen <= 0 || a.workspace_bytes < 4)
    return KDACTL_ERR_UNSUPPORTED;
  const int64_t nchunks = (a.seqlen + kdactl::chunk::C - 1) / kdactl::chunk::C;
  const dim3 grid(static_cast<unsigned>((nchunks + a.segment_chunks - 1) / a.segment_chunks), a.heads,
                  static_cast<unsigned>(a.batch));
  const int smem = static_cast<int>(sizeof(Smem));
  KDACTL_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kda_fused_probe),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kda_fused_probe<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(a, static_cast<unsigned*>(a.workspace));
  return kdactl_launch_status();
}
