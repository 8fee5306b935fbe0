// Element types that cross dpcheck's interfaces. Counts are always in elements; bytes follow from here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dpcheck {

enum class DType : std::uint8_t { f32, f64, i32, i64, u64, u8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u64: return 8;
    case DType::u8: return 1;
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
  }
  return "?";
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<std::uint64_t>() { return DType::u64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }

// Where a buffer lives. Host backends and engines take host pointers; GPU ones take device pointers.
enum class MemorySpace : std::uint8_t { host, device };

}  // namespace dpcheck
