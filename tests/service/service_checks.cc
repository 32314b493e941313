#include "tests/service/service_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/client_io.h"
#include "formats/png.h"
#include "formats/safetensors.h"
#include "tests/fixtures/fixture_paths.h"

namespace vaedecode::testing {
namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    out = mant ? NAN : INFINITY;
  } else {
    out = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -out : out;
}

uint8_t ToPixel(float x) {
  float v = std::min(1.0f, std::max(0.0f, x / 2 + 0.5f)) * 255.0f;
  return static_cast<uint8_t>(std::nearbyint(v));
}

}  // namespace

std::string FixtureRepository(const std::vector<std::string>& fixtures) {
  const std::string dir = TempDir("repo");
  for (const std::string& f : fixtures) {
    std::filesystem::create_directory_symlink(std::filesystem::absolute(FixturePath(f)), dir + "/" + f);
  }
  return dir;
}

std::vector<std::string> RealWorkerFlags(const std::string& repository, const std::string& devices, int group_size,
                                         std::vector<std::string> extra) {
  std::vector<std::string> f = {
      absl::StrCat("--worker_binary=", Runfile("worker/vaedecode_worker")),
      absl::StrCat("--model_repository=", repository),
      absl::StrCat("--devices=", devices),
      absl::StrCat("--group_size=", group_size),
      "--collective_timeout_s=60",
  };
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

std::unique_ptr<ServerProcess> StartServing(const std::vector<std::string>& flags,
                                            const std::vector<std::string>& models) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> s = ServerProcess::Start(flags);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  for (const std::string& m : models) {
    absl::Status ok = (*s)->WaitServing(kModelHealth + m, true, absl::Seconds(120));
    EXPECT_TRUE(ok.ok()) << ok;
    if (!ok.ok()) return nullptr;
  }
  return *std::move(s);
}

FloatTensor ReadFloat(const std::string& path, const std::string& name) {
  FloatTensor t;
  auto file = formats::SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return t;
  const formats::TensorView* found = &(*file)->tensors()[0];
  for (const formats::TensorView& view : (*file)->tensors()) {
    if (view.name == name) found = &view;
  }
  EXPECT_TRUE(name.empty() || found->name == name) << path << " has no tensor " << name;
  const formats::TensorView& v = *found;
  EXPECT_EQ(v.dtype, formats::DType::kF32);
  t.shape = v.shape;
  t.data.resize(v.nbytes / 4);
  std::memcpy(t.data.data(), v.data, v.nbytes);
  return t;
}

v1::DecodeRequest FixtureRequest(const std::string& model, const std::string& latent_file, v1::OutputFormat format,
                                 v1::Mode mode) {
  v1::DecodeRequest r;
  r.set_model(model);
  absl::StatusOr<v1::Tensor> latent = client::ReadLatent(latent_file);
  EXPECT_TRUE(latent.ok()) << latent.status();
  if (latent.ok()) *r.mutable_latent() = *latent;
  r.set_output_format(format);
  r.set_mode(mode);
  return r;
}

v1::DecodeRequest SyntheticRequest(const std::string& model, const std::vector<int64_t>& shape,
                                   const std::string& request_id) {
  v1::DecodeRequest r;
  r.set_model(model);
  r.set_request_id(request_id);
  *r.mutable_latent() = client::DemoLatent(shape, 7);
  return r;
}

std::vector<float> AsFloats(const DecodeOutcome& out) {
  const std::string& bytes = out.output.tensor_bytes();
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::vector<int64_t> Shape(const v1::Header& h) { return {h.shape().begin(), h.shape().end()}; }

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

void ExpectOk(const DecodeOutcome& out) {
  ASSERT_TRUE(out.status.ok()) << out.status.error_code() << " " << out.status.error_message();
  ASSERT_TRUE(out.stream_error.ok()) << out.stream_error;
  ASSERT_TRUE(out.output.Finish().ok()) << out.output.Finish();
}

void ExpectMatches(const DecodeOutcome& out, const FloatTensor& expected, v1::OutputFormat format) {
  ExpectOk(out);
  if (!out.status.ok() || !out.stream_error.ok() || !out.output.Finish().ok()) return;
  const bool video = expected.shape.size() == 5;
  const int64_t B = expected.shape[0], C = expected.shape[1];
  const int64_t T = video ? expected.shape[2] : 1;
  const int64_t H = expected.shape[video ? 3 : 2], W = expected.shape[video ? 4 : 3];
  const v1::Header& h = out.output.header();
  EXPECT_EQ(h.output_format(), format);
  if (format == v1::OUTPUT_FLOAT32) {
    EXPECT_EQ(Shape(h), expected.shape);
    EXPECT_LE(MaxAbsDiff(AsFloats(out), expected.data), 1e-4);
    return;
  }
  if (format == v1::OUTPUT_FLOAT16) {
    EXPECT_EQ(Shape(h), expected.shape);
    const std::string& bytes = out.output.tensor_bytes();
    ASSERT_EQ(bytes.size(), expected.data.size() * 2);
    double worst = 0;
    for (size_t i = 0; i < expected.data.size(); ++i) {
      uint16_t half;
      std::memcpy(&half, bytes.data() + 2 * i, 2);
      const double err = std::fabs(HalfToFloat(half) - expected.data[i]);
      worst = std::max(worst, err - 1e-3 * std::fabs(expected.data[i]));
    }
    EXPECT_LE(worst, 1e-4);
    return;
  }
  // uint8 images [B, (T,) H, W, C], from the reference.
  std::vector<int64_t> want_shape = {B};
  if (video) want_shape.push_back(T);
  want_shape.insert(want_shape.end(), {H, W, C});
  EXPECT_EQ(Shape(h), want_shape);
  std::vector<uint8_t> pixels(B * T * H * W * C);
  if (format == v1::OUTPUT_UINT8) {
    ASSERT_EQ(out.output.tensor_bytes().size(), pixels.size());
    std::memcpy(pixels.data(), out.output.tensor_bytes().data(), pixels.size());
  } else {
    ASSERT_EQ(out.output.images().size(), static_cast<size_t>(B * T));
    for (int64_t i = 0; i < B * T; ++i) {
      absl::StatusOr<formats::PngImage> png = formats::DecodePng(out.output.images()[i]);
      ASSERT_TRUE(png.ok()) << png.status();
      ASSERT_EQ(png->width, W);
      ASSERT_EQ(png->height, H);
      ASSERT_EQ(png->channels, C);
      std::memcpy(pixels.data() + i * H * W * C, png->pixels.data(), H * W * C);
    }
  }
  int worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          for (int64_t c = 0; c < C; ++c) {
            const float e = expected.data[(((b * C + c) * T + t) * H + y) * W + x];
            const int got = pixels[(((b * T + t) * H + y) * W + x) * C + c];
            worst = std::max(worst, std::abs(got - ToPixel(e)));
          }
  EXPECT_LE(worst, 1);
}

WorkerProcess Rank(ServerProcess& server, int rank) {
  for (const WorkerProcess& w : server.Workers()) {
    if (w.rank == rank) return w;
  }
  return {};
}

BackgroundDecode::BackgroundDecode(ServerProcess& server, v1::DecodeRequest request, absl::Duration deadline)
    : thread_([this, &server, request = std::move(request), deadline] {
        DecodeOutcome out = Decode(server.stub(), request, deadline, nullptr, [this](grpc::ClientContext& ctx) {
          absl::MutexLock lock(&mu_);
          context_ = &ctx;
        });
        absl::MutexLock lock(&mu_);
        context_ = nullptr;
        outcome_ = std::move(out);
      }) {}

BackgroundDecode::~BackgroundDecode() {
  if (thread_.joinable()) thread_.join();
}

bool BackgroundDecode::Cancel() {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr) return false;
  context_->TryCancel();
  return true;
}

const DecodeOutcome& BackgroundDecode::Join() {
  if (thread_.joinable()) thread_.join();
  return outcome_;
}

std::vector<BadRequestCase> BadRequestCases(const std::string& available) {
  return {
      {"empty model", [](auto& r) { r.set_model(""); }, grpc::StatusCode::INVALID_ARGUMENT,
       absl::StrCat("model: empty; available models: ", available)},
      {"unknown model", [](auto& r) { r.set_model("sd_xl"); }, grpc::StatusCode::NOT_FOUND,
       absl::StrCat("model \"sd_xl\" not found; available: ", available)},
      {"no latent", [](auto& r) { r.clear_latent(); }, grpc::StatusCode::INVALID_ARGUMENT, "latent: missing"},
      {"no dtype", [](auto& r) { r.mutable_latent()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent.dtype: unspecified"},
      {"uint8 latent", [](auto& r) { r.mutable_latent()->set_dtype(v1::UINT8); }, grpc::StatusCode::INVALID_ARGUMENT,
       "UINT8 is not a floating type"},
      {"rank 3", [](auto& r) { r.mutable_latent()->mutable_shape()->RemoveLast(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "(rank 4), got rank 3"},
      {"video latent for an image model", [](auto& r) { r.mutable_latent()->add_shape(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "got rank 5"},
      {"zero dim", [](auto& r) { r.mutable_latent()->set_shape(2, 0); }, grpc::StatusCode::INVALID_ARGUMENT,
       "dimension 2 is 0"},
      {"negative dim", [](auto& r) { r.mutable_latent()->set_shape(3, -4); }, grpc::StatusCode::INVALID_ARGUMENT,
       "dimension 3 is -4"},
      {"channels", [](auto& r) { r.mutable_latent()->set_shape(1, 16); }, grpc::StatusCode::INVALID_ARGUMENT,
       "takes 4 latent channels, got 16"},
      {"short data", [](auto& r) { r.mutable_latent()->mutable_data()->resize(100); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent.data: 100 bytes"},
      {"fp16 byte count", [](auto& r) { r.mutable_latent()->set_dtype(v1::FLOAT16); },
       grpc::StatusCode::INVALID_ARGUMENT, "FLOAT16 needs"},
      {"huge shape", [](auto& r) { r.mutable_latent()->set_shape(0, int64_t{1} << 40); },
       grpc::StatusCode::INVALID_ARGUMENT, "more than 2^40 elements"},
      {"mode enum", [](auto& r) { r.set_mode(static_cast<v1::Mode>(42)); }, grpc::StatusCode::INVALID_ARGUMENT,
       "mode: unknown value 42"},
      {"format enum", [](auto& r) { r.set_output_format(static_cast<v1::OutputFormat>(9)); },
       grpc::StatusCode::INVALID_ARGUMENT, "output_format: unknown value 9"},
      {"space enum", [](auto& r) { r.set_latent_space(static_cast<v1::LatentSpace>(5)); },
       grpc::StatusCode::INVALID_ARGUMENT, "latent_space: unknown value 5"},
      {"long request id", [](auto& r) { r.set_request_id(std::string(300, 'x')); }, grpc::StatusCode::INVALID_ARGUMENT,
       "request_id: 300 characters"},
  };
}

}  // namespace vaedecode::testing
