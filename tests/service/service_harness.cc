#include "tests/service/service_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client_io.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "rpc/status_macros.h"

namespace vaedecode::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir ? srcdir : ".", "/vaedecode/", path);
}

std::string TempDir(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, "-", getpid(), "-", ++counter);
  std::filesystem::create_directories(dir);
  return dir;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(const std::vector<std::string>& flags,
                                                                    absl::Duration timeout) {
  const std::string dir = TempDir("server");
  const std::string ready = dir + "/ready";
  const std::string log_file = dir + "/server.log";
  // Unix socket paths are limited to 108 bytes: $TEST_TMPDIR is too deep.
  char tmpl[] = "/tmp/vaedecode-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::UnavailableError("mkdtemp failed");
  std::vector<std::string> argv = {Runfile("server/vaedecode_server"), "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0", absl::StrCat("--ready_file=", ready),
                                   absl::StrCat("--socket_dir=", tmpl)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  rpc::SpawnOptions spawn;
  spawn.output_file = log_file;
  ASSIGN_OR_RETURN(rpc::ChildProcess child, rpc::ChildProcess::Spawn(argv, spawn));
  std::unique_ptr<ServerProcess> s(new ServerProcess(std::move(child), tmpl, log_file));
  const absl::Time give_up = absl::Now() + timeout;
  while (!std::filesystem::exists(ready)) {
    absl::StatusOr<int> code = s->child_.Wait(absl::InfinitePast());
    if (code.ok()) {
      return absl::UnavailableError(absl::StrCat("server exited with code ", *code, "; its log:\n", ReadAll(log_file)));
    }
    if (absl::Now() > give_up) return absl::DeadlineExceededError("server did not start");
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (absl::string_view line : absl::StrSplit(ReadAll(ready), '\n')) {
    std::vector<std::string> kv = absl::StrSplit(line, '=');
    if (kv.size() != 2) continue;
    if (kv[0] == "grpc_port") (void)absl::SimpleAtoi(kv[1], &s->port_);
    if (kv[0] == "metrics_port") (void)absl::SimpleAtoi(kv[1], &s->metrics_port_);
    if (kv[0] == "http_port") (void)absl::SimpleAtoi(kv[1], &s->http_port_);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  s->channel_ = grpc::CreateCustomChannel(s->address(), grpc::InsecureChannelCredentials(), args);
  s->stub_ = v1::VaeDecoder::NewStub(s->channel_);
  return s;
}

ServerProcess::~ServerProcess() {
  child_.Kill();
  std::error_code ec;
  std::filesystem::remove_all(socket_dir_, ec);
  const std::string log = Log();
  std::fprintf(stderr, "---- server log (%s) ----\n%s---- end of server log ----\n", log_file_.c_str(), log.c_str());
}

std::string ServerProcess::Log() const { return ReadAll(log_file_); }

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::unique_ptr<v1::VaeDecoder::Stub> ServerProcess::SlowReaderStub() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  // A channel of its own, not shared with stub(): the window is per channel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return v1::VaeDecoder::NewStub(grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args));
}

absl::StatusOr<bool> ServerProcess::Serving(const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status s = stub->Check(&ctx, request, &response);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

absl::Status ServerProcess::WaitServing(const std::string& service, bool serving, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < give_up) {
    absl::StatusOr<bool> s = Serving(service);
    if (s.ok() && *s == serving) return absl::OkStatus();
    last = s.ok() ? absl::OkStatus() : s.status();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("health of \"", service, "\" did not become ",
                                                  serving ? "SERVING" : "NOT_SERVING",
                                                  "; last error: ", last.ToString()));
}

absl::StatusOr<std::vector<std::string>> ServerProcess::ReflectionServices() {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  stream->Write(request);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  std::vector<std::string> names;
  while (stream->Read(&response)) {
    for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
  }
  const grpc::Status s = stream->Finish();
  if (!s.ok()) return absl::UnknownError(s.error_message());
  return names;
}

std::vector<WorkerProcess> ServerProcess::Workers() const {
  std::vector<WorkerProcess> out;
  const pid_t parent = child_.pid();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
    pid_t ppid = 0;
    if (fields.size() < 2 || !absl::SimpleAtoi(fields[1], &ppid) || ppid != parent) continue;
    if (fields[0] == "Z") continue;  // exited, not yet reaped
    WorkerProcess w;
    w.pid = pid;
    for (absl::string_view arg : absl::StrSplit(ReadAll(absl::StrCat("/proc/", pid, "/cmdline")), '\0')) {
      if (absl::ConsumePrefix(&arg, "--rank=")) (void)absl::SimpleAtoi(arg, &w.rank);
      if (absl::ConsumePrefix(&arg, "--group=")) w.group = std::string(arg);
    }
    if (w.rank >= 0) out.push_back(w);
  }
  return out;
}

absl::StatusOr<std::vector<WorkerProcess>> ServerProcess::WaitWorkers(size_t count, absl::Duration timeout,
                                                                      const std::string& exclude_group) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    std::vector<WorkerProcess> w = Workers();
    bool excluded = false;
    for (const auto& p : w) excluded |= !exclude_group.empty() && p.group == exclude_group;
    if (w.size() == count && !excluded) return w;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("the server did not have ", count, " workers"));
}

absl::StatusOr<std::string> ServerProcess::ScrapeMetrics() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  // A scrape that cannot be answered fails after a minute instead of hanging.
  timeval timeout{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(metrics_port_);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("cannot connect to the metrics port");
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  if (n < 0) return absl::DeadlineExceededError("the metrics port did not answer within 60 s");
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos || response.find(" 200 ") > body) {
    return absl::UnknownError(absl::StrCat("bad HTTP response: ", response.substr(0, 200)));
  }
  return response.substr(body + 4);
}

absl::Status ServerProcess::WaitMetric(const std::string& name, const std::vector<std::string>& label_pieces,
                                       const std::function<bool(double)>& want, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  std::string last = "no scrape";
  while (absl::Now() < give_up) {
    absl::StatusOr<std::string> m = ScrapeMetrics();
    if (m.ok()) {
      const double v = MetricValue(*m, name, label_pieces);
      if (want(v)) return absl::OkStatus();
      last = absl::StrCat(v);
    } else {
      last = m.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(name, "{", absl::StrJoin(label_pieces, ","),
                                                  "} did not reach the wanted value within ",
                                                  absl::FormatDuration(timeout), "; last: ", last));
}

absl::Status ServerProcess::WaitMetric(const std::string& name, const std::vector<std::string>& label_pieces,
                                       double value, absl::Duration timeout) {
  absl::Status s = WaitMetric(
      name, label_pieces, [value](double v) { return v == value; }, timeout);
  if (s.ok()) return s;
  return absl::DeadlineExceededError(absl::StrCat("wanted ", value, ": ", s.message()));
}

void ServerProcess::Signal(int sig) {
  if (child_.pid() > 0) kill(child_.pid(), sig);
}

absl::StatusOr<int> ServerProcess::WaitExit(absl::Duration timeout) { return child_.Wait(absl::Now() + timeout); }

DecodeOutcome Decode(v1::VaeDecoder::Stub& stub, const v1::DecodeRequest& request, absl::Duration deadline,
                     const std::function<void(int, grpc::ClientContext&)>& on_message,
                     const std::function<void(grpc::ClientContext&)>& on_start) {
  DecodeOutcome out;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto reader = stub.Decode(&ctx, request);
  if (on_start) on_start(ctx);
  v1::DecodeResponse message;
  while (reader->Read(&message)) {
    ++out.messages;
    if (out.stream_error.ok()) out.stream_error = out.output.Add(message);
    if (on_message) on_message(out.messages, ctx);
  }
  out.status = reader->Finish();
  return out;
}

DecodeOutcome Encode(v1::VaeDecoder::Stub& stub, const v1::EncodeRequest& request, int64_t piece_bytes,
                     absl::Duration deadline) {
  DecodeOutcome out;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto stream = stub.Encode(&ctx);
  for (const v1::EncodeRequest& piece : client::EncodePieces(request, piece_bytes)) {
    if (!stream->Write(piece)) break;  // the server ended the call (a refusal): read why
  }
  stream->WritesDone();
  v1::DecodeResponse message;
  while (stream->Read(&message)) {
    ++out.messages;
    if (out.stream_error.ok()) out.stream_error = out.output.Add(message);
  }
  out.status = stream->Finish();
  return out;
}

double MetricValue(const std::string& exposition, const std::string& name,
                   const std::vector<std::string>& label_pieces) {
  double total = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    absl::string_view series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (series.substr(0, brace) != name) continue;
    bool all = true;
    for (const std::string& p : label_pieces) all &= absl::StrContains(series, p);
    if (!all) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) {
      total += v;
      found = true;
    }
  }
  return found ? total : -1;
}

absl::StatusOr<std::string> PromtoolCheck(const std::string& exposition) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  if (access(kPromtool, X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kPromtool, " is missing: run tools/setup.sh (it installs Debian's prometheus package)"));
  }
  const std::string path = TempDir("promtool") + "/metrics.txt";
  {
    std::ofstream out(path);
    out << exposition;
  }
  const CommandResult promtool = RunCommand(absl::StrCat(kPromtool, " check metrics < ", path));
  if (promtool.status < 0) return absl::UnavailableError("cannot run promtool");
  const std::string& output = promtool.output;
  const int rc = promtool.status;
  if (rc == 0) return output;
  // Exit 3 is lint findings only (a malformed exposition exits 1). Triton's
  // names (nv_inference_request_success, ..._duration_us, ..._count gauges)
  // break Prometheus' naming lint; the server keeps them on purpose so that
  // Triton dashboards work, and nothing else may be flagged.
  static const char* const kTritonNames[] = {"vaedecode_request_success",           "vaedecode_request_failure",
                                             "vaedecode_request_duration_us",       "vaedecode_queue_duration_us",
                                             "vaedecode_compute_infer_duration_us", "vaedecode_pending_request_count"};
  bool only_triton_names = WIFEXITED(rc) && WEXITSTATUS(rc) == 3;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    const absl::string_view name = line.substr(0, line.find(' '));
    bool known = false;
    for (const char* triton : kTritonNames) known |= name == triton;
    only_triton_names &= known;
  }
  if (!only_triton_names) return absl::InvalidArgumentError(absl::StrCat("promtool failed: ", output));
  return output;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) result.output.append(buf, n);
  result.status = pclose(p);
  return result;
}

}  // namespace vaedecode::testing
