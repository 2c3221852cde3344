// KDA prefill, route "direct": the token-serial recurrence with the state held in registers.
//
//   S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T (scale q_t)
//
// The columns of S are independent, so the V columns are split across warps (and CTAs). Per token
// and column c, with d = exp(g_t), everything follows from S_{t-1} in one pass:
//   u_c = beta_t (v_c - sum_i k_i d_i S[i,c])                       (the delta rule's correction)
//   o_c = sum_i (scale q_i d_i) S[i,c] + (scale q.k) u_c             (o from S_{t-1}, no 2nd pass)
//   S[i,c] <- d_i S[i,c] + k_i u_c
// so the only work on the sequential chain is one fused reduction over K (for both dots of every
// column a warp owns) and one broadcast of u.
//
// Roles: every warp is a consumer of its own columns; all warps of a CTA share one head and stage
// that head's inputs (q, k, g, v-slice, beta) for the next tile of kTile tokens with cp.async while
// the current tile runs, one __syncthreads per tile.
// Lane layout: lane l owns rows [l*RPL, l*RPL+RPL) of the warp's kCols columns (RPL = K/32).
#pragma once
#include <cuda_bf16.h>
#include "device.cuh"

namespace kdactl {
namespace direct {

constexpr int kTile = 16;   // tokens staged per pipeline step
constexpr int kWarps = 4;   // a CTA's warps (its launch bounds: 128 threads)
constexpr unsigned kFull = 0xffffffffu;

// Sum NV per-lane values over the 32 lanes of a warp. While more than one value is left, each
// butterfly step halves what a lane carries (it keeps the half its mask bit selects and adds the
// partner's copy of that half); the remaining steps are plain all-reduce. Afterwards lane l holds
// the total of value index l / (32 / NV). NV is a power of two <= 32.
template <int NV>
__device__ __forceinline__ float reduce_scatter(float (&v)[NV], int lane) {
#pragma unroll
  for (int step = 0; step < 5; ++step) {
    const int mask = 16 >> step;
    const int cnt = (NV >> step) > 0 ? (NV >> step) : 1;
    if (cnt > 1) {
      const int half = cnt / 2;
      const bool upper = (lane & mask) != 0;
#pragma unroll
      for (int i = 0; i < half; ++i) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(kFull, send, mask);
      }
    } else {
      v[0] += __shfl_xor_sync(kFull, v[0], mask);
    }
  }
  return v[0];
}

// In: q, k, v and o (bf16 or fp16); GType: g (float, bf16 or fp16).
template <int K, typename GType, typename In>
struct Stage {
  In q[kTile][K];
  In k[kTile][K];
  GType g[kTile][K];
  float beta[kTile];
};

// Grid: (V / (kWarps * kCols), H, N). Block: kWarps * 32 threads.
template <int K, int kCols, typename GType, typename In>
__global__ void __launch_bounds__(kWarps * 32) kda_direct_kernel(const kdactl_kda_args a) {
#ifdef KDACTL_ARCH_MISMATCH
  __trap();  // built for another arch: fail loudly instead of computing quietly
#else
  constexpr int RPL = K / 32;       // rows per lane
  constexpr int NV = 2 * kCols;     // values reduced per token: k-dot and q-dot of each column
  constexpr int kGroup = 32 / NV;   // lanes that end up holding the same reduced value
  using StageT = Stage<K, GType, In>;
  __shared__ __align__(16) StageT stage[2];
  __shared__ __align__(16) In v_tile[2][kTile][128];  // up to 4 warps x 32 columns

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int cta_cols = nwarps * kCols;
  const int h = blockIdx.y, n = blockIdx.z, H = a.heads, V = a.value_dim;
  const int col0_cta = blockIdx.x * cta_cols;
  const int col0 = col0_cta + warp * kCols;
  const int row0 = lane * RPL;
  int64_t bos, eos;
  sequence_bounds(a, n, bos, eos);
  const int64_t len = eos - bos;

  const In* q = static_cast<const In*>(a.q);
  const In* k = static_cast<const In*>(a.k);
  const In* v = static_cast<const In*>(a.v);
  const GType* g = static_cast<const GType*>(a.g);
  In* o = static_cast<In*>(a.o);

  // State S[row0 + e][col0 + c], fp32 in registers for the whole sequence.
  float S[RPL][kCols];
  const int64_t slot = state_slot(a, n);
  const int64_t state_base = (slot * H + h) * K * V;
  const bool has_state = slot >= 0, v_first = a.state_v_first;
#pragma unroll
  for (int e = 0; e < RPL; ++e)
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      S[e][c] = a.initial_state && has_state ? a.initial_state[state_base + state_at(a, v_first, row0 + e, col0 + c)] : 0.f;
  const int64_t checkpoint0 = a.checkpoints ? checkpoint_base(a, n) : 0;

  // Stage tile `tile` into buffer `buf`: q, k, g rows and this CTA's v columns by cp.async (16-byte
  // chunks); beta returned to the caller, which stores it after the current tile's serial loop so
  // that its global-load latency hides behind that loop.
  auto stage_tile = [&](int64_t tile, int buf) -> float {
    const int64_t t0 = tile * kTile;
    const int ntok = static_cast<int>(len - t0 < kTile ? len - t0 : kTile);
    constexpr int kQChunks = K * 2 / 16, kGChunks = K * sizeof(GType) / 16;
    const int v_chunks = cta_cols * 2 / 16;
    const int per_tok = 2 * kQChunks + kGChunks + v_chunks;
    for (int i = threadIdx.x; i < ntok * per_tok; i += blockDim.x) {
      const int t = i / per_tok, j = i % per_tok;
      const int64_t row = (bos + t0 + t) * H + h;  // token-head row of the [B*T, H, *] tensors
      if (j < kQChunks) {
        cp_async16(&stage[buf].q[t][j * 8], q + qk_row(a, bos + t0 + t, h) * K + j * 8);
      } else if (j < 2 * kQChunks) {
        const int jj = j - kQChunks;
        cp_async16(&stage[buf].k[t][jj * 8], k + qk_row(a, bos + t0 + t, h) * K + jj * 8);
      } else if (j < 2 * kQChunks + kGChunks) {
        constexpr int per = 16 / sizeof(GType);
        const int jj = j - 2 * kQChunks;
        cp_async16(&stage[buf].g[t][jj * per], g + row * K + jj * per);
      } else {
        const int jj = j - 2 * kQChunks - kGChunks;
        cp_async16(&v_tile[buf][t][jj * 8], v + row * V + col0_cta + jj * 8);
      }
    }
    cp_async_commit();
    return threadIdx.x < ntok ? load_beta(a, (bos + t0 + threadIdx.x) * H + h) : 0.f;
  };

  const Gate gate = Gate::of(a, h);  // the head's gate constants and this lane's dt_bias, read once
  float bias[RPL];
#pragma unroll
  for (int e = 0; e < RPL; ++e) bias[e] = gate.mode == KDACTL_GATE_AS_GIVEN ? 0.f : Gate::bias(a, h, row0 + e);
  const int64_t ntiles = (len + kTile - 1) / kTile;
  float beta_next = ntiles > 0 ? stage_tile(0, 0) : 0.f;
  if (threadIdx.x < kTile) stage[0].beta[threadIdx.x] = beta_next;
  const float scale = a.scale;

  for (int64_t tile = 0; tile < ntiles; ++tile) {
    const int buf = static_cast<int>(tile & 1);
    cp_async_wait_all();
    __syncthreads();  // tile's stage visible to all; everyone is done reading the other buffer
    if (tile + 1 < ntiles) beta_next = stage_tile(tile + 1, buf ^ 1);
    const StageT& st = stage[buf];
    const int ntok = static_cast<int>(len - tile * kTile < kTile ? len - tile * kTile : kTile);
    if (a.checkpoints && (tile * kTile) % a.checkpoint_every == 0) {  // the state before this tile
      const int64_t row = checkpoint0 + tile * kTile / a.checkpoint_every;
#pragma unroll
      for (int e = 0; e < RPL; ++e)
#pragma unroll
        for (int c = 0; c < kCols; ++c) put_checkpoint(a, row, h, row0 + e, col0 + c, S[e][c]);
    }

    for (int t = 0; t < ntok; ++t) {
      // Per-token factors for this lane's rows (independent of S: overlaps the chain).
      float d[RPL], kf[RPL], kd[RPL], qd[RPL], qf[RPL], qk = 0.f;
#pragma unroll
      for (int e = 0; e < RPL; ++e) {
        qf[e] = to_f(st.q[t][row0 + e]);
        kf[e] = to_f(st.k[t][row0 + e]);
        d[e] = ex(gate(to_f(st.g[t][row0 + e]), bias[e]));
        qk += qf[e] * kf[e];
      }
      if (a.qk_l2norm) {  // the warp holds all K rows of the token: its sums are the norms
        float qq = 0.f, kk = 0.f;
#pragma unroll
        for (int e = 0; e < RPL; ++e) qq += qf[e] * qf[e], kk += kf[e] * kf[e];
        const float rq = rsqrtf(warp_allreduce(qq) + kL2NormEps), rk = rsqrtf(warp_allreduce(kk) + kL2NormEps);
#pragma unroll
        for (int e = 0; e < RPL; ++e) qf[e] *= rq, kf[e] *= rk;
        qk *= rq * rk;  // this lane's share of q.k, of the normalized rows
      }
#pragma unroll
      for (int e = 0; e < RPL; ++e) {
        kd[e] = kf[e] * d[e];
        qd[e] = scale * qf[e] * d[e];
      }
      // Phase 1: both dots of every column from S_{t-1}, reduced over K.
      float vals[NV];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float dk = 0.f, dq = 0.f;
#pragma unroll
        for (int e = 0; e < RPL; ++e) {
          dk = fmaf(kd[e], S[e][c], dk);
          dq = fmaf(qd[e], S[e][c], dq);
        }
        vals[c] = dk;
        vals[kCols + c] = dq;
      }
      qk = scale * warp_allreduce(qk);
      const float mine = reduce_scatter<NV>(vals, lane);
      const int idx = lane / kGroup;  // which reduced value this lane holds
      // Phase 2: u_c on the lanes holding a k-dot, then broadcast to all lanes.
      float u_local = 0.f;
      if (idx < kCols) {
        const float vc = to_f(v_tile[buf][t][warp * kCols + idx]);
        u_local = st.beta[t] * (vc - mine);
      }
      float u[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) u[c] = __shfl_sync(kFull, u_local, c * kGroup);
      // Phase 3: o from the q-dot lanes; S update on every lane.
      if (idx >= kCols && (lane % kGroup) == 0) {
        const int c = idx - kCols;
        float uc = u[0];
#pragma unroll
        for (int cc = 1; cc < kCols; ++cc) uc = (c == cc) ? u[cc] : uc;
        const int64_t row = (bos + tile * kTile + t) * H + h;
        o[row * V + col0 + c] = from_f<In>(mine + qk * uc);
      }
#pragma unroll
      for (int e = 0; e < RPL; ++e)
#pragma unroll
        for (int c = 0; c < kCols; ++c) S[e][c] = fmaf(d[e], S[e][c], kf[e] * u[c]);
    }
    // Publish the next tile's beta (read after the next iteration's barrier).
    if (tile + 1 < ntiles && threadIdx.x < kTile) stage[buf ^ 1].beta[threadIdx.x] = beta_next;
  }

  if (a.final_state && has_state) {
#pragma unroll
    for (int e = 0; e < RPL; ++e)
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        a.final_state[state_base + state_at(a, v_first, row0 + e, col0 + c)] = S[e][c];
  }
#endif
}

// The kernels at K with `cols` value columns a warp (2, 4 or 8) on the caller's stream: defined in
// kda_direct_launch.cuh and instantiated once per K in a file of its own (kda_direct_k<K>.cu).
template <int K>
int launch_k(const kdactl_kda_args& a, int cols, cudaStream_t stream);

}  // namespace direct
}  // namespace kdactl
