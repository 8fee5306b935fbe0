// Planted writes: file calls made on purpose by a chosen rank, so that the write audit itself can be
// checked (the property audit_sees_every_write, properties/audit_writes.cpp). The property prepares a
// scratch directory, launches `dpcheck plant-writes` (a hidden subcommand, src/cli/cmd_plant_writes.cpp)
// under mpirun and the audit, and each rank makes exactly the calls of the plan that name its rank; then
// the property compares the audit's records with the plan.
//
// Nothing here runs in a training run: the subcommand is hidden, refuses to run outside an audited MPI
// job, and writes only below a directory that carries the marker file prepare_plants() made.
#pragma once

#include <array>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dpcheck::audit {

// One kind of call the audit claims to see, or (writes == false) a read that it must not report.
struct PlantKind {
  std::string_view name;  // "open-rdwr", "fopen-r+", "read-mmap-private", ...
  std::string_view what;  // "in-place rewrite: open(O_RDWR), one byte written"
  bool writes;            // false: a read-only control
  bool needs_file;        // the file exists before the call (prepare_plants makes it)
  // The C library functions the record may name (the 64-bit and fortified twins of one call), and a
  // word its flags must hold ("O_RDWR", the fopen mode "r+", "length=0"), "" for none.
  std::array<std::string_view, 4> calls;
  std::string_view flag;
};

std::span<const PlantKind> plant_kinds();
const PlantKind* find_plant_kind(std::string_view name);  // nullptr when unknown

// One planted call: rank `rank` makes a call of `kind` on `name`, a path relative to the planted
// directory ("3-a b" or "sub/7-x"). `relative`: the call names the file relative to the working
// directory, which the ranks set to the planted directory; else by its absolute path. The *at calls
// name it relative to the working directory (AT_FDCWD) or to a descriptor of the planted directory.
struct Plant {
  int rank = 1;
  std::string kind;
  bool relative = false;
  std::string name;
};

// "RANK:KIND:abs|rel:NAME", the form `dpcheck plant-writes --plant` takes.
std::string plant_text(const Plant& plant);
// UsageError naming the argument when it is not of that form, names an unknown kind or a name that is
// empty, absolute, or steps out of the directory ("..").
Plant parse_plant(std::string_view text);

// The paths a plant's call writes or reads, absolute below `dir`: the one its record names first
// (rename's and link's source, every other call's only path).
std::filesystem::path plant_path(const std::filesystem::path& dir, const Plant& plant);

// Makes `dir` ready for the plants: its marker file, the subdirectories the names need, and the file of
// every plant whose kind needs one (a few bytes, so that a read or a map has something to read). Error
// if a file cannot be made.
void prepare_plants(const std::filesystem::path& dir, std::span<const Plant> plants);

// Makes the calls of the plants whose rank is `rank`, in order, from the planted directory as the working
// directory (the caller's is restored), and checks that each did what it was meant to (a failed call is
// an Error naming the plant and the errno). UsageError if `dir` has no
// marker file, so that a stray command line can write nothing anywhere else.
void make_plants(const std::filesystem::path& dir, std::span<const Plant> plants, int rank);

// The marker's name inside a planted directory.
inline constexpr std::string_view plant_marker = ".dpcheck-planted-writes";

}  // namespace dpcheck::audit
