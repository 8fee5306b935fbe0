// The names of dpcheck's built-in engines and communicator backends, written once. The engine and
// backend tables (src/target/backends.cpp) give them to their rows, each implementation names itself by them
// (Engine::name, Communicator::backend), and the mutant table says with them which engine a mutant
// breaks. Everything else takes a name from the tables (find_engine, backend_for, default_backend, ...).
#pragma once

#include <string_view>

namespace dpcheck::builtin {

// Engines.
inline constexpr std::string_view cpu = "cpu";
inline constexpr std::string_view cuda = "cuda";

// Communicator backends.
inline constexpr std::string_view local = "local";
inline constexpr std::string_view mpi = "mpi";
inline constexpr std::string_view mpi_native = "mpi-native";
inline constexpr std::string_view cuda_local = "cuda-local";
inline constexpr std::string_view nccl = "nccl";
inline constexpr std::string_view simulated = "simulated";

}  // namespace dpcheck::builtin
