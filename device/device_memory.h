#pragma once

// Memory accounting of the device a process decodes on: what the scheduler
// reads as free memory, what calibration and the trailers report as decode
// peaks, and the budget that turns an oversized allocation into an
// out-of-memory error (which the tiling OOM ladder catches). One per
// process: a worker decodes on one device.
//
//   CPU   LibTorch's CPU allocator replaced by the counting allocator; the
//         budget is a configured cap (there is no natural "free memory").
//   CUDA  the caching allocator's statistics (allocated bytes, current and
//         peak) and cudaMemGetInfo; the budget is the allocator's memory
//         fraction, which caps its reserved bytes, so free memory under it
//         is counted against reserved bytes (less the cached blocks it can
//         give back); what the process holds outside the allocator
//         (context, handles, NCCL buffers) is measured and kept clear of,
//         with a reserve for what grows lazily (kLazyReserveBytes). Needs a
//         build with --config=gpu (an official CUDA LibTorch); elsewhere
//         installing it is UNIMPLEMENTED.
//
// Threading: the readers may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::device {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // Where peaks were measured, for calibration profile keys: "cpu", or
  // "cuda/<GPU model>" (peaks differ between backends, not between GPUs of
  // one model).
  virtual std::string backend() const = 0;

  // Bytes of live tensors on the device.
  virtual int64_t current_bytes() const = 0;
  // The most live bytes since the last ResetPeak().
  virtual int64_t peak_bytes() const = 0;
  // Starts a new peak window at the current usage.
  virtual void ResetPeak() = 0;

  // What a decode may still allocate: the budget less live bytes, and on a
  // GPU at most the device's free memory plus the allocator's cached blocks.
  // -1 when unbounded (a CPU without a budget).
  virtual int64_t free_bytes() const = 0;
  // What a decode could allocate with nothing but this process on the
  // device: the budget (or, on a GPU, the device's memory when smaller or
  // unbudgeted) less live bytes. A request that needs more can never run
  // here, however long it waits. -1 when unbounded (a CPU without a budget).
  virtual int64_t capacity_bytes() const = 0;

  // Caps this process's allocations on the device at `bytes` (0: no cap).
  virtual absl::Status SetBudget(int64_t bytes) = 0;
  virtual int64_t budget_bytes() const = 0;

  // Returns to the device the blocks a caching allocator holds that no
  // tensor uses (CUDA's emptyCache), before something that allocates outside
  // it (a new NCCL communicator) or an allocation that must not find the
  // cache fragmented (an out-of-memory retry). Nothing on a CPU.
  virtual void ReleaseCachedBlocks() {}

  // Measures what this process holds on the device outside its tensors (a
  // GPU's context, cuBLAS/cuDNN handles, NCCL's buffers), which free_bytes()
  // and capacity_bytes() then keep clear of. Call once those exist: after
  // the communicator formed and a first decode ran. Nothing on a CPU.
  virtual void MeasureMemoryOutsideTensors() {}
};

// Installs the accounting for `device` as this process's (once; installing
// again for the same kind of device returns the same instance).
absl::StatusOr<DeviceMemory*> InstallDeviceMemory(const c10::Device& device);

// The installed accounting, or nullptr before InstallDeviceMemory.
DeviceMemory* ProcessDeviceMemory();

}  // namespace vaedecode::device
