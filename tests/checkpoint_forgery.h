// What a hostile user with write access to checkpoint.dir does in the
// checkpoint MAC tests: one step's files of a part copied in as another
// step's, the manifest's step edited to match (checksum and run intact),
// as note 67's probe did by hand.
//
// Thread safety: files only; one caller per folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace gridsync::testing {

// Part `part`'s files of step `from` in `dir` copied in as step `to`
// (overwriting what is there); returns the forged manifest, for tests that
// change it further.
inline nlohmann::json ForgeStep(const std::string& dir, const std::string& part, uint64_t from,
                                uint64_t to) {
  namespace fs = std::filesystem;
  const std::string source = dir + "/step-" + std::to_string(from) + "/" + part;
  const std::string target = dir + "/step-" + std::to_string(to) + "/" + part;
  fs::create_directories(dir + "/step-" + std::to_string(to));
  fs::copy_file(source + ".bin", target + ".bin", fs::copy_options::overwrite_existing);
  std::ifstream in(source + ".json");
  nlohmann::json manifest = nlohmann::json::parse(in);
  manifest["step"] = to;
  std::ofstream(target + ".json", std::ios::trunc) << manifest.dump();
  return manifest;
}

}  // namespace gridsync::testing
