"""The targets of one decoder family folder (families/<name>/), so a family's
BUILD.bazel says only what it borrows from other families.

A family folder holds config.{h,cc} (its diffusers config), decoder.{h,cc}
(the families::Decoder, usually a families::ModuleDecoder, and its
registration), encoder.{h,cc} when it encodes (the families::Encoder) and, when it has its own, blocks.{h,cc} (LibTorch modules
under diffusers' parameter names, with how each layer shards by rows);
config_test.cc and decoder_test.cc are its tests. Each `*_deps` adds to the
deps every family's target of that name has.
"""

def _exists(name):
    return len(native.glob([name])) > 0

def vae_family(
        config_deps = [],
        blocks_deps = [],
        decoder_deps = [],
        encoder_deps = [],
        decoder_test_deps = []):
    native.cc_library(
        name = "config",
        srcs = ["config.cc"],
        hdrs = ["config.h"],
        deps = [
            "//families:config_reader",
            "//rpc:status_macros",
            "//third_party/absl:status",
            "//third_party/json",
        ] + config_deps,
    )
    own = []
    if _exists("blocks.cc"):
        own.append(":blocks")
        native.cc_library(
            name = "blocks",
            srcs = ["blocks.cc"],
            hdrs = ["blocks.h"],
            deps = [
                ":config",
                "//families:layer_ops",
                "//families/nn:modules",
                "//third_party/torch",
            ] + blocks_deps,
        )
    if _exists("encoder.cc"):
        own.append(":encoder")
        native.cc_library(
            name = "encoder",
            srcs = ["encoder.cc"],
            hdrs = ["encoder.h"],
            deps = own[:-1] + [
                ":config",
                "//families:encoder",
                "//families:model_files",
                "//families:module_encoder",
                "//families:registry",
                "//families:status_error",
                "//families/nn:modules",
                "//rpc:status_macros",
                "//third_party/absl:status",
                "//third_party/json",
                "//third_party/torch",
            ] + encoder_deps,
        )
    native.cc_library(
        name = "decoder",
        srcs = ["decoder.cc"],
        hdrs = ["decoder.h"],
        deps = own + [
            ":config",
            "//families:decoder",
            "//families:module_backed_decoder",
            "//families:module_decoder",
            "//families:registry",
            "//families:row_bands",
            "//families:status_error",
            "//families:weight_loading",
            "//families/nn:modules",
            "//rpc:status_macros",
            "//third_party/absl:status",
            "//third_party/json",
            "//third_party/torch",
        ] + decoder_deps,
    )
    native.cc_test(
        name = "config_test",
        srcs = ["config_test.cc"],
        deps = [
            ":config",
            "//third_party/gtest:gtest_main",
            "//third_party/json",
        ],
    )
    if _exists("decoder_test.cc"):
        native.cc_test(
            name = "decoder_test",
            srcs = ["decoder_test.cc"],
            deps = own + [
                ":decoder",
                "//families:builtin_families",
                "//families:model_files",
                "//families:status_error",
                "//families/nn:modules",
                "//formats:tensor_file",
                "//tests/fixtures:fixture_paths",
                "//third_party/gtest:gtest_main",
                "//third_party/json",
                "//third_party/torch",
            ] + decoder_test_deps,
        )
