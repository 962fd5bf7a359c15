#include "common/shared_library.h"

#include <dlfcn.h>

namespace gridsync {

Result<SharedLibrary> SharedLibrary::Open(std::initializer_list<const char*> names,
                                          const char* what) {
  std::string why = "not found";
  for (const char* name : names) {
    if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL); handle != nullptr)
      return SharedLibrary(handle);
    if (const char* error = dlerror(); error != nullptr && name == *names.begin()) why = error;
  }
  return Status::Unsupported(std::string("cannot load ") + what + " (" + *names.begin() +
                             "): " + why);
}

void* SharedLibrary::Symbol(const char* name) const { return dlsym(handle_, name); }

}  // namespace gridsync
