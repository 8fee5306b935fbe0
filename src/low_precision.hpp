// The low-precision formats of mixed-precision training: bfloat16 (8 significant bits, float32's
// exponent range) and IEEE binary16 "fp16" (11 significant bits, normal from 2^-14 to 65504). Each
// conversion from float32 rounds to nearest, ties to even, as cuBLAS, NCCL and PyTorch do; a NaN stays
// a (quiet) NaN and a value beyond the format's range becomes an infinity of its sign. Written out
// bit by bit rather than through a compiler intrinsic, so that every build (any x86-64, no F16C) and
// every plugin gets the same bits.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "src/dtype.hpp"

namespace dpcheck {

// --precision: the format a matrix product's inputs are rounded to (autocast: accumulation, the
// activations, the losses, the master weights and the optimizer state stay float32).
enum class Precision : std::uint8_t { fp32, bf16, fp16 };

std::string_view precision_name(Precision p);      // "fp32", "bf16", "fp16"
Precision parse_precision(std::string_view name);  // those names; else UsageError naming --precision

// Unit roundoff of the format: 2^-24 (float32), 2^-8 (bf16), 2^-11 (fp16).
constexpr double precision_unit_roundoff(Precision p) {
  return p == Precision::bf16 ? 0x1p-8 : p == Precision::fp16 ? 0x1p-11 : 0x1p-24;
}

constexpr std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
  // significand steps the exponent, up to infinity.
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

constexpr std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));  // NaN
  if (ax >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // 65536 and above: infinity
  if (ax < 0x38800000u) {
    // Below 2^-14 the result is a multiple of 2^-24: v * 2^24 (exact) rounded to an integer, ties to
    // even. A result of 0x400 is the smallest normal, which is also its encoding.
    const float scaled = std::bit_cast<float>(ax) * 0x1p24f;
    auto m = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  // Normal: rebias the exponent (127 to 15) and round the 23-bit significand to 10 bits; a carry past
  // 65504 gives 0x7C00, infinity.
  const std::uint32_t r = ax - 0x38000000u;
  return static_cast<std::uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}

constexpr float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;  // zero or subnormal, exact
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// f rounded to the format and back: the float32 value a product sees of an input in that format.
constexpr float round_to_precision(float f, Precision p) {
  switch (p) {
    case Precision::bf16: return bf16_bits_to_float(float_to_bf16_bits(f));
    case Precision::fp16: return fp16_bits_to_float(float_to_fp16_bits(f));
    case Precision::fp32: return f;
  }
  return f;
}

// The same conversions by element type (Bf16, Fp16 of src/dtype.hpp), for code templated on it.
template <class T> constexpr bool is_16bit_v = std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>;

template <class H>
requires is_16bit_v<H>
constexpr float widen16(H h) {
  if constexpr (std::is_same_v<H, Bf16>) return bf16_bits_to_float(h.bits);
  else return fp16_bits_to_float(h.bits);
}

template <class H>
requires is_16bit_v<H>
constexpr H narrow16(float f) {
  if constexpr (std::is_same_v<H, Bf16>) return H{float_to_bf16_bits(f)};
  else return H{float_to_fp16_bits(f)};
}

}  // namespace dpcheck
