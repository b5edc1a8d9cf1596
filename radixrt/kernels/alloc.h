// Output tensors of radixrt's CPU kernels, allocated without a trip through the dispatcher: at::empty is one
// more op per call (a microsecond or so, and one more profiler event), and a decoder layer's kernels
// allocate about ten outputs.
#pragma once
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>

namespace radixrt {

// A new uninitialized CPU tensor of `sizes` with `like`'s dtype (contiguous).
inline at::Tensor empty_like_dtype(at::IntArrayRef sizes, const at::Tensor& like) {
  return at::Tensor(at::detail::empty_cpu(sizes, like.scalar_type()));
}

}  // namespace radixrt
