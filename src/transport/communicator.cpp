// nexar::Communicator: argument checks that need no engine, then forwarding to CommImpl.
#include <nexar/communicator.hpp>

#include "transport/node.hpp"

namespace nexar {

using detail::Domain;

Communicator::Communicator(std::shared_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}

detail::CommImpl& Communicator::self() const {
  if (!impl_) throw Error(Errc::invalid_argument, "communicator: used a default-constructed Communicator");
  return *impl_;
}

int Communicator::rank() const { return self().rank(); }
int Communicator::size() const { return self().size(); }
const Config& Communicator::config() const { return self().config(); }
bool Communicator::is_open() const { return impl_ && impl_->is_open(); }
void Communicator::close() {
  if (impl_) impl_->close();
}

void Communicator::check_element_multiple(const Status& s, std::size_t elem) {
  if (elem > 1 && s.bytes % elem != 0) {
    throw Error(Errc::invalid_argument,
                "recv: message of " + std::to_string(s.bytes) + " bytes from rank " +
                    std::to_string(s.source) + " is not a whole number of " + std::to_string(elem) +
                    "-byte elements");
  }
}

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

void Communicator::stream_send(int dest, int tag, const void* data, std::size_t bytes) {
  istream_send(dest, tag, data, bytes).wait();
}

Request Communicator::istream_send(int dest, int tag, const void* data, std::size_t bytes) {
  ConstBuffer b{data, bytes};
  return self().isend(Domain::bulk, "stream_send", dest, tag, std::span<const ConstBuffer>(&b, 1));
}

Status Communicator::stream_recv(int source, int tag, void* data, std::size_t capacity) {
  return istream_recv(source, tag, data, capacity).wait();
}

Request Communicator::istream_recv(int source, int tag, void* data, std::size_t capacity) {
  return self().irecv(Domain::bulk, "stream_recv", source, tag, data, capacity);
}

void Communicator::register_rpc(RpcId id, RpcHandler handler) {
  if (!handler) throw Error(Errc::invalid_argument, "register_rpc: empty handler for id " + std::to_string(id));
  self().rpc().add(id, std::move(handler));
}

void Communicator::unregister_rpc(RpcId id) { self().rpc().remove(id); }

std::vector<std::byte> Communicator::rpc(int dest, RpcId id, std::span<const std::byte> args,
                                         std::optional<std::chrono::milliseconds> timeout) {
  std::vector<std::byte> reply;
  rpc_async(dest, id, args, &reply, timeout).wait();
  return reply;
}

Request Communicator::rpc_async(int dest, RpcId id, std::span<const std::byte> args,
                                std::vector<std::byte>* reply,
                                std::optional<std::chrono::milliseconds> timeout) {
  auto& s = self();
  return s.rpc_call(dest, id, args, reply, timeout.value_or(s.config().rpc_timeout));
}

}  // namespace nexar
