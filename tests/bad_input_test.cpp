// Bad input to the dpcheck command, end to end. One table: each row is a command line, the exit status
// it must end with, and words its message must contain; the rows run against fixtures made in a fresh
// directory -- a FIFO, symbolic links, a file where a directory belongs, .npy files holding NaN, an
// infinity or a float64 beyond float32, parameter directories with a bad or an extra file -- and against
// /dev/full, /dev/null and /proc. Every row must end within seconds with exactly one line,
// "dpcheck: error: ...", and leave every file as it was: nothing created, nothing replaced, the devices
// still devices. Sizes are refused before anything is allocated, so no row trains a big model.
//
// Beside the table: a symbolic link given as --report is written through to its target and stays a link;
// a run whose loss stops being finite fails naming the step and checkpoints nothing that is not finite;
// processes of one MPI job started with different arguments are refused, naming the option and the ranks;
// under a launcher, a communicator whose ranks are threads is refused, naming the one to use instead.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "properties/case_token.hpp"
#include "src/io/npy.hpp"
#include "src/train/model.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

namespace fs = std::filesystem;

// Every row has this long; the slowest takes well under a second.
constexpr int kRowLimitS = 30;

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Row {
  std::string args;                // after the program name; {d} stands for the fixtures' directory
  int status;                      // the exit status it must end with
  std::vector<std::string> words;  // in the one line it prints
  long memory_kib = 0;             // run under `ulimit -v` with this limit, so that the row is the same
                                   // on any machine; 0: no limit
};

// What the fixtures' directory holds, for "nothing created or replaced": every entry's relative path,
// its type, a link's target and a regular file's bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = fs::relative(e.path(), dir).string();
    const fs::file_status st = e.symlink_status();
    if (fs::is_symlink(st)) out[name] = "link to " + fs::read_symlink(e.path()).string();
    else if (fs::is_regular_file(st)) out[name] = "file " + read_file(e.path());
    else out[name] = "type " + std::to_string(static_cast<int>(st.type()));
  }
  return out;
}

bool is_char_device(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

void write_params(const fs::path& dir, const ModelConfig& model, const std::vector<float>& params) {
  fs::create_directories(dir);
  const ParamLayout layout(model);
  for (const Slice& s : layout.slices())
    write_npy(dir / (s.name + ".npy"), s.shape, std::span<const float>(params).subspan(s.offset, s.size()));
}

// A record of dpcheck.torch (python/torch_record.hpp) as the Monitor writes one: model 4,3,1 on 2 ranks
// with SGD, step 0 alone; `change` damages it before it is written.
struct RecordFixture {
  int version = 1;
  std::vector<int> dims{4, 3, 1};
  std::int64_t examples_in_parts = 8;  // the x.npy below holds 8
  bool nan_params = false;
  bool failure = false;
};

void write_record(const fs::path& dir, const RecordFixture& f) {
  const ModelConfig model{f.dims, Activation::relu, Loss::mse};
  fs::create_directories(dir / "step-00000000");
  nlohmann::json head{{"dpcheck_torch_record", f.version},
                      {"dpcheck_version", "0"},
                      {"torch", "1.13.1"},
                      {"backend", "gloo"},
                      {"world_size", 2},
                      {"model", {{"dims", f.dims}, {"activation", "relu"}, {"loss", "mse"}, {"names", {"0", "2"}}}},
                      {"optimizer", {{"name", "SGD"}, {"kind", "sgd"}, {"lr", 0.1}}},
                      {"command_line", {"job.py"}}};
  if (f.failure) head["failure"] = {{"kind", "gradient"}, {"step", 0}, {"message", "dpcheck.torch: FAILED gradient"}};
  std::ofstream(dir / "record.json") << head.dump(1) << "\n";
  const fs::path s = dir / "step-00000000";
  nlohmann::json step{
      {"step", 0},
      {"lr", 0.1},
      {"optimizer_steps", 0},
      {"parts", {{{"rank", 0}, {"examples", 4}}, {{"rank", 1}, {"examples", f.examples_in_parts - 4}}}}};
  std::ofstream(s / "step.json") << step.dump(1) << "\n";
  std::vector<float> params = init_params(model, 0);
  const std::int64_t n[] = {static_cast<std::int64_t>(params.size())}, none[] = {0};
  write_npy(s / "grad.npy", n, std::span<const float>(params));
  write_npy(s / "params_after.npy", n, std::span<const float>(params));
  if (f.nan_params) params[1] = std::numeric_limits<float>::quiet_NaN();
  write_npy(s / "params.npy", n, std::span<const float>(params));
  write_npy(s / "state.npy", none, std::span<const float>());
  write_npy(s / "state_after.npy", none, std::span<const float>());
  const std::int64_t x_shape[] = {8, f.dims.front()}, y_shape[] = {8, f.dims.back()};
  write_npy(s / "x.npy", x_shape, std::span<const float>(std::vector<float>(8 * f.dims.front(), 0.5f)));
  write_npy(s / "y.npy", y_shape, std::span<const float>(std::vector<float>(8 * f.dims.back(), 0.25f)));
}

class BadInput : public testing::Test {
 protected:
  void SetUp() override {
    const fs::path d = dir_.path();
    // Records of a PyTorch job (dpcheck.torch): a good one, a bundle, and damaged ones.
    write_record(d / "rec", {});
    write_record(d / "rec_bundle", {.failure = true});
    write_record(d / "rec_v2", {.version = 2});
    write_record(d / "rec_parts", {.examples_in_parts = 7});
    write_record(d / "rec_nan", {.nan_params = true});
    write_record(d / "rec_wide", {.dims = {5, 3, 1}});
    fs::create_directories(d / "rec_empty");
    fs::copy_file(d / "rec" / "record.json", d / "rec_empty" / "record.json");
    ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0) << std::strerror(errno);
    std::ofstream(d / "kept.json") << "an earlier report\n";
    fs::create_symlink(d / "kept.json", d / "link.json");
    fs::create_symlink(d / "fifo", d / "link-to-fifo");
    std::ofstream(d / "afile") << "not a directory\n";
    // A repro bundle whose manifest is not one.
    fs::create_directory(d / "badbundle");
    std::ofstream(d / "badbundle" / "manifest.json") << "{}\n";
    std::ofstream(d / "badbundle" / "indices.json") << "{}\n";
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<std::int64_t> x_shape{8, 4}, y_shape{8, 1};
    std::vector<float> x(32, 0.5f), y(8, 0.25f);
    write_npy(d / "x.npy", x_shape, std::span<const float>(x));
    write_npy(d / "y.npy", y_shape, std::span<const float>(y));
    x[5] = nan;
    write_npy(d / "x_nan.npy", x_shape, std::span<const float>(x));
    x[5] = -inf;
    write_npy(d / "x_inf.npy", x_shape, std::span<const float>(x));
    std::vector<double> big(32, 0.5);
    big[31] = 1e300;
    write_npy(d / "x_big.npy", x_shape, std::span<const double>(big));
    y[7] = inf;
    write_npy(d / "y_inf.npy", y_shape, std::span<const float>(y));

    const ModelConfig model{{4, 3, 1}, Activation::relu, Loss::mse};
    std::vector<float> params = init_params(model, 0);
    write_params(d / "init", model, params);
    write_params(d / "init_extra", model, params);
    std::ofstream(d / "init_extra" / "notes.txt") << "exported by hand\n";
    write_params(d / "init_fifo", model, params);
    fs::remove(d / "init_fifo" / "layers.1.bias.npy");
    ASSERT_EQ(::mkfifo((d / "init_fifo" / "layers.1.bias.npy").c_str(), 0600), 0);
    params[2] = std::numeric_limits<float>::quiet_NaN();  // layers.0.weight[0, 2]
    write_params(d / "init_nan", model, params);

    // dpcheck diff: a trace of no steps, one whose step line is damaged, one of an unknown format
    // version, and a directory with no .npy file.
    nlohmann::json trace{{"dpcheck_trace", 1},
                         {"config", nlohmann::json::object()},
                         {"target", nlohmann::json::object()},
                         {"world_size", 1},
                         {"digest", "xxh3"},
                         {"tensors", nlohmann::json::array({"layers.0.weight"})},
                         {"state", nlohmann::json::array()}};
    std::ofstream(d / "trace.jsonl") << trace.dump() << "\n";
    std::ofstream(d / "trace_bad.jsonl") << trace.dump() << "\n{\"step\": 0, \"loss\n";
    std::ofstream(d / "trace_huge.jsonl") << trace.dump() << "\n{\"step\": 0, \"loss\": 1e400}\n";
    trace["dpcheck_trace"] = 2;
    std::ofstream(d / "trace_v2.jsonl") << trace.dump() << "\n";
    fs::create_directories(d / "no_npy");
    std::ofstream(d / "no_npy" / "manifest.json") << "{}\n";

    // JSON nested far past any stack: a trace line, a checkpoint's manifest, a bundle's manifest.
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    std::ofstream(d / "trace_deep.jsonl") << read_file(d / "trace.jsonl") << deep << "\n";
    fs::create_directories(d / "ckpt_deep" / "step-00000001");
    std::ofstream(d / "ckpt_deep" / "step-00000001" / "manifest.json")
        << "{\"format\": " << std::string(200000, '[') << "\n";
    fs::create_directories(d / "bundle_deep");
    std::ofstream(d / "bundle_deep" / "manifest.json") << deep << "\n";
    std::ofstream(d / "bundle_deep" / "indices.json") << "{}\n";
    // Links: to an input, by hard link to an input, to nowhere (a checkpoint directory to be), in a loop.
    fs::create_symlink(d / "x.npy", d / "link-to-x.npy");
    fs::create_hard_link(d / "trace_v2.jsonl", d / "hard-trace.jsonl");
    fs::create_symlink(d / "nowhere" / "ckpt", d / "dangling-dir");
    // A loop of links, outside the directory whose snapshot is compared (a snapshot cannot walk it).
    fs::create_directories(loops_path());
    fs::create_symlink(loops_path() / "loop-b", loops_path() / "loop-a");
    fs::create_symlink(loops_path() / "loop-a", loops_path() / "loop-b");
  }

  void TearDown() override { fs::remove_all(loops_path()); }
  fs::path loops_path() const { return dir_.path().string() + "-loops"; }

  const ScratchDir dir_;
};

TEST_F(BadInput, EveryRowEndsWithOneLineAndTouchesNothing) {
  // A well-formed case token of one property, for the rows that name another.
  const std::string token = encode_case_token({"gradient_average_matches_whole_batch", {rc::Random(7), 3, {}}});
  std::string damaged = token;
  damaged[damaged.size() / 2] = damaged[damaged.size() / 2] == 'A' ? 'B' : 'A';
  const std::vector<Row> rows{
      // Output paths: never replaced unless a regular file, and checked before any work.
      {"verify --cases 1 --report /dev/full", 2, {"/dev/full", "character device"}},
      {"verify --thorough=maybe", 2, {"--thorough", "maybe"}},
      {"verify --describe-mutants --list-mutants", 2, {"--describe-mutants", "excludes"}},
      {"verify --describe-mutants=maybe", 2, {"--describe-mutants", "maybe"}},
      {"verify --thorough --cases 0", 2, {"--cases must be at least 1"}},
      {"verify --cases 1 --report /dev/null", 2, {"/dev/null", "character device"}},
      {"verify --cases 1 --report {d}/fifo", 2, {"fifo", "FIFO"}},
      {"verify --cases 1 --junit {d}/link-to-fifo", 2, {"link-to-fifo", "FIFO"}},
      {"verify --cases 1 --report {d}", 2, {"a directory"}},
      {"verify --cases 1 --report {d}/missing/r.json", 2, {"does not exist"}},
      {"verify --cases 1 --report {d}/r.json --junit {d}/fifo", 2, {"FIFO"}},
      {"verify --cases 1 --report /proc/dpcheck.json", 2, {"--report", "/proc"}},
      {"verify --cases 1 --junit /dev/null", 2, {"--junit", "character device"}},
      {"verify --cases 1 --html /dev/full", 2, {"--html", "character device"}},
      {"verify --cases 1 --report {d}/r.json --html {d}/missing/r.html", 2, {"--html", "does not exist"}},
      {"verify --cases 1 --html {d}/fifo", 2, {"--html", "FIFO"}},
      // Replays: the token is checked, and names its property, before anything runs or prints.
      {"verify --reproduce '' --report {d}/r.json", 2, {"--reproduce", "empty"}},
      {"verify --reproduce nonsense --report {d}/r.json", 2, {"--reproduce", "<property>:<case>:<check>"}},
      {"verify --reproduce " + dpcheck::quoted(damaged) + " --report {d}/r.json",
       2,
       {"--reproduce", "damaged or edited"}},
      {"verify --reproduce " + dpcheck::quoted(token) + " --property sampler_shards_disjoint --report {d}/r.json",
       2,
       {"gradient_average_matches_whole_batch", "sampler_shards_disjoint"}},
      {"verify --reproduce " + dpcheck::quoted(encode_case_token({"no_such_property", {rc::Random(7), 3, {}}})) +
           " --report {d}/r.json",
       2,
       {"no_such_property"}},
      {"verify --reruns 0 --report {d}/r.json", 2, {"--reruns"}},
      {"verify --cases 0 --report {d}/r.json", 2, {"--cases"}},
      {"verify --timeout nan --report {d}/r.json", 2, {"--timeout", "nan"}},
      {"verify --timeout 1e300 --report {d}/r.json", 2, {"--timeout"}},
      {"verify --seed -1 --report {d}/r.json", 2, {"--seed", "-1"}},
      {"verify --world-size 2000000000 --report {d}/r.json", 2, {"--world-size 2000000000"}},
      {"verify --comm simulated --world-size 2000000 --report {d}/r.json",
       2,
       {"--world-size 2000000", "at most 1048576"}},
      {"verify --engine cuda --comm simulated --report {d}/r.json", 2, {"not 'simulated'", "--engine cpu"}},
      {"verify --model 0,3 --report {d}/r.json", 2, {"--model 0,3", "positive widths"}},
      {"verify --model 64 --report {d}/r.json", 2, {"--model 64"}},
      {"verify --model 100000,100000 --report {d}/r.json", 2, {"--model 100000,100000", "2^31 - 1"}},
      {"verify --model 20000,20000 --report {d}/r.json", 2, {"--model 20000,20000", "ulimit -v"}, 1'000'000},
      {"train --model 4,1 --comm simulated --world-size 2000000", 2, {"--world-size 2000000", "at most 1048576"}},
      {"train --model 4,1 --log /dev/full", 2, {"--log", "/dev/full", "character device"}},
      {"train --model 4,1 --log {d}/fifo", 2, {"--log", "FIFO"}},
      {"train --model 4,1 --log /proc/dpcheck.log", 2, {"--log", "cannot create a file in /proc"}},
      {"train --model 4,1 --log {d}/afile/log", 2, {"--log", "not a directory"}},
      {"train --model 4,1 --checkpoint-dir {d}/afile", 2, {"--checkpoint-dir", "a regular file, not a directory"}},
      {"train --model 4,1 --checkpoint-dir {d}/afile/sub", 2, {"--checkpoint-dir", "not a directory"}},
      {"train --model 4,1 --checkpoint-dir /proc/dpcheck-ckpt", 2, {"--checkpoint-dir", "/proc"}},
      {"train --model 4,1 --checkpoint-dir /dev/null", 2, {"--checkpoint-dir", "character device"}},
      {"bench allreduce --sizes 4K --ranks 1 --backends local --json /dev/full", 2, {"--json", "character device"}},
      {"bench allreduce --sizes 4K --ranks 1 --backends local --json {d}/fifo", 2, {"--json", "FIFO"}},
      {"bench hash --json {d}/fifo", 2, {"--json", "FIFO"}},
      {"bench rounding --json {d}/fifo", 2, {"--json", "FIFO"}},
      {"bench rounding --max-world 1", 2, {"--max-world must be from 2 to 65536"}},
      {"bench rounding --elements 0", 2, {"--elements must be from 1"}},
      {"bench rounding --max-world 65536 --elements 2048", 2, {"2^26", "65536 x 2048"}},
      {"bench rounding --format fp8", 2, {"unknown --format 'fp8'"}},
      {"bench rounding --schedules ring,butterfly", 2, {"--schedules butterfly: no such schedule"}},
      {"bench rounding --schedules ring:4", 2, {"--schedules ring:4", "only hierarchical"}},
      {"bench step --json /proc/dpcheck.json", 2, {"--json", "/proc"}},
      {"audit --json {d}/fifo -- true", 2, {"--json", "FIFO"}},
      {"audit --json /proc/dpcheck.json -- true", 2, {"--json", "/proc"}},
      // Engines and communicators: names from the backend table (src/target/backends.hpp), in pairs that go
      // together, with a launcher where the communicator's ranks are processes.
      {"verify --engine quantum --report {d}/r.json", 2, {"unknown engine 'quantum' (choose cpu or cuda)"}},
      {"verify --comm carrier-pigeon --report {d}/r.json",
       2,
       {"unknown --comm 'carrier-pigeon'", "local, simulated, mpi or mpi-native for the cpu engine",
        "cuda-local or nccl for the cuda engine"}},
      {"verify --comm nccl --report {d}/r.json",
       2,
       {"engine cpu runs with --comm local, simulated, mpi or mpi-native, not 'nccl'", "--engine cuda"}},
      {"verify --engine cuda --comm local --report {d}/r.json",
       2,
       {"engine cuda runs with --comm cuda-local or nccl, not 'local'", "--engine cpu"}},
      {"verify --engine cuda --comm mpi --report {d}/r.json", 2, {"not 'mpi'", "--engine cpu"}},
      {"verify --engine quantum --comm mpi --report {d}/r.json", 2, {"quantum"}},
      {"verify --comm mpi --report {d}/r.json", 2, {"--comm mpi runs one process per rank", "mpirun -np 4 dpcheck"}},
      {"verify --tf32 --report {d}/r.json", 2, {"--tf32", "cuda engine"}},
      {"train --model 4,1 --engine quantum --log {d}/l.json", 2, {"unknown engine 'quantum'"}},
      {"train --model 4,1 --comm carrier-pigeon --log {d}/l.json", 2, {"unknown --comm 'carrier-pigeon'"}},
      {"train --model 4,1 --comm cuda-local --log {d}/l.json", 2, {"not 'cuda-local'", "--engine cuda"}},
      {"train --model 4,1 --comm mpi --log {d}/l.json", 2, {"--comm mpi runs one process per rank"}},
      {"train --model 4,1 --tf32 --log {d}/l.json", 2, {"--tf32"}},
      // Mixed precision: --precision, --allreduce-dtype and the loss scaler's options.
      {"verify --precision fp8 --report {d}/r.json", 2, {"unknown --precision 'fp8' (choose fp32, bf16 or fp16)"}},
      {"verify --precision bf16 --engine cuda --comm cuda-local --tf32 --report {d}/r.json",
       2,
       {"--tf32 and --precision bf16 both set the matrix products' input format"}},
      {"verify --allreduce-dtype fp16 --report {d}/r.json",
       2,
       {"unknown --allreduce-dtype 'fp16' (choose fp32 or bf16)"}},
      {"verify --allreduce-dtype bf16 --engine cuda --comm cuda-local --report {d}/r.json",
       2,
       {"--allreduce-dtype bf16", "cpu engine"}},
      {"verify --precision fp32 --mutant bf16-accumulate --report {d}/r.json",
       2,
       {"bf16-accumulate", "add --precision bf16"}},
      {"verify --precision bf16 --mutant scaler-local-skip --report {d}/r.json", 2, {"add --precision fp16"}},
      {"train --model 4,1 --precision half --log {d}/l.json", 2, {"unknown --precision 'half'"}},
      {"train --model 4,1 --precision fp16 --engine cuda --comm cuda-local --tf32 --log {d}/l.json",
       2,
       {"--precision fp16"}},
      {"train --model 4,1 --loss-scale always --log {d}/l.json",
       2,
       {"unknown --loss-scale 'always' (choose none or dynamic)"}},
      {"train --model 4,1 --loss-scale dynamic --loss-scale-init 3 --log {d}/l.json",
       2,
       {"--loss-scale-init must be a power of two"}},
      {"train --model 4,1 --loss-scale dynamic --loss-scale-init inf --log {d}/l.json", 2, {"--loss-scale-init"}},
      {"train --model 4,1 --loss-scale dynamic --loss-scale-init 1e30 --log {d}/l.json", 2, {"--loss-scale-init"}},
      {"train --model 4,1 --loss-scale dynamic --loss-scale-interval 0 --log {d}/l.json", 2, {"--loss-scale-interval"}},
      {"train --model 4,1 --loss-scale-interval 5 --log {d}/l.json", 2, {"are for --loss-scale dynamic"}},
      {"train --model 4,1 --precision fp16 --loss-scale none --loss-scale-init 8 --log {d}/l.json",
       2,
       {"are for --loss-scale dynamic"}},
      {"train --model 4,1 --allreduce-dtype int8 --log {d}/l.json", 2, {"unknown --allreduce-dtype 'int8'"}},
      // Buckets: --bucket-mb is a size in MiB, 0 for one all-reduce.
      {"train --model 4,1 --bucket-mb -1 --log {d}/l.json", 2, {"--bucket-mb"}},
      {"train --model 4,1 --bucket-mb nan --log {d}/l.json", 2, {"--bucket-mb"}},
      {"train --model 4,1 --bucket-mb 1e300 --log {d}/l.json", 2, {"--bucket-mb", "at most"}},
      {"train --model 4,1 --bucket-mb lots --log {d}/l.json", 2, {"--bucket-mb"}},
      {"grad --model 4,1 --batch 8 --precision fp4", 2, {"unknown --precision 'fp4'"}},
      {"grad --model 4,1 --batch 8 --loss-scale dynamic --loss-scale-init 0.3", 2, {"--loss-scale-init"}},
      {"grad --model 1,1 --batch 1 --precision fp16 --loss-scale-init 1099511627776",
       2,
       {"gradient is not finite", "--loss-scale-init"}},
      // --kernels: a shared object this machine loads, exporting a kernel table of a known ABI, with a
      // name, on host memory for the cpu engine (tests/plugins/kernels/).
      {"verify --kernels {d}/missing.so --report {d}/r.json", 2, {"--kernels", "missing.so: no such file"}},
      {"verify --kernels {d}/afile --report {d}/r.json", 2, {"--kernels", "afile: not a shared object"}},
      {"verify --kernels {d}/fifo --report {d}/r.json", 2, {"--kernels", "fifo: not a regular file"}},
      {std::string("verify --report {d}/r.json --kernels ") + DPCHECK_KERNELS_NO_SYMBOL,
       2,
       {"--kernels", "exports no dpcheck_kernel_plugin"}},
      {std::string("train --model 4,1 --log {d}/l.json --kernels ") + DPCHECK_KERNELS_COMM_ONLY,
       2,
       {"exports no dpcheck_kernel_plugin", "it exports dpcheck_comm_plugin: pass it with --comm"}},
      {std::string("verify --report {d}/r.json --kernels ") + DPCHECK_KERNELS_BAD_ABI,
       2,
       {"--kernels", "plugin ABI 99", "knows ABI 1 to 3"}},
      {std::string("grad --model 4,1 --batch 8 --kernels ") + DPCHECK_KERNELS_NO_TABLE, 2, {"--kernels", "no table"}},
      {std::string("verify --report {d}/r.json --kernels ") + DPCHECK_KERNELS_NO_NAME, 2, {"--kernels", "no name"}},
      {std::string("train --model 4,1 --log {d}/l.json --kernels ") + DPCHECK_KERNELS_DEVICE_MEMORY,
       2,
       {"--kernels", "DPCHECK_CUDA", "--engine cuda"}},
      // Timeouts: finite, positive, at most a day.
      {"train --model 4,1 --timeout inf", 2, {"--timeout", "inf"}},
      {"train --model 4,1 --timeout nan", 2, {"--timeout", "nan"}},
      {"train --model 4,1 --timeout 1e300", 2, {"--timeout", "86400"}},
      {"train --model 4,1 --timeout 0", 2, {"--timeout"}},
      {"train --model 4,1 --timeout -5", 2, {"--timeout"}},
      {"train --model 4,1 --timeout 0.0001", 2, {"--timeout"}},
      // Sizes, against the model's own limits and the machine's memory and threads.
      {"train --model 100000,100000", 2, {"--model 100000,100000", "10000100000 parameters"}},
      {"grad --model 50000,50000,50000 --batch 8", 2, {"--model", "5000100000 parameters"}},
      {"train --model 4,99999999999", 2, {"--model", "width 99999999999 is larger than 16777216"}},
      {"train --model 4,1 --world-size 2000000000", 2, {"--world-size 2000000000", "too big for this machine"}},
      {"grad --model 4,1 --batch 8 --world-size 2000000000", 2, {"--world-size 2000000000", "threads"}},
      // --world-size below 1, refused where every command reads its target options (TargetOptions::target).
      {"grad --model 4,1 --batch 8 --world-size 0", 2, {"--world-size must be at least 1"}},
      {"verify --world-size -3", 2, {"--world-size must be at least 1"}},
      {"train --model 4,1 --world-size 0 --steps 1", 2, {"--world-size must be at least 1"}},
      {"bench trace --world-size 0", 2, {"--world-size must be at least 1"}},
      {"grad --model 4,1 --batch 100000000000000", 2, {"--batch 100000000000000", "too big for this machine"}},
      {"train --model 4,1 --batch 100000000000000", 2, {"--batch 100000000000000", "GiB"}},
      {"train --model 4,1 --batch 8 --dataset-size 100000000000000", 2, {"--dataset-size 100000000000000"}},
      {"bench allreduce --sizes 4K,1000G --ranks 2 --backends local", 2, {"--sizes", "too big for this machine"}},
      {"train --model 20000,20000", 2, {"--model 20000,20000", "ulimit -v"}, 1'000'000},
      {"grad --model 20000,20000 --batch 8 --world-size 2", 2, {"--model 20000,20000", "ulimit -v"}, 1'000'000},
      {"grad --model 4,1 --batch 2000000000", 2, {"--batch 2000000000", "ulimit -v"}, 1'000'000},
      {"train --model 4,1 --world-size 4000 --batch 4000", 2, {"--world-size 4000", "ulimit -v"}, 1'000'000},
      // Data and parameters that are not finite.
      {"grad --model 4,1 --x {d}/x_nan.npy --y {d}/y.npy", 2, {"x_nan.npy", "element [1, 1] is nan"}},
      {"grad --model 4,1 --x {d}/x_inf.npy --y {d}/y.npy", 2, {"x_inf.npy", "element [1, 1] is -inf"}},
      {"grad --model 4,1 --x {d}/x_big.npy --y {d}/y.npy", 2, {"x_big.npy", "element [7, 3] is 1e+300", "float32"}},
      {"grad --model 4,1 --x {d}/x.npy --y {d}/y_inf.npy", 2, {"y_inf.npy", "element [7, 0] is inf"}},
      {"train --model 4,1 --x {d}/x_nan.npy --y {d}/y.npy --batch 8", 2, {"x_nan.npy", "nan"}},
      {"grad --model 4,3,1 --batch 8 --init {d}/init_nan", 2, {"layers.0.weight.npy", "element [0, 2] is nan"}},
      {"train --model 4,3,1 --init {d}/init_nan", 2, {"layers.0.weight.npy", "nan"}},
      {"train --model 4,1 --lr 1e39", 2, {"--lr", "1e+39"}},
      {"train --model 4,1 --lr nan", 2, {"--lr", "nan"}},
      {"train --model 4,1 --lr -1", 2, {"--lr"}},
      {"train --model 4,1 --momentum inf", 2, {"--momentum", "inf"}},
      {"train --model 4,1 --optimizer momentum --momentum -0.5", 2, {"--momentum"}},
      // What used to be ignored or clamped without a word.
      {"train --model 4,1 --batch 30 --world-size 2 --accumulate 16", 2, {"--accumulate 16", "15 examples"}},
      {"train --model 4,1 --batch 30 --world-size 2 --accumulate 100", 2, {"--accumulate 100", "at most 15"}},
      {"grad --model 4,1 --batch 30 --world-size 2 --accumulate 16", 2, {"--accumulate 16", "15 examples"}},
      {"grad --model 4,1 --batch 8 --accumulate 0", 2, {"--accumulate"}},
      {"grad --model 4,3,1 --batch 8 --init {d}/init_extra", 2, {"--init", "notes.txt"}},
      {"train --model 4,3,1 --init {d}/init_extra", 2, {"--init", "notes.txt"}},
      {"train --model 4,3,1 --init {d}/init --resume {d}/init", 2, {"--init", "--resume"}},
      {"grad --model 4,1 --batch 8 --mutant writer-all-ranks", 2, {"writer-all-ranks", "only_rank0_writes"}},
      {"grad --model 4,1 --batch 8 --mutant optimizer-rank-perturb", 2, {"optimizer-rank-perturb"}},
      {"grad --model 4,1 --batch 8 --mutant bias-grad-skip-tail", 2, {"bias-grad-skip-tail", "cuda"}},
      {"grad --model 4,1 --batch 8 --seed -1", 2, {"--seed", "-1", "18446744073709551615"}},
      {"grad --model 4,1 --batch 8 --seed 18446744073709551616", 2, {"--seed", "18446744073709551616"}},
      {"train --model 4,1 --seed -1", 2, {"--seed", "-1"}},
      {"train --model 4,1 --seed 99999999999999999999999", 2, {"--seed"}},
      {"train --model 4,1 --seed 1.5", 2, {"--seed", "1.5"}},
      {"train --model 4,1 --seed 0x10", 2, {"--seed", "0x10"}},
      // A FIFO where a .npy file belongs is refused by its type, without waiting for a writer.
      {"grad --model 4,1 --x {d}/fifo --y {d}/y.npy", 2, {"fifo", "FIFO"}},
      {"grad --model 4,1 --x {d}/x.npy --y {d}/fifo", 2, {"fifo", "FIFO"}},
      {"train --model 4,1 --x {d}/fifo --y {d}/y.npy", 2, {"fifo", "FIFO"}},
      {"grad --model 4,3,1 --batch 8 --init {d}/init_fifo", 2, {"layers.1.bias.npy", "FIFO"}},
      {"grad --model 4,1 --x /dev/zero --y {d}/y.npy", 2, {"/dev/zero", "character device"}},
      // Plugins (include/dpcheck/plugin.h): a file that is not one, or a table dpcheck must refuse.
      {"verify --cases 1 --comm {d}/missing.so", 2, {"--comm", "missing.so", "no such file"}},
      {"verify --cases 1 --comm {d}/afile", 2, {"--comm", "afile", "not a shared object"}},
      {"verify --cases 1 --comm {d}", 2, {"--comm", "not a regular file"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_wrong-abi.so",
       2,
       {"wrong-abi", "plugin ABI 99", "knows ABI 1 to 3"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_unknown-dtype.so", 2, {"unknown-dtype", "dtypes hold bit 9"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_unknown-op.so", 2, {"unknown-op", "ops hold bit 7"}},
      // Capabilities (plugin ABI 3): the gradient all-reduce a plugin does not declare is refused up front.
      {"verify --cases 1 --comm {p}/libdpcheck_comm_float32-sum.so",
       2,
       {"plugin 'broken'", "float32-sum", "does not support avg", "DPCHECK_OP_BIT(DPCHECK_AVG)"}},
      {"train --model 4,1 --steps 1 --world-size 2 --comm {p}/libdpcheck_comm_float32-sum.so",
       2,
       {"plugin 'broken'", "does not support avg"}},
      {"train --model 4,1 --steps 1 --world-size 2 --allreduce-dtype bf16 --comm "
       "{p}/libdpcheck_comm_unchanged-source.so",
       2,
       {"plugin 'broken'", "unchanged-source", "does not support bfloat16", "--allreduce-dtype f32",
        "DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16)"}},
      {"verify --cases 1 --allreduce-dtype bf16 --comm {p}/libdpcheck_comm_abi-1.so",
       2,
       {"plugin ABI 1, which has no bfloat16"}},
      {"grad --model 4,1 --batch 4 --world-size 2 --comm {p}/libdpcheck_comm_float32-sum.so",
       2,
       {"does not support avg"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_null-entry.so", 2, {"null-entry", "no allreduce (NULL)"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_null-table.so", 2, {"null-table", "no table (NULL)"}},
      {"verify --cases 1 --comm {p}/libdpcheck_comm_bad-env.so",
       2,
       {"bad-env", "dpcheck_plugin_env", "\"BAD_ENV_CHUNK=4096\"", "not a variable's name"}},
      {"verify --cases 1 --comm {r} --engine cuda", 2, {"engine cuda", "is for --engine cpu"}},
      {"train --model 4,1 --steps 1 --comm {p}/libdpcheck_comm_wrong-abi.so", 2, {"plugin ABI 99"}},
      {"grad --model 4,1 --batch 4 --comm {p}/libdpcheck_comm_null-entry.so", 2, {"no allreduce"}},
      {"bench allreduce --sizes 4K --ranks 2 --comm {p}/libdpcheck_comm_null-table.so", 2, {"no table"}},
      {"bench allreduce --sizes 4K --ranks 2 --comm local", 2, {"--comm local", "--backends"}},
      {"conform", 2, {"--comm"}},
      {"conform --comm local", 2, {"--comm local", "other than dpcheck's default", "mpi-native"}},
      {"train --model 8,4,1 --batch 512 --world-size 65 --allreduce-dtype bf16 --comm {r}",
       2,
       {"--allreduce-dtype bf16 on 65 ranks", "names no reduction schedule", "at most 64 ranks"}},
      {"verify --cases 1 --world-size 65 --allreduce-dtype bf16 --comm {r}",
       2,
       {"--allreduce-dtype bf16 on 65 ranks", "names no reduction schedule", "at most 64 ranks"}},
      {"conform --comm {r} --max-size 0", 2, {"--max-size"}},
      {"conform --comm {r} --max-size 100000", 2, {"--max-size", "4096"}},
      {"conform --comm {r} --max-size 64", 2, {"--max-size is for kernel plugins"}},
      {"conform --comm {r} --max-size x", 2, {"--max-size"}},
      {"conform --comm {d}/missing.so", 2, {"missing.so", "no such file"}},
      {"conform --comm {r} --case count=1", 2, {"--case needs --check"}},
      {"conform --comm {r} --check nonsense", 2, {"--check 'nonsense'"}},
      {"conform --comm {r} --check 'allreduce float32 sum' --case count=x", 2, {"--case", "key=number"}},
      {"conform --comm {r} --check 'allreduce float32 sum' --case 'count=3 root=1'", 2, {"--case", "root=1"}},
      {"conform --comm {r} --check 'broadcast float32' --case offset=1", 2, {"--case", "no count"}},
      {"conform --comm {r} --max-mib -1", 2, {"--max-mib"}},
      {"conform --comm {r} --cases 0", 2, {"--cases"}},
      {"conform --comm {r} --world-size 0", 2, {"--world-size"}},
      {"conform --comm {r} --report /dev/full", 2, {"--report", "character device"}},
      {"conform --comm {r} --junit {d}/fifo", 2, {"--junit", "FIFO"}},
      {"conform --comm {r} --html {d}/fifo", 2, {"--html", "FIFO"}},
      {"conform --comm {r} --report {d}/c.json --html /proc/dpcheck.html", 2, {"--html", "/proc"}},
      {"conform --comm {r} --kernels {d}/missing.so", 2, {"one plugin at a time"}},
      {"conform --comm {r} --schedule butterfly", 2, {"--schedule butterfly", "rank-order, ring, tree"}},
      {"conform --comm {r} --schedule ring:4", 2, {"--schedule ring:4", "only hierarchical takes a group size"}},
      {"conform --comm {r} --schedule hierarchical:0", 2, {"--schedule hierarchical:0", "whole number from 1"}},
      {"conform --comm {r} --schedule hierarchical:x", 2, {"--schedule hierarchical:x", "whole number from 1"}},
      {"conform --comm {r} --check 'schedule float32 sum'", 2, {"--check 'schedule float32 sum' needs --schedule"}},
      {"conform --kernels {d}/missing.so --schedule ring", 2, {"--schedule is for a communicator"}},
      {"conform --comm {r} --schedule open-mpi-ring:4",
       2,
       {"--schedule open-mpi-ring:4", "only hierarchical takes a group size"}},
      {"conform --kernels {d}/missing.so --allreduce-only", 2, {"--allreduce-only is for a communicator"}},
      {"conform --comm {r} --allreduce-only --check 'broadcast float32'",
       2,
       {"--allreduce-only with --check 'broadcast float32'", "not one of the all-reduce's"}},
      {"conform --kernels {d}/missing.so", 2, {"--kernels", "missing.so", "no such file"}},
      {"conform --kernels {d}/missing.so --precision fp7", 2, {"unknown --precision 'fp7'"}},
      {"conform --kernels {r}", 2, {"--kernels", "dpcheck_comm_plugin", "--comm"}},
      {"conform --comm {r} --check 'property no_such_property'", 2, {"no_such_property"}},
      {"conform --comm {r} --no-properties --check 'property replicas_bitwise_synchronized'",
       2,
       {"--check 'property replicas_bitwise_synchronized'", "leaves out verify's properties"}},
      // diff: two inputs of one kind, each there and readable, traces well formed and of a known version.
      {"diff {d}/trace.jsonl {d}/missing.jsonl", 2, {"B", "missing.jsonl", "no such file"}},
      {"diff {d}/missing {d}/init", 2, {"A", "missing", "no such file"}},
      {"diff {d}/afile {d}/init", 2, {"afile", "neither a trace"}},
      {"diff {d}/fifo {d}/trace.jsonl", 2, {"fifo", "FIFO"}},
      {"diff {d}/x.npy {d}/x_nan.npy", 2, {"x.npy", "a single .npy file"}},
      {"diff {d}/init {d}/no_npy", 2, {"no_npy", "holds no .npy files"}},
      {"diff {d}/trace.jsonl {d}/init", 2, {"is a trace", "is a directory of .npy tensors"}},
      {"diff {d}/trace.jsonl {d}/trace_bad.jsonl", 2, {"trace_bad.jsonl:2", "not JSON"}},
      {"diff {d}/trace.jsonl {d}/trace_huge.jsonl", 2, {"trace_huge.jsonl:2", "1e400"}},
      {"diff {d}/trace_v2.jsonl {d}/trace.jsonl", 2, {"trace_v2.jsonl:1", "version 2"}},
      {"diff {d}/init {d}/init_fifo", 2, {"layers.1.bias.npy", "FIFO"}},
      {"diff {d}/init {d}/init --ulp -1", 2, {"--ulp", "-1"}},
      {"diff {d}/init {d}/init --ulp 1.5", 2, {"--ulp", "1.5"}},
      {"diff {d}/init {d}/init --rtol nan", 2, {"--rtol", "nan"}},
      {"diff {d}/init {d}/init --rtol -1e-6", 2, {"--rtol", "-1e-6"}},
      {"diff {d}/init {d}/init --ulp 1 --rtol 1e-6", 2, {"--ulp or --rtol, not both"}},
      {"diff {d}/trace.jsonl {d}/trace.jsonl --ulp 1", 2, {"--ulp", "traces compare digest by digest"}},
      {"diff {d}/init {d}/init --json /dev/full", 2, {"--json", "character device"}},
      {"diff {d}/trace.jsonl {d}/trace.jsonl --json {d}/fifo", 2, {"--json", "FIFO"}},
      {"diff {d}/init", 2, {"B"}},
      {"train --model 4,1 --trace {d}/fifo", 2, {"--trace", "FIFO"}},
      {"train --model 4,1 --trace {d}/afile/t.jsonl", 2, {"--trace", "not a directory"}},
      {"train --model 4,1 --check-gradient-every -1", 2, {"--check-gradient-every", "at least 0"}},
      {"train --model 4,1 --bundle-dir {d}/afile", 2, {"--bundle-dir", "a regular file, not a directory"}},
      {"replay {d}/missing", 2, {"missing", "not a directory"}},
      {"replay {d}/afile", 2, {"afile", "not a directory"}},
      {"replay {d}/init", 2, {"init", "not a repro bundle", "--step"}},
      {"replay {d}/init --step -1", 2, {"--step", "at least 0"}},
      {"replay {d}/init --step 0", 2, {"no checkpoint in", "init"}},
      {"replay {d}/badbundle", 2, {"badbundle", "manifest.json", "dpcheck_bundle", "missing"}},
      {"replay {d}/badbundle --step 3", 2, {"--step", "a bundle replays its failing step"}},
      {"replay {d}/badbundle --check-gradient-every -2", 2, {"badbundle"}},
      {"replay", 2, {"bundle"}},
      {"bench trace --steps 0", 2, {"--steps", "at least 1"}},
      {"bench scaling --world-size 0", 2, {"--world-size", "from 1 to 64"}},
      {"bench scaling --model 4,1 --batch 4 --world-size 1 --html {d}/fifo", 2, {"--html"}},
      {"bench allreduce --sizes 4K --ranks 2 --backends local --html /dev/full", 2, {"--html"}},
      {"bench trace --steps 1 --html {d}/nodir/t.html", 2, {"--html"}},
      {"bench step --engine cpu --html {d}/nodir/s.html", 2, {"--html"}},
      {"bench step --engine cpu --torch-script {d}/none.py", 2, {"--torch-script", "none.py", "no such file"}},
      {"bench step --engine cpu --torch-script {d}", 2, {"--torch-script", "not a regular file"}},
      {"train --model 4,1 --html /dev/full", 2, {"--html"}},
      {"train --model 4,1 --report {d}/nodir/r.json", 2, {"--report"}},
      {"bench scaling --world-size 65", 2, {"--world-size", "from 1 to 64"}},
      {"bench scaling --world-size 4 --batch 3", 2, {"--batch 3", "each of the 4 ranks"}},
      {"bench scaling --steps 0", 2, {"--steps", "at least 1"}},
      {"bench scaling --warmup -1", 2, {"--warmup"}},
      {"bench scaling --bucket-mb 0", 2, {"--bucket-mb", "above 0"}},
      {"bench scaling --bucket-mb inf", 2, {"--bucket-mb"}},
      {"bench scaling --model 4,0", 2, {"--model"}},
      {"bench scaling --batch 100000000000", 2, {"--batch"}},
      {"bench scaling --comm nccl", 2, {"nccl"}},
      {"bench scaling --comm {d}/missing.so", 2, {"missing.so"}},
      {"bench scaling --model 4,1 --batch 4 --world-size 1 --json /dev/full", 2, {"--json"}},
      {"bench scaling --model 4,1 --batch 4 --world-size 1 --json {d}/nodir/x.json", 2, {"--json"}},
      {"drift {d}/missing {d}/init", 2, {"missing", "not a directory"}},
      {"drift {d}/init {d}/init", 2, {"no checkpoint in", "init"}},
      {"drift {d}/init {d}/init --from -1", 2, {"--from", "at least 0"}},
      {"drift {d}/init", 2, {"b"}},
      // Records of a PyTorch job (dpcheck.torch's Monitor(record=DIR) and bundle_dir=DIR).
      {"replay {d}/rec", 2, {"rec is a record of every step", "--step"}},
      {"replay {d}/rec --step 5", 2, {"holds no step 5", "it holds 0"}},
      {"replay {d}/rec --step 0 --x {d}/x.npy", 2, {"--x does not apply", "a record of a PyTorch job"}},
      {"replay {d}/rec --step 0 --mutant allreduce-sum-not-mean", 2, {"--mutant does not apply"}},
      {"replay {d}/rec_bundle --step 1", 2, {"--step", "a bundle of step 0 alone"}},
      {"replay {d}/rec_v2 --step 0", 2, {"record.json", "another version of dpcheck.torch"}},
      {"replay {d}/rec_parts --step 0", 2, {"x.npy holds 8 examples", "parts hold 7"}},
      {"replay {d}/rec_nan --step 0", 2, {"params.npy", "element [1] is nan"}},
      {"replay {d}/rec_empty", 2, {"rec_empty", "holds no step"}},
      {"drift {d}/rec {d}/init", 2, {"init is not a record of dpcheck.torch", "--checkpoint-dir"}},
      {"drift {d}/rec {d}/rec_bundle", 2, {"rec_bundle is a bundle of one failed step"}},
      {"drift {d}/rec {d}/rec --engine cpu", 2, {"--engine does not apply to records"}},
      {"drift {d}/rec {d}/rec --from 3", 2, {"no step from 3"}},
      {"drift {d}/rec {d}/rec_wide", 2, {"record different models", "4,3,1", "5,3,1"}},
      {"bench trace --model 4,0", 2, {"--model"}},
      {"bench trace --batch 100000000000", 2, {"--batch"}},
      {"bench trace --json /dev/full", 2, {"--json", "character device"}},
      // Empty values: refused by name for every option of every subcommand, never read as the default.
      {"verify --seed '' --report {d}/r.json", 2, {"--seed is empty"}},
      {"train --model 4,1 --lr ''", 2, {"--lr is empty"}},
      {"train --model 4,1 --bucket-mb ''", 2, {"--bucket-mb is empty"}},
      {"train --model 4,1 --mutant ''", 2, {"--mutant is empty"}},
      {"train --model 4,1 --warmup-steps ''", 2, {"--warmup-steps is empty"}},
      {"train --model 4,1 --resume ''", 2, {"--resume is empty"}},
      {"train --model 4,1 --report ''", 2, {"--report is empty"}},
      {"train --model 4,1 --checkpoint-dir ' '", 2, {"--checkpoint-dir is empty"}},
      {"train --model '' ", 2, {"--model is empty"}},
      {"train --model 4,1 --precision '' --loss-scale ''", 2, {"is empty"}},
      {"grad --model 4,1 --batch 8 --x '' --y {d}/y.npy", 2, {"--x is empty"}},
      {"verify --cases 1 --kernels '' --report {d}/r.json", 2, {"--kernels is empty"}},
      {"verify --cases 1 --comm '' --report {d}/r.json", 2, {"--comm is empty"}},
      {"diff '' {d}/trace.jsonl", 2, {"argument A is empty"}},
      {"diff {d}/trace.jsonl {d}/trace.jsonl --json ''", 2, {"--json is empty"}},
      {"conform --comm {r} --check ''", 2, {"--check is empty"}},
      {"conform --comm {r} --world-size ''", 2, {"--world-size is empty"}},
      {"bench allreduce --sizes '' --ranks 1 --backends local", 2, {"--sizes is empty"}},
      {"bench allreduce --sizes 4K --ranks 1, --backends local", 2, {"rank count ''"}},
      {"bench step --models ''", 2, {"--models is empty"}},
      {"replay ''", 2, {"argument bundle is empty"}},
      {"drift {d}/init {d}/init --trace-a ''", 2, {"--trace-a is empty"}},
      // Control characters in a value, a path or a message are escaped: the message stays one line.
      {"train --model 4,1 --precision 'fp\n8'", 2, {"fp\\n8"}},
      {"grad --model 4,1 --x '{d}/no\nsuch.npy' --y {d}/y.npy", 2, {"no\\nsuch.npy"}},
      {"verify --cases 1 --comm '{d}/evil\n\033[2J.so'", 2, {"evil\\n\\x1b[2J.so"}},
      {"diff '{d}/a\rb' {d}/init", 2, {"a\\rb"}},
      // Whole numbers: decimal, within their type; never clamped, wrapped or read as hex or octal.
      {"train --model 4,1 --batch 9223372036854775808", 2, {"--batch", "9223372036854775808", "whole number"}},
      {"train --model 4,1 --warmup-steps 9223372036854775808", 2, {"--warmup-steps", "whole number"}},
      {"train --model 4,1 --batch -9223372036854775809", 2, {"--batch", "whole number"}},
      {"train --model 4,1 --batch 0x10", 2, {"--batch '0x10'", "decimal"}},
      {"train --model 4,1 --steps 010", 2, {"--steps '010'", "decimal"}},
      {"grad --model 4,1 --batch 8 --world-size 1e3", 2, {"--world-size"}},
      {"bench step --models 8,8@8:nan", 2, {"--models", "8,8@8:nan", "GOAL"}},
      {"bench step --models 8,8@8:-1", 2, {"--models", "GOAL"}},
      {"bench step --models 8,8@8:inf", 2, {"--models", "GOAL"}},
      {"bench step --models 8,8@8:0.5:9", 2, {"--models", "GOAL"}},
      {"bench step --models 8,8@8x", 2, {"--models", "positive whole batch"}},
      {"bench step --models 8,8@99999999999", 2, {"--models", "positive whole batch"}},
      {"conform --comm {r} --check 'allreduce float32 sum' --case count=4611686018427387904",
       2,
       {"--case", "count 4611686018427387904", "too big for this machine"}},
      // An output that is an input, directly or through a link, or another output: refused before any work.
      {"train --model 4,1 --x {d}/x.npy --y {d}/y.npy --batch 8 --trace {d}/x.npy", 2, {"--trace", "same file as --x"}},
      {"train --model 4,1 --x {d}/x.npy --y {d}/y.npy --batch 8 --report {d}/link-to-x.npy",
       2,
       {"--report", "same file as --x"}},
      {"diff {d}/trace.jsonl {d}/trace_v2.jsonl --json {d}/trace_v2.jsonl", 2, {"--json", "same file as argument B"}},
      {"diff {d}/trace.jsonl {d}/trace_v2.jsonl --json {d}/hard-trace.jsonl", 2, {"--json", "same file as argument B"}},
      {"verify --cases 1 --report {d}/r.json --junit {d}/r.json", 2, {"--report and --junit name the same file"}},
      {"drift {d}/init {d}/init --trace-a {d}/trace.jsonl --trace-b {d}/trace.jsonl", 2, {"no checkpoint"}},
      // Paths the system cannot follow: said with the option and the path, before any work.
      {"train --model 4,1 --checkpoint-dir {d}/dangling-dir",
       2,
       {"--checkpoint-dir", "symbolic link", "does not exist"}},
      {"verify --cases 1 --report {l}/loop-a", 2, {"--report", "loop-a", "too many levels of symbolic links"}},
      {"train --model 4,1 --trace {l}/loop-a", 2, {"--trace", "loop-a", "too many levels of symbolic links"}},
      {"train --model 4,1 --checkpoint-dir {l}/loop-a", 2, {"loop-a", "too many levels of symbolic links"}},
      {"diff {l}/loop-a {d}/init", 2, {"loop-a"}},
      {"verify --cases 1 --report {d}/" + std::string(5000, 'a'), 2, {"--report"}},
      {"train --model 4,1 --checkpoint-dir {d}/" + std::string(5000, 'c'), 2, {"--checkpoint-dir"}},
      // JSON nested past any stack, and lines longer than a trace's: refused by name, never a crash.
      {"diff {d}/trace.jsonl {d}/trace_deep.jsonl", 2, {"trace_deep.jsonl:2", "nested deeper than 64"}},
      {"diff {d}/trace_deep.jsonl {d}/trace.jsonl", 2, {"trace_deep.jsonl:2", "nested deeper than 64"}},
      {"train --model 4,1 --resume {d}/ckpt_deep", 2, {"ckpt_deep"}},
      {"replay {d}/bundle_deep", 2, {"bundle_deep", "nested deeper than 64"}},
      // plant-writes, the hidden ranks of audit_sees_every_write: the plan is read first, and nothing runs
      // outside the write audit (nor outside a launcher, nor in a directory the property did not prepare).
      {"plant-writes --plant 1:open-rdwr:abs:f", 2, {"--dir", "required"}},
      {"plant-writes --dir {d} --plant 1:open-rdwr:abs:kept.json", 2, {"plant-writes", "DPCHECK_AUDIT_LOG"}},
      {"plant-writes --dir {d} --plant 1:open-rdwr:abs", 2, {"--plant 1:open-rdwr:abs", "RANK:KIND:abs|rel:NAME"}},
      {"plant-writes --dir {d} --plant one:open-rdwr:abs:f", 2, {"--plant one:open-rdwr:abs:f", "the rank 'one'"}},
      {"plant-writes --dir {d} --plant 1:no-such-kind:abs:f", 2, {"unknown kind 'no-such-kind'", "open-rdwr"}},
      {"plant-writes --dir {d} --plant 1:open-rdwr:sideways:f", 2, {"'sideways' is neither abs nor rel"}},
      {"plant-writes --dir {d} --plant 1:open-rdwr:abs:../kept.json", 2, {"--plant", "inside the planted directory"}},
      {"plant-writes --dir {d} --plant 1:open-rdwr:abs:{d}/kept.json", 2, {"--plant", "inside the planted directory"}},
      {"grad --model 4,1 --batch 8 --mutant audit-rdwr-not-a-write",
       2,
       {"audit-rdwr-not-a-write", "audit_sees_every_write"}},
  };

  const fs::path d = dir_.path();
  const std::map<std::string, std::string> before = snapshot(d);
  ASSERT_TRUE(before.contains("kept.json") && before.contains("init/layers.0.weight.npy"));
  for (const Row& row : rows) {
    // {p}: the tests' plugins; {r}: the ring example, a plugin that loads.
    const std::string args =
        replace_all(replace_all(replace_all(replace_all(row.args, "{d}", d.string()), "{p}", DPCHECK_COMM_PLUGIN_DIR),
                                "{r}", DPCHECK_RING_PLUGIN),
                    "{l}", loops_path().string());
    if (row.memory_kib > 0 && kAddressSanitizer) {
      // AddressSanitizer reserves terabytes of address space for its shadow memory at start, which no
      // `ulimit -v` allows: the row runs in the other builds.
      std::printf("not under AddressSanitizer (ulimit -v): %s\n", args.c_str());
      continue;
    }
    std::string cmd = std::string(DPCHECK_BINARY) + " " + args;
    if (row.memory_kib > 0) cmd = "sh -c " + quoted("ulimit -v " + std::to_string(row.memory_kib) + " && exec " + cmd);
    const CommandResult r = run_command(cmd, kRowLimitS);
    EXPECT_EQ(r.status, row.status) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("dpcheck: error: ", 0), 0u) << args << "\n" << r.output;
    for (const std::string& w : row.words)
      EXPECT_NE(r.output.find(w), std::string::npos) << args << "\nlacks: " << w << "\n" << r.output;
    EXPECT_LT(r.seconds, 10.0) << args;
    EXPECT_EQ(snapshot(d), before) << args;
    EXPECT_TRUE(is_char_device("/dev/null")) << args;
    EXPECT_TRUE(is_char_device("/dev/full")) << args;
  }
}

// The report goes to the file the link names, whole, and the link stays a link to it; so for a link
// whose target does not exist yet.
TEST_F(BadInput, ASymlinkedReportIsWrittenThroughToItsTarget) {
  const fs::path d = dir_.path();
  fs::create_symlink("fresh.json", d / "dangling.json");
  const std::string cmd = std::string(DPCHECK_BINARY) +
                          " verify --cases 1 --property sampler_shards_disjoint --report " +
                          (d / "link.json").string() + " --junit " + (d / "dangling.json").string();
  const CommandResult r = run_command(cmd, 120);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));
  EXPECT_EQ(fs::read_symlink(d / "link.json"), d / "kept.json");
  const nlohmann::json report = nlohmann::json::parse(read_file(d / "kept.json"));
  EXPECT_TRUE(report["passed"].get<bool>());
  EXPECT_TRUE(fs::is_symlink(d / "dangling.json"));
  EXPECT_NE(read_file(d / "fresh.json").find("<testsuites>"), std::string::npos);
  // Nothing else appeared: no temporary file left beside either target.
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().rfind('.', 0), std::string::npos) << e.path();
}

// A learning rate that makes the loss overflow: train fails (exit 1) at the first loss that is not
// finite, naming the step, and every checkpoint it wrote holds finite parameters only.
TEST_F(BadInput, TrainStopsAtTheFirstLossThatIsNotFinite) {
  const fs::path ckpt = dir_.path() / "ckpt";
  const std::string cmd = std::string(DPCHECK_BINARY) + " train --model 4,1 --lr 1e30 --steps 5 --checkpoint-every 1 " +
                          "--checkpoint-dir " + ckpt.string() + " --keep 10 --bundle-dir " + dir_.path().string();
  const CommandResult r = run_command(cmd, 60);
  EXPECT_EQ(r.status, 1) << r.output;
  const std::size_t failed = r.output.find("FAILED: ");
  ASSERT_NE(failed, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not finite", failed), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step ", failed), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("all steps passed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step    4"), std::string::npos) << r.output;  // stopped before the end
  int checkpoints = 0;
  for (const auto& step : fs::directory_iterator(ckpt)) {
    ++checkpoints;
    for (const auto& f : fs::directory_iterator(step.path())) {
      if (f.path().extension() != ".npy") continue;
      for (float v : read_npy(f.path()).as_float32()) EXPECT_TRUE(std::isfinite(v)) << f.path();
    }
  }
  EXPECT_GE(checkpoints, 1);  // the steps before the overflow were checkpointed
}

// One line and the exit status, and nothing left in `dir` that was not there before.
void expect_one_line(const CommandResult& r, int status, const std::vector<std::string>& words,
                     const std::string& what) {
  EXPECT_EQ(r.status, status) << what << "\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << what << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("dpcheck: error: ", 0), 0u) << what << "\n" << r.output;
  for (const std::string& w : words)
    EXPECT_NE(r.output.find(w), std::string::npos) << what << "\nlacks: " << w << "\n" << r.output;
}

// Exactly one "dpcheck: error: " line, at the end, after what the command printed before it failed.
void expect_one_error_line(const CommandResult& r, int status, const std::vector<std::string>& words,
                           const std::string& what) {
  EXPECT_EQ(r.status, status) << what << "\n" << r.output;
  std::size_t lines = 0;
  for (std::size_t at = r.output.find("dpcheck: error: "); at != std::string::npos;
       at = r.output.find("dpcheck: error: ", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << what << "\n" << r.output;
  const std::size_t last = r.output.rfind("dpcheck: error: ");
  ASSERT_NE(last, std::string::npos) << what << "\n" << r.output;
  const std::string line = r.output.substr(last);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << what << "\n" << r.output;
  for (const std::string& w : words)
    EXPECT_NE(line.find(w), std::string::npos) << what << "\nlacks: " << w << "\n" << r.output;
}

// A plugin that faults (its call returns an error) stops verify as it stops train: exit 3, one line
// naming the plugin, the call and its message -- not a failing property (exit 1), which is for a
// plugin that computes wrong numbers.
TEST_F(BadInput, APluginFaultInVerifyIsARuntimeFault) {
  const CommandResult r =
      run_command(std::string(DPCHECK_BINARY) + " verify --cases 2 --kernels " + DPCHECK_KERNELS_FAILING, 120);
  expect_one_error_line(r, 3, {"plugin 'failing'", "linear_forward", "no workspace left"}, "verify --kernels failing");
  EXPECT_EQ(r.output.find("FAILED"), std::string::npos) << r.output;
}

// Inputs that need a real run's checkpoints: drift's traces must be regular files (/dev/zero never ends,
// a FIFO blocks), and a trace line longer than any dpcheck writes is refused before it is held whole.
TEST_F(BadInput, InputsThatNeverEndAreRefused) {
  const fs::path d = dir_.path();
  const std::string bin = DPCHECK_BINARY;
  const CommandResult made = run_command(
      bin + " train --model 4,1 --steps 2 --checkpoint-every 1 --keep 5 --checkpoint-dir " + (d / "ckpt").string(), 60);
  ASSERT_EQ(made.status, 0) << made.output;
  const std::string ckpt = (d / "ckpt").string();
  {
    std::ofstream long_line(d / "trace_long.jsonl", std::ios::binary);
    long_line << read_file(d / "trace.jsonl") << "[\"" << std::string((std::size_t{33} << 20), 'x') << "\"]\n";
  }
  const std::map<std::string, std::string> before = snapshot(d);
  const struct {
    std::string args;
    std::vector<std::string> words;
  } rows[] = {
      {"drift " + ckpt + " " + ckpt + " --trace-a /dev/zero", {"--trace-a /dev/zero", "character device"}},
      {"drift " + ckpt + " " + ckpt + " --trace-b /dev/full", {"--trace-b /dev/full", "character device"}},
      {"drift " + ckpt + " " + ckpt + " --trace-a " + (d / "fifo").string(), {"--trace-a", "FIFO"}},
      {"drift " + ckpt + " " + ckpt + " --trace-a " + (d / "missing").string(), {"--trace-a", "no such file"}},
      {"drift " + ckpt + " " + ckpt + " --trace-a " + (d / "trace_deep.jsonl").string(), {"--trace-a"}},
      {"diff " + (d / "trace.jsonl").string() + " " + (d / "trace_long.jsonl").string(),
       {"trace_long.jsonl:2", "longer than 32 MiB"}},
  };
  for (const auto& row : rows) {
    const CommandResult r = run_command(bin + " " + row.args, kRowLimitS);
    expect_one_line(r, 2, row.words, row.args);
    EXPECT_LT(r.seconds, 10.0) << row.args;
    EXPECT_EQ(snapshot(d), before) << row.args;
  }
}

// A write the system refuses midway (`ulimit -f`, as a full disk): the writer reports it naming the
// user's path (exit 3) -- not SIGXFSZ -- and leaves no temporary file or directory behind.
TEST_F(BadInput, AWriteRefusedMidwayLeavesNothingBehind) {
  const fs::path d = dir_.path();
  fs::create_directory(d / "out");
  const std::map<std::string, std::string> before = snapshot(d);
  for (const std::string& args : {"train --model 64,64 --steps 1 --checkpoint-dir " + (d / "out" / "ckpt").string(),
                                  "train --model 64,64 --steps 1 --keep 1 --checkpoint-every 1 --checkpoint-dir " +
                                      (d / "out" / "ckpt").string()}) {
    const CommandResult r =
        run_command("sh -c " + quoted("ulimit -f 4 && exec " + std::string(DPCHECK_BINARY) + " " + args), 60);
    EXPECT_EQ(r.status, 3) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("dpcheck: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("too large"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(".tmp"), std::string::npos) << r.output;
    for (const auto& e : fs::recursive_directory_iterator(d / "out"))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << args << ": left " << e.path();
    fs::remove_all(d / "out");
    fs::create_directory(d / "out");
  }
  EXPECT_EQ(snapshot(d), before);
}

// A plugin whose initializer crashes while it loads: one line naming the plugin being loaded, exit 3.
TEST_F(BadInput, APluginThatCrashesWhileLoadingIsNamed) {
  if (kAddressSanitizer) GTEST_SKIP() << "under AddressSanitizer its own report names the crash";
  const CommandResult r =
      run_command(std::string(DPCHECK_BINARY) + " verify --cases 1 --kernels " + DPCHECK_KERNELS_CRASH_ON_LOAD, 60);
  expect_one_line(r, 3, {"--kernels", "crash_on_load", "loading", "SIGSEGV"}, "crash on load");
}

// A repro bundle whose manifest names data files it then ignores, or a rank or example beyond the run's.
TEST_F(BadInput, ABundleOutsideItsRunIsRefused) {
  const fs::path d = dir_.path();
  const CommandResult made = run_command(std::string(DPCHECK_BINARY) +
                                             " train --model 4,1 --steps 5 --world-size 2 --lr 1e30 "
                                             "--bundle-dir " +
                                             d.string(),
                                         60);
  ASSERT_EQ(made.status, 1) << made.output;
  fs::path bundle;
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename().string().starts_with("dpcheck-bundle-")) bundle = e.path();
  ASSERT_FALSE(bundle.empty()) << made.output;
  const nlohmann::json manifest = nlohmann::json::parse(read_file(bundle / "manifest.json"));
  const nlohmann::json indices = nlohmann::json::parse(read_file(bundle / "indices.json"));
  const auto edited = [&](const std::string& name, const std::function<void(nlohmann::json&, nlohmann::json&)>& edit) {
    const fs::path copy = d / name;
    fs::copy(bundle, copy, fs::copy_options::recursive);
    nlohmann::json m = manifest, i = indices;
    edit(m, i);
    std::ofstream(copy / "manifest.json") << m.dump(2) << "\n";
    std::ofstream(copy / "indices.json") << i.dump() << "\n";
    return copy.string();
  };
  const struct {
    std::string path;
    std::vector<std::string> words;
  } rows[] = {
      {edited("missing-data",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["data"] = {{"x", (d / "gone-x.npy").string()},
                             {"y", (d / "gone-y.npy").string()},
                             {"x_xxh3", "0"},
                             {"y_xxh3", "0"}};
              }),
       {"gone-x.npy", "is gone"}},
      {edited("empty-data",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["data"] = {{"x", ""}, {"y", ""}, {"x_xxh3", ""}, {"y_xxh3", ""}};
              }),
       {"data", "empty path"}},
      {edited("both-data",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["data"] = {{"synthetic", true}, {"x", (d / "gone-x.npy").string()}};
              }),
       {"data", "one or the other"}},
      {edited("far-rank", [&](nlohmann::json& m, nlohmann::json&) { m["failure"]["rank"] = 1000000; }),
       {"failure.rank", "1000000"}},
      {edited("far-index", [&](nlohmann::json&, nlohmann::json& i) { i["ranks"][0][0] = 1000000000; }),
       {"indices.json", "1000000000"}},
      // The backend the run ran on (divergence/backend_record.hpp), damaged.
      {edited("backend-text", [&](nlohmann::json& m, nlohmann::json&) { m["backend"] = "gloo"; }),
       {"backend-text/manifest.json", "\"backend\" is \"gloo\", not an object"}},
      {edited("backend-no-path",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["backend"]["plugins"] = {{{"option", "--comm"}}};
              }),
       {"backend-no-path/manifest.json", "\"backend.plugins[0].path\" is missing"}},
      {edited("backend-abi",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["backend"]["plugins"] = {{{"option", "--comm"},
                                            {"path", "./libgloo.so"},
                                            {"resolved", "/x/libgloo.so"},
                                            {"xxh3", "0123456789abcdef"},
                                            {"name", "gloo ring"},
                                            {"version", nullptr},
                                            {"abi", "3"}}};
              }),
       {"backend-abi/manifest.json", "\"backend.plugins[0].abi\" is \"3\""}},
      {edited("backend-env",
              [&](nlohmann::json& m, nlohmann::json&) {
                m["backend"]["mpi_env"] = {{"prefixes", {"OMPI_MCA_coll"}}, {"set", {{"OMPI_MCA_coll; rm x", "1"}}}};
              }),
       {"backend-env/manifest.json", "backend.mpi_env.set", "not an environment variable"}},
  };
  for (const auto& row : rows) {
    const CommandResult r = run_command(std::string(DPCHECK_BINARY) + " replay " + row.path, kRowLimitS);
    expect_one_error_line(r, 2, row.words, row.path);
  }
}

// Processes of one job given different arguments: every rank stops with status 2 before any work,
// and rank 0 alone names the option and the ranks.
class BadInputMpi : public testing::Test {
 protected:
  void SetUp() override {
    if (!DPCHECK_HAS_MPI) GTEST_SKIP() << "this build has no MPI backend";
    if (::access(DPCHECK_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no MPI launcher at " << DPCHECK_MPIEXEC;
  }
  // Runs rank 1 with args1 and every other rank with args0 (through a wrapper script).
  CommandResult run_split(const std::string& args0, const std::string& args1) const {
    const fs::path script = dir_.path() / "ranks.sh";
    std::ofstream(script) << "#!/bin/sh\n"
                          << "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec " << DPCHECK_BINARY << " " << args1
                          << "; fi\n"
                          << "exec " << DPCHECK_BINARY << " " << args0 << "\n";
    return run_command(
        std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 3 sh " + script.string(), 60);
  }
  const ScratchDir dir_;
};

// mpirun adds its own lines about the job it ended; dpcheck's are those starting "dpcheck: error: ".
std::vector<std::string> error_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t end = output.find('\n'); end != std::string::npos; start = end + 1, end = output.find('\n', start))
    if (output.compare(start, 16, "dpcheck: error: ") == 0) lines.push_back(output.substr(start, end - start));
  return lines;
}

TEST_F(BadInputMpi, RanksThatDisagreeOnTheCommandLineAreRefusedNamingTheOption) {
  const struct {
    std::string args0, args1, words;
  } cases[] = {
      {"train --comm mpi --model 4,1 --batch 30", "train --comm mpi --model 4,1 --batch 32",
       "ranks disagree on the command line: --batch is 30 on rank 0 and 32 on rank 1"},
      {"verify --comm mpi --cases 2", "verify --comm mpi --cases=3",
       "ranks disagree on the command line: --cases is 2 on rank 0 and 3 on rank 1"},
      {"verify --comm mpi --property sampler_shards_disjoint",
       "verify --comm mpi --property replicas_bitwise_synchronized",
       "--property is sampler_shards_disjoint on rank 0 and replicas_bitwise_synchronized on rank 1"},
      {"grad --model 4,1 --batch 8", "grad --model 4,1 --batch 8 --seed 3", "--seed on rank 1"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_split(c.args0, c.args1);
    EXPECT_EQ(r.status, 2) << c.args1 << "\n" << r.output;
    const std::vector<std::string> lines = error_lines(r.output);
    ASSERT_EQ(lines.size(), 1u) << c.args1 << "\n" << r.output;
    EXPECT_NE(lines[0].find(c.words), std::string::npos) << lines[0];
    EXPECT_LT(r.seconds, 30.0) << r.output;
  }
}

// One rank's own input is bad (its data file is missing or holds a NaN, its plugin is missing): every
// rank stops at once, and rank 0 names the rank and the reason in one line.
TEST_F(BadInputMpi, OneRanksBadInputStopsEveryRankAtOnce) {
  const fs::path d = dir_.path();
  for (int r = 0; r < 3; ++r) fs::create_directories(d / ("rank" + std::to_string(r)));
  const std::vector<std::int64_t> x_shape{8, 4}, y_shape{8, 1};
  std::vector<float> x(32, 0.5f), y(8, 0.25f);
  for (int r : {0, 2}) {
    write_npy(d / ("rank" + std::to_string(r)) / "x.npy", x_shape, std::span<const float>(x));
    write_npy(d / ("rank" + std::to_string(r)) / "y.npy", y_shape, std::span<const float>(y));
  }
  const struct {
    std::string args, words;
    bool rank1_nan;
  } cases[] = {
      {"train --comm mpi --model 4,1 --batch 8 --x x.npy --y y.npy --timeout 60", "rank 1: x.npy", false},
      {"train --comm mpi --model 4,1 --batch 8 --x x.npy --y y.npy --timeout 60", "rank 1: x.npy", true},
      {"train --comm mpi --model 4,1 --batch 8 --kernels ./k.so --timeout 60", "rank 1: --kernels ./k.so: no such file",
       false},
  };
  fs::copy_file(DPCHECK_KERNELS_NAIVE, d / "rank0" / "k.so");
  fs::copy_file(DPCHECK_KERNELS_NAIVE, d / "rank2" / "k.so");
  for (const auto& c : cases) {
    fs::remove(d / "rank1" / "x.npy");
    fs::remove(d / "rank1" / "y.npy");
    if (c.rank1_nan) {
      std::vector<float> bad = x;
      bad[3] = std::numeric_limits<float>::quiet_NaN();
      write_npy(d / "rank1" / "x.npy", x_shape, std::span<const float>(bad));
      write_npy(d / "rank1" / "y.npy", y_shape, std::span<const float>(y));
    }
    const fs::path script = d / "ranks.sh";
    std::ofstream(script) << "#!/bin/sh\ncd " << d.string() << "/rank$OMPI_COMM_WORLD_RANK || exit 9\nexec "
                          << DPCHECK_BINARY << " " << c.args << "\n";
    const CommandResult r = run_command(
        std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 3 sh " + script.string(), 60);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    const std::vector<std::string> lines = error_lines(r.output);
    ASSERT_EQ(lines.size(), 1u) << c.args << "\n" << r.output;
    EXPECT_NE(lines[0].find(c.words), std::string::npos) << lines[0];
    if (c.rank1_nan) {
      EXPECT_NE(lines[0].find("nan"), std::string::npos) << lines[0];
    }
    EXPECT_LT(r.seconds, 20.0) << r.output;  // not the 60 s timeout
  }
  // replay reads its checkpoint directory on every rank: rank 1's is missing.
  for (int r : {0, 2}) {
    const CommandResult made = run_command(
        "cd " + (d / ("rank" + std::to_string(r))).string() + " && " + DPCHECK_BINARY +
            " train --model 4,1 --batch 8 --world-size 3 --steps 2 --checkpoint-every 1 --checkpoint-dir ckpt",
        60);
    ASSERT_EQ(made.status, 0) << made.output;
  }
  const fs::path script = d / "replay.sh";
  std::ofstream(script) << "#!/bin/sh\ncd " << d.string() << "/rank$OMPI_COMM_WORLD_RANK || exit 9\nexec "
                        << DPCHECK_BINARY << " replay ckpt --step 1 --comm mpi --timeout 60\n";
  const CommandResult r = run_command(
      std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 3 sh " + script.string(), 60);
  EXPECT_EQ(r.status, 2) << r.output;
  const std::vector<std::string> lines = error_lines(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output;
  EXPECT_NE(lines[0].find("rank 1: ckpt is not a directory"), std::string::npos) << lines[0];
  EXPECT_LT(r.seconds, 20.0) << r.output;
}

// Under a launcher, a communicator whose ranks are threads is refused, naming the one of its engine that
// runs under a launcher; and the launcher's processes are the world size.
TEST_F(BadInputMpi, ALauncherWantsACommunicatorWhoseRanksAreProcesses) {
  const struct {
    std::string args, words;
  } cases[] = {
      {"verify --cases 1", "started by a launcher with 3 processes but --comm is local: add --comm mpi"},
      {"train --model 4,1 --comm local", "started by a launcher with 3 processes but --comm is local: add --comm mpi"},
      {"verify --engine cuda --cases 1",
       "started by a launcher with 3 processes but --comm is cuda-local: add --comm nccl"},
      {"verify --comm mpi --world-size 2 --cases 1", "--world-size 2 disagrees with the launcher's 3 processes"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_split(c.args, c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    const std::vector<std::string> lines = error_lines(r.output);
    ASSERT_EQ(lines.size(), 1u) << c.args << "\n" << r.output;
    EXPECT_NE(lines[0].find(c.words), std::string::npos) << lines[0];
    EXPECT_LT(r.seconds, 30.0) << r.output;
  }
}

}  // namespace
}  // namespace dpcheck
