// The backend a bundle records, and what replay says of a difference (divergence/backend_record.hpp).
#include "divergence/backend_record.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "divergence/trace.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/plugin/plugin_loader.hpp"

namespace dpcheck {

namespace fs = std::filesystem;

// Named, so that a unity build that joins this file to divergence.cpp keeps their helpers apart.
namespace backend_json {

[[noreturn]] void bad_field(const std::string& what, const std::string& why) {
  throw UsageError("\"" + what + "\" " + why);
}

const nlohmann::json& field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  if (!j.is_object()) bad_field(where.substr(0, where.size() - 1), "is " + j.dump() + ", not an object");
  if (!j.contains(key)) bad_field(where + key, "is missing");
  return j.at(key);
}

std::string text_field(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_string()) bad_field(where + key, "is " + v.dump() + ", not a string");
  return v.get<std::string>();
}

std::vector<std::string> text_list(const nlohmann::json& j, const std::string& key, const std::string& where) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_array()) bad_field(where + key, "is " + v.dump() + ", not a list");
  std::vector<std::string> out;
  for (const nlohmann::json& s : v) {
    if (!s.is_string()) bad_field(where + key, "holds " + s.dump() + ", not a string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

// Names go into a shell line (the replay line), so only a variable's name is taken.
bool is_variable_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// {"NAME": "value" or null}; `allow_unset` false: every value a string.
EnvValues env_field(const nlohmann::json& j, const std::string& key, const std::string& where, bool allow_unset) {
  const nlohmann::json& v = field(j, key, where);
  if (!v.is_object()) bad_field(where + key, "is " + v.dump() + ", not an object of variables");
  EnvValues out;
  for (const auto& [name, value] : v.items()) {
    if (!is_variable_name(name)) bad_field(where + key, "names \"" + name + "\", which is not an environment variable");
    if (value.is_string()) out[name] = value.get<std::string>();
    else if (value.is_null() && allow_unset) out[name] = std::nullopt;
    else bad_field(where + key + "." + name, "is " + value.dump() + ", not a string" + (allow_unset ? " or null" : ""));
  }
  return out;
}

nlohmann::json env_json(const EnvValues& env) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : env) out[name] = value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  return out;
}

std::optional<std::string> env_now(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// "NAME=value" (value as one shell word) or "NAME unset".
std::string setting(const std::string& name, const std::optional<std::string>& value) {
  return value ? name + "=" + shell_word(*value) : name + " unset";
}

std::string value_text(const std::optional<std::string>& value) { return value ? shell_word(*value) : "unset"; }

// The set variables of this process whose names start with one of `prefixes`.
EnvValues env_with_prefixes(const std::vector<std::string>& prefixes) {
  EnvValues out;
  for (char** e = ::environ; e && *e; ++e) {
    const std::string entry(*e);
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = entry.substr(0, eq);
    for (const std::string& p : prefixes)
      if (name.starts_with(p) && is_variable_name(name)) out[name] = entry.substr(eq + 1);
  }
  return out;
}

// XXH3 of a plugin's file, once per file as long as its size and time stay (verify's tools property
// writes a bundle per case).
std::string plugin_file_xxh3(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) throw UsageError(file.string() + ": cannot be read to record it in the bundle");
  using Key = std::tuple<std::string, off_t, std::int64_t, std::int64_t>;
  const Key key{file.string(), st.st_size, static_cast<std::int64_t>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec};
  static std::mutex mutex;
  static std::map<Key, std::string> cache;
  {
    const std::lock_guard lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UsageError(file.string() + ": cannot be read to record it in the bundle");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string hex = digest_hex(hash_bytes(bytes.data(), bytes.size()));
  const std::lock_guard lock(mutex);
  cache[key] = hex;
  return hex;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "none" : out;
}

std::vector<std::string> names_of(const EnvValues& env) {
  std::vector<std::string> out;
  for (const auto& [name, value] : env) out.push_back(name);
  return out;
}

}  // namespace backend_json

nlohmann::json BackendRecord::to_json() const {
  using namespace backend_json;
  nlohmann::json plugins_json = nlohmann::json::array();
  for (const PluginRecord& p : plugins) {
    nlohmann::json j = p.to_json();
    j["resolved"] = p.resolved;
    j["xxh3"] = p.xxh3;
    j["env"] = env_json(p.env);
    plugins_json.push_back(std::move(j));
  }
  nlohmann::json out{{"plugins", std::move(plugins_json)}};
  if (!env_prefixes.empty()) out["mpi_env"] = {{"prefixes", env_prefixes}, {"set", env_json(library_env)}};
  return out;
}

BackendRecord BackendRecord::from_json(const nlohmann::json& j) {
  using namespace backend_json;
  BackendRecord r;
  const std::string where = "backend.";
  const nlohmann::json& plugins = field(j, "plugins", where);
  if (!plugins.is_array()) bad_field("backend.plugins", "is " + plugins.dump() + ", not a list");
  for (std::size_t i = 0; i < plugins.size(); ++i) {
    const nlohmann::json& p = plugins[i];
    const std::string at = "backend.plugins[" + std::to_string(i) + "].";
    PluginRecord pr;
    pr.option = text_field(p, "option", at);
    if (pr.option != "--comm" && pr.option != "--kernels")
      bad_field(at + "option", "is \"" + pr.option + "\", not --comm or --kernels");
    pr.path = text_field(p, "path", at);
    if (pr.path.empty()) bad_field(at + "path", "is empty");
    pr.resolved = text_field(p, "resolved", at);
    pr.xxh3 = text_field(p, "xxh3", at);
    pr.name = text_field(p, "name", at);
    const nlohmann::json& version = field(p, "version", at);
    if (!version.is_null() && !version.is_string())
      bad_field(at + "version", "is " + version.dump() + ", not a string or null");
    if (version.is_string()) pr.version = version.get<std::string>();
    const nlohmann::json& abi = field(p, "abi", at);
    if (!abi.is_number_unsigned() || abi.get<std::uint64_t>() > 1u << 20)
      bad_field(at + "abi", "is " + abi.dump() + ", not a plugin ABI (an integer in [0, 1048576])");
    pr.abi = abi.get<unsigned>();
    if (pr.option == "--comm") {
      pr.dtypes = text_list(p, "dtypes", at);
      pr.ops = text_list(p, "ops", at);
    }
    pr.env = env_field(p, "env", at, true);
    r.plugins.push_back(std::move(pr));
  }
  if (j.contains("mpi_env")) {
    const nlohmann::json& m = j.at("mpi_env");
    r.env_prefixes = text_list(m, "prefixes", "backend.mpi_env.");
    r.library_env = env_field(m, "set", "backend.mpi_env.", false);
  }
  return r;
}

BackendRecord record_backend(const Target& target) {
  using namespace backend_json;
  BackendRecord r;
  for (const PluginIdentity& p : target_plugins(target)) {
    PluginRecord pr;
    static_cast<PluginIdentity&>(pr) = p;
    std::error_code ec;
    fs::path resolved = fs::canonical(p.path, ec);
    if (ec) resolved = fs::absolute(p.path);
    pr.resolved = resolved.string();
    pr.xxh3 = plugin_file_xxh3(resolved);
    for (const std::string& name : plugin_env_names(p.path, p.option)) pr.env[name] = env_now(name);
    r.plugins.push_back(std::move(pr));
  }
  if (target.backend->mpi != MpiUse::none) {
    r.env_prefixes = mpi_env_prefixes();
    r.library_env = env_with_prefixes(r.env_prefixes);
  }
  return r;
}

std::vector<std::string> backend_differences(const BackendRecord& recorded, const BackendRecord& now) {
  using namespace backend_json;
  std::vector<std::string> lines;
  const auto differs = [&](const std::string& what, const std::string& then, const std::string& today,
                           const std::string& note = "") {
    if (then != today) lines.push_back("the bundle ran with " + what + then + "; it is now " + today + note);
  };
  const auto variable = [&](const std::string& name, const std::optional<std::string>& then) {
    const std::optional<std::string> today = env_now(name);
    if (today != then)
      lines.push_back("the bundle ran with " + setting(name, then) + "; it is now " + value_text(today));
  };
  const auto or_none = [](const std::string& text) { return text.empty() ? std::string("none") : text; };
  for (const PluginRecord& was : recorded.plugins) {
    const auto is = std::find_if(now.plugins.begin(), now.plugins.end(),
                                 [&](const PluginRecord& p) { return p.option == was.option && p.path == was.path; });
    if (is == now.plugins.end()) continue;  // re-targeted: the replay says so
    const std::string plugin = was.option + " plugin ";
    differs(plugin, "'" + was.name + "'", "'" + is->name + "'");
    differs(plugin + "version ", or_none(was.version), or_none(is->version));
    differs(plugin + "ABI ", std::to_string(was.abi), std::to_string(is->abi));
    differs(plugin + "file ", was.resolved, is->resolved);
    differs(plugin + "file of XXH3 ", was.xxh3, is->xxh3,
            was.resolved == is->resolved ? " (the file changed since the run)" : "");
    differs(plugin + "dtypes ", joined(was.dtypes), joined(is->dtypes));
    differs(plugin + "ops ", joined(was.ops), joined(is->ops));
    differs(plugin + "variables ", joined(names_of(was.env)), joined(names_of(is->env)));
    for (const auto& [name, value] : was.env) variable(name, value);
  }
  if (!recorded.env_prefixes.empty() && !now.env_prefixes.empty()) {
    const auto ours = [&](const std::string& name) {
      return std::any_of(now.env_prefixes.begin(), now.env_prefixes.end(),
                         [&](const std::string& p) { return name.starts_with(p); });
    };
    for (const auto& [name, value] : recorded.library_env)
      if (ours(name)) variable(name, value);
    // This build's own prefixes, not the bundle's: a bundle cannot widen what is read of the environment.
    for (const auto& [name, value] : env_with_prefixes(now.env_prefixes))
      if (!recorded.library_env.contains(name))
        lines.push_back("the bundle ran with " + name + " unset; it is now " + value_text(value));
  }
  return lines;
}

std::string recorded_env_prefix(const BackendRecord& recorded) {
  using namespace backend_json;
  std::set<std::string> unset;
  std::map<std::string, std::string> set;
  for (const PluginRecord& p : recorded.plugins)
    for (const auto& [name, value] : p.env) {
      if (value) set[name] = *value;
      else unset.insert(name);
    }
  for (const auto& [name, value] : recorded.library_env) set[name] = *value;
  std::string out = unset.empty() ? "" : "env";
  for (const std::string& name : unset) out += " -u " + name;
  for (const auto& [name, value] : set) out += (out.empty() ? "" : " ") + name + "=" + shell_word(value);
  return out.empty() ? out : out + " ";
}

}  // namespace dpcheck
