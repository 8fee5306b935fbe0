// The write-audit library's own file access and the paths it records (audit_preload.cpp): raw system
// calls, so that its own opens and writes never show up as writes of the program, and a call's path
// made absolute against its directory descriptor or the working directory, "." and ".." taken
// lexically. No heap, no exceptions.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "src/audit/preload_text.hpp"

namespace dpcheck::audit_preload {

// ---- raw system calls for the library's own use ------------------------------------------------------

inline long raw_open(const char* path, int flags, unsigned mode) noexcept {
  return ::syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}
inline void raw_close(long fd) noexcept { ::syscall(SYS_close, fd); }
inline long raw_write(long fd, const void* data, std::size_t size) noexcept {
  long n;
  do n = ::syscall(SYS_write, fd, data, size);
  while (n < 0 && errno == EINTR);
  return n;
}
// Length of the link's text (not terminated), or -1.
inline long raw_readlink(const char* path, char* out, std::size_t cap) noexcept {
  return ::syscall(SYS_readlinkat, AT_FDCWD, path, out, cap);
}

// ---- paths ------------------------------------------------------------------------------------------

// The work buffer for one path: the kernel's own limit, so any single path argument fits.
constexpr std::size_t path_cap = PATH_MAX;

// Collapses "//", "." and ".." of an absolute path in place, without looking at the file system: the
// recorded path is the one the program named, and following symbolic links would report where they
// point instead. ".." is taken lexically, as std::filesystem::path::lexically_normal does.
inline void normalize(char* p) noexcept {
  if (p[0] != '/') return;
  // p[0, out) is the normalized part ("/" or "/a/b"); it never grows past what has been read.
  std::size_t out = 1;
  std::size_t in = 0;
  while (p[in] != '\0') {
    while (p[in] == '/') ++in;
    if (p[in] == '\0') break;
    std::size_t end = in;
    while (p[end] != '\0' && p[end] != '/') ++end;
    const std::size_t n = end - in;
    if (n == 2 && p[in] == '.' && p[in + 1] == '.') {
      while (out > 1 && p[out - 1] != '/') --out;
      if (out > 1) --out;
    } else if (!(n == 1 && p[in] == '.')) {
      if (out > 1) p[out++] = '/';
      for (std::size_t i = 0; i < n; ++i) p[out++] = p[in + i];
    }
    in = end;
  }
  p[out] = '\0';
}

// Writes the absolute form of `path` (relative to the directory `dirfd`, or the working directory)
// into out[path_cap]. The base comes from the kernel (getcwd, /proc/self/fd), so it has no symbolic
// links of its own; if it cannot be found the path stays relative and is never taken as allowed.
// Returns false if the result was cut to fit.
inline bool absolute_path(int dirfd, const char* path, char* out) noexcept {
  if (path == nullptr) {
    ::strcpy(out, "(null)");
    return true;
  }
  Text t(out, path_cap);
  if (path[0] != '/') {
    long n = -1;
    if (dirfd == AT_FDCWD) {
      // The raw getcwd returns the length including the terminating zero; a directory that is no
      // longer reachable comes back as "(unreachable)/...", which stays relative.
      n = ::syscall(SYS_getcwd, out, path_cap);
      n = n > 0 ? n - 1 : -1;
    } else {
      char fd_link[40];
      Text l(fd_link, sizeof fd_link);
      l.put("/proc/self/fd/");
      l.number(dirfd);
      n = raw_readlink(l.c_str(), out, path_cap - 1);
    }
    if (n >= 0) {
      t.assume(static_cast<std::size_t>(n));
    } else if (dirfd == AT_FDCWD) {
      t.put("(cwd unknown)");
    } else {
      t.put("(fd ");
      t.number(dirfd);
      t.put(')');
    }
    if (path[0] != '\0') {
      t.put('/');
      t.put(path);
    }
  } else {
    t.put(path);
  }
  const bool whole = !t.full();
  t.c_str();
  normalize(out);
  return whole;
}

}  // namespace dpcheck::audit_preload
