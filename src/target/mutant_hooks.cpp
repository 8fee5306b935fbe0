#include "src/target/mutant_hooks.hpp"

#include <atomic>

#include "src/error.hpp"

namespace dpcheck {

namespace {

std::atomic<const MutantTable*> registered{nullptr};

}  // namespace

void register_mutant_table(const MutantTable& table) {
  const MutantTable* none = nullptr;
  if (!registered.compare_exchange_strong(none, &table) && none != &table)
    throw Error("a second mutant table was registered; a program has one");
}

const MutantTable& mutant_table() {
  const MutantTable* table = registered.load();
  if (table == nullptr)
    throw Error(
        "no mutant table is registered in this program: call register_mutants() "
        "(mutants/mutants.hpp) before running a target with a mutant");
  return *table;
}

}  // namespace dpcheck
