// The command line (cli/command_line.h): options and flags, --config files and their
// precedence, --help and --version, suggestions for mistyped options, commands and keys.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "core/error.h"

namespace tandem {
namespace {

struct CliRun {
  int status = -1;
  std::string out, err;
  std::map<std::string, std::string> seen;  // what the handler read
  bool ran = false;
};

// Runs `demo ARGS...`: a program with a command `train` (options epochs, lr, data, a flag
// nesterov, the optimizer's options) and a command `pki` with a command `issue`.
CliRun run_demo(std::vector<std::string> args) {
  CliRun r;
  Program program("demo", "a demonstration");
  program.command("train", "train something")
      .option("epochs", "N", "epochs")
      .option("data", "DIR", "data")
      .option("dtypes", "LIST", "a comma-separated list")
      .flag("group", "a flag")
      .optimizer_options(false)
      .run([&r](const CliArgs& a) {
        r.ran = true;
        for (const char* n : {"epochs", "data", "dtypes", "lr", "momentum", "optimizer"})
          if (a.has(n)) r.seen[n] = a.str(n, "");
        r.seen["group"] = a.has("group") ? "yes" : "no";
        r.seen["nesterov"] = a.has("nesterov") ? "yes" : "no";
        if (a.has("epochs")) a.integer("epochs", 1, 1);  // throws on a malformed value
        return 7;
      });
  program.command("pki", "identities")
      .command("issue", "issue one")
      .option("client", "NAME", "the name")
      .run([&r](const CliArgs& a) {
        r.ran = true;
        r.seen["client"] = a.required("client");
        return 0;
      });
  args.insert(args.begin(), "demo");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  r.status = program.main(static_cast<int>(argv.size()), argv.data());
  r.out = testing::internal::GetCapturedStdout();
  r.err = testing::internal::GetCapturedStderr();
  return r;
}

std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(CommandLine, OptionsFlagsAndTheHandlersStatus) {
  const CliRun r = run_demo({"train", "--epochs", "3", "--data=d", "--group", "--lr", "-0.5"});
  EXPECT_EQ(r.status, 7);
  EXPECT_EQ(r.seen.at("epochs"), "3");
  EXPECT_EQ(r.seen.at("data"), "d");
  EXPECT_EQ(r.seen.at("lr"), "-0.5");
  EXPECT_EQ(r.seen.at("group"), "yes");
  EXPECT_EQ(r.seen.at("nesterov"), "no");
}

TEST(CommandLine, ARepeatedOptionTakesItsLastValue) {
  const CliRun r = run_demo({"train", "--epochs", "1", "--epochs", "4"});
  EXPECT_EQ(r.seen.at("epochs"), "4");
}

TEST(CommandLine, ConfigFileGivesEveryOptionUnderItsFlagsName) {
  const std::string file = write_config("tandem_cli_a.toml",
                                        "# a comment\nepochs = 5\ndata = \"folder one\"\ngroup = true\nlr = 0.01\n"
                                        "dtypes = [\"f32\", \"f16\"]\nnesterov = false\n");
  const CliRun r = run_demo({"train", "--config", file});
  ASSERT_EQ(r.status, 7) << r.err;
  EXPECT_EQ(r.seen.at("epochs"), "5");
  EXPECT_EQ(r.seen.at("data"), "folder one");
  EXPECT_EQ(r.seen.at("group"), "yes");
  EXPECT_EQ(r.seen.at("lr"), "0.01");
  EXPECT_EQ(r.seen.at("dtypes"), "f32,f16");  // an array is the flag's comma-separated list
  EXPECT_EQ(r.seen.at("nesterov"), "no");
}

TEST(CommandLine, FlagsWinOverTheConfigFile) {
  const std::string file = write_config("tandem_cli_b.toml", "epochs = 5\ndata = \"from-file\"\ngroup = true\n");
  const CliRun r = run_demo({"train", "--epochs", "2", "--config", file, "--group=false"});
  ASSERT_EQ(r.status, 7) << r.err;
  EXPECT_EQ(r.seen.at("epochs"), "2");
  EXPECT_EQ(r.seen.at("data"), "from-file");
  EXPECT_EQ(r.seen.at("group"), "no");  // false on the command line beats true in the file
}

TEST(CommandLine, AnUnknownConfigKeyIsRefusedWithTheClosestName) {
  const std::string file = write_config("tandem_cli_c.toml", "epoch = 5\n");
  const CliRun r = run_demo({"train", "--config", file});
  EXPECT_EQ(r.status, 1);
  EXPECT_FALSE(r.ran);
  EXPECT_NE(r.err.find("unknown key 'epoch'; did you mean epochs?"), std::string::npos) << r.err;
}

TEST(CommandLine, ConfigKeysInASectionOrAMissingFileAreRefused) {
  const std::string file = write_config("tandem_cli_d.toml", "[train]\nepochs = 5\n");
  CliRun r = run_demo({"train", "--config", file});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("key 'train.epochs' is inside a [section]"), std::string::npos) << r.err;
  r = run_demo({"train", "--config", "/nonexistent/x.toml"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--config /nonexistent/x.toml: no such file"), std::string::npos) << r.err;
  const std::string flag = write_config("tandem_cli_e.toml", "group = \"maybe\"\n");
  r = run_demo({"train", "--config", flag});
  EXPECT_NE(r.err.find("key group is a flag: give true or false, got 'maybe'"), std::string::npos) << r.err;
}

TEST(CommandLine, AMistypedOptionSuggestsTheRightOne) {
  CliRun r = run_demo({"train", "--epoch", "3"});
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(r.ran);
  EXPECT_NE(r.err.find("unknown option --epoch; did you mean --epochs? ('demo train --help' lists the options)"),
            std::string::npos)
      << r.err;
  r = run_demo({"train", "--nestrov"});
  EXPECT_NE(r.err.find("did you mean --nesterov?"), std::string::npos) << r.err;
  r = run_demo({"train", "--zzzzzzzz"});
  EXPECT_NE(r.err.find("unknown option --zzzzzzzz ("), std::string::npos) << r.err;  // nothing close: no guess
}

TEST(CommandLine, AMistypedCommandSuggestsTheRightOne) {
  CliRun r = run_demo({"trian"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown command 'trian'; did you mean train?"), std::string::npos) << r.err;
  r = run_demo({"pki", "isue", "--client", "x"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown command 'isue'; did you mean issue? ('demo pki --help' lists the commands)"),
            std::string::npos)
      << r.err;
}

TEST(CommandLine, HelpOnEveryCommandAndVersion) {
  CliRun r = run_demo({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
  EXPECT_NE(r.out.find("pki"), std::string::npos);
  r = run_demo({"train", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_FALSE(r.ran);
  EXPECT_NE(r.out.find("Usage: demo train"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--epochs N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--config FILE"), std::string::npos) << r.out;
  r = run_demo({"pki", "issue", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("Usage: demo pki issue"), std::string::npos) << r.out;
  r = run_demo({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("demo " + tandem_version(), 0), 0u) << r.out;
  EXPECT_NE(tandem_version().find("(commit "), std::string::npos);
}

TEST(CommandLine, AnOptionWithoutItsValueNamesTheCommand) {
  const CliRun r = run_demo({"pki", "issue", "--client"});
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(r.ran);
  EXPECT_NE(r.err.find("demo pki issue: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--client"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("('demo pki issue --help' says more)"), std::string::npos) << r.err;
}

TEST(CommandLine, ACommandOfCommandsAloneSaysWhatItHas) {
  const CliRun r = run_demo({"pki"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("issue"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("demo pki: give a command"), std::string::npos) << r.err;
}

TEST(CommandLine, ErrorsOfTheHandlerNameTheOption) {
  CliRun r = run_demo({"train", "--epochs", "three"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("demo: [cli] option --epochs expects an integer, got 'three'"), std::string::npos) << r.err;
  r = run_demo({"pki", "issue"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("option --client is required: give it on the command line, or as client = ..."),
            std::string::npos)
      << r.err;
}

TEST(CommandLine, ClosestNames) {
  EXPECT_EQ(closest_names("epoch", {"epochs", "seed", "limit"}), std::vector<std::string>{"epochs"});
  EXPECT_EQ(closest_names("chekpoint-dir", {"checkpoint-dir", "checkpoint-every"}),
            std::vector<std::string>{"checkpoint-dir"});
  EXPECT_EQ(closest_names("bacth", {"batch", "backend"}), std::vector<std::string>{"batch"});  // a swap counts once
  EXPECT_TRUE(closest_names("qqqq", {"epochs", "seed"}).empty());
}

}  // namespace
}  // namespace tandem
