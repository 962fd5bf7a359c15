// Libraries loaded at run time rather than linked (NVIDIA's NCCL and
// cuBLAS: large, and needed only by workers that use a GPU), with their
// functions looked up by name.
//
// Thread safety: the class is a handle; Open and Lookup may be called from
// any thread. Libraries stay loaded for the life of the process.
#pragma once

#include <initializer_list>
#include <string>

#include "common/status.h"

namespace gridsync {

class SharedLibrary {
 public:
  // The first of `names` that loads (as dlopen finds it: LD_LIBRARY_PATH,
  // the loader's cache); Unsupported naming `what`, the first name and
  // dlerror's reason when none does.
  static Result<SharedLibrary> Open(std::initializer_list<const char*> names, const char* what);

  // Sets *function to the symbol `name` and returns whether it exists.
  template <typename Function>
  bool Lookup(const char* name, Function* function) const {
    *function = reinterpret_cast<Function>(Symbol(name));
    return *function != nullptr;
  }

 private:
  explicit SharedLibrary(void* handle) : handle_(handle) {}
  void* Symbol(const char* name) const;

  void* handle_ = nullptr;
};

}  // namespace gridsync
