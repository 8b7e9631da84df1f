// models/encoder_class.cpp: torch.classes.strata.SentenceEncoder, the converted sentence encoder
// of models/conversion.h (all-MiniLM-L6-v2 with any attention spec in any layers) as a
// TorchScript custom class, so that Python (python/strata/encoder.py) runs the very encoder the
// conversion benchmark and `strata embed` run: no math in Python. It lives in models/ (which
// builds on LibTorch) because it binds a model: torch/ sits below models/ and must not include
// it. Compiled into its own library, libstrata_encoder.so (cmake/strata_encoder.cmake), put beside
// libstrata_torch.so, which stays free of models/ and data/ (they link it).
//
// Methods (errors are strata::Error, RuntimeError in Python, naming the argument):
//   __init__(str spec, int[] layers, str model_dir, int max_length)
//       spec "<kind>[:key=value,...][@layer,...]" (models/attention_zoo.h); layers apart from
//       the spec (empty: the spec's own, or all); model_dir "" = the installed model
//       (data::find_minilm_dir); max_length tokens incl. [CLS] and [SEP], in [2, 512].
//   encode(str[] texts, int batch_size, bool progress) -> Tensor   n x hidden float32
//       (SentenceEncoder::embed; progress: a bar on stderr, models::stderr_progress_bar)
//   method() -> str  (spec[@layers] as given), spec() -> str (canonical), layers() -> int[]
//   (empty: all), dim() -> int (hidden), max_length() -> int
#include <torch/custom_class.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

#include "data/shared_files.h"
#include "models/conversion.h"
#include "strata/error.h"

namespace {

using strata::models::ConversionMethod;
using strata::models::SentenceEncoder;

constexpr const char* kWhere = "SentenceEncoder";

// The spec and layers parsed; an error names the argument ('spec', or 'layers' for both given).
ConversionMethod parse_method(const std::string& spec, const std::vector<int64_t>& layers) {
  try {
    return strata::models::parse_conversion_method(spec, layers);
  } catch (const strata::Error& e) {
    throw strata::Error(strata::detail::cat(kWhere, ": argument 'spec'", layers.empty() ? "" : " with 'layers'", ": ",
                                            e.what()));
  }
}

// The converted model. A given model_dir must hold the model's three files (an error naming
// 'model_dir' otherwise); the installed model's absence is an error saying how to install it.
SentenceEncoder load(const ConversionMethod& method, const std::string& model_dir) {
  for (const char* file : {"config.json", "vocab.txt", "model.safetensors"})
    STRATA_CHECK_ARG(model_dir.empty() || strata::data::is_regular_file(model_dir + "/" + file), kWhere, "model_dir",
                     "\"\" (the installed model) or a folder with config.json, vocab.txt and model.safetensors",
                     strata::detail::cat("'", model_dir, "' without ", file));
  return strata::models::load_converted_encoder(method, model_dir);
}

class SentenceEncoderClass : public torch::CustomClassHolder {
 public:
  SentenceEncoderClass(const std::string& spec, const std::vector<int64_t>& layers, const std::string& model_dir,
                       int64_t max_length)
      : method_(parse_method(spec, layers)), model_(load(method_, model_dir)) {
    const int64_t max_positions = model_.encoder.config().max_positions;
    STRATA_CHECK_ARG(max_length >= 2 && max_length <= max_positions, kWhere, "max_length",
                     "in [2, " + std::to_string(max_positions) + "] (room for [CLS] and [SEP], the model's positions)",
                     max_length);
    model_.max_len = max_length;
  }

  // texts: n strings -> n x hidden float32, L2-normalised rows; progress: a bar on stderr.
  at::Tensor encode(std::vector<std::string> texts, int64_t batch_size, bool progress) const {
    return model_.embed(texts, batch_size,
                        progress ? strata::models::stderr_progress_bar("SentenceEncoder.encode")
                                 : strata::models::EmbedProgress{});
  }
  std::string method() const { return method_.label(); }
  std::string spec() const { return strata::models::to_string(method_.spec); }
  std::vector<int64_t> layers() const { return method_.layers; }
  int64_t dim() const { return model_.encoder.config().hidden; }
  int64_t max_length() const { return model_.max_len; }

 private:
  ConversionMethod method_;
  SentenceEncoder model_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(strata, m) {
  m.class_<SentenceEncoderClass>("SentenceEncoder")
      .def(torch::init<std::string, std::vector<int64_t>, std::string, int64_t>())
      .def("encode", &SentenceEncoderClass::encode)
      .def("method", &SentenceEncoderClass::method)
      .def("spec", &SentenceEncoderClass::spec)
      .def("layers", &SentenceEncoderClass::layers)
      .def("dim", &SentenceEncoderClass::dim)
      .def("max_length", &SentenceEncoderClass::max_length);
}
