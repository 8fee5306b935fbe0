// Planted writes (see src/audit/planted.hpp): the kinds, the plan's text form, and the calls themselves.
#include "src/audit/planted.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>

#include "src/error.hpp"

namespace dpcheck::audit {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 4> kOpen{"open", "open64", "__open_2", "__open64_2"};
constexpr std::array<std::string_view, 4> kOpenat{"openat", "openat64", "__openat_2", "__openat64_2"};

// Every kind of write the audit claims to see (audit_preload.cpp), and reads it must not report.
constexpr PlantKind kKinds[] = {
    {"open-create", "create: open(O_WRONLY|O_CREAT|O_EXCL)", true, false, kOpen, "O_CREAT"},
    {"open-truncate", "truncate: open(O_WRONLY|O_TRUNC) of an existing file", true, true, kOpen, "O_TRUNC"},
    {"open-append", "append: open(O_WRONLY|O_APPEND) of an existing file, one byte written", true, true, kOpen,
     "O_APPEND"},
    {"open-rdwr",
     "in-place rewrite: open(O_RDWR) of an existing file, no create, truncate or append, one byte "
     "written",
     true, true, kOpen, "O_RDWR"},
    {"openat-create", "create: openat(O_WRONLY|O_CREAT|O_TRUNC)", true, false, kOpenat, "O_CREAT"},
    {"openat-rdwr", "in-place rewrite: openat(O_RDWR) of an existing file, one byte written", true, true, kOpenat,
     "O_RDWR"},
    {"creat", "create: creat()", true, false, {"creat", "creat64"}, "O_CREAT"},
    {"truncate", "truncate(path, 0) of an existing file", true, true, {"truncate", "truncate64"}, "length=0"},
    {"rename", "rename() of an existing file", true, true, {"rename"}, ""},
    {"renameat", "renameat() of an existing file", true, true, {"renameat"}, ""},
    {"unlink", "unlink() of an existing file", true, true, {"unlink"}, ""},
    {"remove", "remove() of an existing file", true, true, {"remove"}, ""},
    {"link", "link() of an existing file to a new name", true, true, {"link"}, ""},
    {"symlink", "symlink() at a new name", true, false, {"symlink"}, ""},
    {"mkdir", "mkdir()", true, false, {"mkdir"}, ""},
    {"mmap-shared", "mmap(PROT_WRITE, MAP_SHARED) of an existing file opened O_RDWR, one byte stored and synced", true,
     true, kOpen, "O_RDWR"},
    {"fopen-w", "fopen(\"w\")", true, false, {"fopen", "fopen64"}, "w"},
    {"fopen-a", "fopen(\"a\")", true, false, {"fopen", "fopen64"}, "a"},
    {"fopen-r+", "fopen(\"r+\") of an existing file, one byte written", true, true, {"fopen", "fopen64"}, "r+"},
    {"fopen-w+", "fopen(\"w+\") of an existing file", true, true, {"fopen", "fopen64"}, "w+"},
    {"fopen-a+", "fopen(\"a+\") of an existing file, one byte written", true, true, {"fopen", "fopen64"}, "a+"},
    {"read-open", "read-only open(O_RDONLY)", false, true, kOpen, ""},
    {"read-openat", "read-only openat(O_RDONLY)", false, true, kOpenat, ""},
    {"read-fopen", "read-only fopen(\"r\")", false, true, {"fopen", "fopen64"}, ""},
    {"read-mmap-private",
     "mmap(PROT_READ|PROT_WRITE, MAP_PRIVATE) of a file opened O_RDONLY, its private copy "
     "changed",
     false, true, kOpen, ""},
};

// What every prepared file holds: mmap needs bytes to map, a read something to read.
constexpr std::string_view kContent = "planted\n";

[[noreturn]] void fail(const Plant& p, const std::string& what) {
  throw Error("planted " + p.kind + " of " + p.name + " on rank " + std::to_string(p.rank) + ": " + what + ": " +
              std::strerror(errno));
}

void check(bool ok, const Plant& p, const std::string& what) {
  if (!ok) fail(p, what);
}

void write_one_byte(int fd, const Plant& p) { check(::pwrite(fd, "X", 1, 0) == 1, p, "write"); }

// Makes one plant's call, and whatever the call is for (a byte written, a map stored).
void make_one(const fs::path& dir, const Plant& p) {
  const fs::path abs = plant_path(dir, p);
  const std::string path = p.relative ? p.name : abs.string();
  const char* c = path.c_str();
  const std::string& k = p.kind;
  // The *at calls name the file relative to the working directory (the planted directory), or to a
  // descriptor of the planted directory.
  const bool at_call = k == "openat-create" || k == "openat-rdwr" || k == "read-openat" || k == "renameat";
  int dirfd = AT_FDCWD;
  if (at_call && !p.relative) {
    dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    check(dirfd >= 0, p, "open the planted directory");
  }
  const char* at = p.name.c_str();
  const std::string to = path + "~";  // rename's and link's second name
  int fd = -1;
  if (k == "open-create") {
    check((fd = ::open(c, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) >= 0, p, "open");
  } else if (k == "open-truncate") {
    check((fd = ::open(c, O_WRONLY | O_TRUNC | O_CLOEXEC)) >= 0, p, "open");
  } else if (k == "open-append") {
    check((fd = ::open(c, O_WRONLY | O_APPEND | O_CLOEXEC)) >= 0, p, "open");
    check(::write(fd, "X", 1) == 1, p, "write");
  } else if (k == "open-rdwr") {
    check((fd = ::open(c, O_RDWR | O_CLOEXEC)) >= 0, p, "open");
    write_one_byte(fd, p);
  } else if (k == "openat-create") {
    check((fd = ::openat(dirfd, at, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) >= 0, p, "openat");
  } else if (k == "openat-rdwr") {
    check((fd = ::openat(dirfd, at, O_RDWR | O_CLOEXEC)) >= 0, p, "openat");
    write_one_byte(fd, p);
  } else if (k == "creat") {
    check((fd = ::creat(c, 0644)) >= 0, p, "creat");
  } else if (k == "truncate") {
    check(::truncate(c, 0) == 0, p, "truncate");
  } else if (k == "rename") {
    check(::rename(c, to.c_str()) == 0, p, "rename");
  } else if (k == "renameat") {
    const std::string at_to = std::string(at) + "~";
    check(::renameat(dirfd, at, dirfd, at_to.c_str()) == 0, p, "renameat");
  } else if (k == "unlink") {
    check(::unlink(c) == 0, p, "unlink");
  } else if (k == "remove") {
    check(::remove(c) == 0, p, "remove");
  } else if (k == "link") {
    check(::link(c, to.c_str()) == 0, p, "link");
  } else if (k == "symlink") {
    check(::symlink("planted-target", c) == 0, p, "symlink");
  } else if (k == "mkdir") {
    check(::mkdir(c, 0755) == 0, p, "mkdir");
  } else if (k == "mmap-shared" || k == "read-mmap-private") {
    const bool shared = k == "mmap-shared";
    check((fd = ::open(c, (shared ? O_RDWR : O_RDONLY) | O_CLOEXEC)) >= 0, p, "open");
    void* m = ::mmap(nullptr, kContent.size(), PROT_READ | PROT_WRITE, shared ? MAP_SHARED : MAP_PRIVATE, fd, 0);
    check(m != MAP_FAILED, p, "mmap");
    static_cast<char*>(m)[0] = 'X';
    const bool synced = !shared || ::msync(m, kContent.size(), MS_SYNC) == 0;
    ::munmap(m, kContent.size());
    check(synced, p, "msync");
  } else if (k.starts_with("fopen-") || k == "read-fopen") {
    const std::string mode = k == "read-fopen" ? "r" : k.substr(6);
    FILE* f = std::fopen(c, mode.c_str());
    check(f != nullptr, p, "fopen");
    const bool ok = mode == "r" ? std::fgetc(f) != EOF : std::fputc('X', f) != EOF;
    check(std::fclose(f) == 0 && ok, p, mode == "r" ? "read" : "write");
  } else if (k == "read-open") {
    check((fd = ::open(c, O_RDONLY | O_CLOEXEC)) >= 0, p, "open");
  } else if (k == "read-openat") {
    check((fd = ::openat(dirfd, at, O_RDONLY | O_CLOEXEC)) >= 0, p, "openat");
  } else {
    throw Error("planted write of unknown kind " + k);
  }
  if (k.starts_with("read-") && fd >= 0) {
    char byte;
    check(::read(fd, &byte, 1) == 1, p, "read");
  }
  if (fd >= 0) ::close(fd);
  if (dirfd != AT_FDCWD) ::close(dirfd);
}

}  // namespace

std::span<const PlantKind> plant_kinds() { return kKinds; }

const PlantKind* find_plant_kind(std::string_view name) {
  for (const PlantKind& k : kKinds)
    if (k.name == name) return &k;
  return nullptr;
}

std::string plant_text(const Plant& plant) {
  return std::to_string(plant.rank) + ":" + plant.kind + ":" + (plant.relative ? "rel" : "abs") + ":" + plant.name;
}

Plant parse_plant(std::string_view text) {
  const std::string arg = "--plant " + std::string(text);
  const std::size_t a = text.find(':'), b = a == std::string_view::npos ? a : text.find(':', a + 1),
                    c = b == std::string_view::npos ? b : text.find(':', b + 1);
  if (c == std::string_view::npos) throw UsageError(arg + ": not RANK:KIND:abs|rel:NAME");
  Plant p;
  const std::string_view rank = text.substr(0, a);
  const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), p.rank);
  if (ec != std::errc() || end != rank.data() + rank.size() || p.rank < 0)
    throw UsageError(arg + ": the rank '" + std::string(rank) + "' is not a number of 0 or more");
  p.kind = std::string(text.substr(a + 1, b - a - 1));
  if (find_plant_kind(p.kind) == nullptr) {
    std::string names;
    for (const PlantKind& k : kKinds) names += (names.empty() ? "" : ", ") + std::string(k.name);
    throw UsageError(arg + ": unknown kind '" + p.kind + "' (known: " + names + ")");
  }
  const std::string_view how = text.substr(b + 1, c - b - 1);
  if (how != "abs" && how != "rel") throw UsageError(arg + ": '" + std::string(how) + "' is neither abs nor rel");
  p.relative = how == "rel";
  p.name = std::string(text.substr(c + 1));
  const fs::path name(p.name);
  bool escapes = false;
  for (const fs::path& part : name) escapes |= part == "..";
  if (p.name.empty() || name.is_absolute() || escapes || p.name.back() == '/')
    throw UsageError(arg + ": the name must be a file's path inside the planted directory, without '..'");
  return p;
}

fs::path plant_path(const fs::path& dir, const Plant& plant) { return (dir / plant.name).lexically_normal(); }

void prepare_plants(const fs::path& dir, std::span<const Plant> plants) {
  std::ofstream(dir / plant_marker) << "files below this directory are written on purpose by dpcheck plant-writes\n";
  for (const Plant& p : plants) {
    const fs::path path = plant_path(dir, p);
    fs::create_directories(path.parent_path());
    const PlantKind* kind = find_plant_kind(p.kind);
    if (kind == nullptr || !kind->needs_file) continue;
    std::ofstream f(path, std::ios::binary);
    f << kContent;
    if (!f.flush()) throw Error("cannot prepare the planted file " + path.string());
  }
}

void make_plants(const fs::path& dir, std::span<const Plant> plants, int rank) {
  std::error_code ec;
  if (!dir.is_absolute() || !fs::is_regular_file(dir / plant_marker, ec))
    throw UsageError("--dir " + dir.string() + ": not a directory prepared for planted writes (no " +
                     std::string(plant_marker) + " in it)");
  // Relative names are relative to the planted directory; the caller's working directory is restored
  // however the calls end.
  const int cwd = ::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0 || ::chdir(dir.c_str()) != 0) {
    const int err = errno;
    if (cwd >= 0) ::close(cwd);
    throw Error("cannot change to the planted directory " + dir.string() + ": " + std::strerror(err));
  }
  struct Restore {
    int fd;
    ~Restore() {
      [[maybe_unused]] const int r = ::fchdir(fd);
      ::close(fd);
    }
  } restore{cwd};
  for (const Plant& p : plants)
    if (p.rank == rank) make_one(dir, p);
}

}  // namespace dpcheck::audit
