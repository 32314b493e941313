#include "server/bounded_http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/http_reply.h"
#include "server/socket_port.h"

namespace vaedecode::server {
namespace {

// Threads beyond max_connections: a connection over the limit is refused on
// one of these, so refusals never queue behind held connections.
constexpr int kRefusalThreads = 8;
// How often a wait looks at whether the server is stopping.
constexpr absl::Duration kStopPoll = absl::Milliseconds(100);
// Once the server stops, a reply still being written gets this long: a slow
// reader must not hold the drain (reads stop at once: no new request is
// served).
constexpr absl::Duration kStopWriteGrace = absl::Seconds(5);
// A request line and headers larger than this are refused (431): without a
// bound, lines of up to 8 KiB each could arrive until the header deadline.
constexpr int64_t kMaxHeaderBytes = int64_t{64} << 10;

std::string Describe(absl::Duration d) { return absl::StrCat(absl::ToInt64Seconds(d), " s"); }

void AddressOf(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  std::array<char, NI_MAXHOST> host{};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host.data(), host.size(), nullptr, 0,
                  NI_NUMERICHOST) == 0) {
    ip = host.data();
  }
  port = PortOf(addr);
}

// One connection's socket as httplib reads and writes it, with deadlines:
// every wait ends at the current phase's deadline, however often bytes
// trickle in (the library's own stream restarts its timeout at each recv).
class ConnectionStream : public httplib::Stream {
 public:
  // `stopping` says the server is stopping.
  ConnectionStream(socket_t sock, const HttpConnectionLimits& limits, std::function<bool()> stopping)
      : sock_(sock), limits_(limits), stopping_(std::move(stopping)) {}

  // A request is starting: its request line and headers are due by
  // header_timeout from now.
  void StartRequest() {
    phase_ = Phase::kHeaders;
    read_deadline_ = absl::Now() + limits_.header_timeout;
    write_deadline_ = absl::InfiniteFuture();
    read_timed_out_ = false;
    header_bytes_ = 0;
    headers_too_large_ = false;
    wrote_ = false;
    close_after_reply_ = false;
  }
  // The headers are parsed (httplib's pre-routing hook): the body is due by
  // body_timeout from now.
  void HeadersRead() {
    phase_ = Phase::kBody;
    read_deadline_ = absl::Now() + limits_.body_timeout;
  }
  // The reply is about to be written (httplib's post-routing hook): it gets
  // write_timeout from now, whatever was written before (a 100 Continue).
  // A reply to a request whose body was not read whole (refused, too
  // large, timed out) ends the connection: the rest would be read as the
  // next request.
  void ReplyStarting(int status) {
    write_deadline_ = absl::Now() + limits_.write_timeout;
    if (status == 408 || status == 413 || status == 415 || status == 431) close_after_reply_ = true;
  }
  bool CloseAfterReply() const { return close_after_reply_; }

  // OK, or the wire limit this request broke: a read deadline, or the
  // header size (the HTTP status to answer it with: 408 or 431).
  absl::Status Refusal(int* http_status) const {
    if (headers_too_large_) {
      *http_status = 431;
      return absl::ResourceExhaustedError(
          absl::StrCat("the request line and headers are larger than ", kMaxHeaderBytes >> 10, " KiB"));
    }
    *http_status = 408;
    if (!read_timed_out_) return absl::OkStatus();
    if (phase_ == Phase::kHeaders) {
      return absl::DeadlineExceededError(absl::StrCat("the request line and headers did not arrive within ",
                                                      Describe(limits_.header_timeout),
                                                      " of their first byte (--http_header_timeout_s)"));
    }
    return absl::DeadlineExceededError(absl::StrCat("the request body did not arrive within ",
                                                    Describe(limits_.body_timeout),
                                                    " of its headers (--http_body_timeout_s)"));
  }
  // This request got nothing written back (the library gives up silently
  // when the request line itself does not arrive).
  bool Unanswered() const { return !wrote_; }
  bool Buffered() const { return begin_ < end_; }

  // Waits until a request's first byte can be read, at most keep_alive;
  // false when none came or `stopping` says the server is stopping.
  bool AwaitRequest() {
    if (Buffered()) return true;
    const absl::Time until = absl::Now() + limits_.keep_alive;
    while (!stopping_()) {
      const absl::Time now = absl::Now();
      if (now >= until) return false;
      const int ready = Poll(POLLIN, std::min(until - now, kStopPoll));
      if (ready != 0) return ready > 0;
    }
    return false;
  }

  bool is_readable() const override { return Buffered() || Wait(POLLIN, read_deadline_) > 0; }
  bool is_writable() const override { return Poll(POLLOUT, absl::ZeroDuration()) > 0; }

  ssize_t read(char* ptr, size_t size) override {
    if (phase_ == Phase::kHeaders && header_bytes_ >= kMaxHeaderBytes) {
      headers_too_large_ = true;
      return -1;
    }
    if (!Buffered()) {
      if (const int ready = Wait(POLLIN, read_deadline_); ready <= 0) {
        read_timed_out_ = ready == 0;
        return -1;
      }
      // Large reads (a body) go straight to the caller; small ones (the
      // parser's line reader asks a byte at a time) through the buffer.
      if (size >= buffer_.size() && phase_ != Phase::kHeaders) return recv(sock_, ptr, size, 0);
      const ssize_t n = recv(sock_, buffer_.data(), buffer_.size(), 0);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    if (phase_ == Phase::kHeaders) header_bytes_ += static_cast<int64_t>(n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (write_deadline_ == absl::InfiniteFuture()) write_deadline_ = absl::Now() + limits_.write_timeout;
    wrote_ = true;
    if (Wait(POLLOUT, write_deadline_) <= 0) return -1;
    return send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) AddressOf(addr, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) AddressOf(addr, len, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  enum class Phase { kHeaders, kBody };

  // poll() for `events` up to `timeout`: >0 ready (or the peer hung up:
  // the recv or send says what happened), 0 timed out, <0 error.
  int Poll(short events, absl::Duration timeout) const {
    pollfd p{sock_, events, 0};
    int r;
    do {
      r = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout))));
    } while (r < 0 && errno == EINTR);
    return r;
  }
  // Polls until `deadline` (0: it passed), in slices so that a stopping
  // server ends reads at once and writes after kStopWriteGrace.
  int Wait(short events, absl::Time deadline) const {
    while (true) {
      if (stopping_()) {
        if (events == POLLIN) return 0;
        if (stopped_at_ == absl::InfiniteFuture()) stopped_at_ = absl::Now();
        deadline = std::min(deadline, stopped_at_ + kStopWriteGrace);
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return 0;
      const int ready = Poll(events, std::min(absl::Ceil(left, absl::Milliseconds(1)), kStopPoll));
      if (ready != 0) return ready;
    }
  }

  socket_t sock_;
  const HttpConnectionLimits& limits_;
  const std::function<bool()> stopping_;
  mutable absl::Time stopped_at_ = absl::InfiniteFuture();
  Phase phase_ = Phase::kHeaders;
  absl::Time read_deadline_ = absl::InfiniteFuture();
  absl::Time write_deadline_ = absl::InfiniteFuture();
  bool read_timed_out_ = false;
  int64_t header_bytes_ = 0;  // handed to the parser in this request's header phase
  bool headers_too_large_ = false;
  bool wrote_ = false;
  bool close_after_reply_ = false;
  std::array<char, 4096> buffer_{};
  size_t begin_ = 0;
  size_t end_ = 0;
};

// The connection the calling pool thread is serving, for the pre-routing
// hook and the handlers.
thread_local ConnectionStream* current_stream = nullptr;

// Writes a whole small reply (a 408, 431 or 503); best effort, never waits past `deadline`.
void WriteReply(socket_t sock, const HttpReply& reply, absl::Time deadline) {
  const char* reason = reply.status == 408   ? "Request Timeout"
                       : reply.status == 431 ? "Request Header Fields Too Large"
                                             : "Service Unavailable";
  std::string text = absl::StrCat("HTTP/1.1 ", reply.status, " ", reason, "\r\nContent-Type: ", reply.content_type,
                                  "\r\nContent-Length: ", reply.body.size(), "\r\nConnection: close\r\n");
  for (const auto& [name, value] : reply.headers) absl::StrAppend(&text, name, ": ", value, "\r\n");
  absl::StrAppend(&text, "\r\n", reply.body);
  size_t sent = 0;
  while (sent < text.size() && absl::Now() < deadline) {
    const ssize_t n = send(sock, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{sock, POLLOUT, 0};
      poll(&p, 1, 10);
    } else {
      return;
    }
  }
}

// Reads what has already arrived, so that closing does not reset the
// connection (and discard the reply) because of unread request bytes.
void DrainArrived(socket_t sock) {
  std::array<char, 16384> sink;
  for (int i = 0; i < 64 && recv(sock, sink.data(), sink.size(), MSG_DONTWAIT) > 0; ++i) {
  }
}

// Reads what has arrived first: closing with unread bytes resets the
// connection, which can destroy the reply before the client reads it.
void Close(socket_t sock) {
  DrainArrived(sock);
  shutdown(sock, SHUT_RDWR);
  close(sock);
}

}  // namespace

BoundedHttpServer::BoundedHttpServer(HttpConnectionLimits limits) : limits_(limits) {
  const size_t threads = static_cast<size_t>(std::max(1, limits_.max_connections) + kRefusalThreads);
  new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    if (current_stream != nullptr) current_stream->HeadersRead();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (current_stream == nullptr) return;
    current_stream->ReplyStarting(res.status);
  });
}

absl::Status BoundedHttpServer::WireRefusal(int* http_status) {
  return current_stream != nullptr ? current_stream->Refusal(http_status) : absl::OkStatus();
}

void BoundedHttpServer::Refuse(socket_t sock) {
  ++refused_;
  HttpReply reply = ErrorReply(absl::UnavailableError(
      absl::StrCat("this HTTP port serves at most ", limits_.max_connections,
                   " connections at once and all are in use; retry shortly, or send over fewer connections")));
  reply.headers.emplace_back("Retry-After", "1");
  DrainArrived(sock);
  WriteReply(sock, reply, absl::Now() + absl::Seconds(1));
  DrainArrived(sock);
  Close(sock);
}

bool BoundedHttpServer::process_and_close_socket(socket_t sock) {
  if (active_.fetch_add(1) >= limits_.max_connections) {
    --active_;
    Refuse(sock);
    return false;
  }
  ConnectionStream stream(sock, limits_, [this] { return svr_sock_ == INVALID_SOCKET; });
  current_stream = &stream;
  bool ok = false;
  for (size_t left = keep_alive_max_count_; left > 0 && stream.AwaitRequest(); --left) {
    stream.StartRequest();
    bool closed = false;
    ok = process_request(stream, /*close_connection=*/left == 1, closed, nullptr);
    int http_status = 0;
    if (absl::Status refusal = stream.Refusal(&http_status); !refusal.ok()) {
      if (stream.Unanswered()) {
        HttpReply reply = ErrorReply(refusal);
        reply.status = http_status;
        WriteReply(sock, reply, absl::Now() + absl::Seconds(1));
      }
      break;  // what is left of the request would be read as the next one
    }
    if (!ok || closed || stream.CloseAfterReply()) break;
  }
  current_stream = nullptr;
  Close(sock);
  --active_;
  return ok;
}

}  // namespace vaedecode::server
