#include "families/registry.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "device/counting_cpu_allocator.h"
#include "families/builtin_families.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::families {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

TEST(ClassesWithKeysLike, RecognisesEveryFixtureCheckpoint) {
  std::set<std::string> seen;
  for (const testing::FixtureCase& c :
       testing::FixtureCases({"AutoencoderKL", "AutoencoderKLFlux2", "AutoencoderKLWan", "AutoencoderKLQwenImage",
                              "AutoencoderKLHunyuanVideo", "AutoencoderKLLTX2Video"})) {
    if (!seen.insert(c.fixture).second) continue;
    absl::StatusOr<std::unique_ptr<ModelFiles>> files = ModelFiles::Open(testing::FixturePath(c.fixture));
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_THAT(BuiltinFamilies().ClassesWithKeysLike((*files)->tensors()), Contains(c.diffusers_class)) << c.fixture;
  }
  EXPECT_EQ(seen.size(), 9u);  // every fixture folder of these classes (ltx2_full is LTX-2 with its encoder)
}

TEST(ClassesWithKeysLike, UnknownKeysGuessNothing) { EXPECT_TRUE(BuiltinFamilies().ClassesWithKeysLike({}).empty()); }

// A model folder whose config.json says `class_name` next to `fixture`'s weights.
std::string MismatchedFolder(const std::string& fixture, const std::string& class_name) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / (fixture + "_as_" + class_name);
  fs::create_directories(dir);
  std::ifstream in(testing::FixturePath(fixture + "/config.json"));
  nlohmann::json config = nlohmann::json::parse(in);
  config["_class_name"] = class_name;
  std::ofstream(dir / "config.json") << config.dump(2);
  const fs::path weights = dir / "diffusion_pytorch_model.safetensors";
  if (!fs::exists(weights)) {
    fs::create_symlink(testing::FixturePath(fixture + "/diffusion_pytorch_model.safetensors"), weights);
  }
  return dir.string();
}

struct Mismatch {
  std::string fixture;     // whose weights
  std::string config_as;   // the class config.json claims
  std::string looks_like;  // what the error must name
};

class WrongFamily : public ::testing::TestWithParam<Mismatch> {};

TEST_P(WrongFamily, TheErrorNamesTheFamilyTheWeightsLookLike) {
  const Mismatch& m = GetParam();
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(MismatchedFolder(m.fixture, m.config_as), {});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()),
              AllOf(HasSubstr(absl::StrCat("these weights look like a checkpoint of ", m.looks_like)),
                    HasSubstr(absl::StrCat("says ", m.config_as))));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, WrongFamily,
    ::testing::Values(Mismatch{"flux2_kl", "AutoencoderKL", "AutoencoderKLFlux2, but"},
                      Mismatch{"sd_kl", "AutoencoderKLFlux2", "AutoencoderKL, but"},
                      Mismatch{"hunyuanvideo", "AutoencoderKL", "AutoencoderKLHunyuanVideo, but"},
                      Mismatch{"ltx2", "AutoencoderKLWan", "AutoencoderKLLTX2Video or AutoencoderKLLTXVideo"},
                      Mismatch{"wan21", "AutoencoderKLFlux2", "AutoencoderKLWan or AutoencoderKLQwenImage"}),
    [](const ::testing::TestParamInfo<Mismatch>& info) { return info.param.fixture + "_as_" + info.param.config_as; });

TEST(WrongFamily, AStrictLoadingErrorStillListsTheOffendingKeys) {
  absl::StatusOr<std::unique_ptr<Decoder>> d =
      BuiltinFamilies().Load(MismatchedFolder("flux2_kl", "AutoencoderKL"), {});
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(
      std::string(d.status().message()),
      AllOf(HasSubstr("does not match the model"), HasSubstr("unexpected: bn.num_batches_tracked, bn.running_mean")));
}

TEST(WrongFamily, RightFamilyLoadsWithoutAGuess) {
  absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath("flux2_kl"), {});
  EXPECT_TRUE(d.ok()) << d.status();
}

TEST(UnreadConfigKeys, EveryFixtureConfigIsReadWhole) {
  // diffusers' save_config writes every constructor argument: each one is
  // read by the decoder or known as the encoder's, so none is reported.
  for (const testing::FixtureCase& c : testing::AllFixtureCases()) {
    if (c.name != "main") continue;
    absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(testing::FixturePath(c.fixture), {});
    ASSERT_TRUE(d.ok()) << c.fixture << ": " << d.status();
    EXPECT_THAT((*d)->info().unread_config_keys, ::testing::IsEmpty()) << c.fixture;
  }
}

TEST(UnreadConfigKeys, AMisspeltKeyIsListed) {
  for (const std::string fixture : {"sd_kl", "flux2_kl", "wan21", "ltx2", "minimax_h3"}) {
    const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / (fixture + "_misspelt");
    fs::create_directories(dir);
    std::ifstream in(testing::FixturePath(fixture + "/config.json"));
    nlohmann::json config = nlohmann::json::parse(in);
    config["layers_per_blok"] = 3;
    config["_commit_hash"] = "abc";  // diffusers' own bookkeeping: never reported
    std::ofstream(dir / "config.json") << config.dump(2);
    LoadOptions seeded;
    seeded.seeded_weights = 1;
    absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(dir.string(), seeded);
    ASSERT_TRUE(d.ok()) << fixture << ": " << d.status();
    EXPECT_EQ((*d)->info().unread_config_keys, std::vector<std::string>{"layers_per_blok"}) << fixture;
  }
}

// Every integer and integer-list config value of every family's fixture,
// set to 0, -1, 2^20 and a value that divides nothing, with the fixture's
// weights: Load answers a Status every time. Before, a norm_num_groups of 0
// or a patch_size of 0 divided by zero (SIGFPE), a width of 2^20 threw
// bad_alloc out of the factory or allocated without bound, a negative
// channel count threw length_error: each killed the worker that loaded it.
TEST(Load, NoConfigValueCrashesOrAllocatesWithoutBound) {
  std::set<std::string> fixtures;
  for (const testing::FixtureCase& c : testing::AllFixtureCases()) fixtures.insert(c.fixture);
  int mutations = 0;
  for (const std::string& fixture : fixtures) {
    const nlohmann::json original =
        nlohmann::json::parse(std::ifstream(testing::FixturePath(fixture + "/config.json")));
    for (const auto& [key, value] : original.items()) {
      std::vector<nlohmann::json> bad;
      if (value.is_number_integer()) {
        bad = {0, -1, int64_t{1} << 20, 7};
      } else if (value.is_array() && !value.empty() && value[0].is_number_integer()) {
        const size_t n = value.size();
        nlohmann::json plus_one = value;
        for (auto& v : plus_one) v = v.get<int64_t>() + 1;
        bad = {std::vector<int64_t>(n, 0), std::vector<int64_t>(n, int64_t{1} << 20), plus_one, std::vector<int64_t>{}};
      }
      for (const nlohmann::json& b : bad) {
        nlohmann::json config = original;
        config[key] = b;
        const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / "mutated";
        fs::remove_all(dir);
        fs::create_directories(dir);
        std::ofstream(dir / "config.json") << config.dump();
        fs::create_symlink(testing::FixturePath(fixture + "/diffusion_pytorch_model.safetensors"),
                           dir / "diffusion_pytorch_model.safetensors");
        // Loading installs the counting allocator: what a load allocated
        // shows in its peak (the fixtures' weights are a few MB; an
        // unbounded build of a 2^20-wide layer would be gigabytes).
        device::CountingCpuAllocator& allocator = device::CountingCpuAllocator::Install();
        const int64_t before = allocator.current_bytes();
        allocator.ResetPeak();
        absl::StatusOr<std::unique_ptr<Decoder>> d = BuiltinFamilies().Load(dir.string(), {});
        EXPECT_LT(allocator.peak_bytes() - before, int64_t{1} << 30) << fixture << " " << key << "=" << b.dump();
        if (!d.ok()) {
          EXPECT_FALSE(d.status().message().empty()) << fixture << " " << key << "=" << b.dump();
        }
        ++mutations;
      }
    }
  }
  EXPECT_GT(mutations, 200);
}

}  // namespace
}  // namespace vaedecode::families
