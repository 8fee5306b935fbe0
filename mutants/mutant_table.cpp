// The table of mutants (mutants/mutants.hpp): the rows of the five files that hold them, one list, and
// what the core and the checks ask of it by name.
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/error.hpp"

namespace dpcheck {

std::span<const MutantInfo> mutants() {
  static const std::vector<MutantInfo> all = [] {
    std::vector<MutantInfo> rows;
    for (const std::span<const MutantInfo> part :
         {comm_mutants(), data_mutants(), step_mutants(), file_mutants(), check_mutants()})
      rows.insert(rows.end(), part.begin(), part.end());
    return rows;
  }();
  return all;
}

const MutantInfo* find_mutant(std::string_view name) {
  for (const MutantInfo& m : mutants())
    if (m.name == name) return &m;
  return nullptr;
}

void require_known_mutant(std::string_view name) {
  if (name.empty() || find_mutant(name)) return;
  std::string names;
  for (const MutantInfo& m : mutants()) names += (names.empty() ? "" : ", ") + std::string(m.name);
  throw UsageError("unknown mutant '" + std::string(name) + "' (known: " + names + ")");
}

std::string audit_mutant(std::string_view mutant) {
  return mutant.starts_with("audit-") && find_mutant(mutant) != nullptr ? std::string(mutant) : std::string();
}

MutantTraits mutant_traits(std::string_view name) {
  require_known_mutant(name);
  const MutantInfo* m = find_mutant(name);
  return m ? MutantTraits{m->engine, m->precision} : MutantTraits{};
}

const MutantParts& mutant_parts(std::string_view name) {
  static const MutantParts none;
  const MutantInfo* m = find_mutant(name);
  return m ? m->parts : none;
}

void mutant_bound_options(std::string_view mutant, reference::BoundOptions& options) {
  if (const MutantInfo* m = find_mutant(mutant); m && m->bound) m->bound(options);
}

PluginRules mutant_plugin_rules(std::string_view mutant) {
  PluginRules rules;
  if (const MutantInfo* m = find_mutant(mutant); m && m->plugin_rules) m->plugin_rules(rules);
  return rules;
}

void mutant_schedule_options(std::string_view mutant, reference::ScheduleOptions& options) {
  if (const MutantInfo* m = find_mutant(mutant); m && m->schedule) m->schedule(options);
}

void mutant_schedule_gamma(std::string_view mutant, const reference::ScheduleOptions& options, int world,
                           double& gamma) {
  if (const MutantInfo* m = find_mutant(mutant); m && m->schedule_gamma) m->schedule_gamma(options, world, gamma);
}

void register_mutants() {
  static const MutantTable table{.require = &mutant_traits, .parts = &mutant_parts};
  register_mutant_table(table);
}

}  // namespace dpcheck
