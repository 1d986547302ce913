#include "quic/connection.hpp"

#include <ngtcp2/ngtcp2_crypto_gnutls.h>
#include <gnutls/crypto.h>

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "quic/endpoint.hpp"
#include "tls/peer_check.hpp"
#include "tls/tls_context.hpp"

namespace nexar::quic {

namespace {

// TLS 1.3 only; AES-128-GCM first: it is the cheapest AEAD with AES-NI, and per-packet
// crypto is a third of the sender's CPU.
constexpr const char* kTlsPriority =
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:"
    "%DISABLE_TLS13_COMPAT_MODE";

Connection* self(void* user_data) { return static_cast<Connection*>(user_data); }

}  // namespace

Connection::Connection(Endpoint& ep, bool server, const Address& remote)
    : ep_(ep), server_(server), remote_(remote), last_rx_(Endpoint::now()) {
  conn_ref_.get_conn = cb_get_conn;
  conn_ref_.user_data = this;
  const Address& local = ep.local();
  ngtcp2_path_storage_init(&path_, local.sa(), local.len, remote.sa(), remote.len, nullptr);
}

Connection::~Connection() {
  if (conn_) ngtcp2_conn_del(conn_);
  if (session_) gnutls_deinit(session_);
}

ngtcp2_callbacks Connection::callbacks(bool server) {
  ngtcp2_callbacks cb{};
  if (server) {
    cb.recv_client_initial = ngtcp2_crypto_recv_client_initial_cb;
  } else {
    cb.client_initial = ngtcp2_crypto_client_initial_cb;
    cb.recv_retry = ngtcp2_crypto_recv_retry_cb;
  }
  cb.recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb;
  cb.encrypt = ngtcp2_crypto_encrypt_cb;
  cb.decrypt = ngtcp2_crypto_decrypt_cb;
  cb.hp_mask = ngtcp2_crypto_hp_mask_cb;
  cb.update_key = ngtcp2_crypto_update_key_cb;
  cb.delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb;
  cb.delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb;
  cb.get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb;
  cb.version_negotiation = ngtcp2_crypto_version_negotiation_cb;
  cb.rand = cb_rand;
  cb.get_new_connection_id = cb_new_cid;
  cb.remove_connection_id = cb_remove_cid;
  cb.handshake_completed = cb_handshake_completed;
  cb.recv_stream_data = cb_recv_stream_data;
  cb.acked_stream_data_offset = cb_acked;
  cb.extend_max_stream_data = cb_extend_stream;
  cb.stream_close = cb_stream_close;
  return cb;
}

void Connection::init_tls(const tls::TlsContext& tls, const std::vector<std::string>& alpn) {
  unsigned flags = (server_ ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NO_END_OF_EARLY_DATA;
  if (int rv = gnutls_init(&session_, flags); rv != 0)
    throw Error(Errc::tls, std::string("gnutls_init: ") + gnutls_strerror(rv));
  int rv = server_ ? ngtcp2_crypto_gnutls_configure_server_session(session_)
                   : ngtcp2_crypto_gnutls_configure_client_session(session_);
  if (rv != 0) throw Error(Errc::tls, "ngtcp2_crypto_gnutls_configure_session failed");
  if (int r = gnutls_priority_set_direct(session_, kTlsPriority, nullptr); r != 0)
    throw Error(Errc::tls, std::string("gnutls priority: ") + gnutls_strerror(r));
  if (int r = gnutls_credentials_set(session_, GNUTLS_CRD_CERTIFICATE, tls.get()); r != 0)
    throw Error(Errc::tls, std::string("gnutls credentials: ") + gnutls_strerror(r));
  if (server_) {
    // Members authenticate each other; joiners of a seed have no certificate yet (the
    // token proof after the handshake authenticates them).
    gnutls_certificate_server_set_request(
        session_, tls.wants_client_cert() ? GNUTLS_CERT_REQUIRE : GNUTLS_CERT_IGNORE);
    // Do not advertise our CA names: a client holding a certificate from another cluster
    // must still present it, so the rejection can say which cluster it came from.
    gnutls_certificate_send_x509_rdn_sequence(session_, 1);
  }
  gnutls_session_set_verify_function(session_, cb_verify);
  std::vector<gnutls_datum_t> protos;
  for (const std::string& id : alpn)
    protos.push_back({reinterpret_cast<unsigned char*>(const_cast<char*>(id.data())), static_cast<unsigned>(id.size())});
  gnutls_alpn_set_protocols(session_, protos.data(), static_cast<unsigned>(protos.size()), GNUTLS_ALPN_MANDATORY);
  gnutls_session_set_ptr(session_, &conn_ref_);
  ngtcp2_conn_set_tls_native_handle(conn_, session_);
}

std::string Connection::alpn() const {
  gnutls_datum_t p{};
  if (session_ == nullptr || gnutls_alpn_get_selected_protocol(session_, &p) != 0) return {};
  return {reinterpret_cast<const char*>(p.data), p.size};
}

std::array<std::uint8_t, 32> Connection::export_secret(std::string_view label) const {
  std::array<std::uint8_t, 32> out{};
  if (session_ == nullptr || !established_)
    throw Error(Errc::tls, "exporting a secret from a connection that is not established");
  if (int rv = gnutls_prf_rfc5705(session_, label.size(), label.data(), 0, nullptr, out.size(),
                                  reinterpret_cast<char*>(out.data()));
      rv < 0)
    throw Error(Errc::tls, std::string("TLS exporter: ") + gnutls_strerror(rv));
  return out;
}

// ---- callbacks -------------------------------------------------------------------------

ngtcp2_conn* Connection::cb_get_conn(ngtcp2_crypto_conn_ref* ref) {
  return static_cast<Connection*>(ref->user_data)->conn_;
}

void Connection::cb_rand(std::uint8_t* dest, std::size_t len, const ngtcp2_rand_ctx*) {
  gnutls_rnd(GNUTLS_RND_RANDOM, dest, len);
}

int Connection::cb_new_cid(ngtcp2_conn*, ngtcp2_cid* cid, std::uint8_t* token,
                           std::size_t cidlen, void* user_data) {
  Connection* c = self(user_data);
  if (gnutls_rnd(GNUTLS_RND_RANDOM, cid->data, cidlen) != 0) return NGTCP2_ERR_CALLBACK_FAILURE;
  cid->datalen = cidlen;
  if (gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN) != 0)
    return NGTCP2_ERR_CALLBACK_FAILURE;
  c->cids_.push_back(*cid);
  c->ep_.add_cid(*cid, c);
  return 0;
}

int Connection::cb_remove_cid(ngtcp2_conn*, const ngtcp2_cid* cid, void* user_data) {
  Connection* c = self(user_data);
  c->ep_.remove_cid(*cid);
  std::erase_if(c->cids_, [&](const ngtcp2_cid& x) { return ngtcp2_cid_eq(&x, cid); });
  return 0;
}

int Connection::cb_verify(gnutls_session_t session) {
  auto* ref = static_cast<ngtcp2_crypto_conn_ref*>(gnutls_session_get_ptr(session));
  Connection* c = static_cast<Connection*>(ref->user_data);
  tls::PeerCheck check = c->ep_.tls().check(session);
  if (!check.ok) {
    c->verify_error_ = check.error;
    return GNUTLS_E_CERTIFICATE_ERROR;
  }
  if (!c->server_ && check.node != c->expected_node_) {
    c->verify_error_ = "peer certificate names node '" + check.node + "', expected '" +
                       c->expected_node_ + "'";
    return GNUTLS_E_CERTIFICATE_ERROR;
  }
  if (c->handler_) {
    std::string why = c->handler_->on_peer_identity(*c, check.node);
    if (!why.empty()) {
      c->verify_error_ = why;
      return GNUTLS_E_CERTIFICATE_ERROR;
    }
  }
  c->peer_node_ = check.node;
  return 0;
}

int Connection::cb_handshake_completed(ngtcp2_conn*, void* user_data) {
  Connection* c = self(user_data);
  c->established_ = true;
  log::debug("quic: connection to {} ({}) established", c->remote_.to_string(), c->peer_node_);
  if (c->handler_) c->handler_->on_established(*c);
  return 0;
}

int Connection::cb_recv_stream_data(ngtcp2_conn* conn, std::uint32_t, std::int64_t stream,
                                    std::uint64_t, const std::uint8_t* data, std::size_t len,
                                    void* user_data, void*) {
  // Connection-level credit is returned at once: each stream's own window already bounds
  // what a peer can make us hold, so a stalled stream never starves the others.
  ngtcp2_conn_extend_max_offset(conn, len);
  Connection* c = self(user_data);
  if (c->handler_ && len > 0) c->handler_->on_stream_data(*c, stream, data, len);
  return 0;
}

int Connection::cb_acked(ngtcp2_conn*, std::int64_t stream, std::uint64_t offset,
                         std::uint64_t len, void* user_data, void*) {
  self(user_data)->acked(stream, offset, len);
  return 0;
}

int Connection::cb_extend_stream(ngtcp2_conn*, std::int64_t stream, std::uint64_t, void* user_data,
                                 void*) {
  if (SendStream* s = self(user_data)->stream(stream)) s->blocked = false;
  return 0;
}

int Connection::cb_stream_close(ngtcp2_conn*, std::uint32_t, std::int64_t, std::uint64_t,
                                void*, void*) {
  return 0;
}

// ---- streams ---------------------------------------------------------------------------

std::int64_t Connection::open_stream(int priority, bool scavenger) {
  std::int64_t id = -1;
  if (int rv = ngtcp2_conn_open_uni_stream(conn_, &id, nullptr); rv != 0) {
    throw Error(Errc::protocol, std::string("open stream: ") + ngtcp2_strerror(rv));
  }
  auto s = std::make_unique<SendStream>();
  s->id = id;
  s->priority = priority;
  s->scavenger = scavenger;
  auto pos = std::upper_bound(streams_.begin(), streams_.end(), priority,
                              [](int p, const std::unique_ptr<SendStream>& x) { return p < x->priority; });
  streams_.insert(pos, std::move(s));
  return id;
}

Connection::SendStream* Connection::stream(std::int64_t id) {
  for (auto& s : streams_)
    if (s->id == id) return s.get();
  return nullptr;
}

void Connection::push(std::int64_t id, Chunk chunk) {
  SendStream* s = stream(id);
  if (closed_ || !s) {
    chunk.done(Errc::peer_failed, "connection closed");
    return;
  }
  if (chunk.len == 0) {
    chunk.done(Errc::ok);
    return;
  }
  s->queued += chunk.len;
  s->q.push_back(std::move(chunk));
  ep_.schedule_flush(*this);
}

std::uint64_t Connection::unacked(std::int64_t id) const {
  for (auto& s : streams_)
    if (s->id == id) return s->queued - s->base;
  return 0;
}

void Connection::consumed(std::int64_t stream_id, std::uint64_t n) {
  if (closed_ || n == 0) return;
  ngtcp2_conn_extend_max_stream_offset(conn_, stream_id, n);
  ep_.schedule_flush(*this);
}

Connection::CongestionState Connection::congestion_state() const {
  ngtcp2_conn_info info{};
  ngtcp2_conn_get_conn_info(conn_, &info);
  return {info.cwnd, info.ssthresh};
}

Connection::PathStats Connection::path_stats() const {
  ngtcp2_conn_info info{};
  ngtcp2_conn_get_conn_info(conn_, &info);
  PathStats s{info.smoothed_rtt, info.min_rtt, info.latest_rtt, info.rttvar, info.cwnd, info.bytes_in_flight, 0};
  // ngtcp2 1.11 counts losses per stream only; the lanes' streams live as long as the pair.
  for (const auto& st : streams_) s.lost_packets += ngtcp2_conn_get_stream_loss_count(conn_, st->id);
  return s;
}

void Connection::acked(std::int64_t id, std::uint64_t offset, std::uint64_t len) {
  SendStream* s = stream(id);
  if (!s) return;
  std::uint64_t upto = offset + len;
  if (upto > s->acked) {
    if (s->scavenger) {
      const std::uint64_t n = std::min(upto - s->acked, scavenger_in_flight_);
      scavenger_in_flight_ -= n;
      ngtcp2_conn_info info{};
      ngtcp2_conn_get_conn_info(conn_, &info);
      scavenger_.on_ack(n, info.latest_rtt, ep_.now());
    }
    s->acked = upto;
  }
  while (!s->q.empty() && s->base + s->q.front().len <= upto) {
    Chunk& c = s->q.front();
    s->base += c.len;
    c.done(Errc::ok);
    s->q.pop_front();
    if (s->send_idx > 0) {
      --s->send_idx;
    } else {
      s->send_off = 0;
    }
  }
}

bool Connection::has_unsent() const noexcept {
  for (auto& s : streams_)
    if (s->sent < s->queued) return true;
  return false;
}

Connection::SendStream* Connection::next_writable() {
  // The best priority class with something to write; within it, the stream that waited
  // longest since it last got bytes into a packet. Always taking the first one would let
  // one stream of a class starve the others for as long as it has data.
  SendStream* best = nullptr;
  for (auto& s : streams_) {
    if (best && s->priority != best->priority) break;  // streams_ is sorted by priority
    if (s->blocked || s->sent >= s->queued) continue;
    if (s->scavenger && scavenger_in_flight_ >= scavenger_.window()) {
      scavenger_.note_limited();
      continue;
    }
    if (!best || s->last_turn < best->last_turn) best = s.get();
  }
  return best;
}

// ---- I/O -------------------------------------------------------------------------------

int Connection::read(const ngtcp2_path& path, const std::uint8_t* pkt, std::size_t len,
                     std::uint64_t ts) {
  ngtcp2_pkt_info pi{};
  int rv = ngtcp2_conn_read_pkt(conn_, &path, &pi, pkt, len, ts);
  if (rv != 0) check_liberr(rv, "read");
  else last_rx_ = ts;
  return rv;
}

void Connection::check_liberr(int rv, const char* where) {
  if (closed_) return;
  if (rv == NGTCP2_ERR_DRAINING || rv == NGTCP2_ERR_CLOSING) {
    const ngtcp2_ccerr* e = ngtcp2_conn_get_ccerr(conn_);
    std::string reason(reinterpret_cast<const char*>(e->reason), e->reasonlen);
    if (e->type == NGTCP2_CCERR_TYPE_APPLICATION && e->error_code == close_orderly) {
      finish(Errc::peer_closed, reason.empty() ? "peer closed the connection" : reason);
    } else if (e->type == NGTCP2_CCERR_TYPE_APPLICATION && e->error_code == close_declared_failed) {
      finish(Errc::rank_failed, reason.empty() ? "the peer declared this rank failed" : reason);
    } else if (e->type == NGTCP2_CCERR_TYPE_TRANSPORT && (e->error_code & 0xff00) == 0x0100) {
      finish(Errc::tls, "peer rejected the TLS handshake (alert " +
                            std::to_string(e->error_code & 0xff) + ")" +
                            (reason.empty() ? "" : ": " + reason));
    } else {
      finish(Errc::peer_failed, "peer closed the connection with error " +
                                    std::to_string(e->error_code) +
                                    (reason.empty() ? "" : ": " + reason));
    }
    return;
  }
  if (rv == NGTCP2_ERR_IDLE_CLOSE) {
    finish(Errc::peer_failed, "peer silent for the idle timeout");
    return;
  }
  if (rv == NGTCP2_ERR_HANDSHAKE_TIMEOUT) {
    finish(Errc::timeout, "QUIC handshake with " + remote_.to_string() + " timed out");
    return;
  }
  if (rv == NGTCP2_ERR_DROP_CONN) {
    finish(Errc::peer_failed, "connection dropped");
    return;
  }
  Errc code = Errc::protocol;
  std::string why = std::string(where) + ": " + ngtcp2_strerror(rv);
  if (rv == NGTCP2_ERR_CRYPTO) {
    code = Errc::tls;
    if (!verify_error_.empty())
      why = verify_error_.starts_with("peer certificate rejected") ? verify_error_
                                                                   : "peer certificate rejected: " + verify_error_;
    else why = "TLS handshake failed (alert " + std::to_string(ngtcp2_conn_get_tls_alert(conn_)) + ")";
  }
  // Tell the peer why before we go.
  ngtcp2_ccerr ccerr;
  ngtcp2_ccerr_default(&ccerr);
  if (rv == NGTCP2_ERR_CRYPTO) {
    ngtcp2_ccerr_set_tls_alert(&ccerr, ngtcp2_conn_get_tls_alert(conn_),
                               reinterpret_cast<const std::uint8_t*>(why.data()),
                               std::min<std::size_t>(why.size(), 200));
  } else {
    ngtcp2_ccerr_set_liberr(&ccerr, rv, nullptr, 0);
  }
  std::uint8_t buf[1500];
  ngtcp2_pkt_info pi{};
  ngtcp2_ssize n = ngtcp2_conn_write_connection_close(conn_, &path_.path, &pi, buf,
                                                      sizeof buf, &ccerr, Endpoint::now());
  if (n > 0) ep_.send(*this, buf, static_cast<std::size_t>(n), static_cast<std::size_t>(n));
  finish(code, why);
}

void Connection::close(std::uint64_t app_code, const std::string& reason) {
  if (closed_) return;
  if (!ngtcp2_conn_in_closing_period(conn_) && !ngtcp2_conn_in_draining_period(conn_)) {
    // Data still queued goes out first, then the close.
    flush(Endpoint::now());
    ngtcp2_ccerr ccerr;
    ngtcp2_ccerr_default(&ccerr);
    ngtcp2_ccerr_set_application_error(&ccerr, app_code,
                                       reinterpret_cast<const std::uint8_t*>(reason.data()),
                                       std::min<std::size_t>(reason.size(), 200));
    std::uint8_t buf[1500];
    ngtcp2_pkt_info pi{};
    ngtcp2_ssize n = ngtcp2_conn_write_connection_close(conn_, &path_.path, &pi, buf,
                                                        sizeof buf, &ccerr, Endpoint::now());
    if (n > 0) ep_.send(*this, buf, static_cast<std::size_t>(n), static_cast<std::size_t>(n));
  }
  finish(Errc::closed, reason);
}

void Connection::finish(Errc code, const std::string& why) {
  if (closed_) return;
  closed_ = true;
  log::debug("quic: connection to {} closed: {}: {}", remote_.to_string(), to_string(code), why);
  // The handler fails the operations it tracks first (they carry better context), then
  // anything still queued fails here.
  if (handler_) handler_->on_closed(*this, code, why);
  for (auto& s : streams_) {
    for (auto& c : s->q) c.done(code, why);
    s->q.clear();
  }
  ep_.retire(*this);
}

void Connection::handle_expiry(std::uint64_t ts) {
  if (closed_) return;
  int rv = ngtcp2_conn_handle_expiry(conn_, ts);
  if (rv != 0) {
    check_liberr(rv, "timer");
    return;
  }
  flush(ts);
}

void Connection::flush(std::uint64_t ts) {
  if (closed_) return;
  std::uint8_t* buf = ep_.txbuf_.data();
  // pkt_max: what the path is known to carry, the size of every full packet; tx_max: the
  // room each write gets, larger while a path MTU probe may still come.
  const std::size_t pkt_max = ngtcp2_conn_get_path_max_tx_udp_payload_size(conn_);
  const std::size_t tx_max = std::max(pkt_max, ngtcp2_conn_get_max_tx_udp_payload_size(conn_));
  if (pkt_max > path_payload_) {
    if (path_payload_ != 0)
      log::info("quic: the path to {} carries {}-byte datagrams", remote_.to_string(), pkt_max);
    path_payload_ = pkt_max;
    scavenger_.set_mss(pkt_max);
  }
  const std::size_t batch_max = std::min(ep_.txbuf_.size(), UdpSocket::max_batch_bytes);
  std::size_t max_pkts =
      std::max<std::size_t>(1, std::min<std::size_t>(ngtcp2_conn_get_send_quantum(conn_) / pkt_max, 512));
  std::size_t batch = 0, seg = 0, npkts = 0, total_pkts = 0;
  for (auto& s : streams_) s->blocked = false;

  auto send_batch = [&] {
    if (batch) ep_.send(*this, buf, batch, seg);
    batch = 0;
    npkts = 0;
    seg = 0;
  };

  for (;;) {
    SendStream* s = next_writable();
    ngtcp2_vec vec[16];
    std::size_t nvec = 0;
    std::int64_t sid = -1;
    std::uint32_t flags = 0;
    if (s) {
      sid = s->id;
      flags = NGTCP2_WRITE_STREAM_FLAG_MORE;
      std::size_t off = s->send_off;
      for (std::size_t i = s->send_idx; i < s->q.size() && nvec < 16; ++i) {
        const Chunk& c = s->q[i];
        vec[nvec].base = const_cast<std::uint8_t*>(c.data) + off;
        vec[nvec].len = c.len - off;
        ++nvec;
        off = 0;
      }
    }
    ngtcp2_ssize datalen = -1;
    ngtcp2_pkt_info pi{};
    if (batch + tx_max > batch_max) send_batch();
    ngtcp2_ssize n = ngtcp2_conn_writev_stream(conn_, &path_.path, &pi, buf + batch, tx_max,
                                               &datalen, flags, sid, vec, nvec, ts);
    if (s && datalen > 0) {
      // Advance the unsent cursor over what ngtcp2 took.
      auto left = static_cast<std::size_t>(datalen);
      s->sent += left;
      if (s->scavenger) scavenger_in_flight_ += left;
      s->last_turn = ++turns_;
      while (left > 0) {
        const Chunk& c = s->q[s->send_idx];
        std::size_t room = c.len - s->send_off;
        if (left >= room) {
          left -= room;
          ++s->send_idx;
          s->send_off = 0;
        } else {
          s->send_off += left;
          left = 0;
        }
      }
    }
    if (n < 0) {
      if (n == NGTCP2_ERR_WRITE_MORE) continue;
      if (n == NGTCP2_ERR_STREAM_DATA_BLOCKED || n == NGTCP2_ERR_STREAM_SHUT_WR ||
          n == NGTCP2_ERR_STREAM_NOT_FOUND) {
        if (s) s->blocked = true;
        continue;
      }
      send_batch();
      check_liberr(static_cast<int>(n), "write");
      return;
    }
    if (n == 0) break;
    auto pkt = static_cast<std::size_t>(n);
    if (pkt > pkt_max) {
      // A path MTU probe: alone, and never fragmented (it must prove the size whole).
      std::size_t prev = batch;
      if (prev) ep_.send(*this, buf, prev, seg);
      ep_.send(*this, buf + prev, pkt, pkt, true);
      batch = 0;
      npkts = 0;
      ++total_pkts;
      if (total_pkts >= max_pkts) break;
      continue;
    }
    if (npkts > 0 && pkt > seg) {
      // A GSO batch is same-size packets with at most a shorter last one: move the larger
      // packet to a batch of its own.
      std::size_t prev = batch;
      ep_.send(*this, buf, prev, seg);
      std::memmove(buf, buf + prev, pkt);
      batch = 0;
      npkts = 0;
    }
    if (npkts == 0) seg = pkt;
    batch += pkt;
    ++npkts;
    ++total_pkts;
    if (pkt < seg || npkts >= UdpSocket::max_batch_segments) send_batch();
    if (total_pkts >= max_pkts) break;
  }
  send_batch();
  ngtcp2_conn_update_pkt_tx_time(conn_, ts);
  if (total_pkts) ep_.loop().note_activity();
}

}  // namespace nexar::quic
