#pragma once

// What the service tests share on top of the harness: model repositories
// made of the diffusers fixtures (../shared/fixtures), server flags that run
// the real vaedecode_worker, requests, and gtest checks of decoded outputs
// against the diffusers references.
//
// Threading: the checks report through gtest and may run on any thread; the
// rest has no shared state.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/service/service_harness.h"
#include "vaedecode/v1/vaedecode.pb.h"

namespace vaedecode::testing {

// The health service name of a model is this prefix + the model's name.
inline constexpr char kModelHealth[] = "vaedecode.v1.VaeDecoder/";

// A fresh model repository whose folders are symlinks to the named fixtures.
std::string FixtureRepository(const std::vector<std::string>& fixtures);

// Server flags for `devices` in groups of `group_size` running the real
// worker on `repository` ("" = the worker's embedded default model), then
// `extra`.
std::vector<std::string> RealWorkerFlags(const std::string& repository, const std::string& devices, int group_size,
                                         std::vector<std::string> extra = {});

// Starts the server and waits until every model in `models` is SERVING;
// nullptr (and a test failure saying why) otherwise.
std::unique_ptr<ServerProcess> StartServing(const std::vector<std::string>& flags,
                                            const std::vector<std::string>& models);

struct FloatTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// The only tensor of a float32 .safetensors file, or the one called `name`.
FloatTensor ReadFloat(const std::string& path, const std::string& name = "");

// A request for `model` with the latent of the .safetensors file `latent_file`.
v1::DecodeRequest FixtureRequest(const std::string& model, const std::string& latent_file,
                                 v1::OutputFormat format = v1::OUTPUT_FLOAT32, v1::Mode mode = v1::MODE_AUTO);

// A request for `model` with a seeded FLOAT32 latent of `shape`.
v1::DecodeRequest SyntheticRequest(const std::string& model, const std::vector<int64_t>& shape,
                                   const std::string& request_id = "");

std::vector<float> AsFloats(const DecodeOutcome& out);
std::vector<int64_t> Shape(const v1::Header& header);
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// The call ended OK with a complete, well-formed stream.
void ExpectOk(const DecodeOutcome& out);

// Compares a decode in `format` with the diffusers reference `expected`
// (NCHW or NCTHW float32): float32 to 1e-4, float16 to its rounding,
// uint8/PNG to one level of the 8-bit conversion.
void ExpectMatches(const DecodeOutcome& out, const FloatTensor& expected, v1::OutputFormat format);

// A malformed request (the sd_kl fixture's, mutated) and what the server
// must answer: the code and a piece of the message naming the problem.
struct BadRequestCase {
  std::string name;
  std::function<void(v1::DecodeRequest&)> mutate;
  grpc::StatusCode code;
  std::string message;
};
// Every malformed field the frontend checks; `available` is the server's
// model list as its messages print it ("flux1_kl, sd_kl").
std::vector<BadRequestCase> BadRequestCases(const std::string& available);

// The server's worker with `rank` (pid 0 when there is none).
WorkerProcess Rank(ServerProcess& server, int rank);

// Runs Decode on a thread; the call can be cancelled from the test thread.
class BackgroundDecode {
 public:
  BackgroundDecode(ServerProcess& server, v1::DecodeRequest request, absl::Duration deadline = absl::Seconds(120));
  ~BackgroundDecode();
  // False when the call is not (or no longer) in progress.
  bool Cancel();
  const DecodeOutcome& Join();

 private:
  absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  DecodeOutcome outcome_;
  std::thread thread_;
};

}  // namespace vaedecode::testing
