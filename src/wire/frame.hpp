// Wire format v2: stream preambles and frame headers. Byte layout in docs/PROTOCOL.md.
// Every decoder checks every length before trusting it; nothing here allocates.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace nexar::wire {

inline constexpr std::uint8_t protocol_version = 2;
inline constexpr std::array<std::byte, 4> magic = {std::byte{'N'}, std::byte{'X'},
                                                   std::byte{'A'}, std::byte{'R'}};

/// The independent lanes of a peer connection; one QUIC unidirectional stream each way.
enum class Lane : std::uint8_t {
  control = 0,       ///< hello, goodbye, heartbeats, failure notices, revoke, agreement
  data = 1,          ///< point-to-point send/recv
  rpc_request = 2,   ///< RPC calls
  rpc_response = 3,  ///< RPC replies
  bulk = 4,          ///< large messages (bulk_send/bulk_recv)
  collective = 5,    ///< collectives' messages
};
inline constexpr int lane_count = 6;

/// ALPN protocol ids between members: a pair's first connection, and its extra ones
/// (Config::connections_per_peer). The dialler says which it means in its handshake, so the
/// acceptor never mistakes one for the other.
inline constexpr const char* mesh_alpn = "nexar/1";
inline constexpr const char* extra_alpn = "nexar-extra/1";

/// First 8 bytes of every stream: "NXAR", version, lane, two zero bytes.
inline constexpr std::size_t preamble_size = 8;

enum class FrameType : std::uint8_t {
  hello = 1,         ///< control: sender's rank and world size; payload = node name
  goodbye = 2,       ///< control: orderly close; no payload
  // The message frames travel on the three message lanes: data, bulk and collective.
  eager = 3,         ///< message lanes: a whole message; payload = message bytes
  rts = 4,           ///< message lanes: ready-to-send `length` bytes, id `seq`; no payload
  cts = 5,           ///< message lanes (reverse direction): clear-to-send message `seq`; no payload
  rdata = 6,         ///< message lanes: the bytes of rendezvous message `seq`; payload = message
  rpc_request = 7,   ///< rpc_request: call `seq` of function `tag`; payload = arguments
  rpc_response = 8,  ///< rpc_response: reply to call `seq`; flags = RpcStatus; payload = reply
  // Failure handling, all on the control lane (docs/PROTOCOL.md, "Failures").
  heartbeat = 9,     ///< control: proof of life while the link is otherwise quiet; no payload
  failed = 10,       ///< control: world rank `tag` is declared failed; payload = reason (text)
  revoke = 11,       ///< control: communicator `comm` is revoked; payload: why, if said (text)
  agree = 12,        ///< control: contribution to agreement `seq` of `comm`; payload = Ballot
  decided = 13,      ///< control: the decision of agreement `seq` of `comm`; payload = Ballot
  // Membership (docs/PROTOCOL.md, "Membership").
  welcome = 14,      ///< control: member -> admitted joiner: communicator `comm` was grown by
                     ///< agreement `seq`; payload = its members (encode_members)
  // Shared memory between ranks of one host (docs/PROTOCOL.md, "Shared memory").
  shm_offer = 15,    ///< control: attach to my shared memory; payload = host key, '\n', socket name
  shm_switch = 16,   ///< message lanes: what follows on this lane comes through shared memory
  // Relaying between ranks that are not neighbours (docs/PROTOCOL.md, "Relay").
  relay = 17,        ///< any lane: bytes of the lane's stream from rank `src` to relay_dest(comm),
                     ///< at stream offset `seq`; payload = those bytes, then a relay_mac_size MAC
  relay_ack = 18,    ///< control: rank `src` holds bytes below `seq` of lane relay_lane(comm)
                     ///< from relay_dest(comm), which may send below `tag`; payload = a MAC
  // Several engine threads (docs/PROTOCOL.md, "Extra connections").
  ports = 19,        ///< control: where to dial my shards; payload = their UDP ports, 2 bytes each
  // The TCP link (docs/PROTOCOL.md, "The TCP link").
  tcp_offer = 20,    ///< control: dial my TCP port `tag` for the message lanes, protected as
                     ///< `seq` says (cipher_code: 0 tls, 1 none); `tag` 0: no TCP link from me; no payload
  tcp_switch = 21,   ///< message lanes: what follows on this lane comes through the TCP link
};

/// Largest payload of a relay frame: relays store and forward whole segments, so this
/// bounds what one segment costs each hop.
inline constexpr std::uint64_t max_relay_segment = 64 * 1024;
/// Bytes of the MAC that ends every relay and relay_ack payload.
inline constexpr std::uint64_t relay_mac_size = 16;

/// The `comm` field of relay and relay_ack frames: the destination's world rank (bits
/// 0-31), hops taken so far (bits 32-39) and, in relay_ack, the lane acknowledged (bits
/// 40-47).
constexpr std::uint64_t relay_route(std::uint32_t dest, unsigned hops, Lane lane = Lane::control) noexcept {
  return dest | (std::uint64_t{hops & 0xffu} << 32) | (std::uint64_t{static_cast<std::uint8_t>(lane)} << 40);
}
constexpr std::uint32_t relay_dest(std::uint64_t comm) noexcept { return static_cast<std::uint32_t>(comm); }
constexpr unsigned relay_hops(std::uint64_t comm) noexcept { return static_cast<unsigned>((comm >> 32) & 0xffu); }
constexpr std::uint8_t relay_lane(std::uint64_t comm) noexcept { return static_cast<std::uint8_t>(comm >> 40); }

/// Largest payload of a shm_offer frame.
inline constexpr std::uint64_t max_shm_offer_payload = 512;
/// Largest payload of a ports frame: a rank has at most 15 shards (Config::engine_threads).
inline constexpr std::uint64_t max_ports_payload = 30;

/// World ranks an elastic job may ever number (members, joiners, replacements): the
/// membership service stops admitting beyond it.
inline constexpr std::uint32_t max_node_ids = 1u << 16;

/// Largest payload of an agree, decided or welcome frame: a ballot whose lists name 2^18
/// ranks in all (a member list needs less).
inline constexpr std::uint64_t max_ballot_payload = 20 + 4 * (std::uint64_t{1} << 18);

/// flags of an rdata frame.
inline constexpr std::uint8_t flag_cancelled = 0x01;  ///< sender cancelled; payload empty

/// flags of an rpc_response frame.
enum class RpcStatus : std::uint8_t { ok = 0, unknown_id = 1, handler_failed = 2 };

/// Fixed 40-byte header in front of every frame, little-endian.
struct FrameHeader {
  FrameType type = FrameType::eager;
  std::uint8_t flags = 0;
  /// eager and rts: the fingerprint of the collective call the message belongs to
  /// (wire/call_check.hpp), which the receiver compares with its own; 0 for any other
  /// message, and in every other frame type.
  std::uint16_t check = 0;
  std::uint32_t src = 0;      ///< sender's rank in the world of the connection
  std::uint64_t comm = 0;     ///< communicator id (0 = world)
  std::uint64_t tag = 0;      ///< message tag, or RPC function id
  std::uint64_t seq = 0;      ///< rendezvous message id or RPC call id
  std::uint64_t length = 0;   ///< payload bytes that follow (for rts: the announced size)
};
inline constexpr std::size_t header_size = 40;
/// The longest reason a revoke frame carries (two collective calls and their ranks).
inline constexpr std::size_t max_revoke_payload = 1024;

/// The name of a frame type as the protocol documentation and error messages spell it
/// ("eager", "rpc_response"); "unknown" for a value outside the enum.
const char* to_string(FrameType t) noexcept;

/// The name of a lane ("control", "bulk"); "unknown" for a value outside the enum.
const char* to_string(Lane l) noexcept;

/// Writes the preamble of a stream for `lane` into `out`.
void encode_preamble(Lane lane, std::span<std::byte, preamble_size> out) noexcept;

/// Writes `h` into `out`.
void encode_header(const FrameHeader& h, std::span<std::byte, header_size> out) noexcept;

/// Result of decoding; `error` is empty on success and names the offending field otherwise.
struct DecodeError {
  std::string error;
  explicit operator bool() const noexcept { return !error.empty(); }
};

/// Decodes a preamble. Fails on wrong magic, unsupported version, unknown lane,
/// non-zero reserved bytes.
DecodeError decode_preamble(std::span<const std::byte, preamble_size> in, Lane& lane);

/// Decodes a header and checks it: known type, reserved bytes zero, `length` <=
/// `max_payload` for types that carry a payload, and zero for types that do not (goodbye,
/// cts; and rdata with flag_cancelled), flags valid for the type, and the type allowed on
/// `lane` (see FrameType comments; cts travels on the lane of the message it answers).
DecodeError decode_header(std::span<const std::byte, header_size> in, Lane lane,
                          std::uint64_t max_payload, FrameHeader& h);

/// True when frames of this type carry `length` payload bytes after the header.
bool has_payload(const FrameHeader& h) noexcept;
bool has_payload(FrameType type, std::uint8_t flags) noexcept;

/// Incremental reader of one received stream: preamble, then header, payload, header, ...
/// It never buffers payload: payload bytes are handed to the handler as they arrive, so
/// the caller can land them straight in their destination.
///
/// Handler must provide:
///   bool on_preamble(Lane lane);                       // false: stop, error
///   bool on_header(const FrameHeader& h);              // false: stop, error
///   void on_payload(std::span<const std::byte> chunk); // part of the current payload
///   bool on_frame_end(const FrameHeader& h);           // false: stop, error
/// A frame with no payload gets on_header then on_frame_end.
class FrameReader {
 public:
  explicit FrameReader(std::uint64_t max_payload) noexcept : max_payload_(max_payload) {}

  /// Consumes all of `in`, calling the handler. Returns an empty DecodeError, or the
  /// reason the stream is invalid (malformed bytes, or a handler returned false); after
  /// an error the reader stays failed and consumes nothing more.
  template <class Handler>
  DecodeError feed(std::span<const std::byte> in, Handler& handler);

  /// True between frames (no partial header or payload pending).
  bool at_boundary() const noexcept {
    return state_ == State::header && have_ == 0;
  }
  /// The lane from the preamble (valid after it was read).
  Lane lane() const noexcept { return lane_; }
  /// For a byte stream whose lane is known without a preamble (a shared-memory ring):
  /// the next bytes are a frame header. Call before the first feed().
  void start_without_preamble(Lane lane) noexcept {
    lane_ = lane;
    state_ = State::header;
  }

 private:
  enum class State { preamble, header, payload, failed };
  std::uint64_t max_payload_;
  State state_ = State::preamble;
  Lane lane_ = Lane::control;
  std::array<std::byte, header_size> buf_{};
  std::size_t have_ = 0;
  FrameHeader cur_{};
  std::uint64_t remaining_ = 0;
};

}  // namespace nexar::wire

#include "wire/frame_reader_impl.hpp"
