// vaedecode_server: the gRPC decode service. Starts the worker groups, serves
// vaedecode.v1.VaeDecoder (plus grpc.health.v1 and reflection) and /metrics,
// and drains gracefully on SIGTERM, SIGINT or SIGHUP (exit code 0).

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "rpc/log_field.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address HOST:PORT (port 0: any free port)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for TLS on --listen; with --tls_key. Empty: plaintext");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates; when set, clients must present a certificate they signed (mutual TLS)");
ABSL_FLAG(std::string, model_repository, "",
          "Folder whose subfolders are diffusers VAE folders (model name = folder name); "
          "empty: the embedded default model, named \"default\"");
ABSL_FLAG(std::string, devices, "cpu:1", "Worker devices: cpu:N or cuda:0,1,...");
ABSL_FLAG(int, group_size, 1, "Ranks per worker group (groups are carved from --devices at start)");
ABSL_FLAG(int64_t, max_queue, 64, "Requests that may wait for a group; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "Largest request (latent) and response message");
ABSL_FLAG(int64_t, grpc_memory_mib, 0,
          "What gRPC may hold for all calls in flight, partial uploads included (beyond: streams reset "
          "RESOURCE_EXHAUSTED); 0 = 4 x --max_message_bytes, at least 256");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9090", "Prometheus /metrics address HOST:PORT; empty: none");
ABSL_FLAG(int, drain_timeout_s, 30, "On SIGTERM, how long calls in flight may take to finish");
ABSL_FLAG(int, max_connection_age_s, 300,
          "Close client connections after this long (GOAWAY, so clients reconnect and L4 load balancers "
          "spread them over replicas); 0 = never");
ABSL_FLAG(int, max_connection_age_grace_s, 600,
          "How long calls on a connection past its age may still take before it is closed; 0 = no limit");
ABSL_FLAG(std::string, worker_binary, "", "Path of vaedecode_worker; empty: the one beside this binary");
ABSL_FLAG(std::string, dtype, "float32", "Worker compute dtype: float32, bfloat16 or float16");
ABSL_FLAG(int, threads, 1, "Intra-op threads per worker process");
ABSL_FLAG(int, collective_timeout_s, 300, "Worker collective timeout");
ABSL_FLAG(double, heartbeat_timeout_s, 5,
          "A worker process silent this long (hung, stopped, swapped out) fails its group's request "
          "with UNAVAILABLE and the group is rebuilt; workers beat every 0.25 s. 0 = off");
ABSL_FLAG(int, cancel_release_timeout_s, 30,
          "A group whose leader is still busy this long after its request was cancelled is rebuilt; from 5 s "
          "on it is out of rotation and readiness says so (at least 10)");
ABSL_FLAG(int64_t, memory_budget_mib, 0,
          "Memory each worker rank may use on its device (its free memory for the exact/tiled/queue "
          "choice; allocations above it fail with an out-of-memory). 0 = CPU: unbounded, GPU: the whole GPU");
ABSL_FLAG(int, worker_start_timeout_s, 300, "How long a group may take to form and load its models");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "Largest Chunk.data in a Decode stream");
ABSL_FLAG(std::string, max_output_pixels, absl::StrCat(vaedecode::server::kDefaultMaxOutputPixels),
          "Largest output one request may ask for, in pixels (batch x frames x height x width): N for every "
          "model, then MODEL=M overrides (\"268435456,wan=100000000\"); 0 = only --max_message_bytes limits it. "
          "The default, 2^28, is 3 GiB of float32 RGB");
ABSL_FLAG(int64_t, max_attention_tokens, vaedecode::server::kDefaultMaxAttentionTokens,
          "For models with attention: the most latent positions of one frame (rows x columns) a request may "
          "have; one attention call runs over them all and its work grows with their square. 0 = no limit");
ABSL_FLAG(bool, allow_non_finite_latents, false,
          "Decode latents holding NaN/Inf (or values beyond a float16 model's range) instead of refusing them");
ABSL_FLAG(int64_t, max_call_output_mib, 512,
          "Finished output one call may hold in the server while its client reads (the group is released as soon "
          "as the decode is done); beyond it the group waits for the client");
ABSL_FLAG(int64_t, max_output_buffer_mib, 2048, "Finished output all calls together may hold in the server");
ABSL_FLAG(int, stream_stall_timeout_s, 30,
          "A client that reads nothing of its stream for this long is cancelled (its output is dropped)");
ABSL_FLAG(int, stream_read_timeout_s, 120,
          "The most a call's output may wait for its client in all (its writes' waits summed); a slower reader "
          "is cancelled, so a steady slow reader cannot hold a group or buffered output longer");
ABSL_FLAG(int, max_sessions_per_group, 8, "DecodeSession: sessions open at once on one worker group (0: none)");
ABSL_FLAG(int, session_idle_timeout_s, 60,
          "DecodeSession: a session whose client sends nothing for this long is ended and its state freed");
ABSL_FLAG(int64_t, session_history_mib, 256,
          "DecodeSession: latent history kept per session to rebuild its state after a worker dies; a session "
          "past it goes on but cannot survive its group's rebuild");
ABSL_FLAG(int64_t, session_state_budget_mib, 4096,
          "DecodeSession: what open sessions' decoder states may hold on each rank of a group; a session that "
          "would pass it is refused at open");
ABSL_FLAG(std::string, http_listen, "",
          "HTTP address HOST:PORT for diffusers' remote_decode() (POST /, /models/NAME; GET /health); "
          "empty: off");
ABSL_FLAG(std::string, http_default_model, "", "The model of POST / on --http_listen; empty: the only model served");
ABSL_FLAG(int, http_request_timeout_s, 600, "Deadline of each HTTP request, from its arrival");
ABSL_FLAG(int, http_header_timeout_s, 10,
          "An HTTP request's line and headers must arrive within this of their first byte (else 408)");
ABSL_FLAG(int, upload_timeout_s, 120,
          "A gRPC request whose message is still arriving after this has its connection closed (its calls fail "
          "UNAVAILABLE); 0 = off");
ABSL_FLAG(int, http_body_timeout_s, 120, "An HTTP request's body must arrive within this of its headers (else 408)");
ABSL_FLAG(std::string, socket_dir, "", "Folder for the leaders' Unix sockets; empty: a fresh /tmp folder");
ABSL_FLAG(std::string, ready_file, "",
          "Once listening, write \"grpc_port=P\\nmetrics_port=M\\nhttp_port=H\\n\" here (for scripts and tests)");
ABSL_FLAG(std::string, log_level, "info", "spdlog level: trace, debug, info, warn, error");

namespace {

int g_signal_pipe[2] = {-1, -1};

// Exit codes: 0 after a clean drain; 1 when the server cannot start (bad
// flags, ports); this one when the drain timeout had to cut calls.
constexpr int kExitDrainCutCalls = 3;

// Under `bazel run` the working directory is the runfiles tree: relative
// paths mean the caller's directory.
std::string ResolvePath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  // Async-signal-safe; a full pipe means a signal is already pending.
  ssize_t unused = write(g_signal_pipe[1], &c, 1);
  (void)unused;
}

int WaitForSignal() {
  char c = 0;
  while (read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "vaedecode_server --listen=HOST:PORT [--model_repository=DIR] "
      "[--devices=cpu:N|cuda:0,1] [--group_size=G] ...");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));

  // File descriptors: the soft limit up to the hard one (often 1024 of
  // 524288), so connections run out far later; each call holds a few.
  if (struct rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  // Installed before any thread exists; handlers only write to a pipe.
  if (pipe(g_signal_pipe) != 0) {
    std::perror("vaedecode_server: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // a closed terminal drains too, not kills

  vaedecode::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.tls_cert_file = ResolvePath(absl::GetFlag(FLAGS_tls_cert));
  options.tls_key_file = ResolvePath(absl::GetFlag(FLAGS_tls_key));
  options.tls_client_ca_file = ResolvePath(absl::GetFlag(FLAGS_tls_client_ca));
  options.model_repository = ResolvePath(absl::GetFlag(FLAGS_model_repository));
  options.devices = absl::GetFlag(FLAGS_devices);
  options.group_size = absl::GetFlag(FLAGS_group_size);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.grpc_memory_mib = absl::GetFlag(FLAGS_grpc_memory_mib);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  options.max_connection_age = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_s));
  options.max_connection_age_grace = absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_grace_s));
  options.worker_binary = ResolvePath(absl::GetFlag(FLAGS_worker_binary));
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.collective_timeout_s = absl::GetFlag(FLAGS_collective_timeout_s);
  options.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.cancel_release_timeout = absl::Seconds(absl::GetFlag(FLAGS_cancel_release_timeout_s));
  options.memory_budget_mib = absl::GetFlag(FLAGS_memory_budget_mib);
  options.worker_start_timeout = absl::Seconds(absl::GetFlag(FLAGS_worker_start_timeout_s));
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  absl::StatusOr<vaedecode::server::AdmissionLimits> admission =
      vaedecode::server::ParseOutputPixelLimits(absl::GetFlag(FLAGS_max_output_pixels));
  if (!admission.ok()) {
    spdlog::error("event=start_failed message={}", vaedecode::rpc::LogValue(admission.status().message()));
    return 1;
  }
  options.admission = *admission;
  options.admission.max_attention_tokens = absl::GetFlag(FLAGS_max_attention_tokens);
  options.admission.allow_non_finite = absl::GetFlag(FLAGS_allow_non_finite_latents);
  options.max_call_output_bytes = absl::GetFlag(FLAGS_max_call_output_mib) << 20;
  options.max_output_buffer_bytes = absl::GetFlag(FLAGS_max_output_buffer_mib) << 20;
  options.stream_stall_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_stall_timeout_s));
  options.stream_read_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_read_timeout_s));
  options.socket_dir = ResolvePath(absl::GetFlag(FLAGS_socket_dir));
  options.http_listen = absl::GetFlag(FLAGS_http_listen);
  options.http_default_model = absl::GetFlag(FLAGS_http_default_model);
  options.http_request_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_request_timeout_s));
  options.http_header_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_header_timeout_s));
  options.http_body_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_body_timeout_s));
  options.upload_timeout = absl::Seconds(absl::GetFlag(FLAGS_upload_timeout_s));
  options.sessions.max_sessions_per_group = absl::GetFlag(FLAGS_max_sessions_per_group);
  options.sessions.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_session_idle_timeout_s));
  options.sessions.max_history_bytes = absl::GetFlag(FLAGS_session_history_mib) << 20;
  options.sessions.state_budget_bytes_per_rank = absl::GetFlag(FLAGS_session_state_budget_mib) << 20;

  absl::StatusOr<std::unique_ptr<vaedecode::server::Server>> server = vaedecode::server::Server::Create(options);
  if (!server.ok()) {
    spdlog::error("event=start_failed message={}", vaedecode::rpc::LogValue(server.status().message()));
    return 1;
  }
  const std::string ready_file = ResolvePath(absl::GetFlag(FLAGS_ready_file));
  if (!ready_file.empty()) {
    const std::string tmp = ready_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc_port=" << (*server)->port() << "\nmetrics_port=" << (*server)->metrics_port()
          << "\nhttp_port=" << (*server)->http_port() << "\n";
    }
    std::rename(tmp.c_str(), ready_file.c_str());
  }

  const int sig = WaitForSignal();
  spdlog::info("event=signal signal={}", sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGINT");
  const absl::Status drained = (*server)->Drain(options.drain_timeout);
  if (!drained.ok()) spdlog::warn("event=drain message={}", vaedecode::rpc::LogValue(drained.message()));
  server->reset();
  // 3: the drain timeout cut calls (they were told UNAVAILABLE, retry).
  const int code = drained.ok() ? 0 : kExitDrainCutCalls;
  spdlog::info("event=exit code={}", code);
  return code;
}
