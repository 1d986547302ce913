// nexar — error reporting.
//
// Policy (see docs/ARCHITECTURE.md, "Errors"):
//  * Every failure of a nexar operation surfaces as one type, nexar::Error, whose code()
//    says what kind of failure it was and whose what() names the operation, the local
//    rank, the peer rank and address where there is one, and the time elapsed.
//  * Blocking calls throw nexar::Error. Non-blocking calls never throw after they were
//    accepted: the failure is stored in the Request and thrown by Request::wait(), or
//    returned by Request::error().
//  * Errors caused by the caller (Errc::invalid_argument, Errc::truncated,
//    Errc::unknown_rpc, Errc::rpc_failed, Errc::timeout) leave the communicator usable.
//    Errors caused by a peer (Errc::peer_closed, Errc::peer_failed, Errc::protocol,
//    Errc::tls) fail the operations that involve that peer; operations on other peers go on.
//    Errc::closed means the local communicator was closed.
//  * A member that fails (its process dies, its host goes silent for
//    Config::failure_timeout) is declared failed by whoever notices first, and every
//    member of every communicator containing it learns so. Those communicators are
//    revoked: their pending and later operations fail with Errc::rank_failed naming the
//    failed rank(s) in the communicator's own numbering, until the application shrinks
//    them (or the runtime does, under Config::on_failure = automatic).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>
#include <system_error>

namespace nexar {

/// Kinds of failure. Plugs into std::error_code through nexar::error_category().
enum class Errc : int {
  ok = 0,
  invalid_argument = 1,  ///< bad rank, size, tag, handler id or configuration value
  truncated = 2,         ///< receive buffer smaller than the incoming message
  timeout = 3,           ///< the operation's deadline passed
  peer_closed = 4,       ///< the peer closed its communicator in an orderly way
  peer_failed = 5,       ///< the peer's connection broke (idle timeout, reset, crash)
  protocol = 6,          ///< the peer sent bytes that violate the nexar wire protocol
  tls = 7,               ///< handshake or certificate check failed
  unknown_rpc = 8,       ///< the remote rank has no handler for the called id
  rpc_failed = 9,        ///< the remote handler threw; the message carries its text
  closed = 10,           ///< the local communicator was closed
  io = 11,               ///< a local socket or system call failed
  cancelled = 12,        ///< the operation was cancelled before it completed
  rejected = 13,         ///< the seed refused to admit this node (token, rank, world size)
  rank_failed = 14,      ///< a member of the communicator failed; the message names it
  revoked = 15,          ///< the application revoked the communicator (Communicator::revoke)
};

/// The std::error_category of nexar::Errc values.
const std::error_category& error_category() noexcept;

/// Makes nexar::Errc usable as std::error_code.
inline std::error_code make_error_code(Errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Short stable name of a code, e.g. "peer_failed".
const char* to_string(Errc e) noexcept;

/// The one exception type nexar throws.
///
/// what() reads like
///   "recv: rank 0, peer 3 (127.0.0.1:40211), after 1.204 s: peer_failed: idle timeout"
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// An error that also carries the ranks that failed (Errc::rank_failed).
  Error(Errc code, const std::string& message, std::vector<int> failed)
      : std::runtime_error(message),
        code_(code),
        failed_(std::make_shared<const std::vector<int>>(std::move(failed))) {}

  /// The kind of failure.
  Errc code() const noexcept { return code_; }

  /// For Errc::rank_failed thrown by a blocking call: the communicator's failed members, in
  /// its numbering as it was when the operation started, ascending. Empty otherwise.
  const std::vector<int>& failed_ranks() const noexcept {
    static const std::vector<int> none;
    return failed_ ? *failed_ : none;
  }

 private:
  Errc code_;
  std::shared_ptr<const std::vector<int>> failed_;
};

}  // namespace nexar

template <>
struct std::is_error_code_enum<nexar::Errc> : std::true_type {};
