// Route "chunk"'s prepare pass at K = 64 on bf16 q and k (kda_chunk_prepare.cuh).
#include "kda_chunk_prepare.cuh"

template int kdactl::chunk::launch_prepare_as<64, __nv_bfloat16>(const kdactl_kda_args&, cudaStream_t);
