// Element types that cross dpcheck's interfaces. Counts are always in elements; bytes follow from here.
// bf16 (bfloat16) and f16 (IEEE binary16) buffers hold the formats' 16-bit patterns, a std::uint16_t
// each (Bf16 and Fp16 below name them for the typed helpers); src/low_precision.hpp converts them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dpcheck {

// New dtypes go at the end: the values cross the mpi backend's wire and the CUDA plugin's contract.
enum class DType : std::uint8_t { f32, f64, i32, i64, u64, u8, bf16, f16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u64: return 8;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u64: return "uint64";
    case DType::u8: return "uint8";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}

// The floating dtypes: those that avg is for.
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
constexpr bool is_16bit_float(DType t) { return t == DType::bf16 || t == DType::f16; }

// One element of a bf16 or f16 buffer: its bit pattern, with the dtype in the type, so that
// Communicator::allreduce(std::span<Bf16>, op) and the like name it.
struct Bf16 {
  std::uint16_t bits = 0;
  bool operator==(const Bf16&) const = default;
};
struct Fp16 {
  std::uint16_t bits = 0;
  bool operator==(const Fp16&) const = default;
};
static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<std::uint64_t>() { return DType::u64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<Bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<Fp16>() { return DType::f16; }

// Where a buffer lives. Host backends and engines take host pointers; GPU ones take device pointers.
enum class MemorySpace : std::uint8_t { host, device };

}  // namespace dpcheck
