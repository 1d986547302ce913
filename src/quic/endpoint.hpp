// A node's QUIC endpoint: one UDP socket for all its incoming and outgoing connections.
// It reads datagrams (GRO), routes them to connections by destination connection ID,
// accepts new connections, sends what connections write (GSO batches), and runs the
// one timer that drives every connection's ngtcp2 expiry. It is driven by an EventLoop
// (the transport's progress engine) and knows nothing else of it: everything here runs on
// the loop's thread, or on a thread holding the loop's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/event_loop.hpp"
#include "quic/connection.hpp"
#include "quic/impairment.hpp"
#include "quic/udp_socket.hpp"
#include "quic/wake_timer.hpp"

namespace nexar::quic {

inline constexpr std::size_t scid_len = 16;

class Endpoint {
 public:
  /// Chooses the handler of a connection a peer opened; nullptr refuses it.
  using AcceptFn = std::function<ConnectionHandler*(Connection&)>;

  /// Takes ownership of the bound socket `fd`.
  Endpoint(detail::EventLoop& loop, int fd, const tls::TlsContext& tls,
           ConnectionSettings settings, bool try_gso);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// Starts reading; incoming connections go to `accept`.
  void start(AcceptFn accept);
  /// Dials `to`, expecting its certificate to name `node`, offering ALPN protocol `alpn`
  /// (empty: the first of ConnectionSettings::alpn).
  Connection& connect(const Address& to, const std::string& node, ConnectionHandler* h,
                      const std::string& alpn = {});
  /// Flushes `c` once the current batch of events is handled.
  void schedule_flush(Connection& c);
  /// While one lives, connections that become dirty are flushed when the outermost one
  /// ends instead of by work posted to the loop: a user thread that sends or
  /// polls inline flushes itself rather than waking the loop's thread (loop lock held).
  class Batch {
   public:
    explicit Batch(Endpoint& ep) : ep_(ep) { ++ep_.batching_; }
    ~Batch() {
      if (--ep_.batching_ == 0) ep_.flush_dirty();
    }
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    Endpoint& ep_;
  };
  /// Closes every connection with `reason` and stops reading.
  void shutdown(const std::string& reason, std::uint64_t app_code = 0);
  /// Connections not closed yet, those still in their handshake included.
  std::size_t live_connections() const noexcept;
  /// Reads whatever the socket holds, runs due ngtcp2 timers (through flush_dirty's
  /// re-arm) and sends what that produced (loop lock held). Returns whether packets came.
  bool poll() { return on_readable(); }
  /// Handles connections whose ngtcp2 expiry has passed (loop lock held).
  void service_timers();
  /// Sends what connections have queued now rather than from posted work.
  void flush_dirty();

  const Address& local() const noexcept { return sock_.local(); }
  const ConnectionSettings& settings() const noexcept { return settings_; }
  const tls::TlsContext& tls() const noexcept { return tls_; }
  detail::EventLoop& loop() noexcept { return loop_; }
  static std::uint64_t now() noexcept;

  /// Counters, for tests and logs.
  struct Stats {
    std::uint64_t datagrams_in = 0, datagrams_dropped = 0, packets_out = 0, batches_out = 0, bytes_out = 0;
    /// The largest datagram sent, and how many went out as IP fragments because the
    /// path's MTU had shrunk below their size (UdpSocket::send).
    std::uint64_t largest_datagram_out = 0, datagrams_fragmented = 0;
  };
  const Stats& stats() const noexcept { return stats_; }
  /// The socket's datagrams lost to full queues: on arrival, and on the way out.
  std::uint64_t receive_drops() const noexcept { return sock_.receive_drops(); }
  std::uint64_t send_drops() const noexcept { return sock_.queue_drops(); }
  /// Whether shutdown() ran: the endpoint dials and accepts nothing any more.
  bool stopped() const noexcept { return stopped_; }
  /// What the impairment did (ConnectionSettings::impair); nullptr when there is none.
  const Impairment* impairment() const noexcept { return impair_.get(); }

 private:
  friend class Connection;
  /// ngtcp2 settings and transport parameters of a connection with `remote`; `probes`
  /// receives the path MTU probe sizes `st` points at (ngtcp2 copies them).
  void defaults(std::uint64_t ts, const Address& remote, ngtcp2_settings& st, ngtcp2_transport_params& params,
                std::vector<std::uint16_t>& probes) const;
  /// The socket or the timer may be readable; false once stopped (stop watching).
  bool on_ready();
  bool on_readable();
  void dispatch(const Address& from, std::uint8_t* pkt, std::size_t len, std::uint64_t ts);
  Connection* accept(const Address& from, std::uint8_t* pkt, std::size_t len, std::uint64_t ts);
  void rearm_timer();
  /// Runs the ngtcp2 timers of connections due at `ts`; returns whether any was.
  bool service_due(std::uint64_t ts);
  /// When `c`'s timer should run: ngtcp2's expiry, plus kAckGraceNs while it has nothing
  /// queued to send (then only acknowledgements and slow timers can be due).
  std::uint64_t due_at(Connection& c) const;
  /// Sends a batch of `c`'s packets; `probe`: a path MTU probe, never fragmented.
  void send(Connection& c, const std::uint8_t* data, std::size_t len, std::size_t segment, bool probe = false);
  void add_cid(const ngtcp2_cid& cid, Connection* c);
  void remove_cid(const ngtcp2_cid& cid);
  void retire(Connection& c);

  detail::EventLoop& loop_;
  const tls::TlsContext& tls_;
  ConnectionSettings settings_;
  UdpSocket sock_;
  // ngtcp2's expiry for every connection; watched by the loop next to the socket.
  WakeTimer timer_;
  bool watching_ = false;
  std::uint64_t timer_at_ = 0;  // when timer_ fires; 0 = disarmed
  AcceptFn accept_;
  std::map<std::string, Connection*> cids_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<Connection*> dirty_;
  bool flush_posted_ = false;
  // A read happened since the last re-arm, so flush_dirty() must re-arm (and run due
  // timers) even with nothing to flush. Without a read or a flush no connection's expiry
  // moved, and the armed timer still stands: a batch that only touched shared memory (an
  // 8 B message to a same-host peer) then asks no connection for its expiry.
  bool rearm_due_ = true;
  int batching_ = 0;
  bool stopped_ = false;
  // A refused send queued an error report (IP_RECVERR): read it out with the next read.
  bool errors_queued_ = false;
  std::vector<std::uint8_t> rxbuf_;
  std::vector<std::uint8_t> txbuf_;
  std::unique_ptr<Impairment> impair_;  // only when settings_.impair is active
  std::uint64_t next_id_ = 1;
  Stats stats_;
};

}  // namespace nexar::quic
