// Writing files so that a reader never sees half of one: write a temporary file beside the target,
// fsync it, rename it over the target, and fsync the directory so the rename itself is durable.
// A failure removes the temporary file and throws Error naming the path and the system's reason.
#pragma once

#include <filesystem>
#include <functional>
#include <string_view>

namespace dpcheck {

// Calls write(fd) to fill the temporary file, then commits it as `path`.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(int fd)>& write);
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// write(2) until everything is written; throws Error naming `path` on failure.
void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path);

// Checks that `path` can be created (its directory exists and is writable) before long work starts,
// so bad output paths are reported up front; throws UsageError.
void check_writable(const std::filesystem::path& path);

}  // namespace dpcheck
