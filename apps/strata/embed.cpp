// apps/strata/embed.cpp: `strata embed`: sentence embeddings of the user's own text with the
// converted encoder of the conversion benchmark (models::load_converted_encoder +
// SentenceEncoder::embed: all-MiniLM-L6-v2, mean pooling, L2 normalisation, any attention spec in
// any layers, sentences batched by token count and put back in input order).
//
//   strata embed --method "monarch:T=2,B=8" [--layers 3 4 5] < sentences.txt > embeddings.npy
//
// Input: one sentence per line (UTF-8; a trailing '\r' is dropped; an empty line is an empty
// sentence, so row i is line i + 1). Output: .npy (float32, n x hidden) or JSON, to stdout or
// atomically to --output. Every argument is checked before the model is loaded.
#include <fmt/core.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>

#include "commands.h"
#include "data/files.h"
#include "data/npy.h"
#include "models/conversion.h"
#include "session.h"
#include "strata/error.h"

namespace strata::app {

namespace {

using ::strata::detail::cat;
constexpr const char* kWhere = "strata embed";

// The lines of `text` (a final '\n' ends the last line, it does not start an empty one).
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

// The sentences of --input (a file, or stdin for "" and "-"); an input without any is an error.
std::vector<std::string> read_sentences(const std::string& input) {
  const bool from_stdin = input.empty() || input == "-";
  const std::string text = from_stdin ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                      : data::read_file(input, "strata embed: argument '--input'");
  std::vector<std::string> lines = split_lines(text);
  STRATA_CHECK_ARG(!lines.empty(), kWhere, "--input", "one sentence per line",
                   from_stdin ? std::string("an empty stdin") : cat("the empty file '", input, "'"));
  return lines;
}

// --format, or from --output's extension: .json is JSON, anything else .npy.
std::string output_format(const EmbedOptions& o) {
  if (!o.format.empty()) return o.format;
  const std::string& p = o.output;
  return p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0 ? "json" : "npy";
}

// {"method": ..., "spec": ..., "layers": "all" | [...], "max_length": L, "count": n, "dim": d,
//  "embeddings": [[...], ...]}; each float in its shortest form that reads back to the same float32.
std::string embeddings_json(const at::Tensor& emb, const models::ConversionMethod& m, int64_t max_length) {
  nlohmann::ordered_json head;
  head["method"] = m.label();
  head["spec"] = models::to_string(m.spec);
  head["layers"] = m.layers.empty() ? nlohmann::ordered_json("all") : nlohmann::ordered_json(m.layers);
  head["max_length"] = max_length;
  head["count"] = emb.size(0);
  head["dim"] = emb.size(1);
  std::string out = head.dump();
  out.pop_back();  // the closing '}': the embeddings follow
  out += ",\"embeddings\":[";
  const float* p = emb.data_ptr<float>();
  for (int64_t r = 0; r < emb.size(0); ++r) {
    out += r ? ",\n  [" : "\n  [";
    for (int64_t c = 0; c < emb.size(1); ++c) {
      const float x = p[r * emb.size(1) + c];
      STRATA_CHECK(std::isfinite(x), kWhere, ": embedding ", r, " has a non-finite value (", x, ")");
      if (c) out += ',';
      out += fmt::format("{}", x);
    }
    out += "]";
  }
  return out + "\n]}\n";
}

// Writes the bytes to stdout; a failed write (a closed pipe, a full disk) is an error.
void write_stdout(const std::string& bytes) {
  const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  STRATA_CHECK(n == bytes.size() && std::fflush(stdout) == 0, kWhere, ": cannot write to stdout (", n, " of ",
               bytes.size(), " bytes written)");
}

}  // namespace

CLI::App* add_embed(CLI::App& app, EmbedOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "embed", "Sentence embeddings (all-MiniLM-L6-v2, any attention spec) of one sentence per line");
  cmd->add_option("--method", o.method,
                  "attention spec as in `strata convert`: <kind>[:key=value,...][@layers], e.g. "
                  "monarch:T=2,B=8 (models/attention_zoo.h)")
      ->capture_default_str()
      ->type_name("SPEC");
  cmd->add_option("--layers", o.layers, "layers (0-based) that use the spec, the others softmax (default: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--input", o.input, "one sentence per line (default: stdin)")->type_name("FILE");
  cmd->add_option("--output", o.output, "embeddings file, written atomically (default: stdout)")->type_name("FILE");
  cmd->add_option("--format", o.format, "npy (float32, n x 384) or json (default: json for --output *.json, else npy)")
      ->check(CLI::IsMember({"npy", "json"}));
  cmd->add_option("--batch-size", o.batch_size, "sentences of equal token count per forward")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--max-length", o.max_length, "tokens per sentence incl. [CLS] and [SEP]; longer ones are truncated")
      ->capture_default_str()
      ->check(CLI::Range(2, 512));
  cmd->add_flag("--progress", o.progress, "a progress bar on stderr also when stderr is not a terminal");
  cmd->add_option("--threads", o.threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  return cmd;
}

int run_embed(const EmbedOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // Everything that needs no model first: a typo must fail in a second.
  models::ConversionMethod method;
  try {
    method = models::parse_conversion_method(o.method, o.layers);
  } catch (const Error& e) {
    throw Error(cat(kWhere, ": argument '--method'", o.layers.empty() ? "" : " with '--layers'", ": ", e.what()));
  }
  const std::string format = output_format(o);
  const bool to_stdout = o.output.empty() || o.output == "-";
  if (to_stdout) {
    STRATA_CHECK_ARG(format == "json" || !::isatty(1), kWhere, "--output",
                     "a file, or stdout redirected (> embeddings.npy), for the binary .npy", "stdout is a terminal");
  } else {
    const std::string why = data::unwritable_reason(o.output);
    STRATA_CHECK_ARG(why.empty(), kWhere, "--output", "a file that can be written", cat("'", o.output, "' (", why, ")"));
  }
  const std::vector<std::string> sentences = read_sentences(o.input);
  configure_threads(o.threads);

  models::SentenceEncoder model = models::load_converted_encoder(method);
  model.max_len = o.max_length;
  const bool show_progress = o.progress || (::isatty(2) && int64_t(sentences.size()) > o.batch_size);
  const at::Tensor emb =
      model.embed(sentences, o.batch_size, show_progress ? models::stderr_progress_bar(kWhere) : models::EmbedProgress{});

  const std::string bytes =
      format == "json" ? embeddings_json(emb, method, o.max_length)
                       : data::npy_float32(std::span<const float>(emb.data_ptr<float>(), size_t(emb.numel())),
                                           {emb.size(0), emb.size(1)});
  if (to_stdout) {
    write_stdout(bytes);
  } else {
    data::write_file_atomic(o.output, bytes, kWhere);
  }
  fmt::print(stderr, "strata embed: {} sentences -> {} ({} x {} float32, {} format, method {}) in {:.1f} s\n",
             sentences.size(), to_stdout ? std::string("stdout") : o.output, emb.size(0), emb.size(1), format,
             method.label(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace strata::app
