// A model's parameters as one flat float32 array, tables in ModelTables
// order (grid levels, then MLP matrices): what --dump-params writes and the
// tests compare across modes.
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model.h"

namespace gridsync {

std::vector<float> FlattenParams(const HashGridModel& model);
Status WriteParams(const std::string& path, const HashGridModel& model);
// The floats of a regular file of whole float32s; IOError naming the file
// when it is not one (a folder, a FIFO, a device) or cannot be read,
// Corruption when its size is not a multiple of 4.
Result<std::vector<float>> ReadParams(const std::string& path);

}  // namespace gridsync
