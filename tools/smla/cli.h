// Small shared pieces of the smla CLI: the one argument parser every subcommand uses, and the
// subcommand entry points.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace smla::cli {

// One option of a subcommand: `--name VALUE` (or `--name=VALUE`) when `value` names the value,
// a `--name` flag when `value` is null.
struct Option {
  const char* name;
  const char* value;  // placeholder shown in the usage ("H[,H...]"); null: a flag
  const char* help;
};

// A subcommand's grammar: its options and how many positionals it takes.
struct Command {
  const char* name;
  const char* positional;  // usage of the positionals ("DUMP.safetensors"); null: none
  int num_positional;      // exactly this many (0 or 1), unless help is asked
  const char* summary;
  std::vector<Option> options;
};

// Every subcommand's grammar, in usage order; null when `name` is not a subcommand.
const std::vector<Command>& commands();
const Command* find_command(const std::string& name);
std::string usage(const Command& c);  // "usage: smla NAME ..." and one line per option
std::string usage_all();              // the top-level usage: one line per subcommand

// The options given after the subcommand (flags map to "") and the positionals in order.
struct Args {
  std::string command;
  std::map<std::string, std::string> kv;
  std::vector<std::string> positional;
  bool help = false;  // --help or -h was given: print usage(command) and exit 0
  bool has(const std::string& k) const { return kv.count(k) != 0; }
  std::string get(const std::string& k, const std::string& dflt) const;
  // A decimal integer (optional '-', digits, nothing else) in [lo, hi]; otherwise an Error that
  // names --k and the range. Never wraps: 4294967312 is out of range, not 16.
  long long get_int(const std::string& k, long long dflt, long long lo, long long hi) const;
  // Comma-separated integers, each in [lo, hi], e.g. --T 1,32,128.
  std::vector<long long> get_ints(const std::string& k, const std::vector<long long>& dflt, long long lo,
                                  long long hi) const;
};

// Parses argv[first, argc) against c. Unknown options, a value option without its value, a flag
// given a value, an option given twice and a wrong number of positionals are Errors naming the
// argument and pointing at `smla NAME --help`. --help / -h anywhere sets help and skips the
// positional count.
Args parse_args(const Command& c, int argc, const char* const* argv, int first);

int cmd_info(const Args& a);
int cmd_check(const Args& a);
int cmd_bench(const Args& a);
int cmd_replay(const Args& a);

}  // namespace smla::cli
