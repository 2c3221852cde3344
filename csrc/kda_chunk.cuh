// KDA prefill, route "chunk": the chunked (WY / UT) form on tensor cores, in two kernels.
//
// Per chunk of C = 16 tokens, with in-chunk cumulative log-decay G (per key) and start state S0:
//   A_ts = sum_i k_ti k_si e^(G_ti - G_si) (s < t)     P_ts = scale sum_i q_ti k_si e^(G_ti - G_si) (s <= t)
//   M'   = (I + Diag(beta) A)^-1 Diag(beta)
//   W = M' (K e^G)   Qg = scale Q e^G   Kr = K e^(G_C - G)   eG = e^G_C
// and then the only part that depends on the state:
//   U = M' V - W S0        O = Qg S0 + P U        S_C = Diag(eG) S0 + Kr^T U
// kda_chunk_prepare computes the first block for every (chunk, head) at once and writes it to the
// workspace; kda_chunk_recur walks the chunks of one (sequence, head, V slice) in order. The
// recurrence forms M' V and P U itself from v and the two 16 x 16 matrices (its issue slots are
// mostly idle, while the workspace's round trip through HBM bounds both kernels): 2 KB a block in
// place of the 8 KB of U0 = M' V and O0 = P U0, and v is read once, by the recurrence only.
//
// Chunk slots: sequence n's chunk c lives in slot bos_n / C + n + c, which is unique, needs no
// prefix sum over the sequences (nothing to compute on the host, so the launch captures in a graph),
// and is below total_rows / C + N.
#pragma once
#include <cuda_bf16.h>
#include <cstddef>
#include <type_traits>
#include "device.cuh"

namespace kdactl {
namespace chunk {

using bf16 = __nv_bfloat16;
constexpr int C = KDACTL_CHUNK;        // tokens per chunk
// A and P are formed on tensor cores as (K e^G')(K e^-G')^T, G' = G - G_ref with the chunk's middle row
// as reference (e^(G_t - G_s) = e^G'_t e^-G'_s), while every |G'| and -G_ref stay within kShiftLimit:
// e^+-60 leaves fp32 room for q and k to 1e12, and the lower-bound gate (>= -5 a token, so |G'| <= 40)
// always fits. Past it (steeper decays within 8 tokens), through the chunk's halving (steep_a_p).
constexpr float kShiftLimit = 60.f;
constexpr float kF16Safe = 60000.f;  // |U| up to here rounds to a finite fp16 (65504 is its largest)

// One (chunk, head)'s prepared factors in the workspace; every offset is a multiple of 16 bytes.
// The [C][K] tiles and the [C][C] planes are stored as 8 x 8 core matrices (tile_at), the order in
// which sm_90a's wgmma reads a shared-memory operand without swizzling: the recurrence copies a block
// into its ring as it is, and ldmatrix reads the same order without bank conflicts.
// M' and P go as bf16 pairs hi + lo (hi = bf16(x), lo = bf16(x - hi)): the recurrence's bf16
// products then see them to ~2^-17, where bf16 alone (2^-9) would add to the state's error each chunk.
template <int K>
struct Block {
  static constexpr int kPlanes = 4;                // M' hi, M' lo, P hi, P lo: [C][C] bf16 each
  static constexpr int64_t kW = 0;                 // -W  [C][K] bf16
  static constexpr int64_t kQ = kW + C * K * 2;    // Qg  [C][K] bf16
  static constexpr int64_t kKr = kQ + C * K * 2;   // Kr  [C][K] bf16, fp16 when q, k, v are (a.qkv_fp16)
  static constexpr int64_t kM = kKr + C * K * 2;   // the planes
  static constexpr int64_t kEg = kM + kPlanes * C * C * 2;  // eG  [K]    fp32
  static constexpr int64_t kBytes = kEg + K * 4;
  // Every block starts a 128-byte line, so the recurrence's 16-byte copies of a row touch 2 lines, not
  // 3; route small_bh's bounds live apart (chunk_bounds) so that these stay exactly what the plain path reads.
  static_assert(kBytes % 128 == 0, "blocks on whole lines");
};
// Where element (r, col) of a tile of C rows lives: the 16-byte piece of row r and columns 8j .. 8j + 7
// is piece j C + r, so each core matrix (8 rows of one piece) is 128 contiguous bytes.
__host__ __device__ constexpr int tile_at(int r, int col) { return ((col / 8) * C + r) * 8 + col % 8; }

// Route small_bh lets a segment start from a zero state a few chunks before its own first chunk when
// the chunks in between provably forget what came before them. A chunk maps its start state to
// S_C = T S_0 + (terms of its own tokens) with T = Diag(eG) - Kr^T W, a diagonal and C rank-1 terms, so
// ||T||_2 <= max eG + sum_t ||Kr_t|| ||W_t||. The prepare pass stores log2 of that bound, from W and
// Kr before their bf16 rounding, raised by 2^-6 for the roundings of W, Kr and the state the recurrence
// multiplies W by (at most 2^-9 each). The norm of a product of chunk maps is
// at most the product of their bounds, so once the chunks walked before a segment bound it by
// 2^kDropLog2, the history a zero start drops is at most 2^kDropLog2 (1e-6) of the state there, far
// under the SPEC's 5e-3 error ratio. Nothing is assumed of the gate, beta or the keys' norms; a
// segment whose bound does not fall that low within kWarmChunks chunks starts from its exact stitched
// state. (A bound per key channel, max_d prod eG_d, does not hold: the delta rule's rank-1 updates move
// the state between channels, so history survives where each channel alone decays.)
constexpr float kDropLog2 = -20.f;
// 32: fla's softplus draw leaves heads with e^A_log near 1 whose bound reaches 2^-20 only after 10-20
// chunks (tools/decay_bounds.py); a walk back that long still costs a fraction of the whole walk or the
// stitch that such a start takes otherwise, and a start that needs fewer walks back no further.
constexpr int kWarmChunks = 32;
constexpr int kWarmLoads = 8;  // bounds loaded at once by warm_start_at
static_assert(kWarmChunks % kWarmLoads == 0, "whole rounds of loads");
constexpr int kMinHalvedChunks = 4;  // Segments::halves: a segment of fewer chunks is walked whole
constexpr float kBoundMargin = 1.f + 1.f / 64.f;

__host__ __device__ inline int64_t num_slots(const kdactl_kda_args& a) {
  const int64_t rows = a.varlen ? a.seqlen : a.batch * a.seqlen;
  return rows / C + a.batch;
}

// Route small_bh's bounds, log2 of each chunk map's (fp32 [slot][head]), right after the blocks.
template <int K>
__host__ __device__ inline float* chunk_bounds(const kdactl_kda_args& a, unsigned char* ws) {
  return reinterpret_cast<float*>(ws + num_slots(a) * a.heads * Block<K>::kBytes);
}

// ---- Kernel 1: one warp per (slot, head) ----------------------------------------------------------
// In: q, k (bf16 or fp16); GT: g (float, bf16 or fp16).
template <int K, typename GT, typename In>
struct PrepSmem {
  static constexpr bool kG16 = sizeof(GT) == 2;  // g staged as given, then summed into G
  static constexpr int KP = K + 8;  // pitches that make the fragment reads
  static constexpr int GP = K + 8;  // (scalar and paired) free of bank conflicts
  static constexpr int NP = C + 1;
  // 16-bit g is staged in the last K / 2 floats of G's own rows (16-byte aligned): the cumsum reads
  // all of a row's g before it writes that row, so no second buffer (4.3 KB less a warp).
  static constexpr int kRawAt = GP - K / 2;
  static_assert(kRawAt % 4 == 0, "16-bit g rows start 16-byte aligned");
  // e^G_ref of each key lives in the pitch padding of G's rows (8 floats a row, K / 8 rows), written
  // once the cumsum has read all the 16-bit g staged there.
  static constexpr int kRefRow = C / 2 - 1;
  static_assert(GP - K == 8 && K / 8 <= C, "e^G_ref fits in G's padding");
  __device__ static float* ref_of(PrepSmem& sm, int key) { return &sm.G[key / 8][K + key % 8]; }
  In q[C][KP], k[C][KP];
  float G[C][GP];  // G log2(e), e^(G - G_ref) (steep: G log2(e) kept), K e^G from the A/P pass on
  // N (then M' in its place) and P live in k's tile: they are written once the A/P pass has read k for
  // the last time. 2 KB less a warp lets 12 warps share an SM where 10 did (K = 128: 18.1 KB a warp).
  __device__ float (*NM())[NP] { return reinterpret_cast<float(*)[NP]>(&k[0][0]); }
  __device__ float (*P())[NP] { return NM() + C; }
  float beta[C];
  // fla's q/k l2norm, folded into the products (fold_l2norm): 1 / ||q_t|| and 1 / ||k_t|| (1 without it).
  float rq[C], rk[C];
  // Kr's factor a key, which the pass that reads k last takes Kr from: e^(G_C - G_ref) on the fast path
  // (Kr = (k e^-G') e^(G_C - G_ref)), G_C log2(e) on the steep one (Kr = k 2^(G_C log2(e) - G log2(e))).
  // It is G's last row, kept apart: that pass overwrites G with K e^G while other lanes still need it.
  float kr_at[K];
  static_assert(2 * C * NP * sizeof(float) <= sizeof(k), "N and P fit in k's tile");
};

// Row r of a staged q or k tile to unit norm in place, fla's x / sqrt(|x|^2 + eps) rounded to T, by
// lanes 2r and 2r + 1 (`first`: the lane's parity), alternate 16-byte pieces each (no bank conflicts).
// The lane's pieces are read once into registers and written back whole: element by element, the
// pass took eight 2-byte loads and stores where one 16-byte access does. Same sums, same roundings.
template <int K, typename T>
__device__ __forceinline__ void l2norm_row(T* row, int first) {
  static_assert(K % 16 == 0, "whole 16-byte pieces, two lanes a row");
  constexpr int kPieces = K / 16;
  uint4 x[kPieces];
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    x[i] = *reinterpret_cast<const uint4*>(row + first * 8 + 16 * i);
    const uint32_t w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = to_f2(reinterpret_cast<const T*>(&w[e]));
      acc = fmaf(v.x, v.x, fmaf(v.y, v.y, acc));
    }
  }
  const float rs = rsqrtf(acc + __shfl_xor_sync(0xffffffffu, acc, 1) + kL2NormEps);
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    uint32_t w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = to_f2(reinterpret_cast<const T*>(&w[e]));
      w[e] = pack2<T>(v.x * rs, v.y * rs);
    }
    *reinterpret_cast<uint4*>(row + first * 8 + 16 * i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// fla's l2norm of q and k without rewriting the staged tiles: each row's sum of squares as the
// diagonal of X X^T on tensor cores (products of bf16 or fp16 values are exact in fp32, as in the sums
// of a scalar pass), and 1 / sqrt(|x|^2 + eps) into sm.rq / sm.rk, which the passes multiply in where
// it costs least: A and P as they are written out (rows and columns), W through M''s columns, Qg with
// its scale, Kr as it is formed.
// The products then see q and k unrounded, as the fp64 reference does (fla rounds them to bf16).
// False when a row's |x| exceeds 2^40 (or is not finite): the fast path's operands x e^60 could then
// overflow (kShiftLimit assumes |x| up to about 1e12), and the caller normalizes the tiles in place.
constexpr float kFoldL2Max = 1.2089258e24f;  // 2^80: |x|^2 up to here
template <int K, typename In, typename Sm>
__device__ __forceinline__ bool fold_l2norm(Sm& sm, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const int lrow = (lane & 7) + 8 * ((lane >> 3) & 1), lcol = 8 * (lane >> 4);  // x4: the A fragment
  float sq[2][2][4] = {};  // [q, k][n-tile: rows 0-7, 8-15][accumulator]
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      uint32_t x[4];  // (rows g / g + 8, this k-step's columns); as B, rows 0-7 are {x0, x2}, 8-15 {x1, x3}
      ldmatrix_x4(x, m == 0 ? &sm.q[lrow][16 * ks + lcol] : &sm.k[lrow][16 * ks + lcol]);
      if constexpr (std::is_same_v<In, __half>) {
        mma_f16(sq[m][0], x, x[0], x[2]);
        mma_f16(sq[m][1], x, x[1], x[3]);
      } else {
        mma_bf16(sq[m][0], x, x[0], x[2]);
        mma_bf16(sq[m][1], x, x[1], x[3]);
      }
    }
  }
  // Lane (g, t = g / 2) holds row g's sum (n-tile 0, column g) and row g + 8's (n-tile 1, column g).
  bool ok = true;
  if (t == g >> 1) {
    const bool odd = g & 1;  // selected, not indexed: an index by lane would put sq in local memory
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      const float sum_q = odd ? sq[0][half][2 * half + 1] : sq[0][half][2 * half];
      const float sum_k = odd ? sq[1][half][2 * half + 1] : sq[1][half][2 * half];
      ok = ok && sum_q <= kFoldL2Max && sum_k <= kFoldL2Max;
      sm.rq[r] = rsqrtf(sum_q + kL2NormEps);
      sm.rk[r] = rsqrtf(sum_k + kL2NormEps);
    }
  }
  return __all_sync(0xffffffffu, ok);
}

// A and P for chunks whose decay is too steep to factor through one reference row (kShiftLimit), still
// on tensor cores, from G as staged (sm.G, before the K e^G pass, in log2 units: G log2(e), so that each
// factor is one ex2). Each pair s < t is factored through
// the token R where the chunk's binary halving first parts them (t and s agree on the bits above the
// highest one in which they differ, b; R is the last token of s's half):
//   e^(G_t - G_s) = e^(G_t - G_R) e^(G_R - G_s),   s <= R < t,
// and since G only falls, both factors are at most 1: nothing overflows however steep the decay, and a
// factor that underflows belongs to a term under 2^-126 |k_t| |k_s|, which no sum here can see. The
// roundings are the fast path's: each factor times k or q to tf32 (2^-11), summed in fp32.
// Level lv = 0, 1, 2 pairs the rows t with bit b = 3 - lv set with the 8 columns s of their block's
// other half (b clear); level 3 pairs t = 2m + 1 with s = 2m and gives P's even diagonal (R = s:
// factor 1); level 4 gives P's odd diagonal. One m16n8k8 product per level and k-step (B's 8 columns
// are the level's 8 tokens s). Every (t, s <= t) is written by exactly one level; the rest of NM and P
// stays zero. A row with no pair at a level takes itself as reference (a factor of 1, so no inf or NaN
// in its products): an mma's rows are independent, and that row's accumulators are never written out.
struct SteepLevel {
  int lv;
  // The reference token of row r, or -1 where r has no pair at this level.
  __device__ __forceinline__ int row_ref(int r) const {
    if (lv <= 2) {
      const int b = 3 - lv;
      return (r >> b) & 1 ? (r & ~((2 << b) - 1)) + (1 << b) - 1 : -1;
    }
    return lv == 3 ? r & ~1 : (r & 1 ? r : -1);
  }
  // The token s of B's column n; its reference is row_ref's for the rows it pairs with.
  __device__ __forceinline__ int col_token(int n) const {
    if (lv <= 2) {
      const int b = 3 - lv;
      return ((n >> b) << (b + 1)) | (n & ((1 << b) - 1));
    }
    return 2 * n + (lv == 4);
  }
  __device__ __forceinline__ int col_ref(int s) const {
    if (lv <= 2) {
      const int b = 3 - lv;
      return (s & ~((2 << b) - 1)) + (1 << b) - 1;
    }
    return s;
  }
};

// q or k widened from bf16 or fp16 is a tf32 value already (8 or 10 mantissa bits, fp16's range), so an
// operand of factor 1 goes to the mma as it is: no product, no rounding.
__device__ __forceinline__ uint32_t tf32_exact(float x) { return __float_as_uint(x); }

// It then leaves K e^G in place and hands Qg and Kr to `emit`, as the fast path does (`q_row`: Qg's
// scale and q's norm for rows g and g + 8, `k_row` k's norm), and N and P last, since they go into k's tile.
template <int K, typename In, typename Sm, typename Emit>
__device__ __forceinline__ void steep_a_p(Sm& sm, int lane, float scale, const float (&q_row)[2],
                                          const float (&k_row)[2], Emit&& emit) {
  constexpr int kLevels = 5;
  const int g = lane >> 2, t = lane & 3;
  // This lane's rows g and g + 8 and its B column g at each level, with their reference tokens.
  int row_ref[kLevels][2], s_col[kLevels], r_col[kLevels];
#pragma unroll
  for (int lv = 0; lv < kLevels; ++lv) {
    const SteepLevel level{lv};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half, ref = level.row_ref(r);
      row_ref[lv][half] = ref >= 0 ? ref : r;
    }
    s_col[lv] = level.col_token(g);
    r_col[lv] = level.col_ref(s_col[lv]);
  }
  // P's products leave scale out (q e^(G_t - G_R), not scale q e^(..)): it multiplies each sum once.
  float acc_a[kLevels - 1][4] = {}, acc_p[kLevels][4] = {};  // level 4 is P's odd diagonal alone
#pragma unroll 2
  for (int kk = 0; kk < K / 8; ++kk) {
    // k-index t is key 8kk + 2t and t + 4 is key 8kk + 2t + 1, as on the fast path.
    const int col = 8 * kk + 2 * t;
    float2 G_t[2], kv[2], qv[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      G_t[half] = *reinterpret_cast<const float2*>(&sm.G[g + 8 * half][col]);
      kv[half] = to_f2(&sm.k[g + 8 * half][col]);
      qv[half] = to_f2(&sm.q[g + 8 * half][col]);
    }
#pragma unroll
    for (int lv = 0; lv < kLevels; ++lv) {
      uint32_t ak[4], aq[4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (lv == 4) {  // every row its own reference
          aq[half] = tf32_exact(qv[half].x), aq[half + 2] = tf32_exact(qv[half].y);
          continue;
        }
        if (lv == 0 && half == 0) {  // rows 0-7 have no pair across the middle
          ak[0] = ak[2] = aq[0] = aq[2] = 0u;
          continue;
        }
        const float2 G_r = *reinterpret_cast<const float2*>(&sm.G[row_ref[lv][half]][col]);
        const float2 e = make_float2(ex2(G_t[half].x - G_r.x), ex2(G_t[half].y - G_r.y));
        ak[half] = to_tf32(kv[half].x * e.x), ak[half + 2] = to_tf32(kv[half].y * e.y);
        aq[half] = to_tf32(qv[half].x * e.x), aq[half + 2] = to_tf32(qv[half].y * e.y);
      }
      const float2 y = to_f2(&sm.k[s_col[lv]][col]);
      uint32_t b0 = tf32_exact(y.x), b1 = tf32_exact(y.y);  // levels 3 and 4: the column is its own reference
      if (lv <= 2) {
        const float2 G_s = *reinterpret_cast<const float2*>(&sm.G[s_col[lv]][col]);
        const float2 G_r = *reinterpret_cast<const float2*>(&sm.G[r_col[lv]][col]);
        b0 = to_tf32(y.x * ex2(G_r.x - G_s.x)), b1 = to_tf32(y.y * ex2(G_r.y - G_s.y));
      }
      if (lv < 4) mma_tf32(acc_a[lv < 4 ? lv : 0], ak, b0, b1);
      mma_tf32(acc_p[lv], aq, b0, b1);
    }
  }
  __syncwarp();  // G (log2 units) is read no more: K e^G in place, each element by the lane that reads it
#pragma unroll 2
  for (int kk = 0; kk < K / 8; ++kk) {
    const int col = 8 * kk + 2 * t;
    const float2 gc = *reinterpret_cast<const float2*>(&sm.kr_at[col]);  // G_C log2(e)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float2* G = reinterpret_cast<float2*>(&sm.G[g + half * 8][col]);
      const float2 lg = *G, e = make_float2(ex2(lg.x), ex2(lg.y));
      const float2 kv = to_f2(&sm.k[g + half * 8][col]);
      const float2 qv = to_f2(&sm.q[g + half * 8][col]);
      *G = make_float2(kv.x * e.x, kv.y * e.y);
      emit(half, col, make_float2(qv.x * e.x * q_row[half], qv.y * e.y * q_row[half]),
           make_float2(kv.x * k_row[half] * ex2(gc.x - lg.x), kv.y * k_row[half] * ex2(gc.y - lg.y)));
    }
  }
  __syncwarp();  // every lane has read k: N and P go into its tile
  for (int i = lane; i < C * C; i += 32) sm.NM()[i / C][i % C] = 0.f, sm.P()[i / C][i % C] = 0.f;
  __syncwarp();  // NM and P are zero everywhere
#pragma unroll
  for (int lv = 0; lv < kLevels; ++lv) {
    const SteepLevel level{lv};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // (row g or g + 8, column 2t or 2t + 1)
      const int r = g + 8 * (i >> 1), s = level.col_token(2 * t + (i & 1)), ref = level.row_ref(r);
      if (ref < 0 || ref != level.col_ref(s)) continue;  // not a pair of this level
      sm.P()[r][s] = scale * sm.rq[r] * sm.rk[s] * acc_p[lv][i];
      if (lv < 4 && s < r) sm.NM()[r][s] = sm.beta[r] * sm.rk[r] * sm.rk[s] * acc_a[lv < 4 ? lv : 0][i];
    }
  }
}

// prepare_chunk's phases, for a caller that times them (tools/fused_probe.cu): `trace(i)` as phase i ends.
enum PrepPhase { kStaged, kNormed, kSummed, kProducts, kSolved, kPlanes, kDone, kPrepPhases };
struct NoTrace {
  __device__ __forceinline__ void operator()(int) const {}
};

// One (chunk, head)'s factors into a block laid out as Block<K> (`blk`: global or shared memory), by one
// warp: rows row0 .. row0 + ntok - 1 of the flattened layout (ntok <= C); with log2 of the bound on the
// chunk's state map into *bound when BOUND (route small_bh, a.segment_chunks > 0: the other routes'
// instance has none of its work).
template <int K, typename GT, typename In, bool BOUND, typename Trace = NoTrace>
__device__ __forceinline__ void prepare_chunk(const kdactl_kda_args& a, unsigned char* blk, float* bound, int h,
                                              int64_t row0, int ntok, PrepSmem<K, GT, In>& sm, Trace trace = {}) {
  using Sm = PrepSmem<K, GT, In>;
  constexpr bool kG16 = Sm::kG16;
  using B = Block<K>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int H = a.heads;

  // Stage q, k, g (rows past the sequence's end are zero: they add nothing anywhere). Lane l copies the
  // same 16-byte piece of every (32 / pieces)-th row, from sources one row stride apart: the offsets,
  // and GVA's division for the q/k head, are worked out once (per piece they were about a third of the
  // prepare's instructions before its first product).
  const In* q = static_cast<const In*>(a.q);
  const In* k = static_cast<const In*>(a.k);
  auto clamp_row = [&](int r) { return static_cast<int64_t>(r < ntok ? r : 0); };
  auto raw_g = [&](int r) { return reinterpret_cast<GT*>(&sm.G[r][Sm::kRawAt]); };  // 16-bit g's row r
  const int64_t g_stride = static_cast<int64_t>(H) * K;
  {
    constexpr int kPieces = K / 8, kRows = 32 / kPieces;  // 16-byte pieces of a 16-bit row; rows a pass
    static_assert(32 % kPieces == 0 && C % kRows == 0, "whole rows a pass");
    const int j = lane % kPieces;
    const int64_t qk_stride = static_cast<int64_t>(qk_heads(a)) * K;
    const In* q_src = q + qk_row(a, row0, h) * K + j * 8;
    const In* k_src = k + qk_row(a, row0, h) * K + j * 8;
    const GT* g_src = static_cast<const GT*>(a.g) + (row0 * H + h) * K + j * 8;
#pragma unroll
    for (int pass = 0; pass < C / kRows; ++pass) {
      const int r = lane / kPieces + pass * kRows, bytes = r < ntok ? 16 : 0;
      cp_async16_zfill(&sm.q[r][j * 8], q_src + clamp_row(r) * qk_stride, bytes);
      cp_async16_zfill(&sm.k[r][j * 8], k_src + clamp_row(r) * qk_stride, bytes);
      if constexpr (kG16) cp_async16_zfill(raw_g(r) + j * 8, g_src + clamp_row(r) * g_stride, bytes);
    }
  }
  if constexpr (!kG16) {
    constexpr int kPieces = K / 4, kRows = 32 / kPieces;  // of an fp32 row
    static_assert(32 % kPieces == 0 && C % kRows == 0, "whole rows a pass");
    const int j = lane % kPieces;
    const float* g_src = static_cast<const float*>(a.g) + (row0 * H + h) * K + j * 4;
#pragma unroll
    for (int pass = 0; pass < C / kRows; ++pass) {
      const int r = lane / kPieces + pass * kRows;
      cp_async16_zfill(&sm.G[r][j * 4], g_src + clamp_row(r) * g_stride, r < ntok ? 16 : 0);
    }
  }
  cp_async_commit();
  if (lane < C) sm.beta[lane] = lane < ntok ? load_beta(a, (row0 + lane) * H + h) : 0.f;
  cp_async_wait_all();
  __syncwarp();
  trace(kStaged);
  if (!(a.qk_l2norm && fold_l2norm<K, In>(sm, lane))) {  // no norm to fold in: factors of 1
    if (a.qk_l2norm) {  // a row too large to fold: its tile normalized in place
      __syncwarp();
      l2norm_row<K>(sm.q[lane >> 1], lane & 1);  // rounded to q's type; rows past the end stay zero
      l2norm_row<K>(sm.k[lane >> 1], lane & 1);
    }
    if (lane < C) sm.rq[lane] = 1.f, sm.rk[lane] = 1.f;
  }
  __syncwarp();
  trace(kNormed);

  bf16* w_out = reinterpret_cast<bf16*>(blk + B::kW);
  bf16* q_out = reinterpret_cast<bf16*>(blk + B::kQ);
  bf16* kr_out = reinterpret_cast<bf16*>(blk + B::kKr);
  float* eg_out = reinterpret_cast<float*>(blk + B::kEg);
  const float scale = a.scale;

  // G = cumsum of g over the chunk, 4 keys per lane, each lane's 4 keys moved in one access (one per
  // key conflicted 4 ways), summed in log2 units (G log2(e), Gate::step), so that each e^x below is one
  // ex2. G goes to shared memory as e^(G - G_ref), which the later passes read with e^G_ref (each e^x
  // once: MUFU was a fifth of the pass), unless the decay is too steep to factor (kShiftLimit): then as
  // G log2(e), for steep_a_p.
  static_assert(K <= 128, "a lane per 4 keys");
  const int j = lane;
  // fla's gates from raw g, as each row is summed: the head's constants and this lane's 4 dt_bias
  // values are read once, and each gate is a few MUFU and FMA ops beside the cumsum.
  const Gate gate = Gate::of(a, h);
  float bias[4] = {0.f, 0.f, 0.f, 0.f};
  if (j < K / 4)
#pragma unroll
    for (int e = 0; e < 4; ++e) bias[e] = Gate::bias(a, h, 4 * j + e);
  bool steep = false;
  float Gr[C][4] = {}, run[4] = {0.f, 0.f, 0.f, 0.f};  // G log2(e)
  float eg_max = 0.f;  // BOUND: this lane's keys' largest eG
  if (j < K / 4) {
    gate.with_mode([&](auto mode) {  // one unrolled loop per gate mode
      constexpr int M = decltype(mode)::value;
#pragma unroll
      for (int r = 0; r < C; ++r) {  // g past the sequence's end was staged as zero: no decay
        const float4 x = kG16 ? to_f4(raw_g(r) + 4 * j) : to_f4(&sm.G[r][4 * j]);
        const bool in = r < ntok;
        run[0] = gate.step<M>(run[0], x.x, bias[0], in), run[1] = gate.step<M>(run[1], x.y, bias[1], in);
        run[2] = gate.step<M>(run[2], x.z, bias[2], in), run[3] = gate.step<M>(run[3], x.w, bias[3], in);
#pragma unroll
        for (int e = 0; e < 4; ++e) Gr[r][e] = run[e];
      }
      // e^G' and e^-G' finite, and e^G_ref far above fp32's underflow. fla's gates only decay (each step
      // adds a product of opposite signs: -A < 0, lower_bound < 0 as the prologue requires; fma's rounding
      // keeps the sum from rising: 0 >= G_0 >= G_ref >= G_C), so past the reference's own check only the
      // last row can stray; g as given may rise anywhere.
      constexpr float kLimit = kShiftLimit * kLog2e;
      constexpr bool kFalls = M != KDACTL_GATE_AS_GIVEN;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float ref = Gr[Sm::kRefRow][e];
        steep |= ref < -kLimit;
#pragma unroll
        for (int r = 0; r < C; ++r)
          if (!kFalls || r == C - 1) steep |= fabsf(Gr[r][e] - ref) > kLimit;
      }
    });
    const float4 eg = make_float4(ex2(run[0]), ex2(run[1]), ex2(run[2]), ex2(run[3]));
    *reinterpret_cast<float4*>(eg_out + 4 * j) = eg;
    if constexpr (BOUND) eg_max = fmaxf(fmaxf(eg.x, eg.y), fmaxf(eg.z, eg.w));
  }
  steep = __any_sync(0xffffffffu, steep);
  if (j < K / 4) {  // every lane has read its g of row r above (the 16-bit g's place)
    float4* out = reinterpret_cast<float4*>(&sm.G[0][4 * j]);
    float4* kr_at = reinterpret_cast<float4*>(&sm.kr_at[4 * j]);
    if (!steep) {
      const float* mid = Gr[Sm::kRefRow];
#pragma unroll
      for (int r = 0; r < C; ++r)
        out[r * Sm::GP / 4] = make_float4(ex2(Gr[r][0] - mid[0]), ex2(Gr[r][1] - mid[1]), ex2(Gr[r][2] - mid[2]),
                                          ex2(Gr[r][3] - mid[3]));
      float4* ref = reinterpret_cast<float4*>(Sm::ref_of(sm, 4 * j));
      *ref = make_float4(ex2(mid[0]), ex2(mid[1]), ex2(mid[2]), ex2(mid[3]));
      *kr_at = make_float4(ex2(run[0] - mid[0]), ex2(run[1] - mid[1]), ex2(run[2] - mid[2]), ex2(run[3] - mid[3]));
    } else {
#pragma unroll
      for (int r = 0; r < C; ++r)  // in log2 units, as steep_a_p takes it (no reference: its own pass forms e^G)
        out[r * Sm::GP / 4] = make_float4(Gr[r][0], Gr[r][1], Gr[r][2], Gr[r][3]);
      *kr_at = make_float4(run[0], run[1], run[2], run[3]);
    }
  }
  __syncwarp();
  trace(kSummed);

  // A (strictly lower, times beta_t) -> sm.NM, and P (lower with diagonal) -> sm.P. Each path leaves
  // in G the operand of W = M' (K e^G), K e^G (fp32), and hands Qg = scale Q e^G / ||q|| and
  // Kr = K e^(G_C - G) / ||k|| to `emit`, each element by the lane that read it: rows g and g + 8, keys
  // 2t and 2t + 1 of each 8-key piece, a pair a register, so that in tile_at's order a warp's store is one
  // whole 128-byte line and the tiles need no staging. |Kr| <= |k|: in fp16's range with fp16 inputs.
  const float q_row[2] = {scale * sm.rq[g], scale * sm.rq[g + 8]};  // Qg's scale and q's norm, per row
  const float k_row[2] = {sm.rk[g], sm.rk[g + 8]};
  float kr_sq[2] = {0.f, 0.f};  // BOUND: this lane's share of ||Kr_t||^2, rows g and g + 8
  auto emit = [&](int half, int col, float2 qg, float2 kr) {
    const int r = g + 8 * half;
    *reinterpret_cast<uint32_t*>(q_out + tile_at(r, col)) = pack_bf16(qg.x, qg.y);
    *reinterpret_cast<uint32_t*>(kr_out + tile_at(r, col)) = pack2<In>(kr.x, kr.y);
    if constexpr (BOUND) kr_sq[half] = fmaf(kr.x, kr.x, fmaf(kr.y, kr.y, kr_sq[half]));
  };
  if (!steep) {
    float acc_a[2][4] = {}, acc_p[2][4] = {};
#pragma unroll 4
    for (int kk = 0; kk < K / 8; ++kk) {
      // The sum over keys may take them in any order: k-index t is key 8kk + 2t and k-index t + 4
      // is key 8kk + 2t + 1, so that each lane's two keys per row are adjacent (paired loads).
      uint32_t ak[4], aq[4], ki[4];  // A layout positions: (g, t) (g+8, t) (g, t+4) (g+8, t+4)
      const int col = 8 * kk + 2 * t;
      const float2 ref = *reinterpret_cast<const float2*>(Sm::ref_of(sm, col));  // e^G = e^G' e^G_ref
      const float2 kra = *reinterpret_cast<const float2*>(&sm.kr_at[col]);     // e^(G_C - G_ref)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = g + half * 8;
        float2* G = reinterpret_cast<float2*>(&sm.G[r][col]);
        const float2 e = *G;  // e^G'
        const float2 kv = to_f2(&sm.k[r][col]);
        const float2 qv = to_f2(&sm.q[r][col]);
        const float2 ke = make_float2(kv.x * e.x, kv.y * e.y), qe = make_float2(qv.x * e.x, qv.y * e.y);
        const float2 kd = make_float2(kv.x * rcp(e.x), kv.y * rcp(e.y));  // K e^-G'
        ak[half] = to_tf32(ke.x), ak[half + 2] = to_tf32(ke.y);
        aq[half] = to_tf32(qe.x), aq[half + 2] = to_tf32(qe.y);  // scale: once a sum, below
        ki[half] = to_tf32(kd.x), ki[half + 2] = to_tf32(kd.y);
        *G = make_float2(ke.x * ref.x, ke.y * ref.y);
        // |k e^-G'| / ||k|| <= e^60 first, then the factor <= 1: neither product leaves fp32's range
        emit(half, col, make_float2(qe.x * (ref.x * q_row[half]), qe.y * (ref.y * q_row[half])),
             make_float2(kd.x * k_row[half] * kra.x, kd.y * k_row[half] * kra.y));
      }
      // B = (K e^-G')^T: tokens 0-7 are rows g of this lane's positions, tokens 8-15 rows g+8.
      mma_tf32(acc_a[0], ak, ki[0], ki[2]);
      mma_tf32(acc_a[1], ak, ki[1], ki[3]);
      mma_tf32(acc_p[0], aq, ki[0], ki[2]);
      mma_tf32(acc_p[1], aq, ki[1], ki[3]);
    }
    __syncwarp();  // every lane has read k: N and P go into its tile
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int tt = g + (i >> 1) * 8, ss = 8 * nt + 2 * t + (i & 1);
        sm.NM()[tt][ss] = ss < tt ? sm.beta[tt] * sm.rk[tt] * sm.rk[ss] * acc_a[nt][i] : 0.f;
        sm.P()[tt][ss] = ss <= tt ? scale * sm.rq[tt] * sm.rk[ss] * acc_p[nt][i] : 0.f;
      }
  } else {
    steep_a_p<K, In>(sm, lane, scale, q_row, k_row, emit);
  }
  __syncwarp();
  trace(kProducts);

  // M' = (I + N)^-1 Diag(beta) by forward substitution: lane j < C owns column j; M' replaces N.
  {
    const int j = lane & (C - 1);
    float m[C];
#pragma unroll
    for (int r = 0; r < C; ++r) {
      float x = r == j ? 1.f : 0.f;
#pragma unroll
      for (int s = 0; s < r; ++s) x = fmaf(-sm.NM()[r][s], m[s], x);
      m[r] = x;
    }
    __syncwarp();  // every lane has read N
    if (lane < C) {
      const float b = sm.beta[j];
#pragma unroll
      for (int r = 0; r < C; ++r) sm.NM()[r][j] = m[r] * b;
    }
  }
  __syncwarp();
  trace(kSolved);

  // -M' Diag(1 / ||k_s||) as A operands over the chunk's tokens (k-steps s = 0-7 and 8-15): W's sign here
  uint32_t am[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int s = 8 * ks + t + (p >> 1) * 4;
      am[ks][p] = to_tf32(-sm.NM()[g + (p & 1) * 8][s] * sm.rk[s]);
    }

  // M' and P out as hi and lo bf16 planes: lane i takes half a row of each, 16 bytes a plane.
  {
    bf16* planes = reinterpret_cast<bf16*>(blk + B::kM);
    const int r = lane >> 1, c0 = (lane & 1) * 8;
    auto put_pair = [&](const float* x, bf16* hi_plane) {
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) split_bf16(x[2 * e], x[2 * e + 1], hi[e], lo[e]);
      *reinterpret_cast<uint4*>(hi_plane + tile_at(r, c0)) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(hi_plane + C * C + tile_at(r, c0)) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    };
    put_pair(&sm.NM()[r][c0], planes);
    put_pair(&sm.P()[r][c0], planes + 2 * C * C);
  }
  trace(kPlanes);

  // -W = -M' (K e^G), one key n-tile at a time, out from the accumulators as Qg and Kr went (tile_at's
  // order: a warp's store is one 128-byte line).
  float w_sq[2] = {0.f, 0.f};  // BOUND: this lane's share of ||W_t||^2, rows g and g + 8
#pragma unroll 4
  for (int nt = 0; nt < K / 8; ++nt) {
    const int col = 8 * nt + g, c0 = 8 * nt + 2 * t;
    float w[4] = {};
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int s0 = 8 * ks + t, s1 = s0 + 4;
      mma_tf32(w, am[ks], to_tf32(sm.G[s0][col]), to_tf32(sm.G[s1][col]));
    }
    *reinterpret_cast<uint32_t*>(w_out + tile_at(g, c0)) = pack_bf16(w[0], w[1]);
    *reinterpret_cast<uint32_t*>(w_out + tile_at(g + 8, c0)) = pack_bf16(w[2], w[3]);
    if constexpr (BOUND) {
      w_sq[0] = fmaf(w[0], w[0], fmaf(w[1], w[1], w_sq[0]));
      w_sq[1] = fmaf(w[2], w[2], fmaf(w[3], w[3], w_sq[1]));
    }
  }
  if constexpr (BOUND) {  // route small_bh: the bound on this chunk's state map (kDropLog2)
    float terms = 0.f;  // sum_t ||Kr_t|| ||W_t||: rows g and g + 8 summed over their 4 lanes, added on t = 0
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float kr = kr_sq[half], w = w_sq[half];
#pragma unroll
      for (int m = 1; m <= 2; m <<= 1)
        kr += __shfl_xor_sync(0xffffffffu, kr, m), w += __shfl_xor_sync(0xffffffffu, w, m);
      terms += sqrtf(kr * w);
    }
    terms = warp_allreduce(t == 0 ? terms : 0.f);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) eg_max = fmaxf(eg_max, __shfl_xor_sync(0xffffffffu, eg_max, m));
    if (lane == 0) *bound = log2f((eg_max + terms) * kBoundMargin);
  }
  trace(kDone);
}

template <int K, typename GT, typename In, bool BOUND>
__global__ void __launch_bounds__(32) kda_chunk_prepare(const kdactl_kda_args a, unsigned char* ws) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Heads fastest: the CTAs resident at once read whole token rows of q, k and g (every head's piece)
  // and write consecutive blocks.
  const int64_t slot = blockIdx.x / a.heads;
  const int h = static_cast<int>(blockIdx.x % a.heads);
  // The sequence whose slots hold this one: the last n with bos_n / C + n <= slot.
  int64_t lo = 0, hi = a.batch - 1, bos, eos;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    sequence_bounds(a, mid, bos, eos);
    if (bos / C + mid <= slot) lo = mid; else hi = mid - 1;
  }
  sequence_bounds(a, lo, bos, eos);
  const int64_t row0 = bos + (slot - (bos / C + lo)) * C;
  if (row0 >= eos) return;  // a slot past this sequence's last chunk
  const int ntok = static_cast<int>(eos - row0 < C ? eos - row0 : C);
  const int64_t at = slot * a.heads + h;
  prepare_chunk<K, GT, In, BOUND>(a, ws + at * Block<K>::kBytes, BOUND ? chunk_bounds<K>(a, ws) + at : nullptr, h, row0,
                                  ntok, *reinterpret_cast<PrepSmem<K, GT, In>*>(smem_raw));
#endif
}

// ---- Kernel 2: one CTA per (sequence or segment, head, slice of 16 * WARPS value columns) ----------
// The state is kept transposed, S^T [V x K]: each warp owns 16 of its rows as mma accumulators, which
// are at once the A operand of S^T W^T and S^T Qg^T and the accumulator of S^T += U^T Kr.
//
// Route small_bh (kda_small_bh.cu) runs it on segments of a sequence instead, in two passes. A segment
// whose start is known (segment 0; a warm start) is walked whole in kReduce, writing o. Since any
// other segment's end state is affine in its start state, S_end = M S_start + E, kReduce gets its E
// (from a zero start) and, in its odd z slots, M (V = K: the columns of M are the end states of the
// identity's columns, with zero values); a stitch kernel chains the start states; kReplay runs those
// segments from their start states and writes o.
enum class Pass { kWhole, kReduce, kReplay };

struct Segments {
  int64_t chunks = 0;     // chunks per segment
  int count = 1;          // segments per sequence
  const float* bounds = nullptr;  // chunk_bounds, where the prepare stored them: segments may start warm
  // Varlen (route small_bh's unit table, one entry per unit: a sequence's segments are consecutive
  // units, each of at most `chunks` chunks, so one long sequence is cut and short ones are whole):
  int* unit_seq = nullptr;   // [units]: the sequence of each unit, -1 past the last; nullptr: fixed layout
  int* seq_unit0 = nullptr;  // [N + 1]: each sequence's first unit, and the count of units
  // A state pool's start states [N][H] (the caller's layout), copied before any pass: the last segment
  // writes a sequence's final state into its slot while other segments may still read the start there.
  float* starts = nullptr;
  float* ends = nullptr;  // [N][count][H][K][V]: E, overwritten by the stitch with the next start state
  float* maps = nullptr;  // [N][count][H][K][K]: M transposed (M^T[j][k] = M[k][j])
  // Route small_bh's choice on the device (kda_small_bh.cu, all_warm), set for a fixed layout of at most
  // KDACTL_SMALL_BH_MAX_UNSTITCHED segments: nonzero when every segment starts warm. Where set, kReduce
  // runs only then (its grid without M slots: nothing is stitched) and a whole walk (kWhole) only otherwise.
  unsigned* all_warm = nullptr;
  // kReduce with M slots whose grid fits one wave (set by the launcher): a known segment whose middle
  // chunk starts warm too is walked in two halves at once, by its E slot (to the middle) and its M slot
  // (from the middle), which such a segment leaves idle otherwise. A kReduce instance of its own
  // (recur's HALVES): the check cost the plain kReduce 4-7 % where it was a runtime branch (H100).
  bool halves = false;
  bool longest_first = false;  // Pass::kWhole: run the sequences longest first (longest_first below)
};
// The chunk a segment's walk starts from: 0 (the sequence's start, from its initial state: exact) when
// the walk back from the segment's first chunk reaches it within kWarmChunks chunks; else the chunk
// c > 0 from which chunks c .. first - 1 bound the history before them to 2^kDropLog2 (a zero state
// there); else -1: the segment needs its exact stitched start. `slot0`: the sequence's chunk 0's slot.
// MAX_CHUNKS: how far back it may walk (a multiple of kWarmLoads; below kWarmChunks only where the bounds
// further back are not there yet: tools/ahead_probe.cu).
template <int MAX_CHUNKS = kWarmChunks>
__device__ __forceinline__ int64_t warm_start_at(const Segments& sg, int64_t slot0, int h, int H, int64_t first) {
  static_assert(MAX_CHUNKS % kWarmLoads == 0, "whole loads of bounds");
  if (first == 0) return 0;
  if (!sg.bounds) return first <= MAX_CHUNKS ? 0 : -1;
  float log2_bound = 0.f;
  for (int w0 = 0; w0 < MAX_CHUNKS; w0 += kWarmLoads) {
    float bound[kWarmLoads];  // log2 of the bounds of chunks first - 1 - w0, first - 2 - w0, ...: loaded at once
#pragma unroll
    for (int w = 0; w < kWarmLoads; ++w) {
      const int64_t c = first - 1 - w0 - w;
      bound[w] = c > 0 ? sg.bounds[(slot0 + c) * H + h] : 0.f;
    }
#pragma unroll
    for (int w = 0; w < kWarmLoads; ++w) {
      const int64_t c = first - 1 - w0 - w;
      if (c <= 0) return 0;
      log2_bound += bound[w];
      if (log2_bound <= kDropLog2) return c;
    }
  }
  return -1;
}
__device__ __forceinline__ int64_t warm_start(const Segments& sg, int64_t slot0, int h, int H, int p) {
  return warm_start_at(sg, slot0, h, H, p * sg.chunks);
}

// A stage of the ring: the chunk's block as the workspace holds it (Block's order, tiles in tile_at's),
// then this CTA's values of the chunk's v.
template <int K, int VS>
struct RecurStage {
  static constexpr int UP = VS + 8;  // v's pitch: its transposed ldmatrix free of bank conflicts
  bf16 w[C * K], qg[C * K], kr[C * K];  // -W, Qg, Kr
  bf16 m[Block<K>::kPlanes][C * C];     // M' hi, lo, P hi, lo
  float eg[K];
  uint16_t v[C][UP];  // bf16 or fp16
};

// Varlen batches of up to kOrderMax sequences whose CTAs outnumber the SMs take them longest first
// (Segments::longest_first): CTAs start in blockIdx.z order, and a long sequence started last would
// run alone after the others (its chain of chunks is the batch's critical path). Each CTA ranks the
// lengths itself (ties by index), so nothing is computed on the host and the launch stays
// capturable. The CTA's first THREADS threads must all call it.
constexpr int kOrderMax = 64;
template <int THREADS>
__device__ __forceinline__ int64_t longest_first(const kdactl_kda_args& a, int64_t z) {
  if (!a.varlen || a.batch < 2 || a.batch > kOrderMax) return z;
  __shared__ int64_t len[kOrderMax];
  __shared__ int64_t picked;
  for (int m = threadIdx.x; m < a.batch; m += THREADS) {
    int64_t bos, eos;
    sequence_bounds(a, m, bos, eos);
    len[m] = eos - bos;
  }
  sync_first<THREADS>();
  for (int m = threadIdx.x; m < a.batch; m += THREADS) {
    int rank = 0;
    for (int j = 0; j < a.batch; ++j) rank += len[j] > len[m] || (len[j] == len[m] && j < m);
    if (rank == z) picked = m;
  }
  sync_first<THREADS>();
  return picked;
}

// S^T (the walk's accumulators, recur's layout) as bf16 A operands, k-step kk: keys 16 kk .. 16 kk + 15.
template <int K>
__device__ __forceinline__ void state_operands(const float (&s)[K / 8][4], uint32_t (&as)[K / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    as[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    as[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    as[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    as[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// One chunk of the walk on mma.sync, each warp its 16 value rows: U^T = V^T M'^T + S^T (-W)^T, O^T =
// S^T Qg^T + U^T P^T into `out` (when emit), and S^T = S^T Diag(eG) + U^T Kr. `v_rows`: this lane's row
// address of V^T's transposed ldmatrix, as recur's.
template <int K, bool F16, typename St>
__device__ __forceinline__ void chunk_mma_sync(const St& st, float (&s)[K / 8][4], const uint32_t (&as)[K / 16][4],
                                               float (&out)[2][4], bool emit, bool homogeneous, const uint16_t* v_rows,
                                               int lane) {
  const int t = lane & 3;
  const int lr = (lane >> 4) * 8 + (lane & 7), lc = ((lane >> 3) & 1) * 8;  // ldmatrix row addresses
  float u[2][4] = {}, u_odd[2][4] = {}, u_v[2][4] = {}, out_odd[2][4] = {};
  if (!homogeneous) {  // V^T M'^T, apart from the chain through S: it needs no S
    uint32_t av[4], bm[4], bm_lo[4];
    ldmatrix_x4_trans(av, v_rows);
    ldmatrix_x4(bm, &st.m[0][tile_at(lr, lc)]);
    ldmatrix_x4(bm_lo, &st.m[1][tile_at(lr, lc)]);
    if constexpr (F16) {  // fp16 v as two bf16 parts, exactly: hi times M' (hi + lo), lo times M' hi
      uint32_t av_lo[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        __half2 h2;
        memcpy(&h2, &av[m], sizeof(h2));
        const float2 x = __half22float2(h2);
        split_bf16(x.x, x.y, av[m], av_lo[m]);
      }
      mma_bf16(u_v[0], av_lo, bm[0], bm[1]);
      mma_bf16(u_v[1], av_lo, bm[2], bm[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      mma_bf16(u_v[nt], av, bm_lo[2 * nt], bm_lo[2 * nt + 1]);
      mma_bf16(u_v[nt], av, bm[2 * nt], bm[2 * nt + 1]);
    }
  }
  // Even and odd k-steps accumulate apart: two dependent mma chains of K/32 instead of one of K/16.
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t bw[4], bq[4];
    ldmatrix_x4(bw, &st.w[tile_at(lr, 16 * kk + lc)]);
    float(&uk)[2][4] = (kk & 1) ? u_odd : u;
    mma_bf16(uk[0], as[kk], bw[0], bw[1]);
    mma_bf16(uk[1], as[kk], bw[2], bw[3]);
    if (emit) {
      ldmatrix_x4(bq, &st.qg[tile_at(lr, 16 * kk + lc)]);
      float(&ok)[2][4] = (kk & 1) ? out_odd : out;
      mma_bf16(ok[0], as[kk], bq[0], bq[1]);
      mma_bf16(ok[1], as[kk], bq[2], bq[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) u[nt][i] += u_odd[nt][i] + u_v[nt][i];
  // S^T = S^T Diag(eG) + U^T Kr. With fp16 q, k, v, Kr is fp16 and so is U where the warp's U fits
  // fp16's range (else bf16, and Kr converted): 8x finer than bf16, which the final state of an fp16
  // call needs (U and Kr in bf16 dominate its error: tools/chunk_precision.py --fla-gate-case).
  const uint32_t au[4] = {pack_bf16(u[0][0], u[0][1]), pack_bf16(u[0][2], u[0][3]),
                          pack_bf16(u[1][0], u[1][1]), pack_bf16(u[1][2], u[1][3])};
  const int tr = ((lane >> 3) & 1) * 8 + (lane & 7), tc = (lane >> 4) * 8;
  // One loop per operand kind, chosen once per chunk (a choice inside it cost bf16 calls, which
  // never take the others, instructions on the chain through S): kBf16 U and Kr; kF16 U and Kr
  // (fp16 inputs, the warp's U within kF16Safe); kBf16U (fp16 inputs, U past it: Kr converted).
  enum { kBf16, kF16, kBf16U };
  auto update = [&](auto kind, const uint32_t(&a_u)[4]) {
    constexpr int kKind = decltype(kind)::value;
#pragma unroll
    for (int jj = 0; jj < K / 16; ++jj) {
      uint32_t bk[4];
      ldmatrix_x4_trans(bk, &st.kr[tile_at(tr, 16 * jj + tc)]);
      if constexpr (kKind == kBf16U)
#pragma unroll
        for (int i = 0; i < 4; ++i) bk[i] = f16_to_bf16(bk[i]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * jj + half;
        const float2 e = *reinterpret_cast<const float2*>(&st.eg[8 * j + 2 * t]);
        s[j][0] *= e.x, s[j][1] *= e.y, s[j][2] *= e.x, s[j][3] *= e.y;
        if constexpr (kKind == kF16) mma_f16(s[j], a_u, bk[2 * half], bk[2 * half + 1]);
        else mma_bf16(s[j], a_u, bk[2 * half], bk[2 * half + 1]);
      }
    }
  };
  if constexpr (!F16) {
    update(Gate::Mode<kBf16>{}, au);
  } else {
    float u_max = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) u_max = fmaxf(u_max, fabsf(u[nt][i]));
    if (__any_sync(0xffffffffu, u_max > kF16Safe)) {
      update(Gate::Mode<kBf16U>{}, au);
    } else {
      const uint32_t au16[4] = {pack_f16(u[0][0], u[0][1]), pack_f16(u[0][2], u[0][3]),
                                pack_f16(u[1][0], u[1][1]), pack_f16(u[1][2], u[1][3])};
      update(Gate::Mode<kF16>{}, au16);
    }
  }
  if (emit) {  // O^T += U^T P^T (the U the state took)
    uint32_t bp[4], bp_lo[4];
    ldmatrix_x4(bp, &st.m[2][tile_at(lr, lc)]);
    ldmatrix_x4(bp_lo, &st.m[3][tile_at(lr, lc)]);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      mma_bf16(out_odd[nt], au, bp_lo[2 * nt], bp_lo[2 * nt + 1]);
      mma_bf16(out[nt], au, bp[2 * nt], bp[2 * nt + 1]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) out[nt][i] += out_odd[nt][i];
  }
}

#if defined(KDACTL_WGMMA)
// One chunk of the walk on sm_90a's warpgroup MMA, the products of recur's mma.sync loop: each of the
// CTA's warpgroups owns 64 of its value rows (warp w the 16 of its vw), with S^T as the accumulator of
// its update and, packed to bf16 (`as`), the A operand of S^T (-W)^T and S^T Qg^T; the tensor cores
// read the B operands from the stage, whose tiles are in wgmma's core-matrix order (tile_at).
// `v_rows`: this lane's row address of V^T's transposed ldmatrix, as recur's. EMIT and HOMOGENEOUS
// are recur's emit and homogeneous, as template arguments: a branch between the products of a group
// makes ptxas insert a warpgroup.arrive there (its note C7519), so recur branches before the first.
template <int K, bool EMIT, bool HOMOGENEOUS, typename St>
__device__ __forceinline__ void chunk_wgmma(const St& st, float (&s)[K / 8][4], uint32_t (&as)[K / 16][4],
                                            float (&out)[2][4], const uint16_t* v_rows, int t) {
  constexpr bool emit = EMIT, homogeneous = HOMOGENEOUS;
  constexpr uint32_t kPiece = C * 16;  // bytes from a tile's 16-byte column piece to the next
  constexpr uint32_t kRows8 = 128;     // bytes from its rows 0-7 to rows 8-15
  // A [C][K] tile at k-step kk (keys 16 kk ..) as B = tile^T (K-major), and a [C][C] plane as B = plane^T.
  auto tile_t = [&](const bf16* tile, int kk) { return wgmma_desc(tile + kk * 16 * C, kPiece, kRows8); };
  auto plane_t = [&](const bf16* plane) { return wgmma_desc(plane, kPiece, kRows8); };
  float u[2][4] = {};
  uint32_t av[1][4] = {};
  if constexpr (!homogeneous) ldmatrix_x4_trans(av[0], v_rows);
  wgmma_hold(as), wgmma_hold(av), wgmma_hold(u), wgmma_hold(out);
  wgmma_fence();
  // U^T = S^T (-W)^T + V^T M'^T (M' as hi + lo), then O^T = S^T Qg^T in a group of its own.
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_n16(u, as[kk], tile_t(st.w, kk));
  if constexpr (!homogeneous) wgmma_n16(u, av[0], plane_t(st.m[1])), wgmma_n16(u, av[0], plane_t(st.m[0]));
  wgmma_commit();
  if constexpr (emit)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) wgmma_n16(out, as[kk], tile_t(st.qg, kk));
  wgmma_commit();
  wgmma_wait<1>();  // U is in; O's products may still run
  wgmma_hold(u), wgmma_hold(av);
  uint32_t au[1][4] = {{pack_bf16(u[0][0], u[0][1]), pack_bf16(u[0][2], u[0][3]), pack_bf16(u[1][0], u[1][1]),
                        pack_bf16(u[1][2], u[1][3])}};
  // S^T = S^T Diag(eG) + U^T Kr (Kr [token][key]: B with N contiguous), O^T += U^T P^T. (S^T scaled
  // before the wait instead, beside the products in flight, made ptxas wait for all of them first.)
#pragma unroll
  for (int j = 0; j < K / 8; ++j) {
    const float2 e = *reinterpret_cast<const float2*>(&st.eg[8 * j + 2 * t]);
    s[j][0] *= e.x, s[j][1] *= e.y, s[j][2] *= e.x, s[j][3] *= e.y;
  }
  wgmma_hold(s), wgmma_hold(au);
  wgmma_fence();
  const uint64_t kr = wgmma_desc(st.kr, kRows8, kPiece);  // along K (tokens) 8 rows, along N (keys) a piece
  if constexpr (K == 128) wgmma_n128_tb(s, au[0], kr);
  else wgmma_n64_tb(s, au[0], kr);
  if constexpr (emit) wgmma_n16(out, au[0], plane_t(st.m[3])), wgmma_n16(out, au[0], plane_t(st.m[2]));
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(s), wgmma_hold(out), wgmma_hold(as), wgmma_hold(au);
}
#endif

// Whether a walk takes sm_90a's warpgroup MMA (chunk_wgmma): bf16 walks of whole warpgroups, where the
// build has it and the SM has more than one warpgroup to run. A lone one (4 warps, 8 stages: pick_recur's
// CTA with an SM to itself) waits out each group of products, where mma.sync's instructions overlap.
// H100, per call: B1 T8192 H64 (4 warps, 8 stages) 417 us against 387; small_bh's kReduce (4 warps,
// 4 stages, two CTAs an SM) 285 against 345-347 at B1 T8192 H64 and 218-219 against 263-265 at
// B1 T32768 H12; 8 warps 548-549 against 572-577 at B1 T8192 H96 (kernel times alternating with the
// mma.sync build: docs/routes/chunk.md).
template <int WARPS, int STAGES, bool F16>
__host__ __device__ constexpr bool walks_on_wgmma() {
#if defined(KDACTL_WGMMA)
  return !F16 && (WARPS == 8 || (WARPS == 4 && STAGES < 8));
#else
  return false;
#endif
}

// A walk's shared memory (recur below lays it out): the ring of STAGES stages, then each warp's o tile.
template <int K, int WARPS, int STAGES>
constexpr size_t recur_smem() {
  return STAGES * sizeof(RecurStage<K, 16 * WARPS>) + WARPS * C * 24 * sizeof(bf16);
}

// A walk's place in its CTA. The library's walks are their whole CTA (WholeCta); a CTA of more roles
// (tools/ahead_probe.cu) gives each walk warpgroup a seat: its threads' numbering from 0 (tid), a named
// barrier of its own (sync) and a wait before each chunk's load (before_load).
struct WholeCta {
  static constexpr bool kWhole = true;
  __device__ __forceinline__ void before_load(int64_t) const {}
};

// One CTA's walk: value slice vx, head h, unit bz (a sequence, or a segment slot).
// F16: q, k, v and o are fp16 (a.qkv_fp16), an instance of its own, so that the bf16 instance's loop
// is one straight block, free of fp16's operand choices on the chain through S. HALVES: kReduce under
// Segments::halves. Seat: the walk's place in its CTA (WholeCta above).
template <int K, int V, int WARPS, int STAGES, Pass PASS, bool F16, bool HALVES, typename Seat = WholeCta>
__device__ __forceinline__ void recur(const kdactl_kda_args& a, const unsigned char* ws, const Segments& sg,
                                      unsigned char* smem_raw, int vx, int h, int64_t bz, Seat seat = {}) {
  static_assert(Seat::kWhole || PASS != Pass::kWhole, "longest_first counts the CTA's threads");
  constexpr int VS = 16 * WARPS;
  using St = RecurStage<K, VS>;
  using B = Block<K>;
  St* stage = reinterpret_cast<St*>(smem_raw);
  uint16_t(*o_tile)[C][24] = reinterpret_cast<uint16_t(*)[C][24]>(smem_raw + STAGES * sizeof(St));  // o's bits

  unsigned seat_tid = threadIdx.x;  // this thread's index in the walk
  if constexpr (!Seat::kWhole) seat_tid = seat.tid();
  const int lane = seat_tid & 31, warp = seat_tid >> 5, g = lane >> 2, t = lane & 3;
  const int H = a.heads;
  if (sg.all_warm && (*sg.all_warm != 0) != (PASS == Pass::kReduce)) return;  // the other kernel walks
  // Sequence n, segment p of its `segments`, and for kReduce whether this CTA maps M (homogeneous).
  const bool paired = PASS == Pass::kReduce && !sg.all_warm;  // kReduce's grid: an M slot (odd z) beside each unit's
  const bool m_slot = paired && (bz & 1);
  const int64_t z = paired ? bz / 2 : bz;
  int64_t n = PASS != Pass::kWhole ? z / sg.count : sg.longest_first ? longest_first<WARPS * 32>(a, z) : z;
  int p = PASS == Pass::kWhole ? 0 : static_cast<int>(z % sg.count), segments = sg.count;
  if (PASS != Pass::kWhole && sg.unit_seq) {
    n = sg.unit_seq[z];
    if (n < 0) return;  // past the last unit
    p = static_cast<int>(z - sg.seq_unit0[n]), segments = sg.seq_unit0[n + 1] - sg.seq_unit0[n];
  }
  const int v_cta = vx * VS, vw = warp * 16;
  int64_t bos, eos;
  sequence_bounds(a, n, bos, eos);
  const int64_t nchunks = (eos - bos + C - 1) / C, slot0 = bos / C + n;
  int64_t c_first = PASS == Pass::kWhole ? 0 : p * sg.chunks;  // this unit's first chunk of o (or E)
  const int64_t seg_base = (z * H + h);  // this segment's slot in sg.ends and sg.maps
  // A segment whose start is known (segment 0, from the initial state, or a warm start: warm_start)
  // is walked to its end in kReduce, writing o from c_first on and its absolute end state; kReplay
  // walks only the stitched segments, from the start the stitch made. kReduce's E (from a zero start)
  // and M of a stitched segment run only where the next segment's start is stitched from them.
  // A sequence of at most KDACTL_SMALL_BH_MAX_UNSTITCHED segments is never stitched (its stitched walks
  // would cost more than walking on): a known segment's CTA walks on through every following segment
  // that does not start known, and those segments' CTAs return.
  const bool unstitched = PASS != Pass::kWhole && segments <= KDACTL_SMALL_BH_MAX_UNSTITCHED;
  int64_t warm = PASS == Pass::kWhole ? 0 : warm_start(sg, slot0, h, H, p);
  const bool known = warm >= 0;
  if (PASS == Pass::kReplay && (known || unstitched)) return;  // walked in kReduce
  int last = p;  // the last segment this CTA walks
  int64_t c_end = PASS == Pass::kWhole ? nchunks : min(nchunks, (p + 1) * sg.chunks);
  bool first_half = false, second_half = false;  // a known segment's, walked in two (Segments::halves)
  if (PASS == Pass::kReduce && unstitched) {
    if (m_slot || !known) return;
    while (last + 1 < segments && warm_start(sg, slot0, h, H, last + 1) < 0) ++last;
    c_end = min(nchunks, (last + 1) * sg.chunks);
  } else if (PASS == Pass::kReduce) {
    const int64_t mid = c_first + (c_end - c_first + 1) / 2;
    const bool halvable = HALVES && known && c_end - c_first >= kMinHalvedChunks;
    const int64_t warm_mid = halvable ? warm_start_at(sg, slot0, h, H, mid) : -1;
    if (warm_mid >= 0) {  // the E slot walks to the middle, the M slot from there as a known segment
      if (m_slot) c_first = mid, warm = warm_mid, second_half = true;
      else c_end = mid, first_half = true;
    } else {
      // Whether the stitch reads this segment's E and M. Asked only where it decides: a known segment's E
      // slot walks and its M slot returns either way, without a second round trip for the next bounds.
      auto next_reads = [&] { return p < segments - 1 && warm_start(sg, slot0, h, H, p + 1) < 0; };
      if (m_slot ? known || !next_reads() : !known && !next_reads()) return;
    }
  }
  const bool homogeneous = m_slot && !second_half;  // an M slot that maps M
  const int64_t c_begin = warm >= 0 ? warm : c_first;  // the first chunk walked

  float s[K / 8][4];  // S^T rows vw+g, vw+g+8 (of this slice) x keys 8j+2t, 8j+2t+1
  const int64_t slot = state_slot(a, n);
  const int64_t state_base = (slot * H + h) * K * V;
  const int vcol = v_cta + vw + g;
  // The caller's states are [K][V] or V-first [V][K]; small_bh's own segment states are [K][V].
  auto at = [](bool v_first, int key, int col) { return state_offset(v_first, key, col, K, V); };
  const float* s0 = a.initial_state && slot >= 0 && c_begin == 0 ? a.initial_state + state_base : nullptr;
  if (s0 && PASS != Pass::kWhole && sg.starts) s0 = sg.starts + (n * H + h) * K * V;
  bool s0_v_first = a.state_v_first;
  if (PASS == Pass::kReplay && warm < 0) s0 = sg.ends + (seg_base - H) * K * V, s0_v_first = false;  // the stitched start
#pragma unroll
  for (int j = 0; j < K / 8; ++j) {
    const int key = 8 * j + 2 * t;
    if (homogeneous) {  // the identity's columns
      s[j][0] = key == vcol, s[j][1] = key + 1 == vcol, s[j][2] = key == vcol + 8, s[j][3] = key + 1 == vcol + 8;
    } else {
      s[j][0] = s0 ? s0[at(s0_v_first, key, vcol)] : 0.f;
      s[j][1] = s0 ? s0[at(s0_v_first, key + 1, vcol)] : 0.f;
      s[j][2] = s0 ? s0[at(s0_v_first, key, vcol + 8)] : 0.f;
      s[j][3] = s0 ? s0[at(s0_v_first, key + 1, vcol + 8)] : 0.f;
    }
  }
  const bool writes_o = PASS != Pass::kReduce || known;  // o, checkpoints and (last segment) the final state
  const bool checkpointing = writes_o && a.checkpoints != nullptr;
  const int64_t checkpoint0 = checkpointing ? checkpoint_base(a, n) : 0;

  // Copy i of a stage goes to thread i % threads, so every thread's copies sit at fixed offsets from
  // two bases (threads is a multiple of the pieces per row of v): the loops unroll into bare cp.async.
  constexpr int kThreads = WARPS * 32, kSlice = VS / 8;  // 16-byte pieces per row of v
  static_assert(kThreads % kSlice == 0 && C * kSlice % kThreads == 0, "copy layout");
  static_assert(offsetof(St, v) == B::kBytes, "a stage starts with the block as it is");
  const int tid = seat_tid;
  const uint16_t* v = static_cast<const uint16_t*>(a.v);
  auto load = [&](int64_t c, St& st) {
    seat.before_load(c);
    // The block, 16 bytes a copy, as it is.
    constexpr int kPieces = B::kBytes / 16;
    const unsigned char* blk = ws + ((slot0 + c) * H + h) * B::kBytes + tid * 16;
    unsigned char* dst = reinterpret_cast<unsigned char*>(&st) + tid * 16;
#pragma unroll
    for (int it = 0; it < (kPieces + kThreads - 1) / kThreads; ++it)
      if (kPieces % kThreads == 0 || tid + it * kThreads < kPieces) cp_async16(dst + it * kThreads * 16, blk + it * kThreads * 16);
    if (!homogeneous) {  // (M's columns start from zero values: no v)
      // This CTA's VS values of the chunk's v rows (zero past the sequence's end).
#pragma unroll
      for (int it = 0; it < C * kSlice / kThreads; ++it) {
        const int r = tid / kSlice + it * (kThreads / kSlice);
        const int64_t row = bos + c * C + r;
        const bool in = row < eos;
        cp_async16_zfill(&st.v[r][(tid % kSlice) * 8], v + ((in ? row : bos) * H + h) * V + v_cta + (tid % kSlice) * 8,
                         in ? 16 : 0);
      }
    }
  };

  const int64_t count = c_end - c_begin;  // chunks this CTA walks, from c_begin
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < count) load(c_begin + i, stage[i]);
    cp_async_commit();
  }
  uint16_t* o = static_cast<uint16_t*>(a.o);  // bf16, or fp16 (F16)
  for (int64_t i = 0; i < count; ++i) {
    cp_async_wait<STAGES - 2>();
#if defined(KDACTL_WGMMA)
    if constexpr (walks_on_wgmma<WARPS, STAGES, F16>()) fence_proxy_async();  // the stage's copies, for the tensor cores' reads
#endif
    // chunk i is in; everyone is done with the stage the next load overwrites
    if constexpr (Seat::kWhole) sync_first<kThreads>();
    else seat.sync(kThreads);
    if (i + STAGES - 1 < count) load(c_begin + i + STAGES - 1, stage[(i + STAGES - 1) % STAGES]);
    cp_async_commit();
    const St& st = stage[i % STAGES];
    const int64_t c = c_begin + i;
    const bool emit = PASS == Pass::kWhole || (writes_o && c >= c_first);  // past a warm start's first chunks
    if (checkpointing && emit && (c * C) % a.checkpoint_every == 0) {  // the state before chunk c
      const int64_t row = checkpoint0 + c * C / a.checkpoint_every;
#pragma unroll
      for (int j = 0; j < K / 8; ++j) {
        const int key = 8 * j + 2 * t;
        put_checkpoint(a, row, h, key, vcol, s[j][0]);
        put_checkpoint(a, row, h, key + 1, vcol, s[j][1]);
        put_checkpoint(a, row, h, key, vcol + 8, s[j][2]);
        put_checkpoint(a, row, h, key + 1, vcol + 8, s[j][3]);
      }
    }

    uint32_t as[K / 16][4];
    state_operands<K>(s, as);
    // U^T = V^T M'^T + S^T (-W)^T and O^T = S^T Qg^T + U^T P^T: [16 values x 16 tokens] per warp.
    // V^T is an A operand straight from the [token][value] stage: a transposed ldmatrix of the 8x8
    // blocks (tokens 0-7 | 8-15) x (values +0 | +8) gives each lane its (value, tokens 2t..2t+1).
    const int lr = (lane >> 4) * 8 + (lane & 7), lc = ((lane >> 3) & 1) * 8;  // ldmatrix row addresses
    float out[2][4] = {};
#if defined(KDACTL_WGMMA)
    if constexpr (walks_on_wgmma<WARPS, STAGES, F16>())
      homogeneous ? chunk_wgmma<K, false, true>(st, s, as, out, &st.v[lr][vw + lc], t)  // (which never emits)
      : emit      ? chunk_wgmma<K, true, false>(st, s, as, out, &st.v[lr][vw + lc], t)
                  : chunk_wgmma<K, false, false>(st, s, as, out, &st.v[lr][vw + lc], t);
    else
#endif
      chunk_mma_sync<K, F16>(st, s, as, out, emit, homogeneous, &st.v[lr][vw + lc], lane);
    if (emit) {  // o through a per-warp tile, 16 bytes a lane
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          o_tile[warp][8 * nt + 2 * t + (i & 1)][g + (i >> 1) * 8] = o_bits(out[nt][i], F16);
      __syncwarp();
      const int tok = lane >> 1, half = lane & 1;
      const int64_t row = bos + c * C + tok;
      if (row < eos)
        *reinterpret_cast<uint4*>(o + (row * H + h) * V + v_cta + vw + half * 8) =
            *reinterpret_cast<const uint4*>(&o_tile[warp][tok][half * 8]);
    }
  }
  cp_async_wait_all();

  if (homogeneous) {  // M^T: row vcol of M^T is column vcol of M
    float* mt = sg.maps + seg_base * K * K;
#pragma unroll
    for (int j = 0; j < K / 8; ++j) {
      const int key = 8 * j + 2 * t;
      *reinterpret_cast<float2*>(mt + vcol * K + key) = make_float2(s[j][0], s[j][1]);
      *reinterpret_cast<float2*>(mt + (vcol + 8) * K + key) = make_float2(s[j][2], s[j][3]);
    }
    return;
  }
  if (first_half) return;  // the M slot walks on from the middle and writes the segment's end
  float* sf = a.final_state && slot >= 0 ? a.final_state + state_base : nullptr;
  bool sf_v_first = a.state_v_first;
  if (PASS != Pass::kWhole && last != segments - 1) {  // E_p, for the stitch (kReduce); nothing after a replay
    sf = PASS == Pass::kReduce && !unstitched ? sg.ends + seg_base * K * V : nullptr;
    sf_v_first = false;
  }
  if (sf) {
#pragma unroll
    for (int j = 0; j < K / 8; ++j) {
      const int key = 8 * j + 2 * t;
      sf[at(sf_v_first, key, vcol)] = s[j][0];
      sf[at(sf_v_first, key + 1, vcol)] = s[j][1];
      sf[at(sf_v_first, key, vcol + 8)] = s[j][2];
      sf[at(sf_v_first, key + 1, vcol + 8)] = s[j][3];
    }
  }
}

template <int K, int V, int WARPS, int STAGES, Pass PASS, bool F16, bool HALVES>
__global__ void __launch_bounds__(WARPS * 32)
    kda_chunk_recur(const kdactl_kda_args a, const unsigned char* ws, const Segments sg) {
  static_assert(!HALVES || PASS == Pass::kReduce, "halves are kReduce's");
#ifdef KDACTL_ARCH_MISMATCH
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  recur<K, V, WARPS, STAGES, PASS, F16, HALVES>(a, ws, sg, smem_raw, blockIdx.x, blockIdx.y, blockIdx.z);
#endif
}

}  // namespace chunk
}  // namespace kdactl
