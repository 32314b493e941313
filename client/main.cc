// vaedecode_client: decodes one latent through a vaedecode server and writes
// the result like the `vaedecode` CLI does (.safetensors / .npy / .png), or
// with --image encodes one image (or clip) through Encode and writes its
// latent like `vaedecode encode` does.
//
//   vaedecode_client --server=127.0.0.1:50051 --latent=latent.safetensors --out=image.png
//   vaedecode_client --server=… --latent_shape=1,4,32,32 --seed=0 --out=demo.png
//   vaedecode_client --server=… --image=photo.png --out=latent.safetensors [--posterior=sample --seed=7]
//   vaedecode_client --server=… --model=wan --latent=clip.safetensors --stream_chunks=1,2,2 --out=clip.npy
//
// --stream_chunks sends the latent through a DecodeSession, that many latent
// frames per chunk (each once the chunk before it is decoded, as a
// generator would), prints one line per chunk and writes the clip the
// session's frames make (equal to the Decode without it).
//
// Prints one summary line; errors are one line on stderr and exit code 1
// (2 for bad flags).

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/client_io.h"
#include "rpc/modes.h"
#include "rpc/output_assembler.h"
#include "rpc/output_formats.h"
#include "rpc/request_options.h"
#include "rpc/session_client.h"
#include "rpc/session_stream.h"
#include "rpc/status_macros.h"
#include "vaedecode/v1/vaedecode.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "Server address HOST:PORT");
ABSL_FLAG(std::string, model, "default", "Model name (the server's ListModels)");
ABSL_FLAG(std::string, latent, "", ".safetensors or .npy latent; empty: a seeded demo latent");
ABSL_FLAG(std::string, audio_latent, "",
          ".safetensors or .npy audio latent muxed into the .mp4 (with --audio_model, a request option)");
ABSL_FLAG(std::string, latent_shape, "1,4,32,32", "Shape of the demo latent");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the demo latent; with --image and --posterior=sample, the sample's seed");
ABSL_FLAG(std::string, image, "",
          "Encode instead: .png, .jpg, .mp4, .safetensors or .npy image ([B, C, (T,) H, W] in [-1, 1]) to encode");
ABSL_FLAG(std::string, stream_chunks, "",
          "Video latents: decode through a streaming session, sending this many latent frames per chunk (1,2,2)");
ABSL_FLAG(int64_t, piece_bytes, 4 << 20, "Encode: the image is streamed in pieces of this many bytes");
ABSL_FLAG(std::string, out, "", "Output file: .safetensors, .npy, .png, .jpg or .mp4");
ABSL_FLAG(double, deadline_s, 600, "Call deadline in seconds");
ABSL_FLAG(std::string, request_id, "", "Request id (the server generates one when empty)");
ABSL_FLAG(int64_t, max_message_bytes, 256 << 20, "Largest message the client accepts");
ABSL_FLAG(bool, list_models, false, "Print the server's models and exit");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificates that signed the server's certificate: connect over TLS (empty with --tls_cert: "
          "the system's roots)");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain, for a server that requires one (mutual TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace {

using vaedecode::rpc::OutputAssembler;
namespace v1 = vaedecode::v1;

absl::Status Fail(const std::string& message) { return absl::InvalidArgumentError(message); }

// Under `bazel run` the working directory is the runfiles tree: relative
// paths mean the caller's directory.
std::string ResolvePath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().find("-----BEGIN ") == std::string::npos) {
    return Fail(absl::StrCat(flag, "=", path, ": not a readable PEM file"));
  }
  return text.str();
}

// Plaintext, or TLS when a CA or a client certificate is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials() {
  const std::string ca = ResolvePath(absl::GetFlag(FLAGS_tls_ca));
  const std::string cert = ResolvePath(absl::GetFlag(FLAGS_tls_cert));
  const std::string key = ResolvePath(absl::GetFlag(FLAGS_tls_key));
  if (cert.empty() != key.empty()) return Fail("--tls_cert and --tls_key go together");
  if (ca.empty() && cert.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(std::string roots, ReadPem("--tls_ca", ca));
    ssl.pem_root_certs = roots;
  }
  if (!cert.empty()) {
    ASSIGN_OR_RETURN(std::string chain, ReadPem("--tls_cert", cert));
    ASSIGN_OR_RETURN(std::string private_key, ReadPem("--tls_key", key));
    ssl.pem_cert_chain = chain;
    ssl.pem_private_key = private_key;
  }
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1) {
      return Fail(absl::StrCat("--latent_shape=", text, ": positive integers separated by commas"));
    }
    shape.push_back(d);
  }
  return shape;
}

// The request options (rpc/request_options.h) are no absl flags: they are
// taken from the command line by the table, so a new option is no line here.
// `--name=value` or `--name value`, by the option's field name or its CLI
// flag (--jpeg_quality, --jpeg-quality); an empty value leaves it unset.
using OptionArgs = std::map<std::string, std::string>;  // option name -> value

// A decode option's row, or else an encode option's (rpc/request_options.h).
const vaedecode::rpc::OptionInfo* FindOption(absl::string_view name) {
  if (const vaedecode::rpc::OptionInfo* decode = vaedecode::rpc::FindRequestOption(name)) return decode;
  for (const vaedecode::rpc::OptionInfo& o : vaedecode::rpc::EncodeOptions()) {
    if (o.name == name || o.CliFlag() == absl::StrCat("--", name)) return &o;
  }
  return nullptr;
}

// The encode option named `name`, or nullptr.
const vaedecode::rpc::OptionInfo* FindEncodeOption(const std::string& name) {
  for (const vaedecode::rpc::OptionInfo& o : vaedecode::rpc::EncodeOptions()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

absl::StatusOr<OptionArgs> TakeRequestOptions(int& argc, char** argv) {
  OptionArgs taken;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {  // the rest is not flags
      while (i < argc) argv[kept++] = argv[i++];
      break;
    }
    const vaedecode::rpc::OptionInfo* option = nullptr;
    absl::string_view name = arg;
    if (absl::ConsumePrefix(&name, "--") || absl::ConsumePrefix(&name, "-")) {
      option = FindOption(name.substr(0, name.find('=')));
    }
    if (option == nullptr || (option->surfaces & vaedecode::rpc::kClient) == 0) {
      argv[kept++] = argv[i];
      continue;
    }
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      taken[option->name] = std::string(name.substr(eq + 1));
    } else if (i + 1 < argc) {
      taken[option->name] = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value: ", option->Accepted()));
    }
  }
  argc = kept;
  return taken;
}

// Whether `--name` (or `--name=...`) is among the arguments: a flag whose
// absence means something other than its default value.
bool FlagGiven(int argc, char** argv, absl::string_view name) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (arg == name || absl::StartsWith(arg, absl::StrCat(name, "="))) return true;
  }
  return false;
}

// `seed_given`: --seed was on the command line (otherwise the server draws one).
absl::StatusOr<v1::EncodeRequest> BuildEncodeRequest(const OptionArgs& options, bool seed_given) {
  v1::EncodeRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  RETURN_IF_ERROR(vaedecode::client::ReadImage(ResolvePath(absl::GetFlag(FLAGS_image)), request));
  for (const auto& [name, value] : options) {
    if (value.empty()) continue;
    const vaedecode::rpc::OptionInfo* option = FindEncodeOption(name);
    if (option == nullptr) return Fail(absl::StrCat("--", name, " applies to decodes, not to --image encodes"));
    if (absl::Status s = vaedecode::rpc::SetOption(*option, value, request); !s.ok()) {
      return Fail(absl::StrCat("--", s.message()));
    }
  }
  if (seed_given) request.set_seed(absl::GetFlag(FLAGS_seed));
  return request;
}

absl::StatusOr<v1::DecodeRequest> BuildRequest(const OptionArgs& options) {
  v1::DecodeRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  const std::string latent = ResolvePath(absl::GetFlag(FLAGS_latent));
  if (latent.empty()) {
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseShape(absl::GetFlag(FLAGS_latent_shape)));
    *request.mutable_latent() = vaedecode::client::DemoLatent(shape, absl::GetFlag(FLAGS_seed));
  } else {
    ASSIGN_OR_RETURN(v1::Tensor t, vaedecode::client::ReadLatent(latent));
    *request.mutable_latent() = std::move(t);
  }
  if (const std::string audio = ResolvePath(absl::GetFlag(FLAGS_audio_latent)); !audio.empty()) {
    ASSIGN_OR_RETURN(v1::Tensor t, vaedecode::client::ReadLatent(audio));
    *request.mutable_audio_latent() = std::move(t);
  }
  for (const auto& [name, value] : options) {
    if (value.empty()) continue;
    const vaedecode::rpc::OptionInfo* option = vaedecode::rpc::FindRequestOption(name);
    if (option == nullptr) return Fail(absl::StrCat("--", name, " applies to --image encodes, not to decodes"));
    if (absl::Status s = vaedecode::rpc::SetOption(*option, value, request); !s.ok()) {
      return Fail(absl::StrCat("--", s.message()));
    }
  }
  if (auto given = options.find("output_format"); given == options.end() || given->second.empty()) {
    ASSIGN_OR_RETURN(v1::OutputFormat f, vaedecode::rpc::FormatForExtension(absl::GetFlag(FLAGS_out)));
    request.set_output_format(f);
  }
  return request;
}

std::string StatusLine(const grpc::Status& s) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  return absl::StrCat(code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN", ": ", s.error_message());
}

// Reads a stream's messages into `output`; false (with the reason on
// stderr) when the server's stream or status was bad.
template <typename Stream>
bool ReadStream(Stream& stream, grpc::ClientContext& ctx, OutputAssembler& output) {
  v1::DecodeResponse message;
  absl::Status stream_error;
  while (stream.Read(&message)) {
    if (!stream_error.ok()) continue;
    stream_error = output.Add(message);
    if (!stream_error.ok()) ctx.TryCancel();
  }
  const grpc::Status status = stream.Finish();
  if (!stream_error.ok()) {
    std::cerr << "vaedecode_client: bad stream from the server: " << stream_error.message() << "\n";
    return false;
  }
  if (!status.ok()) {
    std::cerr << "vaedecode_client: " << StatusLine(status) << "\n";
    return false;
  }
  return true;
}

int Encode(v1::VaeDecoder::Stub& stub, const OptionArgs& options, bool seed_given,
           std::chrono::system_clock::time_point deadline) {
  absl::StatusOr<v1::EncodeRequest> request = BuildEncodeRequest(options, seed_given);
  if (!request.ok()) {
    std::cerr << "vaedecode_client: " << request.status().message() << "\n";
    return 2;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  ctx.set_wait_for_ready(true);
  auto stream = stub.Encode(&ctx);
  for (const v1::EncodeRequest& piece : vaedecode::client::EncodePieces(*request, absl::GetFlag(FLAGS_piece_bytes))) {
    if (!stream->Write(piece)) break;  // the server ended the call (a refusal): Finish says why
  }
  stream->WritesDone();
  OutputAssembler output;
  if (!ReadStream(*stream, ctx, output)) return 1;
  absl::StatusOr<std::vector<std::string>> written = vaedecode::client::WriteEncodeOutput(
      ResolvePath(absl::GetFlag(FLAGS_out)), output, request->posterior() == v1::POSTERIOR_MOMENTS);
  if (!written.ok()) {
    std::cerr << "vaedecode_client: " << written.status().message() << "\n";
    return 1;
  }
  const v1::Header& h = output.header();
  const v1::Timings& t = output.trailer().timings();
  std::cout << "request_id=" << h.request_id() << " shape=[" << absl::StrJoin(h.shape(), ",")
            << "] mode=" << v1::Mode_Name(h.mode()) << " degree=" << h.degree() << " queue_ms=" << t.queue_ms()
            << " encode_ms=" << t.decode_ms() << " total_ms=" << t.total_ms()
            << " wrote=" << absl::StrJoin(*written, ",");
  if (h.has_sample_seed()) std::cout << " sample_seed=" << h.sample_seed();
  std::cout << "\n";
  return 0;
}

// The latent of `request` through one DecodeSession, `chunks` latent frames
// at a time; writes the clip like a Decode's output.
int DecodeInSession(v1::VaeDecoder::Stub& stub, const v1::DecodeRequest& request, const std::vector<int64_t>& chunks,
                    std::chrono::system_clock::time_point deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  ctx.set_wait_for_ready(true);
  vaedecode::rpc::SessionCallbacks callbacks;
  callbacks.on_message = [](const v1::DecodeResponse& message) {
    if (!message.has_chunk_trailer()) return;
    const v1::ChunkTrailer& t = message.chunk_trailer();
    std::cout << "chunk=" << t.chunk() << " first_frame=" << t.first_frame() << " frames=" << t.frames()
              << " queue_ms=" << t.timings().queue_ms() << " decode_ms=" << t.timings().decode_ms()
              << " stream_ms=" << t.timings().stream_ms() << " state_bytes=["
              << absl::StrJoin(t.state_bytes_per_rank(), ",") << "]"
              << (t.replayed_latent_frames() > 0 ? absl::StrCat(" replayed=", t.replayed_latent_frames()) : "") << "\n";
  };
  absl::StatusOr<v1::SessionOpen> open = vaedecode::rpc::SessionOpenFor(request);
  if (!open.ok()) {
    std::cerr << "vaedecode_client: --stream_chunks: " << open.status().message() << "\n";
    return 2;
  }
  vaedecode::rpc::SessionCall call =
      vaedecode::rpc::RunDecodeSession(stub, ctx, *open, request.latent(), chunks, callbacks);
  // A protocol error cancels the call: name it, not the CANCELLED it causes.
  if (!call.stream_error.ok()) {
    std::cerr << "vaedecode_client: bad stream from the server: " << call.stream_error.message() << "\n";
    return 1;
  }
  if (!call.status.ok()) {
    std::cerr << "vaedecode_client: " << StatusLine(call.status) << "\n";
    return 1;
  }
  vaedecode::rpc::SessionAssembler& session = call.stream;
  absl::StatusOr<std::vector<std::string>> written =
      vaedecode::client::WriteOutput(ResolvePath(absl::GetFlag(FLAGS_out)), session.clip());
  if (!written.ok()) {
    std::cerr << "vaedecode_client: " << written.status().message() << "\n";
    return 1;
  }
  const v1::SessionHeader& h = session.header();
  const v1::Trailer& t = session.trailer();
  std::cout << "session_id=" << h.session_id() << " shape=[" << absl::StrJoin(session.clip().header().shape(), ",")
            << "] mode=" << v1::Mode_Name(h.mode()) << " degree=" << h.degree() << " chunks=" << t.session_chunks()
            << " frames=" << t.session_frames() << " decode_ms=" << t.timings().decode_ms()
            << " total_ms=" << t.timings().total_ms() << " wrote=" << absl::StrJoin(*written, ",") << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      absl::StrCat("vaedecode_client --server=HOST:PORT [--model=NAME] [--latent=FILE | --latent_shape=B,C,H,W "
                   "--seed=S] --out=FILE.{safetensors,npy,png,jpg,mp4} [request options]\n"
                   "       vaedecode_client --server=HOST:PORT --model=NAME --image=FILE.{png,jpg,mp4,safetensors,npy} "
                   "--out=FILE.{safetensors,npy} [--seed=S] [encode options]\nrequest options:\n",
                   vaedecode::rpc::OptionUsage(vaedecode::rpc::kClient), "encode options:\n",
                   vaedecode::rpc::EncodeOptionUsage(vaedecode::rpc::kClient)));
  absl::StatusOr<OptionArgs> options = TakeRequestOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "vaedecode_client: " << options.status().message() << "\n";
    return 2;
  }
  const bool seed_given = FlagGiven(argc, argv, "seed");
  absl::ParseCommandLine(argc, argv);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(absl::GetFlag(FLAGS_max_message_bytes)));
  args.SetMaxSendMessageSize(static_cast<int>(absl::GetFlag(FLAGS_max_message_bytes)));
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = Credentials();
  if (!credentials.ok()) {
    std::fprintf(stderr, "vaedecode_client: %s\n", std::string(credentials.status().message()).c_str());
    return 2;
  }
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server), *credentials, args);
  std::unique_ptr<v1::VaeDecoder::Stub> stub = v1::VaeDecoder::NewStub(channel);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_deadline_s) * 1000));

  if (absl::GetFlag(FLAGS_list_models)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    v1::ListModelsResponse models;
    const grpc::Status s = stub->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!s.ok()) {
      std::cerr << "vaedecode_client: " << StatusLine(s) << "\n";
      return 1;
    }
    for (const v1::ModelInfo& m : models.models()) {
      std::cout << m.name() << " family=" << m.family() << " latent_channels=" << m.latent_channels()
                << " spatial_factor=" << m.spatial_factor() << " video=" << (m.is_video() ? "yes" : "no")
                << (m.timestep_conditioning() ? " timestep_conditioning=yes" : "") << "\n";
    }
    return 0;
  }

  if (absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "vaedecode_client: --out FILE is required (.safetensors, .npy, .png, .jpg or .mp4)\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_image).empty()) return Encode(*stub, *options, seed_given, deadline);
  absl::StatusOr<v1::DecodeRequest> request = BuildRequest(*options);
  if (!request.ok()) {
    std::cerr << "vaedecode_client: " << request.status().message() << "\n";
    return 2;
  }

  if (const std::string chunks_text = absl::GetFlag(FLAGS_stream_chunks); !chunks_text.empty()) {
    const auto& shape = request->latent().shape();
    absl::StatusOr<std::vector<int64_t>> chunks =
        vaedecode::rpc::ParseStreamChunks("--stream_chunks", chunks_text, shape.size() == 5 ? shape[2] : 1);
    if (!chunks.ok() || shape.size() != 5) {
      std::cerr << "vaedecode_client: "
                << (chunks.ok() ? "--stream_chunks needs a video latent [B, C, T, H, W]" : chunks.status().message())
                << "\n";
      return 2;
    }
    return DecodeInSession(*stub, *request, *chunks, deadline);
  }

  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  // Waits for the server to come up (within the deadline) instead of failing at once.
  ctx.set_wait_for_ready(true);
  OutputAssembler output;
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader = stub->Decode(&ctx, *request);
  if (!ReadStream(*reader, ctx, output)) return 1;
  absl::StatusOr<std::vector<std::string>> written =
      vaedecode::client::WriteOutput(ResolvePath(absl::GetFlag(FLAGS_out)), output);
  if (!written.ok()) {
    std::cerr << "vaedecode_client: " << written.status().message() << "\n";
    return 1;
  }
  const v1::Header& h = output.header();
  const v1::Timings& t = output.trailer().timings();
  std::cout << "request_id=" << h.request_id() << " shape=[" << absl::StrJoin(h.shape(), ",")
            << "] mode=" << v1::Mode_Name(h.mode()) << " degree=" << h.degree() << " chunks=" << output.chunks()
            << " queue_ms=" << t.queue_ms() << " decode_ms=" << t.decode_ms() << " gather_ms=" << t.gather_ms()
            << " total_ms=" << t.total_ms() << " wrote=" << absl::StrJoin(*written, ",");
  if (h.has_noise_seed()) std::cout << " noise_seed=" << h.noise_seed();
  std::cout << "\n";
  return 0;
}
