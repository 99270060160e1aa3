#include "client/channel.h"

namespace cosmoflow {

bool IsReplicaTarget(const std::string& target) {
  for (const char* scheme : {"ipv4:", "ipv6:", "dns:", "unix:"})
    if (target.rfind(scheme, 0) == 0) return true;
  return false;
}

std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& target,
                                                 std::shared_ptr<grpc::ChannelCredentials> creds,
                                                 grpc::ChannelArguments args,
                                                 std::chrono::milliseconds keepalive) {
  if (IsReplicaTarget(target)) {
    args.SetServiceConfigJSON(kReplicaServiceConfig);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, int(keepalive.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, int(keepalive.count()));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

}  // namespace cosmoflow
