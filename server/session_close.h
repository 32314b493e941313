#pragma once

// The job that frees an ended session's state on its group. The session's
// room in the registry (its slot and its state bytes) is given back when
// that job is done, not when the session's call ends: until the workers
// have freed the state, a new session cannot count on its memory.

#include <memory>

#include "server/job.h"
#include "server/session_record.h"
#include "server/session_registry.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// A job for `session`'s group (model `model`) that writes nothing; when it
// finishes, with any status (a group that failed lost the state with its
// workers; a stopping server frees everything), `registry` closes the
// session. The registry is shared: the job may outlive the service.
std::shared_ptr<Job> MakeSessionCloseJob(const std::shared_ptr<SessionRecord>& session, const v1::ModelInfo& model,
                                         std::shared_ptr<SessionRegistry> registry);

}  // namespace vaedecode::server
