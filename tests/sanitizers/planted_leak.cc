// A leak planted in project code, for the sanitizer run: LeakSanitizer must report it even with
// the third-party suppressions of lsan.supp loaded (planted_leak_test.sh checks the report).
#include <cstdio>
#include <cstring>

namespace cosmoflow {

// Allocates and drops the only pointer: a definite leak in a frame named after this project.
__attribute__((noinline)) void PlantedLeakInProjectCode() {
  char* volatile block = new char[4096];
  std::memset(block, 1, 4096);
  block = nullptr;
}

}  // namespace cosmoflow

int main() {
  cosmoflow::PlantedLeakInProjectCode();
  std::puts("planted_leak: leaked 4096 bytes");
  return 0;
}
