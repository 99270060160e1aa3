// Small RAII layer over the HDF5 C API, shared by datasets and checkpoints.
//
// Contract: every function here must be called with the lock from H5Lock() held (Debian's HDF5 is
// the serial, non-thread-safe build). HDF5's own error printing is silenced; failures come back as
// Status values that name the file and the object. This header is internal to core/ (it includes
// hdf5.h); other folders use dataset.h and checkpoint.h.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow::h5 {

// The process-wide HDF5 lock.
std::recursive_mutex& Lock();

// Owns one hid_t and closes it with the right H5*close function.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

// Silences HDF5's default error stack printing (once per process).
void SilenceErrors();

// Opens an existing file read-only; the error distinguishes "missing" from "not an HDF5 file".
StatusOr<Handle> OpenFile(const std::string& path);
StatusOr<Handle> CreateFile(const std::string& path);  // truncates
StatusOr<Handle> OpenDataset(hid_t file, const std::string& name, const std::string& file_path);
bool Exists(hid_t loc, const std::string& name);

// Extents of a dataset.
std::vector<hsize_t> Dims(hid_t dataset);

// Attributes on an object (string attributes are variable-length UTF-8).
Status WriteStringAttr(hid_t obj, const std::string& name, const std::string& value);
Status WriteStringListAttr(hid_t obj, const std::string& name, const std::vector<std::string>& values);
Status WriteInt64Attr(hid_t obj, const std::string& name, int64_t value);
Status WriteDoubleListAttr(hid_t obj, const std::string& name, const std::vector<double>& values);
StatusOr<std::string> ReadStringAttr(hid_t obj, const std::string& name);
StatusOr<std::vector<std::string>> ReadStringListAttr(hid_t obj, const std::string& name);
StatusOr<int64_t> ReadInt64Attr(hid_t obj, const std::string& name);
StatusOr<std::vector<double>> ReadDoubleListAttr(hid_t obj, const std::string& name);

// fsyncs a file or directory by path (used before/after atomic renames).
Status FsyncPath(const std::string& path);
std::string DirName(const std::string& path);

}  // namespace cosmoflow::h5
