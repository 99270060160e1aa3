// A zeroed, 64-byte aligned float array for kernel workspaces (sized at set-up, never per step).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace cosmoflow {

class AlignedFloats {
 public:
  AlignedFloats() = default;
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(p_); }

  // Replaces the contents with `floats` zeros (the allocation rounded up to 16 floats).
  void Allocate(int64_t floats) {
    std::free(p_);
    n_ = floats;
    const int64_t rounded = (floats < 16 ? 16 : floats + 15) / 16 * 16;
    p_ = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(rounded) * 4));
    if (p_ == nullptr) throw std::bad_alloc();
    std::memset(p_, 0, static_cast<size_t>(rounded) * 4);
  }
  float* data() const { return p_; }
  int64_t size() const { return n_; }

 private:
  float* p_ = nullptr;
  int64_t n_ = 0;
};

}  // namespace cosmoflow
