// nexar::Errc <-> std::error_code integration and stable code names.
#include <nexar/error.hpp>

#include <string>

namespace nexar {
namespace {

// One short sentence per code; to_string() gives the stable machine-readable name.
const char* describe(Errc e) noexcept {
  switch (e) {
    case Errc::ok: return "success";
    case Errc::invalid_argument: return "invalid argument or configuration value";
    case Errc::truncated: return "receive buffer smaller than the incoming message";
    case Errc::timeout: return "the operation's deadline passed";
    case Errc::peer_closed: return "the peer closed its communicator";
    case Errc::peer_failed: return "the connection to the peer broke";
    case Errc::protocol: return "the peer violated the nexar wire protocol";
    case Errc::tls: return "TLS handshake or certificate check failed";
    case Errc::unknown_rpc: return "the remote rank has no handler for this RPC id";
    case Errc::rpc_failed: return "the remote RPC handler threw";
    case Errc::closed: return "the local communicator was closed";
    case Errc::io: return "a local socket or system call failed";
    case Errc::cancelled: return "the operation was cancelled";
    case Errc::rejected: return "the seed refused to admit this node";
    case Errc::rank_failed: return "a member of the communicator failed";
    case Errc::revoked: return "the communicator was revoked";
  }
  return nullptr;
}

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "nexar"; }

  std::string message(int value) const override {
    const auto e = static_cast<Errc>(value);
    if (const char* text = describe(e)) {
      return std::string(to_string(e)) + ": " + text;
    }
    return "unknown nexar error " + std::to_string(value);
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  // Function-local static: one identity for the category across the process, which
  // std::error_code comparison relies on.
  static const Category category;
  return category;
}

const char* to_string(Errc e) noexcept {
  switch (e) {
    case Errc::ok: return "ok";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::truncated: return "truncated";
    case Errc::timeout: return "timeout";
    case Errc::peer_closed: return "peer_closed";
    case Errc::peer_failed: return "peer_failed";
    case Errc::protocol: return "protocol";
    case Errc::tls: return "tls";
    case Errc::unknown_rpc: return "unknown_rpc";
    case Errc::rpc_failed: return "rpc_failed";
    case Errc::closed: return "closed";
    case Errc::io: return "io";
    case Errc::cancelled: return "cancelled";
    case Errc::rejected: return "rejected";
    case Errc::rank_failed: return "rank_failed";
    case Errc::revoked: return "revoked";
  }
  // Values outside the enumeration (casts from the wire, for instance) still get a
  // printable name rather than a null pointer.
  return "unknown";
}

}  // namespace nexar
