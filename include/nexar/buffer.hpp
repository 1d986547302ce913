// nexar — buffer descriptors for gather lists and fused collectives.
#pragma once

#include <cstddef>

namespace nexar {

/// One piece of a gather list for Communicator::send_iov: `bytes` bytes at `data`.
struct ConstBuffer {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// One buffer of a fused (bucketed) collective: `count` elements at `data`.
struct MutableBuffer {
  void* data = nullptr;
  std::size_t count = 0;
};

}  // namespace nexar
