// What the checkpoint writer (writer.cpp) and the format's reader (checkpoint_format.cpp) share,
// internal to src/train/: the format's name and version as a manifest states them, the manifest's
// file name, a refusal, and the checkpoints in a directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace dpcheck::checkpoint_files {

inline constexpr const char* kFormat = "dpcheck-checkpoint";
inline constexpr int kVersion = 1;
inline constexpr const char* kManifest = "manifest.json";

// A UsageError whose text is the reason: caught where the checkpoint is named, so that each skipped
// candidate is reported as "step-00000012: <reason>".
[[noreturn]] void refuse(const std::string& reason);

// Every entry named like a checkpoint, of whatever type (the reader says why a non-directory is
// unusable), newest first.
std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoints_in(const std::filesystem::path& dir);

}  // namespace dpcheck::checkpoint_files
