// nexar — the library's way into the private parts of the public handle types.
//
// Communicator and Request are handles on internal objects (detail::CommunicatorImpl,
// detail::OpState) that the public headers only name. Their constructors from those objects, and the
// accessors that return them, are private to keep detail types out of the public API; this
// struct, a friend of both, is how the library (and tests of internals) reach them.
#pragma once

#include <memory>
#include <utility>

#include <nexar/communicator.hpp>
#include <nexar/request.hpp>

namespace nexar::detail {

struct Access {
  /// A Communicator over `impl` (null: an empty communicator).
  static Communicator make_communicator(std::shared_ptr<CommunicatorImpl> impl) {
    return impl ? Communicator(std::move(impl)) : Communicator();
  }
  /// The implementation behind a communicator handle (null for an empty one).
  static const std::shared_ptr<CommunicatorImpl>& impl(const Communicator& c) noexcept { return c.impl_; }

  /// A Request tracking `state` (null: a complete, successful request).
  static Request make_request(std::shared_ptr<OpState> state) { return Request(std::move(state)); }
  /// The operation a request tracks (null for a default-constructed one).
  static const std::shared_ptr<OpState>& state(const Request& r) noexcept { return r.state_; }
};

}  // namespace nexar::detail
