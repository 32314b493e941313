#pragma once

#include "families/registry.h"

namespace vaedecode::families {

// A registry holding every family this build supports.
const Registry& BuiltinFamilies();

}  // namespace vaedecode::families
