#pragma once

// A copy of a tensor to host memory that may still be in flight, so that a
// thread which queues GPU work can hand results to the host (frames to
// stream, a word a collective carried) without waiting for the device to
// drain: the GPU keeps its queue full while the copy travels.
//
//   CPU tensor   nothing to copy: the host tensor is the tensor itself, ready.
//   CUDA tensor  copied into pinned host memory on the device's current
//                stream, behind the work queued before; an event marks the end.
//
// Threading: Start on the thread that queued the producing work (its current
// stream); Wait and ready() from any one thread afterwards.

#include <memory>

#include <ATen/core/Tensor.h>

namespace c10 {
class Event;
}  // namespace c10

namespace vaedecode::device {

class HostCopy {
 public:
  HostCopy() = default;  // empty: ready, undefined tensor
  HostCopy(HostCopy&&) noexcept;
  HostCopy& operator=(HostCopy&&) noexcept;
  ~HostCopy();

  static HostCopy Start(const at::Tensor& tensor);

  // Whether the copy is complete (never blocks).
  bool ready() const;
  // Blocks until the copy is complete; the host tensor (undefined when empty).
  const at::Tensor& Wait();

 private:
  at::Tensor host_;
  std::unique_ptr<c10::Event> done_;  // null when nothing is in flight
};

}  // namespace vaedecode::device
