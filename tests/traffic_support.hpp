// Traffic of several lanes at once, shared by the tests of the paths that carry it (QUIC in
// transport_test, shared memory in shm_link_test).
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nexar/nexar.hpp>

#include "support.hpp"

namespace nexar::testing {

/// Ranks 0 and 1 of `w`: a bulk transfer of `bytes` random bytes from 0 to 1 while both run
/// `rounds` of barrier, an 8-byte all_reduce and a send each way. Returns the first
/// mismatch or error ("" when every bulk byte arrived intact and every small result is right).
inline std::string bulk_beside_small_traffic(std::vector<Communicator>& w, std::size_t bytes, int rounds) {
  const auto big = random_bytes(bytes, 91);
  std::vector<std::byte> got(big.size());
  std::string errors[2];
  std::thread s([&] { w[0].bulk_send(1, 4, std::span<const std::byte>(big)); });
  std::thread r([&] { w[1].bulk_recv(0, 4, std::span<std::byte>(got)); });
  std::vector<std::thread> small;
  for (int rank = 0; rank < 2; ++rank) {
    small.emplace_back([&, rank] {
      Communicator& comm = w[static_cast<std::size_t>(rank)];
      try {
        for (int i = 0; i < rounds; ++i) {
          comm.barrier();
          std::vector<std::uint64_t> x{static_cast<std::uint64_t>(i * 2 + rank)};
          comm.all_reduce(std::span<std::uint64_t>(x), ReduceOp::sum);
          if (x[0] != static_cast<std::uint64_t>(i * 4 + 1))
            throw std::runtime_error("all_reduce " + std::to_string(i) + " gave " + std::to_string(x[0]));
          const int peer = 1 - rank;
          std::vector<int> out{i * 10 + rank}, in(1);
          auto sent = comm.isend(peer, 6, std::span<const int>(out));
          comm.recv(peer, 6, std::span<int>(in));
          sent.wait();
          if (in[0] != i * 10 + peer) throw std::runtime_error("send " + std::to_string(i));
        }
      } catch (const std::exception& e) {
        errors[rank] = "rank " + std::to_string(rank) + ": " + e.what();
      }
    });
  }
  for (auto& t : small) t.join();
  s.join();
  r.join();
  if (!errors[0].empty()) return errors[0];
  if (!errors[1].empty()) return errors[1];
  if (got != big) return "the bulk transfer arrived damaged";
  return "";
}

}  // namespace nexar::testing
