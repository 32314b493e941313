// BroadcastJob's round trip over a real two-rank Gloo group (two processes
// on loopback): the peer rebuilds every field of the leader's plan that
// peers need, bit for bit, an encode's mode and image, and the heartbeat and
// shutdown kinds, and a streaming session's id, start and close.

#include "worker/group_job.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "parallel/gloo_communicator.h"
#include "parallel/testing/multi_process.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {
namespace {

absl::Status Expect(bool condition, absl::string_view what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

absl::StatusOr<std::unique_ptr<parallel::Communicator>> Connect(int rank, int world, int port) {
  parallel::GlooOptions options;
  options.rank = rank;
  options.world_size = world;
  options.store_port = port;
  options.group_name = "group-job-test";
  options.timeout = absl::Seconds(20);
  return parallel::GlooCommunicator::Create(options);
}

// The leader's job: a tiled bf16 video latent with a timestep that no
// integer rounding would keep. `world`: the group's size, as the leader's
// planner sets it (the leader keeps its own plan; peers take the size from
// their communicator).
GroupJob LeaderJob(int world) {
  GroupJob job;
  job.plan.world_size = world;
  job.model_index = 3;
  job.plan.mode = DecodeMode::kTiled;
  job.plan.tile_shape = {40, 48, true};
  job.plan.overlap_halo = false;
  job.plan.latent = (at::arange(2 * 4 * 3 * 5 * 6, at::kFloat) / 7.0).reshape({2, 4, 3, 5, 6}).to(at::kBFloat16);
  job.plan.conditioning.timestep = 0.05;
  job.plan.reason = "leader only";
  job.plan.session = {42, true, true, 3};
  return job;
}

absl::Status RoundTrip(int rank, int world, int port) {
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm, Connect(rank, world, port));
  const GroupJob sent = LeaderJob(world);
  ASSIGN_OR_RETURN(GroupJob got, BroadcastJob(*comm, rank == kLeader ? &sent : nullptr));
  RETURN_IF_ERROR(Expect(got.kind == JobKind::kDecode, "kind"));
  RETURN_IF_ERROR(Expect(got.model_index == 3, "model index"));
  RETURN_IF_ERROR(Expect(got.plan.mode == DecodeMode::kTiled, "mode"));
  RETURN_IF_ERROR(Expect(got.plan.tile_shape.rows == 40 && got.plan.tile_shape.cols == 48 && got.plan.tile_shape.stock,
                         "tile shape"));
  RETURN_IF_ERROR(Expect(!got.plan.overlap_halo, "overlap_halo"));
  RETURN_IF_ERROR(Expect(got.plan.world_size == world, "world size"));
  RETURN_IF_ERROR(Expect(got.plan.latent.scalar_type() == at::kBFloat16, "latent dtype"));
  RETURN_IF_ERROR(Expect(got.plan.latent.sizes().vec() == sent.plan.latent.sizes().vec(), "latent shape"));
  RETURN_IF_ERROR(Expect(got.plan.latent.equal(sent.plan.latent), "latent values"));
  const double t = got.plan.conditioning.timestep.value_or(-1);
  RETURN_IF_ERROR(Expect(std::memcmp(&t, &*sent.plan.conditioning.timestep, sizeof(t)) == 0, "timestep bits"));
  RETURN_IF_ERROR(Expect(got.plan.session.id == 42 && got.plan.session.start && got.plan.session.ends,
                         "session id, start and end"));
  // What stays on the leader.
  RETURN_IF_ERROR(Expect(rank == kLeader ? got.plan.reason == "leader only" : got.plan.reason.empty(), "reason"));
  RETURN_IF_ERROR(Expect(got.plan.session.replayed_latent_frames == (rank == kLeader ? 3 : 0), "replayed frames"));

  // A session's close carries its id and nothing else.
  GroupJob close;
  close.kind = JobKind::kSessionClose;
  close.plan.session.id = 77;
  ASSIGN_OR_RETURN(GroupJob closed, BroadcastJob(*comm, rank == kLeader ? &close : nullptr));
  RETURN_IF_ERROR(Expect(closed.kind == JobKind::kSessionClose && closed.plan.session.id == 77, "session close"));
  RETURN_IF_ERROR(Expect(!closed.plan.latent.defined(), "a session close carries no latent"));

  // An encode: its mode and image travel; the decode plan's latent does not.
  GroupJob encode;
  encode.kind = JobKind::kEncode;
  encode.model_index = 2;
  encode.encode.mode = DecodeMode::kExact;
  encode.encode.reason = "leader only";
  encode.encode.image = (at::arange(2 * 3 * 7 * 5, at::kFloat) / 11.0).reshape({2, 3, 7, 5});
  ASSIGN_OR_RETURN(GroupJob image, BroadcastJob(*comm, rank == kLeader ? &encode : nullptr));
  RETURN_IF_ERROR(Expect(image.kind == JobKind::kEncode && image.model_index == 2, "encode kind and model"));
  RETURN_IF_ERROR(Expect(image.encode.mode == DecodeMode::kExact, "encode mode"));
  RETURN_IF_ERROR(Expect(image.encode.image.defined() && image.encode.image.equal(encode.encode.image), "image"));
  RETURN_IF_ERROR(Expect(!image.plan.latent.defined(), "an encode carries no latent"));
  RETURN_IF_ERROR(
      Expect(rank == kLeader ? image.encode.reason == "leader only" : image.encode.reason.empty(), "encode reason"));

  // A dense encode runs on the leader alone: its image does not travel.
  encode.encode.mode = DecodeMode::kDense;
  ASSIGN_OR_RETURN(GroupJob dense, BroadcastJob(*comm, rank == kLeader ? &encode : nullptr));
  RETURN_IF_ERROR(Expect(dense.kind == JobKind::kEncode && dense.encode.mode == DecodeMode::kDense, "dense encode"));
  RETURN_IF_ERROR(
      Expect(rank == kLeader ? dense.encode.image.equal(encode.encode.image) : !dense.encode.image.defined(),
             "a dense encode's image stays on the leader"));

  for (JobKind kind : {JobKind::kHeartbeat, JobKind::kShutdown}) {
    GroupJob control;
    control.kind = kind;
    ASSIGN_OR_RETURN(GroupJob back, BroadcastJob(*comm, rank == kLeader ? &control : nullptr));
    RETURN_IF_ERROR(Expect(back.kind == kind, "control kind"));
    RETURN_IF_ERROR(Expect(!back.plan.latent.defined(), "a control job carries no latent"));
  }
  return absl::OkStatus();
}

TEST(BroadcastJob, PeersRebuildTheLeadersPlan) {
  // Before any tensor exists in this process: the ranks are forked.
  const absl::Status s = parallel::testing::RunRanks(2, RoundTrip, absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s;
}

TEST(BroadcastJob, AGroupOfOneGetsItsOwnJob) {
  parallel::GlooOptions options;
  options.group_name = "group-job-test-1";
  absl::StatusOr<std::unique_ptr<parallel::Communicator>> comm = parallel::GlooCommunicator::Create(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const GroupJob sent = LeaderJob(1);
  absl::StatusOr<GroupJob> got = BroadcastJob(**comm, &sent);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->plan.latent.equal(sent.plan.latent));
  EXPECT_EQ(got->plan.reason, "leader only");
}

}  // namespace
}  // namespace vaedecode::worker
