// The GPU worker path, run where a CUDA LibTorch and GPUs exist (every test
// skips elsewhere, e.g. in CI without a GPU; tools/gpu_check.sh
// runs them on a GPU machine):
//  * every fixture decodes densely on cuda:0 within diffusers' 1e-4 (float32
//    with TF32 off), from VAE and raw latents; in bfloat16 within the
//    fixtures' bf16 gate (max abs <= 1, RMSE <= 0.05); and the group path (job
//    broadcast, decode, rank statistics) runs with a communicator on the GPU;
//  * exact decode sharded over 2-4 GPUs with NCCL equals the dense decode;
//  * (--config=gpu) device memory reads the CUDA caching allocator and a
//    budget turns an oversized allocation into an out-of-memory status.
//
// CUDA is only touched inside forked ranks: a CUDA context does not survive
// fork, so the gtest process never creates one.

#include <iostream>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "device/compute_device.h"
#include "device/device_memory.h"
#include "formats/tensor_file.h"
#include "parallel/nccl_communicator.h"
#include "parallel/testing/multi_process.h"
#include "parallel/testing/tensor_checks.h"
#include "rpc/status_macros.h"
#include "tests/fixtures/fixture_paths.h"
#include "tests/fixtures/fixture_tensors.h"
#include "tests/fixtures/sharded_fixture_cases.h"
#include "tests/multiprocess/group_decode_checks.h"
#include "worker/decode_job.h"
#include "worker/group_decode.h"

namespace vaedecode {
namespace {

using parallel::testing::RankOutcome;
constexpr const char* kSkip = "SKIP: ";
// In a skip message: the case needs a GPU this binary does not see (no CUDA
// backend linked, or no device). gpu_check.sh fails a binary that skips so
// on a machine with a GPU.
constexpr const char* kNoGpu = "[gpu] ";

// Runs `body` on `world` forked ranks, rank r on cuda:r; skips the test
// unless a CUDA LibTorch sees at least `world` GPUs.
void RunOnGpus(int world, absl::Duration timeout, const std::function<absl::Status(int rank, int port)>& body) {
  parallel::testing::RunRanksOptions options;
  options.world_size = world;
  options.timeout = timeout;
  absl::StatusOr<std::vector<RankOutcome>> outcomes =
      parallel::testing::RunRanksCollect(options, [&body](int rank, int world, int port) -> absl::Status {
        if (!at::hasCUDA()) {
          return absl::FailedPreconditionError(absl::StrCat(kSkip, kNoGpu, "needs a --config=gpu build and a GPU"));
        }
        const int count = c10::impl::VirtualGuardImpl(c10::kCUDA).deviceCount();
        if (count == 0) return absl::FailedPreconditionError(absl::StrCat(kSkip, kNoGpu, "no GPU visible"));
        if (count < world) {
          return absl::FailedPreconditionError(absl::StrCat(kSkip, "needs ", world, " GPUs, found ", count));
        }
        RETURN_IF_ERROR(device::PrepareComputeDevice(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank))));
        return body(rank, port);
      });
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  for (const RankOutcome& outcome : *outcomes) {
    if (absl::StartsWith(outcome.status.message(), kSkip)) GTEST_SKIP() << outcome.status.message();
  }
  for (const RankOutcome& outcome : *outcomes) {
    EXPECT_TRUE(outcome.status.ok()) << "rank " << outcome.rank << ": " << outcome.status;
  }
}

// Rank `rank` of an NCCL group on cuda:<rank>; a skip where NCCL is not
// compiled in (builds without --config=cuda).
absl::StatusOr<std::unique_ptr<parallel::Communicator>> JoinNcclGroup(int rank, int world, int port) {
  parallel::NcclOptions options;
  options.rank = rank;
  options.world_size = world;
  options.device = rank;
  options.store_port = port;
  options.timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = parallel::NcclCommunicator::Create(options);
  if (!comm.ok() && comm.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::FailedPreconditionError(absl::StrCat(kSkip, comm.status().message()));
  }
  return comm;
}

absl::StatusOr<std::unique_ptr<families::Decoder>> GpuDecoder(const std::string& fixture, int index,
                                                              at::ScalarType dtype = at::kFloat) {
  ASSIGN_OR_RETURN(std::unique_ptr<families::Decoder> decoder, testing::LoadFixtureDecoder(fixture, dtype));
  decoder->ToDevice(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
  return decoder;
}

// A fixture case's VAE latent decoded densely on cuda:0 in `dtype`.
struct GpuCase {
  std::unique_ptr<families::Decoder> decoder;
  at::Tensor expected;  // diffusers' float32 decode, on the CPU
  at::Tensor sample;    // ours, on the GPU
};

absl::StatusOr<GpuCase> DecodeCaseOnGpu(const testing::FixtureCase& c, at::ScalarType dtype) {
  absl::StatusOr<std::unique_ptr<families::Decoder>> decoder = GpuDecoder(c.fixture, 0, dtype);
  RETURN_IF_ERROR(decoder.status());
  absl::StatusOr<at::Tensor> expected = formats::ReadTensorFile(c.expected_file, "sample");
  absl::StatusOr<at::Tensor> latent = formats::ReadTensorFile(c.latent_file, "latent");
  RETURN_IF_ERROR(expected.status());
  RETURN_IF_ERROR(latent.status());
  const bool video = (*decoder)->info().is_video;
  families::DenseOps ops;
  absl::StatusOr<at::Tensor> sample =
      worker::RunDecode(**decoder, {testing::InFamilyRank(*latent, video), families::LatentSpace::kVae}, ops);
  RETURN_IF_ERROR(sample.status());
  if (!sample->is_cuda()) return absl::InternalError("the decode did not run on the GPU");
  return GpuCase{*std::move(decoder), testing::InFamilyRank(*expected, video), *sample};
}

class GpuFixture : public ::testing::TestWithParam<testing::FixtureCase> {};

// Runs anywhere (no GPU): every file the GPU case reads is there, so a
// bundle that forgot one fails on the CPU that built it.
TEST_P(GpuFixture, FixtureFilesArePresent) {
  const testing::FixtureCase c = GetParam();
  for (const std::string& file : {c.latent_file, c.expected_file, c.pipeline_latent_file}) {
    if (file.empty()) continue;
    EXPECT_TRUE(formats::ReadTensorFile(file, file == c.expected_file ? "sample" : "latent").ok()) << file;
  }
  EXPECT_TRUE(testing::LoadFixtureDecoder(c.fixture).ok()) << c.fixture;
}

// Everything a case checks on cuda:0 in one forked child (a CUDA context
// and the weights' upload cost seconds each): dense float32 with TF32 off
// from VAE and raw latents within diffusers' 1e-4; bfloat16 within the
// fixtures' bf16 gate (as the CPU golden test: max abs <= 1 and RMSE <=
// 0.05 against diffusers' float32 decode); and the group path at world size
// 1 over NCCL (the leader's job and statistics tensors on the GPU, the
// sample back there).
TEST_P(GpuFixture, DecodesOnTheGpu) {
  const testing::FixtureCase c = GetParam();
  RunOnGpus(1, absl::Seconds(240), [&c](int rank, int port) -> absl::Status {
    if (at::globalContext().allowTF32CuBLAS() || at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) {
      return absl::InternalError("TF32 is still enabled on the compute device");
    }
    absl::StatusOr<GpuCase> run = DecodeCaseOnGpu(c, at::kFloat);
    RETURN_IF_ERROR(run.status());
    RETURN_IF_ERROR(
        parallel::testing::ExpectTensorClose(run->sample, run->expected, 1e-4, 0, c.fixture + " on cuda:0"));
    if (!c.pipeline_latent_file.empty()) {
      absl::StatusOr<at::Tensor> raw = formats::ReadTensorFile(c.pipeline_latent_file, "latent");
      RETURN_IF_ERROR(raw.status());
      families::DenseOps ops;
      absl::StatusOr<at::Tensor> from_raw = worker::RunDecode(*run->decoder, {*raw, families::LatentSpace::kRaw}, ops);
      RETURN_IF_ERROR(from_raw.status());
      RETURN_IF_ERROR(
          parallel::testing::ExpectTensorClose(*from_raw, run->expected, 1e-4, 0, c.fixture + " raw on cuda:0"));
    }

    absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = JoinNcclGroup(rank, 1, port);
    RETURN_IF_ERROR(comm.status());
    absl::StatusOr<at::Tensor> latent = testing::LeaderLatent(c.latent_file, rank, *run->decoder);
    RETURN_IF_ERROR(latent.status());
    testing::GroupCheckOptions check;
    check.expected_file = c.expected_file;
    check.what = c.fixture + "/" + c.name + " (group of 1 on cuda:0)";
    absl::StatusOr<testing::GroupDecodeCheck> group =
        testing::DecodeWithGroupAndCheck(*run->decoder, **comm, *latent, check);
    RETURN_IF_ERROR(group.status());
    worker::GroupDecodeResult mine;
    absl::StatusOr<std::vector<worker::RankStats>> stats = worker::GatherRankStats(**comm, mine);
    RETURN_IF_ERROR(stats.status());
    if (stats->size() != 1) return absl::InternalError("no rank statistics");
    run->decoder.reset();  // the float32 weights leave the GPU before the bf16 ones arrive

    absl::StatusOr<GpuCase> bf16 = DecodeCaseOnGpu(c, at::kBFloat16);
    RETURN_IF_ERROR(bf16.status());
    if (bf16->decoder->dtype() != at::kBFloat16) return absl::InternalError("the decoder is not bfloat16");
    const double max_abs = parallel::testing::MaxAbsError(bf16->sample.to(at::kFloat), bf16->expected);
    const double rmse = parallel::testing::RootMeanSquareError(bf16->sample.to(at::kFloat), bf16->expected);
    std::cout << c.fixture << "/" << c.name << " bfloat16 on cuda:0: max abs " << max_abs << " rmse " << rmse << "\n";
    if (max_abs > 1.0 || rmse > 0.05) {
      return absl::InternalError(absl::StrCat(c.fixture, " bfloat16: max abs ", max_abs, ", RMSE ", rmse));
    }
    return absl::OkStatus();
  });
}

std::string CaseName(const ::testing::TestParamInfo<testing::FixtureCase>& info) {
  return info.param.fixture + "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuFixture, ::testing::ValuesIn(testing::ShardedFixtureCases()), CaseName);

class GpuExact : public ::testing::TestWithParam<int> {};

TEST_P(GpuExact, ShardedOverGpusEqualsDense) {
  const int world = GetParam();
  RunOnGpus(world, absl::Seconds(600), [world](int rank, int port) -> absl::Status {
    absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = JoinNcclGroup(rank, world, port);
    RETURN_IF_ERROR(comm.status());
    for (const testing::FixtureCase& c : testing::ShardedFixtureCases()) {
      absl::StatusOr<std::unique_ptr<families::Decoder>> decoder = GpuDecoder(c.fixture, rank);
      RETURN_IF_ERROR(decoder.status());
      absl::StatusOr<at::Tensor> latent = testing::LeaderLatent(c.latent_file, rank);
      RETURN_IF_ERROR(latent.status());
      testing::GroupCheckOptions check;
      check.expected_file = c.expected_file;
      check.what = absl::StrCat(c.fixture, "/", c.name, " exact over ", world, " GPUs");
      absl::StatusOr<testing::GroupDecodeCheck> result =
          testing::DecodeWithGroupAndCheck(**decoder, **comm, *latent, check);
      RETURN_IF_ERROR(result.status());
    }
    return absl::OkStatus();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GpuExact, ::testing::Values(2, 3, 4));

TEST(GpuMemory, CachingAllocatorStatisticsAndBudget) {
  RunOnGpus(1, absl::Seconds(120), [](int, int) -> absl::Status {
    absl::StatusOr<device::DeviceMemory*> memory = device::InstallDeviceMemory(c10::Device(c10::kCUDA, 0));
    if (!memory.ok() && memory.status().code() == absl::StatusCode::kUnimplemented) {
      return absl::FailedPreconditionError(absl::StrCat(kSkip, kNoGpu, memory.status().message()));
    }
    RETURN_IF_ERROR(memory.status());
    device::DeviceMemory& m = **memory;
    if (!absl::StartsWith(m.backend(), "cuda/")) return absl::InternalError("backend " + m.backend());
    const int64_t base = m.current_bytes();
    m.ResetPeak();
    {
      at::Tensor block = at::empty({64 << 20}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
      if (m.current_bytes() - base != (64 << 20)) {
        return absl::InternalError(absl::StrCat("current grew by ", m.current_bytes() - base));
      }
    }
    if (m.current_bytes() != base || m.peak_bytes() - base != (64 << 20)) {
      return absl::InternalError(absl::StrCat("current ", m.current_bytes(), " peak ", m.peak_bytes()));
    }
    if (m.free_bytes() <= (64 << 20)) return absl::InternalError("free memory not reported");
    RETURN_IF_ERROR(m.SetBudget(m.current_bytes() + (256 << 20)));
    if (m.free_bytes() > (256 << 20)) return absl::InternalError("the budget does not bound free memory");
    const absl::Status too_big = worker::CatchExceptions("allocation", [] {
      at::Tensor t = at::empty({int64_t{1} << 30}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
    });
    if (too_big.code() != absl::StatusCode::kResourceExhausted) {
      return absl::InternalError("1 GiB under a 256 MiB budget: " + too_big.ToString());
    }
    return m.SetBudget(0);
  });
}

}  // namespace
}  // namespace vaedecode
