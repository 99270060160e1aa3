// The admin surface of the server (ReloadModel, and any later admin RPC): who may call it and which
// checkpoints it may name.
//
// Off by default. When enabled, a call must carry one credential:
//   - a bearer token (`authorization: Bearer <token>` metadata) equal to the one read from
//     --admin-token-file at start-up, compared in constant time;
//   - or, with mTLS on, a verified client certificate whose common name or a subject alternative
//     name equals --admin-client-cert-name.
// Disabled: UNIMPLEMENTED. No credential: UNAUTHENTICATED. A wrong one: PERMISSION_DENIED. These
// answers come from memory only: nothing in the request is looked up on the file system.
//
// An authorised call may name a checkpoint file or directory under the checkpoint root (relative
// names are taken from the root). The name is refused lexically first (`..`, NUL, outside the root
// as written), then resolved (realpath) and refused if it does not exist or leads out of the root
// through a symlink; every refusal gives the same message, which never depends on what exists
// outside the root. What lies inside the root (files, links, a directory's LATEST) is trusted
// operator input: the root must be writable only by the operator and the trainer.
//
// Thread-safety: immutable after Create(); every method may be called from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "core/base/status.h"

namespace cosmoflow {

struct AdminOptions {
  bool enabled = false;             // --enable-admin
  std::string token_file;           // --admin-token-file: the bearer token, one line
  std::string client_cert_name;     // --admin-client-cert-name: CN or SAN of an admin certificate
  std::string checkpoint_root;      // --admin-checkpoint-root; empty: derived from --checkpoint
};

class AdminGuard {
 public:
  // A disabled guard refuses every call with UNIMPLEMENTED.
  AdminGuard() = default;
  // Reads the token file and resolves the root. `checkpoint` is the server's --checkpoint (the
  // root defaults to it when it is a directory, else to its parent directory); `mtls` tells
  // whether client certificates are verified (required by client_cert_name). Errors name the flag.
  static StatusOr<AdminGuard> Create(const AdminOptions& options, const std::string& checkpoint,
                                     bool mtls);

  bool enabled() const { return enabled_; }
  const std::string& root() const { return root_; }

  // Checks the credential of one call: `authorization` is the value of the authorization
  // metadata (empty if absent), `cert_names` the CN and SANs of the verified client certificate
  // (empty without one).
  Status Authorize(const std::string& authorization,
                   const std::vector<std::string>& cert_names) const;
  // The same for a gRPC call.
  Status Authorize(const grpc::ServerContextBase& ctx) const;

  // The absolute, symlink-free path of `requested` under the root. Empty `requested` returns
  // empty (the caller reloads its own --checkpoint).
  StatusOr<std::string> ResolveCheckpoint(const std::string& requested) const;

 private:
  bool enabled_ = false;
  std::string token_;  // empty: tokens are not accepted
  std::string client_cert_name_;
  std::string root_;  // realpath of the root, no trailing '/'
};

// The flag combination alone (no file is read): --admin-* flags need --enable-admin, which needs a
// credential; a certificate name needs mTLS.
Status CheckAdminOptions(const AdminOptions& options, bool mtls);

// Equality of a and b in time that depends only on b's length (b is the secret).
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace cosmoflow
