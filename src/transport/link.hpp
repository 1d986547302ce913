// A link is one way the bytes of a pair's lanes travel between this rank and a peer: the
// pair's first QUIC connection (transport/quic_link.hpp), an extra QUIC connection
// (transport/stripes.hpp), a shared-memory segment (transport/shm_link.hpp) or a path
// through relays (transport/relay_link.hpp). The Peer sends every chunk on the link its
// routing rule picks (Peer::route) and reads every link's incoming streams with the same
// frame readers, so the frames and what they mean do not depend on the carrier.
//
// A link carries, for each lane it takes, one ordered byte stream each way. Going out, a
// chunk's completion runs once the peer holds its last byte (acknowledged, or written into
// memory the peer maps), or with the error that lost it. Coming in, the link hands its
// owner the bytes of each stream in order, and the owner says how many of them may be
// replaced at once: the rest are credited back later with consumed(). Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nexar/error.hpp>

#include "quic/connection.hpp"
#include "wire/frame.hpp"

namespace nexar::detail {

class Link;

/// What a link's incoming bytes reach (the Peer).
class LinkOwner {
 public:
  /// `len` bytes of the peer's stream `stream` (the link's own number for it) over `link`,
  /// in order. Returns the bytes whose credit goes back at once, or nothing when the stream
  /// broke the protocol or the peer is gone (the link then stops delivering).
  virtual std::optional<std::uint64_t> on_link_data(Link& link, std::uint64_t stream, const std::uint8_t* data,
                                                    std::size_t len) = 0;
  /// `link` ended by itself (not closed by its owner): what it held is lost. `code` says
  /// how, as a connection's end does (Errc::ok: an orderly close).
  virtual void on_link_closed(Link& link, Errc code, const std::string& why) = 0;

 protected:
  ~LinkOwner() = default;
};

class Link {
 public:
  virtual ~Link() = default;

  /// Queues `c` at the end of `lane`'s outgoing stream.
  virtual void push(wire::Lane lane, quic::Chunk c) = 0;
  /// `n` bytes of incoming stream `stream`, delivered earlier, were consumed: the peer may
  /// send that many more.
  virtual void consumed(std::uint64_t stream, std::uint64_t n) = 0;
  /// Bytes queued on this link and not yet held by the peer.
  virtual std::uint64_t unacked() const = 0;
  /// The peer is gone: every chunk this link still holds completes with `code`.
  virtual void fail(Errc code, const std::string& why) = 0;

  /// The lane incoming stream `stream` carries when the link fixes it; nothing when the
  /// stream starts with a preamble that names its lane (wire::encode_preamble).
  virtual std::optional<wire::Lane> stream_lane(std::uint64_t stream) const = 0;
  /// Whether the peer may send `lane` over this link (a stream for any other lane is a
  /// protocol error).
  virtual bool carries(wire::Lane lane) const noexcept = 0;
  /// Whether bytes on this link cross a socket: messages moving on it keep waiters from
  /// waking the engine thread for the replies (Engine::note_socket_messages).
  virtual bool on_socket() const noexcept = 0;
  /// Incoming stream `stream`, for error messages ("stream 6", "shared-memory lane data").
  virtual std::string describe(std::uint64_t stream) const = 0;

  /// What a poll did.
  struct Polled {
    bool moved = false;   // bytes went out or came in
    bool more = false;    // work is left that no event will announce: poll again soon
    std::string broken;   // the peer broke the carrier's protocol: why
  };
  /// Whether the link moves bytes only when polled (the node polls it on every turn of its
  /// engine and while user threads wait), rather than on its carrier's events.
  virtual bool polled() const noexcept { return false; }
  /// Moves what is waiting out, and hands what arrived to `owner`.
  virtual Polled poll(LinkOwner& /*owner*/) { return {}; }
};

}  // namespace nexar::detail
