// The binaries' contract with operators: check-config exit codes and output,
// and the worker refusing what is not supported yet. Runs the real binaries
// (files, folders and keys: cli_files_test.cc; memory: memory_fit_cli_test.cc).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/wire/curve.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/binary_runner.h"
#include "tests/loopback_listener.h"

namespace {

using binary_runner::Execute;
using binary_runner::ExpectRefused;
using binary_runner::ProcessResult;

TEST(CliTest, CheckConfigAcceptsEverySeedConfigAsIs) {
  for (const char* name :
       {"distributed_small", "distributed_medium", "distributed_large", "local"}) {
    const ProcessResult run =
        Execute("tools/gridsync", std::string("check-config configs/") + name + ".json");
    EXPECT_EQ(run.exit_code, 0) << name << ": " << run.output;
    EXPECT_NE(run.output.find("\"log2_hashmap_size\""), std::string::npos) << run.output;
    // Defaults are filled in: the seed configs have no network section.
    EXPECT_NE(run.output.find("\"n_neurons\": 64"), std::string::npos) << run.output;
  }
}

// ps.optimizer prints as written ("auto"); where Adam runs is said beside it.
TEST(CliTest, CheckConfigSaysWhereAdamRuns) {
  struct Case {
    const char* set;
    const char* said;
  };
  for (const Case& c :
       {Case{"compression.codec=fp16",
             "resolved: ps.optimizer \"auto\": Adam on the shards, which receive gradients "
             "(codec \"fp16\" only rounds"},
        Case{"compression.codec=onebit", "\"auto\": Adam on the workers, which push updates"},
        Case{"compression.codec=int8 --set compression.error_feedback=true",
             "\"auto\": Adam on the workers, which push updates (compression.error_feedback is on"},
        Case{"ps.optimizer=worker", "ps.optimizer \"worker\": Adam on the workers"}}) {
    const ProcessResult run =
        Execute("tools/gridsync", std::string("check-config configs/local.json --set ") + c.set);
    EXPECT_EQ(run.exit_code, 0) << c.set << ": " << run.output;
    EXPECT_NE(run.output.find(c.said), std::string::npos) << c.set << ": " << run.output;
  }
  const ProcessResult nccl = Execute(
      "tools/gridsync", "check-config configs/local.json --set distributed.gradient_sync=nccl");
  EXPECT_EQ(nccl.output.find("resolved: ps.optimizer"), std::string::npos) << nccl.output;
}

TEST(CliTest, CheckConfigRejectsBadValueWithExitCode2) {
  const ProcessResult run = Execute(
      "tools/gridsync", "check-config configs/distributed_small.json --set training.batch_size=-3");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("training.batch_size"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("-3"), std::string::npos) << run.output;
}

TEST(CliTest, CheckConfigRejectsMissingFile) {
  const ProcessResult run = Execute("tools/gridsync", "check-config configs/no-such-file.json");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("no-such-file.json"), std::string::npos) << run.output;
}

// check-config and the binaries refuse the same settings, with the same words.
TEST(CliTest, CheckConfigRefusesWhatTheWorkerRefuses) {
  const std::string args =
      "configs/distributed_small.json --set distributed.master_addr=127.0.0.1 --set "
      "compression.codec=onebit";
  const ProcessResult check = Execute("tools/gridsync", "check-config " + args);
  EXPECT_EQ(check.exit_code, 2) << check.output;
  EXPECT_NE(check.output.find("compression.codec=onebit: not supported with"), std::string::npos)
      << check.output;
  const ProcessResult worker = Execute("worker/gridsync-worker", "--config " + args);
  EXPECT_EQ(worker.exit_code, 2) << worker.output;
  EXPECT_NE(worker.output.find("compression.codec=onebit: not supported with"), std::string::npos)
      << worker.output;
  // The shard and the coordinator refuse it as well, before they serve
  // (a systemd unit would otherwise run a cluster its workers refuse).
  for (const auto& [binary, extra] : {std::pair{"server/gridsync-ps", " --shard 0"},
                                      std::pair{"server/gridsync-coordinator", ""}}) {
    const ProcessResult run = Execute(binary, "--config " + args + extra);
    EXPECT_EQ(run.exit_code, 2) << binary << ": " << run.output;
    EXPECT_NE(run.output.find("compression.codec=onebit: not supported with"), std::string::npos)
        << binary << ": " << run.output;
  }
  // What runs distributed passes both (the worker is not started here).
  // (The large seed's 32 workers do not fit one 24 GiB machine together:
  // AClusterThatCannotFitOneMachineIsRefusedAlike.)
  const ProcessResult medium = Execute("tools/gridsync",
                                       "check-config configs/distributed_medium.json --set "
                                       "distributed.master_addr=127.0.0.1");
  EXPECT_EQ(medium.exit_code, 0) << medium.output;
}

// A model of fewer 4096-row blocks than shards would leave shards that own
// nothing: check-config, a shard, a worker and launch refuse it alike, and
// launch before it starts anything (it started the coordinator and every
// shard, which exited 2, and then exited 1 itself).
TEST(CliTest, ShardsThatWouldOwnNothingAreRefusedAlike) {
  const std::string args =
      "configs/local.json --set encoding.n_levels=1 --set encoding.log2_hashmap_size=4 --set "
      "encoding.base_resolution=4 --set network.n_hidden_layers=1 --set ps.shards=8";
  const std::string why = "ps.shards 8: 5 of the shards would own no value of the model";
  for (const auto& [binary, command] :
       {std::pair{"tools/gridsync", "check-config " + args},
        std::pair{"server/gridsync-ps", "--config " + args + " --shard 0"},
        std::pair{"worker/gridsync-worker", "--config " + args + " --rank 0 --check-only"},
        std::pair{"tools/gridsync", "launch " + args}}) {
    const ProcessResult run = Execute(binary, command);
    EXPECT_EQ(run.exit_code, 2) << command << ": " << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << command << ": " << run.output;
    EXPECT_EQ(run.output.find("starting"), std::string::npos) << command << ": " << run.output;
  }
}

// task.image: check-config loads it as the worker does and refuses it with
// the worker's words; a file missing on this machine is refused for a run
// here, and only named for a cluster of other machines.
TEST(CliTest, CheckConfigRefusesTheImagesTheWorkerRefuses) {
  const std::string missing = "/nonexistent/gridsync-no-such-image.png";
  for (const std::string& extra : {std::string(""), std::string(" --standalone")}) {
    const ProcessResult check = Execute(
        "tools/gridsync", "check-config configs/local.json --set task.image=" + missing + extra);
    EXPECT_EQ(check.exit_code, 2) << check.output;
    EXPECT_NE(check.output.find("task.image: cannot load image '" + missing + "'"),
              std::string::npos)
        << check.output;
  }
  const ProcessResult worker =
      Execute("worker/gridsync-worker",
              "--config configs/local.json --standalone --set training.steps=1 --set task.image=" +
                  missing);
  EXPECT_EQ(worker.exit_code, 2) << worker.output;
  EXPECT_NE(worker.output.find("task.image: cannot load image '" + missing + "'"),
            std::string::npos)
      << worker.output;
  // Not a file of this machine's: the seed configs' cluster (192.168.1.100).
  const ProcessResult remote = Execute(
      "tools/gridsync", "check-config configs/distributed_small.json --set task.image=" + missing);
  EXPECT_EQ(remote.exit_code, 0) << remote.output;
  EXPECT_NE(remote.output.find("note: task.image '" + missing + "' is not on this machine"),
            std::string::npos)
      << remote.output;
  // A file that is here but is no image is refused wherever the workers are.
  const ProcessResult damaged = Execute(
      "tools/gridsync", "check-config configs/distributed_small.json --set task.image=README.md");
  EXPECT_EQ(damaged.exit_code, 2) << damaged.output;
  EXPECT_NE(damaged.output.find("task.image: cannot load image 'README.md'"), std::string::npos)
      << damaged.output;
}

// CLI11's Range compares, and NaN compares false both ways: `monitor
// --interval nan` refreshed as fast as it could, `launch --grace nan`
// killed at once. Floating-point flags refuse what is not a finite number.
TEST(CliTest, FloatingPointFlagsRefuseNaNAndInfinity) {
  for (const auto& [binary, args] : std::vector<std::pair<std::string, std::string>>{
           {"tools/gridsync", "monitor configs/local.json --interval nan --once"},
           {"tools/gridsync", "monitor configs/local.json --timeout inf --once"},
           {"tools/gridsync", "launch configs/local.json --grace nan"},
           {"tools/gridsync", "launch configs/local.json --grace -5"},
           {"worker/gridsync-worker", "--config configs/local.json --metrics-hold nan"}}) {
    const ProcessResult run = Execute(binary, args);
    EXPECT_EQ(run.exit_code, 2) << binary << " " << args << ": " << run.output;
    EXPECT_NE(run.output.find("not in range"), std::string::npos)
        << binary << " " << args << ": " << run.output;
  }
  // --metrics-hold with no metrics endpoint held nothing, without a word.
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --metrics-hold 5 --check-only",
                "--metrics-hold 5: this worker serves no metrics (metrics.port is 0 and no "
                "--metrics-port)");
  // Indices take digits only (an empty --shard served as shard 0).
  ExpectRefused("worker/gridsync-worker", "--config configs/local.json --rank -2",
                "--rank: Value \"-2\" is not an index");
  ExpectRefused("server/gridsync-ps", "--config configs/local.json --shard ''",
                "--shard: Value \"\" is not an index");
  ExpectRefused("worker/gridsync-worker", "--config configs/local.json --standalone --rank 3",
                "--rank 3: a run in one process has no ranks");
}

// A flag never silently does nothing: `launch --coordinator` without
// --node (every process runs here anyway), and an empty --bin-dir or
// --node, which read as "not given".
TEST(CliTest, LaunchFlagsThatWouldDoNothingAreRefused) {
  // One metrics port for every worker: the second failed to bind, after
  // the cluster had started.
  ExpectRefused("tools/gridsync", "launch configs/local.json --worker-arg=--metrics-port=28541",
                "one port for the 2 workers on this machine");
  // One trace file for every worker (they interleaved into invalid JSON),
  // a --set the launcher's own overrode silently, and --check-only that
  // left the other workers waiting out timeout_s (hostile probes).
  ExpectRefused("tools/gridsync", "launch configs/local.json --worker-arg --timeline=out/t.json",
                "one file for the 2 workers on this machine");
  ExpectRefused("tools/gridsync", "launch configs/local.json --worker-arg --set=training.steps=5",
                "--worker-arg --set=training.steps=5: gridsync launch gives every worker its "
                "--set itself");
  ExpectRefused("tools/gridsync", "launch configs/local.json --rank0-arg --check-only",
                "--rank0-arg --check-only: gridsync launch gives every worker its --check-only");
  // A worker's --metrics-port on a shard's port: refused before anything
  // starts (worker 0's --check-only), where the shard failed to bind after.
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --rank 0 --metrics-port 29501 --check-only",
                "--metrics-port 29501: the port is shard 0's on this machine");
  ExpectRefused("tools/gridsync", "launch configs/local.json --coordinator",
                "--coordinator requires --node");
  ExpectRefused("tools/gridsync", "launch configs/local.json --bin-dir ''",
                "--bin-dir: Value \"\" is empty; allowed: the folder that holds");
  ExpectRefused("tools/gridsync", "launch configs/local.json --node ''",
                "--node: Value \"\" is empty; allowed: a name from distributed.nodes[].name");
  // A worker's extra arguments are checked before anything starts (the
  // coordinator and shards started, then the workers failed).
  for (const char* args : {"--worker-arg --bogus", "--rank0-arg ''"}) {
    const ProcessResult run = Execute("tools/gridsync", std::string("launch configs/local.json ") +
                                                            args + " --set training.steps=2");
    EXPECT_EQ(run.exit_code, 2) << args << ": " << run.output;
    EXPECT_NE(run.output.find("refuses its command line"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("starting coordinator"), std::string::npos) << run.output;
  }
  ExpectRefused("worker/gridsync-worker", "--config configs/local.json --rank 0 ''",
                "argument 5 is empty");
}

// A hostile probe: `compress --codecs topk --bits 3` ran without a word
// about --bits, and `load --seed -1` ran with seed 2^64 - 1.
TEST(CliTest, BenchFlagsThatWouldDoNothingOrWrapAreRefused) {
  ExpectRefused("tools/gridsync-bench", "compress --codecs topk --bits 3",
                "--bits: no listed codec reads it; allowed: with qsgd");
  ExpectRefused("tools/gridsync-bench", "compress --train --codecs none,qsgd --ratio 0.1",
                "--ratio: no listed codec reads it; allowed: with topk or randomk");
  // Options of --train without it, and of the codec table with it, did
  // nothing (`compress --steps 5` printed the table as ever).
  ExpectRefused("tools/gridsync-bench", "compress --codecs none --steps 5",
                "--steps requires --train");
  ExpectRefused("tools/gridsync-bench", "compress --codecs none --rounds 3",
                "--rounds requires --train");
  ExpectRefused("tools/gridsync-bench", "compress --train --codecs none --reps 5",
                "--train excludes --reps");
  for (const char* seed : {"-1", "18446744073709551616", "7x"}) {
    ExpectRefused(
        "tools/gridsync-bench", std::string("load --seed ") + seed,
        std::string("--seed: Value ") + seed + " is not an integer in 0..18446744073709551615");
  }
}

// A hostile probe: `gridsync-ps --resume-step -1` went looking for the
// checkpoint of step 18446744073709551615 (CLI11 reads unsigned flags with
// strtoull), and a value past 2^64 was clamped. Step flags take digits up
// to training.steps' bound, and the refusal names what was typed.
TEST(CliTest, StepFlagsRefuseSignsAndOverflow) {
  for (const auto& [binary, args] : std::vector<std::pair<std::string, std::string>>{
           {"server/gridsync-ps", "--config configs/local.json --shard 0 --resume-step -1"},
           {"server/gridsync-ps",
            "--config configs/local.json --shard 0 --resume-step 18446744073709551616"},
           {"worker/gridsync-worker", "--config configs/local.json --rank 0 --start-step -50"},
           {"worker/gridsync-worker", "--config configs/local.json --rank 0 --start-step 1e3"},
           {"worker/gridsync-worker", "--config configs/local.json --eval-every 10000001"}}) {
    const ProcessResult run = Execute(binary, args);
    EXPECT_EQ(run.exit_code, 2) << binary << " " << args << ": " << run.output;
    const std::string typed = args.substr(args.rfind(' ') + 1);
    EXPECT_NE(run.output.find("Value \"" + typed + "\" is not a step; allowed: a step from 0"),
              std::string::npos)
        << binary << " " << args << ": " << run.output;
  }
}

// A hostile probe: --standalone on a cluster's config with a codec trained
// without a word, where distributed.enable false refuses the codec (it
// would compress nothing). --standalone keeps the cluster's sections on
// purpose (one file for both runs), so they are noted, by check-config and
// the worker alike.
TEST(CliTest, StandaloneNotesTheClusterSectionsItIgnores) {
  const std::string sets =
      " --standalone --set compression.codec=onebit --set training.steps=2 --set "
      "training.batch_size=1024 --set task.output=/tmp/gridsync-cli-test";
  for (const auto& [binary, args] : std::vector<std::pair<std::string, std::string>>{
           {"tools/gridsync", "check-config configs/local.json" + sets},
           {"worker/gridsync-worker", "--config configs/local.json" + sets}}) {
    const ProcessResult run = Execute(binary, args);
    EXPECT_EQ(run.exit_code, 0) << binary << ": " << run.output;
    EXPECT_NE(run.output.find("note: --standalone: one process trains, so distributed.*, ps.*, "
                              "compression.* and security.* have no effect in this run "
                              "(compression.codec \"onebit\": nothing is compressed)"),
              std::string::npos)
        << binary << ": " << run.output;
  }
}

// A standalone run keeps no checkpoints: --start-step there trained a fresh
// model from that step without a word. Refused, before any training.
TEST(CliTest, WorkerRefusesToResumeAStandaloneRun) {
  const ProcessResult run = Execute("worker/gridsync-worker",
                                    "--config configs/local.json --standalone --start-step 5 "
                                    "--set training.steps=10 --set training.batch_size=1024");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--start-step 5: a standalone run keeps no checkpoints"),
            std::string::npos)
      << run.output;
}

TEST(CliTest, WorkerTrainsStandaloneAndReportsJson) {
  const ProcessResult run =
      Execute("worker/gridsync-worker",
              "--config configs/local.json --standalone --set training.steps=3 "
              "--set training.batch_size=1024 --set task.output=/tmp/gridsync-cli-test");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("\"psnr_db\""), std::string::npos) << run.output;
}

// Issue: a missing config or a usage error used to exit 105 (CLI11's code).
TEST(CliTest, EveryBinaryExits2OnAMissingConfigOrABadFlag) {
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"worker/gridsync-worker", "--config /nonexistent/cluster.json"},
      {"server/gridsync-ps", "--config /nonexistent/cluster.json --shard 0"},
      {"server/gridsync-coordinator", "--config /nonexistent/cluster.json"},
      {"tools/gridsync", "launch /nonexistent/cluster.json"},
      {"tools/gridsync", "check-config /nonexistent/cluster.json"},
  };
  for (const auto& [binary, args] : runs) {
    const ProcessResult run = Execute(binary, args);
    EXPECT_EQ(run.exit_code, 2) << binary << " " << args << ": " << run.output;
    EXPECT_NE(run.output.find("/nonexistent/cluster.json"), std::string::npos) << run.output;
  }
  // A coordinator --port on a shard's port (a hostile probe: accepted, the
  // shard's bind failing later); the ports the config names are checked
  // against each other already.
  ExpectRefused("server/gridsync-coordinator", "--config configs/local.json --port 29501",
                "--port 29501 is where shard 0 listens (distributed.master_port + 1 + its index)");
  // An empty path read "cannot open config : No such file or directory".
  ExpectRefused("tools/gridsync", "check-config ''", "the config path is empty");
  ExpectRefused("worker/gridsync-worker", "--config '' --standalone", "the config path is empty");
  for (const char* binary : {"worker/gridsync-worker", "server/gridsync-ps", "tools/gridsync"}) {
    const ProcessResult run = Execute(binary, "--no-such-flag");
    EXPECT_EQ(run.exit_code, 2) << binary << ": " << run.output;
  }
  ExpectRefused("tools/gridsync", "chek-config configs/local.json",
                "no subcommand 'chek-config'; allowed: check-config, launch, monitor, checkpoints, "
                "keygen");
}

// A master_addr that does not resolve passed check-config, and launch
// started the cluster, whose coordinator exited 1 ("cannot resolve bind
// address"). The lookup must stay on this machine: the binaries run in
// empty network and mount namespaces where /etc/nsswitch.conf says "hosts:
// files" and /run is an empty tmpfs (no nscd or systemd-resolved socket),
// so the name (under .invalid, RFC 6761) is looked up in /etc/hosts alone.
TEST(CliTest, AnUnresolvableMasterAddrIsRefusedBeforeAnythingStarts) {
  const std::string nss = ::testing::TempDir() + "/nsswitch-files-" + std::to_string(::getpid());
  std::ofstream(nss) << "hosts: files\n";
  const auto isolated = [&nss](const std::string& command) {
    return "unshare -nm sh -c 'mount -t tmpfs none /run && mount --bind " + nss +
           " /etc/nsswitch.conf && exec " + command + "'";
  };
  if (std::system((isolated("true") + " >/dev/null 2>&1").c_str()) != 0) {
    std::filesystem::remove(nss);
    GTEST_SKIP() << "unshare -nm with mounts is not permitted here (needs root)";
  }
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  const std::string dir = build ? build : "build";
  const std::string gridsync = dir + "/tools/gridsync";
  const std::string sets = " configs/local.json --set distributed.master_addr=gridsync.invalid";
  const std::string words =
      "distributed.master_addr: cannot resolve host 'gridsync.invalid' to an address on this "
      "machine";
  // And a worker's --check-only (a hostile probe saw it pass, and the start
  // then wait out its timeout), and the coordinator, which binds that name
  // (it exited 1, "cannot resolve bind address", naming no key; bounded by
  // timeout, should it ever resolve and serve).
  for (const std::string& command :
       {gridsync + " check-config" + sets, gridsync + " launch" + sets,
        dir + "/worker/gridsync-worker --rank 0 --check-only --config" + sets,
        "timeout 20 " + dir + "/server/gridsync-coordinator --config" + sets}) {
    FILE* pipe = popen((isolated(command) + " 2>&1").c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
    const int status = pclose(pipe);
    EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2) << command << ": " << out;
    EXPECT_NE(out.find(words), std::string::npos) << command << ": " << out;
    EXPECT_EQ(out.find("starting"), std::string::npos) << command << ": " << out;
  }
  std::filesystem::remove(nss);
}

// A hostile probe: --dump-params on a full disk left a truncated file where
// the last run's whole one was. It is replaced whole or not at all now.
TEST(CliTest, ADumpOnAFullDiskLeavesThePreviousFileWhole) {
  const std::string dir = ::testing::TempDir() + "/gridsync-full-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  if (std::system(("unshare -m true >/dev/null 2>&1")) != 0) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "unshare -m is not permitted here (needs root)";
  }
  const char* build = std::getenv("GRIDSYNC_BUILD_DIR");
  const std::string worker = std::string(build ? build : "build") + "/worker/gridsync-worker";
  // 1 MiB of tmpfs holds the old file, not the model (tens of MB).
  const std::string script = "mount -t tmpfs -o size=1m none " + dir + " && printf old > " + dir +
                             "/p.bin && " + worker +
                             " --config configs/local.json --standalone --set training.steps=1 "
                             "--set training.batch_size=1024 --set task.output=" +
                             ::testing::TempDir() + " --dump-params " + dir +
                             "/p.bin; echo rc=$?; echo file=$(cat " + dir + "/p.bin); ls " + dir;
  FILE* pipe = popen(("unshare -m sh -c '" + script + "' 2>&1").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  EXPECT_EQ(pclose(pipe), 0) << out;
  std::filesystem::remove_all(dir);
  EXPECT_NE(out.find("rc=1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot write " + dir + "/p.bin.tmp"), std::string::npos) << out;
  EXPECT_NE(out.find("file=old\n"), std::string::npos) << out;
  // No leftover (p.bin.tmp-<random>) in the listing that ends the output.
  ASSERT_NE(out.find("file=old\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("p.bin.tmp", out.find("file=old\n")), std::string::npos) << out;
}

// A hostile probe: a worker whose coordinator's machine was not up yet
// exited 1, on which its unit does not restart it, so "start the machines
// in any order" held only within distributed.timeout_s. It exits 4 now, in
// every mode and with or without checkpoints: it joined nothing.
TEST(CliTest, AWorkerThatReachesNoCoordinatorExits4ForItsUnitToRestartIt) {
  const uint16_t port = gridsync::testing::UnusedPort();
  ASSERT_NE(port, 0);
  for (const char* mode : {"ps", "nccl"}) {
    const ProcessResult run =
        Execute("worker/gridsync-worker",
                "--config configs/local.json --rank 0 --set distributed.timeout_s=2 "
                "--set checkpoint.every_steps=0 --set distributed.gradient_sync=" +
                    std::string(mode) + " --set distributed.master_port=" + std::to_string(port));
    EXPECT_EQ(run.exit_code, 4) << mode << ": " << run.output;
    EXPECT_NE(
        run.output.find("cannot connect to the coordinator at 127.0.0.1:" + std::to_string(port)),
        std::string::npos)
        << mode << ": " << run.output;
    EXPECT_NE(run.output.find("no coordinator before the first step"), std::string::npos)
        << mode << ": " << run.output;
  }
}

// A hostile probe: resuming a run that had reached training.steps started
// every process, the shards loaded the step, and the workers then exited
// 1; keygen "" wrote its keys into /. Both are refused with exit 2 now.
TEST(CliTest, AFinishedResumeAnEmptyKeysFolderAndUnwrittenCheckpointsAreNotQuiet) {
  ExpectRefused("tools/gridsync", "keygen ''", "dir: Value \"\" is empty");
  // Empty output files did nothing, without a word.
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --dump-params ''",
                "--dump-params: Value \"\" is empty");
  ExpectRefused("server/gridsync-ps", "--config configs/local.json --shard 0 --timeline ''",
                "--timeline: Value \"\" is empty");
  const std::string dir = ::testing::TempDir() + "/finished-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  // Its own ports (coordinator, two shards): ctest runs tests two at a
  // time, and cli_files_test's launches take 28770-28792.
  const std::string sets =
      " configs/local.json --set distributed.master_port=28810 --set training.steps=10 --set "
      "training.batch_size=1024 --set encoding.log2_hashmap_size=12 --set "
      "checkpoint.every_steps=5 --set checkpoint.dir=" +
      dir + "/ck --set task.output=" + dir;
  const ProcessResult run = Execute("tools/gridsync", "launch" + sets);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const ProcessResult resume = Execute("tools/gridsync", "launch" + sets + " --resume");
  EXPECT_EQ(resume.exit_code, 2) << resume.output;
  EXPECT_NE(resume.output.find("is of step 10, and training.steps is 10: nothing is left to "
                               "train; allowed: training.steps above 10"),
            std::string::npos)
      << resume.output;
  EXPECT_EQ(resume.output.find("starting"), std::string::npos) << resume.output;
  // A checkpoint the shards cannot write (a file where step 10's folder
  // goes) fails the run after its summary: it ended 0 with them gone.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/ck");
  std::ofstream(dir + "/ck/step-10") << "in the way\n";
  const ProcessResult unwritten = Execute("tools/gridsync", "launch" + sets);
  EXPECT_EQ(unwritten.exit_code, 1) << unwritten.output;
  EXPECT_NE(unwritten.output.find("could not write checkpoints of this run"), std::string::npos)
      << unwritten.output;
  EXPECT_NE(unwritten.output.find("checkpoint(s) were not written since it started"),
            std::string::npos)
      << unwritten.output;
  // Under nccl every worker holds checkpoint state: a worker whose writes
  // failed ended 0 as well. It now exits 6 once trained, is not restarted
  // as failed, and the run ends 1 after its summary.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/ck");
  std::ofstream(dir + "/ck/step-10") << "in the way\n";
  const ProcessResult nccl = Execute(
      "tools/gridsync",
      "launch" + sets +
          " --set distributed.gradient_sync=nccl --set training.device=cpu --max-restarts 2");
  EXPECT_EQ(nccl.exit_code, 1) << nccl.output;
  EXPECT_NE(nccl.output.find("PSNR"), std::string::npos) << nccl.output;
  EXPECT_NE(nccl.output.find("worker-0 could not write checkpoints of this run"), std::string::npos)
      << nccl.output;
  EXPECT_NE(nccl.output.find("checkpoint(s) of this worker were not written"), std::string::npos)
      << nccl.output;
  EXPECT_EQ(nccl.output.find("restarting"), std::string::npos) << nccl.output;
  // Each worker names the collective it uses and why.
  EXPECT_NE(nccl.output.find("collective backend gloo (distributed.collective auto: "
                             "training.device cpu)"),
            std::string::npos)
      << nccl.output;
  // A worker that fails after the checkpoint of the last step (here its
  // --timeline cannot be written) is not restarted with the whole job into
  // the workers' refusal to resume with nothing left to train.
  std::filesystem::remove_all(dir);
  const ProcessResult after = Execute(
      "tools/gridsync", "launch" + sets +
                            " --set distributed.gradient_sync=nccl --set training.device=cpu "
                            "--max-restarts 2 --rank0-arg --timeline --rank0-arg /dev/full");
  EXPECT_EQ(after.exit_code, 1) << after.output;
  EXPECT_NE(after.output.find("not restarting: the newest complete checkpoint is of step 10, the "
                              "run's last"),
            std::string::npos)
      << after.output;
  EXPECT_EQ(after.output.find("restarting the whole job"), std::string::npos) << after.output;
  std::filesystem::remove_all(dir);
}

// keygen checks everything before it writes (a probe's repeated role, or a
// folder named like a key file, left a mix of new and old keys), and its
// keys load as a pair.
TEST(CliTest, KeygenRefusesBeforeWritingAnything) {
  const std::string dir = ::testing::TempDir() + "/keygen-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ExpectRefused("tools/gridsync", "keygen " + dir + " --roles worker --roles worker",
                "--roles lists worker twice");
  EXPECT_FALSE(std::filesystem::exists(dir)) << "a refused keygen made " << dir;
  const ProcessResult made = Execute("tools/gridsync", "keygen " + dir);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto before = gridsync::wire::LoadCurveKeyPair(dir, "shard");
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  std::filesystem::remove(dir + "/worker.key");
  std::filesystem::create_directory(dir + "/worker.key");
  ExpectRefused("tools/gridsync", "keygen " + dir + " --force",
                dir + "/worker.key is a folder; allowed: a regular file, or none");
  auto after = gridsync::wire::LoadCurveKeyPair(dir, "shard");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->secret_z85, before->secret_z85) << "a refused keygen replaced shard.key";
  std::filesystem::remove_all(dir);
}

// training.device cuda on a machine without a usable GPU: check-config said
// OK and the worker exited 1 once training began. Now both refuse it before
// anything runs, naming the key and what runs here.
TEST(CliTest, CudaWithoutADeviceIsRefusedBeforeTraining) {
  std::string reason;
  if (gridsync::cuda::Available(&reason)) GTEST_SKIP() << "this machine has a CUDA device";
  const std::string words = "training.device: \"cuda\", but CUDA is unavailable here";
  ExpectRefused("tools/gridsync", "check-config configs/local.json --set training.device=cuda",
                words);
  ExpectRefused("worker/gridsync-worker",
                "--config configs/local.json --standalone --set training.device=cuda", words);
  ExpectRefused("tools/gridsync", "launch configs/local.json --set training.device=cuda", words);
  // So is NCCL as the collective, which needs a GPU as well.
  const std::string nccl =
      " --set distributed.gradient_sync=nccl --set distributed.collective=nccl";
  const std::string nccl_words = "distributed.collective: \"nccl\", but CUDA is unavailable here";
  ExpectRefused("tools/gridsync", "check-config configs/local.json" + nccl, nccl_words);
  ExpectRefused("worker/gridsync-worker", "--config configs/local.json --rank 0" + nccl,
                nccl_words);
}

// A single process serves metrics on worker 0's port of metrics.port (it
// took any free port, so metrics.port did nothing there).
TEST(CliTest, AStandaloneWorkerServesMetricsOnItsConfiguredPort) {
  const ProcessResult run =
      Execute("worker/gridsync-worker",
              "--config configs/local.json --standalone --set metrics.port=38400 --set "
              "training.steps=3 --set training.batch_size=1024 --set task.output=" +
                  ::testing::TempDir() + "/standalone-metrics");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  // Worker 0 of a cluster of 2 shards: metrics.port + 1 + 2 + 0.
  EXPECT_NE(run.output.find("metrics at http://127.0.0.1:38403/metrics"), std::string::npos)
      << run.output;
}

}  // namespace
