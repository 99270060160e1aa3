#include "server/admin.h"

#include <grpcpp/security/auth_context.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cosmoflow {

namespace fs = std::filesystem;

namespace {

// One answer for every path that is not an existing entry under the root: whether something
// exists outside (or behind a symlink) must not show in the reply.
constexpr char kNotUnderRoot[] =
    "checkpoint_path must name an existing checkpoint file or directory under the server's "
    "checkpoint root (relative names are taken from the root; no '..', no links out of it)";

constexpr size_t kMinTokenBytes = 16;

StatusOr<std::string> ReadToken(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return InvalidArgumentError("--admin-token-file '" + path + "' is not a readable file");
  // Like ssh with its keys: a secret that every local user can read is no secret.
  if (st.st_mode & S_IRWXO)
    return InvalidArgumentError("--admin-token-file '" + path +
                                "' is accessible to other users (chmod o-rwx it)");
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return InvalidArgumentError("cannot read --admin-token-file '" + path + "'");
  std::string token = ss.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.size() < kMinTokenBytes)
    return InvalidArgumentError("--admin-token-file '" + path + "' holds fewer than " +
                                std::to_string(kMinTokenBytes) + " characters");
  for (unsigned char c : token)
    if (c <= ' ' || c > '~')  // what an HTTP/2 header value carries without escaping
      return InvalidArgumentError("--admin-token-file '" + path +
                                  "' must hold one line of printable ASCII without spaces");
  return token;
}

StatusOr<std::string> ResolveRoot(const AdminOptions& options, const std::string& checkpoint) {
  std::string root = options.checkpoint_root;
  if (root.empty()) {
    struct stat st;
    const bool is_dir = ::stat(checkpoint.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    root = is_dir ? checkpoint : fs::path(checkpoint).parent_path().string();
    if (root.empty()) root = ".";
  }
  char resolved[PATH_MAX];
  struct stat st;
  if (::realpath(root.c_str(), resolved) == nullptr || ::stat(resolved, &st) != 0 ||
      !S_ISDIR(st.st_mode))
    return InvalidArgumentError("the admin checkpoint root '" + root + "' is not a directory");
  return std::string(resolved);
}

bool HasDotDot(const std::string& path) {
  for (const auto& part : fs::path(path))
    if (part == "..") return true;
  return false;
}

// `path` (absolute, lexically normal) is `root` or lies below it.
bool LexicallyUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Always b.size() iterations: the time reveals the secret's length at most, never how many
  // leading characters of a guess were right.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

Status CheckAdminOptions(const AdminOptions& options, bool mtls) {
  if (!options.enabled) {
    if (!options.token_file.empty() || !options.client_cert_name.empty() ||
        !options.checkpoint_root.empty())
      return InvalidArgumentError("the --admin-* flags need --enable-admin");
    return Status::Ok();
  }
  if (options.token_file.empty() && options.client_cert_name.empty())
    return InvalidArgumentError(
        "--enable-admin needs a credential: --admin-token-file or --admin-client-cert-name");
  if (!options.client_cert_name.empty() && !mtls)
    return InvalidArgumentError(
        "--admin-client-cert-name needs client certificates (--tls-client-ca)");
  return Status::Ok();
}

StatusOr<AdminGuard> AdminGuard::Create(const AdminOptions& options,
                                        const std::string& checkpoint, bool mtls) {
  CF_RETURN_IF_ERROR(CheckAdminOptions(options, mtls));
  AdminGuard guard;
  if (!options.enabled) return guard;
  if (!options.token_file.empty()) {
    CF_ASSIGN_OR_RETURN(guard.token_, ReadToken(options.token_file));
  }
  CF_ASSIGN_OR_RETURN(guard.root_, ResolveRoot(options, checkpoint));
  guard.client_cert_name_ = options.client_cert_name;
  guard.enabled_ = true;
  return guard;
}

Status AdminGuard::Authorize(const std::string& authorization,
                             const std::vector<std::string>& cert_names) const {
  if (!enabled_)
    return UnimplementedError(
        "admin calls are disabled on this server (start it with --enable-admin and a credential)");
  if (!client_cert_name_.empty())
    for (const auto& name : cert_names)
      if (name == client_cert_name_) return Status::Ok();
  if (authorization.empty()) {
    if (!cert_names.empty() && !client_cert_name_.empty())
      return PermissionDeniedError("the client certificate is not the admin certificate");
    return UnauthenticatedError(
        "admin calls need credentials (metadata 'authorization: Bearer <token>'" +
        std::string(client_cert_name_.empty() ? ")" : " or the admin client certificate)"));
  }
  constexpr char kScheme[] = "bearer ";
  const size_t n = sizeof(kScheme) - 1;
  bool bearer = authorization.size() > n;
  for (size_t i = 0; bearer && i < n; ++i)
    bearer = std::tolower(static_cast<unsigned char>(authorization[i])) == kScheme[i];
  if (!bearer)
    return UnauthenticatedError("the authorization metadata must be 'Bearer <token>'");
  if (token_.empty() || !ConstantTimeEquals(authorization.substr(n), token_))
    return PermissionDeniedError("the admin token is not valid");
  return Status::Ok();
}

Status AdminGuard::Authorize(const grpc::ServerContextBase& ctx) const {
  if (!enabled_) return Authorize("", {});
  std::string authorization;
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end())
    authorization.assign(it->second.data(), it->second.size());
  std::vector<std::string> cert_names;
  if (auto auth = ctx.auth_context(); auth && auth->IsPeerAuthenticated()) {
    for (const char* property : {"x509_common_name", "x509_subject_alternative_name"})
      for (const auto& value : auth->FindPropertyValues(property))
        cert_names.emplace_back(value.data(), value.size());
  }
  return Authorize(authorization, cert_names);
}

StatusOr<std::string> AdminGuard::ResolveCheckpoint(const std::string& requested) const {
  if (requested.empty()) return std::string();
  // Lexical checks first: a name that leaves the root as written is refused before any system
  // call sees it.
  if (requested.find('\0') != std::string::npos || HasDotDot(requested) ||
      requested.size() >= PATH_MAX)
    return PermissionDeniedError(kNotUnderRoot);
  fs::path candidate = fs::path(requested).is_absolute() ? fs::path(requested)
                                                         : fs::path(root_) / requested;
  std::string normal = candidate.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (!LexicallyUnder(normal, root_)) return PermissionDeniedError(kNotUnderRoot);
  // Only now the file system, and only under the root: symlinks are resolved, and a missing entry
  // and a link leading out get the same answer.
  char resolved[PATH_MAX];
  if (::realpath(normal.c_str(), resolved) == nullptr || !LexicallyUnder(resolved, root_))
    return PermissionDeniedError(kNotUnderRoot);
  return std::string(resolved);
}

}  // namespace cosmoflow
