#include "worker/leader_service.h"

#include <chrono>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tiling/planner.h"
#include "tiling/tiled_decode.h"
#include "worker/counting_cpu_allocator.h"
#include "worker/output_stream.h"

namespace vaedecode::worker {
namespace {

void FillModelInfo(const NamedModel& m, const tiling::PeakProfile& profile, const std::string& dtype_name,
                   int world_size, v1::ModelInfo* out) {
  const families::ModelInfo& info = m.decoder->info();
  out->set_name(m.name);
  out->set_family(info.family);
  out->set_diffusers_class(info.diffusers_class);
  out->set_config_json(info.config_json);
  out->set_latent_channels(info.latent_channels);
  out->set_out_channels(info.out_channels);
  out->set_spatial_factor(info.spatial_factor);
  out->set_temporal_factor(info.temporal_factor);
  out->set_is_video(info.is_video);
  out->set_scaling_factor(info.scaling_factor);
  if (info.shift_factor) out->set_shift_factor(*info.shift_factor);
  out->set_raw_to_vae_formula(info.raw_to_vae_formula);
  out->set_parameter_count(info.parameter_count);
  out->set_dtype(dtype_name);
  out->set_peak_bytes_per_latent(profile.bytes_per_latent);
  out->set_fixed_peak_bytes(profile.fixed_bytes);
  out->add_supported_modes(v1::MODE_DENSE);
  out->add_supported_modes(v1::MODE_TILED);
  // A one-row latent is always shardable if the family has an adapter.
  const std::vector<int64_t> probe = info.is_video ? std::vector<int64_t>{1, info.latent_channels, 1, 64, 64}
                                                   : std::vector<int64_t>{1, info.latent_channels, 64, 64};
  if (world_size > 1 && m.decoder->CheckExactSharding(probe, world_size).ok()) {
    out->add_supported_modes(v1::MODE_EXACT);
  }
}

int64_t MaxChunkBytes(const grpc::ServerContext& context) {
  auto it = context.client_metadata().find(kMaxChunkBytesKey);
  int64_t value = 0;
  if (it != context.client_metadata().end() &&
      absl::SimpleAtoi(std::string(it->second.data(), it->second.size()), &value) && value > 0) {
    return value;
  }
  return kDefaultMaxChunkBytes;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::StatusOr<at::Tensor> LatentFromRequest(const v1::Tensor& latent) {
  at::ScalarType type;
  switch (latent.dtype()) {
    case v1::FLOAT32:
      type = at::kFloat;
      break;
    case v1::FLOAT16:
      type = at::kHalf;
      break;
    case v1::BFLOAT16:
      type = at::kBFloat16;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("latent dtype ", v1::DType_Name(latent.dtype()), " is not a float type (FLOAT32, FLOAT16, BFLOAT16)"));
  }
  std::vector<int64_t> shape(latent.shape().begin(), latent.shape().end());
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 1 || d > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(absl::StrCat("latent shape [", absl::StrJoin(shape, ", "), "] has a bad dimension"));
    }
    numel *= d;
    if (numel > (int64_t{1} << 34)) return absl::InvalidArgumentError("latent is too large");
  }
  const int64_t want = numel * static_cast<int64_t>(c10::elementSize(type));
  if (static_cast<int64_t>(latent.data().size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat("latent data has ", latent.data().size(), " bytes; shape [",
                                                   absl::StrJoin(shape, ", "), "] of ", v1::DType_Name(latent.dtype()),
                                                   " needs ", want));
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), latent.data().data(), static_cast<size_t>(want));
  return t;
}

LeaderService::LeaderService(GroupRuntime& runtime, std::string dtype_name,
                             std::vector<tiling::PeakProfile> profiles)
    : runtime_(runtime), dtype_name_(std::move(dtype_name)), profiles_(std::move(profiles)) {}

grpc::Status LeaderService::Models(grpc::ServerContext*, const v1::ListModelsRequest*,
                                   v1::ListModelsResponse* response) {
  for (size_t i = 0; i < runtime_.models().size(); ++i) {
    FillModelInfo(runtime_.models()[i], profiles_[i], dtype_name_, runtime_.world_size(), response->add_models());
  }
  return grpc::Status::OK;
}

grpc::Status LeaderService::Status(grpc::ServerContext*, const internal::StatusRequest*,
                                   internal::StatusResponse* response) {
  response->set_world_size(runtime_.world_size());
  response->set_decodes(runtime_.decodes());
  for (int64_t b : runtime_.free_bytes_per_rank()) response->add_free_bytes_per_rank(b);
  absl::MutexLock lock(&stats_mu_);
  for (int64_t b : last_peak_bytes_) response->add_peak_bytes_per_rank(b);
  return grpc::Status::OK;
}

grpc::Status LeaderService::Run(grpc::ServerContext* context, const v1::DecodeRequest* request,
                                grpc::ServerWriter<v1::DecodeResponse>* writer) {
  const int model = runtime_.FindModel(request->model());
  if (model < 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown model \"", request->model(), "\""));
  }
  absl::StatusOr<at::Tensor> latent = LatentFromRequest(request->latent());
  if (!latent.ok()) return ToGrpcStatus(latent.status());
  if (request->mode() == v1::MODE_TILED) return RunTiled(context, *request, model, *latent, writer);

  GroupJob job;
  job.model_index = model;
  job.allow_exact = request->mode() != v1::MODE_DENSE;
  job.decode.latent = *latent;
  job.decode.latent_space =
      request->latent_space() == v1::LATENT_SPACE_RAW ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
  // The sync API has no cancellation callback: a watcher polls the context
  // and raises the flag the group checks at every GroupNorm.
  std::atomic<bool> cancelled{false};
  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    while (!finished.load()) {
      if (context->IsCancelled()) {
        cancelled = true;
        return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  absl::StatusOr<DecodeOutcome> outcome = runtime_.Run(job, &cancelled);
  finished = true;
  watcher.join();
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  {
    absl::MutexLock lock(&stats_mu_);
    last_peak_bytes_.clear();
    for (const RankStats& r : outcome->ranks) last_peak_bytes_.push_back(r.peak_bytes);
  }

  const auto stream_start = std::chrono::steady_clock::now();
  v1::DecodeResponse header_message;
  v1::Header* header = header_message.mutable_header();
  header->set_request_id(request->request_id());
  header->set_mode(outcome->result.mode == "exact" ? v1::MODE_EXACT : v1::MODE_DENSE);
  header->set_degree(outcome->result.mode == "exact" ? runtime_.world_size() : 1);
  header->set_mode_reason(outcome->result.mode == "exact"
                              ? absl::StrCat("exact sharding over ", runtime_.world_size(), " ranks")
                              : (outcome->result.reason.empty() ? "one rank" : outcome->result.reason));
  if (absl::Status s = DescribeOutput(outcome->result.sample, request->output_format(), header); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!writer->Write(header_message)) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");

  absl::Status streamed = EmitChunks(outcome->result.sample, request->output_format(), MaxChunkBytes(*context),
                                     [&](v1::Chunk&& chunk) {
                                       if (context->IsCancelled()) return false;
                                       v1::DecodeResponse message;
                                       *message.mutable_chunk() = std::move(chunk);
                                       return writer->Write(message);
                                     });
  if (!streamed.ok()) return ToGrpcStatus(streamed);

  v1::DecodeResponse trailer_message;
  v1::Trailer* trailer = trailer_message.mutable_trailer();
  trailer->mutable_timings()->set_decode_ms(outcome->result.decode_ms);
  trailer->mutable_timings()->set_gather_ms(outcome->result.gather_ms);
  trailer->mutable_timings()->set_stream_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stream_start).count());
  for (const RankStats& r : outcome->ranks) trailer->add_peak_bytes_per_rank(r.peak_bytes);
  trailer->set_collectives(outcome->comm.collectives());
  writer->Write(trailer_message);
  return grpc::Status::OK;
}

namespace {

bool WriteAll(grpc::ServerContext* context, grpc::ServerWriter<v1::DecodeResponse>* writer,
              const at::Tensor& sample, const v1::DecodeRequest& request, v1::DecodeResponse header_message,
              v1::DecodeResponse trailer_message, absl::Status* status) {
  if (absl::Status s = DescribeOutput(sample, request.output_format(), header_message.mutable_header()); !s.ok()) {
    *status = s;
    return false;
  }
  if (!writer->Write(header_message)) return false;
  *status = EmitChunks(sample, request.output_format(), MaxChunkBytes(*context), [&](v1::Chunk&& chunk) {
    if (context->IsCancelled()) return false;
    v1::DecodeResponse message;
    *message.mutable_chunk() = std::move(chunk);
    return writer->Write(message);
  });
  if (!status->ok()) return false;
  return writer->Write(trailer_message);
}

std::string PlanText(const tiling::TilePlan& plan) {
  return absl::StrCat(plan.rows.starts.size(), "x", plan.cols.starts.size(), " tiles of ", plan.rows.tile, "x",
                      plan.cols.tile, " latents (", plan.reason, ")");
}

}  // namespace

grpc::Status LeaderService::RunTiled(grpc::ServerContext* context, const v1::DecodeRequest& request, int model,
                                     const at::Tensor& latent, grpc::ServerWriter<v1::DecodeResponse>* writer) {
  families::Decoder& decoder = *runtime_.models()[model].decoder;
  if (absl::Status valid = decoder.ValidateLatent(latent); !valid.ok()) return ToGrpcStatus(valid);
  const families::ModelInfo& info = decoder.info();
  tiling::FamilyGeometry geometry;
  geometry.spatial_factor = info.spatial_factor;
  geometry.stock_tile = info.stock_tile;
  geometry.stock_stride = info.stock_stride;
  geometry.peak_bytes_per_latent = profiles_[model].bytes_per_latent * static_cast<double>(latent.size(0));
  geometry.fixed_bytes = static_cast<int64_t>(profiles_[model].fixed_bytes);
  const int64_t free = FreeBytes();
  const int64_t budget = free >= 0 ? free : std::numeric_limits<int64_t>::max() / 2;
  const tiling::TilePlan plan = tiling::PlanTiles(latent.size(-2), latent.size(-1), geometry, budget);

  tiling::TiledResult result;
  double decode_ms = 0;
  const int64_t peak_before = CountingCpuAllocator::Installed() ? CountingCpuAllocator::Installed()->current_bytes() : 0;
  if (CountingCpuAllocator::Installed()) CountingCpuAllocator::Installed()->ResetPeak();
  absl::Status status = runtime_.RunLocal([&]() -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    at::Tensor z;
    absl::Status prepared = CatchExceptions("latent conversion", [&] {
      z = request.latent_space() == v1::LATENT_SPACE_RAW ? decoder.ToVaeSpace(latent.to(at::kFloat)) : latent;
      z = z.to(decoder.dtype()).contiguous();
    });
    if (!prepared.ok()) return prepared;
    families::DenseOps ops;
    absl::StatusOr<tiling::TiledResult> tiled =
        tiling::RunOomLadder(plan, geometry, [&](const tiling::TilePlan& p) -> absl::StatusOr<at::Tensor> {
          at::Tensor out;
          absl::Status s = CatchExceptions("tiled decode", [&] { out = tiling::DecodeTiles(decoder, z, p, ops); });
          if (!s.ok()) return s;
          return out;
        });
    decode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!tiled.ok()) return tiled.status();
    result = *std::move(tiled);
    return absl::OkStatus();
  });
  if (!status.ok()) return ToGrpcStatus(status);
  if (result.retries > 0) {
    spdlog::warn("tiled decode of request {} needed {} out-of-memory retr{}", request.request_id(), result.retries,
                 result.retries == 1 ? "y" : "ies");
  }

  v1::DecodeResponse header;
  header.mutable_header()->set_request_id(request.request_id());
  header.mutable_header()->set_mode(v1::MODE_TILED);
  header.mutable_header()->set_degree(1);
  header.mutable_header()->set_mode_reason(absl::StrCat("tiled to fit ", budget >> 20, " MiB free"));
  header.mutable_header()->set_tile_plan(PlanText(plan));
  v1::DecodeResponse trailer;
  trailer.mutable_trailer()->mutable_timings()->set_decode_ms(decode_ms);
  trailer.mutable_trailer()->set_tile_retries(result.retries);
  trailer.mutable_trailer()->set_tile_plan(PlanText(result.plan));
  if (CountingCpuAllocator::Installed()) {
    trailer.mutable_trailer()->add_peak_bytes_per_rank(CountingCpuAllocator::Installed()->peak_bytes() - peak_before);
  }
  absl::Status stream_status;
  if (!WriteAll(context, writer, result.sample, request, header, trailer, &stream_status)) {
    return stream_status.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away")
                              : ToGrpcStatus(stream_status);
  }
  return grpc::Status::OK;
}

}  // namespace vaedecode::worker
