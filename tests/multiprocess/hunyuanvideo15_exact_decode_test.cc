// Exact (layer-wise sharded) HunyuanVideo 1.5 decode equals the dense decode
// and diffusers, with real worker processes over real Gloo: both
// AutoencoderKLHunyuanVideo15 fixtures at world sizes 1-4 (5 latent frames
// on 3 rows: bands 2,1 / 1,1,1, dense at 4 ranks; 1 frame on 5 rows: bands
// 3,2 / 2,2,1 / 2,1,1,1), from the decoder input and the pipeline latent;
// synthetic batch-2 latents (which diffusers decodes one entry at a time)
// with several frames and 1-row bands; collective counts derived from the
// layer structure; and an exact stream (a session's chunks) gathering each
// frame's attention keys and values once, not its whole prefix per chunk.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "families/builtin_families.h"
#include "families/sharded_layer_ops.h"
#include "parallel/counting_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

// Exact vs dense differ only in rounding: LibTorch's CPU conv3d rounds a
// pixel differently depending on the input's extent (~3e-6 on O(1) values),
// and the random-weight decoder amplifies it; the norms are per pixel, so
// no statistics are merged. The video criterion is 3e-5. A wrong halo row,
// replicated edge row or attention frame is off by O(0.1).
constexpr double kExactVsDense = 3e-5;
constexpr double kVsDiffusers = 1e-4;
constexpr char kGroup[] = "hunyuanvideo15-exact-decode-test";
const std::vector<std::string> kClasses = {"AutoencoderKLHunyuanVideo15"};

testing::GroupCheckOptions Tolerances() {
  testing::GroupCheckOptions o;
  o.exact_vs_dense = kExactVsDense;
  o.vs_diffusers = kVsDiffusers;
  return o;
}

class HunyuanVideo15ExactDecode : public ::testing::TestWithParam<testing::FixtureCaseAtWorld> {};

TEST_P(HunyuanVideo15ExactDecode, EqualsDenseAndDiffusers) {
  testing::GroupCheckOptions options = Tolerances();
  options.want_mode = testing::WantModeForRows(std::get<0>(GetParam()), std::get<1>(GetParam()));
  const absl::Status s = testing::RunFixtureCaseOnGroup(GetParam(), kGroup, options);
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HunyuanVideo15ExactDecode,
                         ::testing::ValuesIn(testing::FixtureCasesAtWorldSizes(kClasses)),
                         testing::FixtureCaseAtWorldName);

TEST(HunyuanVideo15ExactDecodeCoverage, EveryHunyuanVideo15FixtureIsTested) {
  EXPECT_GE(testing::FixtureCases(kClasses).size(), 2u);
}

// Collectives of one exact decode at world size > 1, from the layer
// structure of the hunyuanvideo15 fixture (5 levels, layers_per_block 1, so
// 2 resnets per up block; 4 upsamplers; mid block resnet-attention-resnet):
//   halo exchanges (3x3x3 convs) = 1 (conv_in) + 2 x 2 (mid resnets)
//       + 5 x 2 x 2 (up resnets) + 4 (upsamplers) + 1 (conv_out) = 30
//   GroupNorm statistics         = 0 (every norm is a per-pixel RMS norm)
//   K/V all-gathers              = 1 (the frame-causal mid-block attention:
//       every frame's band in one gather)
//   row gather to the leader     = 1
// = 32, whatever the frame count (no temporal tiling). The attention's
// 1x1x1 convs have no halo; the repeat shortcuts and the unpacking are
// row-local. None at world size 1.
constexpr testing::ExpectedCollectives kPerDecode{/*halo=*/30, /*group_norm=*/0, /*attention_kv=*/1};

TEST(HunyuanVideo15ExactDecodeGroup, BatchTwoSeveralFramesOneRowBandsAndCollectiveCounts) {
  for (int world : {1, 2, 4}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) {
          // Batch 2 with 3 frames on 5 rows (bands 2,1,1,1 at 4 ranks), then 6
          // frames on 4 rows, batch 1, one after the other in one group.
          return testing::CheckSyntheticDecodes("hunyuanvideo15", {{2, 8, 3, 5, 3}, {1, 8, 6, 4, 2}}, kPerDecode, rank,
                                                w, port, kGroup, Tolerances());
        },
        absl::Seconds(240));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

// One attention, in the mid block, after 3 halo exchanges: the leader's
// cancel flag also rides the halo exchanges. Up before the decode starts,
// every rank of 3 stops after exchange 1 (the stop word reaches rank 2 with
// it), before the attention, and no row is gathered; before, the decode ran
// to its end unless the flag was up by the attention. The next decode is
// right.
TEST(HunyuanVideo15ExactDecodeGroup, ACancelStopsEveryRankWithinWMinusOneConvolutions) {
  absl::Status s = parallel::testing::RunRanks(
      3,
      [](int rank, int w, int port) -> absl::Status {
        ASSIGN_OR_RETURN(parallel::CommStats stopped,
                         testing::DecodeCancelledFromTheStart("hunyuanvideo15", {1, 8, 2, 5, 3}, rank, w, port, kGroup,
                                                              Tolerances()));
        if (stopped.ForKind(parallel::CallKind::kHalo).calls != w - 1 ||
            stopped.ForKind(parallel::CallKind::kAttentionKV).calls != 0 ||
            stopped.ForKind(parallel::CallKind::kGatherOutput).calls != 0) {
          return absl::InternalError(absl::StrCat("rank ", rank, ": the cancelled decode made ", stopped.ToString()));
        }
        return absl::OkStatus();
      },
      absl::Seconds(180));
  EXPECT_TRUE(s.ok()) << s;
}

// An exact stream keeps its attention's keys and values gathered: each
// chunk's one K/V all-gather carries that chunk's frames alone (chunks of 1,
// 1, 2 and 1 latent frames: the same bytes for each frame, however long the
// prefix), and its frames equal the whole clip's exact decode within
// rounding (the same rows through the same layers, one chunk at a time).
TEST(HunyuanVideo15ExactDecodeGroup, AnExactStreamGathersEachFramesKeysAndValuesOnce) {
  for (int world : {2, 3}) {
    absl::Status s = parallel::testing::RunRanks(
        world,
        [](int rank, int w, int port) -> absl::Status {
          ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, testing::JoinTestGroup(rank, w, port, kGroup));
          ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, testing::LoadFixtureDecoder("hunyuanvideo15"));
          at::manual_seed(7);
          const at::Tensor latent = at::randn({2, 8, 5, 5, 3});  // every rank the same
          const parallel::ShardSpec spec = parallel::ShardSpec::ForRows(3, latent.size(3), rank, w);
          const at::Tensor band = latent.narrow(3, spec.local_band().begin, spec.local_band().size());
          parallel::CountingCommunicator counting(*comm);
          families::ShardedLayerOps ops(counting, spec);
          const at::Tensor whole = decoder->Decode(band, ops);
          std::unique_ptr<families::DecodeStream> stream = decoder->OpenStream();
          std::vector<at::Tensor> chunks;
          int64_t begin = 0;
          int64_t bytes_per_frame = 0;
          for (int64_t frames : {1, 1, 2, 1}) {
            counting.Reset();
            chunks.push_back(stream->DecodeChunk(band.narrow(2, begin, frames), ops));
            begin += frames;
            const parallel::OpCounters kv = counting.stats().ForKind(parallel::CallKind::kAttentionKV);
            if (kv.calls != 1) return absl::InternalError(absl::StrCat("a chunk made ", kv.calls, " K/V gathers"));
            if (bytes_per_frame == 0) bytes_per_frame = kv.bytes_received;
            if (kv.bytes_received != frames * bytes_per_frame) {
              return absl::InternalError(absl::StrCat("rank ", rank, ": a chunk of ", frames, " frames after ",
                                                      begin - frames, " gathered ", kv.bytes_received,
                                                      " K/V bytes; one frame's are ", bytes_per_frame));
            }
          }
          return parallel::testing::ExpectTensorClose(at::cat(chunks, 2), whole, kExactVsDense, 0,
                                                      "exact stream vs the whole exact decode");
        },
        absl::Seconds(180));
    EXPECT_TRUE(s.ok()) << "world size " << world << ": " << s;
  }
}

}  // namespace
}  // namespace vaedecode
