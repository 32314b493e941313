#pragma once

// The Open Inference Protocol's ModelInfer and ModelMetadata as pure
// translations to and from vaedecode.v1 (the parameters and tensors are
// described in server/oip_service.h), shared by the gRPC service and the
// HTTP/REST binding, and fuzzed (server/oip_infer_fuzzer.cc).
//
// Thread-safe: pure functions.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/collected_output.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::server {

// What a ModelInfer asks for: its request parameter "operation", "decode"
// (the default) or "encode"; INVALID_ARGUMENT for anything else.
enum class InferOperation { kDecode, kEncode };
absl::StatusOr<InferOperation> OperationOf(const inference::ModelInferRequest& request);

// The DecodeRequest a ModelInferRequest asks for, for `model`.
// INVALID_ARGUMENT naming the input, output or parameter at fault.
absl::StatusOr<v1::DecodeRequest> TranslateModelInfer(const inference::ModelInferRequest& request,
                                                      const v1::ModelInfo& model);

// The EncodeRequest of an "encode" ModelInfer: input "image" (FP32, FP16 or
// BF16 [B, C, (T,) H, W] in [-1, 1], UINT8 pixels [B, (T,) H, W, C], or
// BYTES [1] holding a PNG or JPEG file), output "latent"; the parameters
// are rpc::EncodeOptions()'s rows (posterior, seed, latent_space, mode).
absl::StatusOr<v1::EncodeRequest> TranslateModelInferEncode(const inference::ModelInferRequest& request,
                                                            const v1::ModelInfo& model);

// Fills `response` with the output of a finished decode ("sample") or
// encode ("latent", and the sample's seed as the parameter sample_seed).
absl::Status FillModelInferResponse(CollectedOutput output, inference::ModelInferResponse* response,
                                    InferOperation operation = InferOperation::kDecode);

// The model's tensors as ModelMetadata describes them (-1: any size), with
// their default datatypes (FP32 in and out).
inference::ModelMetadataResponse DescribeModel(const v1::ModelInfo& model);

// Triton's ModelConfig of the model: the same tensors (max_batch_size 0:
// the batch is in dims), and as parameters every datatype the latent and
// the sample may take, the diffusers class, the dtype it decodes in and its
// raw-latent formula.
inference::ModelConfig DescribeConfig(const v1::ModelInfo& model);

}  // namespace vaedecode::server
