// Tests of the seed protocol codec (src/wire/seed_message.*): golden bytes, round trips,
// truncated, oversized and malformed messages, the elastic additions (accept and member
// flags, announcements), the relay keys of accepts and announcements, and the incremental
// SeedMessageReader.
#include "wire/seed_message.hpp"

#include <gtest/gtest.h>

#include "support.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace nexar::wire {
namespace {

using nexar::testing::contains;

using SeedBytes = std::vector<std::uint8_t>;

Proof counting_proof(std::uint8_t first) {
  Proof p{};
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(first + i);
  return p;
}

// One message of every type, with contents that catch swapped, truncated or mis-sized
// fields: distinct proofs, embedded NUL and non-ASCII bytes, negative and extreme integers.
SeedHello sample_hello() {
  SeedHello m;
  m.proof = counting_proof(0x10);
  m.cluster = std::string("cluster-\0-\xc3\xa9t\xc3\xa9", 16);
  return m;
}

JoinRequest sample_request() {
  JoinRequest m;
  m.proof = counting_proof(0xe0);  // wraps around through 0xff
  m.rank = -1;
  m.world = 0x7fffffff;
  m.advertise = "fd00::1";
  m.port = 65535;
  m.node = "host-1234-abcdef01";
  m.host = "host.example";
  m.csr_pem = "-----BEGIN CERTIFICATE REQUEST-----\n" + std::string(1500, 'Q') +
              "\n-----END CERTIFICATE REQUEST-----\n";
  return m;
}

// A key whose bytes name the member it belongs to (never all zero).
RelayKey sample_key(std::size_t member) {
  RelayKey k{};
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint8_t>(0x80 + member * 7 + i);
  return k;
}

// One key per member, zero for `rank`'s own entry, as a seed sends them.
void give_keys(JoinAccept& m) {
  m.keys.clear();
  for (std::size_t i = 0; i < m.members.size(); ++i)
    m.keys.push_back(static_cast<std::int32_t>(i) == m.rank ? RelayKey{} : sample_key(i));
}

JoinAccept sample_accept(std::size_t members = 5, std::int32_t rank = -1) {
  JoinAccept m;
  m.rank = rank >= 0 ? rank : static_cast<std::int32_t>(members - 1);
  m.flags = accept_elastic | accept_late;
  m.ca_pem = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
  m.cert_pem = std::string("cert\0with\0nuls", 14);
  for (std::size_t i = 0; i < members; ++i)
    m.members.push_back({"node-" + std::to_string(i),
                         i % 2 ? "[fd00::" + std::to_string(i) + "]:29400"
                               : "10.0.0." + std::to_string(i) + ":" + std::to_string(1000 + i),
                         i % 3 == 2});  // some joined late
  give_keys(m);
  return m;
}

Announce sample_announce() {
  Announce m;
  m.rank = 0x01020304;
  m.member = {"joiner-\xc3\xa9-7", "[fd00::7]:65535", true};
  m.key = sample_key(9);
  return m;
}

JoinReject sample_reject() {
  JoinReject m;
  m.code = 0xbeef;
  m.reason = "rank 3 is already taken by node-7 (10.0.0.7:1007)";
  return m;
}

void expect_same(const SeedHello& a, const SeedHello& b) {
  EXPECT_EQ(a.proof, b.proof);
  EXPECT_EQ(a.cluster, b.cluster);
}
void expect_same(const JoinRequest& a, const JoinRequest& b) {
  EXPECT_EQ(a.proof, b.proof);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world, b.world);
  EXPECT_EQ(a.advertise, b.advertise);
  EXPECT_EQ(a.port, b.port);
  EXPECT_EQ(a.node, b.node);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.csr_pem, b.csr_pem);
}
void expect_same(const Member& a, const Member& b, std::size_t i = 0) {
  EXPECT_EQ(a.node, b.node) << "member " << i;
  EXPECT_EQ(a.addr, b.addr) << "member " << i;
  EXPECT_EQ(a.late, b.late) << "member " << i;
}
void expect_same(const JoinAccept& a, const JoinAccept& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.flags, b.flags);
  EXPECT_EQ(a.ca_pem, b.ca_pem);
  EXPECT_EQ(a.cert_pem, b.cert_pem);
  ASSERT_EQ(a.members.size(), b.members.size());
  for (std::size_t i = 0; i < a.members.size(); ++i) expect_same(a.members[i], b.members[i], i);
  EXPECT_EQ(a.keys, b.keys);
}
void expect_same(const Announce& a, const Announce& b) {
  EXPECT_EQ(a.rank, b.rank);
  expect_same(a.member, b.member);
  EXPECT_EQ(a.key, b.key);
}
void expect_same(const JoinReject& a, const JoinReject& b) {
  EXPECT_EQ(a.code, b.code);
  EXPECT_EQ(a.reason, b.reason);
}

// Decodes `bytes` (which must be valid) as a T and compares it with `want`.
template <class T>
void expect_decodes_to(const SeedBytes& bytes, const T& want,
                       std::uint32_t limit = max_seed_reply) {
  std::string err;
  std::optional<SeedMessage> m = decode_seed_message(bytes.data(), bytes.size(), limit, err);
  ASSERT_TRUE(m.has_value()) << err;
  EXPECT_TRUE(err.empty()) << err;
  const T* got = std::get_if<T>(&*m);
  ASSERT_NE(got, nullptr) << "decoded as variant index " << m->index();
  expect_same(*got, want);
}

// Expects decode_seed_message to refuse `bytes`; returns its error text.
std::string seed_decode_error(const SeedBytes& bytes, std::uint32_t limit = max_seed_reply) {
  std::string err;
  std::optional<SeedMessage> m = decode_seed_message(bytes.data(), bytes.size(), limit, err);
  EXPECT_FALSE(m.has_value()) << "accepted " << bytes.size() << " bytes";
  EXPECT_FALSE(err.empty());
  return err;
}

void put_u32(SeedBytes& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    b[at + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(v >> (8 * i));
}
void append_u32(SeedBytes& b, std::uint32_t v) {
  b.resize(b.size() + 4);
  put_u32(b, b.size() - 4, v);
}
void append_u16(SeedBytes& b, std::uint16_t v) {
  b.push_back(static_cast<std::uint8_t>(v));
  b.push_back(static_cast<std::uint8_t>(v >> 8));
}
void append_str(SeedBytes& b, const std::string& s) {
  append_u32(b, static_cast<std::uint32_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}
// A header for `type` and the given body, followed by it.
SeedBytes seed_frame(SeedMsgType type, const SeedBytes& body) {
  const auto header = encode_seed_header(type, static_cast<std::uint32_t>(body.size()));
  // Sized once: growing a vector built from 12 bytes trips GCC 12's -O3 -Warray-bounds.
  SeedBytes b(header.size() + body.size());
  std::copy(header.begin(), header.end(), b.begin());
  std::copy(body.begin(), body.end(), b.begin() + static_cast<std::ptrdiff_t>(header.size()));
  return b;
}

// Feeds `stream` to a reader in pieces of the sizes `next_piece` returns; returns whether
// every feed succeeded and collects the messages.
template <class Next>
bool feed_in_pieces(SeedMessageReader& r, const SeedBytes& stream, Next next_piece,
                    std::vector<SeedMessage>& out) {
  std::size_t pos = 0;
  while (pos < stream.size()) {
    const std::size_t n = std::min(stream.size() - pos, std::max<std::size_t>(1, next_piece()));
    if (!r.feed(stream.data() + pos, n, out)) return false;
    pos += n;
  }
  return true;
}

std::vector<SeedBytes> all_samples() {
  return {encode(sample_hello()), encode(sample_request()), encode(sample_accept()),
          encode(sample_reject()), encode(sample_announce())};
}

TEST(SeedMessage, RoundTripEveryType) {
  expect_decodes_to(encode(sample_hello()), sample_hello());
  expect_decodes_to(encode(sample_request()), sample_request(), max_join_request);
  expect_decodes_to(encode(sample_accept()), sample_accept());
  expect_decodes_to(encode(sample_reject()), sample_reject());
  expect_decodes_to(encode(sample_announce()), sample_announce());

  // Empty strings, a requested rank, and extreme integers.
  SeedHello h;
  expect_decodes_to(encode(h), h);
  JoinRequest q;
  q.rank = 2147483647;
  q.world = -2147483647 - 1;
  expect_decodes_to(encode(q), q);
  JoinAccept one = sample_accept(1);
  one.ca_pem.clear();
  one.cert_pem.clear();
  one.flags = 0;
  one.members[0] = {"", "", false};
  ASSERT_EQ(one.keys.size(), 1u);  // a world of one: only its own (zero) key
  expect_decodes_to(encode(one), one);
  Announce an;
  expect_decodes_to(encode(an), an);
  JoinReject z;
  expect_decodes_to(encode(z), z);

  // A large member list and long strings survive too.
  JoinAccept big = sample_accept(3000, 1234);
  big.cert_pem = std::string(100000, 'c');
  expect_decodes_to(encode(big), big);

  // The header names the type and the exact body length.
  for (const SeedBytes& b : all_samples()) {
    ASSERT_GE(b.size(), seed_header_size);
    const std::uint32_t len =
        static_cast<std::uint32_t>(b[8]) | static_cast<std::uint32_t>(b[9]) << 8 |
        static_cast<std::uint32_t>(b[10]) << 16 | static_cast<std::uint32_t>(b[11]) << 24;
    EXPECT_EQ(len, b.size() - seed_header_size);
  }
  EXPECT_EQ(encode(sample_hello())[5], static_cast<std::uint8_t>(SeedMsgType::hello));
  EXPECT_EQ(encode(sample_request())[5], static_cast<std::uint8_t>(SeedMsgType::join));
  EXPECT_EQ(encode(sample_accept())[5], static_cast<std::uint8_t>(SeedMsgType::accept));
  EXPECT_EQ(encode(sample_reject())[5], static_cast<std::uint8_t>(SeedMsgType::reject));
  EXPECT_EQ(encode(sample_announce())[5], static_cast<std::uint8_t>(SeedMsgType::announce));
}

TEST(SeedMessage, GoldenBytes) {
  // Hand-written from the layout: "NXSD", version 2, type, two zero bytes, body length (u32
  // LE), then the fields little-endian, strings as u32 LE length + bytes, keys 32 raw bytes.
  JoinReject rej;
  rej.code = 13;  // Errc::rejected
  rej.reason = "no";
  const SeedBytes want_reject = {'N', 'X', 'S', 'D', 2,   4,  0, 0, 8, 0, 0, 0,  // header
                                 13,  0,                                         // code
                                 2,   0,   0,   0,   'n', 'o'};                  // reason
  EXPECT_EQ(encode(rej), want_reject);

  JoinAccept acc;
  acc.rank = 1;
  acc.flags = accept_elastic | accept_late;
  acc.ca_pem = "C";
  acc.cert_pem = "";
  acc.members = {{"a", "1.2.3.4:5", false}, {"b", "[::1]:6", true}};
  acc.keys = {sample_key(0), RelayKey{}};  // rank 0's; rank 1 has no key of its own
  SeedBytes want_accept = {
      'N', 'X', 'S', 'D', 2,   3,   0,   0,   121, 0,   0,   0,         // header, body 121 bytes
      1,   0,   0,   0,                                                 // rank 1
      3,   0,                                                           // flags elastic|late
      1,   0,   0,   0,   'C',                                          // ca
      0,   0,   0,   0,                                                 // cert (empty)
      2,   0,   0,   0,                                                 // 2 members
      1,   0,   0,   0,   'a',                                          // member 0 node
      9,   0,   0,   0,   '1', '.', '2', '.', '3', '.', '4', ':', '5',  // member 0 address
      0,   0,                                                           // member 0 flags
      1,   0,   0,   0,   'b',                                          // member 1 node
      7,   0,   0,   0,   '[', ':', ':', '1', ']', ':', '6',            // member 1 address
      1,   0};                                                          // member 1: late
  for (std::uint8_t i = 0; i < 32; ++i) want_accept.push_back(static_cast<std::uint8_t>(0x80 + i));  // key 0
  for (std::uint8_t i = 0; i < 32; ++i) want_accept.push_back(0);  // key 1: its own, zero
  EXPECT_EQ(encode(acc), want_accept);

  Announce ann;
  ann.rank = 0x0105;
  ann.member = {"j", "[::1]:7", true};
  ann.key = sample_key(1);
  SeedBytes want_announce = {
      'N', 'X', 'S', 'D', 2,   5,   0,   0,   54,  0,   0,   0,  // header, body 54 bytes
      5,   1,   0,   0,                                          // rank 261
      1,   0,   0,   0,   'j',                                   // node
      7,   0,   0,   0,   '[', ':', ':', '1', ']', ':', '7',     // address
      1,   0};                                                   // flags: late
  for (std::uint8_t i = 0; i < 32; ++i) want_announce.push_back(static_cast<std::uint8_t>(0x87 + i));  // key
  EXPECT_EQ(encode(ann), want_announce);

  JoinRequest req;
  req.proof = counting_proof(0);
  req.rank = -1;
  req.world = 258;
  req.port = 0x1234;
  req.node = "n";
  SeedBytes want_req = {'N', 'X', 'S', 'D', 2, 2, 0, 0, 59, 0, 0, 0};  // body 59 bytes
  for (std::uint8_t i = 0; i < 32; ++i) want_req.push_back(i);         // proof
  const SeedBytes rest = {0xff, 0xff, 0xff, 0xff,                      // rank -1
                          0x02, 0x01, 0x00, 0x00,                      // world 258
                          0,    0,    0,    0,                         // advertise ""
                          0x34, 0x12,                                  // port
                          1,    0,    0,    0,    'n',                 // node
                          0,    0,    0,    0,                         // host ""
                          0,    0,    0,    0};                        // csr ""
  want_req.insert(want_req.end(), rest.begin(), rest.end());
  EXPECT_EQ(encode(req), want_req);

  // And the hand-written bytes decode back.
  expect_decodes_to(want_reject, rej);
  expect_decodes_to(want_accept, acc);
  expect_decodes_to(want_req, req);
  expect_decodes_to(want_announce, ann);
}

TEST(SeedMessage, EveryTruncationFailsCleanly) {
  for (const SeedBytes& full : all_samples()) {
    SCOPED_TRACE("type " + std::to_string(full[5]));
    for (std::size_t len = 0; len < full.size(); ++len) {
      // As is: shorter than the header, or a body shorter than the header says.
      SeedBytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      const std::string e1 = seed_decode_error(cut);
      if (len < seed_header_size)
        EXPECT_TRUE(contains(e1, "header")) << e1;
      else
        EXPECT_TRUE(contains(e1, "header says")) << e1;

      // With the header patched to the shorter body, the field decoder itself must notice.
      if (len >= seed_header_size) {
        put_u32(cut, 8, static_cast<std::uint32_t>(len - seed_header_size));
        const std::string e2 = seed_decode_error(cut);
        EXPECT_TRUE(contains(e2, "truncated") || contains(e2, "members") || contains(e2, "rank"))
            << "at " << len << ": " << e2;
      }

      // A reader given the prefix just waits for the rest (no message, no error).
      SeedMessageReader r(max_seed_reply);
      std::vector<SeedMessage> out;
      SeedBytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_TRUE(r.feed(prefix.data(), prefix.size(), out)) << r.error();
      EXPECT_TRUE(out.empty());
      // ... and completes it when the rest comes.
      EXPECT_TRUE(r.feed(full.data() + len, full.size() - len, out)) << r.error();
      EXPECT_EQ(out.size(), 1u);
    }
  }
}

TEST(SeedMessage, BadHeaders) {
  const SeedBytes good = encode(sample_reject());
  auto with = [&](std::size_t at, std::uint8_t v) {
    SeedBytes b = good;
    b[at] = v;
    return b;
  };
  // Magic.
  for (std::size_t i = 0; i < 4; ++i) {
    const std::string e = seed_decode_error(with(i, static_cast<std::uint8_t>(good[i] ^ 0x20)));
    EXPECT_TRUE(contains(e, "magic")) << e;
  }
  // Version: 1 (before relay keys) is as foreign as any other.
  for (std::uint8_t v : {0, 1, 3, 255}) {
    const std::string e = seed_decode_error(with(4, v));
    EXPECT_TRUE(contains(e, "version " + std::to_string(v))) << e;
  }
  // Type.
  for (std::uint8_t t : {0, 6, 7, 255}) {
    const std::string e = seed_decode_error(with(5, t));
    EXPECT_TRUE(contains(e, "type " + std::to_string(t))) << e;
  }
  // Reserved bytes.
  for (std::size_t at : {std::size_t{6}, std::size_t{7}}) {
    const std::string e = seed_decode_error(with(at, 1));
    EXPECT_TRUE(contains(e, "reserved")) << e;
  }
  // The reader refuses the same headers as soon as it has them, and stays failed.
  for (const SeedBytes& b : {with(0, 'X'), with(4, 9), with(5, 0), with(7, 0x80)}) {
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(r.feed(b.data(), seed_header_size, out));
    EXPECT_FALSE(r.error().empty());
    EXPECT_TRUE(out.empty());
    EXPECT_FALSE(r.feed(good.data(), good.size(), out)) << "a failed reader accepted more";
    EXPECT_TRUE(out.empty());
  }
}

TEST(SeedMessage, BodyOverLimitRefusedFromHeader) {
  // A header claiming 4 GiB - 1 of body: refused at once, by both decoders, with only the
  // header in hand.
  const auto header = encode_seed_header(SeedMsgType::join, 0xffffffffu);
  SeedBytes huge(header.begin(), header.end());
  const std::string e = seed_decode_error(huge, max_join_request);
  EXPECT_TRUE(contains(e, "4294967295")) << e;
  EXPECT_TRUE(contains(e, std::to_string(max_join_request))) << e;
  for (std::uint32_t limit : {max_join_request, max_seed_reply}) {
    SeedMessageReader r(limit);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(r.feed(huge.data(), huge.size(), out)) << "reader waits for a 4 GiB body";
    EXPECT_TRUE(contains(r.error(), "exceeds limit")) << r.error();
  }
  // Byte by byte: the refusal comes with the 12th byte, not later.
  {
    SeedMessageReader r(max_join_request);
    std::vector<SeedMessage> out;
    for (std::size_t i = 0; i + 1 < huge.size(); ++i) ASSERT_TRUE(r.feed(&huge[i], 1, out));
    EXPECT_FALSE(r.feed(&huge.back(), 1, out));
  }
  // The limit is inclusive: a body of exactly `limit` bytes is fine, one more is not.
  JoinReject rej;
  rej.reason = std::string(1000, 'r');
  const SeedBytes b = encode(rej);
  const auto body = static_cast<std::uint32_t>(b.size() - seed_header_size);
  expect_decodes_to(b, rej, body);
  const std::string e2 = seed_decode_error(b, body - 1);
  EXPECT_TRUE(contains(e2, "exceeds limit")) << e2;
  SeedMessageReader tight(body - 1);
  std::vector<SeedMessage> out;
  EXPECT_FALSE(tight.feed(b.data(), seed_header_size, out));
  // Joiners accept a large member list that a seed would refuse as a join request.
  const SeedBytes big = encode(sample_accept(20000));
  ASSERT_GT(big.size(), max_join_request + seed_header_size);
  seed_decode_error(big, max_join_request);
  expect_decodes_to(big, sample_accept(20000), max_seed_reply);
}

TEST(SeedMessage, TrailingBytes) {
  for (const SeedBytes& full : all_samples()) {
    SCOPED_TRACE("type " + std::to_string(full[5]));
    // Inside the body (the header counts them): the field decoder refuses them.
    for (std::size_t extra : {1u, 3u, 100u}) {
      SeedBytes b = full;
      b.insert(b.end(), extra, 0);
      put_u32(b, 8, static_cast<std::uint32_t>(b.size() - seed_header_size));
      const std::string e = seed_decode_error(b);
      EXPECT_TRUE(contains(e, std::to_string(extra) + " trailing bytes")) << e;
    }
    // After the body (the header does not count them): not one message.
    SeedBytes b = full;
    b.push_back(0);
    const std::string e = seed_decode_error(b);
    EXPECT_TRUE(contains(e, "header says")) << e;
  }
}

TEST(SeedMessage, AcceptValidation) {
  auto accept_body = [](std::int32_t rank, std::uint32_t count, std::size_t members_present,
                        std::uint16_t flags = 0, std::uint16_t member_flags = 0) {
    SeedBytes body;
    append_u32(body, static_cast<std::uint32_t>(rank));
    append_u16(body, flags);
    append_str(body, "ca");
    append_str(body, "cert");
    append_u32(body, count);
    for (std::size_t i = 0; i < members_present; ++i) {
      const std::string index = std::to_string(i);  // "n" + temporary: GCC 12 -O3 -Wrestrict
      append_str(body, "n" + index);
      append_str(body, "10.0.0.1:" + std::to_string(i + 1));
      append_u16(body, i == members_present - 1 ? member_flags : 0);
    }
    for (std::size_t i = 0; i < members_present; ++i) {  // keys; the own rank's zero
      const RelayKey k = static_cast<std::int32_t>(i) == rank ? RelayKey{} : sample_key(i);
      body.insert(body.end(), k.begin(), k.end());
    }
    return seed_frame(SeedMsgType::accept, body);
  };
  // Sanity: the builder makes valid messages.
  {
    std::string err;
    ASSERT_TRUE(decode_seed_message(accept_body(2, 3, 3).data(), accept_body(2, 3, 3).size(),
                                    max_seed_reply, err))
        << err;
  }
  // rank >= members, negative rank.
  for (std::int32_t rank : {3, 4, 1000, 2147483647, -1, -2147483647 - 1}) {
    const std::string e = seed_decode_error(accept_body(rank, 3, 3));
    EXPECT_TRUE(contains(e, "rank " + std::to_string(rank))) << e;
  }
  // No members.
  {
    const std::string e = seed_decode_error(accept_body(0, 0, 0));
    EXPECT_TRUE(contains(e, "0 members")) << e;
  }
  // Counts larger than the body can hold: refused before anything is reserved for them.
  for (std::uint32_t count : {4u, 1000u, 1u << 20, (1u << 20) + 1, 0xffffffffu}) {
    const std::string e = seed_decode_error(accept_body(0, count, 3));
    EXPECT_TRUE(contains(e, "member")) << count << ": " << e;
  }
  // The encoder checks nothing, but the decoder does: encode(rank out of range) fails to decode.
  JoinAccept bad = sample_accept(2);
  bad.rank = 2;
  seed_decode_error(encode(bad));
  bad.members.clear();
  bad.keys.clear();
  bad.rank = 0;
  seed_decode_error(encode(bad));

  // Flags: the two known accept flags in every combination, each member's "late" bit;
  // any other bit is refused, so a newer seed cannot be misread by this joiner.
  for (std::uint16_t f : {0, 1, 2, 3}) {
    for (std::uint16_t mf : {0, 1}) {
      const SeedBytes b = accept_body(1, 3, 3, f, mf);
      std::string err;
      const auto m = decode_seed_message(b.data(), b.size(), max_seed_reply, err);
      ASSERT_TRUE(m) << err;
      const auto& a = std::get<JoinAccept>(*m);
      EXPECT_EQ(a.flags, f);
      EXPECT_FALSE(a.members[0].late);
      EXPECT_EQ(a.members[2].late, mf == 1);
    }
  }
  for (std::uint16_t f : {4, 8, 0x100, 0x8000, 0xffff, 0x8003}) {
    const std::string e = seed_decode_error(accept_body(0, 3, 3, f));
    EXPECT_TRUE(contains(e, "unknown flags")) << f << ": " << e;
  }
  for (std::uint16_t mf : {2, 3, 0x80, 0x8000, 0xffff}) {
    const std::string e = seed_decode_error(accept_body(0, 3, 3, 0, mf));
    EXPECT_TRUE(contains(e, "unknown flags") && contains(e, "member")) << mf << ": " << e;
  }
  // The encoder writes what it is given; the decoder still refuses unknown bits.
  JoinAccept odd = sample_accept(2);
  odd.flags = 0x10;
  EXPECT_TRUE(contains(seed_decode_error(encode(odd)), "unknown flags"));
}

TEST(SeedMessage, AcceptRelayKeys) {
  // One key per member, indexed by world rank, each exactly where the member's rank says.
  const JoinAccept acc = sample_accept(4, 2);
  const SeedBytes b = encode(acc);
  const std::size_t keys_at = b.size() - 4 * 32;
  for (std::size_t i = 0; i < 4; ++i) {
    const RelayKey want = i == 2 ? RelayKey{} : sample_key(i);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), b.begin() + static_cast<std::ptrdiff_t>(keys_at + 32 * i)))
        << "key " << i;
  }
  expect_decodes_to(b, acc);

  // A key for the node's own rank: refused, wherever that rank is, whichever byte is set.
  for (std::int32_t rank : {0, 2, 3}) {
    for (std::size_t byte : {std::size_t{0}, std::size_t{17}, std::size_t{31}}) {
      SeedBytes bad = encode(sample_accept(4, rank));
      bad[keys_at + 32 * static_cast<std::size_t>(rank) + byte] = 0x01;
      const std::string e = seed_decode_error(bad);
      EXPECT_TRUE(contains(e, "own rank " + std::to_string(rank))) << e;
    }
  }
  // Zero keys for the others are the seed's business (it never sends one): not refused here.

  // Version 1's layout (no keys), and keys cut short: truncated, never read past the body.
  {
    SeedBytes v1 = encode(acc);
    v1.resize(keys_at);
    put_u32(v1, 8, static_cast<std::uint32_t>(v1.size() - seed_header_size));
    const std::string e = seed_decode_error(v1);
    EXPECT_TRUE(contains(e, "truncated")) << e;
    for (std::size_t missing : {std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33}}) {
      SeedBytes cut = encode(acc);
      cut.resize(cut.size() - missing);
      put_u32(cut, 8, static_cast<std::uint32_t>(cut.size() - seed_header_size));
      const std::string e2 = seed_decode_error(cut);
      EXPECT_TRUE(contains(e2, "truncated") && contains(e2, "relay keys")) << missing << ": " << e2;
    }
    // A key too many: trailing bytes.
    SeedBytes extra = encode(acc);
    extra.insert(extra.end(), 32, 0x55);
    put_u32(extra, 8, static_cast<std::uint32_t>(extra.size() - seed_header_size));
    EXPECT_TRUE(contains(seed_decode_error(extra), "32 trailing bytes"));
  }

  // The encoder refuses a key list that does not match the members (it could not be decoded).
  for (std::size_t keys : {std::size_t{0}, std::size_t{3}, std::size_t{5}}) {
    JoinAccept wrong = sample_accept(4, 0);
    wrong.keys.resize(keys);
    EXPECT_THROW(encode(wrong), std::invalid_argument) << keys << " keys";
  }
}

TEST(SeedMessage, AnnounceValidation) {
  auto announce_body = [](std::int32_t rank, std::uint16_t flags) {
    SeedBytes body;
    append_u32(body, static_cast<std::uint32_t>(rank));
    append_str(body, "joiner");
    append_str(body, "10.0.0.9:9");
    append_u16(body, flags);
    const RelayKey k = sample_key(3);
    body.insert(body.end(), k.begin(), k.end());
    return seed_frame(SeedMsgType::announce, body);
  };
  // Every non-negative rank and both values of the late bit.
  for (std::int32_t rank : {0, 1, 65535, 65536, 2147483647}) {
    for (std::uint16_t flags : {0, 1}) {
      const SeedBytes b = announce_body(rank, flags);
      std::string err;
      const auto m = decode_seed_message(b.data(), b.size(), max_seed_reply, err);
      ASSERT_TRUE(m) << err;
      const auto& a = std::get<Announce>(*m);
      EXPECT_EQ(a.rank, rank);
      EXPECT_EQ(a.member.node, "joiner");
      EXPECT_EQ(a.member.addr, "10.0.0.9:9");
      EXPECT_EQ(a.member.late, flags == 1);
      EXPECT_EQ(a.key, sample_key(3));
    }
  }
  for (std::int32_t rank : {-1, -2, -2147483647 - 1}) {
    const std::string e = seed_decode_error(announce_body(rank, 1));
    EXPECT_TRUE(contains(e, "announcement") && contains(e, std::to_string(rank))) << e;
  }
  for (std::uint16_t flags : {2, 0x8001, 0xffff}) {
    const std::string e = seed_decode_error(announce_body(3, flags));
    EXPECT_TRUE(contains(e, "unknown flags")) << e;
  }
  // A member without its flags (the layout before elastic membership) is truncated.
  SeedBytes old;
  append_u32(old, 3);
  append_str(old, "joiner");
  append_str(old, "10.0.0.9:9");
  const std::string e = seed_decode_error(seed_frame(SeedMsgType::announce, old));
  EXPECT_TRUE(contains(e, "truncated") && contains(e, "member flags")) << e;
  // Version 1's announcement (no key), and a key cut short, are truncated too.
  for (std::size_t missing : {std::size_t{32}, std::size_t{1}, std::size_t{31}}) {
    SeedBytes cut = announce_body(3, 1);
    cut.resize(cut.size() - missing);
    put_u32(cut, 8, static_cast<std::uint32_t>(cut.size() - seed_header_size));
    const std::string e2 = seed_decode_error(cut);
    EXPECT_TRUE(contains(e2, "truncated") && contains(e2, "relay key")) << missing << ": " << e2;
  }
  // An announcement is as large as a join request at most: the seed's own limit applies.
  const SeedBytes b = encode(sample_announce());
  expect_decodes_to(b, sample_announce(), max_join_request);
}

TEST(SeedMessage, StringLengthsBeyondBody) {
  // A string length field pointing past the body, in each string field of a reject and a
  // hello, including lengths near 2^32 that would wrap a careless bounds check.
  for (std::uint32_t len : {5u, 1000u, 0x7fffffffu, 0xfffffff0u, 0xffffffffu}) {
    SeedBytes body = {13, 0};
    append_u32(body, len);
    body.push_back('x');
    const std::string e = seed_decode_error(seed_frame(SeedMsgType::reject, body));
    EXPECT_TRUE(contains(e, "truncated") && contains(e, "reason")) << e;

    SeedBytes hb(32, 0xaa);
    append_u32(hb, len);
    const std::string e2 = seed_decode_error(seed_frame(SeedMsgType::hello, hb));
    EXPECT_TRUE(contains(e2, "truncated") && contains(e2, "cluster")) << e2;
  }
}

TEST(SeedMessage, ReaderPiecewiseYieldsSameMessages) {
  // Every message type, twice, back to back in one stream.
  SeedBytes stream;
  for (int round = 0; round < 2; ++round)
    for (const SeedBytes& b : all_samples()) stream.insert(stream.end(), b.begin(), b.end());

  auto check = [](const std::vector<SeedMessage>& out) {
    ASSERT_EQ(out.size(), 10u);
    for (int round = 0; round < 2; ++round) {
      const std::size_t o = static_cast<std::size_t>(round) * 5;
      ASSERT_NE(std::get_if<SeedHello>(&out[o]), nullptr);
      expect_same(std::get<SeedHello>(out[o]), sample_hello());
      ASSERT_NE(std::get_if<JoinRequest>(&out[o + 1]), nullptr);
      expect_same(std::get<JoinRequest>(out[o + 1]), sample_request());
      ASSERT_NE(std::get_if<JoinAccept>(&out[o + 2]), nullptr);
      expect_same(std::get<JoinAccept>(out[o + 2]), sample_accept());
      ASSERT_NE(std::get_if<JoinReject>(&out[o + 3]), nullptr);
      expect_same(std::get<JoinReject>(out[o + 3]), sample_reject());
      ASSERT_NE(std::get_if<Announce>(&out[o + 4]), nullptr);
      expect_same(std::get<Announce>(out[o + 4]), sample_announce());
    }
  };
  {  // one byte at a time
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(feed_in_pieces(
        r, stream, [] { return std::size_t{1}; }, out))
        << r.error();
    check(out);
  }
  {  // all at once
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(r.feed(stream.data(), stream.size(), out)) << r.error();
    check(out);
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {  // random pieces, some crossing message bounds
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    ASSERT_TRUE(feed_in_pieces(
        r, stream, [&] { return std::size_t{1} + rng() % 700; }, out))
        << r.error();
    check(out);
  }
  {  // an empty feed is harmless
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_TRUE(r.feed(stream.data(), 0, out));
    EXPECT_TRUE(out.empty());
  }
}

TEST(SeedMessage, ReaderStopsAtFirstBadMessage) {
  // A good message, then a malformed one (valid header, garbage body), then a good one:
  // the reader hands out the first, fails on the second, and never yields the third.
  const SeedBytes good = encode(sample_reject());
  SeedBytes bad = seed_frame(SeedMsgType::reject, SeedBytes{1, 2, 3});
  SeedBytes stream = good;
  stream.insert(stream.end(), bad.begin(), bad.end());
  stream.insert(stream.end(), good.begin(), good.end());
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, stream.size()}) {
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    EXPECT_FALSE(feed_in_pieces(
        r, stream, [&] { return piece; }, out));
    EXPECT_TRUE(contains(r.error(), "truncated")) << r.error();
    ASSERT_EQ(out.size(), 1u);
    expect_same(std::get<JoinReject>(out[0]), sample_reject());
    EXPECT_FALSE(r.feed(good.data(), good.size(), out));
    EXPECT_EQ(out.size(), 1u);
  }
}

TEST(SeedMessage, GarbageNeverCrashes) {
  // Random bytes behind a valid header of every type and random body length: only clean
  // errors or well-formed messages (run under ASan/UBSan).
  std::mt19937_64 rng(99);
  for (int round = 0; round < 4000; ++round) {
    SeedBytes body(rng() % 200);
    for (auto& x : body) x = static_cast<std::uint8_t>(rng());
    if (round % 4 == 0 && body.size() >= 4) body[body.size() - 4] = 0;  // small lengths
    const auto type = static_cast<std::uint8_t>(1 + round % 5);
    SeedBytes b = seed_frame(static_cast<SeedMsgType>(type), body);
    std::string err;
    std::optional<SeedMessage> m = decode_seed_message(b.data(), b.size(), max_seed_reply, err);
    if (m) {
      EXPECT_EQ(m->index() + 1, type);
    } else {
      EXPECT_FALSE(err.empty());
    }
    SeedMessageReader r(max_seed_reply);
    std::vector<SeedMessage> out;
    const bool ok = feed_in_pieces(
        r, b, [&] { return std::size_t{1} + rng() % 16; }, out);
    EXPECT_EQ(ok, m.has_value());
    EXPECT_EQ(out.size(), m ? 1u : 0u);
  }
}

}  // namespace
}  // namespace nexar::wire
