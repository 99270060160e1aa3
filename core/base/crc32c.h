// CRC-32C (Castagnoli), as used by TFRecord framing and by our checkpoint checksums.
// Hardware-accelerated with SSE4.2 when the CPU has it. Thread-safe, no state.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cosmoflow {

// CRC-32C of data[0, n), continuing from `crc` (pass 0 to start).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace cosmoflow
