#include "rpc/rpc.hpp"

#include <string>

#include "core/access.hpp"
#include "core/error_format.hpp"

namespace nexar::detail {

Rpc::Rpc(Node& node)
    : node_(node),
      service_(node.rank(), node.config().rpc_threads,
               [this](int caller, std::uint64_t call, wire::RpcStatus st, std::vector<std::byte> out) {
                 reply(caller, call, st, std::move(out));
               }) {}

bool Rpc::take(std::uint64_t call, Pending* out) {
  std::lock_guard lk(mu_);
  auto it = calls_.find(call);
  if (it == calls_.end()) return false;
  if (out) *out = std::move(it->second);
  calls_.erase(it);
  return true;
}

RpcCall Rpc::call(std::uint64_t comm, int dest, std::uint64_t fn, std::span<const std::byte> args,
                  std::chrono::milliseconds timeout) {
  const char* op = "rpc";
  node_.check_open(op, dest);
  const Config& cfg = node_.config();
  if (args.size() > cfg.max_frame_bytes) {
    ErrorContext ctx{op, node_.rank(), dest, {}, {}};
    throw make_error(Errc::invalid_argument, ctx,
                     "arguments of " + std::to_string(args.size()) + " bytes exceed max_frame_bytes " +
                         std::to_string(cfg.max_frame_bytes));
  }
  if (std::string why = node_.routing().beyond_hop_limit(dest); !why.empty()) {
    ErrorContext ctx{op, node_.rank(), dest, {}, {}};
    throw make_error(Errc::invalid_argument, ctx, why);
  }
  auto st = node_.new_op(op, timeout);
  auto reply = std::make_shared<std::vector<std::byte>>();
  const std::uint64_t call = next_call_.fetch_add(1);
  {
    std::lock_guard lk(mu_);
    calls_[call] = Pending{st, reply, dest};
  }
  // The canceller runs on whichever thread gives the call up (its waiter at the deadline,
  // or cancel()), perhaps after the communicator was dropped: it holds the Rpc weakly.
  st->canceller = [self = weak_from_this(), call, dest, weak = std::weak_ptr<OpState>(st)](Errc code) {
    auto rpc = self.lock();
    auto s = weak.lock();
    if (rpc && s && rpc->take(call, nullptr))
      rpc->node_.fail(s, code, dest, code == Errc::timeout ? "no reply in time" : "call cancelled");
  };
  if (dest == node_.rank()) {
    service_.submit(dest, comm, fn, call, std::vector<std::byte>(args.begin(), args.end()));
    return RpcCall(Access::make_request(st), reply);
  }
  wire::FrameHeader h;
  h.type = wire::FrameType::rpc_request;
  h.src = static_cast<std::uint32_t>(node_.rank());
  h.comm = comm;
  h.tag = fn;
  h.seq = call;
  h.length = args.size();
  if (!node_.send_rpc_frame(dest, wire::Lane::rpc_request, h, args)) {
    // Gone before we could send: the failure the transport recorded is the answer.
    Peer* p = node_.peer(dest);
    if (take(call, nullptr)) node_.fail(st, p->gone_code(), dest, p->gone_why());
  }
  return RpcCall(Access::make_request(st), reply);
}

void Rpc::finish(std::uint64_t call, wire::RpcStatus status, std::vector<std::byte> payload) {
  Pending c;
  if (!take(call, &c)) return;  // timed out or cancelled meanwhile
  std::string text(reinterpret_cast<const char*>(payload.data()), payload.size());
  switch (status) {
    case wire::RpcStatus::ok: {
      const std::size_t n = payload.size();
      *c.reply = std::move(payload);
      c.op->succeed(Status{c.dest, -1, n});
      break;
    }
    case wire::RpcStatus::unknown_id:
      node_.fail(c.op, Errc::unknown_rpc, c.dest, text);
      break;
    case wire::RpcStatus::handler_failed:
      node_.fail(c.op, Errc::rpc_failed, c.dest, text);
      break;
  }
}

void Rpc::reply(int dest, std::uint64_t call, wire::RpcStatus status, std::vector<std::byte> payload) {
  if (dest == node_.rank()) return finish(call, status, std::move(payload));
  const Config& cfg = node_.config();
  if (payload.size() > cfg.max_frame_bytes) {
    // The caller would take an oversized frame for a protocol violation and drop the whole
    // connection: answer with an error instead.
    const std::string why = "reply of " + std::to_string(payload.size()) + " bytes from rank " +
                            std::to_string(node_.rank()) + " exceeds max_frame_bytes " +
                            std::to_string(cfg.max_frame_bytes);
    const auto* p = reinterpret_cast<const std::byte*>(why.data());
    return reply(dest, call, wire::RpcStatus::handler_failed, std::vector<std::byte>(p, p + why.size()));
  }
  wire::FrameHeader h;
  h.type = wire::FrameType::rpc_response;
  h.flags = static_cast<std::uint8_t>(status);
  h.src = static_cast<std::uint32_t>(node_.rank());
  h.seq = call;
  h.length = payload.size();
  node_.send_rpc_frame(dest, wire::Lane::rpc_response, h, payload);
}

void Rpc::on_request(int src, std::uint64_t comm, std::uint64_t fn, std::uint64_t call,
                     std::vector<std::byte> args) {
  service_.submit(src, comm, fn, call, std::move(args));
}

bool Rpc::awaits(std::uint64_t call) {
  std::lock_guard lk(mu_);
  return calls_.count(call) != 0;
}

void Rpc::on_response(int, std::uint64_t call, wire::RpcStatus status, std::vector<std::byte> reply) {
  finish(call, status, std::move(reply));
}

void Rpc::on_peer_gone(int peer, Errc code, const std::string& why) {
  std::vector<Pending> failed;
  {
    std::lock_guard lk(mu_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (it->second.dest == peer) {
        failed.push_back(std::move(it->second));
        it = calls_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : failed) node_.fail(c.op, code, peer, why);
}

void Rpc::on_close() {
  std::map<std::uint64_t, Pending> failed;
  {
    std::lock_guard lk(mu_);
    failed.swap(calls_);
  }
  // Waiting calls fail first, so handlers blocked in nested calls return and stop() can
  // join their threads.
  for (auto& [id, c] : failed) node_.fail(c.op, Errc::closed, c.dest, "communicator closed");
  service_.stop();
}

}  // namespace nexar::detail
