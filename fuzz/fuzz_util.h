// Helpers shared by the fuzz targets: a reader over the fuzz input, and a scratch file for the
// parsers that take a path.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace cosmoflow::fuzz {

// Consumes the fuzz input front to back; past the end everything reads as zero / empty.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | Byte();
    return v;
  }
  double Double() {
    uint64_t bits = uint64_t(U32()) << 32 | U32();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  // Up to `max` bytes: a length byte, then that many bytes.
  std::string_view Bytes(size_t max) {
    const size_t n = std::min<size_t>({size_t{Byte()}, max, size_ - pos_});
    std::string_view s(reinterpret_cast<const char*>(data_) + pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view Rest() {
    std::string_view s(reinterpret_cast<const char*>(data_) + pos_, size_ - pos_);
    pos_ = size_;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A per-process file under /dev/shm (memory, no disk), rewritten for every input.
inline const std::string& ScratchPath(const char* suffix) {
  static const std::string path = "/dev/shm/cosmoflow-fuzz-" + std::to_string(::getpid()) + suffix;
  return path;
}

inline void WriteScratch(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the harness itself is broken: stop loudly
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
}

// A property the code promises was broken: libFuzzer reports it as a crash with the input.
#define FUZZ_CHECK(cond)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

}  // namespace cosmoflow::fuzz
