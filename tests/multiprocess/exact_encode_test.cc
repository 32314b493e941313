// Exact (layer-wise sharded) encode equals the dense encode, with real
// worker processes over real Gloo: every encode fixture of the families
// that encode at world sizes 1-4 (checked against diffusers too), images
// beyond the fixtures (uneven bands, batch 2, odd sizes whose levels floor,
// so the last band takes the remainder, several frames through the Wan
// causal cache), and deterministic collective counts.

#include <atomic>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/builtin_families.h"
#include "formats/tensor_file.h"
#include "parallel/counting_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/encode_job.h"
#include "worker/group_encode.h"
#include "worker/group_runtime.h"
#include "worker/model_repository.h"

namespace vaedecode {
namespace {

using parallel::testing::ExpectTensorClose;

constexpr double kExactVsDenseImage = 1e-5;
constexpr double kExactVsDenseVideo = 3e-5;  // more frames, more layers: the standard's video bound
constexpr double kVsDiffusers = 1e-4;
const std::vector<std::string> kClasses = {
    "AutoencoderKL",          "AutoencoderKLFlux2",          "AutoencoderKLWan",
    "AutoencoderKLQwenImage", "AutoencoderKLQwenImage21",    "AutoencoderKLHunyuanImage",
    "AutoencoderKLConv3D",    "AutoencoderKLHunyuanVideo15", "AutoencoderKLHunyuanVideo",
    "AutoencoderKLLTX2Video", "AutoencoderKLMiniMaxH3"};

struct EncodeCheck {
  std::string fixture;
  at::Tensor image;                          // the same on every rank
  std::string expected_mean;                 // diffusers' mean, "" to skip
  testing::ExpectedCollectives collectives;  // checked when halo > 0
  std::string what;
};

// One rank's part: encode the moments on the group; on the leader compare
// with the dense encode (and diffusers), and check the collectives made.
absl::Status EncodeAndCheck(const EncodeCheck& c, families::Encoder& encoder, parallel::Communicator& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const bool video = encoder.info().is_video;
  const at::Tensor image = testing::InFamilyRank(c.image, video);
  parallel::CountingCommunicator counting(comm);
  worker::EncodeJob job{image, families::PosteriorOutput::kMoments};
  ASSIGN_OR_RETURN(worker::GroupEncodeResult result, worker::EncodeWithGroup(encoder, counting, job));
  const worker::DecodeMode want = world > 1 && encoder.CheckExactSharding(image.sizes().vec(), world).ok()
                                      ? worker::DecodeMode::kExact
                                      : worker::DecodeMode::kDense;
  if (result.mode != want) {
    return absl::InternalError(absl::StrCat(c.what, ": mode ", worker::ModeName(result.mode), " (", result.reason,
                                            "), want ", worker::ModeName(want)));
  }
  if (c.collectives.halo > 0 && want == worker::DecodeMode::kExact) {
    RETURN_IF_ERROR(testing::CheckCollectives(counting.stats(), c.collectives, world, c.what));
  }
  if (rank != worker::kLeader) return absl::OkStatus();
  families::DenseOps dense;
  ASSIGN_OR_RETURN(worker::EncodeResult reference, worker::RunEncode(encoder, job, dense));
  const std::string what = absl::StrCat(c.what, " at world size ", world);
  const bool several_frames = video && image.size(2) > 1;
  const double tolerance = several_frames ? kExactVsDenseVideo : kExactVsDenseImage;
  RETURN_IF_ERROR(ExpectTensorClose(result.output.mean, reference.mean, tolerance, 0, what + ": mean vs dense"));
  RETURN_IF_ERROR(ExpectTensorClose(result.output.logvar, reference.logvar, tolerance, 0, what + ": logvar vs dense"));
  if (!c.expected_mean.empty()) {
    ASSIGN_OR_RETURN(at::Tensor expected, formats::ReadTensorFile(c.expected_mean, "mean"));
    RETURN_IF_ERROR(ExpectTensorClose(result.output.mean, testing::InFamilyRank(expected, video), kVsDiffusers, 0,
                                      what + ": mean vs diffusers"));
  }
  return absl::OkStatus();
}

// `checks` one after another on one group of the fixture's encoder; each
// rank makes its images (the parent stays free of LibTorch work).
absl::Status RunOnGroup(const std::string& fixture, int world,
                        const std::function<absl::StatusOr<std::vector<EncodeCheck>>()>& checks) {
  return parallel::testing::RunRanks(
      world,
      [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Encoder> encoder,
                         families::BuiltinFamilies().LoadEncoder(testing::FixturePath(fixture), {}));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                         testing::JoinTestGroup(rank, w, port, "exact-encode-test"));
        ASSIGN_OR_RETURN(std::vector<EncodeCheck> mine, checks());
        for (const EncodeCheck& c : mine) RETURN_IF_ERROR(EncodeAndCheck(c, *encoder, *comm));
        return absl::OkStatus();
      },
      absl::Seconds(240));
}

using CaseAtWorld = std::tuple<testing::EncodeCase, int>;
class ExactEncode : public ::testing::TestWithParam<CaseAtWorld> {};

TEST_P(ExactEncode, EqualsDenseAndDiffusers) {
  const auto& [c, world] = GetParam();
  absl::Status s = RunOnGroup(c.fixture, world, [&c = c]() -> absl::StatusOr<std::vector<EncodeCheck>> {
    ASSIGN_OR_RETURN(at::Tensor image, formats::ReadTensorFile(c.image_file, "image"));
    return std::vector<EncodeCheck>{{c.fixture, image, c.mean_file, {}, c.fixture + "/" + c.name}};
  });
  EXPECT_TRUE(s.ok()) << s;
}

std::vector<CaseAtWorld> CasesAtWorldSizes() {
  std::vector<CaseAtWorld> out;
  for (const testing::EncodeCase& c : testing::EncodeCases(kClasses)) {
    for (int world = 1; world <= 4; ++world) out.emplace_back(c, world);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExactEncode, ::testing::ValuesIn(CasesAtWorldSizes()),
                         [](const ::testing::TestParamInfo<CaseAtWorld>& info) {
                           const testing::EncodeCase& c = std::get<0>(info.param);
                           return absl::StrCat(c.fixture, "_", c.name, "_ws", std::get<1>(info.param));
                         });

// A seeded image of `shape` and the collectives its exact encode makes.
struct SyntheticEncode {
  std::vector<int64_t> shape;
  testing::ExpectedCollectives collectives;
};

// Seeded images for `fixture`, the same on every rank.
absl::Status RunSynthetic(const std::string& fixture, const std::vector<SyntheticEncode>& encodes, int world) {
  return RunOnGroup(fixture, world, [&]() -> absl::StatusOr<std::vector<EncodeCheck>> {
    std::vector<EncodeCheck> checks;
    for (size_t i = 0; i < encodes.size(); ++i) {
      at::manual_seed(17 + static_cast<uint64_t>(i));
      checks.push_back({fixture, at::rand(encodes[i].shape) * 2 - 1, "", encodes[i].collectives,
                        absl::StrCat(fixture, " [", absl::StrJoin(encodes[i].shape, "x"), "]")});
    }
    return checks;
  });
}

// `shapes`, each with `collectives`.
absl::Status RunSynthetic(const std::string& fixture, const std::vector<std::vector<int64_t>>& shapes,
                          const testing::ExpectedCollectives& collectives, int world) {
  std::vector<SyntheticEncode> encodes;
  for (const std::vector<int64_t>& shape : shapes) encodes.push_back({shape, collectives});
  return RunSynthetic(fixture, encodes, world);
}

TEST(ExactEncodeBeyondFixtures, UnevenBandsBatchAndFlooringSizesCountCollectives) {
  // sd_kl (3 levels, 1 resnet a level): 14 halo exchanges (conv_in, 2 per
  // resnet in 3 down blocks and the mid block's 2, 2 strided downsamplers,
  // conv_out; 1x1 convs none), 12 GroupNorms (2 per resnet, the attention's,
  // conv_norm_out), 1 K/V gather, + the moments' row gather.
  const testing::ExpectedCollectives sd{14, 12, 1};
  // sd_kl halves twice (4x): heights 61 and 43 floor at both levels, so the
  // last band takes the remainder; batch 2; odd widths.
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 61, 45}, {1, 3, 43, 24}, {1, 3, 32, 17}};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("sd_kl", shapes, sd, world).ok()) << "world size " << world;
  }
}

TEST(ExactEncodeBeyondFixtures, Flux2AtOddSizes) {
  // flux2_kl's encoder: (16,16,32,32) widths, 2 resnets a level, 4 levels:
  // conv_in + 2·2·4 + 4 (mid) + 3 downsamplers + conv_out = 25 halos;
  // 2·2·4 + 4 + 1 + 1 = 22 norms; 1 K/V gather.
  const testing::ExpectedCollectives flux2{25, 22, 1};
  for (int world : {2, 4}) {
    EXPECT_TRUE(RunSynthetic("flux2_kl", {{2, 3, 77, 50}, {1, 3, 40, 24}}, flux2, world).ok())
        << "world size " << world;
  }
}

// The Wan lineage's encoders (2 resnets a level, 4 levels, as in the
// fixtures) make, per chunk (the first frame, then 4 frames at a time):
// conv_in + 2·2·4 resnet convs + 3 strided downsamplers + 4 (mid block) +
// conv_out = 25 halo exchanges (the 1x1 convs and (3,1,1) time convs none;
// RMS norms are local) and the mid-block attention's 1 K/V gather.
testing::ExpectedCollectives WanPerChunks(int64_t frames) {
  const int64_t chunks = 1 + (frames - 1) / 4;
  return {25 * chunks, 0, chunks};
}

TEST(ExactEncodeBeyondFixtures, WanClipsAtUnevenBandsAndFlooringSizes) {
  // Wan 2.1 floors: 41 rows -> 20 -> 10 -> 5, 35 -> 17 -> 8 -> 4 (the last
  // band takes the remainder at every level); batch 2; 2 and 3 chunks.
  const std::vector<SyntheticEncode> wan21 = {{{2, 3, 5, 41, 24}, WanPerChunks(5)},
                                              {{1, 3, 9, 35, 16}, WanPerChunks(9)}};
  // Wan 2.2: patchify by 2 and AvgDown3D shortcuts, sides multiples of 16.
  const std::vector<SyntheticEncode> wan22 = {{{2, 3, 5, 48, 32}, WanPerChunks(5)},
                                              {{1, 3, 9, 80, 16}, WanPerChunks(9)}};
  // Qwen-Image: RGBA single frames, 44 -> 22 -> 11 -> 5 rows.
  const std::vector<SyntheticEncode> qwen = {{{2, 4, 1, 44, 24}, WanPerChunks(1)}};
  // Qwen-Image-2.1: 2-D convs, 5 levels (1 + 5·2·2 + 4 + 4 + 1 = 30 halos),
  // AvgDown3D shortcuts; 80 rows are 5 latent rows, 112 are 7; batch 2.
  const testing::ExpectedCollectives qwen21_image{30, 0, 1};
  const std::vector<SyntheticEncode> qwen21 = {{{2, 4, 1, 80, 48}, qwen21_image}, {{1, 4, 1, 112, 32}, qwen21_image}};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("wan21", wan21, world).ok()) << "wan21 at world size " << world;
    EXPECT_TRUE(RunSynthetic("wan22", wan22, world).ok()) << "wan22 at world size " << world;
    EXPECT_TRUE(RunSynthetic("qwenimage", qwen, world).ok()) << "qwenimage at world size " << world;
    EXPECT_TRUE(RunSynthetic("qwenimage21", qwen21, world).ok()) << "qwenimage21 at world size " << world;
  }
}

TEST(ExactEncodeBeyondFixtures, HunyuanImageAtUnevenBandsAndBatchTwo) {
  // hunyuanimage21 (6 levels of 1 resnet, 5 downsamplers: 32x): conv_in +
  // 2·6 resnet convs + 5 downsampler convs + 4 (mid block) + conv_out = 23
  // halos; 2·6 + 5 (mid block) + norm_out = 18 GroupNorms; 1 K/V gather.
  // 160 rows are 5 latent rows (3 + 2, 2 + 1 + 1 + 1 over 2 and 4 ranks).
  const testing::ExpectedCollectives hunyuan{23, 18, 1};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("hunyuanimage21", {{2, 3, 160, 64}, {1, 3, 128, 96}}, hunyuan, world).ok())
        << "world size " << world;
  }
}

TEST(ExactEncodeBeyondFixtures, HunyuanImage3AtUnevenBandsAndBatchTwo) {
  // hunyuanimage3 (3 levels of width 32, no resnets, 2 DownsampleDCAE: 4x;
  // an image runs as 2 frames until the second halves time): conv_in + 2
  // downsampler convs + 4 (mid block) + conv_out = 8 halos; 2·2 + 1 (mid
  // block) + norm_out = 6 GroupNorms; 1 K/V gather. 20 rows are 5 latent
  // rows (3 + 2; 2 + 1 + 1 + 1 over 4 ranks), 28 are 7.
  const testing::ExpectedCollectives hunyuan3{8, 6, 1};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("hunyuanimage3", {{2, 3, 20, 12}, {1, 3, 28, 16}}, hunyuan3, world).ok())
        << "hunyuanimage3 at world size " << world;
  }
}

TEST(ExactEncodeBeyondFixtures, HunyuanVideo15ClipsAtUnevenBands) {
  // hunyuanvideo15 (5 levels of 1 resnet, 4 downsamplers, the last 2 in time
  // too): conv_in + 2·5 resnet convs + 4 downsampler convs + 4 (mid block)
  // + conv_out = 20 halos (replicate-padded causal 3x3x3); RMS norms are
  // local; the frame-causal mid-block attention gathers K/V once. The whole
  // clip at once: the count does not grow with frames.
  const testing::ExpectedCollectives hunyuan{20, 0, 1};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("hunyuanvideo15", {{2, 3, 5, 80, 32}, {1, 3, 9, 64, 48}}, hunyuan, world).ok())
        << "world size " << world;
  }
}

TEST(ExactEncodeBeyondFixtures, HunyuanVideoCeilRowsAndTemporalWindows) {
  // hunyuanvideo (4 levels of 2 resnets, 3 spatial downsamplers that round
  // up, 2 of them in time too), per encoded window: conv_in + 2·2·4 resnet
  // convs + 3 downsamplers + 4 (mid block) + conv_out = 25 halos; 2·2·4 +
  // 4 + 1 (attention) + 1 (conv_norm_out) = 22 GroupNorms; 1 K/V gather.
  // 41 rows -> 21 -> 11 -> 6 (each ceil); 21 frames are diffusers' two
  // temporal windows (frames 0-16 and 12-20), each encoded whole. At 4
  // ranks the first's last band would be 1 row at every level: dense.
  const std::vector<SyntheticEncode> encodes = {{{2, 3, 9, 41, 24}, {25, 22, 1}},
                                                {{1, 3, 21, 32, 16}, {2 * 25, 2 * 22, 2}}};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("hunyuanvideo", encodes, world).ok()) << "world size " << world;
  }
  absl::StatusOr<std::unique_ptr<families::Encoder>> encoder =
      families::BuiltinFamilies().LoadEncoder(testing::FixturePath("hunyuanvideo"), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_TRUE((*encoder)->CheckExactSharding({2, 3, 9, 41, 24}, 3).ok());
  EXPECT_EQ((*encoder)->CheckExactSharding({2, 3, 9, 41, 24}, 4).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ExactEncodeBeyondFixtures, LTX2ClipsAtUnevenBandsAndBatchTwo) {
  // ltx2_full's encoder (patchify 4, 4 folding downsamplers, 32x; 0, 1, 1, 1
  // resnets and 1 in the mid block): conv_in + 4 downsampler convs + 2·3
  // resnet convs + 2 (mid block) + conv_out = 14 halos; its RMS norms and
  // LayerNorms are per pixel and it has no attention: nothing else. 160
  // rows are 5 latent rows (3 + 2, 2 + 2 + 1, 2 + 1 + 1 + 1); the whole clip
  // at once, so the count does not grow with frames.
  const testing::ExpectedCollectives ltx2{14, 0, 0};
  for (int world : {2, 3, 4}) {
    EXPECT_TRUE(RunSynthetic("ltx2_full", {{2, 3, 9, 160, 64}, {1, 3, 17, 128, 32}}, ltx2, world).ok())
        << "world size " << world;
  }
}

// minimax_h3's encoder (6 levels of 1 resnet, 4 downsamplers: 16x, 4x in
// time) per encoded clip: conv_in + 2·6 resnet convs + 4 downsamplers +
// conv_out = 18 halos (reflect-padded; the 1x1x1 shortcuts and quant_conv
// none); 2·6 + norm_out = 13 per-frame GroupNorms, every frame's statistics
// in one all-reduce; no attention. A single frame is one clip; a clip is
// padded to whole 17-frame clips, each encoded on its own.
testing::ExpectedCollectives MiniMaxPerClips(int64_t clips) { return {18 * clips, 13 * clips, 0}; }

TEST(ExactEncodeBeyondFixtures, MiniMaxH3ClipsAtUnevenBandsAndCeilRows) {
  // 53 rows -> 26 -> 13 -> 6 -> 3 (each floors: a bottom pad of 1, then
  // stride 2; the last band takes the remainder and its pad reflects its
  // own rows); 20 frames are 2 clips (7 latent frames after token_drop);
  // batch 2 of single frames. At 4 ranks the 53-row clip has fewer latent
  // rows than ranks: dense.
  const std::vector<SyntheticEncode> encodes = {{{2, 3, 1, 80, 48}, MiniMaxPerClips(1)},
                                                {{1, 3, 20, 64, 32}, MiniMaxPerClips(2)},
                                                {{1, 3, 5, 53, 38}, MiniMaxPerClips(1)}};
  for (int world : {2, 3, 4}) {
    const absl::Status s = RunSynthetic("minimax_h3", encodes, world);
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

TEST(ExactEncodeGroup, CancellationStopsEveryRankAndKeepsTheGroupInStep) {
  for (worker::DecodeMode mode : {worker::DecodeMode::kExact, worker::DecodeMode::kDense}) {
    absl::Status s = parallel::testing::RunRanks(
        3,
        [mode](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<families::Encoder> encoder,
                           families::BuiltinFamilies().LoadEncoder(testing::FixturePath("sd_kl"), {}));
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                           testing::JoinTestGroup(rank, w, port, "encode-cancel"));
          ASSIGN_OR_RETURN(at::Tensor image,
                           formats::ReadTensorFile(testing::FixturePath("sd_kl/image.safetensors"), "image"));
          worker::EncodePlan plan;
          plan.mode = mode;
          plan.image = image;
          // The leader's flag is up before the encode starts: every rank that
          // encodes stops with CANCELLED, together.
          std::atomic<bool> cancelled{true};
          absl::StatusOr<at::Tensor> stopped =
              worker::ExecuteEncodePlan(*encoder, *comm, plan, rank == worker::kLeader ? &cancelled : nullptr);
          const bool encodes = rank == worker::kLeader || mode == worker::DecodeMode::kExact;
          if (encodes && (stopped.ok() || stopped.status().code() != absl::StatusCode::kCancelled)) {
            return absl::InternalError(
                absl::StrCat("rank ", rank, " was not cancelled: ", stopped.status().ToString()));
          }
          // The same group encodes again, exactly.
          EncodeCheck again{
              "sd_kl", image, testing::FixturePath("sd_kl/posterior_mean.safetensors"), {}, "after cancel"};
          return EncodeAndCheck(again, *encoder, *comm);
        },
        absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << worker::ModeName(mode) << ": " << s;
  }
}

TEST(ExactEncodeGroup, APeerThatCannotLoadItsEncoderFailsTheRequestNotTheGroup) {
  // Rank 1's copy of the model folder is missing (a node without the file):
  // the exact encode is refused on every rank after one agreement, and the
  // same group goes on encoding (dense) and refusing (exact), never hanging.
  absl::Status s = parallel::testing::RunRanks(
      2,
      [](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                         testing::JoinTestGroup(rank, w, port, "encode-load"));
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, testing::LoadFixtureDecoder("sd_kl"));
        std::vector<worker::NamedModel> models;
        models.push_back({"sd", std::move(decoder),
                          rank == worker::kLeader ? testing::FixturePath("sd_kl") : "/nonexistent/sd_kl",
                          std::nullopt});
        worker::GroupRuntime runtime(std::move(comm), std::move(models), absl::Seconds(30));
        if (rank != worker::kLeader) return runtime.ServeAsPeer();  // until the leader's Shutdown
        ASSIGN_OR_RETURN(families::Encoder * encoder, runtime.Encoder(0));
        ASSIGN_OR_RETURN(at::Tensor image,
                         formats::ReadTensorFile(testing::FixturePath("sd_kl/image.safetensors"), "image"));
        ASSIGN_OR_RETURN(at::Tensor prepared, worker::PrepareImage(*encoder, worker::EncodeJob{image}));
        worker::GroupJob exact;
        exact.kind = worker::JobKind::kEncode;
        exact.encode = worker::PlanEncode(*encoder, prepared, worker::DecodeMode::kExact, 2);
        worker::GroupJob dense = exact;
        dense.encode = worker::PlanEncode(*encoder, prepared, worker::DecodeMode::kDense, 2);
        for (int attempt = 0; attempt < 2; ++attempt) {
          absl::StatusOr<worker::EncodeOutcome> refused = runtime.RunEncode(exact);
          if (refused.ok() || refused.status().code() != absl::StatusCode::kFailedPrecondition ||
              !absl::StrContains(refused.status().message(), "rank 1 of the group could not load")) {
            return absl::InternalError(
                absl::StrCat("exact encode with rank 1 unable to load: ", refused.status().ToString()));
          }
          ASSIGN_OR_RETURN(worker::EncodeOutcome encoded, runtime.RunEncode(dense));
          ASSIGN_OR_RETURN(at::Tensor expected,
                           formats::ReadTensorFile(testing::FixturePath("sd_kl/posterior_mean.safetensors"), "mean"));
          const at::Tensor mean = encoded.moments.narrow(1, 0, expected.size(1));
          RETURN_IF_ERROR(ExpectTensorClose(mean, expected, kVsDiffusers, 0, "dense encode after the refusal"));
        }
        runtime.Shutdown();
        return absl::OkStatus();
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace vaedecode
