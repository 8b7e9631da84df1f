// torch/mup.cpp: muP-style training support (strata/torch/mup.h): role resolution over a module
// tree, the init rules, the parameter groups and AdamW, the forward-time RMS cap.
#include "strata/torch/mup.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "binding_util.h"
#include "strata/error.h"

namespace strata::torch {

using binding::cat;

const char* mup_kind_name(MupKind k) {
  switch (k) {
    case MupKind::Hidden:
      return "hidden";
    case MupKind::Output:
      return "output";
    case MupKind::Readout:
      return "readout";
    case MupKind::StructuredCore:
      return "structured_core";
    case MupKind::Gain:
      return "gain";
    case MupKind::Bias:
      return "bias";
    case MupKind::Embedding:
      return "embedding";
    case MupKind::Position:
      return "position";
    case MupKind::Input:
      return "input";
  }
  return "?";
}

double MupRole::resolved_std() const {
  switch (kind) {
    case MupKind::Hidden:
    case MupKind::Output:
      return 1.0 / std::sqrt(double(fan_in));
    case MupKind::Readout:
      return 1.0 / double(fan_in);
    case MupKind::StructuredCore:
      return init_std > 0 ? init_std : 1.0 / std::sqrt(double(fan_in));
    case MupKind::Embedding:
    case MupKind::Input:
      return init_std > 0 ? init_std : 0.02;
    default:
      return 0.0;
  }
}

double MupRole::lr(double base_lr, double base_width) const {
  return is_matrix() ? base_lr * base_width / double(fan_in) : base_lr;
}

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The defaults of the torch modules whose parameters' roles are unambiguous (see the header).
std::vector<std::pair<std::string, MupRole>> default_roles(const ::torch::nn::Module& m) {
  std::vector<std::pair<std::string, MupRole>> r;
  if (const auto* lin = dynamic_cast<const ::torch::nn::LinearImpl*>(&m)) {
    r.emplace_back("weight", MupRole::hidden(lin->options.in_features()));
    if (lin->bias.defined()) r.emplace_back("bias", MupRole::bias());
  } else if (dynamic_cast<const ::torch::nn::EmbeddingImpl*>(&m)) {
    r.emplace_back("weight", MupRole::embedding());
  } else if (const auto* ln = dynamic_cast<const ::torch::nn::LayerNormImpl*>(&m)) {
    if (ln->weight.defined()) r.emplace_back("weight", MupRole::gain());
    if (ln->bias.defined()) r.emplace_back("bias", MupRole::bias());
  }
  return r;
}

}  // namespace

std::vector<MupParam> mup_params(const ::torch::nn::Module& model) {
  const char* where = "mup_params";
  const auto named = model.named_parameters(/*recurse=*/true);
  // Every module with its prefix, root first (pre-order: an ancestor's declaration comes first
  // and wins, map::emplace keeping the first).
  std::vector<std::pair<std::string, const ::torch::nn::Module*>> modules{{"", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    modules.emplace_back(item.key(), item.value().get());
  std::map<std::string, MupRole> declared;
  for (const auto& [prefix, m] : modules) {
    const auto* d = dynamic_cast<const MupDeclaring*>(m);
    if (!d) continue;
    for (const auto& [rel, role] : d->mup_roles()) {
      const std::string full = join(prefix, rel);
      STRATA_CHECK_ARG(named.contains(full), where, "model",
                       cat("mup_roles() of module '", prefix, "' to name parameters of its subtree"),
                       cat("'", rel, "', which is none"));
      STRATA_CHECK_ARG((!role.is_matrix() && role.kind != MupKind::Input) || role.fan_in >= 1, where, "model",
                       cat("a fan_in >= 1 in the role of '", full, "'"), role.fan_in);
      // (std 0 means the rule's; a negative or NaN std was silently replaced by it: issue 48 item 4)
      STRATA_CHECK_ARG(role.init_std == 0 || (std::isfinite(role.init_std) && role.init_std > 0), where, "model",
                       cat("an init_std of 0 (the rule's) or a finite number > 0 in the role of '", full, "'"),
                       role.init_std);
      declared.emplace(full, role);
    }
  }
  for (const auto& [prefix, m] : modules)
    for (const auto& [rel, role] : default_roles(*m)) declared.emplace(join(prefix, rel), role);

  std::vector<MupParam> out;
  std::set<const c10::TensorImpl*> seen;  // tied tensors: once, under their first name
  for (const auto& item : named) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const auto it = declared.find(item.key());
    STRATA_CHECK_ARG(it != declared.end(), where, "model",
                     "a muP role for every trainable parameter (declared by mup_roles() of its module or an "
                     "ancestor, or a torch Linear / Embedding / LayerNorm parameter)",
                     cat("none for '", item.key(), "'"));
    out.push_back({item.key(), p, it->second});
  }
  return out;
}

void mup_init_(::torch::nn::Module& model, std::optional<at::Generator> gen, MupInit opt) {
  ::torch::NoGradGuard no_grad;
  for (MupParam& mp : mup_params(model)) {
    switch (mp.role.kind) {
      case MupKind::Output:
      case MupKind::Readout:
        if (opt.zero_outputs) mp.param.zero_();
        else mp.param.normal_(0.0, mp.role.resolved_std(), gen);
        break;
      case MupKind::Position:
      case MupKind::Bias:
        mp.param.zero_();
        break;
      case MupKind::Gain:
        mp.param.fill_(1.0);
        break;
      default:
        mp.param.normal_(0.0, mp.role.resolved_std(), gen);
    }
  }
}

void sp_init_(::torch::nn::Module& model, std::optional<at::Generator> gen) {
  ::torch::NoGradGuard no_grad;
  for (MupParam& mp : mup_params(model)) {
    const double bound = 1.0 / std::sqrt(double(mp.role.fan_in));
    switch (mp.role.kind) {
      case MupKind::Hidden:
      case MupKind::Output:
      case MupKind::Readout:
      case MupKind::Input:
        mp.param.uniform_(-bound, bound, gen);
        break;
      case MupKind::StructuredCore:
        mp.param.normal_(0.0, mp.role.resolved_std(), gen);
        break;
      case MupKind::Embedding:
        mp.param.normal_(0.0, 1.0, gen);
        break;
      case MupKind::Gain:
        mp.param.fill_(1.0);
        break;
      case MupKind::Position:
      case MupKind::Bias:
        mp.param.zero_();
        break;
    }
  }
}

void init_(::torch::nn::Module& model, Parameterization p, std::optional<at::Generator> gen, MupInit opt) {
  if (p == Parameterization::sp) sp_init_(model, gen);
  else mup_init_(model, gen, opt);
}

std::vector<MupParamGroup> mup_param_groups(const ::torch::nn::Module& model, double base_lr, const MupOptions& opt) {
  const char* where = "mup_param_groups";
  STRATA_CHECK_ARG(std::isfinite(base_lr) && base_lr >= 0, where, "base_lr", "a finite number >= 0", base_lr);
  STRATA_CHECK_ARG(std::isfinite(opt.base_width) && opt.base_width > 0, where, "base_width", "a finite number > 0",
                   opt.base_width);
  STRATA_CHECK_ARG(std::isfinite(opt.weight_decay) && opt.weight_decay >= 0, where, "weight_decay",
                   "a finite number >= 0", opt.weight_decay);
  std::vector<MupParamGroup> groups;
  for (MupParam& mp : mup_params(model)) {
    const double lr = mp.role.lr(base_lr, opt.base_width);
    const double wd = mp.param.dim() >= 2 ? opt.weight_decay : 0.0;  // the reference's rule
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const MupParamGroup& x) { return x.lr == lr && x.weight_decay == wd; });
    if (g == groups.end()) g = groups.insert(groups.end(), MupParamGroup{{}, {}, lr, wd});
    g->names.push_back(mp.name);
    g->params.push_back(mp.param);
  }
  return groups;
}

std::unique_ptr<::torch::optim::AdamW> mup_adamw(const ::torch::nn::Module& model, double base_lr,
                                                 const MupOptions& opt) {
  using ::torch::optim::AdamWOptions;
  const auto options = [&](double lr, double wd) {
    AdamWOptions o(lr);
    o.betas({opt.beta1, opt.beta2}).eps(opt.eps).weight_decay(wd);  // torch's default decay is 1e-2: set
    return o;
  };
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  for (const MupParamGroup& g : mup_param_groups(model, base_lr, opt))
    groups.emplace_back(g.params, std::make_unique<AdamWOptions>(options(g.lr, g.weight_decay)));
  return std::make_unique<::torch::optim::AdamW>(std::move(groups), options(base_lr, opt.weight_decay));
}

double rms_cap_sigma(int64_t d_in, int64_t d_out) {
  STRATA_CHECK_ARG(d_in >= 1, "rms_cap", "d_in", ">= 1", d_in);
  STRATA_CHECK_ARG(d_out >= 1, "rms_cap", "d_out", ">= 1", d_out);
  return std::sqrt(double(std::min(d_in, d_out))) / double(d_in);
}

at::Tensor rms_cap(const at::Tensor& w, int64_t d_in, int64_t d_out) {
  const double sigma = rms_cap_sigma(d_in, d_out);
  STRATA_CHECK_ARG(
      // sym_numel: a guard under torch.compile's symbolic shapes, where numel() would throw
      w.defined() && w.sym_numel() > 0 && at::isFloatingType(w.scalar_type()), "rms_cap", "w",
      "a non-empty floating-point tensor",
      w.defined() ? cat(binding::torch_dtype_name(w), " ", w.sym_sizes()) : std::string("an undefined tensor"));
  const at::Tensor ratio = (w.square().mean() + 1e-8).sqrt() / sigma;  // RMS(w) / sigma*, 0-dim
  // max(1, ratio) with the reference's gradient: through ratio only where it is above 1.
  return w / at::where(ratio > 1.0, ratio, at::ones_like(ratio));
}

}  // namespace strata::torch
