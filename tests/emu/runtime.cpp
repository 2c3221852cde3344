// The emulator's runtime (emu.h says what it models): fibers for a block's threads, barriers, warp
// collectives, launches, and the few CUDA runtime calls library.cu makes, answered for an emulated
// device of compute capability 9.0. Its SM count and shared memory per block (an H200's 132 and
// 227 KB unless told otherwise) are set per library copy through kdactl_emu_configure, since the
// kernels plan their grids and rings by them, with the order in which threads run between barriers.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "emu.h"

namespace emu {
namespace {

constexpr size_t kStackBytes = 256 << 10;
constexpr int kMaxThreads = 1024;
constexpr int kSmemDefault = 48 << 10;

// A cp.async not yet performed: its source is read when a wait covers its group.
struct AsyncCopy {
  void* dst;
  const void* src;
  int bytes;  // of 16; the rest is zero-filled
};

struct Fiber {
  ucontext_t ctx;
  Thread t;
  bool done = false;
  char* stack = nullptr;
  std::vector<AsyncCopy> open;                 // issued since the last commit
  std::deque<std::vector<AsyncCopy>> groups;  // committed, oldest first
};

// Threads wait here until `expected` of them have arrived; the last one releases them.
struct Barrier {
  int arrived = 0;
  std::vector<Fiber*> waiters;
};

struct Warp {
  int live = 0;
  unsigned gen = 0;  // collectives completed: lanes write slot gen % 2, so a lane that runs ahead
                     // into the next one never overwrites what a slower lane has yet to read
  int arrived = 0;
  WarpOp op[2] = {nullptr, nullptr};
  int arg[2] = {0, 0};
  unsigned mask[2] = {0, 0};
  LaneIO slots[2][32];
  std::vector<Fiber*> waiters;
};

struct Block {
  dim3 grid, block;
  Body* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier bars[16];
  int bar_expected[16] = {};
  int live = 0;
  std::vector<unsigned char> smem_store;  // dynamic shared memory, from its first 128-byte line
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  std::deque<Fiber*> ready;
  Fiber* current = nullptr;
  ucontext_t scheduler;
  std::string failure;
  std::string name;  // the kernel, for messages
  long idle_yields = 0;  // polls since a thread last met a barrier or collective or exited (yield_thread)
};

Block* g_block = nullptr;
cudaError_t g_last_error = cudaSuccess;
int g_sms = 132;
int g_smem_optin = 232448;  // shared memory per block with the attribute: the H200's 227 KB
// The order in which threads released together run on (kdactl_emu_configure): 0 by thread index,
// 1 reversed, n >= 2 shuffled from seed n, -1 by thread index with each warp running ahead (the lanes
// a warp collective releases run before any other thread, so a warp goes on alone up to a barrier
// of the block: what a GPU may do, and where warps that keep step at their collectives hide a race
// between them). A kernel whose threads synchronize as CUDA requires computes the same bits in every
// order; one that reads what another thread may not have written yet (or may already have
// overwritten) depends on it.
constexpr int kWarpAhead = -1;
int g_schedule = 0;
std::mt19937 g_shuffle;
std::vector<std::pair<const void*, int>> g_smem_attr;
std::vector<char*> g_stacks;

void release(std::vector<Fiber*>& waiters, bool self_too, bool warp = false);

void run_fiber() {
  Block& b = *g_block;
  b.body->run();
  Fiber* f = b.current;
  f->done = true;
  --b.live;
  b.idle_yields = 0;
  Warp& w = b.warps[f->t.warp];
  --w.live;
  // A thread that exits is expected at no barrier: complete those it was the last one missing from.
  if (b.bars[0].arrived > 0 && b.bars[0].arrived >= b.live) {
    b.bars[0].arrived = 0;
    release(b.bars[0].waiters, false);
  }
  if (w.arrived > 0 && w.arrived >= w.live) {
    const unsigned slot = w.gen % 2;
    w.op[slot](w.slots[slot], w.mask[slot], w.arg[slot]);
    w.arrived = 0, ++w.gen;
    release(w.waiters, false, true);
  }
  swapcontext(&f->ctx, &b.scheduler);
}

// The running thread waits: back to the scheduler until a barrier puts it on the ready list.
void block_here(std::vector<Fiber*>& waiters) {
  Block& b = *g_block;
  Fiber* f = b.current;
  waiters.push_back(f);
  swapcontext(&f->ctx, &b.scheduler);
}

// Puts the threads waiting at a completed barrier (and, with `self_too`, the running one, which then
// yields) on the ready list, in the schedule's order; a warp collective's lanes (`warp`) first of all
// under kWarpAhead.
void release(std::vector<Fiber*>& waiters, bool self_too, bool warp) {
  Block& b = *g_block;
  if (self_too) waiters.push_back(b.current);
  if (g_schedule >= 2) {
    std::shuffle(waiters.begin(), waiters.end(), g_shuffle);
  } else {
    std::sort(waiters.begin(), waiters.end(), [](const Fiber* x, const Fiber* y) {
      return g_schedule == 1 ? x->t.linear > y->t.linear : x->t.linear < y->t.linear;
    });
  }
  if (warp && g_schedule == kWarpAhead) b.ready.insert(b.ready.begin(), waiters.begin(), waiters.end());
  else b.ready.insert(b.ready.end(), waiters.begin(), waiters.end());
  waiters.clear();
  if (self_too) swapcontext(&b.current->ctx, &b.scheduler);
}

// Barrier `id` of `expected` threads; id 0 (__syncthreads) expects every thread that has not exited,
// however many exit while others wait (run_fiber completes it then). The last to arrive releases the
// others; the rest wait there, unless `wait` is false (bar.arrive: counted in, and on it goes).
void arrive(int id, int expected, bool wait = true) {
  Block& b = *g_block;
  b.idle_yields = 0;
  Barrier& bar = b.bars[id];
  if (id != 0) {
    if (bar.arrived > 0 && b.bar_expected[id] != expected) trap("threads name one barrier with two thread counts");
    b.bar_expected[id] = expected;
  }
  if (++bar.arrived >= (id == 0 ? b.live : expected)) {
    bar.arrived = 0;
    release(bar.waiters, true);
    return;
  }
  if (wait) block_here(bar.waiters);
}

char* stack_of(int i) {
  while (static_cast<int>(g_stacks.size()) <= i) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "emu: cannot map a fiber stack\n");
      abort();
    }
    g_stacks.push_back(static_cast<char*>(p));
  }
  return g_stacks[i];
}

// Runs one block to its end: a failure (a trap, a deadlock) leaves its message in b.failure.
unsigned g_block_serial = 0;

void run_block(Block& b, uint3 block_idx) {
  ++g_block_serial;
  const int n = static_cast<int>(b.block.x * b.block.y * b.block.z);
  b.fibers.assign(n, Fiber{});
  b.warps.assign((n + 31) / 32, Warp{});
  for (Barrier& bar : b.bars) bar = Barrier{};
  b.live = n;
  b.ready.clear();
  b.failure.clear();
  b.idle_yields = 0;
  if (b.smem_bytes) memset(b.smem, 0xff, b.smem_bytes);
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.t.thread_idx = {i % b.block.x, (i / b.block.x) % b.block.y, i / (b.block.x * b.block.y)};
    f.t.block_idx = block_idx;
    f.t.linear = i, f.t.warp = i / 32, f.t.lane = i % 32;
    ++b.warps[i / 32].live;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack_of(i);
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, run_fiber, 0);
  }
  std::vector<Fiber*> all;
  for (Fiber& f : b.fibers) all.push_back(&f);
  release(all, false);
  while (b.failure.empty() && !b.ready.empty()) {
    b.current = b.ready.front();
    b.ready.pop_front();
    swapcontext(&b.scheduler, &b.current->ctx);
  }
  if (b.failure.empty() && b.live > 0) {
    int at_bar = 0, at_warp = 0;
    for (const Barrier& bar : b.bars) at_bar += static_cast<int>(bar.waiters.size());
    for (const Warp& w : b.warps) at_warp += static_cast<int>(w.waiters.size());
    b.failure = "deadlock in kernel " + b.name + ", block (" + std::to_string(block_idx.x) + "," +
                std::to_string(block_idx.y) + "," + std::to_string(block_idx.z) + "): " + std::to_string(b.live) + " threads never finish (" + std::to_string(at_bar) +
                " wait at a block barrier, " + std::to_string(at_warp) + " at a warp collective)";
  }
}

// The kernel's name, demangled, for a message (its address where the symbol table has no name).
std::string name_of(const void* kernel) {
  Dl_info info{};
  if (dladdr(kernel, &info) && info.dli_sname) {
    int status = 0;
    char* plain = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && plain ? plain : info.dli_sname;
    free(plain);
    return name;
  }
  char buf[32];
  snprintf(buf, sizeof buf, "%p", kernel);
  return buf;
}

}  // namespace

const Thread& self() { return g_block->current->t; }
dim3 block_dim() { return g_block->block; }
dim3 grid_dim() { return g_block->grid; }
void* dynamic_smem() { return g_block->smem; }
unsigned block_serial() { return g_block_serial; }

void trap(const char* why) {
  Block& b = *g_block;
  const Thread& t = b.current->t;
  b.failure = std::string(why) + " in kernel " + b.name + ", thread (" + std::to_string(t.thread_idx.x) + "," + std::to_string(t.thread_idx.y) +
              "," + std::to_string(t.thread_idx.z) + ") of block (" + std::to_string(t.block_idx.x) + "," +
              std::to_string(t.block_idx.y) + "," + std::to_string(t.block_idx.z) + ")";
  swapcontext(&b.current->ctx, &b.scheduler);
  abort();  // the scheduler never resumes a trapped thread
}

void cp_async(void* dst, const void* src, int bytes) { g_block->current->open.push_back({dst, src, bytes}); }

void cp_async_commit() {
  Fiber& f = *g_block->current;
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void cp_async_wait(int newest_pending) {
  Fiber& f = *g_block->current;
  while (static_cast<int>(f.groups.size()) > newest_pending) {
    for (const AsyncCopy& c : f.groups.front()) {
      if (c.bytes > 0) memcpy(c.dst, c.src, c.bytes);
      memset(static_cast<char*>(c.dst) + c.bytes, 0, 16 - c.bytes);
    }
    f.groups.pop_front();
  }
}

void syncthreads() { arrive(0, 0); }

// A poll that finds nothing: the others run first. Polls with no thread meeting a barrier, a collective
// or its end in between would go on for ever: a flag nothing will set (what a GPU would hang on).
constexpr long kMaxIdleYields = 1L << 22;
void yield_thread() {
  Block& b = *g_block;
  if (++b.idle_yields > kMaxIdleYields) trap("polling a flag that no running thread sets");
  b.ready.push_back(b.current);
  swapcontext(&b.current->ctx, &b.scheduler);
}

void named_barrier(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32) trap("bar.sync: barrier id 1..15 and a multiple of 32 threads");
  arrive(id, threads);
}

void named_arrive(int id, int threads) {
  if (id <= 0 || id >= 16 || threads % 32) trap("bar.arrive: barrier id 1..15 and a multiple of 32 threads");
  arrive(id, threads, false);
}

void warp_collective(WarpOp op, int arg, unsigned mask, LaneIO& mine) {
  Block& b = *g_block;
  b.idle_yields = 0;
  Fiber* f = b.current;
  Warp& w = b.warps[f->t.warp];
  if (mask != 0xffffffffu) trap("a warp collective over part of a warp (the kernels use full masks)");
  const unsigned slot = w.gen % 2;
  if (w.arrived == 0) {
    w.op[slot] = op, w.arg[slot] = arg, w.mask[slot] = mask;
  } else if (w.op[slot] != op || w.arg[slot] != arg) {
    trap("lanes of one warp meet at different collectives");
  }
  w.slots[slot][f->t.lane] = mine;
  if (++w.arrived >= w.live) {
    op(w.slots[slot], mask, arg);
    w.arrived = 0, ++w.gen;
    release(w.waiters, true, true);
  } else {
    block_here(w.waiters);
  }
  memcpy(mine.out, w.slots[slot][f->t.lane].out, sizeof(mine.out));
}

// in[2] of each lane: its source lane (or xor mask) | width << 8. A lane reads a lane of its own
// width-wide segment; one outside it (or, for shfl_xor, past the segment) reads its own value.
void shfl_op(LaneIO (&lanes)[32], unsigned, int) {
  for (int l = 0; l < 32; ++l) {
    const int src = lanes[l].in[2] & 0xff, width = lanes[l].in[2] >> 8;
    memcpy(lanes[l].out, lanes[(l / width) * width + src % width].in, 8);
  }
}

void shfl_xor_op(LaneIO (&lanes)[32], unsigned, int) {
  for (int l = 0; l < 32; ++l) {
    const int from = l ^ (lanes[l].in[2] & 0xff), width = lanes[l].in[2] >> 8;
    memcpy(lanes[l].out, lanes[(from / width == l / width) ? from : l].in, 8);
  }
}

void vote_op(LaneIO (&lanes)[32], unsigned mask, int) {
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1) && lanes[l].in[0]) bits |= 1u << l;
  for (int l = 0; l < 32; ++l) lanes[l].out[0] = bits;
}

void nop_op(LaneIO (&)[32], unsigned, int) {}

void launch_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, Body& body) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  int allowed = kSmemDefault;
  for (const auto& [func, bytes] : g_smem_attr)
    if (func == kernel) allowed = bytes;
  cudaError_t err = cudaSuccess;
  if (threads == 0 || threads > kMaxThreads || block.z > 64) err = cudaErrorInvalidConfiguration;
  else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) err = cudaErrorInvalidConfiguration;
  else if (smem > static_cast<size_t>(allowed)) err = cudaErrorInvalidValue;
  if (err != cudaSuccess) {
    g_last_error = err;
    return;
  }
  Block b;
  b.grid = grid, b.block = block, b.body = &body, b.name = name_of(kernel);
  b.smem_store.assign(smem + 128, 0);
  b.smem = b.smem_store.data() + (128 - reinterpret_cast<uintptr_t>(b.smem_store.data()) % 128);
  b.smem_bytes = smem;
  Block* outer = g_block;
  g_block = &b;
  for (unsigned z = 0; z < grid.z && b.failure.empty(); ++z)
    for (unsigned y = 0; y < grid.y && b.failure.empty(); ++y)
      for (unsigned x = 0; x < grid.x && b.failure.empty(); ++x) run_block(b, {x, y, z});
  g_block = outer;
  if (!b.failure.empty()) {
    fprintf(stderr, "emu: kernel failed: %s\n", b.failure.c_str());
    g_last_error = cudaErrorLaunchFailure;
  }
}

}  // namespace emu

extern "C" void kdactl_emu_configure(int sms, int schedule, int smem_optin) {
  emu::g_sms = sms;
  emu::g_smem_optin = smem_optin;
  emu::g_schedule = schedule;
  emu::g_shuffle.seed(static_cast<unsigned>(schedule));
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::g_last_error;
  emu::g_last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "emulated CUDA error";
  }
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = emu::g_sms; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = emu::g_smem_optin; return cudaSuccess;
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > emu::g_smem_optin)
    return cudaErrorInvalidValue;
  for (auto& [f, bytes] : emu::g_smem_attr)
    if (f == func) {
      bytes = value;
      return cudaSuccess;
    }
  emu::g_smem_attr.emplace_back(func, value);
  return cudaSuccess;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t*, const cudaGraphNode_t**, const cudaGraphEdgeData**, size_t*) {
  *status = cudaStreamCaptureStatusNone;
  if (id) *id = 0;
  return cudaSuccess;
}
