// The chunked routes' launch policy: how wide the recurrence runs, from the problem's sizes, the
// tuning fields and the SM count alone. Plain C++ (no CUDA), so that tests compile it on the CPU
// (tests/test_chunk_policy.py); the launchers (kda_chunk.cu, kda_small_bh.cu) call it.
#pragma once
#include "kdactl_api.h"

namespace kdactl {
namespace chunk {

struct RecurShape {
  int warps;   // 16 value columns each
  int stages;  // chunks in flight: the recurrence is bound by the latency of its loads
};

// `rs` with the fields a benchmark forces (kdactl_kda_args.tuning_warps, tuning_stages; 0 keeps rs's).
inline RecurShape tuned(RecurShape rs, const kdactl_kda_args& a) {
  if (a.tuning_warps != 0) rs.warps = a.tuning_warps;
  if (a.tuning_stages != 0) rs.stages = a.tuning_stages;
  return rs;
}

// The recurrence shapes route chunk builds for value dim V: those pick_recur takes (8-warp CTAs, all
// 128 values of a head, only with 4 stages) and the 4-stage ring its 8-stage picks fall back to where
// a part's shared memory per block does not hold 8 (kda_chunk.cu). small_bh builds its planned shape.
inline bool chunk_builds(RecurShape rs, int V) {
  if (rs.stages != 4 && rs.stages != 8) return false;
  return rs.warps == 2 || rs.warps == 4 || (rs.warps == 8 && rs.stages == 4 && V == 128);
}

// Recurrence CTAs (walks) at `warps` per CTA: one per sequence, head and slice of 16 * warps values.
inline int64_t recur_units(const kdactl_kda_args& a, int V, int warps) {
  return a.batch * a.heads * (V / (16 * warps) > 0 ? V / (16 * warps) : 1);
}

// The two kernels' recurrence. Warps per CTA: more CTAs per head shorten nothing on the sequential
// chain but fill more SMs; fewer re-read the shared K-side factors less often. 4 warps once that
// gives half the SMs a CTA (measured at B1 T8192 H64, tools/tune_chunk.py: 0.911 ms against 0.945
// with 2 warps), 8 (all 128 values of a head) where 4-warp CTAs outnumber the SMs and 8-warp ones
// fit one wave (B1 T8192 H96 1.168 ms against 1.182, B2 T16384 H64 2.700 against 2.733, B8 T4096 H12
// 0.600 against 0.608; docs/routes/chunk.md). A CTA of 4 warps or fewer with an SM to itself takes the deep
// pipeline; otherwise two or three share an SM and hide each other's latency (8-warp CTAs: 4 stages,
// 1.168 ms against 1.178 with 8 at H96).
inline RecurShape pick_recur(const kdactl_kda_args& a, int sm_count) {
  const int V = a.value_dim;
  const int64_t units4 = recur_units(a, V, 4);
  const bool one_walk_a_head = units4 > sm_count && V % 128 == 0 && recur_units(a, V, 8) <= sm_count;
  const int warps = tuned({one_walk_a_head ? 8 : 2 * units4 >= sm_count ? 4 : 2, 4}, a).warps;
  return tuned({warps, warps < 8 && recur_units(a, V, warps) <= sm_count ? 8 : 4}, a);
}

}  // namespace chunk
}  // namespace kdactl
