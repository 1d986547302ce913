// nexar — compressed all_reduce with error feedback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <nexar/dtype.hpp>

namespace nexar {

namespace detail {
struct ErrorFeedbackAccess;
}

/// Which elements a compressed all_reduce sends.
struct Compression {
  enum class Kind {
    top_k,     ///< each rank sends its k largest-magnitude elements (indices differ by rank)
    random_k,  ///< every rank sends the same k pseudo-random positions (seed + step)
  };
  Kind kind = Kind::top_k;
  /// k = ceil(ratio * count), at least 1; 0 < ratio <= 1.
  double ratio = 0.01;
  /// random_k: positions come from (seed, step), identical on every rank.
  std::uint64_t seed = 0;
};

/// The error-feedback state of one tensor: what a rank did not send at one step is added
/// to its input at the next, so over steps no gradient mass is lost. Use one object per
/// tensor and rank, and one operation at a time per object.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(Compression c = {}) : compression_(c) {}

  const Compression& compression() const noexcept { return compression_; }
  /// The residual carried into the next step (bytes of the tensor's element type).
  std::span<const std::byte> residual() const noexcept { return residual_; }
  /// Steps run so far.
  std::uint64_t steps() const noexcept { return step_; }
  /// Forgets the residual (e.g. after the tensor's shape or type changed).
  void reset() noexcept {
    residual_.clear();
    step_ = 0;
  }

  // The compressed all_reduce reads and updates the state; nothing else may.
 private:
  friend struct detail::ErrorFeedbackAccess;
  std::vector<std::byte> residual_;
  DataType dtype_ = DataType::f32;  ///< the residual's element type, while it holds any
  std::uint64_t step_ = 0;
  Compression compression_;
};

}  // namespace nexar
