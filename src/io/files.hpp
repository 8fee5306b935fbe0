// Writing files so that a reader never sees half of one, and the open-file and directory plumbing that
// goes with it. write_file_atomic is the one way dpcheck replaces a file (reports, .npy tensors,
// checkpoint manifests): a temporary file beside the target, fsync, rename over the target, fsync of
// the directory so the rename itself is durable. A failure removes the temporary file and throws
// Error naming the path and the system's reason; a file that was there before is left as it was.
//
// Output paths are checked before any work starts (check_output_path, check_output_dir), so that a bad
// one costs a second, not a whole run, and nothing that is not a regular file is ever replaced: a
// symbolic link is written through to its target (the link stays, as with NumPy's np.save or a shell's
// redirection), and a device, FIFO, socket or directory is refused.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace dpcheck {

// The mode of every file dpcheck creates (before the umask): readable by all, writable by the owner,
// whatever umask the user runs under -- outputs are shared for reading, never for writing.
inline constexpr unsigned new_file_mode = 0644;

// An open file descriptor, closed when it goes out of scope.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.release()) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    reset(other.release());
    return *this;
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }

  int get() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) noexcept;
  // Closes now and returns close(2)'s result (errno set on failure), so that the caller sees its
  // error: NFS reports failed writes there.
  int close() noexcept;

 private:
  int fd_ = -1;
};

// Calls write(fd) to fill the temporary file, then commits it as the file `path` names: through
// symbolic links, to their final target. UsageError when `path` has no file name, or its target is a
// device, FIFO or socket (rename would replace it); a directory is refused by rename(2) itself (Error,
// EISDIR). The new file has new_file_mode. The temporary file, ".<name>.tmp.<pid>.<n>" beside the
// target, never outlives the call.
void write_file_atomic(const std::filesystem::path& path, const std::function<void(int fd)>& write);
void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// fsyncs the directory `dir`, so that the entries created, renamed or removed in it survive a crash.
// Throws Error when it cannot be opened or synced (write_file_atomic says why that is an error).
void sync_directory(const std::filesystem::path& dir);

// write(2) until everything is written; throws Error naming `path` on failure.
void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path);

// The file `path` names once symbolic links are followed (at most 40, as the kernel does), whether or
// not it exists; `path` itself when it is not a link. UsageError for a loop, naming `option` ("--trace")
// before the path when given.
std::filesystem::path resolve_links(const std::filesystem::path& path, std::string_view option = {});

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

// Checks that `path` names an input dpcheck can read whole: it exists and (links followed) is a regular
// file -- a device such as /dev/zero never ends, a FIFO blocks until someone writes. Throws UsageError
// "<what>: no such file", "<what> is a FIFO, not a regular file", ... where `what` names the option
// and the path ("--trace-a /dev/zero").
void check_input_file(const std::filesystem::path& path, std::string_view what);

// Throws UsageError when the output `out` (an existing file, links followed) is the very file an input
// names -- compared by device and inode, so also through symbolic and hard links: writing it would
// replace what the run reads. `out_option` and `in_option` name the two ("--trace", "--x").
void check_not_an_input(const std::filesystem::path& out, std::string_view out_option, const std::filesystem::path& in,
                        std::string_view in_option);

// The checks of check_output_path that touch nothing (no trial file), so that every rank may run them.
void check_writable(const std::filesystem::path& path);

}  // namespace dpcheck
