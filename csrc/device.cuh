// Device helpers shared by the kernel routes: operand packing for the tensor cores, the sequence
// bounds of the fixed and varlen layouts, element types, and fla's gates. The inline PTX they build
// on lives in ptx.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>
#include "common.cuh"
#include "ptx.cuh"

namespace kdactl {

// ---- Tensor cores ---------------------------------------------------------------------------------
// Fragment layouts (PTX ISA, mma.m16n8k8 tf32 / m16n8k16 bf16), with g = lane / 4, t = lane % 4:
//   C/D 16x8:       c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
//   A tf32 16x8:    a0 (g, t)   a1 (g+8, t)   a2 (g, t+4)   a3 (g+8, t+4)
//   B tf32 8x8:     b0 (k=t, n=g)             b1 (k=t+4, n=g)
//   A bf16 16x16:   a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B bf16 16x8:    b0 (k=2t..2t+1, n=g)              b1 (k=2t+8..2t+9, n=g)
// The C layout of two adjacent n-tiles is the A layout of a 16x16 bf16 tile, so an accumulator
// turns into the next product's A operand in registers.
// fp32 -> tf32 rounded to nearest (ties away), for finite x: the mma reads the top 19 bits, so adding
// half of the dropped range rounds. One integer add; cvt.rna.tf32 adds an inf/NaN test to that.
__device__ __forceinline__ uint32_t to_tf32(float x) { return __float_as_uint(x) + 0x1000u; }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
// An fp16 pair's bits as the bf16 pair nearest it.
__device__ __forceinline__ uint32_t f16_to_bf16(uint32_t pair) {
  __half2 h;
  memcpy(&h, &pair, sizeof(h));
  const float2 x = __half22float2(h);
  return pack_bf16(x.x, x.y);
}
__device__ __forceinline__ float2 unpack_bf16(uint32_t pair) {
  __nv_bfloat162 h;
  memcpy(&h, &pair, sizeof(h));
  return __bfloat1622float2(h);
}
// (x0, x1) as two bf16 pairs, hi = bf16(x) and lo = bf16(x - hi): together x to about 2^-17.
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  const float2 h = unpack_bf16(hi);
  lo = pack_bf16(x0 - h.x, x1 - h.y);
}
// ---- Layouts --------------------------------------------------------------------------------------
// Sequence n's token rows [bos, eos) in the flattened [B*T] layout (fixed: n * T; varlen: cu_seqlens).
__device__ __forceinline__ void sequence_bounds(const kdactl_kda_args& a, int64_t n, int64_t& bos, int64_t& eos) {
  if (!a.varlen) {
    bos = n * a.seqlen;
    eos = bos + a.seqlen;
  } else if (a.cu_seqlens_is_int32) {
    bos = static_cast<const int32_t*>(a.cu_seqlens)[n];
    eos = static_cast<const int32_t*>(a.cu_seqlens)[n + 1];
  } else {
    bos = static_cast<const int64_t*>(a.cu_seqlens)[n];
    eos = static_cast<const int64_t*>(a.cu_seqlens)[n + 1];
  }
}

// The slot of sequence n's state in initial_state / final_state: n, or state_indices[n] (negative:
// no state, start from zero and write nothing).
__device__ __forceinline__ int64_t state_slot(const kdactl_kda_args& a, int64_t n) {
  return a.state_indices ? static_cast<int64_t>(a.state_indices[n]) : n;
}

// Offset of element (key, col) in one head's state: [K][V], or [V][K] when v_first (a kernel with
// compile-time K and V passes them, and the offset folds to constants).
__device__ __forceinline__ int64_t state_offset(bool v_first, int key, int col, int key_dim, int value_dim) {
  return v_first ? static_cast<int64_t>(col) * key_dim + key : static_cast<int64_t>(key) * value_dim + col;
}

__device__ __forceinline__ int64_t state_at(const kdactl_kda_args& a, bool v_first, int key, int col) {
  return state_offset(v_first, key, col, a.key_dim, a.value_dim);
}

// The first checkpoint row of sequence n (kdactl_kda_args.checkpoints): the checkpoints of the
// sequences before it, ceil(len / every) each. Varlen walks cu_seqlens (only when checkpoints are asked).
__device__ __forceinline__ int64_t checkpoint_base(const kdactl_kda_args& a, int64_t n) {
  const int64_t every = a.checkpoint_every;
  if (!a.varlen) return n * ((a.seqlen + every - 1) / every);
  int64_t rows = 0, bos, eos;
  for (int64_t m = 0; m < n; ++m) {
    sequence_bounds(a, m, bos, eos);
    rows += (eos - bos + every - 1) / every;
  }
  return rows;
}

// Writes element (key, col) of checkpoint row `row`, head h.
__device__ __forceinline__ void put_checkpoint(const kdactl_kda_args& a, int64_t row, int h, int key, int col, float x) {
  const int64_t i = (row * a.heads + h) * a.key_dim * a.value_dim + state_at(a, a.state_v_first, key, col);
  if (a.checkpoint_dtype == KDACTL_DTYPE_BF16)
    static_cast<__nv_bfloat16*>(a.checkpoints)[i] = __float2bfloat16(x);
  else
    static_cast<float*>(a.checkpoints)[i] = x;
}

// The row of q and k that value head h of token `token` reads: GVA shares one q/k head among
// heads / qk_heads consecutive value heads, as fla does.
__device__ __forceinline__ int qk_heads(const kdactl_kda_args& a) { return a.qk_heads > 0 ? a.qk_heads : a.heads; }
__device__ __forceinline__ int64_t qk_row(const kdactl_kda_args& a, int64_t token, int h) {
  const int hq = qk_heads(a);
  return token * hq + h / (a.heads / hq);
}

// ---- Element types: q, k, v, o are bf16 or fp16 (template parameter In); g and beta any of three ----
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
// Two adjacent 16-bit elements (4-byte aligned) as floats.
__device__ __forceinline__ float2 to_f2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 to_f2(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
__device__ __forceinline__ float2 to_f2(const float* p) { return *reinterpret_cast<const float2*>(p); }  // 8-byte aligned
// Four adjacent elements as floats, in one load: 16-byte aligned fp32, or 8-byte aligned 16-bit.
__device__ __forceinline__ float4 to_f4(const float* p) { return *reinterpret_cast<const float4*>(p); }
template <typename T>
__device__ __forceinline__ float4 to_f4(const T* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = to_f2(reinterpret_cast<const T*>(&raw.x)), hi = to_f2(reinterpret_cast<const T*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }
// The pair of T (bf16 or fp16) nearest (lo, hi), as one word.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) return pack_f16(lo, hi);
  else return pack_bf16(lo, hi);
}
// The 16 bits of x rounded to o's type (fp16 or bf16), for code that stages o untyped.
__device__ __forceinline__ uint16_t o_bits(float x, bool fp16) {
  if (fp16) return __half_as_ushort(__float2half(x));
  return __bfloat16_as_ushort(__float2bfloat16(x));
}

__device__ __forceinline__ float load_beta(const kdactl_kda_args& a, int64_t idx) {
  const float b = a.beta_dtype == KDACTL_DTYPE_BF16   ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.beta)[idx])
                  : a.beta_dtype == KDACTL_DTYPE_FP16 ? __half2float(static_cast<const __half*>(a.beta)[idx])
                                                      : static_cast<const float*>(a.beta)[idx];
  if (a.beta_mode == KDACTL_BETA_AS_GIVEN) return b;
  const float s = 1.f / (1.f + expf(-b));
  return a.beta_mode == KDACTL_BETA_SIGMOID2 ? 2.f * s : s;
}

// ---- fla's gates from raw g -------------------------------------------------------------------------
// log(1 + e^-y) for y >= 0 as 2 atanh(s), s = z / (2 + z) = 1 / (1 + 2^(y log2(e) + 1)) in (0, 1/3] with
// z = e^-y (one ex2 and one rcp; past y ~ 88 the ex2 is inf and s = 0, the limit), and 2 atanh(s) as
// s P(s^2), P the minimax cubic of 2 atanh(s) / s on s^2 in [0, 1/9] (relative error 1.8e-7 = 2^-22.4;
// `python3 tools/gate_poly.py` fits it). s carries z's relative error, so the result's stays near 2^-21
// however small z is (log(1 + z) itself would lose z's bits to the rounding of 1 + z, an absolute error
// that piles up over the tokens of a weakly decaying sequence).
__device__ __forceinline__ float log1p_exp_neg(float y) {
  const float s = rcp(1.f + ex2(fmaf(y, kLog2e, 1.f))), u = s * s;
  return s * fmaf(fmaf(fmaf(0.3422605f, u, 0.39589462f), u, 0.66676f), u, 1.9999996f);
}

// The gate of one head, its constants read once (a CTA or a lane keeps it for all its tokens):
// g as given, -A softplus(x) or lb sigmoid(A x), x = g + dt_bias[h, key], A = exp(A_log[h]).
// Relative error of a gate value, fast path against the exact function of the fp32 inputs (the
// error budget tests/test_kda_fused_gpu.py::test_gate_precision holds it to):
//   softplus:    2^-22 (ex2) + |x| 2^-24 (|x| log2 e + 1 rounded) + 2^-23 (rcp) + 2^-22.4 (the cubic)
//                + ~3 2^-24 (s^2, Horner's fma)                                             = 1.9e-6 at |x| = 20
//   lower bound: 2^-22 (ex2) + |A x| 3 2^-24 (x, -A log2 e and their product rounded) + 2^-23 (rcp)
//                + 2^-24 (1 + e^-y rounded)                                                = 4.0e-6 at |A x| = 20
// A relative error eps of every gate makes e^(G_t - G_s) off by a factor e^(eps |G_t - G_s|); weighted by
// e^-|G_t - G_s| itself, a term moves by at most eps/e (max of d e^-d) of its size: 1.5e-6, SPEC 5e-3.
struct Gate {
  int mode;
  float A, lower_bound;
  float neg_A_log2e, lower_bound_log2e;  // -A log2(e) and lb log2(e), for step
  __device__ __forceinline__ static Gate of(const kdactl_kda_args& a, int h) {
    const float A = a.A_log ? expf(a.A_log[h]) : 1.f;
    return {a.gate_mode, A, a.lower_bound, -A * kLog2e, a.lower_bound * kLog2e};
  }
  // dt_bias of (head, key): 0 without one, and for g given as the log decay (nothing read then).
  __device__ __forceinline__ static float bias(const kdactl_kda_args& a, int h, int key) {
    return a.gate_mode != KDACTL_GATE_AS_GIVEN && a.dt_bias ? a.dt_bias[static_cast<int64_t>(h) * a.key_dim + key] : 0.f;
  }
  // The two forms without the factor in front of them (-A, lb): softplus(x) and sigmoid(A x), x = g + bias,
  // e^(-A x) as one ex2 of x times -A log2(e) (e^-y = inf -> 0: the sigmoid's limit).
  __device__ __forceinline__ static float softplus_of(float g, float bias) {
    const float x = g + bias;
    return fmaxf(x, 0.f) + log1p_exp_neg(fabsf(x));
  }
  __device__ __forceinline__ float sigmoid_of(float g, float bias) const { return rcp(1.f + ex2((g + bias) * neg_A_log2e)); }
  // The log decay of raw g (bias: dt_bias of the key, from bias()), for a mode known at compile time:
  // a loop over many elements takes one instance per mode, with no other mode's math in it.
  template <int MODE>
  __device__ __forceinline__ float apply(float g, float bias) const {
    if constexpr (MODE == KDACTL_GATE_AS_GIVEN) return g;
    else if constexpr (MODE == KDACTL_GATE_SOFTPLUS) return -A * softplus_of(g, bias);
    else return lower_bound * sigmoid_of(g, bias);
  }
  // One step of a cumulative sum of gates in log2 units: run + log2(e) times the log decay of raw g,
  // for a mode known at compile time, or run + 0 for a token past the sequence's end (`in` false: no
  // decay there; the gate of g = 0 is not 0). The factor in front of each form, times log2(e), is the
  // step's fma multiplier: apply()'s roundings, with its last product and the sum in one fma.
  template <int MODE>
  __device__ __forceinline__ float step(float run, float g, float bias, bool in) const {
    if constexpr (MODE == KDACTL_GATE_AS_GIVEN) return fmaf(g, kLog2e, run);  // g past the end is staged as zero
    else if constexpr (MODE == KDACTL_GATE_SOFTPLUS) return fmaf(in ? neg_A_log2e : 0.f, softplus_of(g, bias), run);
    else return fmaf(in ? lower_bound_log2e : 0.f, sigmoid_of(g, bias), run);
  }
  __device__ __forceinline__ float operator()(float g, float bias) const {
    return mode == KDACTL_GATE_AS_GIVEN ? g
           : mode == KDACTL_GATE_SOFTPLUS ? apply<KDACTL_GATE_SOFTPLUS>(g, bias)
                                          : apply<KDACTL_GATE_LOWER_BOUND>(g, bias);
  }
  // Calls f(std::integral_constant-like tag) with this gate's mode as a compile-time value.
  template <typename F>
  __device__ __forceinline__ void with_mode(F&& f) const {
    if (mode == KDACTL_GATE_SOFTPLUS) f(Mode<KDACTL_GATE_SOFTPLUS>{});
    else if (mode == KDACTL_GATE_LOWER_BOUND) f(Mode<KDACTL_GATE_LOWER_BOUND>{});
    else f(Mode<KDACTL_GATE_AS_GIVEN>{});
  }
  template <int M>
  struct Mode {
    static constexpr int value = M;
  };
};

// Host: calls f(g element) with a value of the type the arguments name for g, so that a launcher
// instantiates its kernel for exactly the types of this call.
template <typename F>
inline void with_g_type(const kdactl_kda_args& a, F&& f) {
  if (a.g_dtype == KDACTL_DTYPE_BF16) f(__nv_bfloat16{});
  else if (a.g_dtype == KDACTL_DTYPE_FP16) f(__half{});
  else f(0.f);
}
// Host: the same for (g element, q/k/v element).
template <typename F>
inline void with_types(const kdactl_kda_args& a, F&& f) {
  with_g_type(a, [&](auto g) {
    if (a.qkv_fp16) f(g, __half{});
    else f(g, __nv_bfloat16{});
  });
}

constexpr float kL2NormEps = 1e-6f;  // fla's l2norm: x / sqrt(|x|^2 + eps)

__device__ __forceinline__ float warp_allreduce(float x) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) x += __shfl_xor_sync(0xffffffffu, x, mask);
  return x;
}

}  // namespace kdactl
