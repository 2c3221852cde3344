// A measurement, not a route (tools/overlap_probe.py builds and times it): does route small_bh's walk
// (kReduce) keep its pace while prepare CTAs share its SMs? The lead "Prepare ahead, then beside the walk"
// (docs/routes/small_bh.md, open leads) depends on it: kReduce's 2 CTAs an SM leave room for 4 one-warp
// prepare CTAs (shared memory 2 x 72 + 4 x 19.1 KB of 228 KB, registers 2 x 128 x 192 + 4 x 32 x 128, the
// whole 65,536).
//
// The route's two passes, launched apart so that the caller can put them on two streams:
//   kdactl_overlap_walk     kReduce as the route launches it, over the segments of a workspace that a whole
//                           small_bh call prepared (with at most KDACTL_SMALL_BH_MAX_UNSTITCHED segments, it
//                           reads that call's all_warm answer there; with more, its M slots return where
//                           every segment starts warm, and the stitch and the replay are not launched);
//   kdactl_overlap_prepare  the prepare over every (chunk slot, head) into a workspace, with as much dynamic
//                           shared memory as kdactl_overlap_prepare_smem last asked for (at least its own),
//                           so that the caller can cap how many of its CTAs share an SM when it runs alone.
// Both are kdactl's launcher signature (kdactl_kda_args, stream). Scope: fixed-length batches without a
// state pool, K = V = 128, bf16 q, k, v and g.
#include "kda_small_bh.cuh"

namespace {

using namespace kdactl::chunk;
using namespace kdactl::small_bh;

constexpr int K = 128, V = 128;
constexpr int kWalkWarps = kPlanned.warps, kWalkStages = kPlanned.stages;
using In = __nv_bfloat16;
using GT = __nv_bfloat16;
using Prep = PrepSmem<K, GT, In>;

int g_prepare_smem = 0;  // kdactl_overlap_prepare_smem's

bool in_scope(const kdactl_kda_args& a) {
  return !a.varlen && !a.state_indices && !a.checkpoints && a.key_dim == K && a.value_dim == V && !a.qkv_fp16 &&
         a.g_dtype == KDACTL_DTYPE_BF16 && a.segment_chunks > 0 && a.batch > 0 && a.seqlen > 0;
}

}  // namespace

// The dynamic shared memory the prepare launches with from now on (at least its own; 0: its own).
extern "C" void kdactl_overlap_prepare_smem(int bytes) { g_prepare_smem = bytes; }

// The byte offset in the workspace of small_bh's all_warm answer (nonzero: kReduce walks every segment),
// or -1 where the plan has more segments than that answer covers (kReduce then has an M slot a unit).
extern "C" int64_t kdactl_overlap_all_warm_at(const kdactl_kda_args* args) {
  kdactl_kda_args a = *args;
  a.workspace = nullptr;  // the layout from address 0: the answer's address is its offset
  if (!in_scope(a)) return -1;
  const Segments sg = segments_of<K, V>(a);
  return sg.all_warm ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(sg.all_warm)) : -1;
}

// The bytes at the workspace's start that the prepare writes: the blocks, then their bounds.
extern "C" uint64_t kdactl_overlap_prepared_bytes(const kdactl_kda_args* args) {
  return blocks_bytes<K>(*args) + bounds_bytes(*args);
}

extern "C" int kdactl_overlap_walk(const kdactl_kda_args* args, void* stream) {
  const kdactl_kda_args& a = *args;
  if (!in_scope(a) || a.workspace == nullptr || a.workspace_bytes < workspace_bytes<K, V>(a))
    return KDACTL_ERR_UNSUPPORTED;
  Segments sg = segments_of<K, V>(a);
  int64_t slots = unit_count(a);  // kReduce's grid z: a unit each where the all_warm answer decides
  if (sg.all_warm == nullptr) {   // else an E and an M slot a unit, and halves, as the route launches it
    int dev = 0, sms = 0;
    KDACTL_TRY(cudaGetDevice(&dev));
    KDACTL_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    sg.halves = reduce_in_halves<V>(a, slots, sms);
    slots *= 2;
  }
  auto kernel = sg.halves ? kda_chunk_recur<K, V, kWalkWarps, kWalkStages, Pass::kReduce, false, true>
                          : kda_chunk_recur<K, V, kWalkWarps, kWalkStages, Pass::kReduce, false, false>;
  const int smem = static_cast<int>(recur_smem<K, kWalkWarps, kWalkStages>());
  KDACTL_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  smem));
  const dim3 grid(V / (16 * kWalkWarps), a.heads, static_cast<unsigned>(slots));
  kernel<<<grid, kWalkWarps * 32, smem, static_cast<cudaStream_t>(stream)>>>(
      a, static_cast<const unsigned char*>(a.workspace), sg);
  return kdactl_launch_status();
}

extern "C" int kdactl_overlap_prepare(const kdactl_kda_args* args, void* stream) {
  const kdactl_kda_args& a = *args;
  const int64_t ctas = num_slots(a) * a.heads;
  if (!in_scope(a) || a.workspace == nullptr || a.workspace_bytes < blocks_bytes<K>(a) + bounds_bytes(a) ||
      ctas > 0x7fffffff)
    return KDACTL_ERR_UNSUPPORTED;
  auto kernel = kda_chunk_prepare<K, GT, In, true>;
  const int smem = g_prepare_smem > static_cast<int>(sizeof(Prep)) ? g_prepare_smem : static_cast<int>(sizeof(Prep));
  KDACTL_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  smem));
  kernel<<<static_cast<unsigned>(ctas), 32, smem, static_cast<cudaStream_t>(stream)>>>(
      a, static_cast<unsigned char*>(a.workspace));
  return kdactl_launch_status();
}
