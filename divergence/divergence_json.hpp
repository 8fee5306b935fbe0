// Reading back what the divergence tools wrote (internal to divergence/: divergence.cpp, bundle.cpp,
// drift.cpp): a manifest's fields, each refusal naming the field ("\"failure.step\" is missing"), and a
// whole file as text or JSON. Named rather than anonymous, so that a unity build that joins the files
// holds one copy; backend_record.cpp keeps its own (backend_json), whose refusals also name a field that
// is not an object.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace dpcheck::divergence_json {

[[noreturn]] void bad_field(const std::string& what, const std::string& why);
const nlohmann::json& field(const nlohmann::json& j, const std::string& key, const std::string& where);
std::string text_field(const nlohmann::json& j, const std::string& key, const std::string& where);
std::int64_t int_field(const nlohmann::json& j, const std::string& key, const std::string& where, std::int64_t lo,
                       std::int64_t hi);
bool bool_field(const nlohmann::json& j, const std::string& key, const std::string& where);
// The largest step a manifest may name.
inline constexpr std::int64_t kMaxStep = std::int64_t{1} << 53;
// A file's bytes; UsageError "cannot read <path>".
std::string read_text(const std::filesystem::path& p);
// A file parsed as JSON; UsageError naming the file when it is too deep or not JSON.
nlohmann::json parse_json_file(const std::filesystem::path& p);

}  // namespace dpcheck::divergence_json
