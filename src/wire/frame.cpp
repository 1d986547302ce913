// Wire format v1: encoding and validation of stream preambles and frame headers.
//
// Integers are assembled byte by byte so the encoding is little-endian whatever the host
// is, and so no struct layout or alignment ever leaks onto the wire.
#include "wire/frame.hpp"

#include "wire/bytes.hpp"

#include <string>

namespace nexar::wire {
namespace {

// "0x" followed by exactly `digits` lower-case hex digits; <format> is not available on
// every toolchain we build with, and fmt is not a dependency of this module's tests.
std::string hex(std::uint64_t v, int digits) {
  static constexpr char xd[] = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += xd[(v >> (4 * i)) & 0xfu];
  return s;
}

bool known_type(std::uint8_t t) noexcept {
  return t >= static_cast<std::uint8_t>(FrameType::hello) &&
         t <= static_cast<std::uint8_t>(FrameType::tcp_switch);
}

bool allowed_on(FrameType t, Lane lane) noexcept {
  switch (t) {
    case FrameType::hello:
    case FrameType::goodbye:
    case FrameType::heartbeat:
    case FrameType::failed:
    case FrameType::revoke:
    case FrameType::agree:
    case FrameType::decided:
    case FrameType::welcome:
    case FrameType::shm_offer:
    case FrameType::relay_ack:
    case FrameType::ports:
    case FrameType::tcp_offer:
      return lane == Lane::control;
    case FrameType::relay:
      return true;
    case FrameType::eager:
    case FrameType::rts:
    case FrameType::cts:
    case FrameType::rdata:
    case FrameType::shm_switch:
    case FrameType::tcp_switch:
      return lane == Lane::data || lane == Lane::bulk || lane == Lane::collective;
    case FrameType::rpc_request:
      return lane == Lane::rpc_request;
    case FrameType::rpc_response:
      return lane == Lane::rpc_response;
  }
  return false;
}

// Hello carries only a node name; a small cap keeps a hostile peer from making the
// receiver buffer much before the connection is even authenticated as part of the job.
constexpr std::uint64_t max_hello_payload = 1024;
// A failure notice's reason is a short text.
constexpr std::uint64_t max_failed_payload = 1024;

DecodeError length_too_big(std::uint64_t length, std::uint64_t limit) {
  return {"frame length " + std::to_string(length) + " exceeds limit " +
          std::to_string(limit)};
}

}  // namespace

const char* to_string(FrameType t) noexcept {
  switch (t) {
    case FrameType::hello: return "hello";
    case FrameType::goodbye: return "goodbye";
    case FrameType::eager: return "eager";
    case FrameType::rts: return "rts";
    case FrameType::cts: return "cts";
    case FrameType::rdata: return "rdata";
    case FrameType::rpc_request: return "rpc_request";
    case FrameType::rpc_response: return "rpc_response";
    case FrameType::heartbeat: return "heartbeat";
    case FrameType::failed: return "failed";
    case FrameType::revoke: return "revoke";
    case FrameType::agree: return "agree";
    case FrameType::decided: return "decided";
    case FrameType::welcome: return "welcome";
    case FrameType::shm_offer: return "shm_offer";
    case FrameType::shm_switch: return "shm_switch";
    case FrameType::relay: return "relay";
    case FrameType::relay_ack: return "relay_ack";
    case FrameType::ports: return "ports";
    case FrameType::tcp_offer: return "tcp_offer";
    case FrameType::tcp_switch: return "tcp_switch";
  }
  return "unknown";
}

const char* to_string(Lane l) noexcept {
  switch (l) {
    case Lane::control: return "control";
    case Lane::data: return "data";
    case Lane::rpc_request: return "rpc_request";
    case Lane::rpc_response: return "rpc_response";
    case Lane::bulk: return "bulk";
    case Lane::collective: return "collective";
  }
  return "unknown";
}

void encode_preamble(Lane lane, std::span<std::byte, preamble_size> out) noexcept {
  for (std::size_t i = 0; i < magic.size(); ++i) out[i] = magic[i];
  out[4] = static_cast<std::byte>(protocol_version);
  out[5] = static_cast<std::byte>(lane);
  out[6] = std::byte{0};
  out[7] = std::byte{0};
}

void encode_header(const FrameHeader& h, std::span<std::byte, header_size> out) noexcept {
  std::byte* p = out.data();
  p[0] = static_cast<std::byte>(h.type);
  p[1] = static_cast<std::byte>(h.flags);
  put_u16(p + 2, h.check);
  put_u32(p + 4, h.src);
  put_u64(p + 8, h.comm);
  put_u64(p + 16, h.tag);
  put_u64(p + 24, h.seq);
  put_u64(p + 32, h.length);
}

DecodeError decode_preamble(std::span<const std::byte, preamble_size> in, Lane& lane) {
  for (std::size_t i = 0; i < magic.size(); ++i) {
    if (in[i] != magic[i]) {
      return {"preamble magic " + hex(get_u32(in.data()), 8) +
              " is not \"NXAR\" (not a nexar stream)"};
    }
  }
  const auto version = std::to_integer<unsigned>(in[4]);
  if (version != protocol_version) {
    return {"preamble protocol version " + std::to_string(version) +
            " unsupported (expected " + std::to_string(protocol_version) + ")"};
  }
  const auto l = std::to_integer<unsigned>(in[5]);
  if (l >= static_cast<unsigned>(lane_count)) {
    return {"preamble lane " + std::to_string(l) + " unknown"};
  }
  const std::uint16_t reserved = get_u16(in.data() + 6);
  if (reserved != 0) {
    return {"preamble reserved bytes " + hex(reserved, 4) + " must be zero"};
  }
  lane = static_cast<Lane>(l);
  return {};
}

DecodeError decode_header(std::span<const std::byte, header_size> in, Lane lane,
                          std::uint64_t max_payload, FrameHeader& h) {
  const std::byte* p = in.data();
  const auto raw_type = std::to_integer<std::uint8_t>(p[0]);
  if (!known_type(raw_type)) return {"unknown frame type " + hex(raw_type, 2)};
  const auto type = static_cast<FrameType>(raw_type);
  const char* tname = to_string(type);

  // Only messages carry a call's fingerprint.
  const std::uint16_t check = get_u16(p + 2);
  if (check != 0 && type != FrameType::eager && type != FrameType::rts)
    return {"check " + hex(check, 4) + " must be zero for frame type " + tname};

  if (!allowed_on(type, lane)) {
    return {std::string("frame type ") + tname + " not allowed on lane " + to_string(lane)};
  }

  const auto flags = std::to_integer<std::uint8_t>(p[1]);
  switch (type) {
    case FrameType::rdata:
      if ((flags & ~flag_cancelled) != 0) {
        return {"flags " + hex(flags, 2) + " not allowed on frame type rdata"};
      }
      break;
    case FrameType::rpc_response:
      if (flags > static_cast<std::uint8_t>(RpcStatus::handler_failed)) {
        return {"flags " + hex(flags, 2) + " of frame type rpc_response is not an RpcStatus"};
      }
      break;
    default:
      if (flags != 0) {
        return {"flags " + hex(flags, 2) + " not allowed on frame type " + tname};
      }
      break;
  }

  const std::uint64_t length = get_u64(p + 32);
  const bool cancelled = type == FrameType::rdata && (flags & flag_cancelled) != 0;
  // rts has no payload but its length announces the message; every other type without a
  // payload must say 0.
  if (type != FrameType::rts && !has_payload(type, flags)) {
    if (length != 0) {
      return {"frame length " + std::to_string(length) + " must be 0 for frame type " +
              tname + (cancelled ? " with flag cancelled" : "")};
    }
  } else {
    // rts carries no payload but announces the size of the message that will follow as
    // rdata, so the same limit applies to it.
    if (length > max_payload) return length_too_big(length, max_payload);
    if (type == FrameType::hello && length > max_hello_payload) {
      return {length_too_big(length, max_hello_payload).error + " for frame type hello"};
    }
    if (type == FrameType::failed && length > max_failed_payload) {
      return {length_too_big(length, max_failed_payload).error + " for frame type failed"};
    }
    if (type == FrameType::revoke && length > max_revoke_payload) {
      return {length_too_big(length, max_revoke_payload).error + " for frame type revoke"};
    }
    if ((type == FrameType::agree || type == FrameType::decided || type == FrameType::welcome) &&
        length > max_ballot_payload) {
      return {length_too_big(length, max_ballot_payload).error + " for frame type " + tname};
    }
    if (type == FrameType::relay && length > max_relay_segment + relay_mac_size) {
      return {length_too_big(length, max_relay_segment + relay_mac_size).error + " for frame type relay"};
    }
    if ((type == FrameType::relay && length < relay_mac_size) || (type == FrameType::relay_ack && length != relay_mac_size)) {
      return {"frame length " + std::to_string(length) + " of frame type " + tname + " leaves no room for its " +
              std::to_string(relay_mac_size) + "-byte MAC"};
    }
    if (type == FrameType::shm_offer && length > max_shm_offer_payload) {
      return {length_too_big(length, max_shm_offer_payload).error + " for frame type shm_offer"};
    }
    if (type == FrameType::ports && (length > max_ports_payload || length % 2 != 0)) {
      return {"frame length " + std::to_string(length) + " of frame type ports is not an even number of bytes up to " +
              std::to_string(max_ports_payload)};
    }
  }

  h.type = type;
  h.flags = flags;
  h.check = check;
  h.src = get_u32(p + 4);
  h.comm = get_u64(p + 8);
  h.tag = get_u64(p + 16);
  h.seq = get_u64(p + 24);
  h.length = length;
  return {};
}

bool has_payload(FrameType type, std::uint8_t flags) noexcept {
  switch (type) {
    case FrameType::hello:
    case FrameType::eager:
    case FrameType::rpc_request:
    case FrameType::rpc_response:
    case FrameType::failed:
    case FrameType::revoke:
    case FrameType::agree:
    case FrameType::decided:
    case FrameType::welcome:
    case FrameType::shm_offer:
    case FrameType::relay:
    case FrameType::relay_ack:
    case FrameType::ports:
      return true;
    case FrameType::rdata:
      return (flags & flag_cancelled) == 0;
    case FrameType::goodbye:
    case FrameType::rts:
    case FrameType::cts:
    case FrameType::heartbeat:
    case FrameType::shm_switch:
    case FrameType::tcp_offer:
    case FrameType::tcp_switch:
      return false;
  }
  return false;
}

bool has_payload(const FrameHeader& h) noexcept { return has_payload(h.type, h.flags); }

}  // namespace nexar::wire
