// What `dpcheck conform` does between parsing its command line and printing (src/cli/cmd_conform.cpp):
// the options of a run from what was asked, the suite run, each row as the table prints it, the
// summary after the table, and the rows as the JSON report's "checks".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conform/conform.hpp"

namespace dpcheck {

// What the command line asked, less what the command itself checks and prints.
struct ConformRequest {
  std::uint64_t seed = 1;
  int cases = 30;
  std::string check, case_text;
  const PropertyRows* properties = nullptr;  // verify's properties, or none (conform/conform.hpp)
  bool thorough = false;
  double max_mib = 64;  // with max_mib_given
  bool max_mib_given = false;
  int max_size = 1024;
  bool max_size_given = false;
  bool world_size_given = false;
  std::string schedule;         // --schedule
  bool allreduce_only = false;  // --allreduce-only
};

// The options of a run on `target` (its timeout set) with `world` ranks: the seed (rank 0's under a
// launcher: collective there), the buffers' limit (16 MiB quick, 64 thorough, or as given), the command
// that replays a case, the other worlds of threads the collectives also run on, and the child process
// that runs the absent-rank probe (or why it does not run).
ConformOptions conform_options(const Target& target, int world, const ConformRequest& request);

// The suite of the plugin `target` names: its kernels' checks (target.kernels) or its communicator's.
std::vector<ConformRow> run_conform_suite(const Target& target, int world, const ConformOptions& options);

// The table's head line, and one row as the table prints it (the detail cut to one line of 110).
std::string conform_table_head();
std::string conform_table_line(const ConformRow& row);

// What follows the table: the info rows' details, each failure with its promise, minimal case, why and
// replay, then the verdict line (and how many checks the plugin does not take).
struct ConformSummary {
  bool passed = true;
  std::string text;
};
ConformSummary conform_summary(const std::vector<ConformRow>& rows);

// The rows as the JSON report's "checks" array.
nlohmann::json conform_rows_json(const std::vector<ConformRow>& rows);

}  // namespace dpcheck
