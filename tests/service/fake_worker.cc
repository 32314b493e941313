// A torch-free stand-in for vaedecode_worker with the same flags and the same
// GroupLeader protocol, for testing the server's scheduling, supervision,
// drain and error paths fast and without LibTorch.
//
// Rank 0 serves GroupLeader on --socket; other ranks only live (and can be
// killed). Each model (a --model_repository subfolder, or "default") is an
// image model with 4 latent channels and spatial factor 8 whose "decode" is a
// nearest-neighbour upsample of latent channels 0..2 (FLOAT32 input, FLOAT32
// output only). Test hooks, read from the request id:
//   "sleep=N"    sleep N ms before each chunk (cancellation stops it)
//   "crash"      the leader exits mid-stream (after the first chunk)
// FAKE_WORKER_START_DELAY_MS delays readiness; while the file named by
// FAKE_WORKER_FAIL_START_FILE exists, rank 0 exits at once with code 4.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vaedecode/internal/worker.grpc.pb.h"

ABSL_FLAG(int, rank, 0, "");
ABSL_FLAG(int, world, 1, "");
ABSL_FLAG(std::string, group, "", "");
ABSL_FLAG(int, store_port, 0, "");
ABSL_FLAG(std::string, socket, "", "");
ABSL_FLAG(std::string, model_repository, "", "");
ABSL_FLAG(std::string, device, "cpu:0", "");
ABSL_FLAG(std::string, dtype, "float32", "");
ABSL_FLAG(int, threads, 1, "");
ABSL_FLAG(int, collective_timeout_s, 300, "");

namespace {

namespace v1 = vaedecode::v1;
namespace internal = vaedecode::internal;

constexpr int kFactor = 8;

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : 0;
}

int RequestSleepMs(const std::string& id) {
  const size_t at = id.find("sleep=");
  if (at == std::string::npos) return 0;
  int ms = 0;
  size_t end = at + 6;
  while (end < id.size() && isdigit(id[end])) ++end;
  return absl::SimpleAtoi(id.substr(at + 6, end - at - 6), &ms) ? ms : 0;
}

class FakeLeader final : public internal::GroupLeader::Service {
 public:
  explicit FakeLeader(std::vector<std::string> names) : names_(std::move(names)) {}

  grpc::Status Models(grpc::ServerContext*, const v1::ListModelsRequest*,
                      v1::ListModelsResponse* response) override {
    for (const std::string& name : names_) {
      v1::ModelInfo* m = response->add_models();
      m->set_name(name);
      m->set_family("fake");
      m->set_diffusers_class("FakeAutoencoder");
      m->set_latent_channels(4);
      m->set_out_channels(3);
      m->set_spatial_factor(kFactor);
      m->set_temporal_factor(1);
      m->set_scaling_factor(1.0);
      m->add_supported_modes(v1::MODE_DENSE);
      m->add_supported_modes(v1::MODE_EXACT);
      m->set_dtype("float32");
    }
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext*, const internal::StatusRequest*,
                      internal::StatusResponse* response) override {
    const int world = absl::GetFlag(FLAGS_world);
    response->set_world_size(world);
    response->set_decodes(decodes_.load());
    for (int r = 0; r < world; ++r) {
      response->add_free_bytes_per_rank(int64_t{8} << 30);
      response->add_peak_bytes_per_rank(int64_t{1} << 20);
    }
    return grpc::Status::OK;
  }

  grpc::Status Run(grpc::ServerContext* ctx, const v1::DecodeRequest* request,
                   grpc::ServerWriter<v1::DecodeResponse>* writer) override {
    std::lock_guard<std::mutex> one_at_a_time(run_mu_);
    bool known = false;
    for (const auto& n : names_) known |= n == request->model();
    if (!known) return grpc::Status(grpc::StatusCode::NOT_FOUND, "fake: unknown model");
    const v1::Tensor& latent = request->latent();
    if (latent.dtype() != v1::FLOAT32 || latent.shape_size() != 4 || latent.shape(1) != 4) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "fake: FLOAT32 [B,4,H,W] only");
    }
    if (request->output_format() != v1::OUTPUT_FLOAT32) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake: OUTPUT_FLOAT32 only");
    }
    int64_t max_chunk = 4 << 20;
    auto it = ctx->client_metadata().find("x-max-chunk-bytes");
    if (it != ctx->client_metadata().end()) {
      absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &max_chunk);
    }
    const int64_t B = latent.shape(0), h = latent.shape(2), w = latent.shape(3);
    const int64_t H = h * kFactor, W = w * kFactor, C = 3;
    const int world = absl::GetFlag(FLAGS_world);
    const bool exact = request->mode() != v1::MODE_DENSE && world > 1;
    const float* in = reinterpret_cast<const float*>(latent.data().data());

    v1::DecodeResponse header;
    v1::Header* hd = header.mutable_header();
    hd->set_request_id(request->request_id());
    for (int64_t d : {B, C, H, W}) hd->add_shape(d);
    hd->set_dtype(v1::FLOAT32);
    hd->set_output_format(v1::OUTPUT_FLOAT32);
    hd->set_mode(exact ? v1::MODE_EXACT : v1::MODE_DENSE);
    hd->set_degree(exact ? world : 1);
    hd->set_mode_reason("fake");
    hd->set_frames(1);
    hd->set_height(H);
    hd->set_width(W);
    if (!writer->Write(header)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");

    const int sleep_ms = RequestSleepMs(request->request_id());
    const bool crash = request->request_id().find("crash") != std::string::npos;
    const int64_t row_bytes = C * W * 4;
    const int64_t rows_per_chunk = std::max<int64_t>(1, max_chunk / row_bytes);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t r0 = 0; r0 < H; r0 += rows_per_chunk) {
        if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
        if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        const int64_t r1 = std::min(H, r0 + rows_per_chunk);
        std::string data((r1 - r0) * row_bytes, '\0');
        float* out = reinterpret_cast<float*>(data.data());
        for (int64_t c = 0; c < C; ++c)
          for (int64_t y = r0; y < r1; ++y)
            for (int64_t x = 0; x < W; ++x)
              out[(c * (r1 - r0) + (y - r0)) * W + x] =
                  in[((b * 4 + c) * h + y / kFactor) * w + x / kFactor];
        v1::DecodeResponse chunk;
        v1::Chunk* ch = chunk.mutable_chunk();
        ch->set_batch_index(b);
        ch->set_frame(0);
        ch->set_row_begin(r0);
        ch->set_row_end(r1);
        ch->set_data(std::move(data));
        if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
        if (crash) _exit(3);
      }
    }
    ++decodes_;
    v1::DecodeResponse trailer;
    trailer.mutable_trailer()->mutable_timings()->set_decode_ms(1.0);
    trailer.mutable_trailer()->mutable_timings()->set_gather_ms(0.5);
    for (int r = 0; r < (exact ? world : 1); ++r)
      trailer.mutable_trailer()->add_peak_bytes_per_rank(1 << 20);
    trailer.mutable_trailer()->set_collectives(exact ? 7 : 0);
    writer->Write(trailer);
    return grpc::Status::OK;
  }

 private:
  const std::vector<std::string> names_;
  std::mutex run_mu_;
  std::atomic<int64_t> decodes_{0};
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rank) != 0) {
    while (true) pause();  // a peer: lives until killed
  }
  if (const char* f = std::getenv("FAKE_WORKER_FAIL_START_FILE");
      f != nullptr && std::filesystem::exists(f)) {
    return 4;
  }
  std::vector<std::string> names;
  const std::string repo = absl::GetFlag(FLAGS_model_repository);
  if (repo.empty()) {
    names.push_back("default");
  } else {
    for (const auto& e : std::filesystem::directory_iterator(repo)) {
      if (e.is_directory()) names.push_back(e.path().filename().string());
    }
  }
  if (int ms = EnvInt("FAKE_WORKER_START_DELAY_MS"); ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  FakeLeader service(names);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + absl::GetFlag(FLAGS_socket),
                           grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(-1);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return 5;
  server->Wait();
  return 0;
}
