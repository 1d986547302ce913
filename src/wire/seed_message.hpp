// Seed protocol v2: the messages a seed and a joining worker exchange over QUIC (ALPN
// "nexar-seed/1"), one unidirectional stream each way. Byte layout in docs/PROTOCOL.md,
// "Seed protocol". Every decoder checks every length before trusting it. (Version 2 added
// the relay keys to accept and announce; the header's version byte tells the versions apart.)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace nexar::wire {

inline constexpr const char* seed_alpn = "nexar-seed/1";
inline constexpr std::uint8_t seed_protocol_version = 2;
/// Fixed header in front of every seed message: "NXSD", version, type, 2 zero bytes,
/// body length (u32 LE).
inline constexpr std::size_t seed_header_size = 12;
/// Largest body a seed accepts from a joiner (a CSR and a few names).
inline constexpr std::uint32_t max_join_request = 64 * 1024;
/// Largest body a joiner accepts from a seed (certificates and one address per rank).
inline constexpr std::uint32_t max_seed_reply = 64 * 1024 * 1024;

using Proof = std::array<std::uint8_t, 32>;
/// The secret one pair of ranks shares to authenticate what they relay to each other
/// (docs/SECURITY.md, "Relays"); the same type as detail::RelayKey.
using RelayKey = std::array<std::uint8_t, 32>;

enum class SeedMsgType : std::uint8_t { hello = 1, join = 2, accept = 3, reject = 4, announce = 5 };

/// Seed -> joiner, first: the seed proves it knows the token and names the cluster.
struct SeedHello {
  Proof proof{};
  std::string cluster;
};

/// Joiner -> seed, after checking the hello.
struct JoinRequest {
  Proof proof{};
  std::int32_t rank = -1;     ///< requested rank, -1 = any
  std::int32_t world = 0;     ///< expected world size, 0 = no expectation
  std::string advertise;      ///< IP literal peers should dial; empty = as the seed sees us
  std::uint16_t port = 0;     ///< the joiner's data port
  std::string node;           ///< the joiner's node name (certificate common name)
  std::string host;           ///< host name, for messages
  std::string csr_pem;        ///< certificate request for `node` in the hello's cluster
};

struct Member {
  std::string node;
  std::string addr;  ///< "ip:port" / "[ip]:port"
  bool late = false;  ///< admitted after formation (it waits for a grow, or waited)
};

/// accept flags.
inline constexpr std::uint16_t accept_elastic = 0x1;  ///< the seed keeps admitting; stay linked
inline constexpr std::uint16_t accept_late = 0x2;     ///< joined a running job

/// Seed -> joiner, when the cluster formed, or (elastic) when a joiner of the running job
/// is admitted: then `rank` is its new world rank, the last of `members`.
struct JoinAccept {
  std::int32_t rank = 0;
  std::uint16_t flags = 0;
  std::string ca_pem;
  std::string cert_pem;
  std::vector<Member> members;  ///< indexed by world rank; every rank handed out so far
  /// One per member, indexed by world rank: the relay key this node shares with that rank.
  /// Its own entry (`rank`) is all zero. The encoder throws std::invalid_argument unless
  /// there is exactly one key per member.
  std::vector<RelayKey> keys;
};

/// Seed -> every node still linked (elastic): world rank `rank` was handed out to `member`.
/// Announcements come in rank order; each is made for the node it goes to, whose relay key
/// with the new rank it carries.
struct Announce {
  std::int32_t rank = 0;
  Member member;
  RelayKey key{};
};

/// Seed -> joiner, when it will not be admitted; `code` is a nexar::Errc value.
struct JoinReject {
  std::uint16_t code = 0;
  std::string reason;
};

using SeedMessage = std::variant<SeedHello, JoinRequest, JoinAccept, JoinReject, Announce>;

/// The fixed header of a message of `type` whose body is `body_size` bytes: what every
/// encode() below writes in front of the body. `body_size` is not checked against any limit.
std::array<std::uint8_t, seed_header_size> encode_seed_header(SeedMsgType type,
                                                              std::uint32_t body_size) noexcept;

std::vector<std::uint8_t> encode(const SeedHello& m);
std::vector<std::uint8_t> encode(const JoinRequest& m);
std::vector<std::uint8_t> encode(const JoinAccept& m);
std::vector<std::uint8_t> encode(const JoinReject& m);
std::vector<std::uint8_t> encode(const Announce& m);

/// Incremental decoder of one direction of a seed stream. Never buffers more than the
/// header's announced body, and refuses bodies over `limit` from the header alone.
class SeedMessageReader {
 public:
  explicit SeedMessageReader(std::uint32_t limit) : limit_(limit) {}

  /// Appends bytes and adds the messages they complete to `out`. Returns false on malformed
  /// input (error() says why); the stream is unusable afterwards.
  bool feed(const std::uint8_t* data, std::size_t len, std::vector<SeedMessage>& out);
  const std::string& error() const noexcept { return error_; }

 private:
  std::uint32_t limit_;
  std::vector<std::uint8_t> buf_;
  std::string error_;
};

/// Decodes one complete message (header + body). Returns std::nullopt and sets `error` on
/// malformed input. Exposed for tests and the fuzzer.
std::optional<SeedMessage> decode_seed_message(const std::uint8_t* data, std::size_t len,
                                               std::uint32_t limit, std::string& error);

}  // namespace nexar::wire
