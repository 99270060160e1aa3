// The client side of replicated serving: a channel to one server ("host:port", as before) or to
// several replicas, named by a gRPC target with a scheme: "ipv4:10.0.0.1:8500,10.0.0.2:8500",
// "ipv6:[::1]:8500,...", or "dns:///cosmoflow-server.ns.svc:8500" (every address the name resolves
// to, as a Kubernetes headless Service gives). A target with a scheme gets kReplicaServiceConfig:
// round_robin over the replicas, gRPC health checking of cosmoflow.v1.CosmoFlow (a replica that is
// NOT_SERVING, loading or draining, receives no new calls) and retries of UNAVAILABLE for the
// idempotent calls (Predict, PredictBatch, GetModelInfo; never ReloadModel or the stream).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

namespace cosmoflow {

inline constexpr const char* kReplicaServiceConfig = R"({
  "loadBalancingConfig": [{"round_robin": {}}],
  "healthCheckConfig": {"serviceName": "cosmoflow.v1.CosmoFlow"},
  "methodConfig": [{
    "name": [{"service": "cosmoflow.v1.CosmoFlow", "method": "Predict"},
             {"service": "cosmoflow.v1.CosmoFlow", "method": "PredictBatch"},
             {"service": "cosmoflow.v1.CosmoFlow", "method": "GetModelInfo"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
  }]
})";

// True for a target with a scheme (ipv4:, ipv6:, dns:, unix:...): the replica form.
bool IsReplicaTarget(const std::string& target);

// The channel to `target` with `args`; for a replica target, kReplicaServiceConfig as well, and
// keepalive pings every `keepalive` (answered within the same time) so that a replica behind a
// dead link, which sends no reset, is dropped and its calls retried elsewhere. The server accepts
// pings down to 1 s apart.
std::shared_ptr<grpc::Channel> MakeClientChannel(
    const std::string& target, std::shared_ptr<grpc::ChannelCredentials> creds,
    grpc::ChannelArguments args, std::chrono::milliseconds keepalive = std::chrono::seconds(10));

}  // namespace cosmoflow
