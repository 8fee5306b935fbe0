// A planted tree for Layers.KernelsAndTheOracleShareNothing: kernels/ includes the oracle, which the
// order of the layers alone would let it do.
#pragma once

#include "reference/bound.hpp"
