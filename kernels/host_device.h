// GRIDSYNC_HOST_DEVICE marks functions compiled for both the CPU kernels and
// the CUDA kernels, so both twins share one definition of the maths.
//
// Thread safety: macros only.
#pragma once

#if defined(__CUDACC__)
#define GRIDSYNC_HOST_DEVICE __host__ __device__
#else
#define GRIDSYNC_HOST_DEVICE
#endif
