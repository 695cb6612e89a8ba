// Small shared pieces of the smla CLI: argument parsing and the subcommand entry points.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace smla::cli {

// --key value and --flag arguments after the subcommand; positionals in order.
struct Args {
  std::map<std::string, std::string> kv;
  std::vector<std::string> positional;
  bool has(const std::string& k) const { return kv.count(k) != 0; }
  std::string get(const std::string& k, const std::string& dflt) const;
  long long get_int(const std::string& k, long long dflt) const;
  double get_double(const std::string& k, double dflt) const;
  // Comma-separated integers, e.g. --T 1,32,128.
  std::vector<long long> get_ints(const std::string& k, const std::vector<long long>& dflt) const;
};
Args parse_args(int argc, char** argv, int first);

int cmd_info(const Args& a);
int cmd_check(const Args& a);
int cmd_bench(const Args& a);
int cmd_replay(const Args& a);

}  // namespace smla::cli
