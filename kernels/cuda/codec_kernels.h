// Host-only API of the CUDA gradient codecs: the twins of kernels/cpu/codec.h
// for every codec (none, fp16, bf16, int8, qsgd, onebit, topk, randomk).
// Nothing here needs nvcc: the only CUDA type is the opaque cudaStream_t. In
// a build without CUDA the same functions exist and return kUnsupported.
//
// Encode writes byte for byte what cpu::Encode writes for the same options,
// values and seed, NaN and infinities included: both share codec_math (the
// same fixed-order double sums, roundings and counter RNG), topk selects the
// same set (a stable radix sort by |x|, so ties go to the lower index), and
// randomk draws the same indices. Decode accepts and refuses exactly what
// cpu::Decode does and writes the same floats; when the device finds a
// payload bad, the payload is copied back and cpu::Decode's Status is
// returned, so messages match too.
//
// Device-pointer API contracts:
// - all pointers are device memory; they need no alignment;
// - scratch memory is taken with cudaMallocAsync on `stream` and freed the
//   same way (the device needs memory-pool support, CUDA 11.2+);
// - Encode is asynchronous, except that randomk draws its indices on the
//   host (Floyd's sampling is sequential) and copies them from pageable
//   memory, and n == 0 copies a <= 4-byte header the same way;
// - Decode synchronises `stream`: it must read the validation flag to return
//   a Status.
// Bad options, n > kMaxCodecValues and null pointers are kInvalidArgument
// here (not checks: this API also serves tools that take options as input).
//
// Thread safety: every function may be called from any thread; calls on one
// stream are ordered by the stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/codec.h"
#include "kernels/cuda/cuda_kernels.h"  // Available(), cudaStream_t

namespace gridsync::cuda {

// ---- Device-pointer API ----

// values: n floats; out: EncodedSize(options, n) bytes.
Status Encode(const CodecOptions& options, const float* values, size_t n, uint64_t seed,
              uint8_t* out, cudaStream_t stream);
// bytes: `size` bytes; out: n floats, all written (0 where nothing was sent).
Status Decode(const CodecOptions& options, const uint8_t* bytes, size_t size, size_t n,
              uint64_t seed, float* out, cudaStream_t stream);

// The checks both run first, in builds without CUDA too: the options
// (ValidateCodecOptions) and n <= kMaxCodecValues; kInvalidArgument naming
// what is wrong.
Status CheckCodecArguments(const CodecOptions& options, size_t n);

// ---- Host convenience: copy in, run on the default stream, copy out ----
// For tests and benchmarks; every call allocates and frees device memory.
namespace host {

// *out is resized to EncodedSize(options, values.size()).
Status Encode(const CodecOptions& options, const std::vector<float>& values, uint64_t seed,
              std::vector<uint8_t>* out);
// *out is resized to n.
Status Decode(const CodecOptions& options, const std::vector<uint8_t>& bytes, size_t n,
              uint64_t seed, std::vector<float>* out);

}  // namespace host
}  // namespace gridsync::cuda
