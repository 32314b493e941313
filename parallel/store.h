#pragma once

// Rendezvous for communicator groups over a c10d key-value store (normally a
// TCPStore hosted by the leader). Each group incarnation owns the keys under
// "vaedecode/<group_name>/", so groups sharing one store never collide.
//
// A group name must be unique per store for every incarnation of a group:
// rebuilding a group after a failure reuses nothing (an old abort key would
// abort the new group at once); append a generation number.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vaedecode::parallel {

struct TcpStoreOptions {
  // The master listens on this IPv4 address only (c10d alone would listen on
  // every interface, unauthenticated); clients connect to it.
  std::string host = "127.0.0.1";
  // Every process of the group must use the same port, so 0 (any port) is
  // rejected; the caller reserves one (rpc::ReservedPort) and hands it to all ranks.
  int port = 0;
  // This process hosts the store. The server lives as long as the returned
  // store object; the other ranks connect to it as clients.
  bool is_master = false;
  // Bounds connecting (clients retry until the master listens) and every
  // store operation.
  absl::Duration timeout = absl::Seconds(60);
};

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectTcpStore(const TcpStoreOptions& options);

// One rank's view of one group's keys. Thread-safe (c10d stores serialise
// their operations).
class GroupStore {
 public:
  // `store` is shared; this object keeps a reference.
  static absl::StatusOr<std::unique_ptr<GroupStore>> Create(c10::intrusive_ptr<c10d::Store> store,
                                                            std::string_view group_name, int rank, int world_size);

  const std::string& group_name() const { return group_name_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // The store restricted to this group's keys; backends run their own
  // rendezvous on it (Gloo's full-mesh connect, the NCCL unique id).
  const c10::intrusive_ptr<c10d::Store>& store() const { return prefixed_; }

  // Announces this rank, then waits until every rank has. DEADLINE_EXCEEDED
  // naming the ranks that did not join; UNAVAILABLE if the store is gone.
  absl::Status Join(absl::Time deadline);

  // Best effort (the store may be gone with a failed leader): records that
  // the group is aborted, with this rank and `reason`.
  void PublishAbort(std::string_view reason);

  // The published abort message, if any; an error if the store is
  // unreachable.
  absl::StatusOr<std::optional<std::string>> CheckAbort();

  // Sets `key` (in this group's namespace).
  absl::Status Set(std::string_view key, std::string_view value);
  // Waits until `key` is set (or the deadline), then returns its value.
  absl::StatusOr<std::string> WaitAndGet(std::string_view key, absl::Time deadline);

 private:
  GroupStore(c10::intrusive_ptr<c10d::Store> prefixed, std::string group_name, int rank, int world_size);

  c10::intrusive_ptr<c10d::Store> prefixed_;
  std::string group_name_;
  int rank_;
  int world_size_;
};

}  // namespace vaedecode::parallel
