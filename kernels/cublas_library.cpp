#include "kernels/cublas_library.hpp"

#include <dlfcn.h>
#include <link.h>

#include <string>
#include <string_view>
#include <type_traits>

#include "src/error.hpp"

namespace dpcheck::cuda {

namespace {

#define DPCHECK_STR2(x) #x
#define DPCHECK_STR(x) DPCHECK_STR2(x)
constexpr const char* kSoname = "libcublas.so." DPCHECK_STR(CUBLAS_VER_MAJOR);
#undef DPCHECK_STR
#undef DPCHECK_STR2

// The overload of cublasGemmEx that the library exports has exactly the table's type (an unevaluated
// cast: it picks the declaration without referring to the symbol).
static_assert(std::is_same_v<decltype(static_cast<decltype(CublasLibrary::GemmEx)>(&cublasGemmEx)),
                             decltype(CublasLibrary::GemmEx)>);

// The directory of the CUDA runtime this process loaded ("" when none is loaded).
std::string cuda_runtime_directory() {
  std::string dir;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        const std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        const std::size_t slash = name.rfind('/');
        if (slash == std::string_view::npos || name.substr(slash + 1).rfind("libcudart.so", 0) != 0) return 0;
        *static_cast<std::string*>(out) = std::string(name.substr(0, slash));
        return 1;
      },
      &dir);
  return dir;
}

void* open_library() {
  std::string why;
  const std::string dir = cuda_runtime_directory();
  if (!dir.empty()) {
    const std::string beside = dir + "/" + kSoname;
    if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    why = std::string(dlerror()) + "; ";
  }
  if (void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) return h;
  throw Error("cuBLAS could not be opened: " + why + dlerror());
}

template <class F> void resolve(void* library, const char* name, F& entry) {
  void* symbol = dlsym(library, name);
  if (!symbol) throw Error(std::string("cuBLAS (") + kSoname + ") has no " + name);
  entry = reinterpret_cast<F>(symbol);
}

CublasLibrary load() {
  void* library = open_library();  // never closed: cuBLAS stays loaded for the life of the process
  CublasLibrary t{};
  resolve(library, "cublasCreate_v2", t.Create);
  resolve(library, "cublasDestroy_v2", t.Destroy);
  resolve(library, "cublasSetStream_v2", t.SetStream);
  resolve(library, "cublasSetMathMode", t.SetMathMode);
  resolve(library, "cublasSetWorkspace_v2", t.SetWorkspace);
  resolve(library, "cublasSgemm_v2", t.Sgemm);
  resolve(library, "cublasGemmEx", t.GemmEx);
  resolve(library, "cublasGetStatusString", t.GetStatusString);
  return t;
}

}  // namespace

const char* cublas_soname() { return kSoname; }

const CublasLibrary& cublas() {
  static const CublasLibrary table = load();  // a failed load throws, and the next call tries again
  return table;
}

}  // namespace dpcheck::cuda
