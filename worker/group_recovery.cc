#include "worker/group_recovery.h"

#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "device/device_memory.h"
#include "parallel/store.h"
#include "rpc/status_macros.h"

namespace vaedecode::worker {
namespace {

// What a rank says about its own failure: it ran out of memory (and freed
// the job's tensors while unwinding), or it failed only because a peer
// aborted the communicator, or something else went wrong (a bug, a device
// error, a collective that timed out): not known to be sound.
enum class Verdict { kOutOfMemory, kPeerAborted, kBroken };

Verdict VerdictOf(const absl::Status& failure) {
  switch (failure.code()) {
    case absl::StatusCode::kResourceExhausted:
      return Verdict::kOutOfMemory;
    case absl::StatusCode::kUnavailable:  // the communicator's error after a peer's abort
      return Verdict::kPeerAborted;
    default:
      return Verdict::kBroken;
  }
}

constexpr const char* kVerdictNames[] = {"oom", "peer", "broken"};

// "<verdict> <message>" in the store.
std::string Encode(Verdict verdict, const absl::Status& failure) {
  return absl::StrCat(kVerdictNames[static_cast<int>(verdict)], " ", failure.message());
}

Verdict Decode(const std::string& posted, std::string* message) {
  const size_t space = posted.find(' ');
  const std::string name = posted.substr(0, space);
  *message = space == std::string::npos ? "" : posted.substr(space + 1);
  for (int v = 0; v < 3; ++v) {
    if (name == kVerdictNames[v]) return static_cast<Verdict>(v);
  }
  return Verdict::kBroken;
}

}  // namespace

std::string CommunicatorName(const std::string& group_name, int generation) {
  return generation == 0 ? group_name : absl::StrCat(group_name, ".r", generation);
}

GroupRecovery::GroupRecovery(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank, int world_size,
                             absl::Duration timeout, Connect connect)
    : store_(std::move(store)),
      group_name_(std::move(group_name)),
      rank_(rank),
      world_size_(world_size),
      timeout_(timeout),
      connect_(std::move(connect)) {}

GroupRecovery::~GroupRecovery() = default;

absl::StatusOr<std::unique_ptr<parallel::Communicator>> GroupRecovery::ConnectFirst() {
  return connect_(CommunicatorName(group_name_, 0));
}

absl::StatusOr<Recovered> GroupRecovery::Recover(const absl::Status& failure,
                                                 std::unique_ptr<parallel::Communicator>* comm) {
  const absl::Time deadline = absl::Now() + timeout_;
  // One namespace per generation: an earlier failure's verdicts never count.
  ASSIGN_OR_RETURN(
      std::unique_ptr<parallel::GroupStore> verdicts,
      parallel::GroupStore::Create(store_, absl::StrCat(CommunicatorName(group_name_, generation_), ".verdicts"), rank_,
                                   world_size_));
  const Verdict own = VerdictOf(failure);
  RETURN_IF_ERROR(verdicts->Set(absl::StrCat(rank_), Encode(own, failure)));
  // The peers read why from the post; this rank need not wait for theirs.
  if (own == Verdict::kBroken) return absl::UnavailableError("this rank cannot recover in place");
  std::vector<int> out_of_memory;  // the ranks that ran out
  std::string first_message;
  for (int r = 0; r < world_size_; ++r) {
    absl::StatusOr<std::string> posted = verdicts->WaitAndGet(absl::StrCat(r), deadline);
    if (!posted.ok()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r, " did not say how it came out of the failed job: ", posted.status().message()));
    }
    std::string message;
    const Verdict verdict = Decode(*posted, &message);
    if (verdict == Verdict::kBroken) {
      return absl::UnavailableError(absl::StrCat("rank ", r, " cannot recover in place: ", message));
    }
    if (verdict == Verdict::kOutOfMemory) {
      if (out_of_memory.empty()) first_message = message;
      out_of_memory.push_back(r);
    }
  }
  // Every rank merely saw a peer abort: nobody knows why.
  if (out_of_memory.empty()) return absl::UnavailableError("no rank of the failed job knows why it failed");
  const std::string who =
      absl::StrCat(out_of_memory.size() == 1 ? "rank " : "ranks ", absl::StrJoin(out_of_memory, ", "));

  // The failed job's memory sits in the caching allocator's cache, where a
  // new communicator's buffers (allocated outside it) cannot reach it.
  device::DeviceMemory* memory = device::ProcessDeviceMemory();
  if (memory != nullptr) memory->ReleaseCachedBlocks();
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> next,
                   connect_(CommunicatorName(group_name_, generation_ + 1)));
  ++generation_;
  *comm = std::move(next);  // the aborted one is destroyed here
  if (memory != nullptr) memory->MeasureMemoryOutsideTensors();
  spdlog::info("worker group {} rank {}: re-formed in place after {} ran out of memory (generation {})", group_name_,
               rank_, who, generation_);
  return Recovered{absl::ResourceExhaustedError(
      absl::StrCat(who, " ran out of memory (", first_message, "); the group recovered in place"))};
}

}  // namespace vaedecode::worker
