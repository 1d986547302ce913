#include "relay.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <string>
#include <system_error>

namespace nexar_relay {
namespace {

// epoll data of the sockets that are not a client's (a client's is its slot number).
constexpr std::uint64_t kListenTag = 1ull << 40;
constexpr std::uint64_t kTimerTag = kListenTag + 1;
constexpr std::uint64_t kSignalTag = kListenTag + 2;

// How often idle clients are looked for (when any exist and --idle-timeout-s is not 0).
constexpr std::int64_t kSweepEveryNs = 1'000'000'000;

// Kernel socket buffers: a burst released at once (everything that arrived while the relay
// was not scheduled) must not overflow them. SO_*BUFFORCE lifts net.core.[rw]mem_max for
// root, as the benchmarks run; others get what the limit allows.
constexpr int kSocketBuffer = 8 << 20;

std::system_error sys_error(const std::string& what) { return {errno, std::generic_category(), what}; }

std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void set_buffers(int fd) {
  const int size = kSocketBuffer;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

// The relay never fragments: a datagram larger than the MTU of the way out fails to send
// (EMSGSIZE, counted as a send error), as a router drops a don't-fragment packet. Without
// this the kernel would fragment what arrived whole over lo (64 KiB MTU) to send it over an
// Ethernet link, and a QUIC endpoint probing the path MTU (nexar's datagrams carry
// don't-fragment) would settle on 64 KiB datagrams that then cross the link as IP fragments.
void never_fragment(int fd, int family) {
  const int v4 = IP_PMTUDISC_DO;
  ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &v4, sizeof v4);  // also IPv4-mapped on IPv6
  if (family == AF_INET6) {
    const int v6 = IPV6_PMTUDISC_DO;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &v6, sizeof v6);
  }
}

void watch(int epoll_fd, int fd, std::uint64_t tag, std::uint32_t events = EPOLLIN) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) throw sys_error("epoll_ctl");
}

}  // namespace

Relay::Relay(const RelayOptions& options)
    : options_(options),
      lines_{DelayLine(options.queue_bytes), DelayLine(options.queue_bytes)},
      rng_(options.seed),
      rx_buf_(std::make_unique_for_overwrite<std::uint8_t[]>(kBatch * kMaxDatagram)) {
  for (std::size_t i = 0; i < kBatch; ++i) {
    rx_iov_[i] = iovec{rx_buf_.get() + i * kMaxDatagram, kMaxDatagram};
    rx_msgs_[i].msg_hdr.msg_iov = &rx_iov_[i];
    rx_msgs_[i].msg_hdr.msg_iovlen = 1;
    tx_msgs_[i].msg_hdr.msg_iov = &tx_iov_[i];
    tx_msgs_[i].msg_hdr.msg_iovlen = 1;
  }
  try {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) throw sys_error("epoll_create1");
    listen_fd_ = ::socket(options_.listen.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw sys_error("socket");
    if (::bind(listen_fd_, options_.listen.sa(), options_.listen.len) != 0)
      throw sys_error("cannot bind --listen " + options_.listen.text());
    set_buffers(listen_fd_);
    never_fragment(listen_fd_, options_.listen.family());
    listening_ = Address::local_of(listen_fd_);
    watch(epoll_fd_, listen_fd_, kListenTag);

    timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (timer_fd_ < 0) throw sys_error("timerfd_create");
    watch(epoll_fd_, timer_fd_, kTimerTag);

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    signal_fd_ = ::signalfd(-1, &stop, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd_ < 0) throw sys_error("signalfd");
    watch(epoll_fd_, signal_fd_, kSignalTag);
  } catch (...) {
    for (int fd : {signal_fd_, timer_fd_, listen_fd_, epoll_fd_})
      if (fd >= 0) ::close(fd);
    throw;
  }
}

Relay::~Relay() {
  for (const Client& c : clients_)
    if (c.fd >= 0) ::close(c.fd);
  for (int fd : {signal_fd_, timer_fd_, listen_fd_, epoll_fd_})
    if (fd >= 0) ::close(fd);
}

int Relay::run() {
  std::array<epoll_event, 16> events{};
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw sys_error("epoll_wait");
    }
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      const std::uint64_t tag = events[i].data.u64;
      const std::uint32_t ev = events[i].events;
      if (tag == kSignalTag) {
        signalfd_siginfo si{};
        if (::read(signal_fd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si))
          return static_cast<int>(si.ssi_signo);
      } else if (tag == kTimerTag) {
        std::uint64_t expirations = 0;
        (void)!::read(timer_fd_, &expirations, sizeof expirations);  // only clears it
        armed_ns_ = DelayLine::kNever;
      } else if (tag == kListenTag) {
        if (ev & EPOLLOUT) unblock(listen_fd_);
        if (ev & EPOLLIN) receive_from_clients();
      } else {
        const auto client = static_cast<std::uint32_t>(tag);
        if (ev & EPOLLOUT) unblock(clients_[client].fd);
        // EPOLLERR: an ICMP error (the target's port is closed) is pending; the read
        // returns and clears it.
        if (ev & (EPOLLIN | EPOLLERR)) receive_from_target(client);
      }
    }
    const std::int64_t now = now_ns();
    release_due(kToTarget, now);
    release_due(kToClient, now);
    if (options_.idle_timeout_ns > 0 && now >= next_sweep_ns_) {
      forget_idle(now);
      next_sweep_ns_ = now + kSweepEveryNs;
    }
    arm_timer(now);
  }
}

void Relay::receive_from_clients() {
  for (std::size_t i = 0; i < kBatch; ++i) {
    rx_msgs_[i].msg_hdr.msg_name = &rx_from_[i];
    rx_msgs_[i].msg_hdr.msg_namelen = sizeof rx_from_[i];
  }
  const int n = ::recvmmsg(listen_fd_, rx_msgs_.data(), kBatch, MSG_DONTWAIT, nullptr);
  if (n <= 0) return;  // EAGAIN, or an error about an earlier send: nothing to read now
  const std::int64_t now = now_ns();
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    const std::uint32_t client = client_for(rx_from_[i], rx_msgs_[i].msg_hdr.msg_namelen, now);
    if (client == UINT32_MAX) {
      ++stats_[kToTarget].dropped_error;
      continue;
    }
    hold(kToTarget, client, static_cast<const std::uint8_t*>(rx_iov_[i].iov_base), rx_msgs_[i].msg_len, now);
  }
}

void Relay::receive_from_target(std::uint32_t client) {
  for (std::size_t i = 0; i < kBatch; ++i) {
    rx_msgs_[i].msg_hdr.msg_name = nullptr;
    rx_msgs_[i].msg_hdr.msg_namelen = 0;
  }
  const int n = ::recvmmsg(clients_[client].fd, rx_msgs_.data(), kBatch, MSG_DONTWAIT, nullptr);
  if (n <= 0) return;  // EAGAIN, or ECONNREFUSED (now cleared): the target was not listening
  const std::int64_t now = now_ns();
  clients_[client].last_active_ns = now;
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i)
    hold(kToClient, client, static_cast<const std::uint8_t*>(rx_iov_[i].iov_base), rx_msgs_[i].msg_len, now);
}

void Relay::hold(std::size_t direction, std::uint32_t client, const std::uint8_t* data, std::size_t len, std::int64_t now) {
  DirectionStats& st = stats_[direction];
  if (options_.loss > 0 && static_cast<double>(rng_() >> 11) * 0x1.0p-53 < options_.loss) {
    ++st.dropped_loss;
    return;
  }
  std::int64_t due = now + options_.delay_ns;
  if (options_.jitter_ns > 0) due += static_cast<std::int64_t>(rng_() % static_cast<std::uint64_t>(options_.jitter_ns + 1));
  Client& c = clients_[client];
  if (!options_.reorder) due = std::max(due, c.last_due_ns[direction]);
  if (!lines_[direction].push(due, client, data, len)) {
    ++st.dropped_queue;
    return;
  }
  c.last_due_ns[direction] = due;
  ++c.held;
}

void Relay::release_due(std::size_t direction, std::int64_t now) {
  DelayLine& line = lines_[direction];
  DirectionStats& st = stats_[direction];
  while (blocked_fd_[direction] < 0 && line.next_due() <= now) {
    // A batch goes out through one socket: to the target each client has its own, so the
    // batch ends where the next datagram is another client's.
    std::size_t n = 0;
    int fd = -1;
    while (n < kBatch && line.next_due() <= now) {
      const DelayLine::Held h = line.front();
      Client& c = clients_[h.client];
      const int out = direction == kToTarget ? c.fd : listen_fd_;
      if (n > 0 && out != fd) break;
      fd = out;
      line.pop();
      tx_held_[n] = h;
      tx_iov_[n] = iovec{const_cast<std::uint8_t*>(h.data), h.len};
      msghdr& m = tx_msgs_[n].msg_hdr;
      m.msg_name = direction == kToClient ? c.addr.sa() : nullptr;
      m.msg_namelen = direction == kToClient ? c.addr.len : 0;
      ++n;
    }
    std::size_t done = 0;  // sent, or dropped for an error
    while (done < n) {
      const int sent = ::sendmmsg(fd, tx_msgs_.data() + done, static_cast<unsigned>(n - done), 0);
      if (sent > 0) {
        for (std::size_t i = done; i < done + static_cast<std::size_t>(sent); ++i) {
          ++st.datagrams;
          st.bytes += tx_held_[i].len;
        }
        done += static_cast<std::size_t>(sent);
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // The send buffer is full: the rest waits, in order, until the socket can take more.
        for (std::size_t i = done; i < n; ++i) line.unpop(tx_held_[i]);
        n = done;
        block(direction, fd, direction == kToTarget ? tx_held_[0].client : kListenTag);
        break;
      } else {
        // ECONNREFUSED (the target's port was closed when an earlier datagram arrived),
        // EMSGSIZE (larger than the MTU of the way out: never_fragment) and the like fail
        // this datagram only.
        ++st.dropped_error;
        ++done;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      line.release(tx_held_[i].seq);
      --clients_[tx_held_[i].client].held;
    }
  }
}

void Relay::block(std::size_t direction, int fd, std::uint64_t tag) {
  blocked_fd_[direction] = fd;
  blocked_tag_[direction] = tag;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;
  ev.data.u64 = tag;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void Relay::unblock(int fd) {
  for (std::size_t d = 0; d < 2; ++d) {
    if (blocked_fd_[d] != fd) continue;
    blocked_fd_[d] = -1;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = blocked_tag_[d];
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
  }
}

std::uint32_t Relay::client_for(const sockaddr_storage& from, socklen_t len, std::int64_t now) {
  const AddressKey key(from);
  if (auto it = by_address_.find(key); it != by_address_.end()) {
    clients_[it->second].last_active_ns = now;
    return it->second;
  }
  const int fd = ::socket(options_.target.family(), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return UINT32_MAX;
  set_buffers(fd);
  never_fragment(fd, options_.target.family());
  std::uint32_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<std::uint32_t>(clients_.size());
    clients_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = slot;
  if (::connect(fd, options_.target.sa(), options_.target.len) != 0 ||
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    ::close(fd);
    free_slots_.push_back(slot);
    return UINT32_MAX;
  }
  Client& c = clients_[slot];
  c = Client{};
  c.fd = fd;
  c.addr.storage = from;
  c.addr.len = len;
  c.last_active_ns = now;
  by_address_.emplace(key, slot);
  ++clients_seen_;
  return slot;
}

void Relay::forget_idle(std::int64_t now) {
  for (std::uint32_t slot = 0; slot < clients_.size(); ++slot) {
    Client& c = clients_[slot];
    if (c.fd < 0 || c.held > 0 || now - c.last_active_ns < options_.idle_timeout_ns) continue;
    ::close(c.fd);  // leaves the epoll set with it
    by_address_.erase(AddressKey(c.addr.storage));
    c.fd = -1;
    free_slots_.push_back(slot);
  }
}

void Relay::arm_timer(std::int64_t now) {
  std::int64_t next = DelayLine::kNever;
  for (std::size_t d = 0; d < 2; ++d)
    if (blocked_fd_[d] < 0) next = std::min(next, lines_[d].next_due());
  if (options_.idle_timeout_ns > 0 && by_address_.size() > 0) next = std::min(next, std::max(next_sweep_ns_, now));
  if (next == armed_ns_) return;
  itimerspec spec{};
  if (next != DelayLine::kNever) {
    // 0 would disarm the timer; a time already past fires at once.
    const std::int64_t at = std::max<std::int64_t>(next, 1);
    spec.it_value.tv_sec = static_cast<time_t>(at / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(at % 1'000'000'000);
  }
  if (::timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr) == 0) armed_ns_ = next;
}

}  // namespace nexar_relay
