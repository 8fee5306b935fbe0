// Agreement across the processes of a launcher (src/cli/cli_common.hpp): every rank checks its own
// inputs and the ranks agree on one verdict, so that a bad input on one rank stops every rank at once,
// naming the rank; and the command line every rank was given must be the same.
#include <algorithm>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/comm.hpp"
#include "src/error.hpp"

namespace dpcheck::cli {

namespace {

// Rank 0's text on every rank: its length, then its bytes.
std::string broadcast_text(Communicator& world, std::string text) {
  std::uint64_t size = text.size();
  world.broadcast(&size, 1, DType::u64, 0);
  text.resize(size);
  if (size > 0) world.broadcast(text.data(), size, DType::u8, 0);
  return text;
}

bool is_option_name(const std::string& token) {
  return token.size() > 1 && token[0] == '-' && !(token[1] >= '0' && token[1] <= '9') && token[1] != '.';
}

// "--batch=30" as "--batch", "30", so that the two spellings of one value compare equal.
std::vector<std::string> normalized(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    const std::size_t eq = a.find('=');
    if (a.starts_with("--") && eq != std::string::npos) {
      out.push_back(a.substr(0, eq));
      out.push_back(a.substr(eq + 1));
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// The option whose value token i is ("--batch" for the 30 of "--batch 30"), or "" when token i is an
// option itself or a positional argument.
std::string owner_of(const std::vector<std::string>& args, std::size_t i) {
  if (i == 0 || i >= args.size() || is_option_name(args[i]) || !is_option_name(args[i - 1])) return {};
  return args[i - 1];
}

std::string describe_difference(const std::vector<std::vector<std::string>>& all) {
  const std::vector<std::string> zero = normalized(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> other = normalized(all[r]);
    if (other == zero) continue;
    std::size_t i = 0;
    while (i < zero.size() && i < other.size() && zero[i] == other[i]) ++i;
    const std::string rank = " on rank " + std::to_string(r);
    const std::string option = owner_of(zero, i);
    if (!option.empty() && option == owner_of(other, i))
      return option + " is " + zero[i] + " on rank 0 and " + other[i] + rank;
    const auto at = [](const std::vector<std::string>& a, std::size_t k) {
      return k < a.size() ? a[k] : std::string("nothing");
    };
    return "argument " + std::to_string(i + 1) + " is " + at(zero, i) + " on rank 0 and " + at(other, i) + rank;
  }
  return {};
}

}  // namespace

void check_on_writing_rank(const std::function<void()>& check) {
  Communicator* world = process_world();
  if (world == nullptr || world->size() == 1) return check();
  std::string why;
  if (world->rank() == 0) {
    try {
      check();
    } catch (const UsageError& e) {
      why = e.what();
      if (why.empty()) why = "bad output path";
    }
  }
  why = broadcast_text(*world, why);
  if (!why.empty()) throw UsageError(why);
}

void agree_on_rank_inputs(const std::function<void()>& local) {
  Communicator* world = process_world();
  if (world == nullptr || world->size() == 1) return local();
  std::string why;
  try {
    local();
  } catch (const UsageError& e) {
    why = e.what();
    if (why.empty()) why = "bad input";
  }
  // Every rank's reason ("" for none), padded to the longest for the all-gather.
  const std::vector<std::uint64_t> sizes = world->allgather_value<std::uint64_t>(why.size());
  const std::uint64_t size = *std::max_element(sizes.begin(), sizes.end());
  if (size == 0) return;
  why.resize(size);
  std::string all(size * static_cast<std::size_t>(world->size()), '\0');
  world->allgather(why.data(), all.data(), size, DType::u8);
  std::vector<std::string> reasons;
  for (std::size_t r = 0; r < sizes.size(); ++r) reasons.emplace_back(all.data() + r * size, sizes[r]);
  throw UsageError(describe_rank_reasons(reasons));
}

std::string describe_rank_reasons(const std::vector<std::string>& reasons) {
  if (reasons.empty()) return {};
  const bool same = std::all_of(reasons.begin(), reasons.end(), [&](const std::string& w) { return w == reasons[0]; });
  if (same) return reasons[0];
  std::size_t first = 0;
  while (reasons[first].empty()) ++first;
  int failing = 0;
  for (const std::string& w : reasons) failing += w.empty() ? 0 : 1;
  return "rank " + std::to_string(first) + ": " + reasons[first] +
         (failing > 1 ? " (and " + std::to_string(failing - 1) + " other ranks failed too)" : "");
}

void require_same_command_line(Communicator& world, const std::vector<std::string>& args) {
  if (world.size() == 1) return;
  std::string joined;
  for (const std::string& a : args) joined += a + '\0';
  // Equal counts for the all-gather: every rank's bytes padded to the longest.
  const std::vector<std::uint64_t> sizes = world.allgather_value<std::uint64_t>(joined.size());
  const std::uint64_t size = *std::max_element(sizes.begin(), sizes.end());
  joined.resize(size);
  std::string all(size * static_cast<std::size_t>(world.size()), '\0');
  if (size > 0) world.allgather(joined.data(), all.data(), size, DType::u8);
  std::vector<std::vector<std::string>> per_rank(static_cast<std::size_t>(world.size()));
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    std::string_view rest(all.data() + r * size, sizes[r]);
    while (!rest.empty()) {
      const std::size_t end = rest.find('\0');
      per_rank[r].emplace_back(rest.substr(0, end));
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
  }
  const std::string difference = describe_difference(per_rank);
  if (!difference.empty()) throw UsageError("ranks disagree on the command line: " + difference);
}

}  // namespace dpcheck::cli

namespace dpcheck::cli {

namespace {
Communicator* g_process_world = nullptr;
std::vector<std::string>& g_command_line() {
  static std::vector<std::string> words{"dpcheck"};
  return words;
}
}  // namespace

const std::vector<std::string>& command_line() { return g_command_line(); }
void set_command_line(std::vector<std::string> words) { g_command_line() = std::move(words); }

Communicator* process_world() { return g_process_world; }
void set_process_world(Communicator* world) { g_process_world = world; }
bool is_printing_rank() { return !g_process_world || g_process_world->rank() == 0; }

}  // namespace dpcheck::cli
