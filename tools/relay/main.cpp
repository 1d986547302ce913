// nexar-relay: a UDP relay that delays every datagram, for benchmarks across network
// namespaces, where tbf shapes the rate but does not delay and netem is not available.
//
//   nexar-relay --listen 10.77.0.2:29600 --target 10.77.0.2:29601 --delay-ms 10 --jitter-ms 1
//
// A rank binds the target (NEXAR_BIND_ADDR=10.77.0.2:29601) and advertises the relay
// (NEXAR_ADVERTISE_ADDR=10.77.0.2:29600): peers dial the relay, which holds what they send
// for --delay-ms before passing it on to the rank, and holds the rank's replies as long on
// their way back (relay.hpp). A pair whose connection passes one relay sees a round trip of
// twice the delay.
//
// Prints one line once listening and, stopped by SIGINT or SIGTERM, one line of what it did
// each way; exits 0 then. Exit status 2 on bad options, 1 when it cannot start (the
// --listen address cannot be bound...).
#include <CLI/CLI.hpp>

#include <signal.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "address.hpp"
#include "relay.hpp"

namespace {

using nexar_relay::Address;
using nexar_relay::DirectionStats;
using nexar_relay::Relay;
using nexar_relay::RelayOptions;

// A decimal in [lo, hi] (strtod's syntax, finite): CLI11's Range lets NaN through.
CLI::Validator decimal_in(double lo, double hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < lo || v > hi)
          return "'" + s + "' is not " + what;
        return {};
      },
      what);
}

// A whole number in [lo, hi], digits only (CLI11 would take "-3" for an unsigned option and
// wrap it round).
CLI::Validator whole_in(std::uint64_t lo, std::uint64_t hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& s) -> std::string {
        const bool digits = !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = digits ? std::strtoull(s.c_str(), &end, 10) : 0;
        if (!digits || errno == ERANGE || v < lo || v > hi) return "'" + s + "' is not " + what;
        return {};
      },
      what);
}

CLI::Validator ip_port(bool port_zero_ok) {
  return CLI::Validator(
      [port_zero_ok](std::string& s) -> std::string {
        try {
          (void)Address::parse(s, port_zero_ok);
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return {};
      },
      port_zero_ok ? "IP:PORT" : "IP:PORT (port 1..65535)");
}

std::int64_t ms_to_ns(double ms) { return std::llround(ms * 1e6); }

std::string ms_text(double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", ms);
  return buf;
}

void print_line(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string direction_text(const char* name, const DirectionStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s %" PRIu64 " datagrams %" PRIu64 " B (dropped: queue full %" PRIu64 ", loss %" PRIu64
                ", send error %" PRIu64 ")",
                name, s.datagrams, s.bytes, s.dropped_queue, s.dropped_loss, s.dropped_error);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Relays UDP datagrams from --listen to --target and the replies back, holding each for "
      "--delay-ms (plus jitter) in both directions. One upstream socket per client address.",
      "nexar-relay"};
  std::string listen;
  std::string target;
  std::string delay_ms = "0";
  std::string jitter_ms = "0";
  std::string loss = "0";
  bool reorder = false;
  std::uint64_t seed = 1;
  std::uint64_t queue_bytes = 8u << 20;
  std::uint64_t idle_timeout_s = 60;

  app.add_option("--listen", listen, "IP:PORT clients send to ([IPV6]:PORT; port 0: any free port)")
      ->required()
      ->check(ip_port(true));
  app.add_option("--target", target, "IP:PORT datagrams are relayed to")->required()->check(ip_port(false));
  app.add_option("--delay-ms", delay_ms, "delay of each datagram, each direction (decimals allowed)")
      ->capture_default_str()
      ->check(decimal_in(0, 60000, "a delay of 0..60000 ms"));
  app.add_option("--jitter-ms", jitter_ms, "extra delay per datagram, uniform in 0..J ms")
      ->capture_default_str()
      ->check(decimal_in(0, 60000, "a jitter of 0..60000 ms"));
  app.add_flag("--reorder", reorder,
               "give each datagram its own release time, so jitter larger than the gap between two "
               "datagrams reorders them (without it a datagram never leaves before an earlier one of "
               "the same client and direction)");
  app.add_option("--loss", loss, "fraction of datagrams dropped at random, each direction")
      ->capture_default_str()
      ->check(decimal_in(0, 1, "a fraction of 0..1"));
  app.add_option("--seed", seed, "seed of the jitter and loss draws")
      ->capture_default_str()
      ->check(whole_in(0, UINT64_MAX, "a seed of 0..2^64-1"));
  app.add_option("--queue-bytes", queue_bytes,
                 "bytes held at most in each direction; what arrives beyond it is dropped (and counted)")
      ->capture_default_str()
      ->check(whole_in(65536, std::uint64_t{1} << 32, "a size of 65536..4294967296 bytes"));
  app.add_option("--idle-timeout-s", idle_timeout_s,
                 "forget a client (close its upstream socket) after this long without traffic; 0: never")
      ->capture_default_str()
      ->check(whole_in(0, std::uint64_t{86400} * 365, "a time of 0..31536000 s"));
  app.footer("Exit status: 0 stopped by SIGINT/SIGTERM (after a summary line), 1 it could not start, 2 bad options.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  RelayOptions o;
  o.listen = Address::parse(listen, true);
  o.target = Address::parse(target, false);
  o.delay_ns = ms_to_ns(std::strtod(delay_ms.c_str(), nullptr));
  o.jitter_ns = ms_to_ns(std::strtod(jitter_ms.c_str(), nullptr));
  o.reorder = reorder;
  o.loss = std::strtod(loss.c_str(), nullptr);
  o.queue_bytes = static_cast<std::size_t>(queue_bytes);
  o.seed = seed;
  o.idle_timeout_ns = static_cast<std::int64_t>(idle_timeout_s) * 1'000'000'000;

  // A reader of stdout that went away must not kill the relay mid-run.
  ::signal(SIGPIPE, SIG_IGN);
  // The stop signals arrive through the relay's signalfd, so they must not be delivered.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);

  try {
    Relay relay(o);
    print_line("nexar-relay: " + relay.listening().text() + " -> " + o.target.text() + ", delay " +
               ms_text(std::strtod(delay_ms.c_str(), nullptr)) + " ms, jitter " +
               ms_text(std::strtod(jitter_ms.c_str(), nullptr)) + " ms" + (reorder ? " (reordering)" : " (in order)") +
               ", loss " + loss + ", queue " + std::to_string(queue_bytes) + " B each way, seed " +
               std::to_string(seed));
    const int sig = relay.run();
    print_line("nexar-relay: stopped by " + std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ": " +
               direction_text("to target", relay.stats(Relay::kToTarget)) + "; " +
               direction_text("to clients", relay.stats(Relay::kToClient)) + "; clients " +
               std::to_string(relay.clients_seen()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nexar-relay: %s\n", e.what());
    return 1;
  }
  return 0;
}
