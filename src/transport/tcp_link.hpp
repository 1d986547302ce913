// The TCP link with one peer on another host (Config::link = tcp; docs/ARCHITECTURE.md,
// "The TCP link"): one TCP connection per message lane (data, bulk, collective), each
// attached by transport/tcp_attach.hpp and protected by TLS unless the user said the
// fabric is trusted. A lane switches to it in each direction separately, as onto shared
// memory: the sender puts a tcp_switch frame on the lane's QUIC stream, then writes the
// lane's later frames on its connection; the receiver reads that connection only after the
// frame, so the lane keeps its order across the switch. Separate connections keep a bulk
// transfer from queueing in front of a collective, in the kernel as on the wire; the bulk
// connection's unsent bytes are also capped (TCP_NOTSENT_LOWAT).
//
// A chunk completes once its last byte is in the kernel's send buffer, or with TLS in a
// record GnuTLS holds on its way there (as Gloo's and MPI's sends complete): the kernel
// acknowledges and retransmits from there, and should the peer die first, the connection's
// reset or end fails the pair. unacked() still counts the
// bytes the kernel holds unacknowledged, so an orderly close waits for them. Engine thread.
#pragma once

#include <asio/posix/stream_descriptor.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "transport/link.hpp"
#include "transport/tcp_attach.hpp"

namespace nexar::detail {

class TcpLink final : public Link {
 public:
  /// Hands incoming bytes and the end of a connection to `owner`; holds back reading a
  /// connection while `window` bytes it delivered were not consumed yet (the TCP window
  /// then pushes back on the peer, as a QUIC stream's credit does).
  TcpLink(Engine& engine, LinkOwner& owner, std::uint64_t window);
  ~TcpLink() override;
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  /// The lane's connection index (0 .. kLanes-1), or -1 for lanes that stay on QUIC.
  static int index(wire::Lane lane) noexcept;
  static constexpr int kLanes = 3;

  /// A connection for `a.lane` attached; false if that lane has one already (`a` closes).
  bool add(TcpAttached a);
  bool has(wire::Lane lane) const noexcept {
    const int i = index(lane);
    return i >= 0 && conns_[i] != nullptr;
  }
  /// Frames of `lane` go on its connection from now on (it must have one: has()).
  void start_sending(wire::Lane lane) noexcept;
  bool sending(wire::Lane lane) const noexcept {
    const int i = index(lane);
    return i >= 0 && conns_[i] && conns_[i]->sending;
  }
  /// The peer switched `lane`: read its connection from now on (once it is attached).
  void start_reading(wire::Lane lane);
  /// Lanes on this link, in both directions (diagnostics, tests).
  int lanes() const noexcept;

  // Link
  void push(wire::Lane lane, quic::Chunk c) override;
  void consumed(std::uint64_t stream, std::uint64_t n) override;
  std::uint64_t unacked() const override;
  void fail(Errc code, const std::string& why) override;
  std::optional<wire::Lane> stream_lane(std::uint64_t stream) const override {
    return static_cast<wire::Lane>(stream);
  }
  bool carries(wire::Lane lane) const noexcept override { return index(lane) >= 0; }
  bool on_socket() const noexcept override { return true; }
  std::string describe(std::uint64_t stream) const override;
  /// Reads what waits on the connections the peer switched, without waiting for the engine
  /// thread to hear of it: a user thread waiting for a reply polls here (Node::poll), as it
  /// polls QUIC's socket. The connections' own waits stay armed.
  Polled poll(LinkOwner& owner) override;

 private:
  struct Out {
    quic::Chunk chunk;
    std::size_t done = 0;
  };
  struct Conn {
    TcpAttached sock;
    asio::posix::stream_descriptor desc;
    std::deque<Out> out;
    std::uint64_t queued = 0;   // bytes of `out` not written yet
    std::uint64_t held = 0;     // delivered to the owner, not consumed yet
    bool sending = false;       // we switched the lane
    bool reading = false;       // the peer switched it
    bool read_waiting = false;  // a wait for the socket to be readable is queued
    bool read_posted = false;   // a read of what TLS holds is posted
    bool write_armed = false;
    bool unflushed = false;     // TLS records taken but not written yet (PskSession::flush)
    Conn(asio::io_context& io, TcpAttached a);
  };

  void write(Conn& c);
  /// Reads and hands on what waits on `c`; returns whether anything came.
  bool read(Conn& c);
  /// Makes sure `c` is read again: when its socket becomes readable, and at once (posted)
  /// while bytes wait in user space, which the socket will not announce.
  void arm_read(Conn& c);
  void arm_write(Conn& c);
  /// The connection broke (reset, end, error): the owner hears it once.
  void broken(Conn& c, const std::string& why);

  Engine& engine_;
  LinkOwner& owner_;
  std::uint64_t window_;
  std::unique_ptr<Conn> conns_[kLanes];
  std::vector<std::uint8_t> buf_;           // one read's bytes, before they are handed on
  std::shared_ptr<char> alive_;             // handlers queued after the link died see it gone
  bool failed_ = false;
};

}  // namespace nexar::detail
