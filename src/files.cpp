#include "src/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "src/error.hpp"

namespace dpcheck {

namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path, int err) {
  throw Error(what + " " + path.string() + ": " + std::strerror(err));
}

std::filesystem::path parent_or_dot(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

}  // namespace

void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path) {
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

void write_file_atomic(const std::filesystem::path& path, const std::function<void(int fd)>& write) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path dir = parent_or_dot(path);
  const std::filesystem::path tmp =
      dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", tmp, errno);
  try {
    write(fd);
    if (::fsync(fd) != 0) fail("cannot fsync", tmp, errno);
    if (::close(fd) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      fail("cannot close", tmp, err);
    }
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename to", path, err);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("cannot open directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) fail("cannot fsync directory", dir, err);
}

void write_file_atomic(const std::filesystem::path& path, std::string_view contents) {
  write_file_atomic(path, [&](int fd) { write_all(fd, contents.data(), contents.size(), path); });
}

void check_writable(const std::filesystem::path& path) {
  const std::filesystem::path dir = parent_or_dot(path);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw UsageError("cannot write " + path.string() + ": directory " + dir.string() + " does not exist");
  if (std::filesystem::is_directory(path, ec)) throw UsageError("cannot write " + path.string() + ": it is a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw UsageError("cannot write " + path.string() + ": " + std::strerror(errno));
}

}  // namespace dpcheck
