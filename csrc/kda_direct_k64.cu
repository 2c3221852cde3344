// Route "direct"'s kernels at K = 64 (kda_direct_launch.cuh).
#include "kda_direct_launch.cuh"

template int kdactl::direct::launch_k<64>(const kdactl_kda_args&, int, cudaStream_t);
