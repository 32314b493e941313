// Exact (layer-wise sharded) decode equals the dense decode, with real worker
// processes over real Gloo: every AutoencoderKL fixture at world sizes 1-4
// (prime latent heights, so bands are uneven; batch 2), repeat decodes in one
// group, a rank failing mid-decode, and deterministic collective counts.

#include <atomic>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/builtin_families.h"
#include "families/layer_ops.h"
#include "families/sharded_layer_ops.h"
#include "formats/tensor_file.h"
#include "parallel/band_partition.h"
#include "parallel/counting_communicator.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/decode_job.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

using parallel::testing::ExpectTensorClose;

constexpr double kExactVsDense = 1e-5;
constexpr double kVsDiffusers = 1e-4;

absl::StatusOr<std::unique_ptr<parallel::Communicator>> Join(int rank, int world, int port) {
  parallel::GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_port = port;
  o.group_name = "exact-decode-test";
  o.timeout = absl::Seconds(30);
  return parallel::GlooCommunicator::Create(o);
}

absl::StatusOr<std::unique_ptr<families::Decoder>> LoadFixture(const std::string& fixture) {
  return families::BuiltinFamilies().Load(testing::FixturePath(fixture), {});
}

// Decodes `c` with the group and, on the leader, checks it against the dense
// decode and diffusers' output; returns the collectives this rank made.
absl::StatusOr<int64_t> DecodeAndCheck(const testing::FixtureCase& c, families::Decoder& decoder,
                                       parallel::Communicator& comm) {
  parallel::CountingCommunicator counting(comm);
  worker::DecodeJob input;
  if (comm.rank() == worker::kLeader) {
    ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(c.latent_file, "latent"));
    input.latent = latent;
  }
  ASSIGN_OR_RETURN(worker::GroupDecodeResult result, testing::PlanAndExecute(decoder, counting, counting, input));
  const worker::DecodeMode want_mode = comm.world_size() > 1 ? worker::DecodeMode::kExact : worker::DecodeMode::kDense;
  if (result.mode != want_mode) {
    return absl::InternalError(absl::StrCat("mode ", worker::ModeName(result.mode), " (", result.reason, "), want ",
                                            worker::ModeName(want_mode)));
  }
  if (comm.rank() != worker::kLeader) {
    if (result.sample.defined()) return absl::InternalError("a peer kept decoded rows");
    return counting.stats().collectives();
  }
  families::DenseOps dense;
  ASSIGN_OR_RETURN(at::Tensor reference, worker::RunDecode(decoder, input, dense));
  ASSIGN_OR_RETURN(at::Tensor expected, formats::ReadTensorFile(c.expected_file, "sample"));
  const std::string what = absl::StrCat(c.fixture, "/", c.name, " at world size ", comm.world_size());
  RETURN_IF_ERROR(ExpectTensorClose(result.sample, reference, kExactVsDense, 0, what + " vs dense"));
  RETURN_IF_ERROR(ExpectTensorClose(result.sample, expected, kVsDiffusers, 0, what + " vs diffusers"));
  return counting.stats().collectives();
}

class ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(ExactDecode, EqualsDenseAndDiffusers) {
  const auto& [c, world] = GetParam();
  absl::Status s = parallel::testing::RunRanks(
      world,
      [&c = c](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
        return DecodeAndCheck(c, *decoder, *comm).status();
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes({"AutoencoderKL"})),
                         testing::FixtureCaseAtWorldName);

testing::FixtureCase SdMain() {
  for (const testing::FixtureCase& c : testing::FixtureCases({"AutoencoderKL"})) {
    if (c.fixture == "sd_kl" && c.name == "main") return c;
  }
  return {};
}

TEST(ExactDecodeGroup, RepeatDecodesInOneGroupAndCountCollectives) {
  // sd_kl: 20 halo exchanges (3x3 convs: conv_in, 4 in the mid block, 12 in
  // the up blocks' resnets, 2 upsamplers, conv_out; 1x1 convs need none),
  // 18 GroupNorms (one collective each), 1 K/V all-gather, 1 row gather to
  // the leader, 2 job broadcasts (header, latent) = 42 at any world size > 1;
  // none at world size 1. DistVAE's GroupNorm alone takes 2 per norm.
  const testing::FixtureCase c = SdMain();
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [&](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
          for (int repeat = 0; repeat < 3; ++repeat) {
            ASSIGN_OR_RETURN(int64_t calls, DecodeAndCheck(c, *decoder, *comm));
            const int64_t want = w > 1 ? 42 : 0;
            if (calls != want) {
              return absl::InternalError(absl::StrCat("decode ", repeat, " made ", calls, " collectives, want ", want));
            }
          }
          return absl::OkStatus();
        },
        absl::Seconds(120));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

// Throws from the n-th GroupNorm: a rank failing mid-decode.
class FailingOps : public families::ForwardingOps {
 public:
  FailingOps(families::LayerOps& inner, int fail_at) : ForwardingOps(inner), fail_at_(fail_at) {}
  at::Tensor GroupNorm(const at::Tensor& x, int64_t groups, const at::Tensor& w, const at::Tensor& b,
                       double eps) override {
    if (++calls_ == fail_at_) TORCH_CHECK(false, "injected failure in GroupNorm ", calls_);
    return ForwardingOps::GroupNorm(x, groups, w, b, eps);
  }

 private:
  int fail_at_;
  int calls_ = 0;
};

TEST(ExactDecodeGroup, OneRankFailingMidDecodeFailsEveryRankWithoutHanging) {
  const testing::FixtureCase c = SdMain();
  absl::StatusOr<std::vector<parallel::testing::RankOutcome>> outcomes = parallel::testing::RunRanksCollect(
      {/*world_size=*/3, /*timeout=*/absl::Seconds(60)}, [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
        ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(c.latent_file, "latent"));
        const parallel::ShardSpec spec = parallel::ShardSpec::ForRows(2, latent.size(2), rank, w);
        const parallel::Band b = spec.local_band();
        families::ShardedLayerOps sharded(*comm, spec);
        FailingOps ops(sharded, rank == 1 ? 5 : -1);
        absl::StatusOr<at::Tensor> rows =
            worker::RunDecode(*decoder, worker::DecodeJob{latent.narrow(2, b.begin, b.size()).contiguous()}, ops);
        if (!rows.ok()) {
          comm->Abort(std::string(rows.status().message()));
          return rows.status();
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  for (const parallel::testing::RankOutcome& o : *outcomes) {
    EXPECT_FALSE(o.status.ok()) << "rank " << o.rank << " succeeded";
    EXPECT_FALSE(o.timed_out) << "rank " << o.rank << " hung";
    EXPECT_LT(o.elapsed, absl::Seconds(30)) << "rank " << o.rank;
  }
  EXPECT_NE(std::string((*outcomes)[1].status.message()).find("injected failure"), std::string::npos)
      << (*outcomes)[1].status;
}

TEST(ExactDecodeGroup, CancellationStopsEveryRankAndKeepsTheGroupInStep) {
  const testing::FixtureCase c = SdMain();
  absl::Status s = parallel::testing::RunRanks(
      3,
      [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
        ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(c.latent_file, "latent"));
        // The leader's flag is up before the decode starts: every rank must stop
        // at the first GroupNorm with CANCELLED.
        std::atomic<bool> cancelled{true};
        worker::GroupDecodeOptions options;
        if (rank == worker::kLeader) options.cancelled = &cancelled;
        absl::StatusOr<worker::GroupDecodeResult> stopped =
            worker::DecodeWithGroup(*decoder, *comm, worker::DecodeJob{latent}, options);
        if (stopped.ok() || stopped.status().code() != absl::StatusCode::kCancelled) {
          return absl::InternalError(absl::StrCat("rank ", rank, " was not cancelled: ", stopped.status().ToString()));
        }
        // The same communicator still works: the next decode is exact and right.
        return DecodeAndCheck(c, *decoder, *comm).status();
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ExactDecodeGroup, ThinLatentsFallBackToDenseOnTheLeader) {
  const testing::FixtureCase c = SdMain();
  absl::Status s = parallel::testing::RunRanks(
      4,
      [&](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, LoadFixture(c.fixture));
        ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Join(rank, w, port));
        ASSIGN_OR_RETURN(at::Tensor latent, formats::ReadTensorFile(c.latent_file, "latent"));
        const at::Tensor thin = latent.narrow(2, 0, 3).contiguous();  // 3 rows over 4 ranks
        ASSIGN_OR_RETURN(worker::GroupDecodeResult result,
                         worker::DecodeWithGroup(*decoder, *comm, worker::DecodeJob{thin}));
        if (result.mode != worker::DecodeMode::kDense ||
            result.reason.find("thinner than the conv halo") == std::string::npos) {
          return absl::InternalError(absl::StrCat("mode ", worker::ModeName(result.mode), " reason ", result.reason));
        }
        if (rank != worker::kLeader) return absl::OkStatus();
        // The group's dense path: CancellableDenseOps (large convs in row bands).
        families::CancellableDenseOps dense(nullptr);
        ASSIGN_OR_RETURN(at::Tensor want, worker::RunDecode(*decoder, worker::DecodeJob{thin}, dense));
        return parallel::testing::ExpectTensorEqual(result.sample, want, "dense fallback");
      },
      absl::Seconds(120));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ExactDecodeHarness, TheComparisonCatchesAOneRowError) {
  at::manual_seed(3);
  at::Tensor expected = at::randn({2, 3, 68, 104});
  at::Tensor actual = expected.clone();
  actual.select(2, 33).add_(2 * kExactVsDense);  // one boundary row of a 2-rank split
  EXPECT_FALSE(ExpectTensorClose(actual, expected, kExactVsDense, 0, "one row off").ok());
  EXPECT_TRUE(ExpectTensorClose(expected.clone(), expected, kExactVsDense, 0, "same").ok());
}

}  // namespace
}  // namespace vaedecode
