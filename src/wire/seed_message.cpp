// Seed protocol v2 codec. Integers are little-endian and assembled byte by byte; strings
// are a u32 length followed by that many bytes, checked against what is left of the body.
#include "wire/seed_message.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace nexar::wire {
namespace {

constexpr std::uint8_t kMagic[4] = {'N', 'X', 'S', 'D'};
// String lengths need no cap of their own: each is checked against the rest of a body
// whose size the header already bounded. Member counts are capped before reserving.
constexpr std::uint32_t kMaxMembers = 1u << 20;
constexpr std::size_t kKeySize = std::tuple_size_v<RelayKey>;

// Encoding runs the same field list twice: once through a Sizer that only adds up lengths,
// then through a Writer that fills a buffer allocated once at that exact size. The Writer
// never grows its buffer, so every store is to a slot the size pass already accounted for
// (and GCC 12's -O3 range analysis of vector::insert's reallocation path, which reports
// overflows that cannot happen, never comes into play).
class Sizer {
 public:
  void u16(std::uint16_t) { n_ += 2; }
  void u32(std::uint32_t) { n_ += 4; }
  void i32(std::int32_t) { n_ += 4; }
  void bytes(const std::uint8_t*, std::size_t n) { n_ += n; }
  void str(const std::string& s) {
    if (s.size() > std::numeric_limits<std::uint32_t>::max())
      throw std::length_error("seed message string longer than 4 GiB");
    n_ += 4 + s.size();
  }
  // Body size; the header stores it as a u32.
  std::uint32_t body() const {
    if (n_ > std::numeric_limits<std::uint32_t>::max())
      throw std::length_error("seed message body larger than 4 GiB");
    return static_cast<std::uint32_t>(n_);
  }

 private:
  std::size_t n_ = 0;
};

class Writer {
 public:
  Writer(SeedMsgType t, std::uint32_t body) : out_(seed_header_size + std::size_t{body}) {
    const auto header = encode_seed_header(t, body);
    bytes(header.data(), header.size());
  }
  void u16(std::uint16_t v) {
    for (int i = 0; i < 2; ++i) put(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) put(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void bytes(const std::uint8_t* p, std::size_t n) {
    assert(n <= out_.size() - pos_);
    if (n == 0) return;
    std::memcpy(out_.data() + pos_, p, n);
    pos_ += n;
  }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));  // Sizer::str checked it fits
    bytes(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
  }
  std::vector<std::uint8_t> finish() {
    assert(pos_ == out_.size());
    return std::move(out_);
  }

 private:
  void put(std::uint8_t b) {
    assert(pos_ < out_.size());
    out_[pos_++] = b;
  }
  std::vector<std::uint8_t> out_;
  std::size_t pos_ = 0;
};

// Sizes the message `m` with fields(Sizer&, m), then writes it with fields(Writer&, m).
template <class Fields, class Msg>
std::vector<std::uint8_t> encode_as(SeedMsgType t, const Msg& m, Fields fields) {
  Sizer size;
  fields(size, m);
  Writer w(t, size.body());
  fields(w, m);
  return w.finish();
}

struct Malformed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  void need(std::size_t k, const char* field) {
    if (n_ - off_ < k)
      throw Malformed(std::string("seed message truncated in field '") + field + "'");
  }
  std::uint16_t u16(const char* f) {
    need(2, f);
    std::uint16_t v = static_cast<std::uint16_t>(p_[off_] | (p_[off_ + 1] << 8));
    off_ += 2;
    return v;
  }
  std::uint32_t u32(const char* f) {
    need(4, f);
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{p_[off_ + static_cast<std::size_t>(i)]} << (8 * i);
    off_ += 4;
    return v;
  }
  std::int32_t i32(const char* f) { return static_cast<std::int32_t>(u32(f)); }
  void bytes(std::uint8_t* dst, std::size_t k, const char* f) {
    need(k, f);
    std::memcpy(dst, p_ + off_, k);
    off_ += k;
  }
  std::string str(const char* f) {
    const std::uint32_t len = u32(f);
    need(len, f);
    std::string s(reinterpret_cast<const char*>(p_ + off_), len);
    off_ += len;
    return s;
  }
  void end() {
    if (off_ != n_)
      throw Malformed("seed message has " + std::to_string(n_ - off_) + " trailing bytes");
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t off_ = 0;
};

// A member: node, address, u16 flags (bit 0: joined late).
Member member(Reader& r) {
  Member m;
  m.node = r.str("member node");
  m.addr = r.str("member address");
  const std::uint16_t flags = r.u16("member flags");
  if (flags & ~1u) throw Malformed("seed member entry has unknown flags");
  m.late = flags & 1u;
  return m;
}

template <class W>
void put_member(W& w, const Member& m) {
  w.str(m.node);
  w.str(m.addr);
  w.u16(m.late ? 1 : 0);
}

SeedMessage decode_body(SeedMsgType type, Reader& r) {
  switch (type) {
    case SeedMsgType::hello: {
      SeedHello m;
      r.bytes(m.proof.data(), m.proof.size(), "proof");
      m.cluster = r.str("cluster");
      r.end();
      return m;
    }
    case SeedMsgType::join: {
      JoinRequest m;
      r.bytes(m.proof.data(), m.proof.size(), "proof");
      m.rank = r.i32("rank");
      m.world = r.i32("world");
      m.advertise = r.str("advertise");
      m.port = r.u16("port");
      m.node = r.str("node");
      m.host = r.str("host");
      m.csr_pem = r.str("csr");
      r.end();
      return m;
    }
    case SeedMsgType::accept: {
      JoinAccept m;
      m.rank = r.i32("rank");
      m.flags = r.u16("flags");
      if (m.flags & ~(accept_elastic | accept_late)) throw Malformed("seed accept has unknown flags");
      m.ca_pem = r.str("ca");
      m.cert_pem = r.str("cert");
      const std::uint32_t n = r.u32("members");
      if (n == 0 || n > kMaxMembers)
        throw Malformed("seed accept names " + std::to_string(n) + " members");
      // Each member needs at least its two length fields and its flags (10 bytes), and its
      // key (32 bytes): bound the reservations by the body.
      r.need(std::size_t{n} * (10 + kKeySize), "members");
      m.members.resize(n);
      for (auto& mem : m.members) mem = member(r);
      r.need(std::size_t{n} * kKeySize, "relay keys");
      m.keys.resize(n);
      for (auto& k : m.keys) r.bytes(k.data(), k.size(), "relay keys");
      r.end();
      if (m.rank < 0 || static_cast<std::uint32_t>(m.rank) >= n)
        throw Malformed("seed accept assigns rank " + std::to_string(m.rank) + " of " +
                        std::to_string(n));
      const RelayKey& own = m.keys[static_cast<std::size_t>(m.rank)];
      if (std::any_of(own.begin(), own.end(), [](std::uint8_t b) { return b != 0; }))
        throw Malformed("seed accept carries a relay key for the node's own rank " + std::to_string(m.rank));
      return m;
    }
    case SeedMsgType::announce: {
      Announce m;
      m.rank = r.i32("rank");
      m.member = member(r);
      r.bytes(m.key.data(), m.key.size(), "relay key");
      r.end();
      if (m.rank < 0) throw Malformed("seed announcement of rank " + std::to_string(m.rank));
      return m;
    }
    case SeedMsgType::reject: {
      JoinReject m;
      m.code = r.u16("code");
      m.reason = r.str("reason");
      r.end();
      return m;
    }
  }
  throw Malformed("unknown seed message type " + std::to_string(static_cast<int>(type)));
}

// Checks the header; returns the body length.
std::uint32_t check_header(const std::uint8_t* p, std::uint32_t limit) {
  if (std::memcmp(p, kMagic, 4) != 0) throw Malformed("not a nexar seed message (bad magic)");
  if (p[4] != seed_protocol_version)
    throw Malformed("seed protocol version " + std::to_string(p[4]) + ", expected " +
                    std::to_string(seed_protocol_version));
  if (p[5] < 1 || p[5] > 5) throw Malformed("unknown seed message type " + std::to_string(p[5]));
  if (p[6] != 0 || p[7] != 0) throw Malformed("seed message reserved bytes are not zero");
  const std::uint32_t len = static_cast<std::uint32_t>(p[8]) | static_cast<std::uint32_t>(p[9]) << 8 |
                            static_cast<std::uint32_t>(p[10]) << 16 |
                            static_cast<std::uint32_t>(p[11]) << 24;
  if (len > limit)
    throw Malformed("seed message body of " + std::to_string(len) + " bytes exceeds limit " +
                    std::to_string(limit));
  return len;
}

}  // namespace

std::array<std::uint8_t, seed_header_size> encode_seed_header(SeedMsgType type,
                                                              std::uint32_t body_size) noexcept {
  std::array<std::uint8_t, seed_header_size> h{};
  std::copy(kMagic, kMagic + 4, h.begin());
  h[4] = seed_protocol_version;
  h[5] = static_cast<std::uint8_t>(type);
  // h[6], h[7]: reserved, zero
  for (int i = 0; i < 4; ++i)
    h[8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(body_size >> (8 * i));
  return h;
}

std::vector<std::uint8_t> encode(const SeedHello& m) {
  return encode_as(SeedMsgType::hello, m, [](auto& w, const SeedHello& h) {
    w.bytes(h.proof.data(), h.proof.size());
    w.str(h.cluster);
  });
}

std::vector<std::uint8_t> encode(const JoinRequest& m) {
  return encode_as(SeedMsgType::join, m, [](auto& w, const JoinRequest& r) {
    w.bytes(r.proof.data(), r.proof.size());
    w.i32(r.rank);
    w.i32(r.world);
    w.str(r.advertise);
    w.u16(r.port);
    w.str(r.node);
    w.str(r.host);
    w.str(r.csr_pem);
  });
}

std::vector<std::uint8_t> encode(const JoinAccept& m) {
  if (m.keys.size() != m.members.size())
    throw std::invalid_argument("seed accept with " + std::to_string(m.keys.size()) + " relay keys for " +
                                std::to_string(m.members.size()) + " members");
  return encode_as(SeedMsgType::accept, m, [](auto& w, const JoinAccept& a) {
    w.i32(a.rank);
    w.u16(a.flags);
    w.str(a.ca_pem);
    w.str(a.cert_pem);
    w.u32(static_cast<std::uint32_t>(a.members.size()));  // fits: the body size did
    for (const auto& mem : a.members) put_member(w, mem);
    for (const auto& k : a.keys) w.bytes(k.data(), k.size());  // one per member: checked above
  });
}

std::vector<std::uint8_t> encode(const Announce& m) {
  return encode_as(SeedMsgType::announce, m, [](auto& w, const Announce& a) {
    w.i32(a.rank);
    put_member(w, a.member);
    w.bytes(a.key.data(), a.key.size());
  });
}

std::vector<std::uint8_t> encode(const JoinReject& m) {
  return encode_as(SeedMsgType::reject, m, [](auto& w, const JoinReject& r) {
    w.u16(r.code);
    w.str(r.reason);
  });
}

std::optional<SeedMessage> decode_seed_message(const std::uint8_t* data, std::size_t len,
                                               std::uint32_t limit, std::string& error) {
  try {
    if (len < seed_header_size) throw Malformed("seed message shorter than its header");
    const std::uint32_t body = check_header(data, limit);
    if (len - seed_header_size != body)
      throw Malformed("seed message body is " + std::to_string(len - seed_header_size) +
                      " bytes, header says " + std::to_string(body));
    Reader r(data + seed_header_size, body);
    return decode_body(static_cast<SeedMsgType>(data[5]), r);
  } catch (const Malformed& e) {
    error = e.what();
    return std::nullopt;
  }
}

bool SeedMessageReader::feed(const std::uint8_t* data, std::size_t len, std::vector<SeedMessage>& out) {
  if (!error_.empty()) return false;
  buf_.insert(buf_.end(), data, data + len);
  for (;;) {
    if (buf_.size() < seed_header_size) return true;
    std::uint32_t body = 0;
    try {
      body = check_header(buf_.data(), limit_);
    } catch (const Malformed& e) {
      error_ = e.what();
      return false;
    }
    const std::size_t total = seed_header_size + body;
    if (buf_.size() < total) return true;
    auto m = decode_seed_message(buf_.data(), total, limit_, error_);
    if (!m) return false;
    out.push_back(std::move(*m));
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(total));
  }
}

}  // namespace nexar::wire
