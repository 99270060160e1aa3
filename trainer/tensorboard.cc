#include "trainer/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "core/base/crc32c.h"

namespace cosmoflow {
namespace {

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32. Little-endian fixed-width values, as on x86.
void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
template <typename T>
void PutFixed(T v, std::string* out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}
void PutKey(int field, int wire_type, std::string* out) {
  PutVarint(uint64_t(field) << 3 | uint64_t(wire_type), out);
}
void PutBytes(int field, const std::string& bytes, std::string* out) {
  PutKey(field, 2, out);
  PutVarint(bytes.size(), out);
  out->append(bytes);
}

// Event.wall_time (1, double) and Event.step (2, int64).
std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  PutKey(1, 1, &e);
  PutFixed(wall_time, &e);
  if (step != 0) {  // proto3 leaves a zero field out
    PutKey(2, 0, &e);
    PutVarint(static_cast<uint64_t>(step), &e);
  }
  return e;
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string e = EventHeader(wall_time, 0);
  PutBytes(3, "brain.Event:2", &e);
  return e;
}

std::string EncodeScalarsEvent(double wall_time, int64_t step,
                               const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(1, tag, &v);  // Summary.Value.tag
    PutKey(2, 5, &v);      // Summary.Value.simple_value (float)
    PutFixed(static_cast<float>(value), &v);
    PutBytes(1, v, &summary);  // Summary.value
  }
  std::string e = EventHeader(wall_time, step);
  PutBytes(5, summary, &e);  // Event.summary
  return e;
}

}  // namespace

StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(const std::string& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = WallTime();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d", static_cast<long long>(now),
                host, static_cast<int>(::getpid()));
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return NotFoundError(path + ": cannot create the TensorBoard events file");
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(f, path));
  w->WriteRecord(EncodeFileVersionEvent(now));
  return w;
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(file_); }

void TensorBoardWriter::WriteScalars(int64_t step,
                                     const std::vector<std::pair<std::string, double>>& scalars) {
  WriteRecord(EncodeScalarsEvent(WallTime(), step, scalars));
}

void TensorBoardWriter::WriteRecord(const std::string& data) {
  std::string record;
  PutFixed(static_cast<uint64_t>(data.size()), &record);
  PutFixed(MaskCrc32c(Crc32c(record.data(), 8)), &record);
  record += data;
  PutFixed(MaskCrc32c(Crc32c(data.data(), data.size())), &record);
  std::fwrite(record.data(), 1, record.size(), file_);
  std::fflush(file_);
}

}  // namespace cosmoflow
