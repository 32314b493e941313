#pragma once

// Test harness for the service: starts a real vaedecode_server process on
// loopback (ports chosen by the kernel, read back from --ready_file), talks
// to it over gRPC (VaeDecoder, grpc.health.v1, reflection) and HTTP
// (/metrics), finds its worker processes in /proc.
//
// Threading: a ServerProcess is used by one test thread; Decode may run on
// many threads at once with the stub.

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/child_process.h"
#include "rpc/output_assembler.h"
#include "vaedecode/v1/vaedecode.grpc.pb.h"

namespace vaedecode::testing {

// $TEST_SRCDIR/vaedecode/<path> (a runfile of this test).
std::string Runfile(const std::string& path);
// A fresh folder under $TEST_TMPDIR.
std::string TempDir(const std::string& name);

struct WorkerProcess {
  pid_t pid = 0;
  int rank = -1;
  std::string group;  // the --group flag (incarnation)
};

class ServerProcess {
 public:
  // Starts Runfile("server/vaedecode_server") with --listen=127.0.0.1:0,
  // --metrics_listen=127.0.0.1:0, --ready_file and `flags`; waits until it
  // listens (not until its groups are ready: see WaitServing).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const std::vector<std::string>& flags,
                                                              absl::Duration timeout = absl::Seconds(60));

  pid_t pid() const { return child_.pid(); }
  std::string address() const;
  int metrics_port() const { return metrics_port_; }
  int port() const { return port_; }            // the gRPC port
  int http_port() const { return http_port_; }  // 0 without --http_listen
  v1::VaeDecoder::Stub& stub() { return *stub_; }
  // A stub on a channel of its own whose receive window stays at 64 KiB (no
  // BDP probing): a client that stops reading stalls the server's stream
  // after a few chunks instead of taking the whole output into its buffers.
  std::unique_ptr<v1::VaeDecoder::Stub> SlowReaderStub();
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

  // grpc.health.v1 Check: true SERVING, false NOT_SERVING; an error status
  // otherwise (NOT_FOUND for an unknown service name).
  absl::StatusOr<bool> Serving(const std::string& service);
  // Polls Serving until it equals `serving`.
  absl::Status WaitServing(const std::string& service, bool serving, absl::Duration timeout);
  // Reflection's list_services.
  absl::StatusOr<std::vector<std::string>> ReflectionServices();

  // The server's worker processes (its children), by rank.
  std::vector<WorkerProcess> Workers() const;
  // Waits until the server has `count` workers, none in `exclude` groups.
  absl::StatusOr<std::vector<WorkerProcess>> WaitWorkers(size_t count, absl::Duration timeout,
                                                         const std::string& exclude_group = "");

  // GET /metrics over HTTP/1.0: the body.
  absl::StatusOr<std::string> ScrapeMetrics();
  // Polls /metrics until the sample `name{label_pieces}` (see MetricValue)
  // satisfies `want`; DEADLINE_EXCEEDED naming the last value otherwise.
  absl::Status WaitMetric(const std::string& name, const std::vector<std::string>& label_pieces,
                          const std::function<bool(double)>& want, absl::Duration timeout = absl::Seconds(30));
  // … until it equals `value`.
  absl::Status WaitMetric(const std::string& name, const std::vector<std::string>& label_pieces, double value,
                          absl::Duration timeout = absl::Seconds(30));

  // Everything the server and its workers printed so far (stdout and
  // stderr go to one file; the destructor copies it to the test's stderr).
  std::string Log() const;

  void Signal(int sig);
  // The server's exit code.
  absl::StatusOr<int> WaitExit(absl::Duration timeout);

 private:
  ServerProcess(rpc::ChildProcess child, std::string socket_dir, std::string log_file)
      : child_(std::move(child)), socket_dir_(std::move(socket_dir)), log_file_(std::move(log_file)) {}

 public:
  // Kills the server (its workers die with it) and removes its socket folder.
  ~ServerProcess();

 private:
  rpc::ChildProcess child_;
  std::string socket_dir_;
  std::string log_file_;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::VaeDecoder::Stub> stub_;
};

struct DecodeOutcome {
  grpc::Status status;
  rpc::OutputAssembler output;
  absl::Status stream_error;  // the stream broke the protocol
  int messages = 0;
};

// One Decode call. `on_start(context)` runs once the call is started (the
// context stays valid until Decode returns: another thread may TryCancel
// it); `on_message(count, context)` after each message; `deadline` bounds
// the call.
DecodeOutcome Decode(v1::VaeDecoder::Stub& stub, const v1::DecodeRequest& request,
                     absl::Duration deadline = absl::Seconds(120),
                     const std::function<void(int, grpc::ClientContext&)>& on_message = nullptr,
                     const std::function<void(grpc::ClientContext&)>& on_start = nullptr);

// The value of the sample `name{labels}` in a Prometheus text exposition
// (labels in any order, as "k=\"v\"" pieces that must all appear), summed
// over every series that matches; -1 when none does.
// One Encode call: `request` with its image bytes (image.data or
// encoded_image) sent in pieces of at most `piece_bytes`, the first message
// carrying every other field; the response stream assembled as Decode's.
DecodeOutcome Encode(v1::VaeDecoder::Stub& stub, const v1::EncodeRequest& request, int64_t piece_bytes = 1 << 16,
                     absl::Duration deadline = absl::Seconds(120));

double MetricValue(const std::string& exposition, const std::string& name,
                   const std::vector<std::string>& label_pieces = {});

// Runs `command` with /bin/sh, stderr folded into stdout: its exit status
// (pclose's) and everything it printed.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

// Runs `promtool check metrics` on `exposition`: its combined output, or an
// error with it when promtool fails (FAILED_PRECONDITION, naming
// tools/setup.sh, when /usr/bin/promtool is not installed).
absl::StatusOr<std::string> PromtoolCheck(const std::string& exposition);

}  // namespace vaedecode::testing
