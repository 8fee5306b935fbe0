// What the write-audit library (audit_preload.cpp) writes its records with: text in a fixed buffer
// that remembers whether anything did not fit, JSON strings within a budget, and open(2)'s flags by
// name. No heap, no exceptions: it runs inside programs it knows nothing about.
#pragma once

#include <fcntl.h>

#include <cstddef>
#include <cstdint>

namespace dpcheck::audit_preload {

// ---- bounded text -----------------------------------------------------------------------------------

// Appends to a fixed buffer and remembers whether anything did not fit.
class Text {
 public:
  Text(char* buf, std::size_t cap) noexcept : buf_(buf), cap_(cap) {}
  void put(char c) noexcept {
    if (len_ < cap_) buf_[len_++] = c;
    else full_ = true;
  }
  void put(const char* s) noexcept {
    while (*s != '\0') put(*s++);
  }
  void put(const char* s, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) put(s[i]);
  }
  void number(long long v) noexcept {
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do digits[n++] = static_cast<char>('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0) put('-');
    while (n > 0) put(digits[--n]);
  }
  void octal(unsigned v) noexcept {
    char digits[12];
    int n = 0;
    do digits[n++] = static_cast<char>('0' + (v & 7U));
    while ((v >>= 3) != 0);
    put('0');
    while (n > 0) put(digits[--n]);
  }
  void hex(unsigned long v) noexcept {
    char digits[20];
    int n = 0;
    do digits[n++] = "0123456789abcdef"[v & 15U];
    while ((v >>= 4) != 0);
    put("0x");
    while (n > 0) put(digits[--n]);
  }
  // The first n bytes of the buffer were filled by someone else (a system call).
  void assume(std::size_t n) noexcept { len_ = n < cap_ ? n : cap_; }
  std::size_t size() const noexcept { return len_; }
  bool full() const noexcept { return full_; }
  const char* data() const noexcept { return buf_; }
  // Terminates in place, cutting the last character if the buffer is full.
  const char* c_str() noexcept {
    buf_[len_ < cap_ ? len_ : cap_ - 1] = '\0';
    return buf_;
  }

 private:
  char* buf_;
  std::size_t cap_;
  std::size_t len_ = 0;
  bool full_ = false;
};

// Length of the valid UTF-8 sequence starting at s (at most n bytes), or 0 if it is not one. JSON text
// must be valid Unicode, and file names need not be.
inline std::size_t utf8_length(const unsigned char* s, std::size_t n) noexcept {
  const unsigned char c = s[0];
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len) return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (std::size_t i = 2; i < len; ++i)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

// Appends "s" as a JSON string using at most `budget` bytes of the line; returns false if s was cut.
// Bytes that are not UTF-8 are written as \u00XX, so such a name still reads as something.
inline bool put_json_string(Text& out, const char* s, std::size_t budget) noexcept {
  const std::size_t start = out.size();
  bool whole = true;
  out.put('"');
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  std::size_t left = s != nullptr ? ::strlen(s) : 0;
  while (left > 0) {
    char piece[8];
    std::size_t piece_len = 0, consumed = 1;
    const unsigned char c = *p;
    if (c == '"' || c == '\\') {
      piece[0] = '\\';
      piece[1] = static_cast<char>(c);
      piece_len = 2;
    } else if (c >= 0x20 && c < 0x7F) {
      piece[0] = static_cast<char>(c);
      piece_len = 1;
    } else if (const std::size_t u = c >= 0x80 ? utf8_length(p, left) : 0; u > 0) {
      for (std::size_t i = 0; i < u; ++i) piece[i] = static_cast<char>(p[i]);
      piece_len = consumed = u;
    } else {
      const char* hexdigits = "0123456789abcdef";
      const char esc[6] = {'\\', 'u', '0', '0', hexdigits[c >> 4], hexdigits[c & 15]};
      for (int i = 0; i < 6; ++i) piece[i] = esc[i];
      piece_len = 6;
    }
    // Keep room for the closing quote.
    if (out.size() - start + piece_len + 1 > budget) {
      whole = false;
      break;
    }
    out.put(piece, piece_len);
    p += consumed;
    left -= consumed;
  }
  out.put('"');
  return whole;
}

// ---- readable flags ---------------------------------------------------------------------------------

struct Flag {
  int bits;
  const char* name;
};

inline void put_open_flags(Text& t, int flags) noexcept {
  switch (flags & O_ACCMODE) {
    case O_RDONLY: t.put("O_RDONLY"); break;
    case O_WRONLY: t.put("O_WRONLY"); break;
    case O_RDWR: t.put("O_RDWR"); break;
    default: t.put("O_ACCMODE"); break;
  }
  flags &= ~O_ACCMODE;
  // Several-bit flags first, so that O_TMPFILE is not printed as O_DIRECTORY plus a stray bit.
  static constexpr Flag names[] = {
      {O_TMPFILE, "O_TMPFILE"}, {O_SYNC, "O_SYNC"},       {O_CREAT, "O_CREAT"},         {O_EXCL, "O_EXCL"},
      {O_NOCTTY, "O_NOCTTY"},   {O_TRUNC, "O_TRUNC"},     {O_APPEND, "O_APPEND"},       {O_NONBLOCK, "O_NONBLOCK"},
      {O_DSYNC, "O_DSYNC"},     {O_DIRECT, "O_DIRECT"},   {O_DIRECTORY, "O_DIRECTORY"}, {O_NOFOLLOW, "O_NOFOLLOW"},
      {O_NOATIME, "O_NOATIME"}, {O_CLOEXEC, "O_CLOEXEC"}, {O_PATH, "O_PATH"},           {O_ASYNC, "O_ASYNC"},
  };
  for (const Flag& f : names) {
    if (f.bits != 0 && (flags & f.bits) == f.bits) {
      t.put('|');
      t.put(f.name);
      flags &= ~f.bits;
    }
  }
  if (flags != 0) {
    t.put('|');
    t.hex(static_cast<unsigned>(flags));
  }
}

}  // namespace dpcheck::audit_preload
