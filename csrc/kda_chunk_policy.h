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
// with 2 warps). When every CTA has an SM to itself it takes the deep pipeline; otherwise two or
// three share an SM and hide each other's latency.
inline RecurShape pick_recur(const kdactl_kda_args& a, int sm_count) {
  const int V = a.value_dim;
  const int warps = tuned({2 * recur_units(a, V, 4) >= sm_count ? 4 : 2, 4}, a.tuning).warps;
  return tuned({warps, recur_units(a, V, warps) <= sm_count ? 8 : 4}, a.tuning);
}

// The fused grid's walk width (kda_chunk_fused.cu), or 0 for the two kernels. The tuning code's
// KDACTL_TUNING_FUSED digit asks for the two kernels (1) or the fused grid (2: walks of 8 warps when
// its warps digit is 8, else 4). Auto takes the fused grid where it was measured faster
// (scripts/tune_chunk.py --shapes ab|wide, csrc/PERF.md): fixed-length batches whose walks fill 2/3
// of the SMs or more within one wave and run 128 chunks or more (B1 T8192 H64: 0.72 ms against 0.83,
// H48: 0.62 against 0.73, T2048 H64: 0.20 against 0.23). With fewer walks the producers do not keep
// up (H32, 64 walks: 0.573 against 0.565), with fewer chunks the grid's start-up is not paid back
// (T1024 H64: 0.123 against 0.124). Where 4-warp walks outnumber the SMs the second wave's walks would
// start only when the first's end (H96: 1.47 against 1.25), so there a walk takes all 128 values if
// that fills the SMs so (B2 T16384 H64, 128 walks: 2.70 against 2.89; B1 T8192 H96, 96: 1.23 against
// 1.25; B1 T8192 H80, 80 walks: 1.148 against 1.145, so not taken).
inline int fused_walk_warps(const kdactl_kda_args& a, int sms) {
  const int f = a.tuning % KDACTL_TUNING_AHEAD / KDACTL_TUNING_FUSED;
  if (f != 0) return f != 2 ? 0 : a.tuning % KDACTL_TUNING_STAGES == 8 ? 8 : 4;
  if (a.key_dim != 128 || a.cu_seqlens != nullptr || a.seqlen < 128 * KDACTL_CHUNK) return 0;
  auto fills = [&](int64_t walks) { return 3 * walks >= 2 * sms && walks <= sms; };
  const int64_t walks = recur_units(a, a.value_dim, 4);
  return fills(walks) ? 4 : walks > sms && fills(recur_units(a, a.value_dim, 8)) ? 8 : 0;
}

// How many chunks the fused grid's producers may run ahead of the slowest started walk; 0: no limit.
// Pacing keeps the factors not yet read in L2 (1.3 MB a chunk at H64) and leaves the walks more issue
// slots. It pays where the SMs without a walk hold many producers: at B1 T8192 H48 and H56 (96 and
// 112 walks) 24 chunks took 0.620 and 0.667 ms against 0.664 and 0.710 unpaced; with 128 walks it
// costs (H64: 0.728 against 0.721, T2048 H64: 0.214 against 0.201), and 8 or 16 chunks starve the
// walks (H64: 1.61, 0.85). The tuning code's KDACTL_TUNING_AHEAD digits ask for a limit, at least
// kAheadMin: a walk waiting on chunk c has counted itself past c - 3 only, with 2 stages. Varlen
// walks end at their own chunk counts, which the count of started walks cannot tell apart: no limit.
constexpr int kAheadMin = 4;
inline int fused_ahead(const kdactl_kda_args& a, int64_t walks, int sms) {
  const int asked = a.tuning / KDACTL_TUNING_AHEAD > 0 ? a.tuning / KDACTL_TUNING_AHEAD
                                                       : walks + sms / 8 <= sms ? 24 : 0;
  return a.cu_seqlens != nullptr || asked == 0 ? 0 : asked < kAheadMin ? kAheadMin : asked;
}

}  // namespace chunk
}  // namespace kdactl
