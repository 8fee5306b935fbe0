// A program for tests/audit_test.cpp that makes each kind of write-intent call the write audit
// interposes, on request, so that the test can run it under the audit and compare the records with
// what was done:
//
//   audit_writer [--only-rank N] [--mpi] [--threads T] [--repeat R] [--expect-shim] [--quiet]
//                OP ARGS... [OP ARGS...]
//
// OPs run in order; each failure makes the exit status 1 and is reported on standard error unless
// --quiet (for tests where calls are meant to fail: a failed attempt is recorded too).
// --only-rank N: do nothing unless the launcher's rank (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, RANK)
// is N. --mpi: run the ops between MPI_Init and MPI_Finalize, so that Open MPI's own files are made as in
// a real job. --threads/--repeat: run the op list R times on each of T threads at once.
// --expect-shim: fail unless the fopen stand-in below was called and opened through open().
//
// Built a second time with DPCHECK_AUDIT_SHIM as a shared library: a stand-in for a C library whose
// fopen calls open, so that the test can check that one fopen gives one record.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#ifdef DPCHECK_AUDIT_SHIM

extern "C" {
__attribute__((visibility("default"))) std::atomic<int> audit_shim_fopen_calls{0};
}

// fopen done the way some C libraries do it: open(), then a stream on the descriptor. open() here is
// whatever the program's symbol lookup finds first, the audit library's when it is preloaded before
// this one.
extern "C" __attribute__((visibility("default"))) FILE* fopen(const char* path, const char* mode) {
  int flags = O_RDONLY;
  if (mode[0] == 'w') flags = O_WRONLY | O_CREAT | O_TRUNC;
  if (mode[0] == 'a') flags = O_WRONLY | O_CREAT | O_APPEND;
  if (std::strchr(mode, '+') != nullptr) flags = (flags & ~O_ACCMODE) | O_RDWR;
  const int fd = ::open(path, flags, 0644);
  if (fd < 0) return nullptr;
  audit_shim_fopen_calls.fetch_add(1);
  FILE* f = ::fdopen(fd, mode);
  if (f == nullptr) ::close(fd);
  return f;
}

#else  // the program

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#ifdef DPCHECK_AUDIT_WRITER_MPI
#include <mpi.h>
#endif

// The fortified entry points, called directly as a program built with _FORTIFY_SOURCE would.
extern "C" {
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);
}

namespace {

using Args = std::vector<std::string>;

// Returns 0 or an errno value.
int close_fd(int fd) {
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

int status(int r) { return r == 0 ? 0 : errno; }

int close_file(FILE* f) {
  if (f == nullptr) return errno;
  std::fclose(f);
  return 0;
}

// A directory descriptor for the *at calls.
class Dir {
 public:
  explicit Dir(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_DIRECTORY)) {}
  ~Dir() {
    if (fd_ >= 0) ::close(fd_);
  }
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Template calls need a writable copy of the template; the record carries the name chosen.
int temp_result(int fd, const std::string&) { return close_fd(fd); }

int suffix_length(const std::string& tmpl) {
  const std::size_t x = tmpl.rfind('X');
  return x == std::string::npos ? 0 : static_cast<int>(tmpl.size() - x - 1);
}

struct Op {
  int arity;
  std::function<int(const Args&)> run;
};

const std::map<std::string, Op>& ops() {
  static const std::map<std::string, Op> table = {
      // open family, for writing
      {"open", {1, [](const Args& a) { return close_fd(::open(a[0].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)); }}},
      {"open64", {1, [](const Args& a) { return close_fd(::open64(a[0].c_str(), O_RDWR | O_CREAT, 0600)); }}},
      {"openat",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return close_fd(::openat(d.fd(), a[1].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
        }}},
      {"openat64",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return close_fd(::openat64(d.fd(), a[1].c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640));
        }}},
      {"creat", {1, [](const Args& a) { return close_fd(::creat(a[0].c_str(), 0644)); }}},
      {"creat64", {1, [](const Args& a) { return close_fd(::creat64(a[0].c_str(), 0644)); }}},
      {"__open_2", {1, [](const Args& a) { return close_fd(__open_2(a[0].c_str(), O_WRONLY | O_APPEND)); }}},
      {"__open64_2", {1, [](const Args& a) { return close_fd(__open64_2(a[0].c_str(), O_RDWR)); }}},
      {"__openat_2",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return close_fd(__openat_2(d.fd(), a[1].c_str(), O_WRONLY | O_TRUNC));
        }}},
      {"__openat64_2",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return close_fd(__openat64_2(d.fd(), a[1].c_str(), O_WRONLY | O_APPEND));
        }}},
      {"tmpfile", {1, [](const Args& a) { return close_fd(::open(a[0].c_str(), O_TMPFILE | O_WRONLY, 0600)); }}},
      // stdio
      {"fopen", {1, [](const Args& a) { return close_file(std::fopen(a[0].c_str(), "w")); }}},
      {"fopen64", {1, [](const Args& a) { return close_file(::fopen64(a[0].c_str(), "a")); }}},
      {"fopen-mode", {2, [](const Args& a) { return close_file(std::fopen(a[0].c_str(), a[1].c_str())); }}},
      {"freopen",
       {1,
        [](const Args& a) {
          FILE* f = std::fopen("/dev/null", "r");
          return f == nullptr ? errno : close_file(std::freopen(a[0].c_str(), "w", f));
        }}},
      {"freopen64",
       {1,
        [](const Args& a) {
          FILE* f = std::fopen("/dev/null", "r");
          return f == nullptr ? errno : close_file(::freopen64(a[0].c_str(), "a", f));
        }}},
      {"freopen-same",
       {1,
        [](const Args& a) {  // freopen(NULL, ...): the stream's own file
          FILE* f = std::fopen(a[0].c_str(), "r");
          return f == nullptr ? errno : close_file(std::freopen(nullptr, "a", f));
        }}},
      // names
      {"rename", {2, [](const Args& a) { return status(std::rename(a[0].c_str(), a[1].c_str())); }}},
      {"renameat",
       {3,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::renameat(d.fd(), a[1].c_str(), d.fd(), a[2].c_str()));
        }}},
      {"renameat2",
       {3,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::renameat2(d.fd(), a[1].c_str(), d.fd(), a[2].c_str(), RENAME_NOREPLACE));
        }}},
      {"link", {2, [](const Args& a) { return status(::link(a[0].c_str(), a[1].c_str())); }}},
      {"linkat",
       {3,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::linkat(d.fd(), a[1].c_str(), d.fd(), a[2].c_str(), 0));
        }}},
      {"symlink", {2, [](const Args& a) { return status(::symlink(a[0].c_str(), a[1].c_str())); }}},
      {"symlinkat",
       {3,
        [](const Args& a) {
          Dir d(a[1]);
          return status(::symlinkat(a[0].c_str(), d.fd(), a[2].c_str()));
        }}},
      {"unlink", {1, [](const Args& a) { return status(::unlink(a[0].c_str())); }}},
      {"unlinkat",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::unlinkat(d.fd(), a[1].c_str(), 0));
        }}},
      {"remove", {1, [](const Args& a) { return status(std::remove(a[0].c_str())); }}},
      {"mkdir", {1, [](const Args& a) { return status(::mkdir(a[0].c_str(), 0755)); }}},
      {"mkdirat",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::mkdirat(d.fd(), a[1].c_str(), 0750));
        }}},
      {"rmdir", {1, [](const Args& a) { return status(::rmdir(a[0].c_str())); }}},
      {"truncate", {1, [](const Args& a) { return status(::truncate(a[0].c_str(), 0)); }}},
      {"truncate64", {1, [](const Args& a) { return status(::truncate64(a[0].c_str(), 7)); }}},
      {"mkfifo", {1, [](const Args& a) { return status(::mkfifo(a[0].c_str(), 0600)); }}},
      {"mkfifoat",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return status(::mkfifoat(d.fd(), a[1].c_str(), 0600));
        }}},
      // temporary names
      {"mkstemp",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkstemp(t.data()), t);
        }}},
      {"mkstemp64",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkstemp64(t.data()), t);
        }}},
      {"mkostemp",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkostemp(t.data(), O_CLOEXEC), t);
        }}},
      {"mkostemp64",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkostemp64(t.data(), O_CLOEXEC), t);
        }}},
      {"mkstemps",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkstemps(t.data(), suffix_length(t)), t);
        }}},
      {"mkstemps64",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkstemps64(t.data(), suffix_length(t)), t);
        }}},
      {"mkostemps",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkostemps(t.data(), suffix_length(t), O_CLOEXEC), t);
        }}},
      {"mkostemps64",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return temp_result(::mkostemps64(t.data(), suffix_length(t), O_CLOEXEC), t);
        }}},
      {"mkdtemp",
       {1,
        [](const Args& a) {
          std::string t = a[0];
          return ::mkdtemp(t.data()) == nullptr ? errno : 0;
        }}},
      // reading only: must leave no record
      {"read", {1, [](const Args& a) { return close_fd(::open(a[0].c_str(), O_RDONLY)); }}},
      {"read-at",
       {2,
        [](const Args& a) {
          Dir d(a[0]);
          return close_fd(::openat(d.fd(), a[1].c_str(), O_RDONLY | O_CLOEXEC));
        }}},
      {"read-fortified", {1, [](const Args& a) { return close_fd(__open_2(a[0].c_str(), O_RDONLY)); }}},
      // the working directory, for relative paths
      {"cd", {1, [](const Args& a) { return status(::chdir(a[0].c_str())); }}},
      // a program that empties its environment after start-up (the arity-0 op takes no argument)
      {"clearenv", {0, [](const Args&) { return status(::clearenv()); }}},
  };
  return table;
}

long launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::strtol(v, nullptr, 10);
  return -1;
}

struct Step {
  std::string name;
  Args args;
};

int run_steps(const std::vector<Step>& steps, int repeat, bool quiet) {
  int failures = 0;
  for (int i = 0; i < repeat; ++i) {
    for (const Step& s : steps) {
      if (const int err = ops().at(s.name).run(s.args); err != 0) {
        ++failures;
        if (quiet) continue;
        std::fprintf(stderr, "audit_writer: %s", s.name.c_str());
        for (const std::string& a : s.args) std::fprintf(stderr, " %s", a.c_str());
        std::fprintf(stderr, ": %s\n", std::strerror(err));
      }
    }
  }
  return failures;
}

int usage(const std::string& why) {
  std::fprintf(stderr, "audit_writer: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long only_rank = -1;
  bool mpi = false, expect_shim = false, quiet = false;
  int threads = 1, repeat = 1;
  std::vector<Step> steps;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only-rank" && i + 1 < argc) {
      only_rank = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--mpi") {
      mpi = true;
    } else if (a == "--expect-shim") {
      expect_shim = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (const auto it = ops().find(a); it != ops().end()) {
      if (i + it->second.arity >= argc) return usage(a + " needs " + std::to_string(it->second.arity) + " arguments");
      Step s{a, {}};
      for (int k = 0; k < it->second.arity; ++k) s.args.emplace_back(argv[++i]);
      steps.push_back(std::move(s));
    } else {
      return usage("unknown argument '" + a + "'");
    }
  }
  if (threads < 1 || repeat < 1) return usage("--threads and --repeat must be positive");

#ifdef DPCHECK_AUDIT_WRITER_MPI
  if (mpi) MPI_Init(&argc, &argv);
#else
  if (mpi) return usage("--mpi: this audit_writer was built without MPI");
#endif

  std::atomic<int> failures{0};
  if (only_rank < 0 || launcher_rank() == only_rank) {
    if (threads == 1) {
      failures += run_steps(steps, repeat, quiet);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back([&] { failures += run_steps(steps, repeat, quiet); });
      for (std::thread& t : pool) t.join();
    }
  }

#ifdef DPCHECK_AUDIT_WRITER_MPI
  if (mpi) {
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
  }
#endif

  if (expect_shim) {
    const auto* calls = static_cast<const std::atomic<int>*>(::dlsym(RTLD_DEFAULT, "audit_shim_fopen_calls"));
    if (calls == nullptr || calls->load() == 0) {
      std::fprintf(stderr, "audit_writer: --expect-shim: the fopen stand-in was not called\n");
      return 1;
    }
  }
  std::fflush(stdout);
  return failures > 0 ? 1 : 0;
}

#endif  // DPCHECK_AUDIT_SHIM
