#pragma once

// The device a process decodes on. Workers and the CLI name devices as the
// server does: "cpu:N" (N numbers CPU workers; LibTorch has one CPU device)
// or "cuda:N" (a GPU index as CUDA numbers them in this process).

#include <string>

#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vaedecode::device {

// "cpu", "cpu:N" -> the CPU device; "cuda:N" -> CUDA device N. Anything else
// is INVALID_ARGUMENT naming the text.
absl::StatusOr<c10::Device> ParseComputeDevice(const std::string& name);

// Makes `device` this process's compute device. CUDA: FAILED_PRECONDITION
// when this build has no CUDA backend or the GPU does not exist; otherwise it
// becomes the current device and TF32 is switched off for matmuls and
// convolutions (decodes must match float32 references; TF32 keeps 10
// mantissa bits). CPU: nothing to do.
absl::Status PrepareComputeDevice(const c10::Device& device);

// Waits until every kernel queued on `device` has finished (CUDA; nothing for
// the CPU, whose ops are synchronous): a decode's time ends there.
void SynchronizeDevice(const c10::Device& device);

// Makes `device` current on the calling thread (CUDA; nothing for the CPU).
// Every thread that touches the worker's GPU calls it first: a thread starts
// on device 0, and code that restores "the previous device" would otherwise
// create a context on GPU 0 in every worker (CUDA 12 creates contexts on
// cudaSetDevice).
void UseComputeDevice(const c10::Device& device);

}  // namespace vaedecode::device
