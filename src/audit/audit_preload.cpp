// The write-audit library (libdpcheck_audit.so). `dpcheck audit` loads it with LD_PRELOAD into every
// process of an audited run: the launcher, its daemons and the ranks. It interposes the calls that
// create, change, rename or remove files, and appends one JSON line per call to the log named by
// DPCHECK_AUDIT_LOG, with the caller's rank as the launcher's environment gives it. src/audit/audit.hpp
// reads the log and judges it (DESIGN.md, "Rank-0 writes, checked for real").
//
// It runs inside programs it knows nothing about, so it keeps to what is safe anywhere: no exceptions,
// no iostreams, no heap, no locks, no constructor that needs anything but the environment, and only
// raw system calls for its own file operations, so that they never show up as writes of the program.
// A record is written with one write(2) of at most PIPE_BUF bytes to a file opened with O_APPEND, so
// records of concurrent threads and processes never interleave.
//
// Why the log is a path and not an inherited descriptor: Open MPI's mpirun closes every descriptor
// above 2 in the ranks it starts (checked with Open MPI 4.1), so a descriptor passed down from
// `dpcheck audit` never reaches them. Each record therefore opens the log, writes and closes it; a
// cached descriptor could be closed by the program and its number reused for one of the program's
// own files.
//
// What it cannot see: statically linked programs, programs that clear LD_PRELOAD, and writes made by
// system calls issued directly (not through the C library).

// The interposed definitions must be the real entry points, not the fortified inline wrappers or the
// 64-bit renames.
#undef _FORTIFY_SOURCE
#if defined(_FILE_OFFSET_BITS) && _FILE_OFFSET_BITS == 64
#error "audit_preload.cpp must be built without _FILE_OFFSET_BITS=64: it defines both open and open64"
#endif

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdint>

#include "src/audit/preload_paths.hpp"
#include "src/audit/preload_text.hpp"

#define DPCHECK_AUDIT_EXPORT extern "C" __attribute__((visibility("default")))

// The fortified entry points that the compiler calls when _FORTIFY_SOURCE is on in the program; they
// are not declared unless fortification is on here.
extern "C" {
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);
}

namespace dpcheck::audit_preload {
namespace {

// ---- the real functions ---------------------------------------------------------------------------

// Resolved on first use rather than in a constructor, so that a call made before this library's
// constructor has run (by another library's constructor) still works. Two threads resolving at once
// store the same value.
template <typename F> F real(std::atomic<void*>& slot, const char* name) noexcept {
  void* p = slot.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = ::dlsym(RTLD_NEXT, name);
    slot.store(p, std::memory_order_release);
  }
  return reinterpret_cast<F>(p);
}

#define DPCHECK_REAL(name)                             \
  ([]() noexcept {                                     \
    static constinit std::atomic<void*> slot{nullptr}; \
    return real<decltype(&::name)>(slot, #name);       \
  }())

// ---- recursion guard ---------------------------------------------------------------------------------

// One record per call the program makes: an interposed function that another interposed function calls
// (fopen calling open in some C libraries, a library's wrapper around another) is not recorded again.
// initial-exec: this library is loaded at start-up, and the default TLS model may allocate on first
// access in a thread.
__attribute__((tls_model("initial-exec"))) constinit thread_local int depth = 0;

class Guard {
 public:
  Guard() noexcept : outermost_(depth++ == 0) {}
  ~Guard() { --depth; }
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;
  bool outermost() const noexcept { return outermost_; }

 private:
  bool outermost_;
};

// errno is the program's: keep it exactly as the real call left it.
class ErrnoKeeper {
 public:
  ErrnoKeeper() noexcept : saved_(errno) {}
  ~ErrnoKeeper() { errno = saved_; }
  ErrnoKeeper(const ErrnoKeeper&) = delete;
  ErrnoKeeper& operator=(const ErrnoKeeper&) = delete;

 private:
  int saved_;
};

// ---- mutants of the audit's own judgement ---------------------------------------------------------
// The audit is held to a property like every other check (audit_sees_every_write, properties/
// audit_writes.cpp): it plants writes of every kind on ranks other than 0, and each of these bugs, written
// as a contributor might write it, must make that property fail (their rows are in mutants/file_mutants.cpp).
// DPCHECK_AUDIT_MUTANT names one; run_audited (src/audit/audit.hpp) sets it only for a property run
// against that mutant and removes it from every other audited command, so `dpcheck audit` never runs
// one. Set once by the constructor, before the program's threads exist.
enum class Mutant { none, rdwr_not_a_write, fopen_plus_ignored, openat_unrecorded };
constinit Mutant mutant = Mutant::none;

Mutant mutant_from_environment() noexcept {
  const char* m = ::getenv("DPCHECK_AUDIT_MUTANT");
  if (m == nullptr) return Mutant::none;
  if (::strcmp(m, "audit-rdwr-not-a-write") == 0) return Mutant::rdwr_not_a_write;
  if (::strcmp(m, "audit-fopen-plus-ignored") == 0) return Mutant::fopen_plus_ignored;
  if (::strcmp(m, "audit-openat-unrecorded") == 0) return Mutant::openat_unrecorded;
  return Mutant::none;
}

// Whether the mutant drops the records of this call altogether.
bool unrecorded_by_mutant(const char* call) noexcept {
  // The bug: "openat is what the C library calls inside fopen; programs call open", so the interposed
  // openat family passes through unrecorded.
  return mutant == Mutant::openat_unrecorded &&
         (::strncmp(call, "openat", 6) == 0 || ::strncmp(call, "__openat", 8) == 0);
}

bool open_writes(int flags) noexcept {
  // The bug: "O_RDWR without O_CREAT, O_TRUNC or O_APPEND only reads what is there", which misses an
  // in-place rewrite and the descriptor behind a shared writable mmap.
  if (mutant == Mutant::rdwr_not_a_write)
    return (flags & O_ACCMODE) == O_WRONLY || (flags & (O_CREAT | O_TRUNC | O_APPEND)) != 0 ||
           (flags & O_TMPFILE) == O_TMPFILE;
  return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_APPEND)) != 0 ||
         (flags & O_TMPFILE) == O_TMPFILE;
}

bool open_needs_mode(int flags) noexcept { return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE; }

// fopen's mode writes unless it is "r" with no '+' ("r", "rb", "re", "rm", "r,ccs=..." only read).
bool fopen_writes(const char* mode) noexcept {
  if (mode == nullptr || mode[0] != 'r') return true;
  // The bug: a mode that starts with 'r' reads, "r+" included.
  if (mutant == Mutant::fopen_plus_ignored) return false;
  for (const char* m = mode; *m != '\0' && *m != ','; ++m)
    if (*m == '+') return true;
  return false;
}

// ---- the record -------------------------------------------------------------------------------------

// Field budgets (escaped bytes) keep a record, whatever its paths, within PIPE_BUF (4096 on Linux) so
// that one O_APPEND write puts it in the log whole; what does not fit is cut and marked "truncated".
constexpr std::size_t line_cap = PIPE_BUF;
constexpr std::size_t exe_budget = 400;
constexpr std::size_t path_budget = 1400;  // each of path and to
constexpr std::size_t target_budget = 200;
constexpr std::size_t flags_budget = 256;

// What the environment said when the library was loaded, for a program that later clears or rewrites
// its environment (clearenv, a sanitizing wrapper): it must neither stop recording nor lose its rank.
// Written once by the constructor, before the program's threads exist.
constinit char load_log[path_cap] = {};
constinit long load_rank = -1;

// The first launcher variable that holds a decimal number; -1 for none.
long rank_from_environment() noexcept {
  static constexpr const char* vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"};
  for (const char* var : vars) {
    const char* v = ::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    long r = 0;
    bool ok = true;
    for (const char* c = v; *c != '\0'; ++c) {
      if (*c < '0' || *c > '9' || r > 100000000) {
        ok = false;
        break;
      }
      r = r * 10 + (*c - '0');
    }
    if (ok) return r;
  }
  return -1;
}

// Read at every record rather than only at load, so that a forked child that is given its own rank
// is seen with it; the rank at load stands in when the variables are gone.
long current_rank() noexcept {
  const long r = rank_from_environment();
  return r >= 0 ? r : load_rank;
}

// Appends the line to the log; complains once per process on standard error if it cannot, since a
// lost record would let a write go unseen.
void emit(Text& line) noexcept {
  const char* log = load_log[0] != '\0' ? load_log : ::getenv("DPCHECK_AUDIT_LOG");
  if (log == nullptr || *log == '\0') return;
  const long fd = raw_open(log, O_WRONLY | O_APPEND | O_CLOEXEC, 0);
  const long n = fd >= 0 ? raw_write(fd, line.data(), line.size()) : -1;
  if (fd >= 0) raw_close(fd);
  if (n != static_cast<long>(line.size())) {
    static constinit std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      static constexpr char msg[] =
          "dpcheck audit: cannot append to the audit log (DPCHECK_AUDIT_LOG); writes of this process go unrecorded\n";
      raw_write(2, msg, sizeof msg - 1);
    }
  }
}

void put_common(Text& line, const char* event) noexcept {
  line.put("{\"event\":\"");
  line.put(event);
  line.put("\",\"rank\":");
  if (const long rank = current_rank(); rank >= 0) line.number(rank);
  else line.put("null");
  line.put(",\"pid\":");
  line.number(::syscall(SYS_getpid));
  char exe[exe_budget];
  const long n = raw_readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  line.put(",\"exe\":");
  put_json_string(line, exe, exe_budget);
}

// One write-intent call, as the program made it.
struct Call {
  const char* name;
  int dirfd = AT_FDCWD;
  const char* path = nullptr;
  int dirfd2 = AT_FDCWD;
  const char* path2 = nullptr;   // the second path written (rename, link): "to"
  const char* target = nullptr;  // a symbolic link's text: not a path that is written
  const char* flags = nullptr;   // readable flags, or nullptr
  long mode = -1;                // creation mode, or -1
  bool literal = false;          // path is the kernel's name for a descriptor: record it as it is
  bool ok = true;
  int err = 0;
};

void record(const Call& call) noexcept {
  if (unrecorded_by_mutant(call.name)) return;
  char buf[line_cap];
  Text line(buf, sizeof buf);
  put_common(line, "write");
  line.put(",\"call\":\"");
  line.put(call.name);
  line.put('"');

  bool whole = true;
  char work[path_cap];
  if (call.literal) {
    Text t(work, sizeof work);
    t.put(call.path != nullptr ? call.path : "(unknown)");
    whole &= !t.full();
    t.c_str();
  } else {
    whole &= absolute_path(call.dirfd, call.path, work);
  }
  line.put(",\"path\":");
  whole &= put_json_string(line, work, path_budget);
  if (call.path2 != nullptr) {
    whole &= absolute_path(call.dirfd2, call.path2, work);
    line.put(",\"to\":");
    whole &= put_json_string(line, work, path_budget);
  }
  if (call.target != nullptr) {
    line.put(",\"target\":");
    whole &= put_json_string(line, call.target, target_budget);
  }
  line.put(",\"flags\":");
  put_json_string(line, call.flags != nullptr ? call.flags : "", flags_budget);
  if (call.mode >= 0) {
    line.put(",\"mode\":\"");
    line.octal(static_cast<unsigned>(call.mode));
    line.put('"');
  }
  line.put(",\"result\":\"");
  if (call.ok) {
    line.put("ok");
  } else {
    const char* name = ::strerrorname_np(call.err);
    if (name != nullptr) line.put(name);
    else line.number(call.err);
  }
  line.put('"');
  if (!whole) line.put(",\"truncated\":true");
  line.put("}\n");
  if (!line.full()) emit(line);
}

// Records a process when the library is loaded into it, so that the report can count the processes
// that were audited (an audit that saw no process checked nothing) and learn the launcher's session
// directory for this run. Uses only the environment and system calls.
__attribute__((constructor)) void on_load() {
  const char* log = ::getenv("DPCHECK_AUDIT_LOG");
  if (log == nullptr || *log == '\0' || ::strlen(log) >= sizeof load_log) return;
  ::strcpy(load_log, log);
  load_rank = rank_from_environment();
  mutant = mutant_from_environment();
  ErrnoKeeper keep;
  char buf[line_cap];
  Text line(buf, sizeof buf);
  put_common(line, "start");
  line.put(",\"ppid\":");
  line.number(::syscall(SYS_getppid));
  // The launcher's per-job directories, where it and the ranks it starts keep their own files: Open
  // MPI 4's session directory of this mpirun, and the PMIx server's directory for the job.
  static constexpr const char* dir_vars[] = {"OMPI_MCA_orte_jobfam_session_dir", "PMIX_SERVER_TMPDIR"};
  bool first = true;
  for (const char* var : dir_vars) {
    const char* dir = ::getenv(var);
    if (dir == nullptr || dir[0] != '/') continue;
    line.put(first ? ",\"launcher_dirs\":{\"" : ",\"");
    line.put(var);
    line.put("\":");
    put_json_string(line, dir, path_budget);
    first = false;
  }
  if (!first) line.put('}');
  line.put("}\n");
  if (!line.full()) emit(line);
}

// ---- helpers shared by the wrappers -----------------------------------------------------------------

void record_open(const char* name, int dirfd, const char* path, int flags, long mode, bool ok, int err) noexcept {
  char flag_text[256];
  Text t(flag_text, sizeof flag_text);
  put_open_flags(t, flags);
  Call c;
  c.name = name;
  c.dirfd = dirfd;
  c.path = path;
  c.flags = t.c_str();
  c.mode = open_needs_mode(flags) ? mode : -1;
  c.ok = ok;
  c.err = err;
  record(c);
}

// The open family: one body for all of them. `call` performs the real call.
template <typename F>
int audited_open(const char* name, int dirfd, const char* path, int flags, mode_t mode, F&& call) noexcept {
  Guard guard;
  const int fd = call();
  if (guard.outermost() && open_writes(flags)) {
    ErrnoKeeper keep;
    const int err = errno;
    record_open(name, dirfd, path, flags, static_cast<long>(mode), fd >= 0, err);
  }
  return fd;
}

// Everything else that is always a write: records after the call, with its outcome.
template <typename F> int audited(Call c, F&& call) noexcept {
  Guard guard;
  const int r = call();
  if (guard.outermost()) {
    ErrnoKeeper keep;
    c.ok = r == 0;
    c.err = errno;
    record(c);
  }
  return r;
}

template <typename F> FILE* audited_fopen(const char* name, const char* path, const char* path_of_stream,
                                          const char* mode, F&& call) noexcept {
  Guard guard;
  FILE* f = call();
  if (guard.outermost() && fopen_writes(mode)) {
    ErrnoKeeper keep;
    Call c;
    c.name = name;
    c.path = path != nullptr ? path : path_of_stream;
    // The kernel's name of the stream's descriptor is already absolute, or names no file ("pipe:[7]").
    c.literal = path == nullptr;
    c.flags = mode != nullptr ? mode : "(null)";
    c.ok = f != nullptr;
    c.err = errno;
    record(c);
  }
  return f;
}

mode_t variadic_mode(int flags, va_list ap) noexcept {
  return open_needs_mode(flags) ? static_cast<mode_t>(va_arg(ap, unsigned)) : 0;
}

void put_at_flags(Text& t, int flags, const Flag* names, std::size_t count) noexcept {
  bool first = true;
  for (std::size_t i = 0; i < count; ++i) {
    if ((flags & names[i].bits) != 0) {
      if (!first) t.put('|');
      t.put(names[i].name);
      flags &= ~names[i].bits;
      first = false;
    }
  }
  if (flags != 0) {
    if (!first) t.put('|');
    t.hex(static_cast<unsigned>(flags));
  }
}

// A failed real lookup (a symbol this C library lacks) fails the call the way a missing kernel call
// does.
#define DPCHECK_CALL_REAL(fn, fail_value, ...) \
  [&]() noexcept {                             \
    const auto f = DPCHECK_REAL(fn);           \
    if (f == nullptr) {                        \
      errno = ENOSYS;                          \
      return fail_value;                       \
    }                                          \
    return f(__VA_ARGS__);                     \
  }

}  // namespace
}  // namespace dpcheck::audit_preload

using namespace dpcheck::audit_preload;

// ---- open family ----------------------------------------------------------------------------------------

DPCHECK_AUDIT_EXPORT int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = variadic_mode(flags, ap);
  va_end(ap);
  return audited_open("open", AT_FDCWD, path, flags, mode, DPCHECK_CALL_REAL(open, -1, path, flags, mode));
}

DPCHECK_AUDIT_EXPORT int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = variadic_mode(flags, ap);
  va_end(ap);
  return audited_open("open64", AT_FDCWD, path, flags, mode, DPCHECK_CALL_REAL(open64, -1, path, flags, mode));
}

DPCHECK_AUDIT_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = variadic_mode(flags, ap);
  va_end(ap);
  return audited_open("openat", dirfd, path, flags, mode, DPCHECK_CALL_REAL(openat, -1, dirfd, path, flags, mode));
}

DPCHECK_AUDIT_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = variadic_mode(flags, ap);
  va_end(ap);
  return audited_open("openat64", dirfd, path, flags, mode, DPCHECK_CALL_REAL(openat64, -1, dirfd, path, flags, mode));
}

DPCHECK_AUDIT_EXPORT int creat(const char* path, mode_t mode) {
  return audited_open("creat", AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode,
                      DPCHECK_CALL_REAL(creat, -1, path, mode));
}

DPCHECK_AUDIT_EXPORT int creat64(const char* path, mode_t mode) {
  return audited_open("creat64", AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode,
                      DPCHECK_CALL_REAL(creat64, -1, path, mode));
}

DPCHECK_AUDIT_EXPORT int __open_2(const char* path, int flags) {
  return audited_open("__open_2", AT_FDCWD, path, flags, 0, DPCHECK_CALL_REAL(__open_2, -1, path, flags));
}

DPCHECK_AUDIT_EXPORT int __open64_2(const char* path, int flags) {
  return audited_open("__open64_2", AT_FDCWD, path, flags, 0, DPCHECK_CALL_REAL(__open64_2, -1, path, flags));
}

DPCHECK_AUDIT_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
  return audited_open("__openat_2", dirfd, path, flags, 0, DPCHECK_CALL_REAL(__openat_2, -1, dirfd, path, flags));
}

DPCHECK_AUDIT_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
  return audited_open("__openat64_2", dirfd, path, flags, 0, DPCHECK_CALL_REAL(__openat64_2, -1, dirfd, path, flags));
}

// ---- stdio ------------------------------------------------------------------------------------------------

DPCHECK_AUDIT_EXPORT FILE* fopen(const char* path, const char* mode) {
  return audited_fopen("fopen", path, nullptr, mode, DPCHECK_CALL_REAL(fopen, static_cast<FILE*>(nullptr), path, mode));
}

DPCHECK_AUDIT_EXPORT FILE* fopen64(const char* path, const char* mode) {
  return audited_fopen("fopen64", path, nullptr, mode,
                       DPCHECK_CALL_REAL(fopen64, static_cast<FILE*>(nullptr), path, mode));
}

namespace dpcheck::audit_preload {
namespace {
// freopen(NULL, mode, stream) reopens the stream's own file: name it from the descriptor before the
// call closes it.
const char* stream_path(const char* path, const char* mode, FILE* stream, char* out, std::size_t cap) noexcept {
  if (path != nullptr || stream == nullptr || !fopen_writes(mode)) return nullptr;
  const int fd = ::fileno(stream);
  if (fd < 0) return nullptr;
  char fd_link[40];
  Text l(fd_link, sizeof fd_link);
  l.put("/proc/self/fd/");
  l.number(fd);
  const long n = raw_readlink(l.c_str(), out, cap - 1);
  if (n < 0) return nullptr;
  out[n] = '\0';
  return out;
}
}  // namespace
}  // namespace dpcheck::audit_preload

DPCHECK_AUDIT_EXPORT FILE* freopen(const char* path, const char* mode, FILE* stream) {
  char own[path_cap];
  const char* named = stream_path(path, mode, stream, own, sizeof own);
  return audited_fopen("freopen", path, named, mode,
                       DPCHECK_CALL_REAL(freopen, static_cast<FILE*>(nullptr), path, mode, stream));
}

DPCHECK_AUDIT_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
  char own[path_cap];
  const char* named = stream_path(path, mode, stream, own, sizeof own);
  return audited_fopen("freopen64", path, named, mode,
                       DPCHECK_CALL_REAL(freopen64, static_cast<FILE*>(nullptr), path, mode, stream));
}

// ---- names: rename, link, symlink, unlink, remove -------------------------------------------------------

DPCHECK_AUDIT_EXPORT int rename(const char* from, const char* to) noexcept {
  Call c;
  c.name = "rename";
  c.path = from;
  c.path2 = to;
  return audited(c, DPCHECK_CALL_REAL(rename, -1, from, to));
}

DPCHECK_AUDIT_EXPORT int renameat(int fromfd, const char* from, int tofd, const char* to) noexcept {
  Call c;
  c.name = "renameat";
  c.dirfd = fromfd;
  c.path = from;
  c.dirfd2 = tofd;
  c.path2 = to;
  return audited(c, DPCHECK_CALL_REAL(renameat, -1, fromfd, from, tofd, to));
}

DPCHECK_AUDIT_EXPORT int renameat2(int fromfd, const char* from, int tofd, const char* to, unsigned flags) noexcept {
  static constexpr Flag names[] = {{RENAME_NOREPLACE, "RENAME_NOREPLACE"},
                                   {RENAME_EXCHANGE, "RENAME_EXCHANGE"},
                                   {RENAME_WHITEOUT, "RENAME_WHITEOUT"}};
  char flag_text[128];
  Text t(flag_text, sizeof flag_text);
  put_at_flags(t, static_cast<int>(flags), names, sizeof names / sizeof names[0]);
  Call c;
  c.name = "renameat2";
  c.dirfd = fromfd;
  c.path = from;
  c.dirfd2 = tofd;
  c.path2 = to;
  c.flags = t.c_str();
  return audited(c, DPCHECK_CALL_REAL(renameat2, -1, fromfd, from, tofd, to, flags));
}

DPCHECK_AUDIT_EXPORT int link(const char* from, const char* to) noexcept {
  Call c;
  c.name = "link";
  c.path = from;
  c.path2 = to;
  return audited(c, DPCHECK_CALL_REAL(link, -1, from, to));
}

DPCHECK_AUDIT_EXPORT int linkat(int fromfd, const char* from, int tofd, const char* to, int flags) noexcept {
  static constexpr Flag names[] = {{AT_SYMLINK_FOLLOW, "AT_SYMLINK_FOLLOW"}, {AT_EMPTY_PATH, "AT_EMPTY_PATH"}};
  char flag_text[128];
  Text t(flag_text, sizeof flag_text);
  put_at_flags(t, flags, names, sizeof names / sizeof names[0]);
  Call c;
  c.name = "linkat";
  c.dirfd = fromfd;
  c.path = from;
  c.dirfd2 = tofd;
  c.path2 = to;
  c.flags = t.c_str();
  return audited(c, DPCHECK_CALL_REAL(linkat, -1, fromfd, from, tofd, to, flags));
}

DPCHECK_AUDIT_EXPORT int symlink(const char* target, const char* path) noexcept {
  Call c;
  c.name = "symlink";
  c.path = path;
  c.target = target;
  return audited(c, DPCHECK_CALL_REAL(symlink, -1, target, path));
}

DPCHECK_AUDIT_EXPORT int symlinkat(const char* target, int dirfd, const char* path) noexcept {
  Call c;
  c.name = "symlinkat";
  c.dirfd = dirfd;
  c.path = path;
  c.target = target;
  return audited(c, DPCHECK_CALL_REAL(symlinkat, -1, target, dirfd, path));
}

DPCHECK_AUDIT_EXPORT int unlink(const char* path) noexcept {
  Call c;
  c.name = "unlink";
  c.path = path;
  return audited(c, DPCHECK_CALL_REAL(unlink, -1, path));
}

DPCHECK_AUDIT_EXPORT int unlinkat(int dirfd, const char* path, int flags) noexcept {
  static constexpr Flag names[] = {{AT_REMOVEDIR, "AT_REMOVEDIR"}};
  char flag_text[64];
  Text t(flag_text, sizeof flag_text);
  put_at_flags(t, flags, names, 1);
  Call c;
  c.name = "unlinkat";
  c.dirfd = dirfd;
  c.path = path;
  c.flags = t.c_str();
  return audited(c, DPCHECK_CALL_REAL(unlinkat, -1, dirfd, path, flags));
}

// The C library's remove() unlinks through internal calls that the interposed unlink never sees.
DPCHECK_AUDIT_EXPORT int remove(const char* path) noexcept {
  Call c;
  c.name = "remove";
  c.path = path;
  return audited(c, DPCHECK_CALL_REAL(remove, -1, path));
}

// ---- directories and sizes --------------------------------------------------------------------------------

DPCHECK_AUDIT_EXPORT int mkdir(const char* path, mode_t mode) noexcept {
  Call c;
  c.name = "mkdir";
  c.path = path;
  c.mode = static_cast<long>(mode);
  return audited(c, DPCHECK_CALL_REAL(mkdir, -1, path, mode));
}

DPCHECK_AUDIT_EXPORT int mkdirat(int dirfd, const char* path, mode_t mode) noexcept {
  Call c;
  c.name = "mkdirat";
  c.dirfd = dirfd;
  c.path = path;
  c.mode = static_cast<long>(mode);
  return audited(c, DPCHECK_CALL_REAL(mkdirat, -1, dirfd, path, mode));
}

DPCHECK_AUDIT_EXPORT int rmdir(const char* path) noexcept {
  Call c;
  c.name = "rmdir";
  c.path = path;
  return audited(c, DPCHECK_CALL_REAL(rmdir, -1, path));
}

namespace dpcheck::audit_preload {
namespace {
template <typename Length, typename F>
int audited_truncate(const char* name, const char* path, Length length, F&& call) noexcept {
  char flag_text[48];
  Text t(flag_text, sizeof flag_text);
  t.put("length=");
  t.number(static_cast<long long>(length));
  Call c;
  c.name = name;
  c.path = path;
  c.flags = t.c_str();
  return audited(c, call);
}
}  // namespace
}  // namespace dpcheck::audit_preload

DPCHECK_AUDIT_EXPORT int truncate(const char* path, off_t length) noexcept {
  return audited_truncate("truncate", path, length, DPCHECK_CALL_REAL(truncate, -1, path, length));
}

DPCHECK_AUDIT_EXPORT int truncate64(const char* path, off64_t length) noexcept {
  return audited_truncate("truncate64", path, length, DPCHECK_CALL_REAL(truncate64, -1, path, length));
}

// ---- temporary files and FIFOs --------------------------------------------------------------------------
// Not in DESIGN.md's list, but they create files through the C library's internal calls, which the
// interposed open and mknod never see. Recorded with the name the call chose.

namespace dpcheck::audit_preload {
namespace {
template <typename F> int audited_mkstemp(const char* name, char* tmpl, int extra_flags, F&& call) noexcept {
  Guard guard;
  const int fd = call();
  if (guard.outermost()) {
    ErrnoKeeper keep;
    const int err = errno;
    record_open(name, AT_FDCWD, tmpl, O_RDWR | O_CREAT | O_EXCL | extra_flags, 0600, fd >= 0, err);
  }
  return fd;
}
}  // namespace
}  // namespace dpcheck::audit_preload

DPCHECK_AUDIT_EXPORT int mkstemp(char* tmpl) {
  return audited_mkstemp("mkstemp", tmpl, 0, DPCHECK_CALL_REAL(mkstemp, -1, tmpl));
}

DPCHECK_AUDIT_EXPORT int mkstemp64(char* tmpl) {
  return audited_mkstemp("mkstemp64", tmpl, 0, DPCHECK_CALL_REAL(mkstemp64, -1, tmpl));
}

DPCHECK_AUDIT_EXPORT int mkostemp(char* tmpl, int flags) {
  return audited_mkstemp("mkostemp", tmpl, flags, DPCHECK_CALL_REAL(mkostemp, -1, tmpl, flags));
}

DPCHECK_AUDIT_EXPORT int mkostemp64(char* tmpl, int flags) {
  return audited_mkstemp("mkostemp64", tmpl, flags, DPCHECK_CALL_REAL(mkostemp64, -1, tmpl, flags));
}

DPCHECK_AUDIT_EXPORT int mkstemps(char* tmpl, int suffix_len) {
  return audited_mkstemp("mkstemps", tmpl, 0, DPCHECK_CALL_REAL(mkstemps, -1, tmpl, suffix_len));
}

DPCHECK_AUDIT_EXPORT int mkstemps64(char* tmpl, int suffix_len) {
  return audited_mkstemp("mkstemps64", tmpl, 0, DPCHECK_CALL_REAL(mkstemps64, -1, tmpl, suffix_len));
}

DPCHECK_AUDIT_EXPORT int mkostemps(char* tmpl, int suffix_len, int flags) {
  return audited_mkstemp("mkostemps", tmpl, flags, DPCHECK_CALL_REAL(mkostemps, -1, tmpl, suffix_len, flags));
}

DPCHECK_AUDIT_EXPORT int mkostemps64(char* tmpl, int suffix_len, int flags) {
  return audited_mkstemp("mkostemps64", tmpl, flags, DPCHECK_CALL_REAL(mkostemps64, -1, tmpl, suffix_len, flags));
}

DPCHECK_AUDIT_EXPORT char* mkdtemp(char* tmpl) noexcept {
  Guard guard;
  char* r = DPCHECK_CALL_REAL(mkdtemp, static_cast<char*>(nullptr), tmpl)();
  if (guard.outermost()) {
    ErrnoKeeper keep;
    Call c;
    c.name = "mkdtemp";
    c.path = tmpl;
    c.mode = 0700;
    c.ok = r != nullptr;
    c.err = errno;
    record(c);
  }
  return r;
}

DPCHECK_AUDIT_EXPORT int mkfifo(const char* path, mode_t mode) noexcept {
  Call c;
  c.name = "mkfifo";
  c.path = path;
  c.mode = static_cast<long>(mode);
  return audited(c, DPCHECK_CALL_REAL(mkfifo, -1, path, mode));
}

DPCHECK_AUDIT_EXPORT int mkfifoat(int dirfd, const char* path, mode_t mode) noexcept {
  Call c;
  c.name = "mkfifoat";
  c.dirfd = dirfd;
  c.path = path;
  c.mode = static_cast<long>(mode);
  return audited(c, DPCHECK_CALL_REAL(mkfifoat, -1, dirfd, path, mode));
}
