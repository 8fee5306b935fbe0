#include "src/io/files.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "src/error.hpp"

namespace dpcheck {

namespace {

namespace fs = std::filesystem;

// Linux's own limit on symbolic links followed in one path lookup (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

std::atomic<unsigned> g_counter{0};

[[noreturn]] void fail(const std::string& what, const fs::path& path, int err) {
  throw Error(what + " " + path.string() + ": " + std::strerror(err));
}

fs::path parent_or_dot(const fs::path& path) { return path.has_parent_path() ? path.parent_path() : fs::path("."); }

// A name beside `dir`'s other entries that no other process or thread picks at the same time.
fs::path unique_name(const fs::path& dir, const std::string& stem) {
  return dir / ("." + stem + "." + std::to_string(::getpid()) + "." + std::to_string(g_counter++));
}

}  // namespace

std::string file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

namespace {

// "--report r.json", "--report link.json -> /dev/full", or "cannot write r.json" without an option.
std::string subject(const fs::path& path, std::string_view option, const fs::path& target) {
  std::string s = option.empty() ? "cannot write " + path.string() : std::string(option) + " " + path.string();
  if (target != path) s += " -> " + target.string();
  return s;
}

// 0 when a file (or a directory) can be created in dir and was removed again, else the errno.
int try_create_in(const fs::path& dir, bool directory) {
  const fs::path probe = unique_name(dir, "dpcheck-probe");
  if (directory) {
    if (::mkdir(probe.c_str(), 0700) != 0) return errno;
    ::rmdir(probe.c_str());
    return 0;
  }
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return 0;
}

// The directory that will hold target must exist, be a directory, and (with `probe`) take a new entry.
void check_directory_of(const fs::path& target, const std::string& what, bool probe) {
  const fs::path dir = parent_or_dot(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) throw UsageError(what + ": directory " + dir.string() + " does not exist");
    throw UsageError(what + ": directory " + dir.string() + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) throw UsageError(what + ": " + dir.string() + " is not a directory");
  const int err = probe ? try_create_in(dir, false) : (::access(dir.c_str(), W_OK) == 0 ? 0 : errno);
  if (err != 0) throw UsageError(what + ": cannot create a file in " + dir.string() + ": " + std::strerror(err));
}

void check_output_target(const fs::path& path, std::string_view option, OutputMode mode, bool probe) {
  if (path.empty()) throw UsageError(std::string(option.empty() ? "an output path" : option) + " is empty");
  const fs::path target = resolve_links(path, option);
  const std::string what = subject(path, option, target);
  if (!target.has_filename()) throw UsageError(what + ": not a file name");
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (!exists && errno == ENOTDIR) throw UsageError(what + ": a component of the path is not a directory");
  if (!exists && errno != ENOENT) throw UsageError(what + ": " + std::strerror(errno));
  if (exists && !S_ISREG(st.st_mode)) throw UsageError(what + ": " + file_kind(st.st_mode) + ", not a regular file");
  check_directory_of(target, what, probe);
  if (probe && exists) {
    // An immutable or append-only file (chattr +i, +a) cannot be replaced, even by root: found now, not
    // after all the work.
    const int fd = ::open(target.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    int flags = 0;
    if (fd >= 0) {
      const bool known = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
      ::close(fd);
      if (known && (flags & FS_IMMUTABLE_FL) != 0) throw UsageError(what + ": the file is immutable (chattr +i)");
      if (known && (flags & FS_APPEND_FL) != 0 && mode == OutputMode::replace)
        throw UsageError(what + ": the file is append-only (chattr +a), so it cannot be replaced");
    }
  }
  if (probe && exists && mode == OutputMode::append) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw UsageError(what + ": cannot open it for appending: " + std::strerror(errno));
    ::close(fd);
  }
}

}  // namespace

void write_all(int fd, const void* data, std::size_t size, const fs::path& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

fs::path resolve_links(const fs::path& path, std::string_view option) {
  const std::string named = option.empty() ? path.string() : std::string(option) + " " + path.string();
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    if (hops == kMaxLinks) throw UsageError(named + ": too many levels of symbolic links");
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) throw UsageError(named + ": cannot read the symbolic link " + p.string() + ": " + ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
}

void FileDescriptor::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

int FileDescriptor::close() noexcept { return ::close(release()); }

void sync_directory(const fs::path& dir) {
  const FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.is_open()) {
    const int err = errno;
    fail("cannot open directory", dir, err);
  }
  if (::fsync(fd.get()) != 0) {
    const int err = errno;
    fail("cannot fsync directory", dir, err);
  }
}

void write_file_atomic(const fs::path& path, const std::function<void(int fd)>& write) {
  const auto named = [&](const fs::path& p) { return p.has_filename() && p.filename() != "." && p.filename() != ".."; };
  if (!named(path)) throw UsageError(path.string() + ": not a file name");
  // Renaming over a link would replace the link; the file it points to is what the caller means.
  const fs::path target = resolve_links(path);
  if (!named(target)) throw UsageError(subject(path, {}, target) + ": not a file name");
  // rename(2) would silently put a regular file in the place of a device, FIFO or socket. A directory
  // it refuses by itself (EISDIR), so that one costs only the temporary file, which goes again.
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    throw UsageError(subject(path, {}, target) + ": " + file_kind(st.st_mode) + ", not a regular file");
  // "<path>: fsync of <tmp> failed: <errno's text>"; the arguments allocate nothing, so errno is
  // still the failed call's when it is read.
  // The user's path, never the temporary file's name, which means nothing to them.
  const auto failed = [&](const char* step) -> Error {
    const int err = errno;
    return Error(path.string() + ": " + step + ": " + std::strerror(err));
  };

  // Beside the target, so that the rename cannot cross file systems; pid and counter make the name
  // unique across processes and threads, and O_EXCL makes sure of it.
  const fs::path dir = parent_or_dot(target);
  fs::path tmp;
  FileDescriptor fd;
  for (int attempt = 0; !fd.is_open(); ++attempt) {
    tmp = unique_name(dir, target.filename().string() + ".tmp");
    fd.reset(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, new_file_mode));
    if (!fd.is_open() && (errno != EEXIST || attempt >= 100)) throw failed("cannot create a file beside it");
  }
  // From here until the rename succeeds, every way out removes the temporary file.
  struct RemoveUnlessRenamed {
    const fs::path& p;
    bool renamed = false;
    ~RemoveUnlessRenamed() {
      if (!renamed) ::unlink(p.c_str());
    }
  } guard{tmp};
  write(fd.get());
  // Synced before the rename, so that after a crash the target holds the old file or the whole new one.
  if (::fsync(fd.get()) != 0) throw failed("fsync of the new file failed");
  if (fd.close() != 0) throw failed("close of the new file failed");
  if (::rename(tmp.c_str(), target.c_str()) != 0) throw failed("cannot replace it");
  guard.renamed = true;

  // A failed directory fsync is an error, never ignored: the new file is in place, but its name may
  // not survive a crash, and a caller told "written" would go on to rely on it (prune older
  // checkpoints, report success). Throwing is the safe side: the caller says the write failed, and at
  // worst a file that did survive is reported as not durable. The file is not removed: the old one is
  // gone already, and the new one is whole.
  sync_directory(dir);
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  write_file_atomic(path, [&](int fd) { write_all(fd, contents.data(), contents.size(), path); });
}

void check_output_path(const fs::path& path, std::string_view option, OutputMode mode) {
  check_output_target(path, option, mode, /*probe=*/true);
}

void check_input_file(const fs::path& path, std::string_view what) {
  const std::string who(what);
  if (path.empty()) throw UsageError(who + ": empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) throw UsageError(who + ": no such file");
    throw UsageError(who + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) throw UsageError(who + " is " + file_kind(st.st_mode) + ", not a regular file");
}

void check_not_an_input(const fs::path& out, std::string_view out_option, const fs::path& in,
                        std::string_view in_option) {
  if (out.empty() || in.empty()) return;
  struct stat o {
  }, i{};
  if (::stat(out.c_str(), &o) != 0 || ::stat(in.c_str(), &i) != 0) return;
  if (o.st_dev != i.st_dev || o.st_ino != i.st_ino) return;
  throw UsageError(std::string(out_option) + " " + out.string() + " is the same file as " + std::string(in_option) +
                   " " + in.string() + ": writing it would replace an input; give another path");
}

void check_writable(const fs::path& path) { check_output_target(path, {}, OutputMode::replace, /*probe=*/false); }

void check_output_dir(const fs::path& path, std::string_view option) {
  if (path.empty()) throw UsageError(std::string(option) + " is empty");
  const fs::path target = resolve_links(path, option);
  const std::string what = subject(path, option, target);
  struct stat st {};
  // A link to nothing: creating the directory would meet the link itself ("File exists") only once the
  // run wants to write, after all its work.
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0 && errno == ENOENT)
    throw UsageError(what + ": a symbolic link to " + target.string() +
                     ", which does not exist: create that directory, or give another path");
  if (::stat(target.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) throw UsageError(what + ": " + file_kind(st.st_mode) + ", not a directory");
    if (const int err = try_create_in(target, false))
      throw UsageError(what + ": cannot create a file in it: " + std::strerror(err));
    return;
  }
  if (errno == ENOTDIR) throw UsageError(what + ": a component of the path is not a directory");
  if (errno != ENOENT) throw UsageError(what + ": " + std::strerror(errno));
  // Created with its parents when first written: the nearest existing ancestor must take a directory.
  fs::path ancestor = target.lexically_normal().parent_path();
  while (!ancestor.empty() && ::stat(ancestor.c_str(), &st) != 0 && errno == ENOENT &&
         ancestor.parent_path() != ancestor)
    ancestor = ancestor.parent_path();
  if (ancestor.empty()) ancestor = ".";
  if (::stat(ancestor.c_str(), &st) != 0)
    throw UsageError(what + ": " + ancestor.string() + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw UsageError(what + ": " + ancestor.string() + " is " + file_kind(st.st_mode) + ", not a directory");
  if (const int err = try_create_in(ancestor, true))
    throw UsageError(what + ": cannot create a directory in " + ancestor.string() + ": " + std::strerror(err));
}

}  // namespace dpcheck
