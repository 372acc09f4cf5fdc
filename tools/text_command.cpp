// The text commands: JSON lines in ({"text": ..., "label": N} a line), SentencePiece in the
// middle, a safetensors data set out (ids I32 [N, T], mask U8 [N, T], labels I32 [N]).
#include "tools/text_command.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/interop/safetensors.h"
#include "ports/files/atomic_file.h"
#include "ports/text/sentencepiece_text.h"

namespace tandem {
namespace {



struct TextRow {
  std::string text;
  int32_t label = -1;
};

std::vector<TextRow> read_jsonl(const std::string& path, bool need_labels) {
  std::ifstream in(path);
  if (!in) fail("text", cat("cannot read ", path));
  std::vector<TextRow> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("text", cat(path, " line ", n, ": not JSON (", e.what(), ")"));
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("text", cat(path, " line ", n, ": needs a \"text\" string"));
    TextRow row{j["text"].get<std::string>()};
    if (need_labels) {
      if (!j.contains("label") || !j["label"].is_number_integer() || j["label"].get<int64_t>() < 0 ||
          j["label"].get<int64_t>() > (1 << 24))
        fail("text", cat(path, " line ", n, ": needs an integer \"label\" from 0 to 2^24"));
      row.label = j["label"].get<int32_t>();
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) fail("text", cat(path, " holds no texts"));
  return rows;
}

int vocab(const CliArgs& args) {
  const auto rows = read_jsonl(args.required("texts"), false);
  std::vector<std::string> texts;
  texts.reserve(rows.size());
  for (const auto& r : rows) texts.push_back(r.text);
  const auto size = static_cast<int>(args.integer("vocab-size", 8000, 8));
  const std::string out = args.required("out");
  std::printf("tandem text: training a vocabulary of %d pieces on %zu texts\n", size, texts.size());
  train_text_vocab(texts, size, out);
  std::printf("tandem text: wrote %s\n", out.c_str());
  return 0;
}

int encode(const CliArgs& args) {
  const TextEncoder encoder(args.required("spm"));
  const auto rows = read_jsonl(args.required("texts"), true);
  const int64_t tokens = args.integer("tokens", 128, 1);
  const auto n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> ids(static_cast<std::size_t>(n * tokens)), labels(rows.size());
  std::vector<uint8_t> mask(ids.size());
  int64_t cut = 0, used = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto at = static_cast<std::size_t>(i * tokens);
    const int64_t pieces = encoder.encode(rows[static_cast<std::size_t>(i)].text, tokens, &ids[at], &mask[at]);
    if (pieces > tokens - 1) ++cut;
    used += std::min(pieces + 1, tokens);
    labels[static_cast<std::size_t>(i)] = rows[static_cast<std::size_t>(i)].label;
  }
  const std::string out = args.required("out");
  write_file_atomic(out, write_safetensors({i32_tensor(args.str("ids", "input_ids"), {n, tokens}, ids.data()),
                                            u8_tensor(args.str("mask", "attention_mask"), {n, tokens}, mask.data()),
                                            i32_tensor("labels", {n}, labels.data())}));
  std::printf("tandem text: %s: %lld texts of %lld tokens (vocabulary %d), %lld cut at %lld, %.1f tokens a text on average\n",
              out.c_str(), static_cast<long long>(n), static_cast<long long>(tokens), encoder.vocab_size(),
              static_cast<long long>(cut), static_cast<long long>(tokens), static_cast<double>(used) / static_cast<double>(n));
  return 0;
}

}  // namespace

void declare_text(Command& text) {
  text.command("vocab", "train a SentencePiece vocabulary on a data set's texts")
      .option("texts", "FILE.jsonl", "the texts, one JSON object a line with a \"text\" field (required)")
      .option("out", "spm.model", "the vocabulary to write (required)")
      .option("vocab-size", "N", "pieces (default 8000)")
      .details("A unigram vocabulary; ids 0..3 are reserved: padding, unknown, [CLS], end. Edge and cloud share the\n"
               "file (the model's embedding table is as large as it).")
      .run(vocab);
  text.command("encode", "encode texts with labels into a data set for --data DIR")
      .option("spm", "spm.model", "the vocabulary (required)")
      .option("texts", "FILE.jsonl", "the texts, with a \"text\" and an integer \"label\" a line (required)")
      .option("tokens", "T", "tokens a text: [CLS] and its first T-1 pieces, padded (default 128)")
      .option("out", "FILE.safetensors", "the data set to write (required)")
      .option("ids", "NAME", "the ids' tensor name (default input_ids)")
      .option("mask", "NAME", "the mask's tensor name (default attention_mask)")
      .details("Writes the ids (I32 [N, T]), the mask (U8 [N, T], 1 for a token) and the labels (I32 [N]); prints how\n"
               "many texts were cut at T.")
      .run(encode);
}

}  // namespace tandem
