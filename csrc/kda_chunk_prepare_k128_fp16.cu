// Route "chunk"'s prepare pass at K = 128 on fp16 q and k (kda_chunk_prepare.cuh).
#include "kda_chunk_prepare.cuh"

template int kdactl::chunk::launch_prepare_as<128, __half>(const kdactl_kda_args&, cudaStream_t);
