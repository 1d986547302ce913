// An in-memory CollectivePort for tests: the ranks of a MemoryWorld are threads of one
// process, their collective messages go through queues under one lock, and the mailboxes
// through a map. No transport, QUIC, TLS or shared memory is involved, so the algorithms
// of src/collective run as the plain sequential code they are, in microseconds.
//
// What it keeps of the real port (comm/communicator_impl.cpp): messages between two ranks of one
// collective match in the order they were sent, a receive takes exactly the size it
// expects (another size fails it, naming both), every wait ends at the collective's
// deadline, and collectives of a rank run one after another (here, in the calling thread).
// `seed` makes senders yield at random before they deliver, so that the interleavings of
// the ranks differ from run to run of a seed and repeat within it.
#pragma once

#include <nexar/error.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "collective/context.hpp"
#include "collective/port.hpp"
#include "core/access.hpp"
#include "core/error_format.hpp"
#include "engine/op_state.hpp"

namespace nexar::testing {

class MemoryPort;

/// The shared state of n MemoryPorts.
class MemoryWorld {
 public:
  /// `hosts[r]`: rank r's host number (ranks of one host may use the mailboxes when
  /// `mailbox_bytes` > 0, and the hierarchical all_reduce sees them as one host).
  MemoryWorld(int n, Config cfg, std::vector<std::uint64_t> hosts = {}, std::uint64_t seed = 1);
  ~MemoryWorld();
  MemoryWorld(const MemoryWorld&) = delete;
  MemoryWorld& operator=(const MemoryWorld&) = delete;

  int size() const noexcept { return static_cast<int>(ports_.size()); }
  MemoryPort& port(int r) { return *ports_[static_cast<std::size_t>(r)]; }

  // What the ports share, under mu_ (used by MemoryPort only).
  using Key = std::tuple<int, int, std::int64_t>;  // from, to, collective tag
  struct Pending {
    void* data;
    std::size_t bytes;
    std::shared_ptr<detail::OpState> state;
  };

  std::mutex mu_;
  std::map<Key, std::deque<std::vector<std::byte>>> sent_;  // not received yet
  std::map<Key, std::deque<Pending>> posted_;                // receives not matched yet
  std::map<Key, std::vector<std::byte>> mail_;               // from, to, mailbox label
  std::condition_variable mail_cv_;

 private:
  std::vector<std::unique_ptr<MemoryPort>> ports_;
};

class MemoryPort final : public detail::CollectivePort {
 public:
  MemoryPort(MemoryWorld& w, int rank, Config cfg, std::uint64_t host, std::uint64_t seed, bool mailboxes)
      : world_(w), rank_(rank), cfg_(std::move(cfg)), host_(host), rng_(seed), mailboxes_(mailboxes) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return world_.size(); }
  const Config& config() const noexcept override { return cfg_; }

  Request isend(const char* op, std::int64_t tag, Clock::time_point, int to, const void* data,
                std::size_t bytes) override {
    shake();
    std::unique_lock lk(world_.mu_);
    const MemoryWorld::Key key{rank_, to, tag};
    auto it = world_.posted_.find(key);
    if (it != world_.posted_.end() && !it->second.empty()) {
      MemoryWorld::Pending p = std::move(it->second.front());
      it->second.pop_front();
      lk.unlock();
      deliver(op, to, p, data, bytes);
    } else {
      const auto* b = static_cast<const std::byte*>(data);
      world_.sent_[key].emplace_back(b, b + bytes);
    }
    return {};  // eager: the bytes were copied
  }

  Request irecv(const char* op, std::int64_t tag, Clock::time_point deadline, int from, void* data,
                std::size_t bytes) override {
    auto st = std::make_shared<detail::OpState>(op, deadline);
    std::unique_lock lk(world_.mu_);
    const MemoryWorld::Key key{from, rank_, tag};
    auto it = world_.sent_.find(key);
    if (it != world_.sent_.end() && !it->second.empty()) {
      std::vector<std::byte> m = std::move(it->second.front());
      it->second.pop_front();
      lk.unlock();
      MemoryWorld::Pending p{data, bytes, st};
      deliver_to(op, from, p, m.data(), m.size());
    } else {
      world_.posted_[key].push_back({data, bytes, st});
      // A wait that reaches the deadline withdraws the receive (the real port's canceller).
      st->canceller = [w = &world_, key, raw = st.get(), op, rank = rank_, from](Errc code) {
        std::lock_guard g(w->mu_);
        auto& q = w->posted_[key];
        for (auto i = q.begin(); i != q.end(); ++i) {
          if (i->state.get() != raw) continue;
          auto keep = i->state;
          q.erase(i);
          keep->complete(code, detail::format_error(code, {op, rank, from, {}, {}}, "no matching message arrived in time"));
          return;
        }
      };
    }
    return detail::Access::make_request(st);
  }

  std::byte* scratch(int slot, std::size_t bytes) override {
    auto& s = scratch_[static_cast<std::size_t>(slot)];
    if (s.size() < bytes) s.resize(bytes);
    return s.data();
  }

  std::uint64_t host_id() const noexcept override { return host_; }
  const std::vector<std::uint64_t>* hosts() const noexcept override { return hosts_ ? &*hosts_ : nullptr; }
  void set_hosts(std::vector<std::uint64_t> ids) override { hosts_ = std::move(ids); }

  Request start(const char* name, const CollectiveOptions& o, DataType t, ReduceOp op, detail::CallShape,
                std::function<void(const detail::Coll&)> body) override {
    const auto now = Clock::now();
    const auto deadline = now + o.timeout.value_or(cfg_.op_timeout);
    auto st = std::make_shared<detail::OpState>(name, deadline, now);
    const detail::Coll c{*this, name, static_cast<std::int64_t>(++collectives_) << 32, deadline,
                         o.segment_bytes ? o.segment_bytes : static_cast<std::size_t>(cfg_.tuning.segment_bytes),
                         o.algorithm, t, op};
    try {
      body(c);
      st->succeed();
    } catch (const Error& e) {
      st->complete(e.code(), e.what());
    }
    return detail::Access::make_request(st);
  }

  std::optional<Ticket> mailboxes(const char* op, std::size_t bytes, const CollectiveOptions& o, bool blocking,
                                  std::uint16_t check, detail::CallShape shape) override {
    if (!mailboxes_ || bytes > cfg_.shm_collective_bytes) return std::nullopt;
    return Ticket{op, ++mail_seq_, Clock::now() + o.timeout.value_or(cfg_.op_timeout), !blocking, check, shape};
  }

  bool try_post(const Ticket& t, std::uint64_t part, int to, const void* data, std::size_t len) override {
    shake();
    const auto* b = static_cast<const std::byte*>(data);
    {
      std::lock_guard lk(world_.mu_);
      world_.mail_[{rank_, to, label(t, part)}].assign(b, b + len);
    }
    world_.mail_cv_.notify_all();
    return true;
  }
  bool try_take(const Ticket& t, std::uint64_t part, int from, void* out, std::size_t len) override {
    std::lock_guard lk(world_.mu_);
    auto it = world_.mail_.find({from, rank_, label(t, part)});
    if (it == world_.mail_.end()) return false;
    check_length(t, from, it->second.size(), len);
    if (len) std::memcpy(out, it->second.data(), len);
    world_.mail_.erase(it);
    return true;
  }
  const void* try_peek(const Ticket& t, std::uint64_t part, int from, std::size_t len) override {
    std::lock_guard lk(world_.mu_);
    auto it = world_.mail_.find({from, rank_, label(t, part)});
    if (it == world_.mail_.end()) return nullptr;
    check_length(t, from, it->second.size(), len);
    peeked_[it->second.data()] = it->first;  // a map node's vector stays put until erased
    return it->second.data();
  }
  void release(int, const void* data) override {
    std::lock_guard lk(world_.mu_);
    auto it = peeked_.find(data);
    if (it == peeked_.end()) return;
    world_.mail_.erase(it->second);
    peeked_.erase(it);
  }
  void idle(const Ticket& t, MailWait&, int peer, bool) override {
    std::unique_lock lk(world_.mu_);
    if (Clock::now() >= t.deadline) {
      throw detail::make_error(Errc::timeout, {t.op, rank_, peer, {}, {}}, "deadline passed waiting for mail");
    }
    world_.mail_cv_.wait_for(lk, std::chrono::microseconds(200));
  }

 private:
  static std::int64_t label(const Ticket& t, std::uint64_t part) {
    return static_cast<std::int64_t>((t.seq << 20) | part);
  }
  void check_length(const Ticket& t, int from, std::size_t sent, std::size_t len) const {
    if (sent == len) return;
    throw detail::make_error(Errc::invalid_argument, {t.op, rank_, from, {}, {}},
                             "rank " + std::to_string(from) + " sent " + std::to_string(sent) +
                                 " bytes, this rank expects " + std::to_string(len));
  }
  // Lets the other ranks' threads run first, now and then (seeded).
  void shake() {
    if (rng_() % 4 == 0) std::this_thread::yield();
  }
  // Hands a sent message to the receive `p` posted by rank `to`.
  void deliver(const char* op, int to, MemoryWorld::Pending& p, const void* data, std::size_t bytes) {
    world_.port(to).deliver_to(op, rank_, p, data, bytes);
  }
  void deliver_to(const char* op, int from, MemoryWorld::Pending& p, const void* data, std::size_t bytes) {
    if (bytes != p.bytes) {
      p.state->complete(Errc::invalid_argument,
                        detail::format_error(Errc::invalid_argument, {op, rank_, from, {}, {}},
                                             "rank " + std::to_string(from) + " sent " + std::to_string(bytes) +
                                                 " bytes, this rank expects " + std::to_string(p.bytes) +
                                                 " (the ranks disagree on count or type)"));
      return;
    }
    if (bytes) std::memcpy(p.data, data, bytes);
    p.state->succeed();
  }

  MemoryWorld& world_;
  int rank_;
  Config cfg_;
  std::uint64_t host_;
  std::mt19937_64 rng_;
  bool mailboxes_;
  std::uint64_t collectives_ = 0;
  std::uint64_t mail_seq_ = 0;
  std::optional<std::vector<std::uint64_t>> hosts_;
  std::vector<std::byte> scratch_[3];
  std::map<const void*, MemoryWorld::Key> peeked_;
};

inline MemoryWorld::MemoryWorld(int n, Config cfg, std::vector<std::uint64_t> hosts, std::uint64_t seed) {
  if (hosts.empty()) hosts.assign(static_cast<std::size_t>(n), 1);
  bool one_host = true;
  for (auto h : hosts) one_host = one_host && h == hosts[0];
  for (int r = 0; r < n; ++r) {
    ports_.push_back(std::make_unique<MemoryPort>(*this, r, cfg, hosts[static_cast<std::size_t>(r)],
                                                  seed * 1000003 + static_cast<std::uint64_t>(r),
                                                  one_host && cfg.shm && cfg.shm_collective_bytes > 0));
  }
}

inline MemoryWorld::~MemoryWorld() = default;

}  // namespace nexar::testing
