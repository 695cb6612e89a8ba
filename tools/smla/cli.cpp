// The smla CLI's one argument parser: each subcommand declares its options (cli.h), and every
// argument is checked against that declaration before the subcommand runs.
#include "cli.h"

#include <charconv>
#include <cstring>
#include <string>

#include "smla/types.h"

namespace smla::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"info", nullptr, 0, "the build, the devices, and which backend/kernel runs a problem (or why none can)",
       {{"heads", "H", "query heads (default 128)"},
        {"format", "F", "KV format: bf16, fp16, fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla (default bf16)"},
        {"q-dtype", "T", "q dtype: bf16, fp16, e4m3 (default: fp16 for an fp16 cache, else bf16)"},
        {"topk", "K", "top-k capacity (default 2048)"},
        {"rope-dim", "R", "64 (D = 576, default) or 0 (D = 512)"},
        {"sink", nullptr, "per-head sink logits on"},
        {"score", "auto|bf16|fp8",
         "score precision: auto (default: fp8 for an e4m3 q with an fp8 cache except fp8_ds_mla at H <= 32, else "
         "bf16), bf16, or fp8 (fp8 tensor cores; an e4m3 q with an fp8 cache)"}}},
      {"check", nullptr, 0, "random problems through every backend against the float64 reference",
       {{"seed", "N", "random seed (default 1234)"}, {"quick", nullptr, "the short list of cases"}}},
      {"bench", nullptr, 0, "time sparse MLA (CUDA backend with a GPU, else the CPU reference)",
       {{"backend", "cpu|cuda", "backend (default: cuda when a usable GPU is present, else cpu)"},
        {"format", "F", "KV format (default bf16)"},
        {"q", "e4m3", "an e4m3 q (fp8_e4m3 and fp8_ds_mla caches)"},
        {"score", "auto|bf16|fp8",
         "score precision (cuda): auto (default: fp8 with --q e4m3 except fp8_ds_mla at H <= 32, else bf16), bf16, or fp8 "
         "(needs --q e4m3)"},
        {"heads", "H[,H...]", "query heads per case (cuda default 128,64,32,16,8; cpu 16)"},
        {"T", "T[,T...]", "query rows per case (cuda default 1,32,128,512,4096; cpu 4)"},
        {"topk", "K", "top-k entries per row (cuda default 2048; cpu 256)"},
        {"reps", "N", "timed repetitions per case (cuda default 30, at least 20; cpu 3)"},
        {"json", "FILE", "also write the records as JSON (the path is checked before the run)"},
        {"dim", "576|512", "head size D (cuda only)"},
        {"pool", "ROWS", "KV pool rows (cuda only; default 1048576)"},
        {"splits", "N", "force N top-k splits (cuda only; 0: the launcher chooses)"},
        {"phases", nullptr, "print where each call's time went (cuda only; with --hisparse: the resolver's and the copy blocks' phases, no special build)"},
        {"graph", nullptr, "also time the calls captured in one CUDA graph (cuda only)"},
        {"dcp", "W", "one DCP decode step on W GPUs over NCCL (reads --T --heads --topk --reps --rows)"},
        {"rows", "N", "total KV rows of the DCP request (--dcp only; default 2097152)"},
        {"hisparse", nullptr, "a HiSparse decode step (resolve + attention) vs the resident step (reads --formats --B --reuse --topk --heads --context --reps --json)"},
        {"shardq", "W[,W...]", "ShardQ prefill: the whole step on W GPUs when there are W, then the attention of a TP-W layer with and without ShardQ on one GPU and a predicted step (reads --format(s) --T --heads --topk --reps --pool --a2a-gbps --json)"},
        {"a2a-gbps", "N", "all-to-all GB/s assumed for --shardq's predicted step without W GPUs (default 350)"},
        {"formats", "F[,F...]", "KV formats of --hisparse (default fp8_ds_mla,bf16) or --shardq (default bf16,fp8_ds_mla)"},
        {"B", "B[,B...]", "requests per step (--hisparse only; default 1,32,128)"},
        {"reuse", "P[,P...]", "percent of each token's rows reused from the previous step (--hisparse only; default 0,50,90,100)"},
        {"context", "N", "tokens per request (--hisparse only; default 16384)"},
        {"late-copy", nullptr, "--hisparse only: host reads start after the resolver's end (the pre-s10 schedule, for an A/B)"}}},
      {"replay", "DUMP.safetensors", 1, "run one dumped attention call and write out and lse",
       {{"backend", "cpu|cuda", "backend (default cpu)"},
        {"out", "RESULT.safetensors", "where to write out [T,H,512] and lse [T,H] (required)"},
        {"out-dtype", "bf16|f32", "out element type (default bf16; fp16 for an fp16 q)"}}},
  };
  return kCommands;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::string usage(const Command& c) {
  std::string s = std::string("usage: smla ") + c.name + (c.positional ? std::string(" ") + c.positional : "") +
                  " [options]\n  " + c.summary + "\noptions:\n";
  for (const auto& o : c.options) {
    std::string left = std::string("  --") + o.name + (o.value ? std::string(" ") + o.value : "");
    if (left.size() < 26) left.append(26 - left.size(), ' ');
    else left += "  ";
    s += left + o.help + "\n";
  }
  return s + "  --help, -h              this message\n";
}

std::string usage_all() {
  std::string s = "usage: smla <command> [options]   (smla <command> --help for its options)\n";
  for (const auto& c : commands()) {
    std::string left = std::string("  ") + c.name + (c.positional ? std::string(" ") + c.positional : "");
    left.append(left.size() + 2 <= 26 ? 26 - left.size() : 2, ' ');
    s += left + c.summary + "\n";
  }
  return s;
}

namespace {

// Arguments are echoed in errors: keep the error to one printable line.
[[noreturn]] void fail(std::string msg) {
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  smla::fail(msg);
}

std::string see_help(const std::string& cmd) { return "; see smla " + cmd + " --help"; }

// A decimal integer: optional '-', then digits, and nothing else (no spaces, '+', hex, suffix).
bool parse_integer(const std::string& s, long long& v) {
  if (s.empty()) return false;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '-' && (b + 1 == e || b[1] < '0' || b[1] > '9')) return false;
  const auto r = std::from_chars(b, e, v);
  return r.ec == std::errc() && r.ptr == e;
}

std::string range_text(long long lo, long long hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

}  // namespace

std::string Args::get(const std::string& k, const std::string& dflt) const {
  auto it = kv.find(k);
  return it == kv.end() ? dflt : it->second;
}

long long Args::get_int(const std::string& k, long long dflt, long long lo, long long hi) const {
  auto it = kv.find(k);
  if (it == kv.end()) return dflt;
  long long v = 0;
  if (!parse_integer(it->second, v) || v < lo || v > hi)
    fail("--" + k + " must be an integer in " + range_text(lo, hi) + "; got '" + it->second + "'");
  return v;
}

std::vector<long long> Args::get_ints(const std::string& k, const std::vector<long long>& dflt, long long lo,
                                      long long hi) const {
  auto it = kv.find(k);
  if (it == kv.end()) return dflt;
  std::vector<long long> out;
  const std::string& s = it->second;
  size_t start = 0;
  while (true) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    long long v = 0;
    if (!parse_integer(s.substr(start, end - start), v) || v < lo || v > hi)
      fail("--" + k + " must be comma-separated integers, each in " + range_text(lo, hi) + "; got '" + s + "'");
    out.push_back(v);
    if (end == s.size()) break;
    start = end + 1;
  }
  return out;
}

Args parse_args(const Command& c, int argc, const char* const* argv, int first) {
  Args a;
  a.command = c.name;
  const std::string cmd = c.name;
  for (int i = first; i < argc; ++i) {
    const std::string s = argv[i] ? argv[i] : "";
    if (s == "--help" || s == "-h") {
      a.help = true;
      continue;
    }
    if (s.size() < 2 || s[0] != '-') {  // "" and "-" are positionals too
      a.positional.push_back(s);
      continue;
    }
    if (s.rfind("--", 0) != 0) fail("unknown option '" + s + "' for smla " + cmd + see_help(cmd));
    std::string key = s.substr(2), value;
    const size_t eq = key.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    const Option* opt = nullptr;
    for (const auto& o : c.options)
      if (key == o.name) opt = &o;
    if (!opt) fail("unknown option --" + key + " for smla " + cmd + see_help(cmd));
    if (a.has(key)) fail("--" + key + " is given twice; give it once");
    if (!opt->value) {
      if (inline_value) fail("--" + key + " is a flag and takes no value; got '" + s + "'");
    } else if (!inline_value) {
      if (i + 1 >= argc || !argv[i + 1] || std::strncmp(argv[i + 1], "--", 2) == 0)
        fail("--" + key + " needs a value (--" + key + " " + opt->value + ")");
      value = argv[++i];
    }
    a.kv[key] = value;
  }
  if (!a.help && int(a.positional.size()) != c.num_positional) {
    if (c.num_positional == 0)
      fail("smla " + cmd + " takes no positional arguments; got '" + a.positional[0] + "'" + see_help(cmd));
    fail("smla " + cmd + " needs exactly " + std::to_string(c.num_positional) + " " + c.positional + "; got " +
         std::to_string(a.positional.size()) + see_help(cmd));
  }
  return a;
}

}  // namespace smla::cli
