#include "families/weight_loading.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <limits>

namespace vaedecode::families {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A two-layer module with diffusers-style nested names.
struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    auto* inner = register_module("conv_in", std::make_shared<torch::nn::Module>()).get();
    w = inner->register_parameter("weight", at::zeros({2, 3}));
    b = inner->register_parameter("bias", at::zeros({2}));
    stat = register_buffer("running_mean", at::zeros({4}));
  }
  at::Tensor w, b, stat;
};

// Owns the bytes behind a set of TensorViews.
struct Checkpoint {
  std::vector<at::Tensor> storage;
  std::vector<std::unique_ptr<formats::TensorView>> views;
  TensorMap map;
  void Add(const std::string& name, const at::Tensor& t, formats::DType dtype = formats::DType::kF32) {
    storage.push_back(t.contiguous());
    auto v = std::make_unique<formats::TensorView>();
    v->name = name;
    v->dtype = dtype;
    v->shape = t.sizes().vec();
    v->data = static_cast<const uint8_t*>(storage.back().data_ptr());
    v->nbytes = storage.back().nbytes();
    map[name] = v.get();
    views.push_back(std::move(v));
  }
};

TEST(LoadStrict, FillsParametersAndBuffersByName) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::arange(6, at::kFloat).view({2, 3}));
  ckpt.Add("conv_in.bias", at::full({2}, 7.0f));
  ckpt.Add("running_mean", at::full({4}, -1.0f));
  ckpt.Add("encoder.x", at::ones({5}));
  ckpt.Add("step", at::zeros({}, at::kLong), formats::DType::kI64);
  ASSERT_TRUE(LoadStrict(m, ckpt.map, {{"encoder."}, {"step"}}, "tiny").ok());
  EXPECT_TRUE(m.w.equal(at::arange(6, at::kFloat).view({2, 3})));
  EXPECT_TRUE(m.b.equal(at::full({2}, 7.0f)));
  EXPECT_TRUE(m.stat.equal(at::full({4}, -1.0f)));
}

TEST(LoadStrict, ConvertsHalfAndBfloat16) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::full({2, 3}, 0.5, at::kHalf), formats::DType::kF16);
  ckpt.Add("conv_in.bias", at::full({2}, 2.0, at::kBFloat16), formats::DType::kBF16);
  ckpt.Add("running_mean", at::zeros({4}));
  ASSERT_TRUE(LoadStrict(m, ckpt.map, {}, "tiny").ok());
  EXPECT_TRUE(m.w.equal(at::full({2, 3}, 0.5f)));
  EXPECT_TRUE(m.b.equal(at::full({2}, 2.0f)));
}

TEST(LoadStrict, ListsEveryMissingTensor) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::zeros({2, 3}));
  absl::Status s = LoadStrict(m, ckpt.map, {}, "tiny.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("tiny.safetensors"), HasSubstr("2 missing"),
                                              HasSubstr("conv_in.bias"), HasSubstr("running_mean")));
}

TEST(LoadStrict, ListsUnexpectedTensorsUnlessIgnored) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::zeros({2, 3}));
  ckpt.Add("conv_in.bias", at::zeros({2}));
  ckpt.Add("running_mean", at::zeros({4}));
  ckpt.Add("decoder.extra", at::zeros({1}));
  ckpt.Add("encoder.conv.weight", at::zeros({1}));
  absl::Status s = LoadStrict(m, ckpt.map, {{"encoder."}, {}}, "tiny");
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("1 unexpected: decoder.extra")));
  EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr("encoder.conv")));
}

TEST(LoadStrict, ReportsShapeMismatchWithBothShapes) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::zeros({3, 2}));
  ckpt.Add("conv_in.bias", at::zeros({2}));
  ckpt.Add("running_mean", at::zeros({5}));
  absl::Status s = LoadStrict(m, ckpt.map, {}, "tiny");
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("2 with the wrong shape"), HasSubstr("conv_in.weight (checkpoint [3, 2], model [2, 3])"),
                    HasSubstr("running_mean (checkpoint [5], model [4])")));
}

TEST(LoadStrict, RejectsIntegerTensorForAParameter) {
  TinyImpl m;
  Checkpoint ckpt;
  ckpt.Add("conv_in.weight", at::zeros({2, 3}, at::kInt), formats::DType::kI32);
  ckpt.Add("conv_in.bias", at::zeros({2}));
  ckpt.Add("running_mean", at::zeros({4}));
  absl::Status s = LoadStrict(m, ckpt.map, {}, "tiny");
  EXPECT_THAT(std::string(s.message()), HasSubstr("not floating-point: conv_in.weight (I32)"));
}

// A NaN or Inf weight would make every decode NaN: refused at load, by name
// (float16 overflows to Inf as well).
TEST(LoadStrict, RefusesNonFiniteWeightsByName) {
  TinyImpl m;
  Checkpoint ckpt;
  at::Tensor weight = at::zeros({2, 3});
  weight[1][2] = std::numeric_limits<float>::quiet_NaN();
  ckpt.Add("conv_in.weight", weight);
  ckpt.Add("conv_in.bias", at::full({2}, std::numeric_limits<float>::infinity(), at::kHalf), formats::DType::kF16);
  ckpt.Add("running_mean", at::zeros({4}));
  absl::Status s = LoadStrict(m, ckpt.map, {}, "tiny");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 holding NaN or Inf: conv_in.weight, conv_in.bias"));
}

TEST(CountParameters, SumsNumel) {
  TinyImpl m;
  EXPECT_EQ(CountParameters(m), 8);
}

}  // namespace
}  // namespace vaedecode::families
