// NumPy .npy reading and writing. The format is NumPy's own (numpy/lib/format.py): the magic
// "\x93NUMPY", a version, a little-endian header length, a Python dict literal padded with spaces
// and a newline, then the raw elements. Only what dpcheck stores is accepted -- float32, float64
// and int64, little-endian, C order -- and every rejection says which file and what is wrong with
// it, because these files usually come from someone else's PyTorch or NumPy script.
#include "src/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

#include "src/error.hpp"
#include "src/io/files.hpp"

namespace dpcheck {

// Elements are kept as the file's raw little-endian bytes and converted with memcpy; a big-endian
// host would need byte swaps in the conversions and in write_npy.
static_assert(std::endian::native == std::endian::little, "npy.cpp assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kAlign = 64;  // NumPy's ARRAY_ALIGN: data starts at a multiple of 64 bytes
// NumPy leaves room in the header for the growth axis's extent to reach 21 digits, so that a file
// can be appended to in place; writing the same spaces keeps our files byte-identical to np.save's.
constexpr std::size_t kGrowthAxisMaxDigits = 21;

std::string errno_text(int err) { return std::generic_category().message(err); }

[[noreturn]] void fail(const std::filesystem::path& path, std::string_view problem) {
  throw UsageError(path.string() + ": " + std::string(problem));
}

std::string shape_to_string(std::span<const std::int64_t> shape, bool wildcard = false) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += (wildcard && shape[i] == -1) ? std::string("any") : std::to_string(shape[i]);
  }
  // Python's spelling of a 1-tuple, so that the text matches what NumPy prints for arr.shape.
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// The element count of shape, or nullopt if a dimension is negative or the product overflows.
std::optional<std::int64_t> checked_count(std::span<const std::int64_t> shape) {
  for (std::int64_t d : shape) {
    if (d < 0) return std::nullopt;
  }
  // Any zero extent makes the product 0, however large the other extents are.
  for (std::int64_t d : shape) {
    if (d == 0) return 0;
  }
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > std::numeric_limits<std::int64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// ---- the header dict ----------------------------------------------------------------------------

// The subset of Python literals that .npy headers use: strings, ints, True/False/None, and
// tuples/lists of them (a structured dtype's descr is a list of tuples). Parsed far enough to
// reject such headers with a clear message, not to interpret them.
struct PyValue {
  enum class Kind { string, integer, boolean, none, tuple, list };
  Kind kind = Kind::none;
  std::string text;
  std::int64_t integer = 0;
  bool boolean = false;
  std::vector<PyValue> items;
};

class HeaderParser {
 public:
  HeaderParser(const std::filesystem::path& path, std::string_view text) : path_(path), s_(text) {}

  std::vector<std::pair<std::string, PyValue>> parse_dict() {
    std::vector<std::pair<std::string, PyValue>> entries;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      PyValue key = parse_value();
      if (key.kind != PyValue::Kind::string) error("a key is not a string");
      skip_space();
      expect(':');
      PyValue value = parse_value();
      for (const auto& [k, v] : entries) {
        if (k == key.text) error("key '" + key.text + "' appears twice");
      }
      entries.emplace_back(std::move(key.text), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') error("expected ',' or '}'");
    }
    ++pos_;
    skip_space();
    if (pos_ != s_.size()) error("unexpected text after the closing '}'");
    return entries;
  }

  [[noreturn]] void error(const std::string& what) const {
    // Show the header itself (trailing padding trimmed): it is short, and usually makes the
    // problem obvious at a glance.
    std::string_view shown = s_;
    while (!shown.empty() && is_space(shown.back())) shown.remove_suffix(1);
    constexpr std::size_t kMaxShown = 200;
    std::string excerpt(shown.substr(0, kMaxShown));
    if (shown.size() > kMaxShown) excerpt += "...";
    fail(path_, "malformed header: " + what + " at offset " + std::to_string(pos_) + " in \"" + excerpt + "\"");
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_ident(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_'; }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }

  PyValue parse_value() {
    skip_space();
    const char c = peek();
    if (c == '\'' || c == '"') return parse_string();
    if (c == '(' || c == '[') return parse_sequence();
    if (is_digit(c) || c == '-' || c == '+') return parse_integer();
    if (is_ident(c)) {
      const std::size_t start = pos_;
      while (pos_ < s_.size() && is_ident(s_[pos_])) ++pos_;
      const std::string_view word = s_.substr(start, pos_ - start);
      PyValue v;
      if (word == "True" || word == "False") {
        v.kind = PyValue::Kind::boolean;
        v.boolean = word == "True";
        return v;
      }
      if (word == "None") return v;
      pos_ = start;
      error("unexpected name '" + std::string(word) + "'");
    }
    if (c == '\0') error("unexpected end of header");
    error(std::string("unexpected character '") + c + "'");
  }

  PyValue parse_string() {
    const char quote = s_[pos_++];
    PyValue v;
    v.kind = PyValue::Kind::string;
    for (;;) {
      if (pos_ >= s_.size()) error("unterminated string");
      const char c = s_[pos_++];
      if (c == quote) break;
      // Escapes never occur in the descriptors dpcheck accepts; keeping the escaped character is
      // enough to find the end of the string and reject the header by its content.
      if (c == '\\') {
        if (pos_ >= s_.size()) error("unterminated string");
        v.text += s_[pos_++];
        continue;
      }
      v.text += c;
    }
    return v;
  }

  PyValue parse_integer() {
    PyValue v;
    v.kind = PyValue::Kind::integer;
    bool negative = false;
    if (peek() == '-' || peek() == '+') {
      negative = peek() == '-';
      ++pos_;
      skip_space();
    }
    if (!is_digit(peek())) error("expected a digit");
    // Accumulate as a negative number so that INT64_MIN parses; the sign is applied at the end.
    std::int64_t n = 0;
    while (is_digit(peek())) {
      const int digit = s_[pos_] - '0';
      if (n < (std::numeric_limits<std::int64_t>::min() + digit) / 10) {
        error("integer does not fit in 64 bits");
      }
      n = n * 10 - digit;
      ++pos_;
    }
    // Python 2 wrote long integers as 2L; NumPy still reads such headers (_filter_header).
    if (peek() == 'L' || peek() == 'l') ++pos_;
    if (is_ident(peek())) error("malformed integer");
    if (!negative) {
      if (n == std::numeric_limits<std::int64_t>::min()) error("integer does not fit in 64 bits");
      n = -n;
    }
    v.integer = n;
    return v;
  }

  PyValue parse_sequence() {
    // A hostile header of nested brackets must not exhaust the stack; real ones nest two deep.
    constexpr int kMaxDepth = 32;
    if (++depth_ > kMaxDepth) error("brackets nested too deeply");
    const char open = s_[pos_++];
    const char close = open == '(' ? ')' : ']';
    PyValue v;
    v.kind = open == '(' ? PyValue::Kind::tuple : PyValue::Kind::list;
    bool saw_comma = false;
    for (;;) {
      skip_space();
      if (peek() == close) break;
      v.items.push_back(parse_value());
      skip_space();
      if (peek() == ',') {
        ++pos_;
        saw_comma = true;
        continue;
      }
      if (peek() != close) error(std::string("expected ',' or '") + close + "'");
    }
    ++pos_;
    --depth_;
    // In Python "(5)" is the integer 5, not a tuple; "(5,)" is the tuple.
    if (open == '(' && v.items.size() == 1 && !saw_comma) return std::move(v.items.front());
    return v;
  }

  const std::filesystem::path& path_;
  std::string_view s_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

DType parse_descr(const std::filesystem::path& path, const PyValue& descr) {
  if (descr.kind == PyValue::Kind::list) {
    fail(path,
         "structured dtypes (a list of fields in 'descr') are not supported; dpcheck reads "
         "float32 ('<f4'), float64 ('<f8') and int64 ('<i8')");
  }
  if (descr.kind != PyValue::Kind::string) fail(path, "'descr' in the header is not a string");
  std::string_view d = descr.text;
  // '<' little-endian; '=' native, which is little-endian here; '|' "not applicable", which NumPy
  // itself reads as native; no mark at all is also native.
  char order = '=';
  if (!d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '=' || d[0] == '|')) {
    order = d[0];
    d.remove_prefix(1);
  }
  std::optional<DType> t;
  if (d == "f4") t = DType::f32;
  if (d == "f8") t = DType::f64;
  if (d == "i8") t = DType::i64;
  if (!t) {
    fail(path,
         "unsupported dtype '" + descr.text + "'; dpcheck reads float32 ('<f4'), float64 ('<f8') and int64 ('<i8')");
  }
  if (order == '>') {
    fail(path,
         "big-endian dtype '" + descr.text + "' is not supported; convert with arr.astype('<" + std::string(d) + "')");
  }
  return *t;
}

struct Header {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
};

Header parse_header(const std::filesystem::path& path, std::string_view text) {
  HeaderParser parser(path, text);
  const auto entries = parser.parse_dict();
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : entries) {
    if (key == "descr") {
      descr = &value;
    } else if (key == "fortran_order") {
      fortran = &value;
    } else if (key == "shape") {
      shape = &value;
    } else {
      // NumPy rejects any key beyond these three; so do we, rather than guess what it means.
      fail(path, "unexpected key '" + key + "' in the header");
    }
  }
  if (!descr) fail(path, "the header has no 'descr'");
  if (!fortran) fail(path, "the header has no 'fortran_order'");
  if (!shape) fail(path, "the header has no 'shape'");

  Header h;
  h.dtype = parse_descr(path, *descr);
  if (fortran->kind != PyValue::Kind::boolean) fail(path, "'fortran_order' is not True or False");
  if (fortran->boolean) {
    fail(path, "Fortran order is not supported; save with np.ascontiguousarray");
  }
  if (shape->kind != PyValue::Kind::tuple) fail(path, "'shape' is not a tuple");
  for (const PyValue& dim : shape->items) {
    if (dim.kind != PyValue::Kind::integer) {
      fail(path, "'shape' holds something other than integers");
    }
    if (dim.integer < 0) {
      fail(path, "negative dimension " + std::to_string(dim.integer) + " in shape");
    }
    h.shape.push_back(dim.integer);
  }
  return h;
}

// ---- file I/O -----------------------------------------------------------------------------------

// Reads up to n bytes, fewer only at end of file.
std::size_t read_fully(const std::filesystem::path& path, int fd, void* buf, std::size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, p + done, n - done);
    if (r < 0) {
      const int err = errno;  // captured before building the message can disturb it
      if (err == EINTR) continue;
      throw Error(path.string() + ": read failed: " + errno_text(err));
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

std::uint32_t little_endian_u32(const unsigned char* p, std::size_t bytes) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}

std::string_view descr_of(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i64: return "<i8";
    default: return {};
  }
}

// The bytes before the data, exactly as NumPy's _write_array_header lays them out: version 1.0
// unless the header needs more than 1.0's 16-bit length, in which case 2.0, as np.save does.
std::string make_header(DType dtype, std::span<const std::int64_t> shape) {
  std::string dict = "{'descr': '" + std::string(descr_of(dtype)) +
                     "', 'fortran_order': False, 'shape': " + shape_to_string(shape) + ", }";
  if (!shape.empty()) {
    const std::size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  for (const std::size_t length_bytes : {std::size_t{2}, std::size_t{4}}) {
    const std::size_t prefix = kMagic.size() + 2 + length_bytes;
    const std::size_t unpadded = prefix + dict.size() + 1;  // + the final newline
    // NumPy pads by a full 64 when already aligned; matching it keeps the bytes identical.
    const std::size_t pad = kAlign - unpadded % kAlign;
    const std::size_t header_len = dict.size() + pad + 1;
    if (length_bytes == 2 && header_len > 0xFFFF) continue;
    std::string out(kMagic);
    out += static_cast<char>(length_bytes == 2 ? 1 : 2);
    out += '\0';
    for (std::size_t i = 0; i < length_bytes; ++i) {
      out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
    }
    out += dict;
    out.append(pad, ' ');
    out += '\n';
    return out;
  }
  throw UsageError("write_npy: a shape of " + std::to_string(shape.size()) +
                   " dimensions does not fit in a .npy header");
}

template <class T>
void write_typed(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const T> data) {
  const auto n = checked_count(shape);
  if (n && static_cast<std::uint64_t>(*n) != data.size()) {
    fail(path, "cannot write: shape " + shape_to_string(shape) + " holds " + std::to_string(*n) + " elements but " +
                   std::to_string(data.size()) + " were given");
  }
  write_npy(path, dtype_of<T>(), shape, data.data());
}

void check_consistent(const NpyArray& a) {
  const std::size_t size = dtype_size(a.dtype);
  const auto n = checked_count(a.shape);
  if (!n || a.data.size() != static_cast<std::size_t>(*n) * size) {
    throw UsageError("NpyArray: shape " + a.shape_string() + " of " + std::string(dtype_name(a.dtype)) +
                     " does not match its " + std::to_string(a.data.size()) + " bytes of data");
  }
}

template <class To, class From> std::vector<To> convert(const NpyArray& a) {
  std::vector<To> out(a.data.size() / sizeof(From));
  for (std::size_t i = 0; i < out.size(); ++i) {
    From v;
    std::memcpy(&v, a.data.data() + i * sizeof(From), sizeof(From));
    out[i] = static_cast<To>(v);
  }
  return out;
}

[[noreturn]] void bad_conversion(const NpyArray& a, std::string_view to) {
  throw UsageError("cannot convert a " + std::string(dtype_name(a.dtype)) + " array of shape " + a.shape_string() +
                   " to " + std::string(to));
}

}  // namespace

// ---- NpyArray -----------------------------------------------------------------------------------

std::int64_t NpyArray::count() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string NpyArray::shape_string() const { return shape_to_string(shape); }

std::string shape_text(std::span<const std::int64_t> shape) { return shape_to_string(shape); }

std::string index_text(std::span<const std::int64_t> shape, std::size_t flat) {
  std::vector<std::size_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % static_cast<std::size_t>(shape[d]);
    flat /= static_cast<std::size_t>(shape[d]);
  }
  std::string out = "[";
  for (std::size_t d = 0; d < index.size(); ++d) out += (d ? ", " : "") + std::to_string(index[d]);
  return out + "]";
}

std::vector<float> NpyArray::as_float32() const {
  check_consistent(*this);
  if (dtype == DType::f32) return convert<float, float>(*this);
  // static_cast from double rounds to nearest (the default rounding mode): one rounding, as
  // promised.
  if (dtype == DType::f64) return convert<float, double>(*this);
  bad_conversion(*this, "float32");
}

std::vector<float> NpyArray::as_finite_float32(const std::filesystem::path& path) const {
  std::vector<float> out = as_float32();
  const auto bad = std::find_if(out.begin(), out.end(), [](float v) { return !std::isfinite(v); });
  if (bad == out.end()) return out;
  const auto i = static_cast<std::size_t>(bad - out.begin());
  double original = *bad;
  if (dtype == DType::f64) std::memcpy(&original, data.data() + i * sizeof(double), sizeof(double));
  const std::string where = "element " + index_text(shape, i);
  char value[40];
  std::snprintf(value, sizeof value, "%.9g", original);
  if (std::isfinite(original)) fail(path, where + " is " + value + ", beyond float32's range (about 3.4e38)");
  fail(path, where + " is " + value + "; the values must be finite");
}

std::vector<double> NpyArray::as_float64() const {
  check_consistent(*this);
  if (dtype == DType::f32) return convert<double, float>(*this);
  if (dtype == DType::f64) return convert<double, double>(*this);
  bad_conversion(*this, "float64");
}

std::vector<std::int64_t> NpyArray::as_int64() const {
  check_consistent(*this);
  if (dtype == DType::i64) return convert<std::int64_t, std::int64_t>(*this);
  bad_conversion(*this, "int64");
}

// ---- reading ------------------------------------------------------------------------------------

NpyArray read_npy(const std::filesystem::path& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever if none comes;
  // the file type is checked before anything is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) fail(path, "no such file");
    fail(path, "cannot open: " + errno_text(err));
  }
  FileDescriptor file(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    throw Error(path.string() + ": fstat failed: " + errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, not a .npy file");
  // The file's size bounds every length the header claims before anything is allocated from it.
  if (!S_ISREG(st.st_mode)) fail(path, "is " + file_kind(st.st_mode) + ", not a regular .npy file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);

  unsigned char prefix[12] = {};
  const std::size_t got = read_fully(path, fd, prefix, sizeof prefix);
  if (std::memcmp(prefix, kMagic.data(), std::min(got, kMagic.size())) != 0) {
    fail(path, "not a .npy file (bad magic: it does not start with \"\\x93NUMPY\")");
  }
  if (got < kMagic.size() + 2) {
    fail(path, "truncated header: the file has only " + std::to_string(file_size) + " bytes");
  }
  const unsigned major = prefix[6];
  const unsigned minor = prefix[7];
  if (major < 1 || major > 3 || minor != 0) {
    fail(path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   "; dpcheck reads 1.0, 2.0 and 3.0");
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix_len = kMagic.size() + 2 + length_bytes;
  if (got < prefix_len) {
    fail(path, "truncated header: the file has only " + std::to_string(file_size) + " bytes");
  }
  const std::uint64_t header_len = little_endian_u32(prefix + kMagic.size() + 2, length_bytes);
  const std::uint64_t data_offset = prefix_len + header_len;
  if (data_offset > file_size) {
    fail(path, "truncated header: it claims " + std::to_string(header_len) + " bytes but the file has only " +
                   std::to_string(file_size) + " bytes in all");
  }

  // Versions 1.0 and 2.0 are latin-1 and 3.0 is utf-8; either way the keys and values dpcheck
  // accepts are ASCII, so the bytes are parsed as they are.
  std::string header_text(header_len, '\0');
  const std::size_t in_prefix = got - prefix_len;
  std::memcpy(header_text.data(), prefix + prefix_len, std::min<std::size_t>(in_prefix, header_len));
  if (header_len > in_prefix) {
    const std::size_t rest = header_len - in_prefix;
    if (read_fully(path, fd, header_text.data() + in_prefix, rest) != rest) {
      fail(path, "truncated header: the file shrank while it was read");
    }
  }
  Header h = parse_header(path, header_text);

  const auto n = checked_count(h.shape);
  const std::size_t item = dtype_size(h.dtype);
  if (!n || static_cast<std::uint64_t>(*n) > std::numeric_limits<std::uint64_t>::max() / item) {
    fail(path, "shape " + shape_to_string(h.shape) + " is too large");
  }
  const std::uint64_t want = static_cast<std::uint64_t>(*n) * item;
  const std::uint64_t have = file_size - data_offset;
  const std::string what = "shape " + shape_to_string(h.shape) + " of " + std::string(dtype_name(h.dtype)) + " needs " +
                           std::to_string(want) + " bytes of data but the file has " + std::to_string(have);
  if (have < want) fail(path, "data is truncated: " + what);
  if (have > want) fail(path, "data is longer than the shape says: " + what);

  NpyArray a;
  a.dtype = h.dtype;
  a.shape = std::move(h.shape);
  a.data.resize(static_cast<std::size_t>(want));
  if (read_fully(path, fd, a.data.data(), a.data.size()) != a.data.size()) {
    fail(path, "data is truncated: the file shrank while it was read");
  }
  return a;
}

NpyArray read_npy_expect(const std::filesystem::path& path, std::span<const std::int64_t> expected) {
  NpyArray a = read_npy(path);
  bool match = a.shape.size() == expected.size();
  for (std::size_t i = 0; match && i < expected.size(); ++i) {
    match = expected[i] == -1 || expected[i] == a.shape[i];
  }
  if (!match) {
    fail(path, "expected shape " + shape_to_string(expected, /*wildcard=*/true) + ", found " + a.shape_string());
  }
  return a;
}

// ---- writing ------------------------------------------------------------------------------------

void write_npy(const std::filesystem::path& path, DType dtype, std::span<const std::int64_t> shape, const void* data) {
  if (descr_of(dtype).empty()) {
    fail(path, "cannot write dtype " + std::string(dtype_name(dtype)) +
                   "; .npy files from dpcheck hold float32, float64 or int64");
  }
  const auto n = checked_count(shape);
  if (!n) {
    fail(path,
         "cannot write shape " + shape_to_string(shape) + ": a dimension is negative or the element count overflows");
  }
  const std::size_t item = dtype_size(dtype);
  if (static_cast<std::uint64_t>(*n) > std::numeric_limits<std::size_t>::max() / item) {
    fail(path, "cannot write shape " + shape_to_string(shape) + ": too large");
  }
  const std::size_t bytes = static_cast<std::size_t>(*n) * item;
  if (bytes > 0 && data == nullptr) fail(path, "cannot write: data is null");
  const std::string header = make_header(dtype, shape);
  write_file_atomic(path, [&](int fd) {
    write_all(fd, header.data(), header.size(), path);
    if (bytes > 0) write_all(fd, data, bytes, path);
  });
}

void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const float> data) {
  write_typed(path, shape, data);
}

void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const double> data) {
  write_typed(path, shape, data);
}

void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape,
               std::span<const std::int64_t> data) {
  write_typed(path, shape, data);
}

}  // namespace dpcheck
