#include "comm/tracer.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "comm/recorder.hpp"
#include "core/log.hpp"

namespace nexar::detail {

Tracer::Tracer(std::string dir, int rank, int world)
    : dir_(std::move(dir)),
      path_(fmt::format("{}/nexar-trace-{}-{}.json", dir_, rank, ::getpid())),
      rank_(rank),
      world_(world) {
  // ts counts from the steady clock's own epoch, which every process of a host shares; the
  // Unix time of that epoch lets the merge line up ranks of other hosts too.
  const auto steady = Clock::now();
  const auto wall = std::chrono::system_clock::now();
  unix_us_at_zero_ =
      std::chrono::duration<double, std::micro>(wall.time_since_epoch()).count() -
      std::chrono::duration<double, std::micro>(steady.time_since_epoch()).count();
  std::lock_guard lk(mu_);
  add(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"rank {}"}}}})", rank_, rank_));
  add(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":0,"args":{{"name":"point-to-point"}}}})", rank_));
}

Tracer::~Tracer() { write(); }

double Tracer::us(Clock::time_point t) const noexcept {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

void Tracer::add(std::string event) {
  if (events_.size() + event.size() > kMaxBytes) {
    ++dropped_;
    return;
  }
  if (!events_.empty()) events_ += ",\n";
  events_ += event;
}

int Tracer::track(std::uint64_t comm) {
  auto [it, fresh] = tracks_.emplace(comm, static_cast<int>(tracks_.size()) + 1);
  if (fresh)
    add(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"communicator {:#x}"}}}})",
                    rank_, it->second, comm));
  return it->second;
}

void Tracer::collective(std::uint64_t comm, const OpRecord& r, const WaitMeter* meter) {
  const Clock::duration waited = meter ? meter->waited : Clock::duration{};
  // From its start: the time queued behind earlier collectives of the communicator (in
  // queued_us) would overlap their spans on the track, which trace viewers cannot nest.
  const bool ran = r.started != Clock::time_point{};
  const double from = us(ran ? r.started : r.posted), to = us(r.ended);
  std::lock_guard lk(mu_);
  const int tid = track(comm);
  add(fmt::format(R"({{"ph":"X","cat":"collective","name":"{} #{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                  R"("args":{{"comm":"{:#x}","seq":{},"op":{},"dtype":"{}","count":{},"bytes":{},"reduce":"{}",)"
                  R"("root":{},"algorithm":{},"state":"{}","queued_us":{:.3f},"waiting_us":{:.3f}}}}})",
                  r.op, r.number, rank_, tid, from, to - from, comm, r.number, json_quote(r.op), to_string(r.dtype),
                  r.count, r.bytes, to_string(r.reduce_op), r.root, json_quote(r.algorithm), to_string(r.state),
                  from - us(r.posted), std::chrono::duration<double, std::micro>(waited).count()));
  if (!meter) return;
  for (const auto& st : meter->steps)
    add(fmt::format(R"({{"ph":"X","cat":"step","name":{},"pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f}}})",
                    json_quote(st.name), rank_, tid, us(st.from), us(st.to) - us(st.from)));
  for (const auto& [a, b] : meter->spans)
    add(fmt::format(R"({{"ph":"X","cat":"wait","name":"wait for peers","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f}}})",
                    rank_, tid, us(a), us(b) - us(a)));
}

void Tracer::p2p(std::uint64_t comm, std::shared_ptr<OpState> op, bool sending, int peer, int tag,
                 std::uint64_t bytes) {
  std::lock_guard lk(mu_);
  open_.push_back(Open{comm, std::move(op), sending, peer, tag, bytes});
  drain(false);
}

void Tracer::drain(bool all) {
  // Those at the front as they complete; every completed one once the list doubled since
  // the last sweep, so an operation that stays open (a receive posted for the whole job)
  // holds back no others for long.
  auto draw = [this](const Open& o) {
    if (o.op->done()) {
      const double from = us(o.op->start()), to = us(o.op->ended());
      const std::string name = o.peer < 0 ? std::string("recv from any rank")
                                          : fmt::format("{} rank {}", o.sending ? "send to" : "recv from", o.peer);
      add(fmt::format(R"({{"ph":"X","cat":"p2p","name":"{}","pid":{},"tid":0,"ts":{:.3f},"dur":{:.3f},)"
                      R"("args":{{"comm":"{:#x}","peer":{},"tag":{},"bytes":{},"state":"{}"}}}})",
                      name, rank_, from, to > from ? to - from : 0.0, o.comm, o.peer, o.tag, o.bytes,
                      o.op->code() == Errc::ok ? "done" : "failed"));
    }
  };
  while (!open_.empty() && (all || open_.front().op->done())) {
    draw(open_.front());
    open_.pop_front();
  }
  if (open_.size() < sweep_at_) return;
  std::deque<Open> still;
  for (Open& o : open_) {
    if (o.op->done()) draw(o);
    else still.push_back(std::move(o));
  }
  open_ = std::move(still);
  sweep_at_ = std::max<std::size_t>(64, 2 * open_.size());
}

bool Tracer::write() {
  std::lock_guard lk(mu_);
  if (written_) return true;
  written_ = true;
  drain(true);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  // A rank made again in the same process (a second job, a rebuilt world) keeps the first
  // one's file: a suffix tells them apart.
  for (int k = 2; std::filesystem::exists(path_, ec); ++k)
    path_ = fmt::format("{}/nexar-trace-{}-{}-{}.json", dir_, rank_, ::getpid(), k);
  std::ofstream f(path_, std::ios::trunc);
  if (!f) {
    log::warn("rank {}: cannot write the trace {} (NEXAR_TRACE)", rank_, path_);
    return false;
  }
  f << "{\"traceEvents\":[\n" << events_ << "\n],\n\"displayTimeUnit\":\"ms\",\n";
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  f << fmt::format(R"("otherData":{{"nexar_trace":1,"rank":{},"world":{},"pid":{},"host":{},)"
                   R"("unix_us_at_zero":{:.3f},"dropped_events":{}}}}})",
                   rank_, world_, ::getpid(), json_quote(host), unix_us_at_zero_, dropped_)
    << '\n';
  f.close();
  if (!f) {
    log::warn("rank {}: writing the trace {} failed (NEXAR_TRACE)", rank_, path_);
    return false;
  }
  log::info("rank {}: trace written to {}", rank_, path_);
  return true;
}

}  // namespace nexar::detail
