// verify's properties as rows of `dpcheck conform` (conform/conform.hpp's PropertyRows). Conform's own
// checks sit a layer below the properties, so whoever runs conform with them gives it these: the
// dpcheck command and dpcheck.conform's program.
#pragma once

#include "conform/conform.hpp"

namespace dpcheck {

// Every property of verify's table, run with the plugin in place; a property that calls no plugin is
// skipped (verify checks it), and none runs where the plugin cannot all-reduce a gradient.
const PropertyRows& conform_property_rows();

}  // namespace dpcheck
