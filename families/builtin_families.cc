#include "families/builtin_families.h"

#include "families/autoencoder_kl/decoder.h"
#include "families/flux2/decoder.h"
#include "families/hunyuanimage/decoder.h"
#include "families/hunyuanimage3/decoder.h"
#include "families/hunyuanvideo/decoder.h"
#include "families/hunyuanvideo15/decoder.h"
#include "families/ltx2/decoder.h"
#include "families/ltx2_audio/decoder.h"
#include "families/minimax_h3/decoder.h"
#include "families/minimax_h3_audio/decoder.h"
#include "families/qwenimage/decoder.h"
#include "families/qwenimage21/decoder.h"
#include "families/wan/decoder.h"

namespace vaedecode::families {

const Registry& BuiltinFamilies() {
  static const Registry* registry = [] {
    auto* r = new Registry();
    autoencoder_kl::Register(*r);
    wan::Register(*r);
    qwenimage::Register(*r);
    qwenimage21::Register(*r);
    flux2::Register(*r);
    ltx2::Register(*r);
    hunyuanvideo::Register(*r);
    hunyuanimage::Register(*r);
    hunyuanimage3::Register(*r);
    hunyuanvideo15::Register(*r);
    minimax_h3::Register(*r);
    minimax_h3_audio::Register(*r);
    ltx2_audio::Register(*r);
    return r;
  }();
  return *registry;
}

}  // namespace vaedecode::families
