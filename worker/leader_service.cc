#include "worker/leader_service.h"

#include <chrono>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/compute_device.h"
#include "rpc/log_field.h"
#include "rpc/status.h"
#include "tiling/planner.h"
#include "worker/decode_job.h"
#include "worker/output_stream.h"
#include "worker/tiled_group_decode.h"

namespace vaedecode::worker {
namespace {

void FillModelInfo(const NamedModel& m, const tiling::PeakProfile& profile,
                   int world_size, v1::ModelInfo* out) {
  const families::ModelInfo& info = m.decoder->info();
  out->set_name(m.name);
  out->set_family(info.family);
  out->set_diffusers_class(info.diffusers_class);
  out->set_config_json(info.config_json);
  out->set_latent_channels(info.latent_channels);
  out->set_raw_latent_channels(info.raw_latent_channels > 0 ? info.raw_latent_channels : info.latent_channels);
  out->set_raw_patch(info.raw_patch);
  out->set_out_channels(info.out_channels);
  out->set_spatial_factor(info.spatial_factor);
  out->set_temporal_factor(info.temporal_factor);
  out->set_is_video(info.is_video);
  out->set_timestep_conditioning(info.timestep_conditioning);
  out->set_scaling_factor(info.scaling_factor);
  if (info.shift_factor) out->set_shift_factor(*info.shift_factor);
  out->set_raw_to_vae_formula(info.raw_to_vae_formula);
  out->set_parameter_count(info.parameter_count);
  out->set_dtype(families::DtypeName(m.decoder->dtype()));
  out->set_peak_bytes_per_latent(profile.bytes_per_latent);
  out->set_fixed_peak_bytes(profile.fixed_bytes);
  out->set_attention_bytes_per_latent_pair(profile.attention_bytes_per_latent_pair);
  out->set_attention_fixed_bytes(profile.attention_fixed_bytes);
  out->set_attention_bytes_per_latent(profile.attention_bytes_per_latent);
  out->add_supported_modes(v1::MODE_DENSE);
  out->add_supported_modes(v1::MODE_TILED);
  // A one-row latent is always shardable if the family has an adapter.
  const std::vector<int64_t> probe = info.is_video ? std::vector<int64_t>{1, info.latent_channels, 1, 64, 64}
                                                   : std::vector<int64_t>{1, info.latent_channels, 64, 64};
  if (world_size > 1 && m.decoder->CheckExactSharding(probe, world_size).ok()) {
    out->add_supported_modes(v1::MODE_EXACT);
  }
}

// (1 - s) * latent + s * N(0, 1) in float32, the noise from LibTorch's CPU
// generator seeded with `seed`: torch.randn(shape, generator=
// torch.Generator().manual_seed(seed)), whatever device decodes.
at::Tensor MixDecodeNoise(const at::Tensor& latent, double scale, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor noise = at::randn(latent.sizes(), generator, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor z = latent.to(at::kCPU).to(at::kFloat);
  return ((1 - scale) * z + scale * noise).to(latent.device()).contiguous();
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

LeaderService::LeaderService(GroupRuntime& runtime, at::ScalarType requested_dtype,
                             std::vector<tiling::PeakProfile> profiles)
    : runtime_(runtime), requested_dtype_(requested_dtype), profiles_(std::move(profiles)) {}

grpc::Status LeaderService::Models(grpc::ServerContext*, const v1::ListModelsRequest*,
                                   v1::ListModelsResponse* response) {
  for (size_t i = 0; i < runtime_.models().size(); ++i) {
    FillModelInfo(runtime_.models()[i], profiles_[i], runtime_.world_size(), response->add_models());
  }
  return grpc::Status::OK;
}

grpc::Status LeaderService::Status(grpc::ServerContext*, const internal::StatusRequest* request,
                                   internal::StatusResponse* response) {
  response->set_idle(runtime_.WaitIdle(absl::Milliseconds(std::max<int64_t>(0, request->wait_idle_ms()))));
  response->set_world_size(runtime_.world_size());
  response->set_decodes(runtime_.decodes());
  for (int64_t b : runtime_.free_bytes_per_rank()) response->add_free_bytes_per_rank(b);
  for (int64_t b : runtime_.capacity_bytes_per_rank()) response->add_capacity_bytes_per_rank(b);
  absl::MutexLock lock(&stats_mu_);
  for (int64_t b : last_peak_bytes_) response->add_peak_bytes_per_rank(b);
  return grpc::Status::OK;
}

grpc::Status LeaderService::Run(grpc::ServerContext* context, const v1::DecodeRequest* request,
                                grpc::ServerWriter<v1::DecodeResponse>* writer) {
  const GroupRuntime::Call call(runtime_);  // for the server's wait-for-idle after a cancel
  device::UseComputeDevice(runtime_.device());  // a gRPC thread: make the worker's GPU current
  const int model = runtime_.FindModel(request->model());
  if (model < 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("unknown model \"", request->model(), "\""));
  }
  absl::StatusOr<at::Tensor> latent = LatentFromRequest(request->latent());
  if (!latent.ok()) return rpc::ToGrpcStatus(latent.status());
  GroupJob job;
  job.model_index = model;
  job.allow_exact = request->mode() != v1::MODE_DENSE;
  job.decode.latent = *latent;
  job.decode.latent_space =
      request->latent_space() == v1::LATENT_SPACE_RAW ? families::LatentSpace::kRaw : families::LatentSpace::kVae;
  if (request->has_decode_timestep()) job.decode.conditioning.timestep = request->decode_timestep();
  // LTX2Pipeline's decode noise, mixed into the latent as sent (before any
  // de-normalisation), once, here: every rank and tile gets the same latent.
  std::optional<uint64_t> noise_seed;
  const double noise_scale = request->has_decode_noise_scale() ? request->decode_noise_scale()
                                                               : request->decode_timestep();
  if (noise_scale != 0) {
    noise_seed = request->has_noise_seed() ? request->noise_seed() : std::random_device{}();
    absl::Status noised = CatchExceptions("decode noise", [&] {
      job.decode.latent = MixDecodeNoise(job.decode.latent, noise_scale, *noise_seed);
    });
    if (!noised.ok()) return rpc::ToGrpcStatus(noised);
  }
  if (request->has_scaling_factor()) {
    // The request's own de-normalisation (remote_decode's scaling_factor and
    // shift_factor) in place of the family's: once, here, so every rank and
    // every tile gets the VAE-space latent. float32, as diffusers computes it.
    absl::Status converted = CatchExceptions("latent scaling", [&] {
      at::Tensor z = job.decode.latent.to(at::kFloat) / request->scaling_factor();
      if (request->has_shift_factor()) z = z + request->shift_factor();
      job.decode.latent = z.contiguous();
    });
    if (!converted.ok()) return rpc::ToGrpcStatus(converted);
    job.decode.latent_space = families::LatentSpace::kVae;
  }
  std::string tiled_reason, planned_tiles;
  if (request->mode() == v1::MODE_TILED) {
    absl::StatusOr<tiling::TilePlan> plan = PlanTiledJob(model, job.decode.latent, &job);
    if (!plan.ok()) return rpc::ToGrpcStatus(plan.status());
    tiled_reason = plan->reason;
    planned_tiles = DescribePlan(*plan, runtime_.world_size());
  }
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
  // Tiled single images stream row bands as soon as no later tile touches
  // them: the header goes first (the output shape is known from the latent).
  // Other outputs stream after the decode.
  const families::Decoder& decoder = *runtime_.models()[model].decoder;
  const std::vector<int64_t> out_shape = decoder.OutputShape(job.decode.latent.sizes().vec());
  const bool incremental = request->mode() == v1::MODE_TILED && request->output_format() != v1::OUTPUT_PNG &&
                           request->output_format() != v1::OUTPUT_JPEG && request->output_format() != v1::OUTPUT_MP4 &&
                           out_shape[0] == 1 && (out_shape.size() == 4 || out_shape[2] == 1);
  const auto stream_start = std::chrono::steady_clock::now();
  bool header_sent = false;
  bool caller_gone = false;
  int64_t streamed_rows = 0;
  absl::Status stream_status;
  auto write_header = [&](const std::string& mode_used, const std::string& reason, const std::string& tile_plan,
                          int degree) {
    v1::DecodeResponse message;
    v1::Header* header = message.mutable_header();
    header->set_request_id(request->request_id());
    header->set_mode(mode_used == "exact" ? v1::MODE_EXACT : mode_used == "tiled" ? v1::MODE_TILED : v1::MODE_DENSE);
    header->set_degree(degree);
    // A force_upcast model says it decodes in float32, not the float16 asked for.
    const std::string upcast = families::DecodeDtypeReason(decoder.info(), requested_dtype_);
    header->set_mode_reason(upcast.empty() ? reason : absl::StrCat(reason, "; ", upcast));
    header->set_tile_plan(tile_plan);
    if (noise_seed) header->set_noise_seed(*noise_seed);
    if (absl::Status s = DescribeOutput(out_shape, request->output_format(), header); !s.ok()) {
      stream_status = s;
      return false;
    }
    header_sent = true;
    if (!writer->Write(message)) caller_gone = true;
    return !caller_gone;
  };
  // Streams rows [streamed_rows, final_rows) of `sample` (NCHW or NC1HW).
  auto stream_rows = [&](const at::Tensor& sample, int64_t final_rows) {
    if (caller_gone || !stream_status.ok() || final_rows <= streamed_rows) return;
    const int64_t first = streamed_rows;
    const at::Tensor band = sample.narrow(sample.dim() - 2, first, final_rows - first);
    stream_status = EmitChunks(band, EncodingOf(*request), MaxChunkBytes(*context), [&](v1::Chunk&& chunk) {
      if (context->IsCancelled()) return false;
      chunk.set_row_begin(chunk.row_begin() + first);
      chunk.set_row_end(chunk.row_end() + first);
      v1::DecodeResponse message;
      *message.mutable_chunk() = std::move(chunk);
      return writer->Write(message);
    });
    if (!stream_status.ok()) caller_gone = stream_status.code() == absl::StatusCode::kCancelled;
    streamed_rows = final_rows;
  };
  RowsReady rows_ready;
  if (incremental) {
    rows_ready = [&](const at::Tensor& blended, int64_t final_rows) {
      if (!header_sent && !write_header("tiled", tiled_reason, planned_tiles, runtime_.world_size())) return;
      stream_rows(blended, final_rows);
    };
  }
  absl::StatusOr<DecodeOutcome> outcome = runtime_.Run(job, &cancelled, rows_ready);
  finished = true;
  watcher.join();
  if (!outcome.ok()) return rpc::ToGrpcStatus(outcome.status());
  {
    absl::MutexLock lock(&stats_mu_);
    last_peak_bytes_.clear();
    for (const RankStats& r : outcome->ranks) last_peak_bytes_.push_back(r.peak_bytes);
  }
  const std::string& used = outcome->result.mode;
  if (!header_sent) {
    const std::string reason = used == "exact"   ? absl::StrCat("exact sharding over ", runtime_.world_size(), " ranks")
                               : used == "tiled" ? tiled_reason
                                                 : (outcome->result.reason.empty() ? "one rank" : outcome->result.reason);
    write_header(used, reason, outcome->result.tile_plan, used == "dense" ? 1 : runtime_.world_size());
  }
  if (!stream_status.ok() && !caller_gone) return rpc::ToGrpcStatus(stream_status);
  if (caller_gone) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  if (incremental) {
    stream_rows(outcome->result.sample, outcome->result.sample.size(-2));
  } else {
    stream_status = EmitChunks(outcome->result.sample, EncodingOf(*request), MaxChunkBytes(*context),
                               [&](v1::Chunk&& chunk) {
                                 if (context->IsCancelled()) return false;
                                 v1::DecodeResponse message;
                                 *message.mutable_chunk() = std::move(chunk);
                                 return writer->Write(message);
                               });
  }
  if (!stream_status.ok()) return rpc::ToGrpcStatus(stream_status);

  v1::DecodeResponse trailer_message;
  v1::Trailer* trailer = trailer_message.mutable_trailer();
  trailer->mutable_timings()->set_decode_ms(outcome->result.decode_ms);
  trailer->mutable_timings()->set_gather_ms(outcome->result.gather_ms);
  trailer->mutable_timings()->set_stream_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - stream_start).count());
  for (const RankStats& r : outcome->ranks) trailer->add_peak_bytes_per_rank(r.peak_bytes);
  trailer->set_collectives(outcome->comm.collectives());
  trailer->set_tile_retries(outcome->result.tile_retries);
  trailer->set_tile_plan(outcome->result.tile_plan);
  if (outcome->result.tile_retries > 0) {
    spdlog::warn("tiled decode of request {} needed {} out-of-memory retr{}", rpc::LogValue(request->request_id()),
                 outcome->result.tile_retries, outcome->result.tile_retries == 1 ? "y" : "ies");
  }
  writer->Write(trailer_message);
  return grpc::Status::OK;
}

absl::StatusOr<tiling::TilePlan> LeaderService::PlanTiledJob(int model, const at::Tensor& latent, GroupJob* job) {
  const families::Decoder& decoder = *runtime_.models()[model].decoder;
  if (absl::Status valid = decoder.ValidateLatent(latent); !valid.ok()) return valid;
  // Tiles are cut from the VAE-space latent (a packed raw FLUX.2 latent
  // unpacks to twice the rows and columns): convert once, here, and send
  // every rank the converted latent.
  if (job->decode.latent_space == families::LatentSpace::kRaw) {
    at::Tensor z;
    absl::Status converted = CatchExceptions("latent conversion", [&] {
      z = decoder.ToVaeSpace(latent.to(decoder.device()).to(at::kFloat)).contiguous();
    });
    if (!converted.ok()) return converted;
    job->decode.latent = z;
    job->decode.latent_space = families::LatentSpace::kVae;
  }
  const at::Tensor& z = job->decode.latent;
  const tiling::FamilyGeometry geometry = tiling::PlanningGeometry(decoder, profiles_[model], z.size(0));
  // Every rank decodes whole tiles: the tightest rank bounds the tile. The
  // leader also holds the blended float32 output meanwhile.
  int64_t budget = std::numeric_limits<int64_t>::max() / 2;
  for (int64_t free : runtime_.free_bytes_per_rank()) {
    if (free >= 0) budget = std::min(budget, free);
  }
  const device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (runtime_.free_bytes_per_rank().empty() && memory != nullptr && memory->free_bytes() >= 0) {
    budget = memory->free_bytes();
  }
  int64_t output_bytes = 4;
  for (int64_t d : decoder.OutputShape(z.sizes().vec())) output_bytes *= d;
  budget = std::max<int64_t>(0, budget - output_bytes);
  tiling::TilePlan plan = tiling::PlanTiles(z.size(-2), z.size(-1), geometry, budget);
  if (plan.kind == tiling::PlanKind::kUntiled) {
    // The whole latent fits: one tile (still the tiled protocol, as requested).
    plan.kind = tiling::PlanKind::kTiled;
  }
  job->tile_rows = plan.rows.tile;
  job->tile_cols = plan.cols.tile;
  job->stock_tiles = plan.kind == tiling::PlanKind::kStock;
  plan.reason = absl::StrCat("tiled to fit ", budget >> 20, " MiB free per rank: ", plan.reason);
  return plan;
}

}  // namespace vaedecode::worker
