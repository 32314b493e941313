#pragma once

// Which file a process is stuck on, from /proc: for a worker that does not
// finish starting, the model file on a hung mount it waits to open or read
// is named, not only the timeout. A thread counts when it sits in an open,
// a stat or a read of a file (not of a pipe or a socket).
//
// Thread-safe: reads /proc only. Needs ptrace access to `pid` (our own
// children have it).

#include <sys/types.h>

#include <string>

namespace vaedecode::rpc {

// "openat(\"/models/x/diffusion_pytorch_model.safetensors\")", several
// joined by ", " when several threads wait; "" when none does (or /proc
// cannot tell within a second: reading the process's memory waits for its
// memory map, which a thread stuck on a hung mount can hold).
std::string DescribeBlockedFileIo(pid_t pid);

}  // namespace vaedecode::rpc
