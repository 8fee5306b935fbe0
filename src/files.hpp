// Writing files so that a reader never sees half of one: write a temporary file beside the target,
// fsync it, rename it over the target, and fsync the directory so the rename itself is durable.
// A failure removes the temporary file and throws Error naming the path and the system's reason.
//
// Output paths are checked before any work starts (check_output_path, check_output_dir), so that a bad
// one costs a second, not a whole run, and nothing that is not a regular file is ever replaced: a
// symbolic link is written through to its target (the link stays), and a device, FIFO, socket or
// directory is refused.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace dpcheck {

// Calls write(fd) to fill the temporary file, then commits it as the file `path` names: through
// symbolic links, to their final target, which must be a regular file or absent (UsageError otherwise).
void write_file_atomic(const std::filesystem::path& path, const std::function<void(int fd)>& write);
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// write(2) until everything is written; throws Error naming `path` on failure.
void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path);

// The file `path` names once symbolic links are followed (at most 40, as the kernel does), whether or
// not it exists; `path` itself when it is not a link. UsageError for a loop.
std::filesystem::path resolve_links(const std::filesystem::path& path);

// "a regular file", "a directory", "a FIFO", "a symbolic link", "a character device", ... for a (l)stat st_mode.
std::string file_kind(unsigned mode);

// How a command will write an output file: replaced whole (write_file_atomic), or appended to (a log).
enum class OutputMode { replace, append };

// Checks that `path` can take an output file, before any work starts: its target (links followed) is a
// regular file or absent, and the target's directory exists and takes a new file -- tested by creating
// and removing one, since access() says yes to root even where nothing can be created (/proc, a
// read-only mount). For append, an existing target must also open for appending. Throws UsageError
// naming `option` (e.g. "--report"), the path and the reason. Call it on the writing rank only.
void check_output_path(const std::filesystem::path& path, std::string_view option,
                       OutputMode mode = OutputMode::replace);

// As check_output_path for a directory that the command fills (and creates, with its parents, if
// absent): an existing target must be a directory that takes a new file; an absent one needs its
// nearest existing ancestor to be a directory that takes a new directory.
void check_output_dir(const std::filesystem::path& path, std::string_view option);

// The checks of check_output_path that touch nothing (no trial file), so that every rank may run them.
void check_writable(const std::filesystem::path& path);

}  // namespace dpcheck
