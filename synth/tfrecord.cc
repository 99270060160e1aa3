#include "synth/tfrecord.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/base/crc32c.h"

namespace cosmoflow {
namespace synth {
namespace {

uint32_t LoadU32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // the format is little-endian, as is every host we build for
  return v;
}

uint64_t LoadU64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string Hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// A bounds-checked cursor over protobuf wire format.
class WireReader {
 public:
  WireReader(std::string_view data, const char* what) : data_(data), what_(what) {}

  bool done() const { return pos_ >= data_.size(); }
  size_t pos() const { return pos_; }

  Status Error(const std::string& why) const {
    return DataLossError(std::string(what_) + " at byte " + std::to_string(pos_) + ": " + why);
  }

  Status Varint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return Error("truncated varint");
      const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      result |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) {
        *v = result;
        return Status::Ok();
      }
    }
    return Error("varint longer than 10 bytes");
  }

  // Reads a tag; *field and *wire_type are its parts.
  Status Tag(int* field, int* wire_type) {
    uint64_t tag = 0;
    CF_RETURN_IF_ERROR(Varint(&tag));
    *field = static_cast<int>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    if (*field == 0) return Error("field number 0");
    return Status::Ok();
  }

  Status Bytes(std::string_view* out) {
    uint64_t n = 0;
    CF_RETURN_IF_ERROR(Varint(&n));
    if (n > data_.size() - pos_) {
      return Error("length " + std::to_string(n) + " runs past the end (" +
                   std::to_string(data_.size() - pos_) + " bytes left)");
    }
    *out = data_.substr(pos_, n);
    pos_ += n;
    return Status::Ok();
  }

  Status Fixed32(uint32_t* v) {
    if (data_.size() - pos_ < 4) return Error("truncated 32-bit field");
    *v = LoadU32(reinterpret_cast<const unsigned char*>(data_.data()) + pos_);
    pos_ += 4;
    return Status::Ok();
  }

  Status Skip(int wire_type) {
    switch (wire_type) {
      case 0: {
        uint64_t v = 0;
        return Varint(&v);
      }
      case 1:
        if (data_.size() - pos_ < 8) return Error("truncated 64-bit field");
        pos_ += 8;
        return Status::Ok();
      case 2: {
        std::string_view v;
        return Bytes(&v);
      }
      case 5: {
        uint32_t v = 0;
        return Fixed32(&v);
      }
      default:
        return Error("unsupported wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view data_;
  const char* what_;
  size_t pos_ = 0;
};

Status ParseFloatList(std::string_view data, std::vector<float>* out) {
  WireReader r(data, "FloatList");
  while (!r.done()) {
    int field, wt;
    CF_RETURN_IF_ERROR(r.Tag(&field, &wt));
    if (field != 1) {
      CF_RETURN_IF_ERROR(r.Skip(wt));
    } else if (wt == 2) {  // packed
      std::string_view packed;
      CF_RETURN_IF_ERROR(r.Bytes(&packed));
      if (packed.size() % 4)
        return r.Error("packed floats of " + std::to_string(packed.size()) + " bytes");
      const size_t old = out->size();
      out->resize(old + packed.size() / 4);
      // An empty packed list leaves out->data() null: memcpy must not see it.
      if (!packed.empty()) std::memcpy(out->data() + old, packed.data(), packed.size());
    } else if (wt == 5) {
      uint32_t bits = 0;
      CF_RETURN_IF_ERROR(r.Fixed32(&bits));
      float f;
      std::memcpy(&f, &bits, 4);
      out->push_back(f);
    } else {
      return r.Error("float value with wire type " + std::to_string(wt));
    }
  }
  return Status::Ok();
}

Status ParseInt64List(std::string_view data, std::vector<int64_t>* out) {
  WireReader r(data, "Int64List");
  while (!r.done()) {
    int field, wt;
    CF_RETURN_IF_ERROR(r.Tag(&field, &wt));
    if (field != 1) {
      CF_RETURN_IF_ERROR(r.Skip(wt));
    } else if (wt == 2) {
      std::string_view packed;
      CF_RETURN_IF_ERROR(r.Bytes(&packed));
      WireReader p(packed, "Int64List packed values");
      while (!p.done()) {
        uint64_t v = 0;
        CF_RETURN_IF_ERROR(p.Varint(&v));
        out->push_back(static_cast<int64_t>(v));
      }
    } else if (wt == 0) {
      uint64_t v = 0;
      CF_RETURN_IF_ERROR(r.Varint(&v));
      out->push_back(static_cast<int64_t>(v));
    } else {
      return r.Error("int64 value with wire type " + std::to_string(wt));
    }
  }
  return Status::Ok();
}

Status ParseBytesList(std::string_view data, std::vector<std::string_view>* out) {
  WireReader r(data, "BytesList");
  while (!r.done()) {
    int field, wt;
    CF_RETURN_IF_ERROR(r.Tag(&field, &wt));
    if (field == 1 && wt == 2) {
      std::string_view v;
      CF_RETURN_IF_ERROR(r.Bytes(&v));
      out->push_back(v);
    } else if (field == 1) {
      return r.Error("bytes value with wire type " + std::to_string(wt));
    } else {
      CF_RETURN_IF_ERROR(r.Skip(wt));
    }
  }
  return Status::Ok();
}

Status ParseFeature(std::string_view data, ExampleFeature* feature) {
  WireReader r(data, "Feature");
  bool seen = false;
  while (!r.done()) {
    int field, wt;
    CF_RETURN_IF_ERROR(r.Tag(&field, &wt));
    if (field < 1 || field > 3) {
      CF_RETURN_IF_ERROR(r.Skip(wt));
      continue;
    }
    if (wt != 2) return r.Error("list field " + std::to_string(field) + " is not length-delimited");
    std::string_view list;
    CF_RETURN_IF_ERROR(r.Bytes(&list));
    // oneof semantics: the last list wins.
    *feature = ExampleFeature();
    seen = true;
    if (field == 1) {
      feature->kind = ExampleFeature::Kind::kBytes;
      CF_RETURN_IF_ERROR(ParseBytesList(list, &feature->bytes));
    } else if (field == 2) {
      feature->kind = ExampleFeature::Kind::kFloat;
      CF_RETURN_IF_ERROR(ParseFloatList(list, &feature->floats));
    } else {
      feature->kind = ExampleFeature::Kind::kInt64;
      CF_RETURN_IF_ERROR(ParseInt64List(list, &feature->ints));
    }
  }
  if (!seen) return r.Error("feature holds no list");
  return Status::Ok();
}

std::string Varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
  return s;
}

}  // namespace

const char* FeatureKindName(ExampleFeature::Kind kind) {
  switch (kind) {
    case ExampleFeature::Kind::kBytes:
      return "bytes_list";
    case ExampleFeature::Kind::kFloat:
      return "float_list";
    case ExampleFeature::Kind::kInt64:
      return "int64_list";
  }
  return "?";
}

StatusOr<std::map<std::string, ExampleFeature>> ParseExample(std::string_view record) {
  std::map<std::string, ExampleFeature> features;
  WireReader example(record, "Example");
  while (!example.done()) {
    int field, wt;
    CF_RETURN_IF_ERROR(example.Tag(&field, &wt));
    if (field != 1) {
      CF_RETURN_IF_ERROR(example.Skip(wt));
      continue;
    }
    if (wt != 2) return example.Error("features field is not length-delimited");
    std::string_view features_msg;
    CF_RETURN_IF_ERROR(example.Bytes(&features_msg));
    WireReader fr(features_msg, "Features");
    while (!fr.done()) {
      int ff, fwt;
      CF_RETURN_IF_ERROR(fr.Tag(&ff, &fwt));
      if (ff != 1) {
        CF_RETURN_IF_ERROR(fr.Skip(fwt));
        continue;
      }
      if (fwt != 2) return fr.Error("map entry is not length-delimited");
      std::string_view entry;
      CF_RETURN_IF_ERROR(fr.Bytes(&entry));
      WireReader er(entry, "Features map entry");
      std::string key;
      ExampleFeature value;
      bool has_value = false;
      while (!er.done()) {
        int ef, ewt;
        CF_RETURN_IF_ERROR(er.Tag(&ef, &ewt));
        if ((ef == 1 || ef == 2) && ewt != 2) return er.Error("key/value is not length-delimited");
        if (ef == 1) {
          std::string_view k;
          CF_RETURN_IF_ERROR(er.Bytes(&k));
          key.assign(k);
        } else if (ef == 2) {
          std::string_view v;
          CF_RETURN_IF_ERROR(er.Bytes(&v));
          Status s = ParseFeature(v, &value);
          if (!s.ok()) return s.WithContext("feature '" + key + "'");
          has_value = true;
        } else {
          CF_RETURN_IF_ERROR(er.Skip(ewt));
        }
      }
      if (!has_value) return er.Error("feature '" + key + "' has no value");
      features[key] = std::move(value);
    }
  }
  return features;
}

std::string EncodeLengthDelimited(int field, std::string_view payload) {
  std::string s = Varint((uint64_t(field) << 3) | 2);
  s += Varint(payload.size());
  s.append(payload.data(), payload.size());
  return s;
}

std::string EncodeExample(const std::map<std::string, std::string>& bytes_features,
                          const std::map<std::string, std::vector<float>>& float_features) {
  std::string features;
  for (const auto& [key, value] : bytes_features) {
    const std::string feature = EncodeLengthDelimited(1, EncodeLengthDelimited(1, value));
    features +=
        EncodeLengthDelimited(1, EncodeLengthDelimited(1, key) + EncodeLengthDelimited(2, feature));
  }
  for (const auto& [key, values] : float_features) {
    std::string packed(values.size() * 4, '\0');
    std::memcpy(packed.data(), values.data(), packed.size());
    const std::string feature = EncodeLengthDelimited(2, EncodeLengthDelimited(1, packed));
    features +=
        EncodeLengthDelimited(1, EncodeLengthDelimited(1, key) + EncodeLengthDelimited(2, feature));
  }
  return EncodeLengthDelimited(1, features);
}

std::string FrameTfRecord(std::string_view data) {
  std::string out(12, '\0');
  const uint64_t n = data.size();
  std::memcpy(out.data(), &n, 8);
  const uint32_t len_crc = MaskCrc32c(Crc32c(out.data(), 8));
  std::memcpy(out.data() + 8, &len_crc, 4);
  out.append(data.data(), data.size());
  const uint32_t data_crc = MaskCrc32c(Crc32c(data.data(), data.size()));
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

// ---- TfRecordReader ----

TfRecordReader::~TfRecordReader() {
  if (gz_) gzclose(static_cast<gzFile>(gz_));
}

StatusOr<std::unique_ptr<TfRecordReader>> TfRecordReader::Open(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  }
  gzbuffer(f, 1 << 20);  // big reads: the records are 16 MiB
  std::unique_ptr<TfRecordReader> r(new TfRecordReader());
  r->path_ = path;
  r->gz_ = f;
  return r;
}

Status TfRecordReader::ReadFully(void* dst, size_t n, size_t* got, const std::string& where) {
  gzFile f = static_cast<gzFile>(gz_);
  // zlib's messages start with "<path>: "; the caller's context already names the file.
  auto zlib_message = [&](const char* msg) {
    std::string m = msg ? msg : "unknown zlib error";
    if (m.compare(0, path_.size() + 2, path_ + ": ") == 0) m = m.substr(path_.size() + 2);
    return m;
  };
  auto* p = static_cast<char*>(dst);
  size_t total = 0;
  while (total < n) {
    // gzread takes an unsigned int count: read in chunks of at most 256 MiB.
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, size_t{1} << 28));
    const int r = gzread(f, p + total, chunk);
    if (r < 0) {
      int errnum = 0;
      *got = total;
      return DataLossError(where + ": gzip error after " + std::to_string(total) +
                           " bytes of this read: " + zlib_message(gzerror(f, &errnum)));
    }
    if (r == 0) break;
    total += static_cast<size_t>(r);
  }
  *got = total;
  // A gzip stream cut short reads as a short count with Z_BUF_ERROR set; report it as such.
  if (total < n) {
    int errnum = 0;
    const char* msg = gzerror(f, &errnum);
    if (errnum != Z_OK && errnum != Z_STREAM_END) {
      return DataLossError(where + ": gzip stream ends early, " + std::to_string(total) + " of " +
                           std::to_string(n) + " bytes read (" + zlib_message(msg) + ")");
    }
  }
  return Status::Ok();
}

Status TfRecordReader::Next(std::string* record, bool* eof) {
  *eof = false;
  const std::string where =
      path_ + ": record " + std::to_string(records_) + " at byte " + std::to_string(offset_);
  unsigned char header[12];
  size_t got = 0;
  CF_RETURN_IF_ERROR(ReadFully(header, sizeof(header), &got, where));
  if (got == 0) {
    *eof = true;
    return Status::Ok();
  }
  if (got < sizeof(header)) {
    return DataLossError(where + ": truncated header (" + std::to_string(got) + " of 12 bytes)");
  }
  const uint64_t length = LoadU64(header);
  const uint32_t stored_len_crc = LoadU32(header + 8);
  const uint32_t len_crc = MaskCrc32c(Crc32c(header, 8));
  if (stored_len_crc != len_crc) {
    return DataLossError(where + ": length CRC mismatch (stored " + Hex(stored_len_crc) +
                         ", computed " + Hex(len_crc) + ")");
  }
  if (length > kMaxRecordBytes) {
    return DataLossError(where + ": record length " + std::to_string(length) + " exceeds " +
                         std::to_string(kMaxRecordBytes) + " bytes");
  }
  record->resize(length);
  CF_RETURN_IF_ERROR(ReadFully(record->data(), length, &got, where));
  if (got < length) {
    return DataLossError(where + ": truncated data (" + std::to_string(got) + " of " +
                         std::to_string(length) + " bytes)");
  }
  unsigned char footer[4];
  CF_RETURN_IF_ERROR(ReadFully(footer, 4, &got, where));
  if (got < 4) {
    return DataLossError(where + ": truncated data CRC (" + std::to_string(got) + " of 4 bytes)");
  }
  const uint32_t stored_crc = LoadU32(footer);
  const uint32_t crc = MaskCrc32c(Crc32c(record->data(), length));
  if (stored_crc != crc) {
    return DataLossError(where + ": data CRC mismatch (stored " + Hex(stored_crc) + ", computed " +
                         Hex(crc) + ")");
  }
  offset_ += 16 + static_cast<int64_t>(length);
  ++records_;
  return Status::Ok();
}

}  // namespace synth
}  // namespace cosmoflow
