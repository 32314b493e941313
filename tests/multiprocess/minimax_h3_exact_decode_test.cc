// Exact (row-sharded) MiniMax-H3 decode equals the dense decode and
// diffusers, with real worker processes over real Gloo: both
// AutoencoderKLMiniMaxH3 fixtures (4 register tokens) at world sizes 1-4
// (3 latent rows: bands 2,1 / 1,1,1, dense at 4 ranks), from the decoder
// input and the pipeline latent; synthetic latents with batch 2, 1-row
// bands, several windows, and zero register tokens (only the CLS token is
// shared); and collective counts: one K/V all-gather per transformer layer
// per window, nothing else.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "families/builtin_families.h"
#include "families/minimax_h3/decoder.h"
#include "families/model_files.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

// Exact vs dense differ only in rounding: the attention's keys come in rank
// order rather than row-major (a different summation order), everything
// else is per token. The video criterion is 3e-5. A wrong RoPE row, a
// duplicated register key or a lost CLS token is off by O(0.1).
constexpr double kExactVsDense = 3e-5;
constexpr double kVsDiffusers = 1e-4;
constexpr char kGroup[] = "minimax-h3-exact-decode-test";
const std::vector<std::string> kClasses = {"AutoencoderKLMiniMaxH3"};

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return o;
}

class MiniMaxH3ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(MiniMaxH3ExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options = Tolerances();
  options.want_mode = testing::WantModeForRows(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MiniMaxH3ExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(MiniMaxH3ExactDecodeCoverage, EveryMiniMaxH3FixtureIsTested) {
  EXPECT_GE(testing::FixtureCases(kClasses).size(), 2u);
}

// Collectives of one exact decode at world size > 1 with the minimax_h3
// fixture's 2 transformer layers: 2 K/V all-gathers per window (7 latent
// frames every 5: 1 window for 7 frames, 2 for 9 to 12), then the row
// gather. post_quant_conv is 1x1x1 (no halo); norms, the feed-forward and
// the unpatchify are per token; the shared tokens' K/V are not gathered.
testing::ExpectedCollectives PerDecode(int64_t windows) { return {0, 0, 2 * windows}; }

TEST(MiniMaxH3ExactDecodeGroup, BatchTwoOneRowBandsSeveralWindowsAndCollectiveCounts) {
  for (int world : {1, 2, 4}) {
    for (const auto& [shape, windows] : std::vector<std::pair<std::vector<int64_t>, int64_t>>{
             {{2, 24, 7, 5, 3}, 1},      // bands 2,1,1,1 at 4 ranks; batch 2
             {{1, 24, 12, 6, 2}, 2}}) {  // two windows, cross-faded
      absl::Status s = parallel::testing::RunRanks(
          world,
          [&](int rank, int w, int port) {
            return testing::CheckSyntheticDecodes("minimax_h3", {shape}, PerDecode(windows), rank, w, port, kGroup,
                                                  Tolerances());
          },
          absl::Seconds(180));
      EXPECT_TRUE(s.ok()) << "world size " << world << ", latent [" << absl::StrJoin(shape, ", ") << "]: " << s;
    }
  }
}

TEST(MiniMaxH3ExactDecodeGroup, ZeroRegisterTokensShareOnlyTheClsToken) {
  for (int world : {1, 3, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<families::ModelFiles> files,
                           families::ModelFiles::Open(testing::FixturePath("minimax_h3")));
          nlohmann::json config = files->config();
          config["decoder_num_register_tokens"] = 0;
          ASSIGN_OR_RETURN(families::minimax_h3::MiniMaxH3Config c,
                           families::minimax_h3::MiniMaxH3Config::FromJson(config, "zero registers"));
          families::minimax_h3::MiniMaxH3Decoder decoder(c, config.dump());
          // The fixture's trained-shaped weights but for the register tokens
          // (diffusers' zero init would make every block an identity).
          ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> fixture, testing::LoadFixtureDecoder("minimax_h3"));
          auto* with_registers = dynamic_cast<families::minimax_h3::MiniMaxH3Decoder*>(fixture.get());
          if (with_registers == nullptr) return absl::InternalError("the fixture is not a MiniMax-H3 decoder");
          {
            at::NoGradGuard no_grad;
            const auto source = with_registers->module()->named_parameters();
            for (auto& item : decoder.module()->named_parameters()) {
              if (item.key() != "decoder.register_tokens") item.value().copy_(source[item.key()]);
            }
          }
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, testing::JoinTestGroup(rank, w, port, kGroup));
          at::Tensor latent;
          if (rank == worker::kLeader) {
            at::manual_seed(5);
            latent = at::randn({2, 24, 8, 4, 3});  // 4 rows: bands 2,1,1 / 1,1,1,1
          }
          testing::GroupCheckOptions o = Tolerances();
          o.what = "minimax_h3 without register tokens";
          ASSIGN_OR_RETURN(testing::GroupDecodeCheck checked,
                           testing::DecodeWithGroupAndCheck(decoder, *comm, latent, o));
          return testing::CheckCollectives(checked.stats, PerDecode(2), w, o.what);
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
