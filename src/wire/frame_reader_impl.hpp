// FrameReader::feed, included at the end of wire/frame.hpp (it is a template over the
// handler, so it must be visible to every caller). Do not include this file directly.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace nexar::wire {

template <class Handler>
DecodeError FrameReader::feed(std::span<const std::byte> in, Handler& handler) {
  if (state_ == State::failed) return {"frame reader already failed on this stream"};

  const auto fail = [this](std::string why) {
    state_ = State::failed;
    return DecodeError{std::move(why)};
  };

  const std::byte* const data = in.data();
  const std::size_t n = in.size();
  std::size_t pos = 0;

  // Every iteration either consumes input or completes a frame (at least 40 bytes of
  // input), so the loop is linear in the input size.
  for (;;) {
    switch (state_) {
      case State::preamble: {
        const std::size_t take = std::min(preamble_size - have_, n - pos);
        if (take > 0) std::memcpy(buf_.data() + have_, data + pos, take);
        have_ += take;
        pos += take;
        if (have_ < preamble_size) return {};
        have_ = 0;
        Lane lane = Lane::control;
        DecodeError err =
            decode_preamble(std::span<const std::byte, preamble_size>(buf_.data(), preamble_size),
                            lane);
        if (err) return fail(std::move(err.error));
        lane_ = lane;
        state_ = State::header;
        if (!handler.on_preamble(lane_)) return fail("handler rejected stream preamble");
        break;
      }

      case State::header: {
        if (pos == n) return {};
        const std::size_t take = std::min(header_size - have_, n - pos);
        std::memcpy(buf_.data() + have_, data + pos, take);
        have_ += take;
        pos += take;
        if (have_ < header_size) return {};
        have_ = 0;
        FrameHeader h;
        DecodeError err = decode_header(std::span<const std::byte, header_size>(buf_),
                                        lane_, max_payload_, h);
        if (err) return fail(std::move(err.error));
        cur_ = h;
        if (!handler.on_header(cur_)) return fail("handler rejected frame header");
        if (has_payload(cur_) && cur_.length > 0) {
          remaining_ = cur_.length;
          state_ = State::payload;
        } else if (!handler.on_frame_end(cur_)) {
          return fail("handler rejected frame");
        }
        break;
      }

      case State::payload: {
        if (pos == n) return {};
        // Hand the bytes over in place: the handler lands them in their destination.
        const auto avail = static_cast<std::uint64_t>(n - pos);
        const auto take = static_cast<std::size_t>(std::min(remaining_, avail));
        handler.on_payload(in.subspan(pos, take));
        pos += take;
        remaining_ -= take;
        if (remaining_ == 0) {
          state_ = State::header;
          if (!handler.on_frame_end(cur_)) return fail("handler rejected frame");
        }
        break;
      }

      case State::failed:
        // Only reachable if a handler callback re-entered feed() and failed the reader.
        return {"frame reader already failed on this stream"};
    }
  }
}

}  // namespace nexar::wire
