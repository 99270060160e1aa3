// The KServe v2 / Open Inference Protocol service (inference.GRPCInferenceService,
// proto/kserve_v2.proto) on the same port, batcher and metrics as cosmoflow.v1.
//
// Mapping (docs/serving.md): one model, named kKServeModelName, whose version is the loaded
// checkpoint's version. Input: one tensor "cube", INT16 or FP32, shape [N, C, D, H, W]
// (channels first) or, with the tensor parameter layout="channels_last", [N, D, H, W, C]; its
// elements in raw_input_contents or in contents (int_contents for INT16, fp32_contents for FP32).
// Every one of the N cubes is validated as a cosmoflow.v1 cube and goes through the batcher on its
// own. Outputs, FP32 in raw_output_contents: one [N, 1] tensor per parameter, named after it
// ("Omega_M", ...), in physical units; for a model with an uncertainty also "<name>_sigma" [N, 1]
// per parameter and "covariance" [N, P, P]. ModelConfig describes the same in Triton's terms
// (max_batch_size = the most cubes one call may carry). RepositoryIndex and
// SystemSharedMemoryStatus answer UNIMPLEMENTED. Errors are gRPC statuses naming the field, as on
// cosmoflow.v1.
//
// Thread-safety: the service may be called from any number of gRPC threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "server/batcher.h"
#include "server/metrics.h"

namespace cosmoflow {

inline constexpr const char* kKServeModelName = "cosmoflow";

// What the service reads from the server that owns it; all must outlive the service.
struct KServeBackend {
  Batcher* batcher = nullptr;
  Metrics* metrics = nullptr;
  int max_queue = 64;                 // most cubes one ModelInfer may carry
  std::function<bool()> serving;      // the health status: a model is loaded and not draining
  std::string server_version;         // ServerMetadata.version
};

std::unique_ptr<grpc::Service> MakeKServeService(KServeBackend backend);

}  // namespace cosmoflow
