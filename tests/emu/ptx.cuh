// The emulator's csrc/ptx.cuh: the same functions, computed on the CPU (emu.h says how a warp's
// lanes meet). The tensor-core products (mma.sync and wgmma) take the fragment layouts of the PTX ISA
// (csrc/device.cuh lists them), read tf32 operands as their top 19 bits as the hardware does, and sum each product
// exactly in double before one rounding to fp32 (the hardware's sum of a k-step is at least that
// good to within its accumulator's rounding). ex and rcp are the exact functions with denormals
// flushed, as ex2.approx.ftz and rcp.approx.ftz do; the hardware's are within 2^-22 of them.
#pragma once
#include <stdint.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

namespace kdactl {

// ---- cp.async: performed at the wait that covers its group (emu.h) ------------------------------
inline void check_aligned16(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16) ::emu::trap(what);
}
inline void cp_async16(void* smem, const void* gmem) {
  check_aligned16(smem, "cp.async: shared address not 16-byte aligned");
  check_aligned16(gmem, "cp.async: global address not 16-byte aligned");
  ::emu::cp_async(smem, gmem, 16);
}
inline void cp_async16_zfill(void* smem, const void* gmem, int bytes) {
  check_aligned16(smem, "cp.async: shared address not 16-byte aligned");
  if (bytes < 0 || bytes > 16) ::emu::trap("cp.async: src-size outside 0..16");
  if (bytes > 0) check_aligned16(gmem, "cp.async: global address not 16-byte aligned");
  ::emu::cp_async(smem, gmem, bytes);
}
inline void cp_async_commit() { ::emu::cp_async_commit(); }
inline void cp_async_wait_all() { ::emu::cp_async_wait(0); }
template <int N>
inline void cp_async_wait() {
  ::emu::cp_async_wait(N);
}

template <int THREADS>
inline void sync_first() {
  ::emu::named_barrier(1, THREADS);
}
inline void named_sync(int id, int threads) { ::emu::named_barrier(id, threads); }
inline void named_arrive(int id, int threads) { ::emu::named_arrive(id, threads); }
inline void fence_gpu() {}  // one thread runs at a time: every write is seen at once
inline void fence_cta() {}
inline void spin_pause() { ::emu::yield_thread(); }

// ---- Tensor cores -------------------------------------------------------------------------------
namespace emu_ptx {
enum Operand { kTf32 = 0, kBf16 = 1, kF16 = 2 };

inline float tf32(uint32_t bits) { return __uint_as_float(bits & 0xffffe000u); }
inline float half16(uint32_t bits, int kind) {
  if (kind == kBf16) return __uint_as_float(bits << 16);
  __half h;
  const uint16_t b = static_cast<uint16_t>(bits);
  memcpy(&h, &b, 2);
  return __half2float(h);
}

// lanes[l].in: a0..a3, b0, b1, c0..c3 (as bits). D = A B + C, out: d0..d3.
inline void mma_op(::emu::LaneIO (&lanes)[32], unsigned, int kind) {
  const int K = kind == kTf32 ? 8 : 16;
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* in = lanes[l].in;
    if (kind == kTf32) {
      A[g][t] = tf32(in[0]), A[g + 8][t] = tf32(in[1]), A[g][t + 4] = tf32(in[2]), A[g + 8][t + 4] = tf32(in[3]);
      B[t][g] = tf32(in[4]), B[t + 4][g] = tf32(in[5]);
    } else {
      const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
      for (int r = 0; r < 4; ++r) {
        A[rows[r]][cols[r]] = half16(in[r] & 0xffffu, kind);
        A[rows[r]][cols[r] + 1] = half16(in[r] >> 16, kind);
      }
      B[2 * t][g] = half16(in[4] & 0xffffu, kind), B[2 * t + 1][g] = half16(in[4] >> 16, kind);
      B[2 * t + 8][g] = half16(in[5] & 0xffffu, kind), B[2 * t + 9][g] = half16(in[5] >> 16, kind);
    }
    C[g][2 * t] = __uint_as_float(in[6]), C[g][2 * t + 1] = __uint_as_float(in[7]);
    C[g + 8][2 * t] = __uint_as_float(in[8]), C[g + 8][2 * t + 1] = __uint_as_float(in[9]);
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int r = 0; r < 4; ++r) {
      double s = C[rows[r]][cols[r]];
      for (int k = 0; k < K; ++k) s += static_cast<double>(A[rows[r]][k]) * B[k][cols[r]];
      const float d = static_cast<float>(s);
      lanes[l].out[r] = __float_as_uint(d);
    }
  }
}

inline void mma(int kind, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::emu::LaneIO io{};
  for (int i = 0; i < 4; ++i) io.in[i] = a[i], io.in[6 + i] = __float_as_uint(d[i]);
  io.in[4] = b0, io.in[5] = b1;
  ::emu::warp_collective(mma_op, kind, 0xffffffffu, io);
  for (int i = 0; i < 4; ++i) d[i] = __uint_as_float(io.out[i]);
}

// lanes[l].ptr: the row address lane l gives (matrix l / 8, row l % 8). out: one 32-bit piece of
// each of the four matrices, plain (row g, cols 2t, 2t+1) or transposed (rows 2t, 2t+1, col g).
inline void ldmatrix_op(::emu::LaneIO (&lanes)[32], unsigned, int trans) {
  for (int l = 0; l < 32; ++l)
    if (reinterpret_cast<uintptr_t>(lanes[l].ptr) % 16) ::emu::trap("ldmatrix: row address not 16-byte aligned");
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 4; ++j) {
      uint32_t word;
      if (!trans) {
        memcpy(&word, static_cast<const char*>(lanes[8 * j + g].ptr) + 4 * t, 4);
      } else {
        uint16_t lo, hi;
        memcpy(&lo, static_cast<const char*>(lanes[8 * j + 2 * t].ptr) + 2 * g, 2);
        memcpy(&hi, static_cast<const char*>(lanes[8 * j + 2 * t + 1].ptr) + 2 * g, 2);
        word = lo | static_cast<uint32_t>(hi) << 16;
      }
      lanes[l].out[j] = word;
    }
  }
}

inline void ldmatrix(uint32_t (&r)[4], const void* row, int trans) {
  ::emu::LaneIO io{};
  io.ptr = row;
  ::emu::warp_collective(ldmatrix_op, trans, 0xffffffffu, io);
  for (int i = 0; i < 4; ++i) r[i] = io.out[i];
}

inline float flush(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.f, x) : x; }
}  // namespace emu_ptx

inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu_ptx::mma(emu_ptx::kTf32, d, a, b0, b1);
}
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu_ptx::mma(emu_ptx::kBf16, d, a, b0, b1);
}
inline void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu_ptx::mma(emu_ptx::kF16, d, a, b0, b1);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) { emu_ptx::ldmatrix(r, smem_row, 0); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) { emu_ptx::ldmatrix(r, smem_row, 1); }

// ---- Warpgroup MMA (csrc/ptx.cuh's sm_90a section) -------------------------------------------------
// A product is performed only at the wgmma.wait_group that covers its group, as the hardware may run it
// any time before: it then reads its B operand from shared memory and writes D through the registers
// it was given, so a stage overwritten before the wait, or D read before it, shows. Each thread queues
// its part (its A fragment and where its D lives); at a wait the warpgroup meets on a named barrier
// (ids 14 and 15, which the kernels leave free) and its first thread performs the products of all 128.
// A descriptor holds its address relative to the dynamic shared memory, where the kernels' operands are.
#define KDACTL_WGMMA 1
namespace emu_wgmma {
struct Op {
  float* d;
  int n;  // the product's N: d holds n / 2 floats a thread
  uint32_t a[4];
  uint64_t desc;
  bool n_major;
};
struct Queue {
  unsigned block = 0;  // emu::block_serial() of the block whose thread queued these
  std::vector<Op> open;
  std::deque<std::vector<Op>> groups;
};
inline Queue* queues() {
  static Queue q[1024];
  return q;
}
inline Queue& of(int linear) {
  Queue& q = queues()[linear];
  if (q.block != ::emu::block_serial()) q = Queue{::emu::block_serial(), {}, {}};  // left by an earlier block
  return q;
}
inline Queue& mine() { return of(::emu::self().linear); }

// B[k][n] of a descriptor: K-major core matrices (8 rows of N, 16 bytes of K each) or N-major (8 rows
// of K, 16 bytes of N each), k_stride (LBO) apart along K and n_stride (SBO) along N.
inline float b_at(uint64_t desc, bool n_major, int k, int n) {
  const char* base = static_cast<const char*>(::emu::dynamic_smem());
  const uint64_t addr = (desc & 0x3fffu) << 4, k_stride = (desc >> 16 & 0x3fffu) << 4, n_stride = (desc >> 32 & 0x3fffu) << 4;
  const uint64_t off = n_major ? addr + (k / 8) * k_stride + (n / 8) * n_stride + (k % 8) * 16 + (n % 8) * 2
                               : addr + (k / 8) * k_stride + (n / 8) * n_stride + (n % 8) * 16 + (k % 8) * 2;
  uint16_t bits;
  memcpy(&bits, base + off, 2);
  return emu_ptx::half16(bits, emu_ptx::kBf16);
}

// Op i of the warpgroup's oldest group, over its 128 threads (`ops`, by thread in the warpgroup).
inline void perform(Op* const* ops) {
  const Op& first = *ops[0];
  for (int th = 1; th < 128; ++th)
    if (ops[th]->n != first.n || ops[th]->desc != first.desc || ops[th]->n_major != first.n_major)
      ::emu::trap("wgmma: the warpgroup's threads issued different products");
  float A[64][16];
  for (int th = 0; th < 128; ++th) {
    const int r = 16 * (th / 32) + (th % 32) / 4, c = 2 * (th % 4);
    const int rows[4] = {r, r + 8, r, r + 8}, cols[4] = {c, c, c + 8, c + 8};
    for (int i = 0; i < 4; ++i) {
      A[rows[i]][cols[i]] = emu_ptx::half16(ops[th]->a[i] & 0xffffu, emu_ptx::kBf16);
      A[rows[i]][cols[i] + 1] = emu_ptx::half16(ops[th]->a[i] >> 16, emu_ptx::kBf16);
    }
  }
  std::vector<float> B(16 * first.n);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < first.n; ++n) B[k * first.n + n] = b_at(first.desc, first.n_major, k, n);
  for (int th = 0; th < 128; ++th) {
    const int r = 16 * (th / 32) + (th % 32) / 4, c = 2 * (th % 4);
    for (int j = 0; j < first.n / 8; ++j)
      for (int i = 0; i < 4; ++i) {
        const int row = r + 8 * (i >> 1), col = 8 * j + c + (i & 1);
        float& d = ops[th]->d[4 * j + i];
        double sum = d;
        for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k * first.n + col];
        d = static_cast<float>(sum);
      }
  }
}

inline void issue(float* d, int n, const uint32_t (&a)[4], uint64_t desc, bool n_major) {
  if (::emu::block_dim().x % 128) ::emu::trap("wgmma: the block is not whole warpgroups");
  Op op{d, n, {a[0], a[1], a[2], a[3]}, desc, n_major};
  mine().open.push_back(op);
}

inline void wait(int newest_pending) {
  const int wg = ::emu::self().linear / 128, first = 128 * wg;
  ::emu::named_barrier(14 + wg, 128);
  if (::emu::self().linear == first) {
    Queue* q = queues() + first;
    for (int th = 0; th < 128; ++th) of(first + th);
    for (int th = 1; th < 128; ++th)
      if (q[th].groups.size() != q[0].groups.size()) ::emu::trap("wgmma: the warpgroup's threads committed different groups");
    while (static_cast<int>(q[0].groups.size()) > newest_pending) {
      for (size_t i = 0; i < q[0].groups.front().size(); ++i) {
        Op* ops[128];
        for (int th = 0; th < 128; ++th) {
          if (q[th].groups.front().size() != q[0].groups.front().size()) ::emu::trap("wgmma: groups of different sizes");
          ops[th] = &q[th].groups.front()[i];
        }
        perform(ops);
      }
      for (int th = 0; th < 128; ++th) q[th].groups.pop_front();
    }
  }
  ::emu::named_barrier(14 + wg, 128);
}
}  // namespace emu_wgmma

inline uint64_t wgmma_desc(const void* smem, uint32_t k_stride, uint32_t n_stride) {
  const uintptr_t off = static_cast<const char*>(smem) - static_cast<const char*>(::emu::dynamic_smem());
  if (off % 16 || off >> 18 || k_stride % 16 || n_stride % 16 || k_stride >> 18 || n_stride >> 18)
    ::emu::trap("wgmma: a descriptor's address or strides outside its fields");
  return static_cast<uint64_t>(off >> 4) | static_cast<uint64_t>(k_stride >> 4) << 16 |
         static_cast<uint64_t>(n_stride >> 4) << 32;
}
inline void fence_proxy_async() {}
template <int N>
inline void setmaxnreg_inc() {}  // registers: the host's
template <int N>
inline void setmaxnreg_dec() {}
inline void wgmma_fence() {}
inline void wgmma_commit() {
  emu_wgmma::Queue& q = emu_wgmma::mine();
  q.groups.push_back(std::move(q.open));
  q.open.clear();
}
template <int N>
inline void wgmma_wait() {
  emu_wgmma::wait(N);
}
template <typename T, int N>
inline void wgmma_hold(T (&)[N][4]) {}
inline void wgmma_n16(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc_b) { emu_wgmma::issue(&d[0][0], 16, a, desc_b, false); }
inline void wgmma_n64_tb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) { emu_wgmma::issue(&d[0][0], 64, a, desc_b, true); }
inline void wgmma_n128_tb(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b) {
  emu_wgmma::issue(&d[0][0], 128, a, desc_b, true);
}

// ---- MUFU ---------------------------------------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;
inline float ex2(float x) { return emu_ptx::flush(exp2f(emu_ptx::flush(x))); }
inline float ex(float x) { return ex2(x * kLog2e); }
inline float rcp(float x) { return emu_ptx::flush(1.f / emu_ptx::flush(x)); }

}  // namespace kdactl
