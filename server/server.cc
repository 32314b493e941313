#include "server/server.h"

#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/child_process.h"
#include "rpc/status_macros.h"
#include "server/device_spec.h"

namespace vaedecode::server {
namespace {

constexpr char kServiceName[] = "vaedecode.v1.VaeDecoder";
// Room for a Chunk's other fields and the message framing.
constexpr int64_t kMessageOverhead = 64 << 10;

// gRPC channel arguments are ints of milliseconds.
int MillisecondsArg(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), std::numeric_limits<int>::max()));
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": cannot read"));
  if (text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return text.str();
}

// Plaintext, TLS, or mutual TLS (client certificates required and checked
// against --tls_client_ca).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const ServerOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert_file.empty()) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls_cert", options.tls_cert_file));
  ASSIGN_OR_RETURN(std::string key, ReadPem("--tls_key", options.tls_key_file));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!options.tls_client_ca_file.empty()) {
    ASSIGN_OR_RETURN(std::string ca, ReadPem("--tls_client_ca", options.tls_client_ca_file));
    ssl.pem_root_certs = ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

bool IsExecutable(const std::string& path) {
  std::error_code ec;
  return !path.empty() && std::filesystem::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

}  // namespace

int64_t GrpcMemoryBytes(const ServerOptions& options) {
  if (options.grpc_memory_mib > 0) return options.grpc_memory_mib << 20;
  return std::max<int64_t>(4 * options.max_message_bytes, int64_t{256} << 20);
}

std::string ModelHealthName(const std::string& model) { return absl::StrCat(kServiceName, "/", model); }

absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag) {
  if (!flag.empty()) {
    if (IsExecutable(flag)) return std::filesystem::absolute(flag).string();
    return absl::InvalidArgumentError(absl::StrCat("--worker_binary=", flag, ": not an executable file"));
  }
  const std::filesystem::path self = rpc::SelfExecutable();
  std::vector<std::string> candidates = {
      (self.parent_path().parent_path() / "worker" / "vaedecode_worker").string(),
      self.string() + ".runfiles/vaedecode/worker/vaedecode_worker",
  };
  if (const char* runfiles = getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/vaedecode/worker/vaedecode_worker"));
  }
  if (const char* srcdir = getenv("TEST_SRCDIR")) {
    candidates.push_back(absl::StrCat(srcdir, "/vaedecode/worker/vaedecode_worker"));
  }
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return absl::InvalidArgumentError(
      "cannot find vaedecode_worker beside the server; build //worker:vaedecode_worker or "
      "pass --worker_binary");
}

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options) {
  ASSIGN_OR_RETURN(std::vector<std::string> devices, ParseDevices(options.devices));
  ASSIGN_OR_RETURN(std::vector<GroupSpec> groups, CarveGroups(devices, options.group_size));
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListRepositoryModels(options.model_repository));
  ASSIGN_OR_RETURN(std::string worker_binary, FindWorkerBinary(options.worker_binary));
  if (options.max_queue < 1) {
    // Every request waits in the queue, if only for a moment.
    return absl::InvalidArgumentError(absl::StrCat("--max_queue=", options.max_queue, ": must be at least 1"));
  }
  if (options.max_message_bytes < (1 << 20) || options.max_message_bytes > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", options.max_message_bytes, ": must be in [1 MiB, 2 GiB)"));
  }
  if (options.chunk_bytes < 1024 || options.chunk_bytes > options.max_message_bytes - kMessageOverhead) {
    return absl::InvalidArgumentError(absl::StrCat("--chunk_bytes=", options.chunk_bytes,
                                                   ": must be at least 1024 and leave 64 KiB "
                                                   "below --max_message_bytes=",
                                                   options.max_message_bytes));
  }

  if (options.upload_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--upload_timeout_s must not be negative (0: off)");
  }
  if (options.admission.max_attention_tokens < 0) {
    return absl::InvalidArgumentError("--max_attention_tokens must not be negative (0: no limit)");
  }
  if (options.cancel_release_timeout < absl::Seconds(10)) {
    return absl::InvalidArgumentError(
        "--cancel_release_timeout_s must be at least 10 (a group goes out of rotation 5 s after the cancel)");
  }
  if (options.heartbeat_timeout != absl::ZeroDuration() && options.heartbeat_timeout < absl::Seconds(1)) {
    // Beats come every 0.25 s; less than four of them would fail busy ranks.
    return absl::InvalidArgumentError("--heartbeat_timeout_s must be 0 (off) or at least 1");
  }
  if (options.max_call_output_bytes < options.chunk_bytes ||
      options.max_output_buffer_bytes < options.max_call_output_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--max_call_output_mib (", options.max_call_output_bytes >> 20,
                                                   " MiB) must hold a chunk and be at most --max_output_buffer_mib (",
                                                   options.max_output_buffer_bytes >> 20, " MiB)"));
  }
  if (options.sessions.max_sessions_per_group < 0 || options.sessions.idle_timeout < absl::Seconds(1) ||
      options.sessions.max_history_bytes < 0 || options.sessions.state_budget_bytes_per_rank < 0) {
    return absl::InvalidArgumentError(
        "--max_sessions_per_group, --session_history_mib and --session_state_budget_mib must not be negative, "
        "--session_idle_timeout_s at least 1");
  }
  if (options.stream_stall_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--stream_stall_timeout_s must be at least 1");
  }
  if (options.stream_read_timeout < options.stream_stall_timeout) {
    return absl::InvalidArgumentError("--stream_read_timeout_s must be at least --stream_stall_timeout_s");
  }
  if (options.grpc_memory_mib < 0 || GrpcMemoryBytes(options) < 2 * options.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("--grpc_memory_mib=", options.grpc_memory_mib,
                                                   ": must hold two requests of --max_message_bytes (at least ",
                                                   (2 * options.max_message_bytes) >> 20, "), or be 0 (the default)"));
  }
  if (options.http_header_timeout < absl::Seconds(1) || options.http_body_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_header_timeout_s and --http_body_timeout_s must be at least 1");
  }
  if (options.max_connection_age < absl::ZeroDuration() || options.max_connection_age_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--max_connection_age_s and --max_connection_age_grace_s must not be negative");
  }

  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  s->options_.worker_binary = worker_binary;
  s->registry_ = std::make_shared<prometheus::Registry>();
  s->metrics_ = std::make_unique<ServerMetrics>(*s->registry_);
  s->catalog_ = std::make_unique<ModelCatalog>(names);
  ServerMetrics* metrics = s->metrics_.get();
  s->scheduler_ =
      std::make_unique<Scheduler>(options.max_queue, [metrics](int64_t depth) { metrics->SetQueueDepth(depth); });
  DecodeServiceOptions service_options;
  service_options.group_size = options.group_size;
  service_options.max_request_bytes = options.max_message_bytes;
  service_options.admission = options.admission;
  service_options.max_call_output_bytes = options.max_call_output_bytes;
  service_options.max_output_buffer_bytes = options.max_output_buffer_bytes;
  service_options.stream_stall_timeout = options.stream_stall_timeout;
  service_options.stream_read_timeout = options.stream_read_timeout;
  service_options.upload_timeout = options.upload_timeout;
  service_options.sessions = options.sessions;
  s->service_ = std::make_unique<DecodeService>(service_options, *s->scheduler_, *s->catalog_, *s->metrics_);

  if (!options.metrics_listen.empty()) {
    try {
      // civetweb's defaults (2 threads, 30 s per request, keep-alive) let four
      // slow connections block every scrape, blinding alerts exactly when
      // the service is attacked: more threads, requests (headers included)
      // cut after 5 s, one request per connection.
      s->exposer_ = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", options.metrics_listen, "num_threads", "16", "request_timeout_ms",
                                   "5000", "enable_keep_alive", "no"});
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("--metrics_listen=", options.metrics_listen, ": ", e.what()));
    }
    s->exposer_->RegisterCollectable(s->registry_);
    const std::vector<int> ports = s->exposer_->GetListeningPorts();
    s->metrics_port_ = ports.empty() ? 0 : ports[0];
  }

  grpc::EnableDefaultHealthCheckService(true);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, ServerCredentials(options));
  Server* raw = s.get();
  // OIP replies are one message: what fits under the send limit.
  s->oip_answers_ = std::make_unique<OipAnswers>(*s->catalog_, *s->metrics_, [raw] { return raw->Serving(); });
  s->oip_ = std::make_unique<OipService>(*s->service_, *s->oip_answers_, options.max_message_bytes - kMessageOverhead);
  s->surface_ = std::make_unique<PublicSurface>(
      std::vector<std::string>{kServiceName, "inference.GRPCInferenceService", "grpc.health.v1.Health",
                               "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
  s->reflection_v1_ = std::make_unique<ReflectionV1>(*s->surface_);
  s->reflection_v1alpha_ = std::make_unique<ReflectionV1Alpha>(*s->surface_);
  s->unserved_ = std::make_unique<UnservedMethods>(*s->surface_);
  grpc::ServerBuilder builder;
  // The port is ours (server/grpc_listener.h): gRPC 1.51's own listener
  // stops for good once descriptors run out.
  ASSIGN_OR_RETURN(s->listener_, GrpcListener::Bind(options.listen));
  s->port_ = s->listener_->port();
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->oip_.get());
  builder.RegisterService(s->reflection_v1_.get());
  builder.RegisterService(s->reflection_v1alpha_.get());
  builder.RegisterCallbackGenericService(s->unserved_.get());
  // Compressed requests are refused (UNIMPLEMENTED, naming the algorithm):
  // gRPC inflates a message before any limit applies, and 1 MiB of gzip
  // became 1.1 GB of server memory. Latents hardly compress anyway.
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);

  // gRPC refuses what is over its limit before any service sees it, so such
  // refusals could not be counted or explained: its limit is twice ours,
  // and the service refuses (and counts) what lies between.
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(2 * options.max_message_bytes, std::numeric_limits<int>::max())));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // What the gRPC transport may hold for all calls in flight: partial
  // uploads were unbounded (20 stalled 60 MiB uploads held 1.1 GB). Past the
  // quota gRPC resets streams with RESOURCE_EXHAUSTED until it fits.
  grpc::ResourceQuota quota("vaedecode_grpc");
  quota.Resize(static_cast<size_t>(GrpcMemoryBytes(options)));
  builder.SetResourceQuota(quota);
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, MillisecondsArg(options.max_connection_age));
    // A grace of 0 would cut calls in flight at the GOAWAY: it means "no limit".
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               options.max_connection_age_grace > absl::ZeroDuration()
                                   ? MillisecondsArg(options.max_connection_age_grace)
                                   : std::numeric_limits<int>::max());
  }
  s->grpc_server_ = builder.BuildAndStart();
  if (!s->grpc_server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen=", options.listen));
  }
  s->listener_->Start(std::move(acceptor));
  if (options.upload_timeout > absl::ZeroDuration()) {
    s->upload_watchdog_ = std::make_unique<UploadWatchdog>(options.upload_timeout, s->port_);
  }
  s->catalog_->SetListener([raw] {
    raw->UpdateHealth();
    raw->FailQueuedForUnloadableModels();
  });
  s->UpdateHealth();
  if (!options.http_listen.empty()) {
    if (!options.http_default_model.empty() && !s->catalog_->Lookup(options.http_default_model).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--http_default_model=", options.http_default_model,
                                                     ": not a model of this server (",
                                                     absl::StrJoin(s->catalog_->Names(), ", "), ")"));
    }
    HttpEndpointOptions http;
    http.listen = options.http_listen;
    http.default_model = options.http_default_model;
    http.request_timeout = options.http_request_timeout;
    http.max_request_bytes = options.max_message_bytes;
    http.max_output_bytes = options.max_call_output_bytes;
    // Each connection holds a thread, also while its request is queued:
    // room for a full queue and one running request per group.
    http.connections.max_connections = static_cast<int>(std::clamp<int64_t>(options.max_queue + 8, 8, 256));
    http.connections.header_timeout = options.http_header_timeout;
    http.connections.body_timeout = options.http_body_timeout;
    http.connections.write_timeout = options.stream_read_timeout;
    ASSIGN_OR_RETURN(
        std::unique_ptr<HttpEndpoint> endpoint,
        HttpEndpoint::Start(http, *s->service_, *s->catalog_, *s->oip_answers_, [raw] { return raw->Serving(); }));
    s->http_ = std::move(endpoint);
  }
  if (s->exposer_) {
    s->port_counts_ = std::make_shared<PortCounts>(*s->listener_, s->upload_watchdog_.get(), s->http_.get());
    s->exposer_->RegisterCollectable(s->port_counts_);
  }

  s->socket_dir_ = options.socket_dir;
  if (s->socket_dir_.empty()) {
    char tmpl[] = "/tmp/vaedecode-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return absl::UnavailableError("cannot create a socket folder under /tmp");
    }
    s->socket_dir_ = tmpl;
    s->own_socket_dir_ = true;
  } else {
    // Checked here, once: a folder the leaders cannot bind in made every
    // group restart forever.
    std::error_code ec;
    if (!std::filesystem::is_directory(s->socket_dir_, ec) || access(s->socket_dir_.c_str(), W_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--socket_dir=", s->socket_dir_, ": not a writable folder"));
    }
  }
  // A Unix socket's path is at most 107 bytes: "<dir>/<group>-inc<N>.sock".
  constexpr size_t kSocketPathMax = 107, kSocketNameMax = 40;
  if (s->socket_dir_.size() + 1 + kSocketNameMax > kSocketPathMax) {
    return absl::InvalidArgumentError(absl::StrCat("--socket_dir=", s->socket_dir_, ": longer than ",
                                                   kSocketPathMax - 1 - kSocketNameMax,
                                                   " bytes, too long for the Unix sockets inside it"));
  }

  for (const GroupSpec& spec : groups) {
    WorkerGroupOptions g;
    g.name = spec.name;
    g.devices = spec.devices;
    g.worker_binary = s->options_.worker_binary;
    g.model_repository =
        options.model_repository.empty() ? "" : std::filesystem::absolute(options.model_repository).string();
    g.dtype = options.dtype;
    g.threads = options.threads;
    g.collective_timeout_s = options.collective_timeout_s;
    g.heartbeat_timeout = options.heartbeat_timeout;
    g.cancel_release_timeout = options.cancel_release_timeout;
    g.memory_budget_mib = options.memory_budget_mib;
    g.socket_dir = s->socket_dir_;
    g.start_timeout = options.worker_start_timeout;
    g.max_chunk_bytes = options.chunk_bytes;
    s->groups_.push_back(std::make_unique<WorkerGroup>(g, *s->scheduler_, *s->catalog_, *s->metrics_));
  }
  // Sessions are admitted against the memory each group last reported.
  s->service_->SetGroupCapacity([groups = &s->groups_](const std::string& name) -> int64_t {
    for (const std::unique_ptr<WorkerGroup>& g : *groups) {
      if (g->name() == name) return g->capacity_bytes_per_rank();
    }
    return -1;
  });
  for (auto& g : s->groups_) g->Start();
  spdlog::info(
      "event=listening address={} port={} tls={} metrics_port={} http_port={} groups={} group_size={} "
      "worker={}",
      options.listen, s->port_,
      options.tls_cert_file.empty()        ? "off"
      : options.tls_client_ca_file.empty() ? "server"
                                           : "mutual",
      s->metrics_port_, s->http_port(), s->groups_.size(), options.group_size, s->options_.worker_binary);
  return s;
}

bool Server::Serving() {
  {
    absl::MutexLock lock(&health_mu_);
    if (health_final_) return false;
  }
  for (const std::string& name : catalog_->Names()) {
    if (catalog_->Serving(name)) return true;
  }
  return false;
}

void Server::FailQueuedForUnloadableModels() {
  scheduler_->FailQueued([this](const Job& job) { return catalog_->Lookup(job.model().name()).status(); });
}

void Server::UpdateHealth() {
  absl::MutexLock lock(&health_mu_);
  if (health_final_ || !grpc_server_) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  bool any = false;
  for (const std::string& name : catalog_->Names()) {
    const bool serving = catalog_->Serving(name);
    any |= serving;
    health->SetServingStatus(ModelHealthName(name), serving);
  }
  health->SetServingStatus("", any);
  health->SetServingStatus(kServiceName, any);
}

absl::Status Server::Drain(absl::Duration timeout) {
  if (drained_) return absl::OkStatus();
  drained_ = true;
  const absl::Time start = absl::Now();
  spdlog::info("event=drain_start active_calls={} queued={} timeout_s={}", service_->active_calls(),
               scheduler_->depth(), absl::ToDoubleSeconds(timeout));
  {
    absl::MutexLock lock(&health_mu_);
    health_final_ = true;
    // Every service NOT_SERVING, and later changes ignored.
    if (grpc_server_ && grpc_server_->GetHealthCheckService()) {
      grpc_server_->GetHealthCheckService()->Shutdown();
    }
  }
  service_->StopAccepting();
  scheduler_->Close();
  const absl::Time deadline = start + timeout;
  while (service_->active_calls() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const int64_t cut = service_->active_calls();
  if (cut > 0) {
    // Ended with the server's reason first; gRPC's shutdown below would say
    // only "Cancelling all calls".
    service_->CancelAll(absl::UnavailableError(absl::StrCat("the server is shutting down and its drain timeout (",
                                                            absl::FormatDuration(timeout),
                                                            ") cut this call; retry on another replica")));
    const absl::Time grace = absl::Now() + absl::Seconds(1);
    while (service_->active_calls() > 0 && absl::Now() < grace) absl::SleepFor(absl::Milliseconds(10));
  }
  // Its requests are done or cancelled by now: this closes the port.
  if (http_) http_->Stop();
  // Cancels whatever is left; returns once every call is done.
  listener_->Stop();
  grpc_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  grpc_server_->Wait();
  spdlog::debug("event=drain_grpc_down ms={:.0f}", absl::ToDoubleMilliseconds(absl::Now() - start));
  for (auto& g : groups_) g->Stop();
  spdlog::debug("event=drain_workers_stopped ms={:.0f}", absl::ToDoubleMilliseconds(absl::Now() - start));
  exposer_.reset();
  if (own_socket_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(socket_dir_, ec);
  }
  spdlog::info("event=drain_done cancelled_calls={} drain_ms={:.0f}", cut,
               absl::ToDoubleMilliseconds(absl::Now() - start));
  if (cut > 0) {
    return absl::DeadlineExceededError(
        absl::StrCat(cut, " call(s) were still running after the drain timeout and were cancelled"));
  }
  return absl::OkStatus();
}

Server::~Server() {
  if (!drained_ && grpc_server_) Drain(absl::ZeroDuration()).IgnoreError();
  for (auto& g : groups_) g->Stop();
}

}  // namespace vaedecode::server
