#include "core/error_format.hpp"

#include <fmt/format.h>

#include <iterator>

namespace nexar::detail {

std::string format_error(Errc code, const ErrorContext& ctx, std::string_view detail) {
  std::string msg;
  msg.reserve(ctx.op.size() + ctx.peer_addr.size() + detail.size() + 64);
  auto it = std::back_inserter(msg);

  if (!ctx.op.empty()) {
    msg += ctx.op;
    msg += ": ";
  }

  // Location parts are comma-separated; an all-unknown context collapses to
  // "<op>: <code>: <detail>".
  bool any = false;
  const auto sep = [&] {
    if (any) msg += ", ";
    any = true;
  };
  if (ctx.rank >= 0) {
    sep();
    fmt::format_to(it, "rank {}", ctx.rank);
  }
  if (ctx.peer >= 0) {
    sep();
    fmt::format_to(it, "peer {}", ctx.peer);
    if (!ctx.peer_addr.empty()) fmt::format_to(it, " ({})", ctx.peer_addr);
  } else if (!ctx.peer_addr.empty()) {
    sep();
    fmt::format_to(it, "peer at {}", ctx.peer_addr);
  }
  if (ctx.start != std::chrono::steady_clock::time_point{}) {
    auto elapsed = std::chrono::steady_clock::now() - ctx.start;
    // A start in the future is a caller bug, not worth a negative duration in a message.
    if (elapsed < elapsed.zero()) elapsed = elapsed.zero();
    sep();
    fmt::format_to(it, "after {:.3f} s", std::chrono::duration<double>(elapsed).count());
  }
  if (any) msg += ": ";

  msg += to_string(code);
  if (!detail.empty()) {
    msg += ": ";
    msg += detail;
  }
  return msg;
}

Error make_error(Errc code, const ErrorContext& ctx, std::string_view detail) {
  return Error(code, format_error(code, ctx, detail));
}

}  // namespace nexar::detail
