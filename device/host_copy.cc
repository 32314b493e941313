#include "device/host_copy.h"

#include <utility>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace vaedecode::device {

HostCopy::HostCopy(HostCopy&&) noexcept = default;
HostCopy& HostCopy::operator=(HostCopy&&) noexcept = default;
HostCopy::~HostCopy() = default;

HostCopy HostCopy::Start(const at::Tensor& tensor) {
  HostCopy copy;
  if (!tensor.defined() || tensor.is_cpu()) {
    copy.host_ = tensor;
    return copy;
  }
  // A non-blocking copy from a GPU lands in pinned memory (LibTorch pins the
  // destination itself), queued on the current stream.
  copy.host_ = tensor.to(at::kCPU, /*non_blocking=*/true);
  const c10::Device device = tensor.device();
  copy.done_ = std::make_unique<c10::Event>(device.type());
  copy.done_->record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  return copy;
}

bool HostCopy::ready() const { return done_ == nullptr || done_->query(); }

const at::Tensor& HostCopy::Wait() {
  if (done_ != nullptr) {
    done_->synchronize();
    done_.reset();
  }
  return host_;
}

}  // namespace vaedecode::device
