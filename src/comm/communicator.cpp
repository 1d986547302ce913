// nexar::Communicator, the public facade: point-to-point and RPC go to its CommunicatorImpl
// (which checks ranks and tags) and its node. The collectives' member functions are not
// here: each collective's file in src/collective defines them over port(), next to its
// checks and algorithms.
#include <nexar/communicator.hpp>

#include "comm/communicator_impl.hpp"

namespace nexar {

using detail::Domain;
using detail::CommunicatorImpl;

Communicator::Communicator(std::shared_ptr<detail::CommunicatorImpl> impl) : impl_(std::move(impl)) {}

detail::CommunicatorImpl& Communicator::self() const {
  if (!impl_) throw Error(Errc::invalid_argument, "communicator: used an empty Communicator");
  return impl_->current();
}

int Communicator::rank() const { return self().rank(); }
int Communicator::size() const { return self().size(); }
std::uint64_t Communicator::id() const { return self().id(); }
std::vector<int> Communicator::neighbours() const { return self().neighbours(); }
std::vector<int> Communicator::connected_peers() const { return self().connected_peers(); }
const Config& Communicator::config() const { return self().node().config(); }
bool Communicator::is_open() const { return impl_ && impl_->is_open(); }
void Communicator::close() {
  if (impl_) impl_->close();
}

// ---- diagnosis ------------------------------------------------------------------------

std::vector<OpRecord> Communicator::recorder() const { return self().recorder().snapshot(); }
std::string Communicator::dump() const { return self().dump(); }
Stats Communicator::stats() const { return self().stats(); }

// ---- failures ---------------------------------------------------------------------------

std::vector<int> Communicator::world_ranks() const { return self().members(); }
std::vector<int> Communicator::failed_ranks() const { return self().failed_ranks(); }
bool Communicator::is_revoked() const { return self().is_revoked(); }
void Communicator::on_failure(std::function<void(const std::vector<int>&)> fn) { self().on_failure(std::move(fn)); }
void Communicator::revoke() { self().revoke(); }
Communicator::Agreement Communicator::agree(std::uint64_t value) { return self().agree("agree", value); }
Communicator Communicator::shrink() const { return Communicator(self().shrink()); }

// ---- elastic membership ---------------------------------------------------------------------

int Communicator::pending_joiners() const { return self().pending_joiners(); }
Communicator Communicator::grow() const { return Communicator(self().grow()); }
void Communicator::leave() { self().leave(); }
bool Communicator::joined_by_grow() const { return self().joined_by_grow(); }

void Communicator::check_element_multiple(const char* op, const Status& s, std::size_t elem) {
  if (elem > 1 && s.bytes % elem != 0) {
    throw Error(Errc::invalid_argument,
                std::string(op) + ": message of " + std::to_string(s.bytes) + " bytes from rank " +
                    std::to_string(s.source) + " is not a whole number of " + std::to_string(elem) +
                    "-byte elements");
  }
}

void Communicator::check_size(const char* op, const char* which, std::size_t have, std::size_t need) {
  if (have < need) {
    throw Error(Errc::invalid_argument, std::string(op) + ": " + which + " holds " + std::to_string(have) +
                                            " elements, " + std::to_string(need) + " needed");
  }
}

void Communicator::check_blocks(const char* op, const char* which, std::size_t have, std::size_t blocks) {
  if (blocks == 0 || have % blocks != 0) {
    throw Error(Errc::invalid_argument, std::string(op) + ": " + which + " holds " + std::to_string(have) +
                                            " elements, not " + std::to_string(blocks) +
                                            " equal blocks (one per rank)");
  }
}

// ---- point-to-point ----------------------------------------------------------------------

void Communicator::send(int dest, int tag, const void* data, std::size_t bytes) {
  isend(dest, tag, data, bytes).wait();
}
Request Communicator::isend(int dest, int tag, const void* data, std::size_t bytes) {
  ConstBuffer b{data, bytes};
  return self().isend(Domain::data, "send", dest, tag, std::span<const ConstBuffer>(&b, 1));
}
void Communicator::send_iov(int dest, int tag, std::span<const ConstBuffer> parts) {
  isend_iov(dest, tag, parts).wait();
}
Request Communicator::isend_iov(int dest, int tag, std::span<const ConstBuffer> parts) {
  return self().isend(Domain::data, "send_iov", dest, tag, parts);
}
Status Communicator::recv(int source, int tag, void* data, std::size_t capacity) {
  return irecv(source, tag, data, capacity).wait();
}
Request Communicator::irecv(int source, int tag, void* data, std::size_t capacity) {
  return self().irecv(Domain::data, "recv", source, tag, data, capacity);
}
void Communicator::bulk_send(int dest, int tag, const void* data, std::size_t bytes) {
  ibulk_send(dest, tag, data, bytes).wait();
}
Request Communicator::ibulk_send(int dest, int tag, const void* data, std::size_t bytes) {
  ConstBuffer b{data, bytes};
  return self().isend(Domain::bulk, "bulk_send", dest, tag, std::span<const ConstBuffer>(&b, 1));
}
Status Communicator::bulk_recv(int source, int tag, void* data, std::size_t capacity) {
  return ibulk_recv(source, tag, data, capacity).wait();
}
Request Communicator::ibulk_recv(int source, int tag, void* data, std::size_t capacity) {
  return self().irecv(Domain::bulk, "bulk_recv", source, tag, data, capacity);
}

// ---- RPC: handlers and calls belong to this communicator ----------------------------------

void Communicator::register_rpc(RpcId id, RpcHandler handler) {
  auto& g = self();
  if (!handler) throw Error(Errc::invalid_argument, "register_rpc: empty handler for id " + std::to_string(id));
  g.check_open("register_rpc");
  g.rpc().service().add(g.id(), g.local_of(), id, std::move(handler));
}

void Communicator::unregister_rpc(RpcId id) {
  auto& g = self();
  g.rpc().service().remove(g.id(), id);
}

std::vector<std::byte> Communicator::rpc(int dest, RpcId id, std::span<const std::byte> args,
                                         std::optional<std::chrono::milliseconds> timeout) {
  RpcCall call = rpc_async(dest, id, args, timeout);
  // A handler waiting here holds its thread: the service must know, or it could wait for
  // a request that no thread is left to run.
  detail::RpcService::NestedWait nested(self().rpc().service());
  return std::move(call.wait());
}

RpcCall Communicator::rpc_async(int dest, RpcId id, std::span<const std::byte> args,
                                std::optional<std::chrono::milliseconds> timeout) {
  auto& g = self();
  g.check_open("rpc");
  g.check_rank("rpc", dest, false);
  return g.rpc().call(g.id(), g.world_of(dest), id, args, timeout.value_or(g.config().rpc_timeout));
}

// ---- collectives ---------------------------------------------------------------------------

Communicator::BlockingCall::BlockingCall() noexcept { CommunicatorImpl::blocking_calls(1); }
Communicator::BlockingCall::~BlockingCall() { CommunicatorImpl::blocking_calls(-1); }

detail::CollectivePort& Communicator::port() const { return self(); }

// ---- split ---------------------------------------------------------------------------------

Communicator Communicator::split(int color, int key) const {
  auto child = self().split(color, key);
  return child ? Communicator(std::move(child)) : Communicator();
}

}  // namespace nexar
