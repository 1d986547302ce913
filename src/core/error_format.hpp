// Internal: the one format of nexar::Error messages, shared by every layer.
//
//   "<op>: rank <r>, peer <p> (<addr>), after <s.mmm> s: <code>: <detail>"
//
// Parts that are unknown are left out: the rank when rank < 0, the peer when peer < 0,
// the address when empty, the elapsed time when start is the default (epoch) time point,
// the op when empty, and ": <detail>" when detail is empty. With peer < 0 but an address,
// the peer reads "peer at <addr>" (a peer dialled before its rank is known).
#pragma once

#include <nexar/error.hpp>

#include <chrono>
#include <string>
#include <string_view>

namespace nexar::detail {

/// Where and when a failure happened. Views must outlive the make_error() call only.
struct ErrorContext {
  std::string_view op;                            ///< e.g. "recv", "connect", "rpc call"
  int rank = -1;                                  ///< local rank; < 0 when not known
  int peer = -1;                                  ///< peer rank; < 0 when none
  std::string_view peer_addr;                     ///< "ip:port"; empty when unknown
  std::chrono::steady_clock::time_point start{};  ///< when the op began; default = unknown
};

/// The message make_error() would give the Error (for Requests that store text).
std::string format_error(Errc code, const ErrorContext& ctx, std::string_view detail);

/// An Error with `code` whose what() follows the format above.
Error make_error(Errc code, const ErrorContext& ctx, std::string_view detail);

}  // namespace nexar::detail
