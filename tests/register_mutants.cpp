// Linked into every test program: its targets build their broken parts through the mutant table
// (mutants/mutants.hpp), as the dpcheck command's do.
#include "mutants/mutants.hpp"

namespace {

[[maybe_unused]] const bool mutants_registered = (dpcheck::register_mutants(), true);

}  // namespace
