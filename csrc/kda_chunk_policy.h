// Route "chunk"'s launch policy: which kernels run, and how wide, from the problem's sizes, the
// tuning code and the SM count alone. Plain C++ (no CUDA), so that tests compile it on the CPU
// (tests/test_chunk_policy.py); the launchers (kda_chunk.cu, kda_chunk_fused.cu) call it.
#pragma once
#include "kdactl_api.h"

namespace kdactl {
namespace chunk {

struct RecurShape {
  int warps;   // 16 value columns each
  int stages;  // chunks in flight: the recurrence is bound by the latency of its loads
};

// tuning (benchmarks): KDACTL_TUNING_STAGES * stages + warps, e.g. 84; or warps alone;
// KDACTL_TUNING_AUTO keeps `rs`.
inline RecurShape tuned(RecurShape rs, int tuning) {
  const int tw = tuning % KDACTL_TUNING_STAGES, ts = tuning % KDACTL_TUNING_FUSED / KDACTL_TUNING_STAGES;
  if (tw == 1 || tw == 2 || tw == 4 || tw == 8) rs.warps = tw;
  if (ts == 4 || ts == 8) rs.stages = ts;
  return rs;
}

// Recurrence CTAs (walks) at `warps` per CTA: one per sequence, head and slice of 16 * warps values.
inline int64_t recur_units(const kdactl_kda_args& a, int V, int warps) {
  return a.batch * a.heads * (V / (16 * warps) > 0 ? V / (16 * warps) : 1);
}

// The two kernels' recurrence. Warps per CTA: more CTAs per head shorten nothing on the sequential
// chain but fill more SMs; fewer re-read the shared K-side factors less often. 4 warps once that
// gives half the SMs a CTA (measured at B1 T8192 H64, scripts/tune_chunk.py: 0.911 ms against 0.945
// with 2 warps), 8 (all 128 values of a head) where 4-warp CTAs outnumber the SMs and 8-warp ones
// fit one wave (B1 T8192 H96 1.168 ms against 1.182, B2 T16384 H64 2.700 against 2.733, B8 T4096 H12
// 0.600 against 0.608; docs/routes/chunk.md). A CTA of 4 warps or fewer with an SM to itself takes the deep
// pipeline; otherwise two or three share an SM and hide each other's latency (8-warp CTAs: 4 stages,
// 1.168 ms against 1.178 with 8 at H96).
inline RecurShape pick_recur(const kdactl_kda_args& a, int sm_count) {
  const int V = a.value_dim;
  const int64_t units4 = recur_units(a, V, 4);
  const bool one_walk_a_head = units4 > sm_count && V % 128 == 0 && recur_units(a, V, 8) <= sm_count;
  const int warps = tuned({one_walk_a_head ? 8 : 2 * units4 >= sm_count ? 4 : 2, 4}, a.tuning).warps;
  return tuned({warps, warps < 8 && recur_units(a, V, warps) <= sm_count ? 8 : 4}, a.tuning);
}

// The fused grid's walk width (kda_chunk_fused.cu), or 0 for the two kernels. The tuning code's
// KDACTL_TUNING_FUSED digit asks for the two kernels (1) or the fused grid (2: walks of 8 warps when
// its warps digit is 8, else 4). Auto takes the two kernels everywhere: since the recurrence forms
// M' V and P U itself, the prepare writes 14.5 KB a block instead of 20.5 and the two kernels beat
// the grid on every shape measured (tools/tune_chunk.py --shapes ab, docs/routes/chunk.md), where it had
// won before: B1 T8192 H64 0.655 ms against 0.766, H48 0.588 against 0.685, T4096 H64 0.337 against
// 0.404. The grid's walks run beside producer warps that slow each chunk about 2x and, capped at 168
// registers, spill.
inline int fused_walk_warps(const kdactl_kda_args& a) {
  const int f = a.tuning % KDACTL_TUNING_AHEAD / KDACTL_TUNING_FUSED;
  return f != 2 ? 0 : a.tuning % KDACTL_TUNING_STAGES == 8 ? 8 : 4;
}

// How many chunks the fused grid's producers may run ahead of the slowest started walk; 0: no limit.
// Pacing keeps the factors not yet read in L2 (1.3 MB a chunk at H64): unpaced, the producers finish
// long before the walks, whose later chunks then come from HBM (B1 T8192 H64: 0.805 ms unpaced, 0.756
// paced at 24 chunks). 12 or 16 chunks starve the walks (1.108, 0.915 ms). The tuning code's
// KDACTL_TUNING_AHEAD digits ask for a limit, at least kAheadMin: a walk waiting on chunk c has
// counted itself past c - 3 only, with 2 stages. Varlen walks end at their own chunk counts, which the
// count of started walks cannot tell apart: no limit.
constexpr int kAheadMin = 4, kAheadAuto = 24;
inline int fused_ahead(const kdactl_kda_args& a) {
  const int digits = a.tuning % KDACTL_TUNING_PRODUCERS / KDACTL_TUNING_AHEAD;
  const int asked = digits > 0 ? digits : kAheadAuto;
  return a.varlen ? 0 : asked < kAheadMin ? kAheadMin : asked;
}

// Producer warps beside each walk, of the `most` that the fused grid's shared memory holds (CTAs
// without a walk run them all, and their walk warps prepare too). 6 beside a 4-warp walk (B1 T8192
// H64: 0.786 ms unpaced against 0.798 with 7 and 0.811 with 8; 0.870 against 0.915 with 8, paced at
// 16): more only crowd the walk. All beside an 8-warp walk (5 to 7 time alike). The tuning code's
// KDACTL_TUNING_PRODUCERS digit asks for a number.
constexpr int kProducersBesideWalk4 = 6;
inline int fused_producers(const kdactl_kda_args& a, int walk_warps, int most) {
  const int asked = a.tuning / KDACTL_TUNING_PRODUCERS;
  const int want = asked > 0 ? asked : walk_warps == 4 ? kProducersBesideWalk4 : most;
  return want < most ? want : most;
}

}  // namespace chunk
}  // namespace kdactl
