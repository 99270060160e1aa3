#include "core/io/npy.h"

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <memory>
#include <vector>

namespace cosmoflow {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// Value of `key` in the header dict, as its raw text up to the next top-level ',' or '}'.
bool FindHeaderValue(const std::string& header, const std::string& key, std::string* value) {
  size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return false;
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) return false;
  size_t i = colon + 1;
  while (i < header.size() && header[i] == ' ') ++i;
  size_t end = i;
  if (i < header.size() && header[i] == '(') {
    end = header.find(')', i);
    if (end == std::string::npos) return false;
    ++end;
  } else {
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  }
  *value = header.substr(i, end - i);
  while (!value->empty() && value->back() == ' ') value->pop_back();
  return true;
}

// Reads the magic, the version and the header dict text.
StatusOr<std::string> ReadHeader(std::ifstream& in, const std::string& path) {
  char magic[8];
  if (!in.read(magic, 8)) return DataLossError(path + ": truncated .npy (no header)");
  if (std::memcmp(magic, kMagic, 6) != 0) return InvalidArgumentError(path + ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) return DataLossError(path + ": truncated .npy header");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) return DataLossError(path + ": truncated .npy header");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    return InvalidArgumentError(path + ": unsupported .npy version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) return InvalidArgumentError(path + ": .npy header too large");
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return DataLossError(path + ": truncated .npy header");
  return header;
}

StatusOr<DType> ParseDescr(const std::string& descr, const std::string& path) {
  if (descr == "'<i2'" || descr == "'|i2'") return DType::kInt16;
  if (descr == "'<f4'") return DType::kFloat32;
  return InvalidArgumentError(path + ": unsupported dtype " + descr +
                              " (expected little-endian int16 '<i2' or float32 '<f4')");
}

// shape_text is "(a, b, c)" or "(a, b, c, d)".
StatusOr<std::vector<int64_t>> ParseDims(const std::string& shape_text, const std::string& path) {
  std::vector<int64_t> dims;
  // FindHeaderValue returns whatever follows 'shape': (possibly nothing): only a tuple is a shape.
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')')
    return InvalidArgumentError(path + ": malformed shape '" + shape_text + "' (expected a tuple)");
  std::string s = shape_text.substr(1, shape_text.size() - 2);
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t a = tok.find_first_not_of(' ');
    if (a != std::string::npos) {
      try {
        dims.push_back(std::stoll(tok.substr(a)));
      } catch (...) {
        return InvalidArgumentError(path + ": malformed shape " + shape_text);
      }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  for (auto d : dims)
    if (d <= 0 || d > (1 << 20)) return InvalidArgumentError(path + ": invalid extent in shape " + shape_text);
  return dims;
}

// The cube's shape, channel-first, from the array's extents.
StatusOr<CubeShape> CubeShapeOf(const std::vector<int64_t>& dims, AxisLayout layout, const std::string& shape_text,
                                const std::string& path) {
  if (dims.size() == 3) return CubeShape{1, int(dims[0]), int(dims[1]), int(dims[2])};
  if (dims.size() == 4 && layout == AxisLayout::kChannelFirst)
    return CubeShape{int(dims[0]), int(dims[1]), int(dims[2]), int(dims[3])};
  if (dims.size() == 4) return CubeShape{int(dims[3]), int(dims[0]), int(dims[1]), int(dims[2])};
  return InvalidArgumentError(path + ": array of rank " + std::to_string(dims.size()) + " " + shape_text +
                              "; a cube must be (D,H,W), (C,D,H,W) or (D,H,W,C)");
}

}  // namespace

StatusOr<Cube> ReadNpy(const std::string& path, AxisLayout layout) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open .npy file");
  CF_ASSIGN_OR_RETURN(std::string header, ReadHeader(in, path));
  std::string descr, fortran, shape_text;
  if (!FindHeaderValue(header, "descr", &descr) || !FindHeaderValue(header, "fortran_order", &fortran) ||
      !FindHeaderValue(header, "shape", &shape_text))
    return InvalidArgumentError(path + ": malformed .npy header: " + header);
  if (fortran != "False")
    return InvalidArgumentError(path + ": Fortran-order arrays are not supported (save with C order)");
  CF_ASSIGN_OR_RETURN(DType dtype, ParseDescr(descr, path));
  CF_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ParseDims(shape_text, path));
  CF_ASSIGN_OR_RETURN(CubeShape shape, CubeShapeOf(dims, layout, shape_text, path));
  CF_RETURN_IF_ERROR(shape.Validate().WithContext(path));
  const size_t bytes = static_cast<size_t>(shape.elements()) * DTypeSize(dtype);
  // Before allocating: a 100-byte file must not make us allocate the gigabytes its header claims.
  const std::streamoff data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff available = in.tellg() - data_start;
  in.seekg(data_start);
  if (data_start < 0 || available < std::streamoff(bytes))
    return DataLossError(path + ": truncated .npy data (expected " + std::to_string(bytes) +
                         " bytes, the file holds " + std::to_string(std::max<std::streamoff>(available, 0)) + ")");
  if (dims.size() == 4 && layout == AxisLayout::kChannelLast) {
    std::vector<uint8_t> buf(bytes);
    if (!in.read(reinterpret_cast<char*>(buf.data()), bytes))
      return DataLossError(path + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes)");
    return ChannelLastToFirst(buf.data(), shape, dtype);
  }
  Cube cube(shape, dtype);
  if (!in.read(static_cast<char*>(cube.raw()), bytes))
    return DataLossError(path + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes)");
  return cube;
}

Status WriteNpy(const std::string& path, const Cube& cube, bool squeeze_single_channel) {
  const CubeShape& s = cube.shape();
  std::string shape = (squeeze_single_channel && s.channels == 1)
                          ? "(" + std::to_string(s.depth) + ", " + std::to_string(s.height) + ", " +
                                std::to_string(s.width) + ")"
                          : "(" + std::to_string(s.channels) + ", " + std::to_string(s.depth) + ", " +
                                std::to_string(s.height) + ", " + std::to_string(s.width) + ")";
  std::string header = std::string("{'descr': '") + (cube.dtype() == DType::kInt16 ? "<i2" : "<f4") +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad so that magic + len + header is a multiple of 64, ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return NotFoundError(path + ": cannot create file");
    out.write(kMagic, 6);
    const char version[2] = {1, 0};
    out.write(version, 2);
    const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                  static_cast<unsigned char>(header.size() >> 8)};
    out.write(reinterpret_cast<const char*>(len), 2);
    out.write(header.data(), header.size());
    out.write(static_cast<const char*>(cube.raw()), cube.size_bytes());
    if (!out) return InternalError(path + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return InternalError(path + ": rename failed");
  return Status::Ok();
}

}  // namespace cosmoflow
