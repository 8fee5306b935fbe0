// cuBLAS through the table of kernels/cublas_library.hpp: a program that carries the CUDA engine does not
// load libcublas as it starts; the first call to cublas() loads it, from the CUDA runtime's directory,
// and fills every entry; the entries are the library's own (its status text comes back through them);
// and a failed cuBLAS call is reported in cuBLAS's words. Runs without a GPU: only the last case needs
// there to be none.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kernels/cublas_library.hpp"
#include "kernels/device.hpp"
#include "src/error.hpp"

namespace dpcheck::cuda {
namespace {

// The path this process mapped a file of that name from ("" when it has not).
std::string mapped_path(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const std::size_t at = line.find('/');
    if (at == std::string::npos) continue;
    const std::string path = line.substr(at);
    if (path.size() > name.size() && path.ends_with("/" + name)) return path;
  }
  return "";
}

bool mapped(const std::string& name) { return !mapped_path(name).empty(); }

std::string directory_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

// Read while the program's static objects are made, before any case runs (and so before any case of
// the same run has called cublas()).
const bool kLoadedAtStart = mapped(cublas_soname());

TEST(CublasLibrary, IsNotLoadedAtStartAndIsOnFirstUse) {
  EXPECT_FALSE(kLoadedAtStart) << cublas_soname() << " was mapped before main: something links it";
  const CublasLibrary& t = cublas();
  // From the CUDA runtime's directory, so that the two come from one toolkit.
  const std::string runtime = mapped_path("libcudart.so." + std::to_string(CUDART_VERSION / 1000));
  ASSERT_FALSE(runtime.empty());
  EXPECT_EQ(directory_of(mapped_path(cublas_soname())), directory_of(runtime));
  EXPECT_EQ(&t, &cublas()) << "opened once";
  EXPECT_NE(t.Create, nullptr);
  EXPECT_NE(t.Destroy, nullptr);
  EXPECT_NE(t.SetStream, nullptr);
  EXPECT_NE(t.SetMathMode, nullptr);
  EXPECT_NE(t.SetWorkspace, nullptr);
  EXPECT_NE(t.Sgemm, nullptr);
  EXPECT_NE(t.GemmEx, nullptr);
  EXPECT_NE(t.GetStatusString, nullptr);
}

TEST(CublasLibrary, EntriesAreTheLibrarysOwn) {
  // cuBLAS's own words for its codes (cuBLAS 13).
  EXPECT_STREQ(cublas().GetStatusString(CUBLAS_STATUS_SUCCESS), "success");
  EXPECT_STREQ(cublas().GetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "the library was not initialized");
  EXPECT_STREQ(cublas_status_text(CUBLAS_STATUS_INVALID_VALUE),
               "an unsupported value or parameter was passed to the function");
}

TEST(CublasLibrary, AFailedCallNamesItselfAndCublassReason) {
  if (device_available()) GTEST_SKIP() << "a CUDA device is here: a cuBLAS handle would be made";
  try {
    Blas blas(nullptr, false);
    FAIL() << "a cuBLAS handle was made without a CUDA device";
  } catch (const Error& e) {
    const std::string what = e.what();
    // "cublas().Create(&h_) failed: the library was not initialized (code 1) at kernels/device.cpp:30"
    EXPECT_EQ(what.rfind("cublas().Create(&h_) failed: ", 0), 0u) << what;
    EXPECT_NE(what.find(" (code "), std::string::npos) << what;
    EXPECT_NE(what.find("kernels/device.cpp"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dpcheck::cuda
