// GPU memory accounting from the CUDA caching allocator (libc10_cuda) and the
// CUDA runtime. Built only with --config=gpu (statistics indexed by
// StatType::AGGREGATE == 0).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include "absl/strings/str_cat.h"
#include "device/cuda_memory.h"

namespace vaedecode::device {
namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;
constexpr size_t kAggregate = 0;  // StatType::AGGREGATE in every LibTorch

// Grows after the measurement, outside the caching allocator: NCCL (2.22
// on) allocates channel buffers at a collective's first use of an
// algorithm or protocol, cuBLAS/cuDNN handles per new stream, the CUDA
// context's local memory with a kernel's stack. What a first decode and the
// communicator's warm-up made is measured; this covers the rest.
constexpr int64_t kLazyReserveBytes = int64_t{512} << 20;

class CudaDeviceMemory final : public DeviceMemory {
 public:
  CudaDeviceMemory(int index, std::string backend, int64_t total_bytes)
      : index_(index), backend_(std::move(backend)), total_bytes_(total_bytes) {}

  std::string backend() const override { return backend_; }
  int64_t current_bytes() const override { return Stats().allocated_bytes[kAggregate].current; }
  int64_t peak_bytes() const override { return Stats().allocated_bytes[kAggregate].peak; }
  void ResetPeak() override { allocator::resetPeakStats(static_cast<c10::DeviceIndex>(index_)); }

  int64_t free_bytes() const override {
    const auto stats = Stats();
    const int64_t allocated = stats.allocated_bytes[kAggregate].current;
    const int64_t reserved = stats.reserved_bytes[kAggregate].current;
    // Cached blocks no tensor uses come back to us, but not the free pieces
    // of segments that also hold live tensors (they cannot be released to
    // make room for a larger block).
    const int64_t reclaimable =
        std::max<int64_t>(0, reserved - allocated - stats.inactive_split_bytes[kAggregate].current);
    size_t free_now = 0, total = 0;
    // The worker's device stays current on this thread: every thread of a
    // worker works on it (see device::UseComputeDevice).
    cudaSetDevice(index_);
    const bool known = cudaMemGetInfo(&free_now, &total) == cudaSuccess;
    int64_t free = known ? static_cast<int64_t>(free_now) + reclaimable - kLazyReserveBytes
                         : total_bytes_ - outside_bytes_.load() - kLazyReserveBytes - allocated;
    // The budget caps what the allocator reserves.
    const int64_t budget = budget_bytes_.load();
    if (budget > 0) free = std::min(free, budget - reserved + reclaimable);
    return std::max<int64_t>(0, free);
  }

  int64_t capacity_bytes() const override {
    const int64_t budget = budget_bytes_.load();
    const int64_t device = total_bytes_ - outside_bytes_.load() - kLazyReserveBytes;
    const int64_t limit = budget > 0 ? std::min(budget, device) : device;
    return std::max<int64_t>(0, limit - Stats().allocated_bytes[kAggregate].current);
  }

  absl::Status SetBudget(int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative memory budget ", bytes));
    // The allocator refuses to reserve beyond the fraction: an out-of-memory
    // error, as when the GPU itself is full.
    const double fraction = bytes == 0 ? 1.0 : std::min(1.0, static_cast<double>(bytes) / total_bytes_);
    allocator::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(index_));
    budget_bytes_.store(bytes);
    return absl::OkStatus();
  }
  int64_t budget_bytes() const override { return budget_bytes_.load(); }

  void ReleaseCachedBlocks() override { allocator::emptyCache(); }

  void MeasureMemoryOutsideTensors() override {
    size_t free_now = 0, total = 0;
    cudaSetDevice(index_);
    if (cudaMemGetInfo(&free_now, &total) != cudaSuccess) return;
    // Whatever the device has in use that the allocator did not reserve:
    // this process's context, handles and NCCL buffers (and other
    // processes' memory, which is not ours to use either).
    const int64_t used = static_cast<int64_t>(total) - static_cast<int64_t>(free_now);
    outside_bytes_.store(std::max<int64_t>(0, used - Stats().reserved_bytes[kAggregate].current));
  }

 private:
  using StatsType = decltype(allocator::getDeviceStats(0));
  StatsType Stats() const { return allocator::getDeviceStats(static_cast<c10::DeviceIndex>(index_)); }

  const int index_;
  const std::string backend_;
  const int64_t total_bytes_;
  std::atomic<int64_t> budget_bytes_{0};
  std::atomic<int64_t> outside_bytes_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> NewCudaDeviceMemory(int index) {
  // The caching allocator's statistics exist once LibTorch has initialised
  // CUDA, which it does lazily on the first CUDA tensor.
  try {
    (void)at::empty({0}, at::TensorOptions().device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("cuda:", index, ": ", e.what_without_backtrace()));
  }
  cudaDeviceProp properties;
  if (cudaError_t e = cudaGetDeviceProperties(&properties, index); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", index, ": cudaGetDeviceProperties: ", cudaGetErrorString(e)));
  }
  auto memory = std::make_unique<CudaDeviceMemory>(index, absl::StrCat("cuda/", properties.name),
                                                   static_cast<int64_t>(properties.totalGlobalMem));
  memory->MeasureMemoryOutsideTensors();  // the context, at least; the worker measures again later
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

}  // namespace vaedecode::device
