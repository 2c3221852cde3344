// Route small_bh's workspace layout and the recurrence shape its plan counts on: what kda_small_bh.cu
// launches with, and what the tools that launch its passes apart (tools/*_probe.cu) must agree on.
#pragma once
#include "kda_chunk_launch.cuh"

namespace kdactl {
namespace small_bh {

using chunk::C;
using chunk::RecurShape;
using chunk::Segments;
using chunk::blocks_bytes;
using chunk::bounds_bytes;
using chunk::chunk_bounds;
using chunk::num_slots;
using chunk::recur_smem;

// Fixed layout: the segments of every sequence. Varlen: the most units the batch can need (each
// sequence max(1, ceil(chunks / segment_chunks)) of them, and its chunks at most its slots).
inline int64_t segment_count(const kdactl_kda_args& a) {
  const int64_t chunks = (a.seqlen + C - 1) / C;
  return (chunks + a.segment_chunks - 1) / a.segment_chunks;
}
inline int64_t unit_count(const kdactl_kda_args& a) {
  if (!a.varlen) return a.batch * segment_count(a);
  return (num_slots(a) + a.segment_chunks - 1) / a.segment_chunks + a.batch;
}

// Workspace: the prepared blocks and their bounds (chunk_bounds), then per (unit, head) E [K][V] and
// M^T [K][K] in fp32, then room for a state pool's start states [N][H][K][V] fp32 (always: a size is
// computed before any pointer is set, and at most half of E and M's), then (varlen) the unit table:
// unit_seq [units] and seq_unit0 [N + 1], int32; last, all_warm's answer (fixed layouts of at most
// KDACTL_SMALL_BH_MAX_UNSTITCHED segments).
template <int K, int V>
uint64_t workspace_bytes(const kdactl_kda_args& a) {
  const uint64_t states = static_cast<uint64_t>(unit_count(a)) * a.heads;
  const uint64_t starts = static_cast<uint64_t>(a.batch) * a.heads * K * V * sizeof(float);
  const uint64_t table = a.varlen ? (unit_count(a) + a.batch + 1) * sizeof(int) : 0;
  return blocks_bytes<K>(a) + bounds_bytes(a) + states * (K * V + K * K) * sizeof(float) + starts + table +
         sizeof(unsigned);  // all_warm's answer
}

template <int K, int V>
Segments segments_of(const kdactl_kda_args& a) {
  Segments sg;
  sg.chunks = a.segment_chunks;
  sg.count = static_cast<int>(a.varlen ? unit_count(a) : segment_count(a));  // varlen: a bound per sequence
  unsigned char* ws = static_cast<unsigned char*>(a.workspace);
  sg.bounds = chunk_bounds<K>(a, ws);  // the prepare pass stores every chunk's bound when segment_chunks > 0
  unsigned char* base = ws + blocks_bytes<K>(a) + bounds_bytes(a);
  const int64_t states = unit_count(a) * a.heads;
  sg.ends = reinterpret_cast<float*>(base);
  sg.maps = sg.ends + states * K * V;
  float* after = sg.maps + states * K * K;
  if (a.state_indices) sg.starts = after;
  after += a.batch * a.heads * K * V;
  if (a.varlen) {
    sg.unit_seq = reinterpret_cast<int*>(after);
    sg.seq_unit0 = sg.unit_seq + unit_count(a);
  }
  // A fixed layout that stitches nothing chooses on the device (varlen: each sequence's count decides there)
  if (!a.varlen && sg.count <= KDACTL_SMALL_BH_MAX_UNSTITCHED) sg.all_warm = reinterpret_cast<unsigned*>(after);
  return sg;
}

// The recurrence shape the plan (kdactl.kda.routes.small_bh_plan) counts on: KDACTL_SMALL_BH_CTAS_PER_SM of these CTAs
// share an SM (at K = 128, 71 KB of shared memory each plus the 1 KB the hardware reserves per CTA, in the 228 KB of an
// sm_90 / sm_100 SM; a third would fit there, but not in the register file: the K = 128 reduction takes 186 registers a
// thread on sm_90a (176 under halves; nvcc 13.0), past the 170 of three 128-thread CTAs; capped at 168 it spilled and
// ran slower on an H100, docs/routes/small_bh.md). 4 warps a CTA, each loading the K-side factors for 64 values: with the plan cut
// for 2-warp CTAs, 4 warps already took B1 T65536 H8 1.294 ms against 1.414 and B1 T1048576 H1 2.887 against 3.063
// (docs/routes/small_bh.md).
constexpr RecurShape kPlanned = {4, 4};
constexpr size_t kPlannedCtaBytes = recur_smem<128, kPlanned.warps, kPlanned.stages>() + 1024;
static_assert(KDACTL_SMALL_BH_CTAS_PER_SM * kPlannedCtaBytes <= 228 * 1024,
              "the small_bh recurrence no longer fits KDACTL_SMALL_BH_CTAS_PER_SM CTAs in an SM");

// Whether kReduce walks each known segment in two halves (Segments::halves): where its grid, an E and an M
// slot a unit, fits the SMs in one wave (kdactl.kda.routes.small_bh_halves).
template <int V>
bool reduce_in_halves(const kdactl_kda_args& a, int64_t units, int sms) {
  const int64_t ctas = static_cast<int64_t>(V / (16 * kPlanned.warps)) * a.heads * 2 * units;
  return ctas <= static_cast<int64_t>(sms) * KDACTL_SMALL_BH_CTAS_PER_SM;
}

}  // namespace small_bh
}  // namespace kdactl
