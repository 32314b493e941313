#pragma once

// A CPU allocator that counts live and peak bytes of every LibTorch CPU
// allocation in the process, so CPU workers measure decode peaks the way GPU
// workers read the CUDA caching allocator's statistics.
//
// Install() replaces LibTorch's CPU allocator once per process (before any
// tensor it should count is allocated; tensors allocated earlier are freed by
// their original allocator and never counted). Counters are atomics: any
// thread may read them.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>

namespace vaedecode::device {

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance (idempotent) and returns it.
  static CountingCpuAllocator& Install();
  // The installed instance, or nullptr when Install() was never called.
  static CountingCpuAllocator* Installed();

  int64_t current_bytes() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Starts a new peak window at the current usage.
  void ResetPeak() { peak_.store(current_bytes(), std::memory_order_relaxed); }

  // A budget for CPU serving and tests of the out-of-memory path: an
  // allocation that would take live bytes above `bytes` fails like a real
  // out-of-memory (c10::Error "out of memory"). 0 removes the limit.
  void set_limit_bytes(int64_t bytes) { limit_.store(bytes, std::memory_order_relaxed); }
  int64_t limit_bytes() const { return limit_.load(std::memory_order_relaxed); }

  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  CountingCpuAllocator() = default;
  static void Delete(void* data);

  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> limit_{0};
};

}  // namespace vaedecode::device
