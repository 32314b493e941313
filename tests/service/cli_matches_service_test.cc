// The CLI and the service run one decode path (worker::PlanDecode, then
// the plan on a worker::GroupRuntime): for the same latent and mode they
// give the same output bit for bit, the same plan and the same collectives.
// A real vaedecode_server with a two-rank CPU group serving fixtures of
// several families, and the real `vaedecode` binary (one rank, or two local
// rank processes).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/service/service_checks.h"
#include "tests/service/service_harness.h"

namespace vaedecode::testing {
namespace {

using ::testing::HasSubstr;

// The value of ` name=VALUE` in the CLI's summary line ("" when absent).
std::string Field(const std::string& line, const std::string& name) {
  const std::string key = " " + name + "=";
  const size_t at = line.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return line.substr(begin, line.find(' ', begin) - begin);
}

struct CliDecode {
  std::string line;
  FloatTensor sample;
};

CliDecode RunCli(const std::string& fixture, const std::string& flags, const std::string& name) {
  const std::string out = absl::StrCat(TempDir("cli"), "/", fixture, "_", name, ".safetensors");
  const CommandResult run =
      RunCommand(absl::StrCat(Runfile("cli/vaedecode"), " decode --model ", FixturePath(fixture), " --latent ",
                              FixturePath(fixture + "/latent.safetensors"), " --out ", out, " ", flags));
  EXPECT_EQ(run.status, 0) << run.output;
  CliDecode decode{run.output, {}};
  if (run.status == 0) decode.sample = ReadFloat(out);
  return decode;
}

// One fixture's latent decoded by the server and the CLI in every mode the
// model supports (`tiled`: whether TILED is one).
void ExpectCliMatchesService(ServerProcess& server, const std::string& fixture, bool tiled) {
  SCOPED_TRACE(fixture);
  const std::vector<int64_t> latent_shape = ReadFloat(FixturePath(fixture + "/latent.safetensors")).shape;
  const std::string latent_size =
      absl::StrCat(latent_shape[latent_shape.size() - 2], "x", latent_shape[latent_shape.size() - 1]);
  struct Case {
    v1::Mode mode;
    std::string cli_flags;
    std::string cli_mode;
  };
  for (const Case& c : {Case{v1::MODE_DENSE, "--mode dense", "dense"},
                        Case{v1::MODE_EXACT, "--mode exact --ranks 2 --timeout-s 60", "exact"},
                        Case{v1::MODE_TILED, "--mode tiled", "tiled"}}) {
    SCOPED_TRACE(c.cli_mode);
    if (c.mode == v1::MODE_TILED && !tiled) {
      // Refused by both, naming the problem.
      const DecodeOutcome served =
          Decode(server.stub(),
                 FixtureRequest(fixture, FixturePath(fixture + "/latent.safetensors"), v1::OUTPUT_FLOAT32, c.mode));
      EXPECT_EQ(served.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(served.status.error_message(), HasSubstr("cannot be decoded in TILED mode"));
      const CommandResult run =
          RunCommand(absl::StrCat(Runfile("cli/vaedecode"), " decode --model ", FixturePath(fixture), " --latent ",
                                  FixturePath(fixture + "/latent.safetensors"), " --out ", TempDir("cli"),
                                  "/refused.safetensors --mode tiled"));
      EXPECT_NE(run.status, 0);
      EXPECT_THAT(run.output, HasSubstr("is not decoded in spatial tiles"));
      continue;
    }
    const DecodeOutcome served =
        Decode(server.stub(),
               FixtureRequest(fixture, FixturePath(fixture + "/latent.safetensors"), v1::OUTPUT_FLOAT32, c.mode));
    ExpectOk(served);
    const CliDecode cli = RunCli(fixture, c.cli_flags, c.cli_mode);
    ASSERT_FALSE(cli.sample.data.empty()) << cli.line;

    // The same output, bit for bit.
    EXPECT_EQ(Shape(served.output.header()), cli.sample.shape);
    const std::vector<float> service_sample = AsFloats(served);
    ASSERT_EQ(service_sample.size(), cli.sample.data.size());
    EXPECT_EQ(MaxAbsDiff(service_sample, cli.sample.data), 0.0);

    // The same plan and figures.
    EXPECT_EQ(served.output.header().mode(), c.mode);
    EXPECT_EQ(Field(cli.line, "mode"), c.cli_mode) << cli.line;
    const v1::Trailer& trailer = served.output.trailer();
    if (c.mode == v1::MODE_EXACT) {
      EXPECT_EQ(served.output.header().degree(), 2);
      EXPECT_EQ(Field(cli.line, "ranks"), "2");
      // The decode's own collectives (halo exchanges, statistics, K/V, the
      // row gather): the same count on both.
      EXPECT_GT(trailer.collectives(), 0);
      EXPECT_EQ(Field(cli.line, "collectives"), absl::StrCat(trailer.collectives())) << cli.line;
    }
    if (c.mode == v1::MODE_TILED) {
      // No memory bound on either: one tile of the whole latent, no retry.
      EXPECT_THAT(trailer.tile_plan(), HasSubstr(absl::StrCat("1x1 tiles of ", latent_size, " latents")));
      EXPECT_EQ(Field(cli.line, "plan"), "untiled") << cli.line;
      EXPECT_EQ(Field(cli.line, "tile_calls"), "1");
      EXPECT_EQ(Field(cli.line, "tile_retries"), absl::StrCat(trailer.tile_retries()));
      EXPECT_THAT(served.output.header().mode_reason(), HasSubstr("tiled without a memory bound"));
      EXPECT_THAT(cli.line, HasSubstr("tiled without a memory bound"));
    }
  }
}

TEST(CliMatchesService, DenseExactAndTiledDecodesAreTheSame) {
  // AutoencoderKL, HunyuanImage-2.1, HunyuanVideo 1.5 (a video) and
  // MiniMax-H3 (a ViT decoder, never tiled).
  const std::vector<std::string> fixtures = {"sd_kl", "hunyuanimage21", "hunyuanvideo15", "minimax_h3"};
  // MiniMax-H3's 9 latent frames make 30 frames of 48x80 (its windows; the
  // causal formula would say 33): the limit admits exactly that.
  std::unique_ptr<ServerProcess> server = StartServing(
      RealWorkerFlags(FixtureRepository(fixtures), "cpu:2", 2, {"--max_output_pixels=0,minimax_h3=115200"}), fixtures);
  ASSERT_NE(server, nullptr);
  for (const std::string& fixture : fixtures) ExpectCliMatchesService(*server, fixture, fixture != "minimax_h3");

  // One more latent frame makes 34 frames: refused before any decode, with
  // the frontend's prediction of the window plan's output.
  const DecodeOutcome longer = Decode(server->stub(), SyntheticRequest("minimax_h3", {1, 24, 10, 3, 5}));
  EXPECT_EQ(longer.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(longer.status.error_message(), HasSubstr(absl::StrCat("decodes to ", 34 * 48 * 80, " output pixels")));
}

}  // namespace
}  // namespace vaedecode::testing
