#include "device/counting_cpu_allocator.h"

#include <cstring>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace vaedecode::device {
namespace {

// Each block carries its size in a header, so the context can be the data
// pointer itself: LibTorch's raw_allocate() asserts data == context.
constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned

CountingCpuAllocator* g_instance = nullptr;

}  // namespace

CountingCpuAllocator* CountingCpuAllocator::Installed() { return g_instance; }

CountingCpuAllocator& CountingCpuAllocator::Install() {
  static CountingCpuAllocator* instance = [] {
    auto* a = new CountingCpuAllocator();
    // Priority above the default (0) so later low-priority installs don't win.
    c10::SetCPUAllocator(a, /*priority=*/1);
    g_instance = a;
    return a;
  }();
  return *instance;
}

c10::DataPtr CountingCpuAllocator::allocate(size_t nbytes) {
  const int64_t limit = limit_.load(std::memory_order_relaxed);
  if (limit > 0 && current_.load(std::memory_order_relaxed) + static_cast<int64_t>(nbytes) > limit) {
    TORCH_CHECK(false, "CPU out of memory: allocating ", nbytes, " bytes would exceed the ", limit, " byte budget (",
                current_.load(std::memory_order_relaxed), " in use)");
  }
  auto* base = static_cast<uint8_t*>(c10::alloc_cpu(nbytes + kHeader));
  *reinterpret_cast<size_t*>(base) = nbytes;
  void* data = base + kHeader;
  const int64_t bytes = static_cast<int64_t>(nbytes);
  const int64_t now = g_instance->current_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_instance->peak_.load(std::memory_order_relaxed);
  while (now > peak && !g_instance->peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return c10::DataPtr(data, data, &CountingCpuAllocator::Delete, c10::Device(c10::kCPU));
}

void CountingCpuAllocator::Delete(void* data) {
  if (data == nullptr) return;
  uint8_t* base = static_cast<uint8_t*>(data) - kHeader;
  const size_t nbytes = *reinterpret_cast<size_t*>(base);
  g_instance->current_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  c10::free_cpu(base);
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const { return &CountingCpuAllocator::Delete; }

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

}  // namespace vaedecode::device
