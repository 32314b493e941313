// The request vocabulary's tables (modes, output formats, request options)
// against the proto they describe, and the one parse every front end uses.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "rpc/modes.h"
#include "rpc/output_formats.h"
#include "rpc/request_checks.h"
#include "rpc/request_options.h"

namespace vaedecode::rpc {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ModesTest, ParseAndPrintRoundTrip) {
  for (const std::string& name : ModeNames()) {
    absl::StatusOr<v1::Mode> mode = ParseMode(name);
    ASSERT_TRUE(mode.ok()) << name;
    EXPECT_EQ(ModeName(*mode), name);
  }
  EXPECT_EQ(ParseMode("EXACT").value(), v1::MODE_EXACT);
  EXPECT_EQ(ModeLabel(v1::MODE_TILED), "TILED");
  EXPECT_THAT(Message(ParseMode("fast").status()), HasSubstr("\"fast\"; use auto, dense, exact or tiled"));
  EXPECT_FALSE(ParseMode("").ok());
}

TEST(OutputFormatsTest, EveryEnumValueHasOneRow) {
  const google::protobuf::EnumDescriptor* e = v1::OutputFormat_descriptor();
  std::set<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    const OutputFormatInfo* f = FindOutputFormat(static_cast<v1::OutputFormat>(e->value(i)->number()));
    ASSERT_NE(f, nullptr) << e->value(i)->name() << " has no row in rpc/output_formats.cc";
    EXPECT_TRUE(names.insert(f->name).second) << f->name;
    EXPECT_GT(ElementSize(f->dtype), 0) << f->name;
    EXPECT_FALSE(f->oip_datatype.empty() || f->mime_type.empty() || f->help.empty()) << f->name;
    EXPECT_EQ(f->encoded, f->oip_datatype == "BYTES") << f->name;
    EXPECT_EQ(f->encoded, !f->extensions.empty()) << f->name;
    EXPECT_EQ(ParseOutputFormat(f->name).value(), f);
  }
  EXPECT_EQ(OutputFormats().size(), static_cast<size_t>(e->value_count()));
  EXPECT_EQ(ParseOutputFormat("JPG").value()->format, v1::OUTPUT_JPEG);
  EXPECT_THAT(Message(ParseOutputFormat("gif").status()), HasSubstr("use float32, float16, uint8"));
}

TEST(OutputFormatsTest, ExtensionsAndFits) {
  EXPECT_EQ(FormatForExtension("a/b.PNG").value(), v1::OUTPUT_PNG);
  EXPECT_EQ(FormatForExtension("x.jpeg").value(), v1::OUTPUT_JPEG);
  EXPECT_EQ(FormatForExtension("x.npy").value(), v1::OUTPUT_FLOAT32);
  EXPECT_THAT(Message(FormatForExtension("x.gif").status()), HasSubstr(".safetensors, .npy, .png"));
  EXPECT_EQ(FormatForExtension("x.wav").value(), v1::OUTPUT_WAV);
  EXPECT_TRUE(CheckOutputFits(v1::OUTPUT_PNG, 4, OutputKind::kImage, "m").ok());
  EXPECT_THAT(Message(CheckOutputFits(v1::OUTPUT_JPEG, 4, OutputKind::kImage, "model \"m\"")),
              HasSubstr("jpeg needs 1 or 3 output channels; model \"m\" has 4 (use png)"));
  EXPECT_THAT(Message(CheckOutputFits(v1::OUTPUT_MP4, 3, OutputKind::kImage, "model \"m\"")),
              HasSubstr("mp4 holds video; model \"m\" decodes images (use float32, float16, uint8, png, jpeg)"));
  EXPECT_TRUE(CheckOutputFits(v1::OUTPUT_FLOAT32, 7, OutputKind::kVideo, "m").ok());
  // Audio: waveforms are tensors or WAV files; a mel spectrogram a tensor.
  EXPECT_TRUE(CheckOutputFits(v1::OUTPUT_WAV, 0, OutputKind::kWaveform, "m").ok());
  EXPECT_TRUE(CheckOutputFits(v1::OUTPUT_FLOAT16, 2, OutputKind::kSpectrogram, "m").ok());
  EXPECT_THAT(Message(CheckOutputFits(v1::OUTPUT_PNG, 0, OutputKind::kWaveform, "model \"a\"")),
              HasSubstr("png holds images or video; model \"a\" decodes audio waveforms (use float32, float16, wav, "
                        "wav_float32)"));
  EXPECT_THAT(Message(CheckOutputFits(v1::OUTPUT_WAV_FLOAT32, 0, OutputKind::kSpectrogram, "model \"a\"")),
              HasSubstr("wav_float32 holds audio waveforms; model \"a\" decodes mel spectrograms (use float32, "
                        "float16)"));
  EXPECT_THAT(Message(CheckOutputFits(v1::OUTPUT_WAV, 3, OutputKind::kImage, "model \"m\"")),
              HasSubstr("wav holds audio waveforms; model \"m\" decodes images"));
}

TEST(OutputFormatsTest, TheKindOfAModelsOutput) {
  v1::ModelInfo model;
  v1::DecodeRequest request;
  EXPECT_EQ(OutputKindOf(model, request), OutputKind::kImage);
  model.set_is_video(true);
  EXPECT_EQ(OutputKindOf(model, request), OutputKind::kVideo);
  model.set_is_video(false);
  model.set_is_audio(true);
  EXPECT_EQ(OutputKindOf(model, request), OutputKind::kSpectrogram);  // no vocoder: no sample rate
  model.set_sample_rate(24000);
  EXPECT_EQ(OutputKindOf(model, request), OutputKind::kWaveform);
  request.set_audio_output(v1::AUDIO_OUTPUT_MEL);
  EXPECT_EQ(OutputKindOf(model, request), OutputKind::kSpectrogram);
}

TEST(RequestOptionsTest, EveryRowIsAFieldOfItsKind) {
  using google::protobuf::FieldDescriptor;
  for (const OptionInfo& o : RequestOptions()) {
    const FieldDescriptor* f = v1::DecodeRequest::descriptor()->FindFieldByName(o.name);
    ASSERT_NE(f, nullptr) << o.name << " is not a DecodeRequest field";
    switch (o.kind) {
      case OptionKind::kChoice:
        ASSERT_EQ(f->type(), FieldDescriptor::TYPE_ENUM) << o.name;
        // Every value of the enum has a choice, and no choice is a stranger.
        EXPECT_EQ(o.choices.size(), static_cast<size_t>(f->enum_type()->value_count())) << o.name;
        for (const auto& [number, spellings] : o.choices) {
          EXPECT_NE(f->enum_type()->FindValueByNumber(number), nullptr) << o.name;
          EXPECT_FALSE(spellings.empty()) << o.name;
        }
        break;
      case OptionKind::kInteger:
        EXPECT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_INT32) << o.name;
        EXPECT_LE(o.min, o.max) << o.name;
        break;
      case OptionKind::kUnsigned:
        EXPECT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_UINT64) << o.name;
        break;
      case OptionKind::kNumber:
        EXPECT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_DOUBLE) << o.name;
        break;
      case OptionKind::kName:
        EXPECT_EQ(f->cpp_type(), FieldDescriptor::CPPTYPE_STRING) << o.name;
        break;
    }
    EXPECT_FALSE(o.help.empty()) << o.name;
    EXPECT_EQ(FindRequestOption(o.name), &o);
    EXPECT_EQ(FindRequestOption(o.CliFlag().substr(2)), &o);
  }
}

TEST(RequestOptionsTest, SetFromTextOrTypedValues) {
  v1::DecodeRequest r;
  const OptionInfo& fps = *FindRequestOption("fps");
  EXPECT_TRUE(SetOption(fps, std::string("24"), r).ok());
  EXPECT_EQ(r.fps(), 24);
  EXPECT_TRUE(SetOption(fps, int64_t{30}, r).ok());
  EXPECT_TRUE(SetOption(fps, 60.0, r).ok());
  EXPECT_EQ(r.fps(), 60);
  EXPECT_THAT(Message(SetOption(fps, std::string("0"), r)), HasSubstr("fps: \"0\"; use an integer 1..240"));
  EXPECT_THAT(Message(SetOption(fps, 2.5, r)), HasSubstr("use an integer 1..240"));
  EXPECT_THAT(Message(SetOption(fps, true, r)), HasSubstr("fps: true"));
  EXPECT_EQ(r.fps(), 60);  // a refused value changes nothing

  EXPECT_TRUE(SetOption(*FindRequestOption("mode"), std::string("Tiled"), r).ok());
  EXPECT_EQ(r.mode(), v1::MODE_TILED);
  EXPECT_TRUE(SetOption(*FindRequestOption("output_format"), std::string("jpg"), r).ok());
  EXPECT_EQ(r.output_format(), v1::OUTPUT_JPEG);
  EXPECT_THAT(Message(SetOption(*FindRequestOption("latent_space"), int64_t{1}, r)), HasSubstr("use vae or raw"));

  const OptionInfo& seed = *FindRequestOption("noise_seed");
  EXPECT_TRUE(SetOption(seed, std::string("18446744073709551615"), r).ok());
  EXPECT_EQ(r.noise_seed(), 18446744073709551615u);
  EXPECT_FALSE(SetOption(seed, int64_t{-1}, r).ok());

  const OptionInfo& timestep = *FindRequestOption("decode_timestep");
  EXPECT_THAT(Message(SetOption(timestep, -0.5, r)), HasSubstr("use a number >= 0"));
  EXPECT_FALSE(SetOption(timestep, std::string("nan"), r).ok());
  EXPECT_FALSE(r.has_decode_timestep());
  EXPECT_TRUE(SetOption(*FindRequestOption("scaling-factor"), std::string("-0.5"), r).ok());

  // A name (another model's): a non-empty string within the bound.
  const OptionInfo& audio_model = *FindRequestOption("audio-model");
  EXPECT_TRUE(SetOption(audio_model, std::string("ltx2_audio"), r).ok());
  EXPECT_EQ(r.audio_model(), "ltx2_audio");
  EXPECT_THAT(Message(SetOption(audio_model, std::string(kMaxNameLength + 1, 'x'), r)),
              HasSubstr("audio_model: 257 characters; use a name of at most 256 characters"));
  EXPECT_FALSE(SetOption(audio_model, std::string(), r).ok());
  EXPECT_FALSE(SetOption(audio_model, int64_t{3}, r).ok());
  EXPECT_EQ(r.audio_model(), "ltx2_audio");
  r.set_audio_model(std::string(kMaxNameLength + 1, 'x'));  // as a gRPC client may send it
  EXPECT_THAT(Message(CheckOptionRanges(r)), HasSubstr("audio_model: longer than 256 characters"));
}

TEST(RequestOptionsTest, RangesAreCheckedOnEveryRequest) {
  v1::ModelInfo model;
  model.set_name("m");
  model.set_timestep_conditioning(true);
  v1::DecodeRequest r;
  EXPECT_TRUE(ValidateDecodeOptions(r, model).ok());  // unset int32s are the defaults
  r.set_jpeg_quality(101);
  EXPECT_THAT(Message(ValidateDecodeOptions(r, model)),
              HasSubstr("jpeg_quality: 101; use an integer 1..100 (0: the default, 75)"));
  r.set_jpeg_quality(0);
  // A field with presence: 0 is a level, not "unset".
  r.set_png_compression(0);
  EXPECT_TRUE(ValidateDecodeOptions(r, model).ok());
  r.set_png_compression(10);
  const std::string png = Message(ValidateDecodeOptions(r, model));
  EXPECT_THAT(png, HasSubstr("png_compression: 10; use an integer 0..9"));
  EXPECT_THAT(png, ::testing::Not(HasSubstr("the default")));
  r.clear_png_compression();
  r.set_mode(static_cast<v1::Mode>(9));
  EXPECT_THAT(Message(ValidateDecodeOptions(r, model)), HasSubstr("mode: unknown value 9"));
  r.set_mode(v1::MODE_AUTO);
  r.set_decode_noise_scale(-1);
  EXPECT_THAT(Message(ValidateDecodeOptions(r, model)), HasSubstr("decode_noise_scale: -1; use a number >= 0"));
}

TEST(RequestOptionsTest, UsageNamesEveryOfferedOption) {
  const std::string cli = OptionUsage(kCli);
  EXPECT_THAT(cli, HasSubstr("--jpeg-quality"));
  EXPECT_THAT(cli, HasSubstr("an integer 1..240 (default 16)"));
  EXPECT_THAT(cli, ::testing::Not(HasSubstr("--output-format")));  // the CLI's comes from --out
  EXPECT_THAT(OptionUsage(kClient), HasSubstr("--output_format"));
}

}  // namespace
}  // namespace vaedecode::rpc
