// Tests for src/io/npy: round trips of every dtype and shape dpcheck stores, byte-for-byte agreement
// with the files np.save writes (embedded below, so no NumPy is needed to run them), and every
// rejection, each checked for a message that names the file and the problem.
#include "src/io/npy.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "src/error.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

// ---- files as NumPy writes them -----------------------------------------------------------------
// Each header is what numpy/lib/format.py's _write_array_header produces: the dict with sorted
// keys, then (NumPy 2.x) spaces up to 21 digits for the first extent, then spaces to a 64-byte
// boundary and a newline. The data are the little-endian elements.

// np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3)) with NumPy 2.x.
// 128 header bytes (20 spaces of room for growth, 38 of padding), then 24 of data.
constexpr char kNumpyF32_2x3[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x76\x00"  // version 1.0, header length 118
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                          \n"
    "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40"
    "\x00\x00\x80\x40\x00\x00\xa0\x40";

// np.save(f, np.float64(-2.5)): a 0-d array.
// 128 header bytes (62 spaces of padding), then 8 of data.
constexpr char kNumpyF64Scalar[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x76\x00"  // version 1.0, header length 118
    "{'descr': '<f8', 'fortran_order': False, 'shape': (), }"
    "                                                              \n"
    "\x00\x00\x00\x00\x00\x00\x04\xc0";

// np.save(f, np.arange(-2, 3)).
// 128 header bytes (20 spaces of room for growth, 40 of padding), then 40 of data.
constexpr char kNumpyI64_5[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x76\x00"  // version 1.0, header length 118
    "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }"
    "                                                            \n"
    "\xfe\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
    "\x02\x00\x00\x00\x00\x00\x00\x00";

// np.save(f, np.zeros((0, 4), dtype=np.float32)): no data at all.
// 128 header bytes (20 spaces of room for growth, 38 of padding), then 0 of data.
constexpr char kNumpyF32_0x4[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x76\x00"  // version 1.0, header length 118
    "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }"
    "                                                          \n";

// np.save(f, np.full((1,) * 15, 0.5)): the room NumPy 2.x leaves for the growth axis
// pushes this header past one 64-byte block.
// 192 header bytes (20 spaces of room for growth, 63 of padding), then 8 of data.
constexpr char kNumpyF64Ones15[] =
    "\x93NUMPY"
    "\x01\x00"
    "\xb6\x00"  // version 1.0, header length 182
    "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
    "1, 1, 1, 1), }"
    "                                                                "
    "                   \n"
    "\x00\x00\x00\x00\x00\x00\xe0\x3f";

// The same array from a NumPy 1.x that leaves no room for growth: one block.
// 128 header bytes (19 spaces of padding), then 8 of data.
constexpr char kNumpy1F64Ones15[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x76\x00"  // version 1.0, header length 118
    "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
    "1, 1, 1, 1), }"
    "                   \n"
    "\x00\x00\x00\x00\x00\x00\xe0\x3f";

// Older NumPy 1.x aligned the data to 16 bytes only.
// 80 header bytes (10 spaces of padding), then 24 of data.
constexpr char kNumpyAlign16F32_2x3[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x46\x00"  // version 1.0, header length 70
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "          \n"
    "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40"
    "\x00\x00\x80\x40\x00\x00\xa0\x40";

// NumPy on Python 2 wrote the shape with long integers: np.arange(6.0).reshape(2, 3).
// 80 header bytes (8 spaces of padding), then 48 of data.
constexpr char kPython2F64_2x3[] =
    "\x93NUMPY"
    "\x01\x00"
    "\x46\x00"  // version 1.0, header length 70
    "{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }"
    "        \n"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xf0\x3f"
    "\x00\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x08\x40"
    "\x00\x00\x00\x00\x00\x00\x10\x40\x00\x00\x00\x00\x00\x00\x14\x40";

// np.lib.format.write_array(f, np.arange(6, dtype=np.float32).reshape(2, 3),
//                            version=(2, 0))
// 128 header bytes (20 spaces of room for growth, 36 of padding), then 24 of data.
constexpr char kVersion2F32_2x3[] =
    "\x93NUMPY"
    "\x02\x00"
    "\x74\x00\x00\x00"  // version 2.0, header length 116
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                        \n"
    "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40"
    "\x00\x00\x80\x40\x00\x00\xa0\x40";

// The same with version=(3, 0): a utf-8 header, otherwise as 2.0.
// 128 header bytes (20 spaces of room for growth, 36 of padding), then 24 of data.
constexpr char kVersion3F32_2x3[] =
    "\x93NUMPY"
    "\x03\x00"
    "\x74\x00\x00\x00"  // version 3.0, header length 116
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                        \n"
    "\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40"
    "\x00\x00\x80\x40\x00\x00\xa0\x40";

template <std::size_t N> std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);  // the literal's own terminating NUL is not part of the file
}

// A .npy file around an arbitrary header dict, padded the way NumPy pads; for the hand-made
// headers.
std::string make_npy(std::string_view dict, std::string_view data = {}, int major = 1) {
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  std::string header(dict);
  const std::size_t unpadded = 8 + length_bytes + header.size() + 1;
  header.append(64 - unpadded % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < length_bytes; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return out + header + std::string(data);
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string s(values.size() * 4, '\0');
  std::memcpy(s.data(), std::data(values), s.size());
  return s;
}

std::vector<float> iota_f32(int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(i);
  return v;
}

// Each test gets a fresh directory, removed afterwards, so that "nothing is left behind" can be
// checked by listing it.
class NpyTest : public ::testing::Test {
 protected:
  fs::path put(const std::string& name, const std::string& contents) const {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << contents;
    return p;
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  // read_npy(file) must be rejected with a UsageError "<file>: ...<problem>...".
  void expect_rejected(const fs::path& p, const std::string& problem) const {
    const std::string msg = message_of<UsageError>([&] { read_npy(p); });
    EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << "message does not start with the file: " << msg;
    EXPECT_NE(msg.find(problem), std::string::npos) << "message lacks \"" << problem << "\": " << msg;
  }

  const ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
};

// ---- NumPy's own files parse --------------------------------------------------------------------

TEST_F(NpyTest, ReadsNumpyFloat32Matrix) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kNumpyF32_2x3)));
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.as_float32(), iota_f32(6));
}

TEST_F(NpyTest, ReadsNumpyFloat64Scalar) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kNumpyF64Scalar)));
  EXPECT_EQ(a.dtype, DType::f64);
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(a.as_float64(), std::vector<double>{-2.5});
}

TEST_F(NpyTest, ReadsNumpyInt64Vector) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kNumpyI64_5)));
  EXPECT_EQ(a.dtype, DType::i64);
  EXPECT_EQ(a.shape, std::vector<std::int64_t>{5});
  EXPECT_EQ(a.as_int64(), (std::vector<std::int64_t>{-2, -1, 0, 1, 2}));
}

TEST_F(NpyTest, ReadsNumpyZeroSizeArray) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kNumpyF32_0x4)));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(a.count(), 0);
  EXPECT_TRUE(a.data.empty());
}

TEST_F(NpyTest, ReadsNumpyHeadersWithAndWithoutGrowthRoom) {
  for (const std::string& file : {bytes_of(kNumpyF64Ones15), bytes_of(kNumpy1F64Ones15)}) {
    const NpyArray a = read_npy(put("a.npy", file));
    EXPECT_EQ(a.shape, std::vector<std::int64_t>(15, 1));
    EXPECT_EQ(a.as_float64(), std::vector<double>{0.5});
  }
}

TEST_F(NpyTest, ReadsOldNumpySixteenByteAlignment) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kNumpyAlign16F32_2x3)));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.as_float32(), iota_f32(6));
}

TEST_F(NpyTest, ReadsPython2LongIntegerShape) {
  const NpyArray a = read_npy(put("a.npy", bytes_of(kPython2F64_2x3)));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.as_float64(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST_F(NpyTest, ReadsFormatVersions2And3) {
  for (const std::string& file : {bytes_of(kVersion2F32_2x3), bytes_of(kVersion3F32_2x3)}) {
    const NpyArray a = read_npy(put("a.npy", file));
    EXPECT_EQ(a.dtype, DType::f32);
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(a.as_float32(), iota_f32(6));
  }
}

// ---- what we write is what NumPy writes ---------------------------------------------------------

TEST_F(NpyTest, WritesTheSameBytesAsNumpy) {
  const fs::path p = dir_ / "a.npy";
  const std::vector<float> f = iota_f32(6);
  write_npy(p, std::vector<std::int64_t>{2, 3}, std::span<const float>(f));
  EXPECT_EQ(read_file(p), bytes_of(kNumpyF32_2x3));

  const double scalar = -2.5;
  write_npy(p, std::span<const std::int64_t>{}, std::span<const double>(&scalar, 1));
  EXPECT_EQ(read_file(p), bytes_of(kNumpyF64Scalar));

  const std::vector<std::int64_t> ints{-2, -1, 0, 1, 2};
  write_npy(p, std::vector<std::int64_t>{5}, std::span<const std::int64_t>(ints));
  EXPECT_EQ(read_file(p), bytes_of(kNumpyI64_5));

  write_npy(p, std::vector<std::int64_t>{0, 4}, std::span<const float>{});
  EXPECT_EQ(read_file(p), bytes_of(kNumpyF32_0x4));

  const double half = 0.5;
  write_npy(p, std::vector<std::int64_t>(15, 1), std::span<const double>(&half, 1));
  EXPECT_EQ(read_file(p), bytes_of(kNumpyF64Ones15));
}

// The data must start on a 64-byte boundary whatever the header's length. The shapes below make the
// dict 64 consecutive lengths long, so every remainder modulo 64 is met once, the exact-fit one
// included.
TEST_F(NpyTest, DataOffsetIsAMultipleOf64ForEveryHeaderLength) {
  const fs::path p = dir_ / "a.npy";
  std::vector<bool> remainder_seen(64, false);
  for (int extra = 0; extra < 64; ++extra) {
    // A leading 0 keeps the data empty (and the first extent's digits change nothing: NumPy's
    // growth room absorbs them). Each further extent adds ", " and its digits: 3 to 21 characters.
    std::vector<std::int64_t> shape{0};
    for (int left = extra + 3; left > 0;) {
      int chars = std::min(left, 21);
      if (left - chars > 0 && left - chars < 3) chars = left - 3;
      std::int64_t extent = 1;
      for (int d = 0; d < chars - 3; ++d) extent *= 10;
      shape.push_back(extent);
      left -= chars;
    }
    write_npy(p, DType::f32, shape, nullptr);
    const std::string file = read_file(p);
    ASSERT_GE(file.size(), 10u);
    const std::size_t header_len =
        static_cast<unsigned char>(file[8]) | static_cast<std::size_t>(static_cast<unsigned char>(file[9])) << 8;
    const std::string header = file.substr(10);
    SCOPED_TRACE(header);
    EXPECT_EQ(file.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    EXPECT_EQ(header.size(), header_len);
    EXPECT_EQ(file.size() % 64, 0u);
    const std::size_t dict_end = header.find('}') + 1;
    EXPECT_EQ(header.find_first_not_of(' ', dict_end), header.size() - 1);
    EXPECT_EQ(header.back(), '\n');
    remainder_seen[dict_end % 64] = true;
    EXPECT_EQ(read_npy(p).shape, shape);
  }
  EXPECT_EQ(std::count(remainder_seen.begin(), remainder_seen.end(), true), 64);
}

// Like np.save, a header too long for version 1.0's 16-bit length goes to version 2.0.
TEST_F(NpyTest, HeaderTooLongForVersion1IsWrittenAsVersion2) {
  const fs::path p = dir_ / "a.npy";
  const std::vector<std::int64_t> shape(30000, 1);
  const float one = 1.0f;
  write_npy(p, shape, std::span<const float>(&one, 1));
  const std::string file = read_file(p);
  ASSERT_GE(file.size(), 12u);
  EXPECT_EQ(file[6], '\x02');
  EXPECT_EQ((file.size() - 4) % 64, 0u);
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.as_float32(), std::vector<float>{1.0f});
}

// ---- round trips --------------------------------------------------------------------------------

struct RoundTripCase {
  DType dtype;
  std::vector<std::int64_t> shape;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " (";
  for (std::int64_t d : c.shape) *os << d << ",";
  *os << ")";
}

std::string round_trip_name(const ::testing::TestParamInfo<RoundTripCase>& info) {
  std::string name(dtype_name(info.param.dtype));
  if (info.param.shape.empty()) return name + "_scalar";
  for (std::size_t i = 0; i < info.param.shape.size(); ++i) {
    name += (i == 0 ? "_" : "x") + std::to_string(info.param.shape[i]);
  }
  return name;
}

class NpyRoundTrip : public NpyTest, public ::testing::WithParamInterface<RoundTripCase> {};

// Elements that a careless conversion would change: signed zero, infinities, a NaN with a payload,
// subnormals, the extremes. They are compared bit for bit.
template <class T> T nan_with_payload() {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::bit_cast<T>(std::bit_cast<Bits>(std::numeric_limits<T>::quiet_NaN()) | Bits{1});
}

template <class T> std::vector<T> awkward_values(std::int64_t n) {
  using L = std::numeric_limits<T>;
  std::vector<T> v;
  if constexpr (std::is_floating_point_v<T>) {
    v = {T(-0.0),         L::infinity(), -L::infinity(), nan_with_payload<T>(),
         L::denorm_min(), L::max(),      L::lowest(),    T(1) / T(3)};
  } else {
    v = {L::min(), L::max(), -1, 0, 1};
  }
  const std::size_t special = v.size();
  v.resize(static_cast<std::size_t>(n));
  for (std::size_t i = special; i < v.size(); ++i) {
    v[i] = static_cast<T>(static_cast<double>(i) * 0.37 - 11);
  }
  return v;
}

template <class T> void check_round_trip(const fs::path& p, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  const std::vector<T> values = awkward_values<T>(n);

  // Through the untyped overload ...
  write_npy(p, dtype_of<T>(), shape, values.data());
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.dtype, dtype_of<T>());
  EXPECT_EQ(a.shape, shape);
  EXPECT_EQ(a.count(), n);
  ASSERT_EQ(a.data.size(), values.size() * sizeof(T));
  EXPECT_TRUE(values.empty() || std::memcmp(a.data.data(), values.data(), a.data.size()) == 0);

  // ... and the typed one, read back through the matching conversion.
  write_npy(p, shape, std::span<const T>(values));
  a = read_npy_expect(p, shape);
  std::vector<T> back;
  if constexpr (std::is_same_v<T, float>) back = a.as_float32();
  if constexpr (std::is_same_v<T, double>) back = a.as_float64();
  if constexpr (std::is_same_v<T, std::int64_t>) back = a.as_int64();
  ASSERT_EQ(back.size(), values.size());
  EXPECT_TRUE(values.empty() || std::memcmp(back.data(), values.data(), back.size() * sizeof(T)) == 0);
}

TEST_P(NpyRoundTrip, WritesAndReadsBackBitForBit) {
  const fs::path p = dir_ / "t.npy";
  switch (GetParam().dtype) {
    case DType::f32: check_round_trip<float>(p, GetParam().shape); break;
    case DType::f64: check_round_trip<double>(p, GetParam().shape); break;
    case DType::i64: check_round_trip<std::int64_t>(p, GetParam().shape); break;
    default: FAIL() << "not a .npy dtype";
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"t.npy"});
}

std::vector<RoundTripCase> round_trip_cases() {
  const std::vector<std::vector<std::int64_t>> shapes = {{},  {1},    {7},    {3, 5},    {2, 3, 4},
                                                         {0}, {0, 4}, {4, 0}, {2, 0, 3}, {1, 1, 1, 1, 9}};
  std::vector<RoundTripCase> cases;
  for (DType t : {DType::f32, DType::f64, DType::i64}) {
    for (const auto& s : shapes) cases.push_back({t, s});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Npy, NpyRoundTrip, ::testing::ValuesIn(round_trip_cases()), round_trip_name);

// ---- headers NumPy would read, written differently ----------------------------------------------

TEST_F(NpyTest, ParsesHeaderVariants) {
  const std::string data = f32_bytes({1, 2, 3, 4, 5, 6});
  for (const char* dict : {
           "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
           "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
           "{'descr':'<f4','fortran_order':False,'shape':(2,3)}",
           "{ 'descr' :\t'<f4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 3 , ) , }",
           "{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3), }",
           "{'descr': '|f4', 'fortran_order': False, 'shape': (2, 3), }",
           "{'descr': 'f4', 'fortran_order': False, 'shape': (+2, 3), }",
       }) {
    SCOPED_TRACE(dict);
    const NpyArray a = read_npy(put("a.npy", make_npy(dict, data)));
    EXPECT_EQ(a.dtype, DType::f32);
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(a.as_float32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
}

TEST_F(NpyTest, ParsesUnpaddedHeaderWithoutNewline) {
  const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}";
  std::string file = "\x93NUMPY\x01";
  file += '\0';
  file += static_cast<char>(dict.size());
  file += '\0';
  const double x = 7.25;
  file += dict + std::string(reinterpret_cast<const char*>(&x), sizeof x);
  EXPECT_EQ(read_npy(put("a.npy", file)).as_float64(), std::vector<double>{7.25});
}

// ---- rejections ---------------------------------------------------------------------------------

struct RejectCase {
  const char* name;
  std::string file;
  const char* problem;  // what the message must say
};

void PrintTo(const RejectCase& c, std::ostream* os) { *os << c.name; }

class NpyReject : public NpyTest, public ::testing::WithParamInterface<RejectCase> {};

TEST_P(NpyReject, NamesFileAndProblem) { expect_rejected(put("x.npy", GetParam().file), GetParam().problem); }

std::string with_descr(const char* descr) {
  return make_npy(std::string("{'descr': ") + descr + ", 'fortran_order': False, 'shape': (2,), }",
                  std::string(16, '\0'));
}

std::vector<RejectCase> reject_cases() {
  const std::string good = bytes_of(kNumpyF32_2x3);
  std::string v2_huge_header = bytes_of(kVersion2F32_2x3);
  v2_huge_header[11] = '\x40';  // header length 0x40000074: far past the end of the file
  std::string version4 = good;
  version4[6] = '\x04';
  return {
      {"Int32", with_descr("'<i4'"), "unsupported dtype '<i4'"},
      {"Float16", with_descr("'<f2'"), "unsupported dtype '<f2'"},
      {"Uint64", with_descr("'<u8'"), "unsupported dtype '<u8'"},
      {"Bool", with_descr("'|b1'"), "unsupported dtype '|b1'"},
      {"Object", with_descr("'|O'"), "unsupported dtype '|O'"},
      {"BigEndianFloat32", with_descr("'>f4'"), "big-endian dtype '>f4' is not supported"},
      {"BigEndianInt64", with_descr("'>i8'"), "big-endian dtype '>i8' is not supported"},
      {"Structured", with_descr("[('a', '<f4'), ('b', '<f4')]"), "structured dtypes"},
      {"FortranOrder", make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::string(24, '\0')),
       "Fortran order is not supported; save with np.ascontiguousarray"},
      {"BadMagic", "\x93NUMPZ" + good.substr(6), "bad magic"},
      {"TextFile", "shape,descr\n2,3\n", "bad magic"},
      {"Empty", "", "truncated header"},
      {"CutInPrefix", good.substr(0, 9), "truncated header"},
      {"CutInHeader", good.substr(0, 60), "truncated header"},
      {"HeaderLengthPastEnd", v2_huge_header, "truncated header"},
      {"DataShort", good.substr(0, good.size() - 4),
       "data is truncated: shape (2, 3) of float32 needs 24 bytes of data but the file has 20"},
      {"DataLong", good + std::string(4, '\0'), "data is longer than the shape says"},
      {"NegativeDim", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }"),
       "negative dimension -3 in shape"},
      {"Version4", version4, "unsupported .npy format version 4.0"},
      {"MissingShape", make_npy("{'descr': '<f4', 'fortran_order': False}"), "the header has no 'shape'"},
      {"ExtraKey", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", std::string(4, '\0')),
       "unexpected key 'x'"},
      {"DuplicateKey", make_npy("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': ()}"),
       "key 'descr' appears twice"},
      {"FortranOrderNotBool", make_npy("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}"),
       "'fortran_order' is not True or False"},
      {"ShapeList", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}"), "'shape' is not a tuple"},
      {"ShapeParenthesizedInt", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (5)}"),
       "'shape' is not a tuple"},
      {"ShapeFloat", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}"), "malformed header"},
      {"UnclosedDict", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), "), "malformed header"},
      {"NotADict", make_npy("['descr', '<f4']"), "malformed header: expected '{'"},
      {"HugeInteger", make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}"),
       "does not fit in 64 bits"},
      {"DeeplyNested", make_npy("{'descr': " + std::string(100000, '[') + ", 'fortran_order': False, 'shape': ()}"),
       "nested too deeply"},
      {"ShapeOverflows", make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"),
       "is too large"},
  };
}

std::string reject_name(const ::testing::TestParamInfo<RejectCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Npy, NpyReject, ::testing::ValuesIn(reject_cases()), reject_name);

TEST_F(NpyTest, RejectsMissingFile) { expect_rejected(dir_ / "absent.npy", "no such file"); }

TEST_F(NpyTest, RejectsDirectory) {
  fs::create_directory(dir_ / "d.npy");
  expect_rejected(dir_ / "d.npy", "is a directory");
}

// A FIFO would block open(2) until a writer came, forever if none does: it is refused at once, by type.
TEST_F(NpyTest, RejectsFifoWithoutBlockingAndOtherSpecialFiles) {
  const fs::path fifo = dir_ / "x.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const auto start = std::chrono::steady_clock::now();
  expect_rejected(fifo, "is a FIFO, not a regular .npy file");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  expect_rejected("/dev/zero", "is a character device, not a regular .npy file");
}

// ---- finite values ------------------------------------------------------------------------------

TEST_F(NpyTest, FiniteFloat32PassesFiniteValuesThrough) {
  const fs::path p = dir_ / "x.npy";
  const std::vector<double> v{0.5, -1e38, 3.4e38, 1e-45};
  write_npy(p, std::vector<std::int64_t>{2, 2}, std::span<const double>(v));
  const std::vector<float> f = read_npy(p).as_finite_float32(p);
  ASSERT_EQ(f.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(f[i], static_cast<float>(v[i])) << i;
}

// NaN, infinities and float64 values beyond float32's range are named with the file, the index in
// the array's shape and the value.
TEST_F(NpyTest, FiniteFloat32NamesTheFileTheElementAndTheValue) {
  const double inf = std::numeric_limits<double>::infinity();
  const struct {
    std::vector<double> values;
    bool as_float32;
    std::string words;
  } cases[] = {
      {{1, 2, 3, std::numeric_limits<double>::quiet_NaN(), 5, 6},
       true,
       "element [1, 0] is nan; the values must be finite"},
      {{1, 2, 3, 4, inf, 6}, false, "element [1, 1] is inf; the values must be finite"},
      {{1, -inf, 3, 4, 5, 6}, true, "element [0, 1] is -inf"},
      {{1, 2, 1e300, 4, 5, 6}, false, "element [0, 2] is 1e+300, beyond float32's range"},
      {{1, 2, 3, 4, 5, -5e38}, false, "element [1, 2] is -5e+38, beyond float32's range"},
  };
  for (const auto& c : cases) {
    const fs::path p = dir_ / "bad.npy";
    const std::vector<std::int64_t> shape{2, 3};
    if (c.as_float32) {
      const std::vector<float> f(c.values.begin(), c.values.end());
      write_npy(p, shape, std::span<const float>(f));
    } else {
      write_npy(p, shape, std::span<const double>(c.values));
    }
    const NpyArray a = read_npy(p);
    const std::string msg = message_of<UsageError>([&] { (void)a.as_finite_float32(p); });
    EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.words), std::string::npos) << msg;
  }
}

// ---- expected shapes ----------------------------------------------------------------------------

TEST_F(NpyTest, ExpectShapeAcceptsMatchAndWildcard) {
  const fs::path p = dir_ / "x.npy";
  write_npy(p, DType::f32, std::vector<std::int64_t>{256, 4}, std::vector<float>(1024).data());
  EXPECT_EQ(read_npy_expect(p, std::vector<std::int64_t>{256, 4}).count(), 1024);
  EXPECT_EQ(read_npy_expect(p, std::vector<std::int64_t>{-1, 4}).count(), 1024);
  EXPECT_EQ(read_npy_expect(p, std::vector<std::int64_t>{-1, -1}).count(), 1024);
}

TEST_F(NpyTest, ExpectShapeNamesFileExpectedAndFound) {
  const fs::path p = dir_ / "x.npy";
  write_npy(p, DType::f32, std::vector<std::int64_t>{256, 3}, std::vector<float>(768).data());
  EXPECT_EQ(message_of<UsageError>([&] {
              read_npy_expect(p, std::vector<std::int64_t>{256, 4});
            }),
            p.string() + ": expected shape (256, 4), found (256, 3)");
  EXPECT_EQ(message_of<UsageError>([&] {
              read_npy_expect(p, std::vector<std::int64_t>{-1, 4});
            }),
            p.string() + ": expected shape (any, 4), found (256, 3)");
  EXPECT_EQ(message_of<UsageError>([&] { read_npy_expect(p, std::vector<std::int64_t>{768}); }),
            p.string() + ": expected shape (768,), found (256, 3)");
  EXPECT_EQ(message_of<UsageError>([&] { read_npy_expect(p, std::span<const std::int64_t>{}); }),
            p.string() + ": expected shape (), found (256, 3)");
}

// ---- NpyArray -----------------------------------------------------------------------------------

TEST(NpyArray, CountAndShapeString) {
  NpyArray a;
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(a.shape_string(), "()");
  a.shape = {5};
  EXPECT_EQ(a.count(), 5);
  EXPECT_EQ(a.shape_string(), "(5,)");
  a.shape = {256, 4};
  EXPECT_EQ(a.count(), 1024);
  EXPECT_EQ(a.shape_string(), "(256, 4)");
  a.shape = {0, 4};
  EXPECT_EQ(a.count(), 0);
}

NpyArray array_of(DType t, std::vector<std::int64_t> shape, const void* data, std::size_t bytes) {
  NpyArray a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.data.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + bytes);
  return a;
}

TEST(NpyArray, Float64ToFloat32RoundsOnceToNearest) {
  // 1 + 2^-24 + 2^-52 lies just above the midpoint of two floats: rounding to nearest gives the
  // upper one, truncation the lower.
  const double x[] = {1.0 + 0x1p-24 + 0x1p-52, 0.1, -1e300, 1e-50};
  const NpyArray a = array_of(DType::f64, {4}, x, sizeof x);
  const std::vector<float> f = a.as_float32();
  EXPECT_EQ(f[0], 1.0f + 0x1p-23f);
  EXPECT_EQ(f[1], 0.1f);
  EXPECT_EQ(f[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(f[3], 0.0f);
  EXPECT_EQ(a.as_float64(), std::vector<double>(std::begin(x), std::end(x)));
}

TEST(NpyArray, Float32ToFloat64IsExact) {
  const float x[] = {0.1f, -3.0f, std::numeric_limits<float>::denorm_min()};
  const NpyArray a = array_of(DType::f32, {3}, x, sizeof x);
  const std::vector<double> d = a.as_float64();
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(d[i], static_cast<double>(x[i]));
}

TEST(NpyArray, RejectsConversionsAcrossIntegerAndFloat) {
  const std::int64_t i[] = {1, 2};
  const float f[] = {1, 2};
  const NpyArray ai = array_of(DType::i64, {2}, i, sizeof i);
  const NpyArray af = array_of(DType::f32, {2}, f, sizeof f);
  EXPECT_NE(message_of<UsageError>([&] {
              (void)ai.as_float32();
            }).find("cannot convert a int64 array of shape (2,) to float32"),
            std::string::npos);
  EXPECT_NE(message_of<UsageError>([&] { (void)ai.as_float64(); }).find("to float64"), std::string::npos);
  EXPECT_NE(message_of<UsageError>([&] { (void)af.as_int64(); }).find("float32 array"), std::string::npos);
  EXPECT_EQ(ai.as_int64(), (std::vector<std::int64_t>{1, 2}));
}

TEST(NpyArray, RejectsDataThatDoesNotMatchShape) {
  const float f[] = {1, 2, 3};
  const NpyArray a = array_of(DType::f32, {2, 2}, f, sizeof f);
  EXPECT_NE(message_of<UsageError>([&] { (void)a.as_float32(); }).find("does not match"), std::string::npos);
}

// ---- failed writes leave nothing behind ---------------------------------------------------------

TEST_F(NpyTest, WriteIntoMissingDirectoryThrowsAndLeavesNothing) {
  const fs::path p = dir_ / "missing" / "x.npy";
  const float f[] = {1, 2};
  const std::string msg =
      message_of<Error>([&] { write_npy(p, std::vector<std::int64_t>{2}, std::span<const float>(f)); });
  EXPECT_EQ(msg.rfind(p.string() + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  EXPECT_TRUE(listing().empty());
}

// The rename itself fails here (the target is a directory), after the temporary file was written:
// the temporary file must go.
TEST_F(NpyTest, FailedRenameRemovesTemporaryFile) {
  fs::create_directory(dir_ / "x.npy");
  const float f[] = {1, 2};
  const std::string msg =
      message_of<Error>([&] { write_npy(dir_ / "x.npy", std::vector<std::int64_t>{2}, std::span<const float>(f)); });
  EXPECT_NE(msg.find((dir_ / "x.npy").string() + ": cannot replace it"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(EISDIR)), std::string::npos) << msg;
  EXPECT_EQ(listing(), std::vector<std::string>{"x.npy"});
}

TEST_F(NpyTest, WriteIntoReadOnlyDirectoryLeavesOldFileIntact) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  const fs::path p = dir_ / "x.npy";
  const float old_values[] = {1, 2};
  write_npy(p, std::vector<std::int64_t>{2}, std::span<const float>(old_values));
  fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::remove);
  const float new_values[] = {3, 4, 5};
  const std::string msg =
      message_of<Error>([&] { write_npy(p, std::vector<std::int64_t>{3}, std::span<const float>(new_values)); });
  fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::add);
  EXPECT_NE(msg.find(std::strerror(EACCES)), std::string::npos) << msg;
  EXPECT_EQ(read_npy(p).as_float32(), (std::vector<float>{1, 2}));
  EXPECT_EQ(listing(), std::vector<std::string>{"x.npy"});
}

TEST_F(NpyTest, WriteRejectsBadArgumentsAndCreatesNothing) {
  const fs::path p = dir_ / "x.npy";
  const float f[] = {1, 2, 3, 4, 5};
  EXPECT_NE(message_of<UsageError>([&] {
              write_npy(p, std::vector<std::int64_t>{2, 3}, std::span<const float>(f));
            }).find("shape (2, 3) holds 6 elements but 5 were given"),
            std::string::npos);
  EXPECT_NE(message_of<UsageError>([&] {
              write_npy(p, DType::i32, std::vector<std::int64_t>{2}, f);
            }).find("cannot write dtype int32"),
            std::string::npos);
  EXPECT_NE(message_of<UsageError>([&] {
              write_npy(p, DType::f32, std::vector<std::int64_t>{2, -1}, f);
            }).find("a dimension is negative"),
            std::string::npos);
  EXPECT_NE(message_of<UsageError>([&] {
              write_npy(dir_ / "", DType::f32, std::vector<std::int64_t>{1}, f);
            }).find("not a file name"),
            std::string::npos);
  EXPECT_TRUE(listing().empty());
}

TEST_F(NpyTest, OverwriteReplacesTheWholeFile) {
  const fs::path p = dir_ / "x.npy";
  const std::vector<double> big(1000, 1.5);
  write_npy(p, std::vector<std::int64_t>{1000}, std::span<const double>(big));
  const double small[] = {2.5, 3.5};
  write_npy(p, std::vector<std::int64_t>{2}, std::span<const double>(small));
  EXPECT_EQ(read_npy(p).as_float64(), (std::vector<double>{2.5, 3.5}));
  EXPECT_EQ(listing(), std::vector<std::string>{"x.npy"});
}

// Writers racing on one path while a reader polls it: the reader only ever sees a whole file (every
// element equals the first extent), and no temporary file survives.
TEST_F(NpyTest, ConcurrentWritersNeverExposeAPartialFile) {
  const fs::path p = dir_ / "x.npy";
  auto write_version = [&](std::int64_t k) {
    const std::vector<std::int64_t> v(static_cast<std::size_t>(k * 64), k);
    write_npy(p, std::vector<std::int64_t>{k, 64}, std::span<const std::int64_t>(v));
  };
  write_version(1);
  std::atomic<bool> done{false};
  std::atomic<int> bad_reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      try {
        const NpyArray a = read_npy(p);
        const std::vector<std::int64_t> v = a.as_int64();
        if (a.shape.size() != 2 || a.shape[1] != 64 ||
            std::any_of(v.begin(), v.end(), [&](std::int64_t x) { return x != a.shape[0]; })) {
          ++bad_reads;
        }
      } catch (const Error&) {
        ++bad_reads;
      }
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 20; ++i) write_version(1 + (w * 20 + i) % 17);
    });
  }
  for (auto& t : writers) t.join();
  done = true;
  reader.join();
  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(listing(), std::vector<std::string>{"x.npy"});
}

// Element indices read as NumPy's arr[3, 1]: the last axis varies fastest.
TEST(IndexText, COrderMultiIndex) {
  const std::vector<std::int64_t> matrix{4, 3}, cube{2, 3, 5}, vector{7}, scalar{};
  EXPECT_EQ(index_text(matrix, 0), "[0, 0]");
  EXPECT_EQ(index_text(matrix, 10), "[3, 1]");
  EXPECT_EQ(index_text(cube, 29), "[1, 2, 4]");
  EXPECT_EQ(index_text(vector, 6), "[6]");
  EXPECT_EQ(index_text(scalar, 0), "[]");
}

}  // namespace
}  // namespace dpcheck
